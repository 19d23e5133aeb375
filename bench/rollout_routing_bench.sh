#!/usr/bin/env bash
# Compares two builds of backplane_bench_rollout_routing (say, one built on the commit before a
# change to the request path and one after): runs them alternately, the order swapped each round,
# ROUNDS times each (3 repetitions of 0.2 s per row and run), and prints each row's median and
# quartiles of CPU time per request over every repetition of each build. Alternating runs share
# whatever else the machine is doing; compare medians, and read the quartiles as the noise.
#
#   bench/rollout_routing_bench.sh BEFORE_BINARY AFTER_BINARY
#   ROUNDS=12 FILTER='ExecuteNoRollout/real_time/threads:1' bench/rollout_routing_bench.sh A B
set -euo pipefail
if (($# != 2)); then
  echo "usage: $0 BEFORE_BINARY AFTER_BINARY" >&2
  exit 2
fi
before=$1
after=$2
rounds=${ROUNDS:-10}
filter=${FILTER:-.}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for round in $(seq 1 "$rounds"); do
  order=(before after)
  if ((round % 2 == 0)); then order=(after before); fi
  for which in "${order[@]}"; do
    binary=$before
    if [[ $which == after ]]; then binary=$after; fi
    "$binary" --benchmark_filter="$filter" --benchmark_repetitions=3 --benchmark_min_time=0.2 \
      --benchmark_out="$out/$which-$round.json" --benchmark_out_format=json >/dev/null 2>&1
  done
done
python3 - "$out" <<'PY'
import collections, glob, json, statistics, sys

rows = collections.defaultdict(lambda: collections.defaultdict(list))
for path in glob.glob(sys.argv[1] + "/*.json"):
    which = path.rsplit("/", 1)[1].split("-")[0]
    for run in json.load(open(path))["benchmarks"]:
        if run.get("run_type") == "iteration":
            rows[run["run_name"]][which].append(run["cpu_time"])


def summary(times):
    if len(times) < 2:
        return "-"
    q1, _, q3 = statistics.quantiles(times, n=4)
    return f"{statistics.median(times):7.1f} [{q1:6.1f},{q3:6.1f}]"


print(f"{'row (CPU ns per request)':44s} {'before: median [q1,q3]':>24s} {'after: median [q1,q3]':>24s}")
for name in sorted(rows):
    print(f"{name:44s} {summary(rows[name]['before']):>24s} {summary(rows[name]['after']):>24s}")
PY
