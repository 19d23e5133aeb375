#!/usr/bin/env bash
# The main job: build Backplane (release) and start `backplane serve` with no arguments: the
# example model repository (models/: mnist, mlp) on the build's first-party backends (each model
# prefers CpuAcc, the oneDNN backend, then CpuRef), on 127.0.0.1:8000. Ctrl-C (or SIGTERM) stops
# it gracefully. Extra arguments go to `serve` (e.g. --listen 127.0.0.1:0, --config FILE); see
# docs/operators.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
backplane_install_deps

cmake --preset release >/dev/null
cmake --build --preset release

address=127.0.0.1:8000
previous=""
for argument in "$@"; do
  if [[ "$previous" == "--listen" ]]; then address="$argument"; fi
  if [[ "$argument" == --listen=* ]]; then address="${argument#--listen=}"; fi
  previous="$argument"
done
cat <<MESSAGE

Starting backplane serve on http://${address} (the log says the real port when it is 0).
Classify a handwritten digit (MNIST test image 0, a 5) from another terminal:

  curl -s -X POST --data @models/mnist/example_request.json http://${address}/v2/models/mnist/infer

The answer's 10 logits peak at index 5. More: docs/operators.md.

MESSAGE
exec build/release/bin/backplane serve "$@"
