#!/usr/bin/env bash
# gRPC raw tensors against REST JSON on MNIST through one `backplane serve` on its embedded default
# (the example models on the build's backends: MNIST prefers CpuAcc), side by side in one run, with
# native clients (bench/transport_bench.cpp: cpp-httplib and the generated gRPC stub), then with
# Node's (bench/grpc_bench.mjs, @grpc/grpc-js from tests/grpc_client's lock file).
#
#   bench/grpc_bench.sh                          # 5 s per run, 1 and 4 clients
#   DURATION=10 CLIENTS="1 2 8" bench/grpc_bench.sh
#   BUILD=0 bench/grpc_bench.sh                  # use build/release as it is
# Then the same native clients on `relu`, one Relu over 16 floats (a model that costs nothing to
# run: what remains is the transport's cost), with each transport's cheapest call beside it, and
# the CPU time per request of the server and of the machine (server and client, /proc/PID/stat).
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

work=$(mktemp -d /tmp/backplane-grpc-bench-XXXXXX)
log=$work/serve.log
# The example models, and `relu` beside them with a request of 784 seeded floats.
cp -r models "$work/models"
mkdir -p "$work/models/relu/1"
source scripts/deps.sh
backplane_install_packages python3-onnx
/usr/bin/python3 - "$work/models/relu/1/model.onnx" "$work/relu_request.json" <<'PY'
import json, random, sys
import onnx
from onnx import TensorProto, helper
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
random.seed(20261207)
row = [round(random.uniform(-1, 1), 6) for _ in range(16)]
json.dump({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": row}]},
          open(sys.argv[2], "w"))
PY
source bench/serve_util.sh
trap 'bench_stop_servers; rm -rf "$work"' EXIT
bench_serve "$log" build/release/bin/backplane --models "$work/models" --listen 127.0.0.1:0 \
  --grpc-listen 127.0.0.1:0
server_pid=$served_pid http_url=http://$served_http grpc_target=$served_grpc
echo "# bench/grpc_bench.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
grep -o "backends: .*" "$log" | head -1
build/release/bin/backplane_bench_transport --http "${http_url#http://}" --grpc "$grpc_target" \
  --request "$root/models/mnist/example_request.json" --seconds "${DURATION:-5}" \
  --clients "${CLIENTS:-1 4}" --server-pid "$server_pid"
echo
echo "relu (one Relu over 16 floats: the transport's cost), and each transport's cheapest call:"
build/release/bin/backplane_bench_transport --http "${http_url#http://}" --grpc "$grpc_target" \
  --request "$work/relu_request.json" --model relu --seconds "${DURATION:-5}" \
  --clients "${CLIENTS:-1 4}" --server-pid "$server_pid" --bare | tail -n +2
echo
echo "The same from Node (grpc-js and http, independent clients; grpc-js costs ~0.6 ms a call itself):"
node "$prefix/grpc_bench.mjs" "$root/server/kserve_grpc/proto/grpc_service.proto" "$grpc_target" "$http_url" \
  "$root/models/mnist/example_request.json"
