#!/usr/bin/env bash
# The backend author's path end to end: install Backplane to a prefix, build the example backend
# out of tree with find_package(Backplane) and backplane_add_backend(), and check it loads; then
# the embedder's: build examples/embed_runtime against the same prefix and run it (needs
# ../shared/data: without it the run fails, it is not skipped).
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
# A backend needs the SDK component only, and it brings no dependency: none of the host's
# packages is even looked for.
mkdir -p "$work/sdk_only"
cat >"$work/sdk_only/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(SdkOnly LANGUAGES CXX)
find_package(Backplane 0.1 REQUIRED COMPONENTS sdk)
foreach(dependency spdlog TBB Protobuf ONNX)
  if(${dependency}_FOUND OR DEFINED ${dependency}_DIR)
    message(FATAL_ERROR "find_package(Backplane COMPONENTS sdk) looked for ${dependency}")
  endif()
endforeach()
if(TARGET backplane::runtime OR NOT TARGET backplane::sdk)
  message(FATAL_ERROR "the sdk component must give backplane::sdk and nothing else")
endif()
backplane_add_backend(sdk_only_backend VENDOR Sdk NAME Only
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/../hello_source/hello_backend.cpp)
CMAKE
mkdir -p "$work/hello_source"
cp "$source_dir/examples/hello_backend/hello_backend.cpp" "$work/hello_source/"
cmake -S "$work/sdk_only" -B "$work/sdk_only/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_FLAGS="$cxx_flags" >"$work/sdk.log" 2>&1 ||
  { cat "$work/sdk.log"; exit 1; }
cmake --build "$work/sdk_only/build" >>"$work/sdk.log" 2>&1 || { cat "$work/sdk.log"; exit 1; }
"$work/prefix/bin/backplane" check "$work/sdk_only/build/Sdk_Only_backend.so" >/dev/null
# The installed first-party backend is checked by the installed executable too.
"$work/prefix/bin/backplane" check "$work/prefix/lib/backplane/backends" >/dev/null
# An installed executable never searches the build tree it came from.
defaults=$("$work/prefix/bin/backplane" check --json 2>&1 || true)
if grep -qF "$(cd "$build_dir" && pwd)/backends" <<<"$defaults"; then
  echo "the installed backplane searches the build tree's backends: $defaults"; exit 1
fi
# The embedder's path: the complete embedding example built out of tree from the installed package
# with find_package(Backplane COMPONENTS runtime), run against the installed backends on MNIST.
mnist="$source_dir/../shared/data/models/mnist"
cmake -S "$source_dir/examples/embed_runtime" -B "$work/embed" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_FLAGS="$cxx_flags" >"$work/embed.log" 2>&1 ||
  { cat "$work/embed.log"; exit 1; }
cmake --build "$work/embed" >>"$work/embed.log" 2>&1 || { cat "$work/embed.log"; exit 1; }
"$work/embed/example_embed_runtime" "$mnist/model.onnx" "$mnist/test_data_set_0/input_0.pb" \
  "$work/prefix/lib/backplane/backends" >"$work/embed.out" 2>"$work/embed.err" ||
  { cat "$work/embed.out" "$work/embed.err"; exit 1; }
grep -q "ExecuteAsync: digit 5 in 16 of 16 requests" "$work/embed.out" ||
  { cat "$work/embed.out"; exit 1; }
grep -q "every backend generation has left the process" "$work/embed.out" ||
  { cat "$work/embed.out"; exit 1; }
echo "package test passed"
