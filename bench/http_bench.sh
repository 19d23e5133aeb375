#!/usr/bin/env bash
# HTTP serving benchmark: MNIST inference through `backplane serve` with wrk, at a few
# concurrency levels, first with the backend file left alone, then while a loop publishes a new
# copy of the CpuRef backend into the server's backend directory (write temp + rename) every
# SWAP_INTERVAL seconds, so that each run crosses several hot swaps.
#
#   bench/http_bench.sh                      # 10 s per run, concurrency 1 4 16 64
#   DURATION=30 CONNECTIONS="1 8" bench/http_bench.sh
#
# Prints one line per run: requests/s, p50, p99, non-2xx responses, socket errors, swaps done.
# Needs the release build (it builds it) and wrk (installed on demand, Debian package wrk).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
backplane_install_deps
if ! command -v wrk >/dev/null; then
  echo "installing wrk"
  sudo=""; if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  $sudo apt-get install -y -qq --no-install-recommends wrk
fi

DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-"1 4 16 64"}
SWAP_INTERVAL=${SWAP_INTERVAL:-0.5}
WRK_THREADS=${WRK_THREADS:-2}

cmake --preset release >/dev/null
cmake --build --preset release --target backplane backplane_cpu_ref >/dev/null
root=$(pwd)
cpu_ref=$(readlink -f build/release/backends/Backplane_CpuRef_backend.so)

work=$(mktemp -d /tmp/backplane-http-bench-XXXXXX)
server_pid=""
swapper_pid=""
cleanup() {
  if [[ -n "$swapper_pid" ]]; then kill "$swapper_pid" 2>/dev/null || true; fi
  if [[ -n "$server_pid" ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -m 700 "$work/backends"
install -m 755 "$cpu_ref" "$work/backends/Backplane_CpuRef_backend.so"
# One thread per connection (cpp-httplib keeps a keep-alive connection on its thread): more
# threads than the highest concurrency, or connections queue behind each other.
cat >"$work/serve.json" <<JSON
{"models": "$root/models", "backends": ["$work/backends"], "listen": "127.0.0.1:0",
 "log_level": "info", "http_threads": 128, "watch_debounce_ms": 50}
JSON
cat >"$work/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local file = io.open("$root/models/mnist/example_request.json", "rb")
wrk.body = file:read("*a")
file:close()
LUA

build/release/bin/backplane serve --config "$work/serve.json" 2>"$work/serve.log" &
server_pid=$!
for _ in $(seq 1 300); do
  if grep -q "listening on http://" "$work/serve.log"; then break; fi
  sleep 0.1
done
url=$(grep -o "listening on http://[0-9.:]*" "$work/serve.log" | sed 's/listening on //')
if [[ -z "$url" ]]; then cat "$work/serve.log"; exit 1; fi
infer="$url/v2/models/mnist/infer"
# Warm-up: TBB starts its threads on the first request.
curl -sf -X POST --data @models/mnist/example_request.json "$infer" >/dev/null

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
  output=$(wrk -t"$threads" -c"$connections" -d"${DURATION}s" --latency -s "$work/post.lua" "$infer")
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
for connections in $CONNECTIONS; do run steady "$connections"; done
swap_loop &
swapper_pid=$!
for connections in $CONNECTIONS; do run swapping "$connections"; done
kill "$swapper_pid"
wait "$swapper_pid" 2>/dev/null || true
swapper_pid=""
echo
curl -sf "$url/metrics" | grep -E '^backplane_(backend_swaps_total|backend_rejected_loads_total|backend_leaked_generations_total|inference_failures_total|backend_drain_seconds_(sum|count))' || true
