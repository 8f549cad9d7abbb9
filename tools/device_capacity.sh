#!/usr/bin/env bash
# One device-tool call of probes side by side on the one GPU (under the CUDA MPS daemon when it
# starts). Each argument is one probe, LABEL|ARGS: ARGS are tools/lattice_capacity.py's
# command-line arguments, or a Python script of the tree (e.g. benchmarks/accuracy_small.py)
# followed by its arguments (word-split either way). Every probe stops DEADLINE seconds after
# the start (default 400) and its log comes back as $OUT/cap_LABEL.log (the probes print as they
# go, so a stopped one still reports). Before the probes, alone on the GPU: TESTS (pytest
# arguments) with this tree, and with BASE_NNQS set, BASE_TESTS with the tree whose
# cuscikit/nnqs is BASE_NNQS's (tools/device_base.sh); their output lands in $OUT/tests.log.
# The tree's compiled modules are prebuilt (tools/prebuild_py312.sh).
#   usage (device tool): [DEADLINE=S] [TESTS=...] [BASE_NNQS=DIR BASE_TESTS=...] \
#     bash tools/device_capacity.sh 'LABEL|ARGS'...
source tools/device_base.sh
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  (echo "== this tree: $TESTS"; timeout 300 python3 -m pytest -q -p no:cacheprovider $TESTS) \
    >>"$out/tests.log" 2>&1
fi
if [ -n "$base" ] && [ -n "${BASE_TESTS:-}" ]; then
  # shellcheck disable=SC2086
  (echo "== base tree: $BASE_TESTS"; cd "$base" && cp -r "$root/tests" "$root/pyproject.toml" . \
    && PYTHONPATH=$base timeout 300 python3 -m pytest -q -p no:cacheprovider $BASE_TESTS) \
    >>"$out/tests.log" 2>&1
fi
[ -f "$out/tests.log" ] && tail -n 15 "$out/tests.log"
export OMP_NUM_THREADS=2 CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && echo "MPS daemon started"
pids=()
for probe in "$@"; do
  label=${probe%%|*}
  args=${probe#*|}
  script=tools/lattice_capacity.py
  case $args in *.py\ *) script=${args%% *}; args=${args#* } ;; esac
  # shellcheck disable=SC2086
  timeout "${DEADLINE:-400}" python3 "$script" $args >"$out/cap_$label.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo quit | nvidia-cuda-mps-control 2>/dev/null
tail -n 4 "$out"/cap_*.log
