#!/usr/bin/env bash
# The gpu tests of the fused inference path, then two more block shapes of its kernel on the
# N2/cc-pVDZ model. Usage (repository root on the GPU machine): bash tools/device_fused_tests.sh OUTDIR
set -u
cd "$(dirname "$0")/.."
OUTDIR=${1:-out/device-fused}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest tests/gpu/test_fused_inference.py -q -s -p no:cacheprovider \
  -W ignore::UserWarning 2>&1 | tee "$OUTDIR/tests.log"
echo "# $SECONDS s so far"
timeout $((85 - SECONDS)) python3 benchmarks/inference.py --systems N2/cc-pVDZ --n 131072 \
  --no-profile --module --fused tf32x3:1:2 tf32x3:1:4 2>&1 | tee "$OUTDIR/sweep.log"
echo "# $SECONDS s in all"
