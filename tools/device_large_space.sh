#!/usr/bin/env bash
# The optimiser stage for spaces larger than one batch, on a GPU machine through the device tool.
# Steps, run in the order given, each alone on the GPU:
#   tests   the recorded-stage gpu tests (tests/gpu/test_optimizer_graph.py), TEST_K selects
#   chain   seconds per iteration of the 10-site Hubbard chain at U = 4 (growth by weight, the
#           defaults otherwise; CHAIN_ITERS iterations, default 80, medians from CHAIN_FROM,
#           default 40): BASE_NNQS's package (e.g. the main branch's cuscikit/nnqs) with its
#           recorded stage, then this tree's with the stage recorded only within one batch
#           and with the memory rule (graph_space="auto"), one process each
#   iter    the N2/cc-pVDZ iteration of SOURCES sources (default 256,000; fused CUDA kernel,
#           benchmarks/gpu_pipeline.py), BASE_NNQS's package, then this tree's
# Run from the tree's root with the compiled modules in place; logs land in $OUT. A step's
# pytest or benchmark that ignores the limit's SIGTERM is killed 10 s later (timeout -k 10).
#   usage: BASE_NNQS=/path/to/other/cuscikit/nnqs bash tools/device_large_space.sh tests chain
# shellcheck source=tools/device_base.sh
. "$(dirname "$0")/device_base.sh"
t0=$SECONDS
chain_args=(--systems Hubbard-10-chain-U4 --options '{"growth": "weight"}'
  --iterations "${CHAIN_ITERS:-80}" --from "${CHAIN_FROM:-40}")
for step in "$@"; do
  case $step in
    tests)
      timeout -k 10 "${TT:-150}" python3 -m pytest -q -rA -p no:cacheprovider -m gpu \
        tests/gpu/test_optimizer_graph.py -k "${TEST_K:-}" > "$out/tests.log" 2>&1
      echo "tests: exit $? at $((SECONDS - t0)) s"
      tail -4 "$out/tests.log" ;;
    chain)
      if [ -n "$base" ]; then
        (cd benchmarks && PYTHONPATH=$base timeout -k 10 "${TC:-150}" python3 small_iteration.py \
          "${chain_args[@]}" --variants graph) > "$out/chain_before.log" 2>&1
        echo "chain before: exit $? at $((SECONDS - t0)) s"
      fi
      (cd benchmarks && timeout -k 10 "${TC2:-240}" python3 small_iteration.py \
        "${chain_args[@]}" --variants graph-onebatch graph \
        --json-out "$out/chain_after.json") > "$out/chain_after.log" 2>&1
      echo "chain after: exit $? at $((SECONDS - t0)) s" ;;
    iter)
      for which in before after; do
        [ "$which" = before ] && [ -z "$base" ] && continue
        pp=$root
        [ "$which" = before ] && pp=$base
        (cd "$pp" && PYTHONPATH=$pp timeout -k 10 "${TI:-200}" python3 "$root/benchmarks/gpu_pipeline.py" \
          iteration --pipelines gpu --inference fused-cuda --sources "${SOURCES:-256000}" \
          --max-seconds 1000) > "$out/iteration_$which.log" 2>&1
        echo "iteration $which: exit $? at $((SECONDS - t0)) s"
        grep -E "^gpu|unique|sources" "$out/iteration_$which.log" | tail -4
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "done at $((SECONDS - t0)) s"
