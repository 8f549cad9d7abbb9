#!/usr/bin/env bash
# Prefix sharing in the fused inference kernel, measured on one GPU, each step under a timeout so
# the whole run stays inside TOTAL seconds: (1) benchmarks/inference.py on N2/cc-pVDZ: an older
# fast_infer.py (PREV, if given), then sharing off / on / ordered and two block sizes; (2) one
# N2/cc-pVDZ iteration without and with sharing in one process (benchmarks/gpu_pipeline.py);
# (3) the gpu tests of the shared-prefix path and the default models; (4) N2/STO-3G rates.
# Usage (repository root on the GPU machine): bash tools/device_fused2.sh OUTDIR [TOTAL] [PREV]
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/device-fused2}
TOTAL=${2:-150}
PREV=${3:-}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
left() { echo $((TOTAL - SECONDS)); }
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
torch.cuda.get_device_name())" 2>&1
PREVARG=()
[ -n "$PREV" ] && PREVARG=(--previous "$PREV")
timeout 70 python3 benchmarks/inference.py --systems N2/cc-pVDZ --n 262144 --no-profile --module \
  "${PREVARG[@]}" --fused tf32x3:auto:auto:off tf32x3:auto:auto:on tf32x3:auto:auto:ordered \
  tf32x3:2:4:ordered tf32x3:2:8:ordered \
  --json "$OUTDIR/inference_ccpvdz.json" 2>&1 | tee "$OUTDIR/inference_ccpvdz.log"
echo "# $SECONDS s so far"
timeout $(($(left) - 60)) python3 benchmarks/gpu_pipeline.py iteration --pipelines gpu \
  --inference fused-noshare,fused --sources 16000 --max-seconds 30 2>&1 \
  | tee "$OUTDIR/iteration.log"
echo "# $SECONDS s so far"
timeout $(($(left) - 15)) python3 -m pytest tests/gpu/test_fused_inference.py -q -s \
  -p no:cacheprovider -W ignore::UserWarning -k "shared or prefix or default or random_weights" \
  2>&1 | tee "$OUTDIR/tests.log"
echo "# $SECONDS s so far"
if [ "$(left)" -gt 12 ]; then
  timeout $(($(left) - 2)) python3 benchmarks/inference.py --systems N2 --n 131072 --no-profile \
    --module "${PREVARG[@]}" --fused tf32x3:auto:auto:on 2>&1 | tee "$OUTDIR/inference_sto3g.log"
fi
echo "# $SECONDS s in all"
