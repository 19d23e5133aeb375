#!/usr/bin/env bash
# HTTP serving benchmark with wrk against `backplane serve`:
#
# 1. The transport: POST inference on `mlp` (tiny: measures the HTTP front) and on MNIST (on
#    CpuAcc when the build has it, else CpuRef) at 1, 16, 64, 256 and 1024 connections. With
#    OLD_BACKPLANE=/path/to/backplane the same runs go to that binary too (same arguments, same
#    models and backends), side by side in one table.
# 2. With SLOWLORIS=N (default 300; 0 skips it), the latency of `mlp` calls while N slow clients
#    trickle their headers (bench/slowloris_bench.py), for each front end.
# 3. With SWAP=1, also the hot-swap runs: MNIST while a loop publishes a new copy of the CpuRef
#    backend into the server's backend directory every SWAP_INTERVAL seconds.
#
#   bench/http_bench.sh
#   OLD_BACKPLANE=/work/backplane-httplib DURATION=10 bench/http_bench.sh
#   CONNECTIONS="64 1024" MODELS=mlp bench/http_bench.sh
#
# Prints one line per run: requests/s, p50, p99, non-2xx responses, wrk timeouts, other socket
# errors. Needs the release build (it builds it) and wrk (Debian package wrk: installed on
# demand with `apt-get install wrk`). 1024 connections need about 1100 descriptors on each
# side: the script raises `ulimit -n` to the hard limit.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
backplane_install_deps
backplane_install_packages wrk
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

DURATION=${DURATION:-5}
CONNECTIONS=${CONNECTIONS:-"1 16 64 256 1024"}
MODELS=${MODELS:-"mlp mnist"}
SLOWLORIS=${SLOWLORIS:-300}
SWAP=${SWAP:-0}
SWAP_CONNECTIONS=${SWAP_CONNECTIONS:-"1 4 16 64"}
SWAP_INTERVAL=${SWAP_INTERVAL:-0.5}
WRK_THREADS=${WRK_THREADS:-2}
OLD_BACKPLANE=${OLD_BACKPLANE:-}

cmake --preset release >/dev/null
cmake --build --preset release --target backplane backplane_cpu_ref >/dev/null
root=$(pwd)
cpu_ref=$(readlink -f build/release/backends/Backplane_CpuRef_backend.so)
cpu_acc=""
if [[ -e build/release/backends/Backplane_CpuAcc_backend.so ]]; then
  cpu_acc=$(readlink -f build/release/backends/Backplane_CpuAcc_backend.so)
fi

work=$(mktemp -d /tmp/backplane-http-bench-XXXXXX)
server_pid=""
swapper_pid=""
stop_server() {
  if [[ -n "$server_pid" ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
cleanup() {
  if [[ -n "$swapper_pid" ]]; then kill "$swapper_pid" 2>/dev/null || true; fi
  stop_server
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -m 700 "$work/backends"
install -m 755 "$cpu_ref" "$work/backends/Backplane_CpuRef_backend.so"
preferences='[]'
if [[ -n "$cpu_acc" ]]; then
  install -m 755 "$cpu_acc" "$work/backends/Backplane_CpuAcc_backend.so"
  preferences='["CpuAcc", "CpuRef"]'
fi
# Only keys both front ends know, so that OLD_BACKPLANE runs with the very same file; each
# keeps its own defaults for threads (old: a thread per connection, 32; new: 2 I/O threads and
# 32 handler threads).
cat >"$work/serve.json" <<JSON
{"models": "$root/models", "backends": ["$work/backends"], "listen": "127.0.0.1:0",
 "log_level": "warn", "watch_debounce_ms": 50, "backend_preferences": $preferences}
JSON
# Each model's request body, POSTed by bench/wrk_post.lua.
cp "$root/models/mnist/example_request.json" "$work/mnist.json"
echo '{"inputs": [{"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}' \
  >"$work/mlp.json"

url=""
start_server() {  # start_server BINARY
  : >"$work/serve.log"
  # gRPC off (the pre-gRPC binary of OLD_BACKPLANE knows no such flag): only REST is measured.
  local grpc=(--grpc-listen off)
  [[ "$1" == "${OLD_BACKPLANE:-}" ]] && grpc=()
  "$1" serve --config "$work/serve.json" "${grpc[@]}" 2>"$work/serve.log" &
  server_pid=$!
  url=""
  for _ in $(seq 1 300); do
    url=$(grep -o "listening on http://[0-9.:]*" "$work/serve.log" | sed 's/listening on //' || true)
    if [[ -n "$url" ]]; then break; fi
    sleep 0.1
  done
  if [[ -z "$url" ]]; then cat "$work/serve.log"; exit 1; fi
  # Warm-up: TBB starts its threads on the first request.
  for model in mlp mnist; do
    WRK_BODY="$work/$model.json" wrk -t1 -c1 -d1s -s "$root/bench/wrk_post.lua" \
      "$url/v2/models/$model/infer" >/dev/null
  done
}

row() {  # row FRONT MODEL CONNECTIONS
  local front=$1 model=$2 connections=$3 threads=$WRK_THREADS
  if ((connections < threads)); then threads=$connections; fi
  local output
  output=$(WRK_BODY="$work/$model.json" wrk -t"$threads" -c"$connections" -d"${DURATION}s" \
    --latency -s "$root/bench/wrk_post.lua" "$url/v2/models/$model/infer" 2>&1)
  local rps p50 p99 non2xx timeouts errors
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$output")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$output")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$output")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$output")
  # "Socket errors: connect 0, read 12, write 0, timeout 3"
  timeouts=$(awk '/Socket errors:/ {print $10}' <<<"$output")
  errors=$(awk '/Socket errors:/ {gsub(",", ""); print $4 + $6 + $8}' <<<"$output")
  printf "%-9s %-6s %11s %12s %10s %10s %8s %9s %13s\n" "$front" "$model" "$connections" \
    "${rps:-?}" "${p50:-?}" "${p99:-?}" "${non2xx:-0}" "${timeouts:-0}" "${errors:-0}"
}

transport_table() {  # transport_table FRONT BINARY
  start_server "$2"
  for model in $MODELS; do
    for connections in $CONNECTIONS; do row "$1" "$model" "$connections"; done
  done
  if ((SLOWLORIS > 0)); then
    slowloris_runs+=$'\n'"$1:"$'\n'"$("$python" bench/slowloris_bench.py "${url#http://}" \
      --slow "$SLOWLORIS")"
  fi
  stop_server
}
python=$(command -pv python3)  # Debian's own: bench/slowloris_bench.py needs nothing more
slowloris_runs=""

echo "POST /v2/models/MODEL/infer, ${DURATION}s per run, wrk -t${WRK_THREADS} --latency;" \
  "CPU: $(nproc) cores; MNIST on $([[ -n $cpu_acc ]] && echo CpuAcc || echo CpuRef); ulimit -n $(ulimit -n)"
printf "%-9s %-6s %11s %12s %10s %10s %8s %9s %13s\n" front model connections requests/s p50 p99 \
  non-2xx timeouts "socket errors"
transport_table beast build/release/bin/backplane
if [[ -n "$OLD_BACKPLANE" ]]; then transport_table httplib "$OLD_BACKPLANE"; fi
if [[ -n "$slowloris_runs" ]]; then
  echo
  echo "POST /v2/models/mlp/infer one at a time over one connection, alone and with $SLOWLORIS" \
    "slowloris connections (one header byte a second):$slowloris_runs"
fi
if [[ "$SWAP" != 1 ]]; then exit 0; fi

echo
start_server build/release/bin/backplane
infer="$url/v2/models/mnist/infer"
swaps_so_far() {
  curl -sf "$url/metrics" | awk '/^backplane_backend_swaps_total\{backend="CpuRef"\}/ {print $2}'
}

swap_loop() {
  local n=0
  while true; do
    install -m 755 "$cpu_ref" "$work/backends/.publish-$n.tmp"
    mv -f "$work/backends/.publish-$n.tmp" "$work/backends/Backplane_CpuRef_backend.so"
    n=$((n + 1))
    sleep "$SWAP_INTERVAL"
  done
}

run() {  # run MODE CONNECTIONS
  local mode=$1 connections=$2 threads=$WRK_THREADS
  if ((connections < threads)); then threads=$connections; fi
  local before after output
  before=$(swaps_so_far)
  output=$(WRK_BODY="$work/mnist.json" wrk -t"$threads" -c"$connections" -d"${DURATION}s" \
    --latency -s "$root/bench/wrk_post.lua" "$infer")
  after=$(swaps_so_far)
  local rps p50 p99 non2xx errors
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$output")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$output")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$output")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$output")
  errors=$(awk '/Socket errors:/ {print $4 $5 $6 $7 $8 $9 $10 $11}' <<<"$output")
  printf "%-10s %11s %12s %10s %10s %8s %-34s %s\n" "$mode" "$connections" "$rps" "$p50" "$p99" \
    "${non2xx:-0}" "${errors:-none}" "$((after - before))"
}

echo "MNIST over HTTP: POST $infer, ${DURATION}s per run, wrk -t${WRK_THREADS} --latency"
echo "CPU: $(nproc) cores; backend CpuRef ($(stat -c %s "$cpu_ref") bytes)"
printf "%-10s %11s %12s %10s %10s %8s %-34s %s\n" mode connections requests/s p50 p99 non-2xx \
  "socket errors" swaps
for connections in $SWAP_CONNECTIONS; do run steady "$connections"; done
swap_loop &
swapper_pid=$!
for connections in $SWAP_CONNECTIONS; do run swapping "$connections"; done
kill "$swapper_pid"
wait "$swapper_pid" 2>/dev/null || true
swapper_pid=""
echo
curl -sf "$url/metrics" | grep -E '^backplane_(backend_swaps_total|backend_rejected_loads_total|backend_leaked_generations_total|inference_failures_total|backend_drain_seconds_(sum|count))' || true
