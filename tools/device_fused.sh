#!/usr/bin/env bash
# The fused-inference measurements on one GPU, in priority order, each step under a timeout so the
# whole run stays inside TOTAL seconds: (1) block shapes and precisions of the fused kernel on
# both default models, eager float32 as the anchor (benchmarks/inference.py); (2) one N2/cc-pVDZ
# iteration from 256,000 sources with the fastest tf32x3 shape within 1e-5 (benchmarks/
# gpu_pipeline.py iteration); (3) the gpu tests of the fused path; (4) with the time left, module
# vs fused iterations in one process at 16,000 sources.
# Usage (repository root on the GPU machine): bash tools/device_fused.sh OUTDIR [TOTAL]
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/device-fused}
TOTAL=${2:-270}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
left() { echo $((TOTAL - SECONDS)); }
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
torch.cuda.get_device_name())" 2>&1
timeout 80 python3 benchmarks/inference.py --systems N2/cc-pVDZ --n 262144 --no-profile --module \
  --fused tf32x3:2:4 tf32x3:4:8 tf32x3:1:4 tf32x3:2:8 tf32:2:4 ieee:2:4 \
  --json "$OUTDIR/inference_ccpvdz.json" 2>&1 | tee "$OUTDIR/inference_ccpvdz.log"
timeout 45 python3 benchmarks/inference.py --systems N2 --n 262144 --no-profile --module \
  --fused tf32x3:8:4 tf32x3:16:8 tf32x3:4:4 tf32x3:8:8 \
  --json "$OUTDIR/inference_sto3g.json" 2>&1 | tee "$OUTDIR/inference_sto3g.log"
BEST=$(python3 - "$OUTDIR/inference_ccpvdz.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except Exception:
    rows = []
ok = [r for r in rows if r[3].startswith("fused tf32x3") and float(r[5]) <= 1e-5]
if ok:
    best = max(ok, key=lambda r: float(r[4]))[3].split()
    print(f"--fused-block {best[3]} --fused-warps {best[5]}")
PY
)
echo "# $SECONDS s so far; iteration with: ${BEST:-library defaults}"
timeout $(($(left) - 50)) python3 benchmarks/gpu_pipeline.py iteration --pipelines gpu \
  --inference fused --sources 256000 --max-seconds 80 $BEST 2>&1 | tee "$OUTDIR/iteration_256k.log"
echo "# $SECONDS s so far"
timeout $(($(left) - 5)) python3 -m pytest tests/gpu/test_fused_inference.py -x -q -s \
  -p no:cacheprovider 2>&1 | tee "$OUTDIR/tests.log"
echo "# $SECONDS s so far"
if [ "$(left)" -gt 40 ]; then
  timeout $(($(left) - 3)) python3 benchmarks/gpu_pipeline.py iteration --pipelines gpu \
    --inference module,fused --sources 16000 --max-seconds 60 $BEST 2>&1 \
    | tee "$OUTDIR/iteration_16k.log"
fi
echo "# $SECONDS s in all"
