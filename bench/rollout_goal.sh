#!/usr/bin/env bash
# Issue 40's goal, end to end: progressive rollouts with the DEFAULT policy on a real server,
# ROLLOUTS per case, under closed-loop REST clients, and what each ended as. The candidates are
# builds of one fixture backend (tests/fixtures/CMakeLists.txt, "Builds of one backend for
# bench/rollout_goal.sh"): the same code again (must be promoted), 20 % more work per execution,
# a failure every 50th execution, other outputs (must be rolled back). Each published copy gets
# bytes appended, so every rollout is of new content (a rolled-back digest stays refused).
# The model is an Identity over [N, 4] whose backend busies its core for work_ns per execution:
# "fast" 3 µs (where p99 ratios rolled identical code back), "ms" 3 ms.
#
#   bench/rollout_goal.sh                                  # everything: 20 rollouts per case
#   ROLLOUTS=3 MODELS=fast CLIENTS="1 6" CASES="identical slower" bench/rollout_goal.sh
#   POLICY='{"candidate_isolation": "none"}' MODELS=fast CLIENTS=1 bench/rollout_goal.sh
#   RATE=100 MODELS=ms CLIENTS=1 CASES=identical ROLLOUTS=1 bench/rollout_goal.sh   # ~100 req/s
#   VERBOSE=1 ...                                          # and every transition's verdict
#
# Prints one line per rollout as it ends, then a table: per model, clients and case, how many
# were promoted, rolled back, or not done within steps × step_max_duration_s (plus the shadow
# phase), and the median time a rollout took. ROLLOUTS=20 of everything takes hours at 3 ms
# (a step of 1 % sees 200 candidate runs only after 20,000 requests): see docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh  # backplane_install_packages
backplane_install_packages python3-onnx curl
rollouts=${ROLLOUTS:-20}
models=${MODELS:-fast ms}
client_counts=${CLIENTS:-1 6}
cases=${CASES:-identical slower failing wrong}
rate=${RATE:-0}  # requests/s per client, 0: as fast as answers come
if [[ ${BUILD:-1} != 0 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target backplane backplane-backend-worker \
    backplane_bench_batching bench_fixture_Work bench_fixture_WorkTwin bench_fixture_WorkSlower \
    bench_fixture_WorkFailing bench_fixture_WorkWrong >/dev/null
fi
fixtures=build/release/tests/fixtures/lib
declare -A build_of=([identical]=WorkTwin [slower]=WorkSlower [failing]=WorkFailing [wrong]=WorkWrong)
declare -A work_ns=([fast]=3000 [ms]=3000000)

work=$(mktemp -d /tmp/backplane-rollout-goal-XXXXXX)
server_pid= load_pid=
source bench/serve_util.sh  # bench_serve
stop() {
  [[ -z $load_pid ]] || { kill -TERM "$load_pid" 2>/dev/null; wait "$load_pid" 2>/dev/null || true; }
  [[ -z $server_pid ]] || { kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true; }
  load_pid= server_pid=
}
trap 'stop; rm -rf "$work"' EXIT

mkdir -p "$work/models/identity/1"
/usr/bin/python3 - "$work/models/identity/1/model.onnx" <<'PY'
import sys
import onnx
from onnx import helper, TensorProto
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
echo '{"backends": ["TestWork"]}' >"$work/models/identity/config.json"
# The default policy, nothing else (what an operator who turns progressive on gets), unless
# POLICY gives rollout keys, e.g. POLICY='{"candidate_isolation": "none"}'.
policy=${POLICY:-"{}"}
cat >"$work/serve.json" <<JSON
{"deploy_policy": "progressive", "watch_backends": false, "grpc_listen": "off", "rollout": $policy}
JSON
policy_limit_s() {  # shadow + every step, each at most step_max_duration_s
  /usr/bin/python3 -c 'import json,sys; p=json.load(sys.stdin)["policy"]; print(int((len(p["steps"]) + (p["shadow_fraction"] > 0)) * p["step_max_duration_s"]))'
}

# Publishes build $1 (with bytes making it new content) the safe way and asks for a reload.
serial=0
publish() {
  serial=$((serial + 1))
  cp "$(readlink -f "$fixtures/Test_$1_backend.so")" "$work/backends/.incoming"
  printf 'rollout goal %d %s\n' "$serial" "$(date +%s%N)" >>"$work/backends/.incoming"
  mv "$work/backends/.incoming" "$work/backends/Test_Work_backend.so"
  curl -sf -X POST "$admin/reload" >/dev/null
}

echo "# bench/rollout_goal.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# rollout policy: the default${POLICY:+ with $POLICY}; $rollouts rollout(s) per case; rate per client: ${rate/#0/closed loop}"
: >"$work/results"
for model in $models; do
  for clients in $client_counts; do
    rm -rf "$work/backends" && mkdir -p "$work/backends"
    cp "$(readlink -f "$fixtures/Test_Work_backend.so")" "$work/backends/Test_Work_backend.so"
    bench_serve "$work/serve.log" build/release/bin/backplane --config "$work/serve.json" \
      --models "$work/models" --backends "$work/backends" --listen 127.0.0.1:0
    server_pid=$served_pid http=$served_http
    admin=http://$http/v2/backends/TestWork
    curl -sf -X PUT "$admin/options" -d "{\"work_ns\": ${work_ns[$model]}}" >/dev/null
    limit_s=$(curl -sf "$admin/rollout" | policy_limit_s)
    think_us=0
    [[ $rate == 0 ]] || think_us=$((1000000 / rate))
    build/release/bin/backplane_bench_batching --http "$http" --grpc 127.0.0.1:1 --models identity \
      --features 4 --seconds 1000000 --slices 1 --think-us "$think_us" --runs "rest:$clients" \
      >/dev/null 2>&1 &
    load_pid=$!
    sleep 2
    for case_name in $cases; do
      for round in $(seq 1 "$rollouts"); do
        # Where the rollout view stands: "<phase> <candidate_generation>".
        standing() { /usr/bin/python3 -c 'import json,sys; v=json.load(sys.stdin); print(v["phase"], v["candidate_generation"])'; }
        before=$(curl -sf "$admin/rollout" | standing | cut -d' ' -f2)
        start_ns=$(date +%s%N)
        publish "${build_of[$case_name]}"
        ended=stuck
        while (($(date +%s%N) - start_ns < (limit_s + 30) * 1000000000)); do
          view=$(curl -sf "$admin/rollout")
          read -r phase candidate <<<"$(standing <<<"$view")"
          if [[ $candidate != "$before" && ($phase == promoted || $phase == rolled_back) ]]; then
            ended=$phase
            break
          fi
          sleep 0.2
        done
        took=$((($(date +%s%N) - start_ns) / 1000000))e-3
        why=$(/usr/bin/python3 -c 'import json,sys; h=json.load(sys.stdin)["history"]; print(h[-1]["why"][:150] if h else "")' <<<"$view")
        printf '%-4s %d clients  %-9s #%-2d %-11s %6.1f s  %s\n' "$model" "$clients" "$case_name" \
          "$round" "$ended" "$took" "$why"
        if [[ ${VERBOSE:-0} != 0 ]]; then  # every transition of the rollout, with its numbers
          /usr/bin/python3 -c 'import json,sys
for h in json.load(sys.stdin)["history"]: print("      ", h["phase"], h["weight_percent"], h["why"][:400])' <<<"$view"
        fi
        echo "$model $clients $case_name $ended $took" >>"$work/results"
        if [[ $ended == stuck ]]; then  # leave the next rollout a clean start
          curl -sf -X POST "$admin/rollout/abort" >/dev/null || true
        elif [[ $ended == promoted && $case_name != identical ]]; then
          # A bad build promoted serves now: the next rollout of the case would compare it with
          # itself. Back to the build before it, as an operator would.
          curl -sf -X POST "$admin/rollback" >/dev/null || echo "# rollback after #$round failed" >&2
        fi
      done
    done
    stop
  done
done

echo
/usr/bin/python3 - "$work/results" "$limit_s" "$models" "$client_counts" "$cases" <<'PY'
import statistics, sys
results = [line.split() for line in open(sys.argv[1])]
expected = {"identical": "promoted"}
print("model clients case       expected     promoted rolled_back stuck  median s  limit s")
for model in sys.argv[3].split():
    for clients in sys.argv[4].split():
        for case in sys.argv[5].split():
            rows = [r for r in results if r[:3] == [model, clients, case]]
            count = {end: sum(r[3] == end for r in rows) for end in ("promoted", "rolled_back", "stuck")}
            median = statistics.median(float(r[4]) for r in rows) if rows else 0
            print("%-5s %7s %-10s %-12s %8d %11d %5d %9.1f %8s" % (
                model, clients, case, expected.get(case, "rolled_back"), count["promoted"],
                count["rolled_back"], count["stuck"], median, sys.argv[2]))
PY
