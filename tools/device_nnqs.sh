#!/usr/bin/env bash
# NNQS-SCI on a GPU machine through the device tool: build with the CUDA kernels, then any of
#   tests      the gpu and multi_gpu tests (tests/gpu, tests/parallel, tests/nnqs)
#   it1, it2   one iteration of benchmarks/multi_gpu_iteration.py on 1 or 2 GPUs
#   graphs     the gpu tests of the CUDA-graph optimiser stage and recorded inference
#   small      benchmarks/small_iteration.py (N2/STO-3G, eager vs graphed optimiser stage)
#   infer      benchmarks/inference.py --compile (every variant, with its largest error)
#   iteration  benchmarks/gpu_pipeline.py iteration (N2/cc-pVDZ, SOURCES sources)
# Logs and JSON land in $OUT (at most 8 files come back).
#   usage: bash tools/device_nnqs.sh tests it2        (kind nvidia-h200-x2)
#          SOURCES=256000 COMPILE=1 bash tools/device_nnqs.sh it1
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # NVLink multicast stays off
out=${OUT:-out}
mkdir -p "$out"
if ! python3 -c "import cuscikit._cuda" 2>/dev/null; then
  t0=$SECONDS
  python3 -m pip install --no-build-isolation --no-deps -e . > "$out/build.log" 2>&1 \
    || { tail -40 "$out/build.log"; exit 1; }
  echo "build $((SECONDS - t0)) s"
fi
python3 -c "from cuscikit.backends import cuda; k = cuda(); print('kernels sm_' + k.build_arch(), k.device_info())" \
  || exit 1
sources=${SOURCES:-256000}
compile=""; [ "${COMPILE:-1}" = 1 ] && compile="--compile"
for step in "$@"; do
  t0=$SECONDS
  case $step in
    tests)
      timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider \
        -m "gpu or multi_gpu" tests/gpu tests/parallel tests/nnqs > "$out/pytest.log" 2>&1
      echo "pytest exit $? in $((SECONDS - t0)) s"
      grep -E "passed|failed|^FAILED|^ERROR" "$out/pytest.log" | tail -15 ;;
    it1|it2)
      P=${step#it}
      (cd benchmarks && timeout "${IT_TIMEOUT:-540}" torchrun --standalone --nproc-per-node "$P" \
        multi_gpu_iteration.py --sources "$sources" $compile --out "$out/iteration.json") \
        > "$out/iteration_P$P.log" 2>&1
      echo "iteration P=$P exit $? in $((SECONDS - t0)) s"; tail -12 "$out/iteration_P$P.log" ;;
    graphs)
      timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/gpu/test_optimizer_graph.py \
        tests/gpu/test_pipeline.py::test_baseline_on_gpu_matches_gpu_pipeline \
        > "$out/graphs.log" 2>&1
      echo "graph tests exit $? in $((SECONDS - t0)) s"
      grep -E "passed|failed|^FAILED|^ERROR|Error" "$out/graphs.log" | tail -15 ;;
    small)
      (cd benchmarks && timeout "${SMALL_TIMEOUT:-240}" python3 small_iteration.py \
        --iterations "${ITERS:-200}" ${SMALL_ARGS:-}) > "$out/small.log" 2>&1
      echo "small exit $? in $((SECONDS - t0)) s"; tail -8 "$out/small.log" ;;
    infer)
      (cd benchmarks && timeout "${INFER_TIMEOUT:-300}" python3 inference.py --compile \
        ${INFER_ARGS:-}) > "$out/inference.log" 2>&1
      echo "inference exit $? in $((SECONDS - t0)) s"; tail -16 "$out/inference.log" ;;
    iteration)
      (cd benchmarks && timeout "${IT_TIMEOUT:-540}" python3 gpu_pipeline.py iteration \
        --sources "$sources" --out "$out") > "$out/gpu_iteration.log" 2>&1
      echo "iteration exit $? in $((SECONDS - t0)) s"; tail -12 "$out/gpu_iteration.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
