#!/usr/bin/env bash
# Block shapes and precisions of the fused inference kernel on both default models
# (benchmarks/inference.py; eager float32 as the anchor). Usage: bash tools/device_fused_sweep.sh OUTDIR
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/device-fused}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
torch.cuda.get_device_name())" 2>&1
timeout 100 python3 benchmarks/inference.py --systems N2/cc-pVDZ --n 262144 --no-profile --module \
  --fused tf32x3:2:4 tf32x3:1:4 tf32x3:2:8 tf32x3:4:8 tf32x3:4:4 tf32:2:4 ieee:2:4 \
  2>&1 | tee "$OUTDIR/sweep_ccpvdz.log"
timeout 60 python3 benchmarks/inference.py --systems N2 --n 262144 --no-profile --module \
  --fused tf32x3:4:4 tf32x3:8:4 tf32x3:8:8 tf32x3:16:8 tf32:8:4 2>&1 | tee "$OUTDIR/sweep_sto3g.log"
echo "# $SECONDS s in all"
