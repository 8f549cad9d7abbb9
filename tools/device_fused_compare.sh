#!/usr/bin/env bash
# Side-by-side fused-inference measurements on one GPU: this tree's kernels (FUSED: the CUDA
# and the Triton one by default) against older fast_infer.py files (PREV, each with its
# defaults, in the pipeline's prefix order) on both default models (benchmarks/inference.py,
# eager float32 as the anchor), then the GPU tests of the fused path (TESTS, TEST_SECONDS),
# then one N2/cc-pVDZ iteration from up to 256,000 sources with the time left
# (benchmarks/gpu_pipeline.py; ITER_INFERENCE, by default both kernels). Each step runs under
# a timeout so the whole stays inside TOTAL seconds. Usage (repository root on the GPU
# machine):
#   PREV="old/fast_infer.py ..." bash tools/device_fused_compare.sh OUTDIR [TOTAL]
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/device-fused-compare}
TOTAL=${2:-540}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
left() { echo $((TOTAL - SECONDS)); }
read -r -a prev <<< "${PREV:-}"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
torch.cuda.get_device_name())" 2>&1 | tee "$OUTDIR/env.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >> "$OUTDIR/env.log"
timeout 150 python3 benchmarks/inference.py --systems N2/cc-pVDZ --n 262144 --no-profile --module \
  --previous "${prev[@]}" --fused ${FUSED:-cuda:ordered fp64:auto:auto:ordered} \
  --json "$OUTDIR/inference_ccpvdz.json" 2>&1 | tee "$OUTDIR/inference.log"
echo "# $SECONDS s so far"
timeout 70 python3 benchmarks/inference.py --systems N2 --n 262144 --no-profile --module \
  --previous "${prev[@]}" --fused ${FUSED_STO3G:-cuda:ordered fp64:auto:auto:ordered} \
  --json "$OUTDIR/inference_sto3g.json" 2>&1 | tee -a "$OUTDIR/inference.log"
echo "# $SECONDS s so far"
timeout $(($(left) > 400 ? ${TEST_SECONDS:-220} : $(left) / 2)) python3 -m pytest ${TESTS:-tests/gpu/test_fused_inference.py} \
  -q -rA -p no:cacheprovider 2>&1 | tee "$OUTDIR/tests.log" | tail -40
echo "# $SECONDS s so far"
if [ "$(left)" -gt 90 ]; then
  timeout $(($(left) - 5)) python3 benchmarks/gpu_pipeline.py iteration --pipelines gpu \
    --inference ${ITER_INFERENCE:-fused-cuda,fused-triton} --sources 256000 --max-seconds $(($(left) - 60)) 2>&1 \
    | tee "$OUTDIR/iteration.log"
fi
echo "# $SECONDS s in all"
