#!/usr/bin/env bash
# Runs the libFuzzer targets of a build (tests/fuzz; the clang preset builds them), each for a
# fixed time on a temporary copy of its seed corpus (tests/fuzz/corpus/<target>: the repository's
# corpus is never modified) with its dictionary (tests/fuzz/<target>.dict) when it has one,
# nproc at a time. Prints one line of libFuzzer's final stats per target and fails when any
# target finds a crash, a leak, a timeout (an input that takes over 10 s) or an out-of-memory
# (over 2 GiB); the input that did it is kept under <build dir>/fuzz-artifacts/.
#   scripts/fuzz.sh <build dir> <seconds per target> [target...]   (default: every target)
# scripts/test.sh's clang stage runs it for 10 s a target; bench/fuzz.sh runs it long.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:?usage: scripts/fuzz.sh <build dir> <seconds per target> [target...]}
seconds=${2:?usage: scripts/fuzz.sh <build dir> <seconds per target> [target...]}
shift 2
targets=("$@")
if ((${#targets[@]} == 0)); then
  for corpus in tests/fuzz/corpus/*/; do targets+=("$(basename "$corpus")"); done
fi

artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# UBSan's findings abort (-fno-sanitize-recover in the preset); say where.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_target() {
  local target=$1 binary=$build/bin/${1}_fuzz
  local options=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
                 -artifact_prefix="$artifacts/$target-")
  [[ -f tests/fuzz/$target.dict ]] && options+=(-dict="tests/fuzz/$target.dict")
  if [[ ! -x $binary ]]; then
    echo "no $binary: build the clang preset first" >"$work/$target.log"
    echo 1 >"$work/$target.status"
    return
  fi
  mkdir -p "$work/$target"
  cp tests/fuzz/corpus/"$target"/* "$work/$target/"
  local status=0
  "$binary" "${options[@]}" "$work/$target" >"$work/$target.log" 2>&1 || status=$?
  echo "$status" >"$work/$target.status"
}

# The last status line and the final stats of a run: executions, their rate, coverage.
summarize() {
  local log=$work/$1.log
  awk -v target="$1" '
    / cov: / { for (i = 1; i <= NF; i++) { if ($i == "cov:") cov = $(i + 1); if ($i == "ft:") ft = $(i + 1); if ($i == "corp:") corp = $(i + 1) } }
    /^stat::number_of_executed_units:/ { runs = $2 }
    /^stat::average_exec_per_sec:/ { rate = $2 }
    /^stat::peak_rss_mb:/ { rss = $2 }
    END { printf "%-20s %10s runs %8s/s  cov: %-6s ft: %-7s corpus: %-10s rss: %s MB\n", target, runs, rate, cov, ft, corp, rss }' "$log"
}

jobs=$(nproc)
for target in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_target "$target" &
done
wait
failed=()
for target in "${targets[@]}"; do
  [[ $(cat "$work/$target.status" 2>/dev/null) == 0 ]] || failed+=("$target")
done

for target in "${targets[@]}"; do summarize "$target"; done
for target in "${failed[@]}"; do
  echo "=== ${target}_fuzz FAILED; the end of its log (the input is under $artifacts/):"
  tail -n 60 "$work/$target.log"
done
((${#failed[@]} == 0))
