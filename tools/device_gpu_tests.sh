#!/usr/bin/env bash
# The GPU tests on a GPU machine, one pytest process per file (a file that hangs or crashes
# the process does not take the others with it), in the order given, within DEADLINE seconds
# (default 420) for the whole call; only the tests marked gpu (the rest run in CI). Expects
# the compiled modules already in cuscikit/ (e.g. prebuilt for the machine's Python by
# tools/prebuild_py312.sh). A pytest process that ignores the limit's SIGTERM (a hung CUDA
# call) is killed 10 s later. Logs land in $OUT; a summary line per file is printed.
#   usage: DEADLINE=420 bash tools/device_gpu_tests.sh tests/guga/test_gpu.py tests/gpu ...
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
out=${OUT:-out}
mkdir -p "$out"
deadline=$((SECONDS + ${DEADLINE:-420}))
python3 -c "from cuscikit.backends import cuda; k = cuda(); print('kernels', k.build_arch())" \
  || exit 1
status=0
for f in "$@"; do
  left=$((deadline - SECONDS))
  if [ "$left" -lt 10 ]; then echo "$f: not run (deadline)"; status=1; continue; fi
  log="$out/$(echo "$f" | tr '/' '_').log"
  timeout -k 10 "$left" python3 -m pytest -q -p no:cacheprovider -m gpu \
    "$f" > "$log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && status=1
  echo "$f: exit $rc, $(tail -1 "$log")"
done
exit $status
