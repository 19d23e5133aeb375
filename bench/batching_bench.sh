#!/usr/bin/env bash
# Dynamic batching off against on (issue 21), side by side in one run of one `backplane serve`: a
# wide MLP 784-2048-2048-10 (21 MB of weights, symbolic batch "N", seeded weights, generated here
# with Debian's python3-onnx) served on CpuAcc as `wide` (no batching) and as `wide_batched`
# (max_batch_size 64, preferred [16, 64], max_queue_delay_us DELAY), driven by
# bench/batching_client.cpp (the models alternating in slices, every answer checked): 64
# keep-alive REST clients and 16 gRPC clients sending one row each, then 1 client; then the same
# against `tiny`, a Gemm 784x10 with the same request and answer (what the transport allows a
# batched model, the ceiling of those ratios); then 64 REST
# connections from wrk (one thread: the lightest client, for the latency goal); then one
# client sending 64-row requests over gRPC (the largest batch's execution time alone, for the
# p99 bound; each batched run also prints what its batches took under its own load); then the max_queue_delay_us curve (DELAYS) at 64, 16 and 1 REST clients.
# MNIST is configured with batching too: the log shows it refused at load (fixed batch 1).
#
#   bench/batching_bench.sh                       # 5 s per run
#   DURATION=10 DELAY=2000 DELAYS="0 500 1000 2000 4000" bench/batching_bench.sh
#   BUILD=0 bench/batching_bench.sh               # use build/release as it is
#   ONLY=tiny bench/batching_bench.sh             # only the path's cost (tiny), 3 rounds
#   ONLY=tiny AGAINST=/tmp/old/backplane bench/batching_bench.sh  # ... alternating with another build
#   ONLY=tiny PAIR="wide wide_batched" RUNS="grpc:16" bench/batching_bench.sh  # ... other models, runs
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/deps.sh  # backplane_install_packages, for wrk
backplane_install_packages python3-onnx  # bench/make_mlp.py
delay=${DELAY:-2000}
delays=${DELAYS:-0 500 1000 2000 4000}
if [[ ${BUILD:-1} != 0 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target backplane backplane_cpu_ref backplane_cpu_acc \
    backplane_bench_batching >/dev/null
fi

work=$(mktemp -d /tmp/backplane-batching-bench-XXXXXX)
log=$work/serve.log
source bench/serve_util.sh
trap 'bench_stop_servers; rm -rf "$work"' EXIT

# The models, from the script: Gemm+Relu, Gemm+Relu, Gemm, batch dimension symbolic (`wide`);
# and one Gemm 784x10 (`tiny`: the same request and answer, nearly no execution, so what it
# reaches is what the transport and the batcher's path allow).
mkdir -p "$work/models/wide/1" "$work/models/tiny/1"
make_mlp() { /usr/bin/python3 bench/make_mlp.py "$@"; }
make_mlp "$work/models/wide/1/model.onnx" 784 2048 2048 10
make_mlp "$work/models/tiny/1/model.onnx" 784 10
batched_config() {
  echo "{\"backends\": [\"CpuAcc\"], \"max_batch_size\": 64, \"dynamic_batching\": {\"max_queue_delay_us\": $1, \"preferred_batch_sizes\": [16, 64]}}"
}
for m in wide tiny; do
  echo '{"backends": ["CpuAcc"]}' >"$work/models/$m/config.json"
  mkdir -p "$work/models/${m}_batched/1"
  cp "$work/models/$m/1/model.onnx" "$work/models/${m}_batched/1/"
  batched_config "$delay" >"$work/models/${m}_batched/config.json"
done
for d in $delays; do
  mkdir -p "$work/models/wide_delay_$d/1"
  cp "$work/models/wide/1/model.onnx" "$work/models/wide_delay_$d/1/"
  batched_config "$d" >"$work/models/wide_delay_$d/config.json"
done
cp -r models/mnist "$work/models/mnist"
echo '{"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_us": 1000}}' \
  >"$work/models/mnist/config.json"

# 64 clients need 64 requests handled at once (http_threads defaults to 32), batching or not.
echo '{"http_threads": 128}' >"$work/config.json"
# start_server BINARY LOG: a server on the models above (bench/serve_util.sh).
start_server() {
  bench_serve "$2" "$1" --config "$work/config.json" --models "$work/models" \
    --listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0
}
start_server build/release/bin/backplane "$log"
http=$served_http grpc=$served_grpc
client=build/release/bin/backplane_bench_batching
echo "# bench/batching_bench.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
grep -o "backends: .*" "$log" | head -1
echo "MNIST with batching configured: $(grep -o "cannot batch.*fixed at 1" "$log" | head -1)"
echo
# The admin view of wide_batched's batches: before and after a run, the difference is that run's.
batches_view() { curl -s "http://$http/v2/models/wide_batched/placement"; }
# What the run's batches cost, by the size they executed at, and the p99 bound measured in the
# run itself: max_queue_delay_us + 2 x the mean execution time of the largest size that ran.
print_batches() {
  /usr/bin/python3 -c '
import json, sys
before, after = (json.loads(text)["batching"]["batch_executions"] for text in sys.argv[1:3])
seen = {size["batch_size"]: size for size in before}
rows = []
for size in after:
    old = seen.get(size["batch_size"], {"count": 0, "seconds_sum": 0})
    count = size["count"] - old["count"]
    if count:
        rows.append((size["batch_size"], count, (size["seconds_sum"] - old["seconds_sum"]) / count))
print("   batches by execution size: " + ", ".join("%d rows %d x %.2f ms" % (b, n, t * 1e3) for b, n, t in rows))
if rows:
    print("   p99 bound in this run: %.1f ms (%d us + 2 x %.2f ms, the %d-row batches)"
          % (int(sys.argv[3]) / 1e3 + 2 * rows[-1][2] * 1e3, int(sys.argv[3]), rows[-1][2] * 1e3, rows[-1][0]))
' "$1" "$2" "$delay"
}
if [[ ${ONLY:-} == tiny ]]; then
  echo "## What the transport allows: tiny (Gemm 784x10, nearly no execution), off against on, 3 rounds"
  # CPU time per request (the server's; the machine's: server and client): the path's cost,
  # which a shared machine's other work disturbs less than requests/s.
  # AGAINST=BINARY: the same runs against a second server, another build, in alternation.
  [[ -z ${AGAINST:-} ]] || start_server "$AGAINST" "$work/against.log"
  for _ in 1 2 3; do
    for server in "$grpc $http ${bench_servers[0]} this" \
      ${AGAINST:+"$served_grpc $served_http ${bench_servers[-1]} against"}; do
      read -r g h pid name <<<"$server"
      [[ -z ${AGAINST:-} ]] || echo "# $name build"
      "$client" --http "$h" --grpc "$g" --server-pid "$pid" --models "${PAIR:-tiny tiny_batched}" \
        --seconds "${DURATION:-5}" --runs "${RUNS:-rest:64 grpc:16 grpc-async:16}" | tail -n +2
    done
  done
  exit 0
fi
echo "## Batching off (wide) against on (wide_batched, max_queue_delay_us $delay), one row a request"
for run in rest:64 grpc:16 grpc-async:16 rest:1 grpc:1; do
  before=$(batches_view)
  "$client" --http "$http" --grpc "$grpc" --models "wide wide_batched" \
    --seconds "${DURATION:-5}" --runs "$run" | { [[ $run == rest:64 ]] && cat || tail -n +2; }
  print_batches "$before" "$(batches_view)"
done
echo
echo "## What the transport allows: tiny (Gemm 784x10, nearly no execution), off against on"
# A batched model can answer no faster than this path, whatever its execution costs: the ceiling
# of the ratios above (docs/performance.md).
"$client" --http "$http" --grpc "$grpc" --models "tiny tiny_batched" \
  --seconds "${DURATION:-5}" --runs "rest:64 grpc:16 grpc-async:16" | tail -n +2
echo
echo "## REST, 64 connections from wrk, off against on, 3 rounds"
# wrk drives 64 keep-alive connections from one thread (an event loop), where the client above
# runs 64 threads on the server's 2 cores: the lightest load generator this machine has, for the
# latency goal. It checks no answers (the runs above do). A 1 s warm-up follows each switch of
# model: the unbatched model's last executions are still running when its run ends.
backplane_install_packages wrk
/usr/bin/python3 - "$work/row.json" <<'PY'
import json, random, sys
random.seed(20261203)
row = [round(random.uniform(-1, 1), 6) for _ in range(784)]
json.dump({"inputs": [{"name": "x", "shape": [1, 784], "datatype": "FP32", "data": row}]},
          open(sys.argv[1], "w"))
PY
export WRK_BODY=$work/row.json  # for bench/wrk_post.lua
printf "%-5s %7s  %-22s %10s %8s %8s %8s\n" proto clients model requests/s "p50 ms" "p99 ms" non-2xx
for _ in 1 2 3; do
  for m in wide wide_batched; do
    wrk -t1 -c64 -d1s -s bench/wrk_post.lua "http://$http/v2/models/$m/infer" >/dev/null
    output=$(wrk -t1 -c64 -d"${DURATION:-5}s" --latency -s bench/wrk_post.lua \
      "http://$http/v2/models/$m/infer")
    printf "%-5s %7s  %-22s %10s %8s %8s %8s\n" wrk 64 "$m" \
      "$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' <<<"$output")" \
      "$(awk '$1 == "50%" {print $2}' <<<"$output")" "$(awk '$1 == "99%" {print $2}' <<<"$output")" \
      "$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$output" | grep . || echo 0)"
  done
done
echo
echo "## The largest batch alone: one client, 64-row requests over gRPC (raw tensors)"
"$client" --http "$http" --grpc "$grpc" --models "wide" --seconds "${DURATION:-5}" \
  --runs "grpc:1:64 grpc:1:16"
echo
echo "## max_queue_delay_us curve (wide_delay_<us>), REST, one row a request"
models=""
for d in $delays; do models="$models wide_delay_$d"; done
"$client" --http "$http" --grpc "$grpc" --models "$models" --seconds "${DURATION:-5}" \
  --runs "rest:64 rest:16 rest:1"
echo
echo "## What the batcher did over the whole run, 1-client runs included (the admin view of each model)"
for m in wide wide_batched $models; do
  curl -s "http://$http/v2/models/$m/placement" | /usr/bin/python3 -c '
import json, sys
b = json.load(sys.stdin)["batching"]
mean = b["batched_rows"] / b["batches"] if b["batches"] else 0
print("%-18s requests %8d executions %8d mean batch %5.1f rows, waits skipped %6d"
      % (sys.argv[1], b["requests"], b["executions"], mean, b["waits_skipped"]))' "$m"
done
