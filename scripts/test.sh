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

# CI as the tests read it (RunningInCi, tests/test_util.cpp): set, and not empty, 0 or false.
in_ci() {
  local ci=${CI:-}
  ci=${ci,,}
  [[ -n $ci && $ci != 0 && $ci != false ]]
}

# Whether tests/ci_skips.txt lets preset $1 skip test $2.
skip_allowed() {
  local presets regex _
  while read -r presets regex _; do
    [[ -z $presets || $presets == \#* ]] && continue
    [[ ",$presets," == *",$1,"* && $2 =~ ^${regex}$ ]] && return 0
  done <tests/ci_skips.txt
  return 1
}

# Prints the tests ctest skipped (its output in file $2) by name; under CI, fails when preset $1
# skipped one that tests/ci_skips.txt does not allow.
check_skips() {
  local name unexpected=0
  local -a skipped
  mapfile -t skipped < <(sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+).*\(Skipped\)$/\1/p' "$2")
  echo "=== $1: ${#skipped[@]} test(s) skipped"
  for name in "${skipped[@]}"; do
    if skip_allowed "$1" "$name"; then
      echo "  $name (tests/ci_skips.txt)"
    else
      echo "  $name (NOT in tests/ci_skips.txt)"
      unexpected=$((unexpected + 1))
    fi
  done
  if ((unexpected > 0)) && in_ci; then
    echo "=== $1: ${unexpected} test(s) skipped under CI that tests/ci_skips.txt does not allow"
    return 1
  fi
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
  ctest --preset "$preset" -j "$jobs" | tee "build/${preset}/ctest-output.txt"
  echo "=== ${preset}: tested in $((SECONDS - start)) s; the slowest tests:"
  print_slowest_tests "build/${preset}"
  check_skips "$preset" "build/${preset}/ctest-output.txt"
done
echo "=== all presets passed in ${SECONDS} s"
