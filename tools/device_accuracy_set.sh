#!/usr/bin/env bash
# One device-tool call for the accuracy set: every (system, seed) run of one or more groups side
# by side on the one GPU (benchmarks/accuracy_small.py --jobs), under the CUDA MPS daemon when it
# starts, so that the small kernels of the many processes overlap. The tree's compiled modules are
# prebuilt (tools/prebuild_py312.sh), so nothing is compiled on the device: run it with
# PYTHONPATH set to the tree. Each argument is a group,
# LABEL|SYSTEMS[|RUNNER_JSON[|ANSATZ_JSON[|ITERS[|NICE[|SEEDS]]]]]] (SYSTEMS comma-separated; the JSONs
# replace Runner / Ansatz defaults for that group; ITERS, the group's iteration count and with it
# its rate schedule, replaces the ITERS below; NICE, a niceness for the group's processes, lets
# the long runs of another group keep the host's cores when many short ones share them; SEEDS, the
# group's seeds, replaces the SEEDS below). Every run
# stops DEADLINE seconds after the start (default 130); CACHE=DIR holds reference energies and
# integrals made elsewhere (accuracy_small.py --cache); SEEDS (default 0,1,2); ITERS (default:
# the default iteration count); DEVICE (default cuda, cpu for a dry run); MAXJOBS (default: no
# limit), the most runs of one group at once (the rest wait for a free slot; the MPS server takes
# a limited number of client processes); CKPT=DIR (relative to the tree) keeps a checkpoint per
# run in DIR/LABEL and resumes from it (accuracy_small.py --checkpoint-dir), so a schedule longer
# than one call continues in the next: each checkpoint comes back as ckpt_LABEL_RUN.h5.tgz (unpack
# them into the tree's DIR and carry DIR to the next call); MPS=0 leaves the MPS daemon off. Logs, JSON and
# histories land in $OUT (JSON beside acc_histories.tgz, which holds the histories, the logs and
# gpu.log: GPU use and load sampled every 10 s).
#   usage (device tool): [DEADLINE=S] [CACHE=DIR] bash tools/device_accuracy_set.sh GROUP...
set -uo pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
out=${OUT:-out}
mkdir -p "$out/acc"
root=$(pwd)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc --all
export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
mps=0
if [ "${MPS:-1}" = 0 ]; then
  echo "MPS=0: processes share the GPU by time slicing"
elif nvidia-cuda-mps-control -d; then
  mps=1
  echo "MPS daemon started"
else
  echo "MPS daemon did not start: processes share the GPU by time slicing"
fi
(while true; do
  echo "$(date +%T) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader) load $(cut -d' ' -f1 /proc/loadavg)"
  sleep 10
done) > "$out/gpu.log" 2>&1 &
sampler=$!
extra=()
[ -n "${CACHE:-}" ] && extra+=(--cache "$root/$CACHE")
pids=()
for group in "$@"; do
  IFS='|' read -r label systems runner ansatz iters niceness seeds <<< "$group"
  iters=${iters:-${ITERS:-}}
  seeds=${seeds:-${SEEDS:-0,1,2}}
  read -ra names <<< "${systems//,/ }"
  nseeds=$(tr ',' '\n' <<< "$seeds" | wc -l)
  jobs=$((${#names[@]} * nseeds))
  [ -n "${MAXJOBS:-}" ] && [ "$jobs" -gt "$MAXJOBS" ] && jobs=$MAXJOBS
  nice -n "${niceness:-0}" python3 benchmarks/accuracy_small.py "${names[@]}" --seeds "$seeds" --device "${DEVICE:-cuda}" \
    --jobs "$jobs" --deadline "${DEADLINE:-130}" \
    --runner "${runner:-{\}}" --ansatz "${ansatz:-{\}}" ${iters:+--iters "$iters"} "${extra[@]}" \
    ${CKPT:+--checkpoint-dir "$root/$CKPT/$label"} \
    --out "$out/acc/$label" --json-out "$out/acc_$label.json" > "$out/acc_$label.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
kill "$sampler"
[ "$mps" = 1 ] && echo quit | nvidia-cuda-mps-control
for group in "$@"; do
  label=${group%%|*}
  grep -v "^\S* seed [0-9]*:" "$out/acc_$label.log" | tail -40
done
# one archive (the device tool returns a limited number of files): histories, logs, GPU samples
mv "$out"/acc_*.log "$out/gpu.log" "$out/acc/"
tar czf "$out/acc_histories.tgz" -C "$out" acc && rm -rf "$out/acc"
# one archive per checkpoint (the tool returns files up to 16 MiB; one of a 10-site chain is ~7)
if [ -n "${CKPT:-}" ]; then
  for f in "$root/$CKPT"/*/*.h5; do
    [ -e "$f" ] || continue
    rel=${f#"$root/$CKPT/"}
    tar czf "$out/ckpt_${rel//\//_}.tgz" -C "$root/$CKPT" "$rel"
  done
fi
