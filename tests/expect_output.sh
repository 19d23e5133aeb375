#!/usr/bin/env bash
# Runs a test program; passes only when it exits 0 *and* its output matches PATTERN (a PCRE in
# which `.` matches newlines too). ctest's PASS_REGULAR_EXPRESSION alone ignores the exit status,
# so a sanitizer report at exit or a failed final check of the program would pass.
#   expect_output.sh PATTERN PROGRAM [ARGS...]
set -uo pipefail
pattern=$1
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if ((status != 0)); then
  echo "expect_output.sh: $1 exited with status $status" >&2
  exit 1
fi
if ! grep -qPz -- "(?s)$pattern" <<<"$output"; then
  echo "expect_output.sh: the output does not match: $pattern" >&2
  exit 1
fi
