#!/usr/bin/env bash
# Per-model options and instances (issue 41's goal): two models on CpuAcc that want the cores
# differently, in one server, against each in a server configured for it alone.
#   wide:   MLP 784-2048-2048-10 (21 MB of weights), batched (max_batch_size 64), wants 1 execution
#           at a time with 2 intra-op threads;
#   narrow: MLP 784-256-10, unbatched, wants 2 executions at a time with 1 thread each.
# Servers, one after the other on the same machine:
#   mixed        both models, each with its own "instances" and "backend_options" in config.json;
#   wide_alone   wide only, CpuAcc's server-wide intra_op_threads set to 2 (PUT .../options);
#   narrow_alone narrow only, the server-wide default (1 thread).
# Each model is driven alone in every server (REST, one row a request, every answer checked by
# bench/batching_client.cpp): wide with 64 clients, narrow with 16. The goal: each model's
# throughput in `mixed` within ±10 % of its own server's. Rounds alternate the servers, so drift
# on this shared machine hits both sides alike; the medians and their ratios are printed.
#
#   bench/model_options.sh                 # 3 rounds of 5 s per model
#   ROUNDS=5 DURATION=10 BUILD=0 bench/model_options.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh  # backplane_install_packages
backplane_install_packages python3-onnx bc  # bench/make_mlp.py's onnx and numpy; the ratios
if [[ ${BUILD:-1} != 0 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target backplane backplane_cpu_ref backplane_cpu_acc \
    backplane_bench_batching >/dev/null
fi
rounds=${ROUNDS:-3}
duration=${DURATION:-5}
work=$(mktemp -d /tmp/backplane-model-options-XXXXXX)
server_pid=
source bench/serve_util.sh  # bench_serve
stop_server() {
  [[ -z $server_pid ]] || { kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true; }
  server_pid=
}
trap 'stop_server; rm -rf "$work"' EXIT

/usr/bin/python3 bench/make_mlp.py "$work/wide.onnx" 784 2048 2048 10
/usr/bin/python3 bench/make_mlp.py "$work/narrow.onnx" 784 256 10
wide_config='"backends": ["CpuAcc"], "instances": 1, "max_batch_size": 64,
  "dynamic_batching": {"max_queue_delay_us": 2000, "preferred_batch_sizes": [16, 64]}'
narrow_config='"backends": ["CpuAcc"], "instances": 2'
# repository NAME MODEL CONFIG...: one directory of models per server.
add_model() {
  mkdir -p "$work/$1/$2/1"
  cp "$work/$2.onnx" "$work/$1/$2/1/model.onnx"
  echo "{$3}" >"$work/$1/$2/config.json"
}
add_model mixed wide "$wide_config, \"backend_options\": {\"CpuAcc\": {\"intra_op_threads\": 2}}"
add_model mixed narrow "$narrow_config, \"backend_options\": {\"CpuAcc\": {\"intra_op_threads\": 1}}"
add_model wide_alone wide "$wide_config"
add_model narrow_alone narrow "$narrow_config"
echo '{"http_threads": 128}' >"$work/config.json"

http=
start_server() {  # repository
  bench_serve "$work/$1.log" build/release/bin/backplane --config "$work/config.json" \
    --models "$work/$1" --listen 127.0.0.1:0 --grpc-listen off
  server_pid=$served_pid http=$served_http
  if [[ $1 == wide_alone ]]; then
    curl -sf -X PUT "http://$http/v2/backends/CpuAcc/options" -d '{"intra_op_threads": 2}' >/dev/null
  fi
}
# measure MODEL CLIENTS [SECONDS]: requests/s of one run, every answer checked by the client.
measure() {
  build/release/bin/backplane_bench_batching --http "$http" --grpc 127.0.0.1:1 --models "$1" \
    --seconds "${3:-$duration}" --runs "rest:$2" |
    awk -v m="$1" '$4 == m {print $5; if ($9 != 0) {print "failed requests: " $0 > "/dev/stderr"; exit 1}}'
}
# The effective values the layers run with, from the placement view (the proof of the setup).
effective() {
  curl -s "http://$http/v2/models/$1/options" | /usr/bin/python3 -c '
import json, sys
v = json.load(sys.stdin)["versions"][0]
print("%s: intra_op_threads %s, instances %s" % (sys.argv[1], v["effective"]["CpuAcc"]["intra_op_threads"], v["instances"]["limit"]))' "$1"
}

echo "# bench/model_options.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A runs
for round in $(seq 1 "$rounds"); do
  for server in mixed wide_alone narrow_alone; do
    start_server "$server"
    models=wide
    [[ $server == mixed ]] && models="wide narrow"
    [[ $server == narrow_alone ]] && models=narrow
    for m in $models; do
      [[ $round == 1 ]] && echo "$server $(effective "$m")"
      clients=64
      [[ $m == narrow ]] && clients=16
      measure "$m" "$clients" 1 >/dev/null  # warm-up: batch sizes' shape programs
      runs[$server.$m]="${runs[$server.$m]:-} $(measure "$m" "$clients")"
    done
    stop_server
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
printf "\n%-8s %-14s %-14s %s\n" model mixed alone "mixed / alone (median req/s of $rounds rounds)"
for m in wide narrow; do
  mixed=$(median <<<"${runs[mixed.$m]}")
  alone=$(median <<<"${runs[${m}_alone.$m]}")
  printf "%-8s %-14s %-14s %.3f\n" "$m" "$mixed" "$alone" "$(echo "$mixed / $alone" | bc -l)"
  echo "         runs: mixed${runs[mixed.$m]}; alone${runs[${m}_alone.$m]}"
done
