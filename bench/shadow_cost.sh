#!/usr/bin/env bash
# What shadow runs of a slow candidate cost the stable generation's requests (issue 40): the
# latency test of tests/runtime/shadow_test.cpp run ROUNDS times. Each round measures, in one
# process and one after the other, 2 closed-loop clients executing a two-layer Identity network
# on TestValid (a few µs) on a runtime of 2 arena threads, first with no rollout, then with
# ValidSlow (the same build, every execution 5 ms longer: over a thousand times slower) as a
# candidate shadowing every request (shadow_fraction 1). Prints each round's p99s, then the
# medians and the median of the rounds' ratios (shadowed p99 over p99 with no rollout).
#
#   bench/shadow_cost.sh               # 7 rounds of 1.5 s + 1.5 s
#   ROUNDS=15 BUILD=0 bench/shadow_cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-7}
if [[ ${BUILD:-1} != 0 ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target backplane_runtime_shadow_tests backplane_fixtures \
    >/dev/null
fi
binary=build/release/bin/backplane_runtime_shadow_tests
[[ -x $binary ]] || binary=$(find build/release -name backplane_runtime_shadow_tests -type f | head -1)

alone=()
shadowed=()
ratios=()
for ((round = 1; round <= rounds; round++)); do
  line=$("$binary" --gtest_filter='ShadowTest.ACandidateThousandsOfTimesSlower*' 2>&1 |
    grep '^p99 with no rollout' || true)
  if [[ -z $line ]]; then
    echo "round $round: the test printed no measurement" >&2
    exit 1
  fi
  # "p99 with no rollout A µs (N requests), with the slow candidate shadowed B µs (M): Rx"
  a=$(sed -E 's/^p99 with no rollout ([0-9.e+]+) .*/\1/' <<<"$line")
  b=$(sed -E 's/.*shadowed ([0-9.e+]+) µs.*/\1/' <<<"$line")
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
  printf 'round %d: p99 %8.1f µs with no rollout, %8.1f µs shadowed: %sx\n' "$round" "$a" "$b" "$r"
  alone+=("$a")
  shadowed+=("$b")
  ratios+=("$r")
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
printf 'median of %d rounds: p99 %.1f µs with no rollout, %.1f µs shadowed; ratio %.3f (median of the rounds'"'"' ratios)\n' \
  "$rounds" "$(median "${alone[@]}")" "$(median "${shadowed[@]}")" "$(median "${ratios[@]}")"
