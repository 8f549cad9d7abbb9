#!/usr/bin/env bash
# One device-tool call: short default runs of benchmarks/accuracy_small.py under NVIDIA's
# compute-sanitizer (TOOL: initcheck, reads of device memory never written; memcheck, accesses
# out of bounds), one process per system, side by side on the one GPU (no MPS daemon). Each
# run stops after RUN_SECONDS (default 200) of iterations. A log per system and a summary of the
# reports by kernel land in $OUT. The compiled modules are prebuilt (tools/prebuild_py312.sh):
# run it with PYTHONPATH set to the tree. RUNNER (JSON) replaces Runner defaults, e.g.
# '{"graphs": false}' for the eager optimiser stage, whose kernels keep their host backtraces
# (a kernel replayed from a CUDA graph has none); PRINT_LIMIT (default 200) reports per process.
#   usage (device tool): [TOOL=initcheck] [RUN_SECONDS=200] [CACHE=DIR] [RUNNER=JSON] bash tools/device_sanitize.sh SYSTEM...
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
tool=${TOOL:-initcheck}
extra=()
[ -n "${CACHE:-}" ] && extra+=(--cache "$CACHE")
pids=()
for s in "$@"; do
  compute-sanitizer --tool "$tool" --print-limit "${PRINT_LIMIT:-200}" \
    python3 benchmarks/accuracy_small.py "$s" --seeds 0 --device cuda --max-seconds "${RUN_SECONDS:-200}" \
    --runner "${RUNNER:-{\}}" "${extra[@]}" --out "$out/hist_$s" > "$out/${tool}_$s.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for s in "$@"; do
  f="$out/${tool}_$s.log"
  echo "== $s: $(grep -c '^=========     ' "$f") report lines; summary: $(grep 'ERROR SUMMARY' "$f")"
  grep -E '^========= +(Uninitialized|Invalid|Address|Program hit)' "$f" | sort | uniq -c | head -20
  grep -E '^========= +at .*(kernel|_kernel|0x)' "$f" | sed 's/0x[0-9a-f]*//g' | sort | uniq -c | sort -rn | head -15
  grep -E 'seed 0|error|FAILED' "$f" | tail -5
done
# this script's logs only (other jobs of the same call may still be writing theirs)
logs=()
for s in "$@"; do logs+=("${tool}_$s.log"); done
tar czf "$out/sanitize_logs.tgz" -C "$out" "${logs[@]}" && (cd "$out" && rm -f "${logs[@]}")
