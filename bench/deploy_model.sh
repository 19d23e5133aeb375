#!/usr/bin/env bash
# The deploy model test (tests/runtime/deploy_model_test.cpp) for long runs: seeded random
# sequences of operator actions on a watched backend directory, checked after every step against
# the resolution rule of docs/hot-reload.md, with a client executing throughout.
#
#   bench/deploy_model.sh                 # 5 runs of 1000 steps, each with a new seed
#   RUNS=20 STEPS=2000 bench/deploy_model.sh
#   SEED=1234 STEPS=300 bench/deploy_model.sh   # replay one sequence
#
# Prints each run's seed, steps, time and result; exits non-zero at the first failing run (its
# seed replays it).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
backplane_install_deps
cmake --preset release >/dev/null
cmake --build --preset release --target backplane_runtime_tests >/dev/null
runs=${RUNS:-5}
steps=${STEPS:-1000}
for ((run = 1; run <= runs; ++run)); do
  seed=${SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
  start=$SECONDS
  if BACKPLANE_DEPLOY_SEED=$seed BACKPLANE_DEPLOY_STEPS=$steps \
    build/release/bin/backplane_runtime_tests --gtest_filter='DeployModelTest.*' >/tmp/deploy_model.$$.log 2>&1; then
    echo "run $run: seed $seed, $steps steps: passed in $((SECONDS - start)) s"
  else
    cat /tmp/deploy_model.$$.log
    echo "run $run: seed $seed, $steps steps: FAILED (replay with SEED=$seed STEPS=$steps)"
    exit 1
  fi
done
rm -f /tmp/deploy_model.$$.log
