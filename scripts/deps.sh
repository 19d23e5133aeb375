#!/usr/bin/env bash
# Installs the Debian 12 packages the build and tests need, when they are missing. Sourced by the
# other scripts; safe to run again.
set -euo pipefail

BACKPLANE_PACKAGES=(
  cmake ninja-build g++ pkg-config binutils
  libtbb-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libonnx-dev libprotobuf-dev
  libuv1-dev libssl-dev curl
  libboost-dev  # Boost.Beast/Asio 1.74 (header-only): the HTTP server
  libcpp-httplib-dev  # the tests' and benchmarks' HTTP client
  libdnnl-dev  # oneDNN 2.6 (OpenMP build): the CpuAcc backend
  libgtest-dev libgmock-dev libbenchmark-dev
  # promtool: the tests check /metrics and deploy/prometheus/alerts.yaml with it (and fail under
  # CI=true without it). Debian 12 has it only in the whole server: 19 MB to download, 3 MB of
  # web assets beside it; --no-install-recommends below leaves out node-exporter.
  prometheus
  libomp5-14  # LLVM's OpenMP runtime: the loader's test of a renamed threading runtime
  clang-14    # the clang preset (thread-safety analysis, the libFuzzer targets)
  libclang-rt-14-dev  # clang's sanitizer and libFuzzer runtimes (only recommended by clang-14)
  python3-yaml jq  # tests/deploy read the manifests; scripts/rollout.sh reads the admin API
  openssl  # the signing tests sign backend builds with it (and fail under CI without it)
  libgrpc++-dev protobuf-compiler-grpc  # KServe v2 over gRPC
)
# Node and npm run the independent gRPC client of the tests (tests/grpc_client); any install of
# them will do, so Debian's are only added when there is none.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  BACKPLANE_PACKAGES+=(nodejs npm)
fi

# Installs each of the given packages that is missing (the benchmarks add their tools: wrk).
backplane_install_packages() {
  local missing=()
  for package in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$package")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  echo "installing missing packages: ${missing[*]}"
  local sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

backplane_install_deps() {
  backplane_install_packages "${BACKPLANE_PACKAGES[@]}"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  backplane_install_deps
fi
