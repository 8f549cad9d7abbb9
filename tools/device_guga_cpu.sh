#!/usr/bin/env bash
# GUGA CI against PySCF on a GPU machine's idle CPUs, in one call: PySCF from wheels carried in
# WHL (default whl-pyscf), the rows of tools/guga_cpu_pairs.py (each solver on CPUs of its own,
# 2 threads) within DEADLINE seconds of the whole script (pip install included), and beside them the GUGA GPU tests pinned to CPUs the
# benchmark leaves free (GPU_TESTS=0 skips them). Expects the compiled modules in cuscikit/
# (tools/prebuild_py312.sh). Logs and the JSON of every finished job land in $OUT.
#   usage: DEADLINE=140 bash tools/device_guga_cpu.sh 14:2 12:2 12:0 10:2 10:0 14:0
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "${WHL:-whl-pyscf}"/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
lscpu > "$out/lscpu.txt" 2>&1
ncpu=$(nproc)
if [ "${GPU_TESTS:-1}" = 1 ]; then
  # the last two logical CPUs for the GPU tests; the benchmark takes the others
  (OUT=$out/gpu DEADLINE=$((${DEADLINE:-140} - 5)) taskset -c $((ncpu - 2)),$((ncpu - 1)) \
    bash tools/device_gpu_tests.sh tests/guga/test_gpu.py > "$out/gpu_tests.txt" 2>&1) &
  bench_cpus=0-$((ncpu - 3))
else
  bench_cpus=0-$((ncpu - 1))
fi
taskset -c "$bench_cpus" python3 tools/guga_cpu_pairs.py --rows "$@" --threads 2 --repeat 0 \
  --out "$out/rows" --deadline $((${DEADLINE:-140} - SECONDS - 5)) 2>&1 | tee "$out/pairs.txt"
wait
cat "$out/gpu_tests.txt" 2>/dev/null
