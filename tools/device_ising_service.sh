#!/usr/bin/env bash
# On a GPU machine: the dSB request service's GPU tests (every reply equals the CPU reference)
# and benchmarks/ising_service.py: the echo backend (sockets, threads and load generator with no
# solver: the ceiling of everything else), the resident kernel over n and offered rate, variants
# of the resident server's host options (VARIANTS), the launch-per-request baseline and
# the CPU workers, server and load generator on separate cores (the benchmark runs its
# server in a child process pinned to the first half of the cores). Uses prebuilt modules in
# cuscikit/ when present (tools/prebuild_py312.sh), else builds. Logs and JSON go to $OUT; the
# merged table to $OUT/ising_service_h200.json (the layout of benchmarks/results/).
# Env: RATES (resident offered rates), ECHO_RATES, SIZES, DURATION, VARIANTS (benchmark options
# of each variant run at n = 64 at VARIANT_RATES, separated by ';'; empty: none), ECHO_VARIANTS
# (the same for the echo backend at ECHO_VARIANT_RATES), TESTS (a pytest -k filter; "none": no tests),
# BASELINES=0 (no launch and CPU runs), BENCH_OPTS (options for every run), SPIN_US (the
# server's --spin-us, default 1000000: its threads stay awake between rows), VARIANT_TIMEOUT
# (seconds for each variant's run, default 30), RESIDENT_TIMEOUT (the resident run's, default
# 100), MORE_SIZES and MORE_RATES (a second resident run "resident_more" over these sizes and
# rates, e.g. the larger models at fewer rates; MORE_TIMEOUT, default 60).
set -u
OUT=${OUT:-$PWD/device_ising_service_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{
  date -u
  nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  # what a thread's stall of ~ms could come from: the kernel, NUMA nodes and NUMA balancing,
  # transparent huge pages, the clock source, the network softirq budget, RT throttling
  echo "kernel $(uname -r); cmdline: $(cat /proc/cmdline 2> /dev/null)"
  echo "numa nodes $(ls -d /sys/devices/system/node/node* 2> /dev/null | wc -l);" \
    "numa_balancing $(cat /proc/sys/kernel/numa_balancing 2> /dev/null)"
  echo "thp $(cat /sys/kernel/mm/transparent_hugepage/enabled 2> /dev/null)" \
    "defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2> /dev/null)"
  echo "clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource \
    2> /dev/null)"
  echo "netdev_budget $(cat /proc/sys/net/core/netdev_budget 2> /dev/null)" \
    "usecs $(cat /proc/sys/net/core/netdev_budget_usecs 2> /dev/null)" \
    "max_backlog $(cat /proc/sys/net/core/netdev_max_backlog 2> /dev/null)"
  echo "sched_rt_runtime_us $(cat /proc/sys/kernel/sched_rt_runtime_us 2> /dev/null)"
} > "$OUT/machine.txt"
if ls cuscikit/_cuda.cpython-*.so > /dev/null 2>&1; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif ! CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -e . \
    -C cmake.define.CUSCIKIT_CUDA=ON > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi
python3 -c "import cuscikit._cuda as c; print('cuda kernels for sm', c.build_arch())" 2>&1 \
  | tee -a "$OUT/machine.txt"
SIZES=${SIZES:-64 256 1024}
RATES=${RATES:-100000 200000 400000 600000 800000 1000000 1200000}
DURATION=${DURATION:-0.4}
half=$(( $(nproc) / 2 ))
CORES="--server-cores 0-$((half - 1)) --client-cores $half-$(( $(nproc) - 1 ))"
BENCH="python3 benchmarks/ising_service.py --duration $DURATION --check 2003 $CORES \
  --spin-us ${SPIN_US:-1000000} ${BENCH_OPTS:-}"

if [ "${TESTS:-}" != none ]; then
  echo "== GPU tests"
  timeout "${TEST_TIMEOUT:-90}" python3 -m pytest -m gpu tests/ising/test_service.py -q -x \
    -k "${TESTS:-gpu}" -p no:cacheprovider -rA > "$OUT/service_tests.log" 2>&1
  status=$?
  echo "pytest exit status $status" | tee -a "$OUT/service_tests.log"
  tail -8 "$OUT/service_tests.log"
  if [ "$status" = 124 ]; then
    echo "the GPU tests timed out: no benchmarks"
    exit 1
  fi
fi

run() {  # name, timeout, benchmark options
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout "$limit" $BENCH --label "$name" --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "exit status $?" >> "$OUT/$name.log"
  grep -v "^anchor\|^server cores" "$OUT/$name.log"
}
run echo 40 --backends echo --n 64 --rates ${ECHO_RATES:-$RATES 1500000}
k=0
IFS=';' read -ra evariants <<< "${ECHO_VARIANTS---no-offload;--no-offload --no-pin}"
for v in "${evariants[@]}"; do
  k=$((k + 1))
  run "echo_variant$k" 30 --backends echo --n 64 --rates ${ECHO_VARIANT_RATES:-1000000} $v
done
run resident "${RESIDENT_TIMEOUT:-100}" --backends resident --n $SIZES --rates $RATES
if [ -n "${MORE_SIZES:-}" ]; then
  run resident_more "${MORE_TIMEOUT:-60}" --backends resident --n $MORE_SIZES \
    --rates ${MORE_RATES:-$RATES}
fi
k=0
IFS=';' read -ra variants <<< "${VARIANTS---no-offload;--no-offload --no-pin}"
for v in "${variants[@]}"; do
  k=$((k + 1))
  run "variant$k" "${VARIANT_TIMEOUT:-30}" --backends resident --n 64 \
    --rates ${VARIANT_RATES:-400000 1000000} $v
done
if [ "${BASELINES:-1}" != 0 ]; then
  run launch 40 --backends launch --n $SIZES --rates 20000 40000
  run cpu 40 --backends cpu --n $SIZES --rates 20000 100000
fi

# The merged table keeps each row's numbers and a short summary of its trace (the full rows,
# per-thread counters included, stay in each run's own JSON).
python3 - "$OUT" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
KEEP = ("backend", "label", "n", "offered_per_s", "sent_per_s", "completed_per_s", "busy",
        "errors", "lost", "rtt_p50_us", "rtt_p99_us", "rtt_p999_us", "residence_p50_us",
        "residence_p99_us", "device_solve_mean_us", "feed_wait_mean_us", "checked", "steal_ms")


def compact(row):
    r = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items() if k in KEEP}
    t = row.get("trace", {})
    if "when_slow" in t:
        r["slow_rtt_percent"] = round(t["when_slow"]["slow_rtt_percent"], 3)
    if t.get("stamped"):
        r["slow_since_arrival_percent"] = round(100 * sum(t["arrival_hist"][4:]) / t["stamped"], 3)
    if t.get("slow"):
        r["slow_longest_stage"] = {k: v for k, v in t["slow_dominant"].items() if v}
    stalls = {k: [round(v["stall_max_us"]), round(v.get("stall_max_cpu_us", 0))]
              for k, v in t.get("threads", {}).items() if v.get("stall_max_us", 0) >= 200}
    if stalls:  # [longest stall so far, the thread's CPU time within it] (us)
        r["long_stalls"] = stalls
    return r


merged = {"machine": (out / "machine.txt").read_text().strip(), "script": "benchmarks/ising_service.py"}
variants = sorted(p.stem for p in out.glob("*variant*.json"))
for name in ["echo", "resident", "resident_more"] + variants + ["launch", "cpu"]:
    p = out / f"{name}.json"
    if p.is_file():
        d = json.loads(p.read_text())
        merged.setdefault("anchor", d["anchor"])
        args = {k: v for k, v in d["args"].items() if k not in ("json_out",)}
        info = d["rows"][0].get("info") if d["rows"] else None
        merged[name] = {"args": args, "info": info, "rows": [compact(r) for r in d["rows"]]}
(out / "ising_service_h200.json").write_text(json.dumps(merged, indent=1))
PYEOF
