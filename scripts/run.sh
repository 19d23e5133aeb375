#!/usr/bin/env bash
# The main job: build Backplane (release) and check the first-party backends of the build.
# Extra arguments go to `backplane check` (e.g. --json).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
backplane_install_deps

cmake --preset release >/dev/null
cmake --build --preset release
exec build/release/bin/backplane check "$@" build/release/backends
