#!/usr/bin/env bash
# Mutants that the tests must kill: applies the deliberate breakages of scripts/mutants.txt one
# at a time, builds the test binary each names in build/mutants (release, ccache), runs its tests
# with CI=true and restores the source. A mutant is killed when its tests fail (or crash, or hang);
# it survived when they pass, which is a hole in the tests. Exits non-zero when any mutant
# survived, no longer applies (stale: its original text is not found exactly once, so the list
# cannot rot silently) or does not build, or when the tests fail before any mutant is applied.
#
#   scripts/mutants.sh            every mutant
#   scripts/mutants.sh ID...      those mutants
#   scripts/mutants.sh --list     the mutants, their files and tests
#
# On demand and in the weekly long run, not in every CI run (docs/testing.md): it builds and
# tests once per mutant. BACKPLANE_MUTANT_TIMEOUT (seconds, default 600) bounds one test run.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly list=scripts/mutants.txt
readonly build=build/mutants
readonly logs=$build/mutant-logs
readonly timeout_seconds=${BACKPLANE_MUTANT_TIMEOUT:-600}

# The list's parser and applier: `ids`, `field ID NAME`, `check ID` (exit 3 unless the original
# is found exactly once), `apply ID` (replaces it, same check).
mutant_tool() {
  python3 - "$list" "$@" <<'PY'
import re
import sys

path, command, *args = sys.argv[1:]
mutants = {}
order = []
current = None
section = None
with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f.read().split("\n"), 1):
        if line.startswith("=== "):
            name = line[4:].strip()
            if not re.fullmatch(r"[A-Za-z0-9-]+", name) or name in mutants:
                sys.exit(f"{path}:{number}: bad or repeated mutant id '{name}'")
            current = {"id": name, "original": [], "replacement": []}
            mutants[name] = current
            order.append(name)
            section = None
        elif current is None:
            continue  # the header: comments and blank lines
        elif line in ("--- original", "--- replacement"):
            section = line[4:]
        elif section is not None:
            current[section].append(line)
        elif line.strip() and not line.startswith("#"):
            key, sep, value = line.partition(":")
            if not sep or key not in ("file", "test", "why"):
                sys.exit(f"{path}:{number}: expected file:, test:, why: or --- original")
            current[key] = value.strip()

for mutant in mutants.values():
    for section in ("original", "replacement"):
        lines = mutant[section]
        while lines and not lines[-1].strip():
            lines.pop()
        mutant[section] = "\n".join(lines)
    for key in ("file", "test", "why", "original"):
        if not mutant.get(key):
            sys.exit(f"{path}: mutant {mutant['id']} has no {key}")
    if mutant["original"] == mutant["replacement"]:
        sys.exit(f"{path}: mutant {mutant['id']} changes nothing")


def occurrences(mutant):
    try:
        with open(mutant["file"], encoding="utf-8") as f:
            text = f.read()
    except OSError as error:
        return None, 0, str(error)
    return text, text.count(mutant["original"]), None


def get(name):
    if name not in mutants:
        sys.exit(f"no mutant '{name}' in {path}")
    return mutants[name]


if command == "ids":
    print("\n".join(order))
elif command == "field":
    print(get(args[0])[args[1]])
elif command in ("check", "apply"):
    mutant = get(args[0])
    text, count, error = occurrences(mutant)
    if count != 1:
        print(error or f"its original text is found {count} times in {mutant['file']}, not once")
        sys.exit(3)
    if command == "apply":
        with open(mutant["file"], "w", encoding="utf-8") as f:
            f.write(text.replace(mutant["original"], mutant["replacement"], 1))
else:
    sys.exit(f"unknown command {command}")
PY
}

field() { mutant_tool field "$1" "$2"; }

if [[ ${1:-} == --list ]]; then
  while read -r id; do
    printf '%-32s %s\n%-32s   %s\n%-32s   %s\n' "$id" "$(field "$id" file)" "" \
      "$(field "$id" test)" "" "$(field "$id" why)"
  done < <(mutant_tool ids)
  exit 0
fi

mapfile -t all_ids < <(mutant_tool ids)
ids=("$@")
if ((${#ids[@]} == 0)); then ids=("${all_ids[@]}"); fi
for id in "${ids[@]}"; do field "$id" file >/dev/null; done  # an unknown id stops here

# The source is restored whatever happens: a mutant never stays in the tree. Restored with a new
# modification time, so that the next build compiles the real code again (ccache: a hit).
mutated_file=
backup=$(mktemp)
restore() {
  if [[ -n $mutated_file ]]; then
    cat "$backup" >"$mutated_file"
    echo "restored $mutated_file"
    mutated_file=
  fi
}
trap 'restore; rm -f "$backup"' EXIT
trap 'exit 130' INT TERM

if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++ \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DBACKPLANE_BUILD_BENCHMARKS=OFF >/dev/null
fi
mkdir -p "$logs"

build_binary() {
  cmake --build "$build" --target "$1" -j "$(nproc)" >>"$2" 2>&1
}

# Runs test selection "$1" ("binary filter") into log $2; its exit status is the tests'.
run_tests() {
  local binary filter
  read -r binary filter <<<"$1"
  CI=true timeout --kill-after=10 "$timeout_seconds" \
    "$build/bin/$binary" --gtest_filter="$filter" --gtest_color=no >>"$2" 2>&1
}

# The failed tests a log names, or how the run ended.
failure_of() {
  local failed
  failed=$(sed -nE 's/^\[  FAILED  \] ([A-Za-z0-9_/.]+)(, | \().*$/\1/p' "$1" | sort -u |
    head -3 | paste -sd ' ')
  if [[ -n $failed ]]; then
    echo "$failed"
  elif (($2 == 124 || $2 == 137)); then
    echo "timed out after ${timeout_seconds} s"
  elif (($2 > 128)); then
    echo "crashed (signal $(($2 - 128)))"
  else
    echo "exit status $2"
  fi
}

start=$SECONDS
declare -A result=() detail=()
stale=0

# Stale mutants first, so that a list that no longer matches the code says so before any build.
runnable=()
for id in "${ids[@]}"; do
  if why=$(mutant_tool check "$id"); then
    runnable+=("$id")
  else
    result[$id]=stale
    detail[$id]=$why
    stale=$((stale + 1))
  fi
done

# The selections must pass on the real code and hold a test, or a kill would mean nothing.
declare -A baseline=()
selections=0
for id in "${runnable[@]}"; do
  selection=$(field "$id" test)
  [[ -n ${baseline[$selection]:-} ]] && continue
  selections=$((selections + 1))
  log=$logs/baseline-$selections.log
  : >"$log"
  echo "=== baseline: $selection"
  if ! build_binary "${selection%% *}" "$log"; then
    echo "the unmutated build failed: $log"
    exit 1
  fi
  status=0
  run_tests "$selection" "$log" || status=$?
  if ((status != 0)) || ! grep -qE '^\[  PASSED  \] [1-9]' "$log"; then
    echo "the tests fail (or none matched) before any mutant: $(failure_of "$log" "$status"); $log"
    exit 1
  fi
  baseline[$selection]=passed
done

for id in "${runnable[@]}"; do
  file=$(field "$id" file)
  selection=$(field "$id" test)
  log=$logs/$id.log
  : >"$log"
  echo "=== $id: $file"
  mutant_start=$SECONDS
  cp "$file" "$backup"
  mutated_file=$file
  mutant_tool apply "$id" >>"$log"
  if ! build_binary "${selection%% *}" "$log"; then
    result[$id]="build-failed"
    detail[$id]="the mutant does not compile: $log"
  else
    status=0
    run_tests "$selection" "$log" || status=$?
    if ((status == 0)); then
      result[$id]=SURVIVED
      detail[$id]="$selection passed; $log"
    else
      result[$id]=killed
      detail[$id]=$(failure_of "$log" "$status")
    fi
  fi
  restore >/dev/null
  echo "    ${result[$id]} in $((SECONDS - mutant_start)) s: ${detail[$id]}"
done

echo
echo "=== mutants ($((SECONDS - start)) s)"
not_killed=0
for id in "${ids[@]}"; do
  printf '%-32s %-12s %s\n' "$id" "${result[$id]}" "${detail[$id]}"
  [[ ${result[$id]} == killed ]] || not_killed=$((not_killed + 1))
done
echo "=== ${#ids[@]} mutant(s): $((${#ids[@]} - not_killed)) killed, ${not_killed} not" \
  "(${stale} stale)"
((not_killed == 0))
