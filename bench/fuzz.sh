#!/usr/bin/env bash
# Runs every libFuzzer target long: `bench/fuzz.sh 600` fuzzes each for 10 minutes (default 600 s),
# two at a time, on a copy of its seed corpus, and prints per target the executions, executions
# per second, coverage (cov: edges, ft: features) and corpus size from libFuzzer's final stats.
# Builds the clang preset first. A crash, leak, timeout or out-of-memory fails it and leaves the
# input in build/clang/fuzz-artifacts/ (docs/fuzzing.md says what to do with it).
#   bench/fuzz.sh [seconds per target] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
cmake --preset clang >/dev/null
cmake --build --preset clang -j "$(nproc)"
scripts/fuzz.sh build/clang "$seconds" "$@"
