#!/usr/bin/env bash
# On a GPU machine: build cuscikit with its CUDA kernels, run the dSB GPU tests (CPU == GPU byte
# for byte) and the two dSB benchmarks on the GPU at modest sizes (about 5 minutes in all, of which the build takes 2-3).
# Logs go to $OUT (default ./device_ising_out). Usage: bash tools/device_ising.sh
set -u
OUT=${OUT:-$PWD/device_ising_out}
GSET_DIR=${GSET_DIR:-../shared/data/gset}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

echo "== build"
if ls cuscikit/_cuda.cpython-*.so > /dev/null 2>&1; then
  # Modules built elsewhere for this Python (carried in cuscikit/): import from the tree.
  echo "using the prebuilt modules in cuscikit/" | tee "$OUT/build.log"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif ! CMAKE_BUILD_PARALLEL_LEVEL=8 python -m pip install --no-build-isolation --no-deps -e . \
    -C cmake.define.CUSCIKIT_CUDA=ON > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "build failed"
  exit 1
fi
python -c "import cuscikit._cuda as c; print('cuda kernels for sm', c.build_arch())" 2>&1 \
  | tee -a "$OUT/machine.txt"

echo "== GPU tests"
timeout "${TEST_TIMEOUT:-300}" python -m pytest -m gpu tests/ising -q -p no:cacheprovider -rA \
  > "$OUT/pytest_gpu.log" 2>&1
echo "pytest exit status $?" | tee -a "$OUT/pytest_gpu.log"
tail -15 "$OUT/pytest_gpu.log"

if [ -f benchmarks/ising_throughput.py ]; then
  echo "== throughput"
  timeout "${BENCH_TIMEOUT:-90}" python benchmarks/ising_throughput.py --device cuda \
    ${THROUGHPUT_ARGS:---n 4096 16384 --agents 128 --steps 200} > "$OUT/throughput_cuda.log" 2>&1
  echo "exit status $?" >> "$OUT/throughput_cuda.log"
  cat "$OUT/throughput_cuda.log"
fi
if [ -f benchmarks/ising_quality.py ]; then
  echo "== quality"
  timeout "${QUALITY_TIMEOUT:-150}" python benchmarks/ising_quality.py --device cuda --gset-dir "$GSET_DIR" \
    ${QUALITY_ARGS:---graphs G1 G43 K2000 --agents 128 --steps 1000 --time-budget 4} \
    > "$OUT/quality_cuda.log" 2>&1
  echo "exit status $?" >> "$OUT/quality_cuda.log"
  cat "$OUT/quality_cuda.log"
fi
