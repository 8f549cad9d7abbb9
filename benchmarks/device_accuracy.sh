#!/usr/bin/env bash
# One device-tool call: build, run the test suite, and the NNQS accuracy runs that are too slow
# for 2 CPU cores, several systems side by side on the one GPU. Results land in $OUT.
#   usage (device tool): [ITERS=N] bash benchmarks/device_accuracy.sh SECONDS SYSTEM...
set -uo pipefail
export PYTHONUNBUFFERED=1
limit=$1; shift
out=${OUT:-out}
mkdir -p "$out/acc"
python3 -m pip install --no-build-isolation --no-deps -e . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m cuscikit info
(OMP_NUM_THREADS=2 timeout "$limit" python3 -m pytest -q -m "not slow" -p no:cacheprovider \
   > "$out/pytest.log" 2>&1; echo "pytest exit $?" >> "$out/pytest.log") &
cd benchmarks
for s in "$@"; do
  OMP_NUM_THREADS=3 python3 accuracy_small.py "$s" --device cuda --max-seconds "$limit" \
    --iters "${ITERS:-2000}" \
    --out "$out/acc" > "$out/acc/$s.log" 2>&1 &
done
wait
tail -3 "$out/pytest.log"
for s in "$@"; do tail -6 "$out/acc/$s.log"; done
tar czf "$out/acc.tgz" -C "$out" acc && rm -rf "$out/acc"
