#!/usr/bin/env bash
# On a GPU machine: the dSB request service's GPU tests (every reply equals the CPU reference)
# and benchmarks/ising_service.py over the GPU backends (resident kernel, one launch per request)
# and the CPU workers, server and load generator on separate cores. Uses prebuilt modules in
# cuscikit/ when present (tools/prebuild_py312.sh), else builds. Logs and JSON go to $OUT.
# Env: RATES (GPU offered rates), CPU_RATES, SIZES, DURATION.
set -u
OUT=${OUT:-$PWD/device_ising_service_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{
  date -u
  nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
} > "$OUT/machine.txt"
if ls cuscikit/_cuda.cpython-*.so > /dev/null 2>&1; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif ! CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -e . \
    -C cmake.define.CUSCIKIT_CUDA=ON > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi
python3 -c "import cuscikit._cuda as c; print('cuda kernels for sm', c.build_arch())" 2>&1 \
  | tee -a "$OUT/machine.txt"
SIZES=${SIZES:-64 256 1024}
half=$(( $(nproc) / 2 ))
CORES="--server-cores 0-$((half - 1)) --client-cores $half-$(( $(nproc) - 1 ))"

echo "== GPU tests"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu tests/ising/test_service.py -q -x \
  -p no:cacheprovider -rA > "$OUT/service_tests.log" 2>&1
echo "pytest exit status $?" | tee -a "$OUT/service_tests.log"
tail -8 "$OUT/service_tests.log"

echo "== GPU backends"
timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/ising_service.py --backends resident launch \
  --n $SIZES --rates ${RATES:-100000 200000 400000 600000 800000 1000000} \
  --duration "${DURATION:-1}" --check 2003 $CORES --json-out "$OUT/service_gpu.json" \
  > "$OUT/service_gpu.log" 2>&1
echo "exit status $?" >> "$OUT/service_gpu.log"
cat "$OUT/service_gpu.log"

echo "== CPU backend"
timeout "${CPU_TIMEOUT:-90}" python3 benchmarks/ising_service.py --backends cpu --n $SIZES \
  --rates ${CPU_RATES:-20000 100000} --duration "${DURATION:-1}" --check 2003 $CORES \
  --json-out "$OUT/service_cpu.json" > "$OUT/service_cpu.log" 2>&1
echo "exit status $?" >> "$OUT/service_cpu.log"
cat "$OUT/service_cpu.log"
