#!/usr/bin/env bash
# Builds and runs every test: the release build, then the same tests under AddressSanitizer +
# UndefinedBehaviorSanitizer and under ThreadSanitizer, then the clang build: the thread-safety
# analysis (-Werror=thread-safety; libraries and server) and the libFuzzer targets under
# ASan+UBSan, each then run for a fixed time on its seed corpus (scripts/fuzz.sh, docs/fuzzing.md).
# `scripts/test.sh release` runs one preset.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
backplane_install_deps

presets=("$@")
if ((${#presets[@]} == 0)); then presets=(release asan tsan clang); fi

# The tests of build directory $1 that took longest in its last ctest run, and the sum of all:
# where a preset's test time goes.
print_slowest_tests() {
  [[ -f $1/Testing/Temporary/LastTest.log ]] || return 0
  awk '/^[0-9]+\/[0-9]+ Test: / { name = $3 }
       /^Test time =/ { printf "%8.1f s  %s\n", $4, name; total += $4 }
       END { printf "%8.1f s  (all tests, one after another)\n", total }' \
    "$1/Testing/Temporary/LastTest.log" | sort -rn | awk 'NR <= 11'  # reads all: no SIGPIPE under pipefail
}

jobs=$(nproc)
for preset in "${presets[@]}"; do
  echo "=== ${preset}: build"
  start=$SECONDS
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  echo "=== ${preset}: built in $((SECONDS - start)) s"
  if [[ "$preset" == clang ]]; then
    # No ctest: the build is the thread-safety check; then every fuzz target for 10 s, two at a
    # time on 2 cores (a crash, leak, timeout or out-of-memory fails the stage).
    echo "=== clang: fuzz"
    start=$SECONDS
    scripts/fuzz.sh build/clang 10
    echo "=== clang: fuzzed in $((SECONDS - start)) s"
    continue
  fi
  echo "=== ${preset}: test"
  start=$SECONDS
  ctest --preset "$preset" -j "$jobs"
  echo "=== ${preset}: tested in $((SECONDS - start)) s; the slowest tests:"
  print_slowest_tests "build/${preset}"
done
echo "=== all presets passed in ${SECONDS} s"
