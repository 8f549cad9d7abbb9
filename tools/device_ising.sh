#!/usr/bin/env bash
# On a GPU machine: build cuscikit with its CUDA kernels (or use modules prebuilt for this Python
# in cuscikit/), run the dSB GPU tests (CPU == GPU byte for byte) and, only when they pass, the
# dSB benchmarks on the GPU. Logs go to $OUT (default ./device_ising_out).
# Usage: bash tools/device_ising.sh
# Env: GSET_DIR (graphs + best_known.json), SB_WHEELS (a folder with the simulated-bifurcation
# wheel; its dependencies numpy, sympy, torch and tqdm must be installed), THROUGHPUT_ARGS,
# TUNE_ARGS (a K2000 parameter scan; empty skips it), QUALITY_ARGS, K2000_ARGS (the word none
# skips that step, also for THROUGHPUT_ARGS), GPU_TESTS (pytest arguments, default tests/ising),
# *_TIMEOUT.
set -u
OUT=${OUT:-$PWD/device_ising_out}
GSET_DIR=${GSET_DIR:-${CUSCIKIT_GSET_DIR:-gset}}  # the G-set folder (with best_known.json)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
GSET_DIR=$(cd "$GSET_DIR" 2> /dev/null && pwd || echo "$GSET_DIR")
cd "$(dirname "$0")/.."
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
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
if [ -n "${SB_WHEELS:-}" ]; then
  # --target: the image's Python may refuse installs into its own site-packages.
  python -m pip install -q --no-index --no-deps --no-compile --target /tmp/sb_site \
    "$SB_WHEELS"/simulated_bifurcation-*.whl >> "$OUT/build.log" 2>&1 \
    && export PYTHONPATH="$PYTHONPATH:/tmp/sb_site"
  python -c "import simulated_bifurcation as sb; print('simulated-bifurcation', sb.__version__)" \
    2>&1 | tee -a "$OUT/machine.txt"
fi

echo "== GPU tests"
timeout "${TEST_TIMEOUT:-300}" python -m pytest -m gpu ${GPU_TESTS:-tests/ising} -q \
  -p no:cacheprovider -rA > "$OUT/pytest_gpu.log" 2>&1
status=$?
echo "pytest exit status $status" | tee -a "$OUT/pytest_gpu.log"
tail -15 "$OUT/pytest_gpu.log"
if [ "$status" != 0 ] && [ -z "${FORCE:-}" ]; then
  echo "GPU tests failed: benchmarks skipped (FORCE=1 runs them anyway)"
  exit 1
fi

run() {  # run NAME TIMEOUT ARGS...: one benchmark into $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  (cd benchmarks && timeout "$limit" python "$@") > "$OUT/$name.log" 2>&1
  echo "exit status $?" >> "$OUT/$name.log"
  cat "$OUT/$name.log"
}
if [ "${THROUGHPUT_ARGS:-}" != none ]; then
  run throughput_cuda "${THROUGHPUT_TIMEOUT:-120}" ising_throughput.py --device cuda \
    ${THROUGHPUT_ARGS:---n 2048 8192 --agents 128 1024 --steps 100}
fi
if [ -n "${TUNE_ARGS:-}" ]; then
  run tune_k2000 "${TUNE_TIMEOUT:-120}" ising_quality.py --device cuda --gset-dir "$GSET_DIR" \
    --graphs K2000 --no-baselines $TUNE_ARGS
fi
if [ "${K2000_ARGS:-}" != none ]; then
  run quality_k2000_1s "${K2000_TIMEOUT:-60}" ising_quality.py --device cuda \
    --gset-dir "$GSET_DIR" --graphs K2000 --baselines sb-dsb sb-default \
    ${K2000_ARGS:---agents 1024 --steps 1000 --dt 1.0 --time-budget 1}
fi
if [ "${QUALITY_ARGS:-}" != none ]; then
  run quality_cuda "${QUALITY_TIMEOUT:-200}" ising_quality.py --device cuda \
    --gset-dir "$GSET_DIR" ${QUALITY_ARGS:---graphs G1 G22 G43 K2000 --agents 1024 --steps 5000 \
    --dt 0.75 --time-budget 10 --polish --baselines sb-dsb sb-default}
fi
