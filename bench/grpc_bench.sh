#!/usr/bin/env bash
# gRPC raw tensors against REST JSON on MNIST through one `backplane serve` on its embedded default
# (the example models on the build's backends: MNIST prefers CpuAcc), side by side in one run, with
# native clients (bench/transport_bench.cpp: cpp-httplib and the generated gRPC stub), then with
# Node's (bench/grpc_bench.mjs, @grpc/grpc-js from tests/grpc_client's lock file).
#
#   bench/grpc_bench.sh                          # 5 s per run, 1 and 4 clients
#   DURATION=10 CLIENTS="1 2 8" bench/grpc_bench.sh
#   BUILD=0 bench/grpc_bench.sh                  # use build/release as it is
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
if [[ ${BUILD:-1} != 0 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target backplane backplane_cpu_ref backplane_cpu_acc \
    backplane_bench_transport >/dev/null
fi
prefix=$root/build/release/grpc_bench
if [[ ! -f $prefix/node_modules/@grpc/grpc-js/package.json ]]; then
  mkdir -p "$prefix"
  cp tests/grpc_client/package.json tests/grpc_client/package-lock.json "$prefix/"
  (cd "$prefix" && npm ci --no-audit --no-fund --ignore-scripts --silent)
fi
cp bench/grpc_bench.mjs "$prefix/"

log=$(mktemp /tmp/backplane-grpc-bench-XXXXXX.log)
build/release/bin/backplane serve --listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 2>"$log" &
server_pid=$!
trap 'kill -TERM $server_pid 2>/dev/null; wait $server_pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
  grep -q "listening on grpc://" "$log" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
http_url=$(grep -o "listening on http://[0-9.:]*" "$log" | sed 's/listening on //')
grpc_target=$(grep -o "listening on grpc://[0-9.:]*" "$log" | sed 's|listening on grpc://||')
echo "# bench/grpc_bench.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
grep -o "backends: .*" "$log" | head -1
build/release/bin/backplane_bench_transport --http "${http_url#http://}" --grpc "$grpc_target" \
  --request "$root/models/mnist/example_request.json" --seconds "${DURATION:-5}" \
  --clients "${CLIENTS:-1 4}"
echo
echo "The same from Node (grpc-js and http, independent clients; grpc-js costs ~0.6 ms a call itself):"
node "$prefix/grpc_bench.mjs" "$root/server/kserve_grpc/proto/grpc_service.proto" "$grpc_target" "$http_url" \
  "$root/models/mnist/example_request.json"
