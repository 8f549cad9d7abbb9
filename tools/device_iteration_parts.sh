#!/usr/bin/env bash
# The parts of the N2/cc-pVDZ iteration (the fused ln psi, the phase MLP, the training pass of
# the optimiser stage), on a GPU machine through the device tool. Steps, in the order given,
# each alone on the GPU:
#   profile tools/profile_large_iteration.py (PROFILE_ARGS passed on)
#   pass    tools/profile_training_pass.py: the training pass part by part, N2/STO-3G (1,920
#           rows) and N2/cc-pVDZ (16,384 rows), with TF32 matmuls beside (PASS_ARGS passed on)
#   pipeline  the gpu tests of the device pipeline (tests/gpu/test_pipeline.py, PIPE_K selects)
#   tests   the gpu tests of the training kernels and of the fused inference (TEST_K selects in
#           the latter; default: the tensor-core paths, the trained states, the prefix stages)
#   infer   benchmarks/inference.py on N2/cc-pVDZ and N2, the default fused path in the prefix
#           order beside the float32-FMA kernel, with BASE_NNQS's fast_infer.py timed beside
#   iter    the N2/cc-pVDZ iteration of SOURCES sources (default 256,000), BASE_NNQS's package
#           first, then this tree's (tools/device_large_space.sh iter)
# Run from the tree's root with the compiled modules in place; logs land in $OUT.
#   usage: BASE_NNQS=/path/to/other/cuscikit/nnqs bash tools/device_iteration_parts.sh profile tests
# shellcheck source=tools/device_base.sh
. "$(dirname "$0")/device_base.sh"
t0=$SECONDS
for step in "$@"; do
  case $step in
    profile)
      # shellcheck disable=SC2086  # PROFILE_ARGS: words
      timeout -k 10 "${TP:-200}" python3 tools/profile_large_iteration.py ${PROFILE_ARGS:-} \
        > "$out/profile.log" 2>&1
      echo "profile: exit $? at $((SECONDS - t0)) s"
      grep -E "^\||^#" "$out/profile.log" ;;
    pass)
      for sys_n in N2:1920 N2/cc-pVDZ:16384; do
        # shellcheck disable=SC2086  # PASS_ARGS: words
        timeout -k 10 "${TPASS:-120}" python3 tools/profile_training_pass.py --tf32 \
          --system "${sys_n%%:*}" --n "${sys_n##*:}" ${PASS_ARGS:-} >> "$out/pass.log" 2>&1
        echo "pass ${sys_n}: exit $? at $((SECONDS - t0)) s"
      done
      grep -E "^\||^# [A-Z]" "$out/pass.log" ;;
    pipeline)
      timeout -k 10 "${TPIPE:-150}" python3 -m pytest -q -rA -p no:cacheprovider -m gpu \
        tests/gpu/test_pipeline.py -k "${PIPE_K:-baseline or host_staging or engines or memory_cap or shrinks or weight_growth}" \
        > "$out/tests_pipeline.log" 2>&1
      echo "tests (pipeline): exit $? at $((SECONDS - t0)) s"
      grep -E "passed|failed|Error" "$out/tests_pipeline.log" | tail -8 ;;
    tests)
      timeout -k 10 "${TT1:-120}" python3 -m pytest -q -rA -p no:cacheprovider -m gpu \
        tests/gpu/test_fused_ops_gpu.py > "$out/tests_ops.log" 2>&1
      echo "tests (training kernels): exit $? at $((SECONDS - t0)) s"
      tail -3 "$out/tests_ops.log"
      timeout -k 10 "${TT2:-200}" python3 -m pytest -q -rA -s -p no:cacheprovider -m gpu \
        tests/gpu/test_fused_inference.py -k "${TEST_K:-tf32x3 or trained or default or prefix}" \
        > "$out/tests_infer.log" 2>&1
      echo "tests (fused inference): exit $? at $((SECONDS - t0)) s"
      grep -E "phase|passed|failed|Error" "$out/tests_infer.log" | tail -12 ;;
    infer)
      prev=()
      [ -n "${BASE_NNQS:-}" ] && prev=(--previous "$BASE_NNQS/fast_infer.py")
      timeout -k 10 "${TI:-150}" python3 benchmarks/inference.py --systems N2/cc-pVDZ N2 \
        --n "${N:-262144}" --no-profile --module --fused cuda:ordered:fma cuda:ordered \
        "${prev[@]}" > "$out/infer.log" 2>&1
      echo "infer: exit $? at $((SECONDS - t0)) s"
      grep -E "^\||alone" "$out/infer.log" | tail -16 ;;
    iter)
      OUT=$out bash "$root/tools/device_large_space.sh" iter ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "done at $((SECONDS - t0)) s"
