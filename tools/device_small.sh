#!/usr/bin/env bash
# N2/STO-3G iteration time on a GPU machine through the device tool (benchmarks/small_iteration.py,
# defaults: 200 iterations, medians over iterations 20-200). Steps, run in the order given:
#   before  float32, recorded optimiser stage, profiled (--profile), with the nnqs package of
#           BASE_NNQS laid over this tree (e.g. the main branch's cuscikit/nnqs), alone on the GPU;
#           VARIANTS (default: graph) picks the variants, e.g. "graph graph-teacher0"; medians
#           from iteration FROM (default 20) of ITERS (e.g. ITERS=320 FROM=230: after the teacher)
#   kernels the training kernels alone (small_iteration.py --kernels): microseconds per call,
#           the attention at 1/2/4 warps per program; "after" then runs with the fastest
#   after   the same with this tree, alone on the GPU (VARIANTS too)
#   side    side by side (their timings share the GPU; only their results count): float64 eager
#           against recorded over 200 iterations, the gpu tests of the recorded stage, and the
#           profile with a compiled ln psi (25 iterations, --profile-compile)
#   compile the compiled-ln-psi profile of "side", alone on the GPU
#   repro   float64 with BASE_NNQS's package: eager, eager again and recorded (ITERS iterations,
#           default 200): does the eager path reproduce itself, and the recorded one it?
#   ops     float32, recorded stage, torch's kernels against the Triton training kernels
#           (cuscikit/nnqs/fused_ops.py) in one process, profiled, alone on the GPU
#   infer   inference throughput and error of the fused ln psi (benchmarks/inference.py, no
#           module variants) on INFER_SYSTEMS (default: N2/cc-pVDZ N2), INFER_N configurations
#           (default 262144), the fused variants FUSED, with PREVIOUS_FAST (another version of
#           cuscikit/nnqs/fast_infer.py, e.g. the main branch's) timed beside, alone on the GPU
#   check   side by side: float64 over ITERS64 iterations (default 60) of VARIANTS64 (default:
#           recorded with torch's kernels, recorded and eager with the Triton ones); the gpu
#           tests of TEST_FILES (default: the kernels and the recorded stage), one pytest
#           process per file, selected by TEST_K, with PYTEST_ARGS
#   runs    whole default runs of RUN_ITERS iterations (default 2000): this tree's first with
#           Triton's cache emptied (what it compiles: triton_cache.txt), then BASE_NNQS's package
#           and this tree alternately, RUNS times each (default 2), the cache warm
#   compare64  float64 over ITERS64 iterations of VARIANTS64 (default: graph graph-teacher0),
#           BASE_NNQS's package first, then this tree compared with it variant by variant,
#           while the gpu tests of TEST_FILES (default: the recorded stage and the pipeline)
#           run beside them, one pytest process per file
# A pytest process that ignores the limit's SIGTERM is killed 10 s later (timeout -k 10).
# Run from the tree's root with the compiled modules in place; logs land in $OUT.
#   usage: BASE_NNQS=/path/to/other/cuscikit/nnqs bash tools/device_small.sh before after side
# shellcheck source=tools/device_base.sh
. "$(dirname "$0")/device_base.sh"
t0=$SECONDS
for step in "$@"; do
  case $step in
    before)
      # shellcheck disable=SC2086  # VARIANTS: words
      (cd benchmarks && PYTHONPATH=$base timeout "${T1:-40}" python3 small_iteration.py \
        --iterations "${ITERS:-200}" --from "${FROM:-20}" --variants ${VARIANTS:-graph} \
        --profile --json-out "$out/f32_before.json") > "$out/f32_before.log" 2>&1
      echo "before: exit $? at $((SECONDS - t0)) s" ;;
    kernels)
      (cd benchmarks && timeout "${TK:-40}" python3 small_iteration.py --kernels) \
        > "$out/kernels.log" 2>&1
      echo "kernels: exit $? at $((SECONDS - t0)) s"
      warps=$(sed -n 's/^# best attention warps: \([0-9]*\)$/\1/p' "$out/kernels.log")
      [ -n "$warps" ] && warps_arg="--attn-warps $warps" ;;
    after)
      # shellcheck disable=SC2086  # warps_arg: empty, or the option and its value; VARIANTS
      (cd benchmarks && timeout "${T1:-40}" python3 small_iteration.py ${warps_arg:-} \
        --iterations "${ITERS:-200}" --from "${FROM:-20}" --variants ${VARIANTS:-graph} \
        --profile --json-out "$out/f32_after.json") > "$out/f32_after.log" 2>&1
      echo "after: exit $? at $((SECONDS - t0)) s" ;;
    side)
      (cd benchmarks && timeout "${T64:-80}" python3 small_iteration.py --float64 \
        --variants eager graph) > "$out/f64.log" 2>&1 &
      timeout -k 10 "${TT:-70}" python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/gpu/test_optimizer_graph.py > "$out/tests.log" 2>&1 &
      (cd benchmarks && timeout "${TC:-70}" python3 small_iteration.py --iterations 25 \
        --variants graph --profile-compile) > "$out/compile.log" 2>&1 &
      wait
      echo "side: done at $((SECONDS - t0)) s" ;;
    compile)
      (cd benchmarks && timeout "${TC:-70}" python3 small_iteration.py --iterations 25 \
        --variants graph --profile-compile) > "$out/compile.log" 2>&1
      echo "compile: exit $? at $((SECONDS - t0)) s" ;;
    repro)
      (cd benchmarks && PYTHONPATH=$base timeout "${TR:-90}" python3 small_iteration.py \
        --float64 --iterations "${ITERS:-200}" --variants eager eager graph) \
        > "$out/f64_repro.log" 2>&1
      echo "repro: exit $? at $((SECONDS - t0)) s" ;;
    ops)
      (cd benchmarks && timeout "${TO:-70}" python3 small_iteration.py \
        --iterations "${ITERS:-200}" --variants graph-torch-ops graph --profile) \
        > "$out/f32_ops.log" 2>&1
      echo "ops: exit $? at $((SECONDS - t0)) s" ;;
    infer)
      prev=()
      [ -n "${PREVIOUS_FAST:-}" ] && prev=(--previous "$PREVIOUS_FAST")
      # shellcheck disable=SC2086  # the systems and variants: words
      (cd benchmarks && timeout "${TI:-90}" python3 inference.py --module --no-profile \
        --n "${INFER_N:-262144}" --systems ${INFER_SYSTEMS:-N2/cc-pVDZ N2} "${prev[@]}" \
        --fused ${FUSED:-tf32x3:auto:auto:on tf32x3:auto:auto:ordered}) > "$out/infer.log" 2>&1
      echo "infer: exit $? at $((SECONDS - t0)) s" ;;
    check)
      # shellcheck disable=SC2086  # the variants: words
      (cd benchmarks && timeout "${T64:-80}" python3 small_iteration.py --float64 ${warps_arg:-} \
        --iterations "${ITERS64:-60}" --variants ${VARIANTS64:-graph-torch-ops graph eager}) \
        > "$out/f64_ops.log" 2>&1 &
      # one pytest process per file, side by side (each compiles its own Triton kernels)
      for f in ${TEST_FILES:-tests/gpu/test_fused_ops_gpu.py tests/gpu/test_optimizer_graph.py}; do
        # shellcheck disable=SC2086  # PYTEST_ARGS: more options (e.g. -s for the printed errors)
        timeout -k 10 "${TT:-80}" python3 -m pytest -q ${PYTEST_ARGS:-} -p no:cacheprovider -m gpu \
          -k "${TEST_K:-fused or graph or small or fast_infer or inner_steps}" "$f" \
          > "$out/tests_$(basename "$f" .py).log" 2>&1 &
      done
      wait
      echo "check: done at $((SECONDS - t0)) s" ;;
    compare64)
      # the GPU tests of TEST_FILES in the background (one pytest process per file), and in
      # front float64 over ITERS64 iterations (default 40) of VARIANTS64 (default: graph
      # graph-teacher0) with BASE_NNQS's package, then with this tree compared against it
      # variant by variant (--reference)
      for f in ${TEST_FILES:-tests/gpu/test_optimizer_graph.py tests/gpu/test_pipeline.py}; do
        # shellcheck disable=SC2086  # PYTEST_ARGS: more options
        timeout -k 10 "${TT:-80}" python3 -m pytest -q ${PYTEST_ARGS:-} -p no:cacheprovider \
          -m gpu "$f" > "$out/tests_$(basename "$f" .py).log" 2>&1 &
      done
      # shellcheck disable=SC2086  # the variants: words
      (cd benchmarks && PYTHONPATH=$base timeout -k 5 "${T64:-80}" python3 small_iteration.py \
        --float64 --iterations "${ITERS64:-40}" --variants ${VARIANTS64:-graph graph-teacher0} \
        --history-out "$out/hist_base" --json-out "$out/f64_base.json") \
        > "$out/f64_base.log" 2>&1
      echo "compare64 base: exit $? at $((SECONDS - t0)) s"
      # shellcheck disable=SC2086  # the variants: words
      (cd benchmarks && timeout -k 5 "${T64:-80}" python3 small_iteration.py --float64 \
        --iterations "${ITERS64:-40}" --variants ${VARIANTS64:-graph graph-teacher0} \
        --reference "$out/hist_base" --json-out "$out/f64_branch.json") \
        > "$out/f64_branch.log" 2>&1
      echo "compare64 branch: exit $? at $((SECONDS - t0)) s"
      wait
      echo "compare64: done at $((SECONDS - t0)) s" ;;
    runs)
      # whole default runs (RUN_ITERS iterations, default 2000) as a user starts them: Triton's
      # cache emptied first (TRITON_CACHE_DIR under $out), this tree's first process compiles
      # (its kernels counted by name in triton_cache.txt), then BASE_NNQS's package and this
      # tree alternately, RUNS times each (default 2), with the cache warm
      export TRITON_CACHE_DIR="$out/triton_cache"
      rm -rf "$TRITON_CACHE_DIR"
      whole() {  # label, PYTHONPATH
        (cd benchmarks && PYTHONPATH=$2 timeout "${TW:-150}" python3 small_iteration.py \
          --iterations "${RUN_ITERS:-2000}" --variants graph --json-out "$out/run_$1.json" \
          --history-out "$out/hist_$1") > "$out/run_$1.log" 2>&1
        echo "runs $1: exit $? at $((SECONDS - t0)) s"
      }
      whole cold "$root"
      find "$TRITON_CACHE_DIR" -name "*.json" ! -name "__grp__*" -exec basename {} .json \; \
        | sort | uniq -c | sort -rn > "$out/triton_cache.txt"
      for k in $(seq "${RUNS:-2}"); do
        [ -n "$base" ] && whole "base$k" "$base"
        whole "tree$k" "$root"
      done
      for f in "$out"/run_*.log; do echo "$(basename "$f" .log): $(grep "^\['" "$f")"; done
      rm -rf "$TRITON_CACHE_DIR" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
for f in kernels f32_before f32_after f64 compile f64_repro f32_ops f64_ops f64_base f64_branch \
  infer; do
  [ -f "$out/$f.log" ] && { echo "== $f"; grep -v USDT "$out/$f.log" | tail -14; }
done
for f in "$out"/tests*.log; do [ -f "$f" ] && { echo "== $f"; tail -6 "$f"; }; done
exit 0
