#!/usr/bin/env bash
# Two builds of the compiled modules timed side by side on a GPU machine through the device tool:
# the N2/cc-pVDZ inference benchmark (benchmarks/inference.py, FUSED variants) with build A, B,
# A, B (each its own process), then the gpu tests TEST_K of tests/gpu/test_fused_inference.py
# with build B. A and B are folders of *.so built by tools/prebuild_py312.sh.
#   usage: bash tools/device_ab_builds.sh DIR_A DIR_B      (logs in $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for v in A B A B; do
  dir=$1
  [ "$v" = B ] && dir=$2
  cp "$dir"/*.so cuscikit/
  timeout 40 python3 benchmarks/inference.py --systems N2/cc-pVDZ --n 262144 --no-profile \
    --fused ${FUSED:-cuda:ordered:fma cuda:ordered:tf32x3} > "$out/infer_$v.log" 2>&1
  echo "== build $v"
  grep -E "alone" "$out/infer_$v.log" | sed 's/^# //'
  grep -E "^N2/cc" "$out/infer_$v.log" | grep fused | awk '{print $(NF-1), $NF}'
  cat "$out/infer_$v.log" >> "$out/infer_all.log"
done
timeout -k 5 "${TT:-100}" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_fused_inference.py -k "${TEST_K:-cuda-tf32x3}" 2>&1 | tail -2
