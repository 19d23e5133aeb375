#!/usr/bin/env bash
# The rollout judge's verdicts over generated canary windows, with the default policy: identical
# builds (false alarms), builds 5 % and 20 % slower, for four latency shapes and three window sizes
# (docs/operators.md, "Progressive rollout", quotes this table). Builds what it runs.
#
#   bench/rollout_judge.sh            TRIALS=2000 bench/rollout_judge.sh
# Generated windows, not recorded ones: a server's own windows are judged by RolloutTest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake --build --preset release --target backplane_bench_rollout_judge >/dev/null
build/release/bin/backplane_bench_rollout_judge
