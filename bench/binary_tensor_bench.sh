#!/usr/bin/env bash
# JSON against the binary tensor data extension through `backplane serve`: starts a server on a
# temporary repository (the example MNIST model and a 1M-element Relu model), then prints the
# medians of the in-process parse and of end-to-end requests, JSON and binary side by side.
#
#   bench/binary_tensor_bench.sh            # 31 repetitions per figure
#   REPS=101 bench/binary_tensor_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-31}

cmake --preset release >/dev/null
cmake --build --preset release --target backplane backplane_cpu_ref \
  backplane_bench_binary_tensor >/dev/null
bench=build/release/bin/backplane_bench_binary_tensor
cpu_ref=$(readlink -f build/release/backends/Backplane_CpuRef_backend.so)

work=$(mktemp -d /tmp/backplane-binary-bench-XXXXXX)
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/backends" "$work/models/large/1"
cp "$cpu_ref" "$work/backends/Backplane_CpuRef_backend.so"
cp -r models/mnist "$work/models/mnist"
echo '{"backends": ["CpuRef"]}' > "$work/models/mnist/config.json"
echo '{"backends": ["CpuRef"]}' > "$work/models/large/config.json"
"$bench" --write-large-model "$work/models/large/1/model.onnx"

build/release/bin/backplane serve --listen 127.0.0.1:0 --models "$work/models" \
  --backends "$work/backends" > "$work/serve.log" 2>&1 &
server_pid=$!
for _ in $(seq 300); do
  if grep -q "listening on http://" "$work/serve.log"; then break; fi
  sleep 0.1
done
url=$(grep -o "http://[0-9.]*:[0-9]*" "$work/serve.log" | head -1)
[[ -n "$url" ]] || { cat "$work/serve.log"; exit 1; }
echo "server $url (CpuRef), $(nproc) cores, medians of $REPS"
"$bench" --url "$url" --reps "$REPS"
