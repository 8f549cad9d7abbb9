#!/usr/bin/env bash
# One device-tool call: build, run the test suite, and the NNQS accuracy runs that are too slow
# for 2 CPU cores, several systems side by side on the one GPU. Results land in $OUT.
# Systems are spread round-robin over the GPUs; TESTS=0 skips the test suite, COMPILE=1 adds
# --compile to the runs. CKPT=DIR (relative to the repository, e.g. out/ckpt, carried to the
# device with the run tool's `carry`) keeps a checkpoint per system there, resumes from it and
# copies it back under $OUT/ckpt: runs longer than one call continue in the next. ANSATZ='{"k": v}'
# replaces ansatz defaults, RUNNER='{"k": v}' runner defaults, LR_DECAY=FROM,LR (or none) the
# rate's tail decay (a candidate default checked on the whole set; give it its own CKPT).
# FIRST_ALONE=1 gives the first system GPU 0 to itself.
#   usage (device tool): [ITERS=N] [TESTS=0] [COMPILE=1] bash tools/device_accuracy.sh SECONDS SYSTEM...
set -uo pipefail
export PYTHONUNBUFFERED=1
limit=$1; shift
out=${OUT:-out}
mkdir -p "$out/acc"
python3 -m pip install --no-build-isolation --no-deps -e . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m cuscikit info
[ "${TESTS:-1}" != 0 ] && (OMP_NUM_THREADS=2 timeout "$limit" python3 -m pytest -q -m "not slow" -p no:cacheprovider \
   > "$out/pytest.log" 2>&1; echo "pytest exit $?" >> "$out/pytest.log") &
cd benchmarks
ngpu=$(nvidia-smi -L | wc -l)
extra=()
[ "${COMPILE:-0}" = 1 ] && extra+=(--compile)
[ -n "${CKPT:-}" ] && extra+=(--checkpoint-dir "$PWD/../$CKPT")
[ -n "${ANSATZ:-}" ] && extra+=(--ansatz "$ANSATZ")
[ -n "${RUNNER:-}" ] && extra+=(--runner "$RUNNER")
[ -n "${LR_DECAY:-}" ] && extra+=(--lr-decay "$LR_DECAY")
k=0
for s in "$@"; do
  gpu=$((k % ngpu))
  # FIRST_ALONE=1: the first system (the slowest) has GPU 0 to itself, the rest share the others
  [ "${FIRST_ALONE:-0}" = 1 ] && [ "$ngpu" -gt 1 ] && gpu=$(( k == 0 ? 0 : 1 + (k - 1) % (ngpu - 1) ))
  CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=3 python3 accuracy_small.py "$s" \
    --device cuda --max-seconds "$limit" --iters "${ITERS:-2000}" "${extra[@]}" \
    --out "$out/acc" > "$out/acc/$s.log" 2>&1 &
  k=$((k + 1))
done
wait
[ -f "$out/pytest.log" ] && tail -3 "$out/pytest.log"
for s in "$@"; do tail -6 "$out/acc/$s.log"; done
[ -n "${CKPT:-}" ] && cp -r "../$CKPT" "$out/ckpt"
tar czf "$out/acc.tgz" -C "$out" acc && rm -rf "$out/acc"
