#!/usr/bin/env bash
# The backend author's path end to end: install Backplane to a prefix, build the example backend
# out of tree with find_package(Backplane) and backplane_add_backend(), and check it loads.
# Usage: package_test.sh <build dir> <source dir> [<CXX flags of that build>]
# (the flags matter under sanitizers: the installed static libraries are instrumented)
set -euo pipefail
build_dir=$1
source_dir=$2
cxx_flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/examples/hello_backend" -B "$work/hello" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_FLAGS="$cxx_flags" \
  >/dev/null
cmake --build "$work/hello" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
backend="$work/hello/examples/backends/Example_Hello_backend.so"
test -L "$backend"  # the versioned names are made
"$work/prefix/bin/backplane" check --json "$backend" >"$work/report.json"
grep -q '"id": "ExampleHello"' "$work/report.json"
grep -q '"ok": true' "$work/report.json"
# The installed first-party backend is checked by the installed executable too.
"$work/prefix/bin/backplane" check "$work/prefix/lib/backplane/backends" >/dev/null
echo "package test passed"
