#!/usr/bin/env bash
# ctest: an independent gRPC client (Node's @grpc/grpc-js, installed from npm into WORK_DIR on
# first use) against `backplane serve` on its embedded default (example models, the build's
# backends), both ports free ones. Usage: run_client_test.sh BACKPLANE SOURCE_DIR WORK_DIR
set -euo pipefail
backplane=$1 source_dir=$2 work=$3
client_dir=$source_dir/tests/grpc_client

# No silent skip: without node or npm this test fails (the README's command installs them).
command -v node >/dev/null || { echo "FAIL: node is not installed (apt-get install nodejs npm)"; exit 1; }
# $work may be shared by build trees (the presets share one): one run at a time, so that no
# install or copy changes what another run is using.
mkdir -p "$work"
exec 9>"$work/.lock"
flock 9
if [[ ! -f $work/node_modules/@grpc/grpc-js/package.json ]] ||
   ! cmp -s "$client_dir/package-lock.json" "$work/package-lock.json"; then
  command -v npm >/dev/null || { echo "FAIL: npm is not installed (apt-get install npm)"; exit 1; }
  cp "$client_dir/package.json" "$client_dir/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --ignore-scripts --silent)
fi
cp "$client_dir/kserve_client.mjs" "$work/"

log=$(mktemp)
"$backplane" serve --listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 300); do
  grep -q 'listening on grpc://' "$log" && break
  kill -0 $server 2>/dev/null || { cat "$log"; echo "FAIL: the server exited"; exit 1; }
  sleep 0.1
done
target=$(sed -n 's|.*listening on grpc://\([^ ]*\).*|\1|p' "$log" | head -1)
[[ -n $target ]] || { cat "$log"; echo "FAIL: no gRPC address in the log"; exit 1; }
node "$work/kserve_client.mjs" "$target" "$source_dir/server/kserve_grpc/proto/grpc_service.proto"
