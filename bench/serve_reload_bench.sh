#!/usr/bin/env bash
# Hot reload through `backplane serve`: rename() of a new CpuRef file into the server's backend
# directory -> the admin API reports the new generation -> the first inference after it
# succeeds, over SWAPS swaps, while CLIENTS clients keep POSTing MNIST requests; failed requests;
# the server's VmRSS, /proc/PID/maps lines and mapped CpuRef shadow copies after 10 swaps and
# after all of them (exactly one should be left mapped once drained).
#
#   bench/serve_reload_bench.sh                  # SWAPS=1000 CLIENTS=1 PAUSE_MS=20
#   SWAPS=200 CLIENTS=2 bench/serve_reload_bench.sh
#   BUILD=0 bench/serve_reload_bench.sh          # use build/release as it is
#
# The server runs with its default configuration (watch_debounce_ms 200, every other key at its
# default) apart from --listen 127.0.0.1:0, --models models/ and --backends <a temporary
# directory holding a copy of build/release/backends/Backplane_CpuRef_backend.so>. The measuring
# is done by build/release/bin/backplane_bench_serve_reload (bench/serve_reload_bench.cpp: its
# header says what each printed line means); this script starts and stops the server and prints
# the load average and the server's own counters. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

SWAPS=${SWAPS:-1000}
CLIENTS=${CLIENTS:-1}
PAUSE_MS=${PAUSE_MS:-20}

if [[ ${BUILD:-1} != 0 ]]; then
  source scripts/deps.sh
  backplane_install_deps
  cmake --preset release >/dev/null
  cmake --build --preset release -j2 --target backplane backplane_cpu_ref \
    backplane_bench_serve_reload >/dev/null
fi
cpu_ref=$(readlink -f build/release/backends/Backplane_CpuRef_backend.so)

work=$(mktemp -d /tmp/backplane-serve-reload-XXXXXX)
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -m 700 "$work/backends"
install -m 755 "$cpu_ref" "$work/backends/Backplane_CpuRef_backend.so"

build/release/bin/backplane serve --listen 127.0.0.1:0 --grpc-listen off --models "$root/models" \
  --backends "$work/backends" 2>"$work/serve.log" &
server_pid=$!
for _ in $(seq 1 300); do
  if grep -q "listening on http://" "$work/serve.log"; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
  sleep 0.1
done
url=$(grep -o "listening on http://[0-9.:]*" "$work/serve.log" | sed 's/listening on //' || true)
if [[ -z "$url" ]]; then
  cat "$work/serve.log"
  exit 1
fi
port=${url##*:}
# Warm-up: TBB starts its threads on the first request.
curl -sf -X POST --data @models/mnist/example_request.json "$url/v2/models/mnist/infer" >/dev/null

echo "backplane serve (pid $server_pid) on $url; backend CpuRef ($(stat -c %s "$cpu_ref") bytes);" \
  "$SWAPS swaps, $CLIENTS client(s), ${PAUSE_MS} ms between swaps"
echo "before: $(uptime)"
status=0
build/release/bin/backplane_bench_serve_reload --port "$port" --pid "$server_pid" \
  --backend-dir "$work/backends" --backend "$cpu_ref" \
  --request models/mnist/example_request.json --swaps "$SWAPS" --clients "$CLIENTS" \
  --pause-ms "$PAUSE_MS" || status=$?
echo "after:  $(uptime)"
echo
# The server's own view: swaps, rejected files, leaked generations, failed inferences, drains.
curl -sf "$url/metrics" | grep -E '^backplane_(backend_swaps_total|backend_rejected_loads_total|backend_leaked_generations_total|inference_failures_total|backend_drain_seconds_(sum|count)|loader_generations_live)' || true
active=$(curl -sf "$url/v2/backends/CpuRef" | grep -o '"active_generation":[0-9]*' | cut -d: -f2)
echo "CpuRef active generation: $active"
if grep -qE '\[(error|critical)\]' "$work/serve.log"; then
  echo "server log errors:"
  grep -E '\[(error|critical)\]' "$work/serve.log" | head -20
  status=1
fi
exit "$status"
