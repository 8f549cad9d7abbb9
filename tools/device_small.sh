#!/usr/bin/env bash
# N2/STO-3G iteration time on a GPU machine through the device tool, benchmarks/small_iteration.py
# with its defaults (200 iterations, medians over iterations 20-200), in two phases:
#   1. alone on the GPU, one after the other: float32, recorded optimiser stage, profiled
#      (--profile), first with the nnqs package of BASE_NNQS laid over this tree (the "before",
#      e.g. the main branch's cuscikit/nnqs), then this tree (the "after");
#   2. side by side (their timings share the GPU, only their results count): the float64
#      comparison of the eager and the recorded stage over 200 iterations, the gpu tests of the
#      recorded stage, and the profile with a compiled ln psi (25 iterations, --profile-compile).
# Run from the tree's root with the compiled modules in place; logs land in $OUT.
#   usage: BASE_NNQS=/path/to/other/cuscikit/nnqs bash tools/device_small.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-out}
mkdir -p "$out"
root=$PWD
export PYTHONPATH=$root
python3 -c "from cuscikit.backends import cuda; k = cuda(); print('kernels sm_' + k.build_arch())" \
  || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t0=$SECONDS
if [ -n "${BASE_NNQS:-}" ]; then
  base=$(mktemp -d)
  cp -r "$root/cuscikit" "$base/" && cp "$BASE_NNQS"/*.py "$base/cuscikit/nnqs/"
  (cd benchmarks && PYTHONPATH=$base timeout "${T1:-40}" python3 small_iteration.py \
    --variants graph --profile) > "$out/f32_before.log" 2>&1
  echo "before: exit $? at $((SECONDS - t0)) s"
fi
(cd benchmarks && timeout "${T1:-40}" python3 small_iteration.py --variants graph --profile) \
  > "$out/f32_after.log" 2>&1
echo "after: exit $? at $((SECONDS - t0)) s"
(cd benchmarks && timeout "${T64:-80}" python3 small_iteration.py --float64 \
  --variants eager graph) > "$out/f64.log" 2>&1 &
timeout "${TT:-70}" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/gpu/test_optimizer_graph.py > "$out/tests.log" 2>&1 &
if [ "${COMPILE:-1}" = 1 ]; then
  (cd benchmarks && timeout "${TC:-70}" python3 small_iteration.py --iterations 25 \
    --variants graph --profile-compile) > "$out/compile.log" 2>&1 &
fi
wait
echo "phase 2 done at $((SECONDS - t0)) s"
for f in f32_before f32_after f64 compile; do
  [ -f "$out/$f.log" ] && { echo "== $f"; tail -14 "$out/$f.log"; }
done
echo "== tests"; tail -4 "$out/tests.log"
