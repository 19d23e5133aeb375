#!/usr/bin/env bash
# What a progressive rollout costs the requests it serves (issue 22): p50/p99 and throughput of
# one model through `backplane serve` with no rollout, during shadow at 10 % sampling, during
# canary at 10 % and 50 %, and after the rollout ended — side by side, ROUNDS rounds in one run.
# The model is an MLP 784-512-512-10 with a symbolic batch (seeded weights, bench/make_mlp.py with
# Debian's python3-onnx) on CpuAcc; each round's candidate is another build of CpuAcc (the same
# code with bytes appended: a good fix, same outputs), so shadow runs compare equal and the cost
# measured is the rollout's own. The policy never moves by itself (min_samples 1e8): the script
# moves it with the admin API. Driven by bench/batching_client.cpp: CLIENTS keep-alive REST
# clients sending one row each, then one client.
#
#   bench/rollout_bench.sh                        # 3 rounds, 4 s per measurement
#   ROUNDS=5 SECONDS_PER_RUN=6 CLIENTS=8 BUILD=0 bench/rollout_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh  # backplane_install_packages
backplane_install_packages python3-onnx  # bench/make_mlp.py
rounds=${ROUNDS:-3}
seconds=${SECONDS_PER_RUN:-4}
clients=${CLIENTS:-8}
if [[ ${BUILD:-1} != 0 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target backplane backplane_cpu_ref backplane_cpu_acc \
    backplane_bench_batching >/dev/null
fi

work=$(mktemp -d /tmp/backplane-rollout-bench-XXXXXX)
log=$work/serve.log
source bench/serve_util.sh
trap 'bench_stop_servers; rm -rf "$work"' EXIT

mkdir -p "$work/models/mlp/1" "$work/backends"
/usr/bin/python3 bench/make_mlp.py "$work/models/mlp/1/model.onnx" 784 512 512 10
echo '{"backends": ["CpuAcc"]}' >"$work/models/mlp/config.json"
install -m 755 build/release/backends/Backplane_CpuAcc_backend.so "$work/backends/"
cat >"$work/config.json" <<'JSON'
{"http_threads": 64, "watch_backends": false, "deploy_policy": "progressive",
 "rollout": {"shadow_fraction": 0.1, "min_samples": 100000000, "steps": [10, 50, 100],
             "max_error_excess": 1, "max_latency_regression": 1000000, "max_abs_divergence": 1e-3}}
JSON
bench_serve "$log" build/release/bin/backplane --config "$work/config.json" \
  --models "$work/models" --backends "$work/backends" --listen 127.0.0.1:0 \
  --grpc-listen 127.0.0.1:0
server_pid=$served_pid http=$served_http grpc=$served_grpc
admin=http://$http/v2/backends/CpuAcc
rollout() { curl -sf -X POST "$admin/rollout/$1" >/dev/null; }
phase() {
  curl -s "$admin/rollout" | /usr/bin/python3 -c '
import json, sys
v = json.load(sys.stdin)
print(v["phase"] + ("" if v["phase"] != "canary" else " %g %%" % v["weight_percent"]))'
}
# One measurement: "<label> <requests/s> <p50 ms> <p99 ms> <failed>" for CLIENTS clients and 1.
measure() {
  local label=$1 line
  for n in "$clients" 1; do
    line=$(build/release/bin/backplane_bench_batching --http "$http" --grpc "$grpc" --models mlp \
      --seconds "$seconds" --runs "rest:$n" | tail -1)
    echo "$label|$n $(awk '{print $5, $7, $8, $9}' <<<"$line")" >>"$work/results"
    printf '  %-16s %2d clients  %s\n' "$label" "$n" "$(awk '{printf "%8.0f req/s  p50 %6.3f ms  p99 %6.3f ms  failed %s", $5, $7, $8, $9}' <<<"$line")"
  done
}

echo "# bench/rollout_bench.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# mlp 784-512-512-10 on CpuAcc, REST, one row a request, ${seconds} s per measurement"
for round in $(seq 1 "$rounds"); do
  echo "round $round"
  measure "no rollout"
  # Another build of the backend (same code, another digest), published the safe way.
  cp build/release/backends/Backplane_CpuAcc_backend.so "$work/backends/.incoming"
  printf 'rollout bench build %d\n' "$round" >>"$work/backends/.incoming"
  mv "$work/backends/.incoming" "$work/backends/Backplane_CpuAcc_backend.so"
  curl -sf -X POST "$admin/reload" >/dev/null
  [[ $(phase) == shadow ]] || { echo "expected a shadow phase, got $(phase)" >&2; exit 1; }
  measure "shadow 10 %"
  rollout advance
  [[ $(phase) == "canary 10 %" ]] || { echo "expected canary 10 %, got $(phase)" >&2; exit 1; }
  measure "canary 10 %"
  rollout advance
  measure "canary 50 %"
  rollout abort
  [[ $(phase) == rolled_back ]] || { echo "expected rolled_back, got $(phase)" >&2; exit 1; }
done
echo
echo "## Medians over $rounds rounds (ratio: p50 and p99 against no rollout, same client count)"
/usr/bin/python3 - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, rest = line.rstrip("\n").split("|")
    clients, rps, p50, p99, failed = rest.split()
    rows.setdefault((label, int(clients)), []).append((float(rps), float(p50), float(p99), int(failed)))
labels = ["no rollout", "shadow 10 %", "canary 10 %", "canary 50 %"]
for clients in sorted({c for _, c in rows}, reverse=True):
    base = rows[("no rollout", clients)]
    base_p50 = statistics.median(r[1] for r in base)
    base_p99 = statistics.median(r[2] for r in base)
    print("| %s | clients | req/s | p50 ms | p99 ms | p50 ratio | p99 ratio | failed |" % "phase".ljust(12))
    print("|---|---|---|---|---|---|---|---|")
    for label in labels:
        runs = rows[(label, clients)]
        rps = statistics.median(r[0] for r in runs)
        p50 = statistics.median(r[1] for r in runs)
        p99 = statistics.median(r[2] for r in runs)
        print("| %s | %d | %.0f | %.3f | %.3f | %.2f | %.2f | %d |" % (
            label.ljust(12), clients, rps, p50, p99, p50 / base_p50, p99 / base_p99,
            sum(r[3] for r in runs)))
    print()
PY
grep -c "rollout of backend CpuAcc" "$log" | sed 's/^/rollout transitions logged: /'
