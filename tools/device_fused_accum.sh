#!/usr/bin/env bash
# The fused kernel's tf32x3 accumulation on one GPU, each step under a timeout: (1) throughput of
# the N2/cc-pVDZ and N2/STO-3G default models (benchmarks/inference.py): an older fast_infer.py
# (PREV, if given), then this one with k_chunk 16 (the default) and 0 (each product summed whole
# on the tensor cores), prefix sharing on; (2) tools/fused_trained_check.py on float64-trained
# N2/STO-3G states, seeds 0-3, k_chunk 0 and PREV beside; (3) the gpu tests of the fused path.
# The steps share TOTAL seconds (default 220): each gets at most its own limit and what is left.
# Usage (repository root on the GPU machine): bash tools/device_fused_accum.sh OUTDIR [PREV] [TOTAL]
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/device-fused-accum}
PREV=${2:-}
TOTAL=${3:-220}
mkdir -p "$OUTDIR"
left() { echo $((TOTAL - SECONDS)); }
upto() { local l; l=$(left); l=$((l < $1 ? l : $1)); echo $((l > 1 ? l : 1)); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
torch.cuda.get_device_name())" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
PREVARG=()
FASTARG=()
[ -n "$PREV" ] && PREVARG=(--previous "$PREV") && FASTARG=(--fast "$PREV")
timeout $(upto 65) python3 tools/fused_trained_check.py --seeds 0 1 2 3 --dtypes float64 \
  --k-chunks 0 "${FASTARG[@]}" 2>&1 | tee "$OUTDIR/trained.log"
echo "# $SECONDS s so far"
timeout $(upto 55) python3 benchmarks/inference.py --systems N2/cc-pVDZ N2 --n 131072 --no-profile \
  --module "${PREVARG[@]}" --fused tf32x3:auto:auto:on tf32x3:auto:auto:on:0 \
  --json "$OUTDIR/inference.json" 2>&1 | tee "$OUTDIR/inference.log"
echo "# $SECONDS s so far"
timeout $(upto 100) python3 -m pytest tests/gpu/test_fused_inference.py -v -s -p no:cacheprovider \
  -W ignore::UserWarning 2>&1 | tee "$OUTDIR/tests.log"
echo "# $SECONDS s in all"
