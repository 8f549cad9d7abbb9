#!/usr/bin/env bash
# The fused kernel's weight products on one GPU, each step under a timeout, all within TOTAL
# seconds: (1) throughput of the N2/cc-pVDZ and N2/STO-3G default models (benchmarks/
# inference.py), prefix sharing on: an older fast_infer.py (PREV, if given), this one in "fp64"
# (the weight products on the float64 tensor cores) and "tf32x3" (k_chunk 16); (2)
# tools/fused_trained_check.py on float64-trained N2/STO-3G states (SEEDS, default 2 0 1 3):
# fp64, tf32x3, ieee, tf32x3 with k_chunk 0 (each product summed whole on the tensor cores) and
# PREV; (3) the gpu tests of the fused path with the time left.
# Usage (repository root on the GPU machine):
#   bash tools/device_fused_accum.sh OUTDIR [PREV] [TOTAL] [SEEDS]
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/device-fused-accum}
PREV=${2:-}
TOTAL=${3:-220}
SEEDS=${4:-2 0 1 3}
mkdir -p "$OUTDIR"
left() { echo $((TOTAL - SECONDS)); }
upto() { local l; l=$(left); l=$((l < $1 ? l : $1)); echo $((l > 1 ? l : 1)); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
torch.cuda.get_device_name())" 2>&1
PREVARG=()
FASTARG=()
[ -n "$PREV" ] && PREVARG=(--previous "$PREV") && FASTARG=(--fast "$PREV")
timeout -k 10 "$(upto 90)" python3 benchmarks/inference.py --systems N2/cc-pVDZ N2 --n 65536 \
  --no-profile --module "${PREVARG[@]}" --fused fp64:auto:auto:on tf32x3:auto:auto:on \
  --json "$OUTDIR/inference.json" 2>&1 | tee "$OUTDIR/inference.log"
echo "# $SECONDS s so far"
# shellcheck disable=SC2086
timeout -k 10 "$(upto 70)" python3 tools/fused_trained_check.py --seeds $SEEDS --dtypes float64 \
  --k-chunks 0 "${FASTARG[@]}" 2>&1 | tee "$OUTDIR/trained.log"
echo "# $SECONDS s so far"
timeout -k 10 "$(upto 120)" python3 -m pytest tests/gpu/test_fused_inference.py -v -s \
  -p no:cacheprovider -W ignore::UserWarning 2>&1 | tee "$OUTDIR/tests.log"
echo "# $SECONDS s in all"
