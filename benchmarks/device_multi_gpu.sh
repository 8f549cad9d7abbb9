#!/usr/bin/env bash
# One device-tool call on a machine of several GPUs (issue 6, and the H200 item of issue 5):
# build, the multi-GPU NCCL test, strong and weak scaling at P = 1 .. #GPUs, and the de-dup
# balance run on CPU ranks of the same machine. Logs and the JSON results land in $OUT.
#   usage (device tool, kind nvidia-h200-x2 or larger):
#     [TESTS=0] bash benchmarks/device_multi_gpu.sh [SOURCES] [SOURCES_PER_RANK]
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=32
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # NVLink multicast off (device README)
out=${OUT:-out}
mkdir -p "$out"
sources=${1:-256000}
per_rank=${2:-64000}
python3 -m pip install --no-build-isolation --no-deps -e . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
nvidia-smi -L
ngpu=$(nvidia-smi -L | wc -l)
if [ "${TESTS:-1}" != 0 ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m multi_gpu tests/parallel \
    > "$out/pytest.log" 2>&1
  echo "pytest exit $?"; tail -4 "$out/pytest.log"
fi
for ((P = 1; P <= ngpu; P *= 2)); do
  timeout 150 torchrun --standalone --nproc-per-node "$P" benchmarks/multi_gpu_scaling.py \
    --mode both --sources "$sources" --sources-per-rank "$per_rank" --infer-limit 200000 \
    --out "$out/scaling.json" > "$out/scaling_P$P.log" 2>&1
  echo "scaling P=$P exit $?"
done
tail -30 "$out/scaling_P$((P / 2)).log"
cd benchmarks
timeout 150 python3 dedup_balance.py --engine torch --ranks 2 4 8 --sim 32 64 --sweep \
  > "$out/dedup_balance.log" 2>&1
echo "dedup_balance exit $?"; tail -40 "$out/dedup_balance.log"
