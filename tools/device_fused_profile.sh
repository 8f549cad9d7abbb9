#!/usr/bin/env bash
# Nsight Compute's view of the fused amplitude kernel (both stages of one N2/cc-pVDZ batch in
# the prefix order: tools/fused_shapes.py --one; KERNEL=cuda|triton|auto picks the kernel,
# PRODUCTS=fma|fp64|tf32x3 the CUDA kernel's products),
# printed as text (the sections' details and the warp stall reasons; per SASS instruction in
# ncu_source_sass.csv.gz), then the N2/STO-3G block
# shapes of the whole ln psi (benchmarks/inference.py; STO3G=0 skips them). Usage (repository
# root on the GPU machine):
#   bash tools/device_fused_profile.sh OUTDIR
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/device-fused-profile}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2> /dev/null | head -1)
echo "ncu: ${NCU:-not found}"
if [ -n "$NCU" ]; then
  prod=()
  [ -n "${PRODUCTS:-}" ] && prod=(--products "$PRODUCTS")
  python3 tools/fused_shapes.py --one --kernel "${KERNEL:-auto}" "${prod[@]}"  # compile first
  timeout 240 "$NCU" -k regex:amplitude --launch-count 2 --set full \
    -o "$OUTDIR/amplitude" -f python3 tools/fused_shapes.py --one --kernel "${KERNEL:-auto}" "${prod[@]}" \
    > "$OUTDIR/ncu_run.log" 2>&1
  echo "ncu exit $?"; tail -5 "$OUTDIR/ncu_run.log"
  "$NCU" --import "$OUTDIR/amplitude.ncu-rep" --page details --print-details all \
    > "$OUTDIR/ncu_details.txt" 2>&1
  "$NCU" --import "$OUTDIR/amplitude.ncu-rep" --page raw --csv > "$OUTDIR/ncu_raw.csv" 2>&1
  # per SASS instruction: executed counts and warp stall samples (compressed)
  "$NCU" --import "$OUTDIR/amplitude.ncu-rep" --page source --csv --print-source sass 2>&1 \
    | gzip > "$OUTDIR/ncu_source_sass.csv.gz"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" \
    "$OUTDIR/ncu_details.txt" | head -40
  rm -f "$OUTDIR/amplitude.ncu-rep"
fi
[ "${STO3G:-1}" = 0 ] && exit 0
timeout 100 python3 benchmarks/inference.py --systems N2 --n 262144 --no-profile --module \
  --fused ${FUSED:-fp64:auto:auto:ordered fp64:4:4:ordered fp64:8:4:ordered fp64:16:8:ordered} \
  --json "$OUTDIR/inference_sto3g.json" 2>&1 | tee "$OUTDIR/inference.log" | grep -v "^#"
