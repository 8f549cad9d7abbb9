#!/usr/bin/env bash
# The CUDA amplitude kernel with its products on the tensor cores, on a GPU machine through the
# device tool. Steps, run in the order given, each alone on the GPU:
#   tests   tests/gpu/test_fused_inference.py, TEST_K selects (default: the tensor-core cases and
#           the trained states)
#   infer   benchmarks/inference.py on N2/cc-pVDZ and N2: the float32-FMA products (the
#           anchor), fp64 and tf32x3 tensor cores, each in the prefix order, in one process
#   iter    the N2/cc-pVDZ iteration of SOURCES sources (default 256,000) with the fused
#           inference kinds in KINDS (default fused-fma,fused-tf32x3), one process, one after
#           the other (benchmarks/gpu_pipeline.py)
# Logs land in $OUT. usage: bash tools/device_tensor_cores.sh tests infer iter
# shellcheck source=tools/device_base.sh
. "$(dirname "$0")/device_base.sh"
t0=$SECONDS
for step in "$@"; do
  case $step in
    tests)
      timeout -k 10 "${TT:-200}" python3 -m pytest -q -rA -s -p no:cacheprovider -m gpu \
        tests/gpu/test_fused_inference.py -k "${TEST_K:-cuda-fp64 or cuda-tf32x3 or trained}" \
        > "$out/tests.log" 2>&1
      echo "tests: exit $? at $((SECONDS - t0)) s"
      grep -E "passed|failed|Error" "$out/tests.log" | tail -8 ;;
    infer)
      timeout -k 10 "${TI:-150}" python3 benchmarks/inference.py --systems N2/cc-pVDZ N2 \
        --n "${N:-262144}" --no-profile --module \
        --fused cuda:ordered:fma cuda:ordered:fp64 cuda:ordered:tf32x3 > "$out/infer.log" 2>&1
      echo "infer: exit $? at $((SECONDS - t0)) s"
      grep -E "^\|" "$out/infer.log" | tail -14 ;;
    iter)
      timeout -k 10 "${TIT:-300}" python3 benchmarks/gpu_pipeline.py iteration --pipelines gpu \
        --inference "${KINDS:-fused-fma,fused-tf32x3}" --sources "${SOURCES:-256000}" \
        --max-seconds 1000 > "$out/iteration.log" 2>&1
      echo "iteration: exit $? at $((SECONDS - t0)) s"
      grep -E "^gpu|^\||unique|sources" "$out/iteration.log" | tail -8 ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "done at $((SECONDS - t0)) s"
