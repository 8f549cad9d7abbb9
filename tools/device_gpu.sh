#!/usr/bin/env bash
# One device-tool call for the GPU pipeline: build with the CUDA kernels, run the GPU tests,
# then the chosen sections of gpu_pipeline.py. Logs and the JSON tables land in $OUT.
#   usage (device tool): bash tools/device_gpu.sh "PYTEST_ARGS" SECTION... [-- ARGS]
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # capped runs: less fragmentation
out=${OUT:-out}
mkdir -p "$out"
tests=$1; shift
python3 -m pip install --no-build-isolation --no-deps -e . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
grep -E "cuscikit: " "$out/build.log" | head -3
python3 -c "from cuscikit.backends import cuda; k = cuda(); print('kernels', k.build_arch(), k.device_info())" \
  || exit 1
if [ -n "$tests" ]; then
  timeout 400 python3 -m pytest -q -p no:cacheprovider $tests > "$out/pytest.log" 2>&1
  echo "pytest exit $?"; tail -25 "$out/pytest.log"
fi
args=()
for a in "$@"; do [ "$a" != "--" ] && args+=("$a"); done
set -- "${args[@]}"
if [ $# -gt 0 ]; then
  cd benchmarks && python3 gpu_pipeline.py "$@" --out "$out" 2>&1 | tee "$out/bench.log" | tail -60
fi
