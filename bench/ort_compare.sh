#!/usr/bin/env bash
# CpuAcc against ONNX Runtime, side by side in one run: for each case, ONNX Runtime 1.30 (CPU,
# through its Node binding, single-threaded) and Backplane's Runtime::Execute on CpuAcc with
# intra_op_threads 1 and 2 and on CpuRef; then the runtime's own cost per layer and the
# throughput of 2 clients against 1. Prints a markdown table (docs/performance.md, "CpuAcc
# against ONNX Runtime", says what each column means).
#
#   bench/ort_compare.sh                      # SECONDS_PER_RUN=2; builds what it needs first
#   BUILD=0 bench/ort_compare.sh              # use build/release as it is
#   CPU_ACC=/path/Backplane_CpuAcc_backend.so bench/ort_compare.sh   # another CpuAcc build
#
# CpuAcc is build/release/backends/Backplane_CpuAcc_backend.so unless CPU_ACC says otherwise;
# when there is none, the CpuAcc columns say "missing" and everything else still runs (the
# throughput part then runs on CpuRef, and says so).
#
# ONNX Runtime: onnxruntime-node@1.30.0 installed with npm into build/release/bench/ort (once) with
# ONNXRUNTIME_NODE_INSTALL=skip, which only skips downloading the CUDA/TensorRT provider binaries
# (not in the npm package); the CPU binding (bin/napi-v6/linux/x64/onnxruntime_binding.node and
# libonnxruntime.so.1) is in the package itself. Sessions: CPU provider, intraOpNumThreads 1,
# interOpNumThreads 1, sequential execution. The binding's per-call cost (promise, N-API, tensor
# objects) is measured in the same Node process on a 1-element Identity model right before each
# case and subtracted: "ORT µs" = median(model) - median(identity).
#
# The models (bench/make_compare_models.py, written to build/release/bench/models): MLP
# 784-512-512-10 (Gemm+Relu, Gemm+Relu, Gemm) at batch 1 and 64; LeNet-5-like CNN (Conv 1->6 5x5
# pad 2 + Relu + MaxPool 2, Conv 6->16 5x5 + Relu + MaxPool 2, Flatten, Gemm 400->120 + Relu,
# Gemm 120->84 + Relu, Gemm 84->10: 2 Conv, 2 MaxPool, 3 Gemm) at batch 1 and 64; and the real
# MNIST model (../shared/data/models/mnist/model.onnx, batch 1). Both sides get the same input
# values and time each call separately: median (and p90 in the details) over SECONDS_PER_RUN
# seconds of back-to-back calls after 20 warm-up calls.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=build/release

SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
ORT_VERSION=1.30.0

if [[ ${BUILD:-1} != 0 ]]; then
  source scripts/deps.sh
  backplane_install_deps
  cmake --preset release >/dev/null
  targets=(backplane_cpu_ref backplane_bench_compare)
  # The CpuAcc target, when this tree has one.
  if ninja -C "$build" -t targets all 2>/dev/null | grep -q '^backplane_cpu_acc:'; then
    targets+=(backplane_cpu_acc)
  fi
  cmake --build --preset release -j2 --target "${targets[@]}" >/dev/null
fi

bench_bin=$build/bin/backplane_bench_compare
cpu_ref=$(readlink -f $build/backends/Backplane_CpuRef_backend.so)
cpu_acc=${CPU_ACC:-$build/backends/Backplane_CpuAcc_backend.so}

work=$(mktemp -d /tmp/backplane-ort-compare-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -m 700 "$work/backends"
install -m 755 "$cpu_ref" "$work/backends/Backplane_CpuRef_backend.so"
have_acc=0
if [[ -f $cpu_acc ]]; then
  install -m 755 "$(readlink -f "$cpu_acc")" "$work/backends/Backplane_CpuAcc_backend.so"
  if "$bench_bin" --host-overhead --backends "$work/backends" --prefer CpuAcc,CpuRef \
    --seconds 0.01 >/dev/null 2>"$work/acc_probe.log"; then
    have_acc=1
  else
    echo "CpuAcc: $cpu_acc does not give a CpuAcc backend to a runtime:" >&2
    cat "$work/acc_probe.log" >&2
  fi
fi
if [[ $have_acc == 0 ]]; then
  echo "CpuAcc: missing (no usable $cpu_acc): its columns say \"missing\"" >&2
fi

for tool in node npm /usr/bin/python3; do
  command -v "$tool" >/dev/null || {
    echo "$tool is required (Debian: apt-get install nodejs npm python3-onnx)" >&2
    exit 1
  }
done
/usr/bin/python3 -c "import onnx" 2>/dev/null || {
  echo "/usr/bin/python3 has no onnx module (Debian: apt-get install python3-onnx)" >&2
  exit 1
}

# ONNX Runtime in Node, once per build tree.
ort_dir=$build/bench/ort
if [[ ! -f $ort_dir/node_modules/onnxruntime-node/package.json ]] ||
  ! grep -q "\"version\": \"$ORT_VERSION\"" "$ort_dir/node_modules/onnxruntime-node/package.json"; then
  mkdir -p "$ort_dir"
  [[ -f $ort_dir/package.json ]] || echo '{"name":"backplane-ort-compare","private":true}' >"$ort_dir/package.json"
  (cd "$ort_dir" && ONNXRUNTIME_NODE_INSTALL=skip npm install --no-audit --no-fund --silent \
    "onnxruntime-node@$ORT_VERSION")
fi

models=$build/bench/models
/usr/bin/python3 bench/make_compare_models.py "$models" >/dev/null
mnist=$root/../shared/data/models/mnist/model.onnx

cases=("MLP 784-512-512-10 b1|$models/mlp_b1.onnx"
  "MLP 784-512-512-10 b64|$models/mlp_b64.onnx"
  "LeNet-5-like CNN b1|$models/lenet_b1.onnx"
  "LeNet-5-like CNN b64|$models/lenet_b64.onnx")
if [[ -f $mnist ]]; then
  cases+=("MNIST (real model) b1|$mnist")
else
  echo "MNIST: $mnist is missing: that case is left out" >&2
fi

field() { # field NAME LINE: the value of NAME=... in LINE
  sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"
}

# One Backplane run; prints its output line, or "missing"/"failed".
backplane_run() { # backplane_run MODEL PREFER [OPTION]
  local extra=()
  [[ -n ${3:-} ]] && extra=(--option "$3")
  "$bench_bin" --model "$1" --backends "$work/backends" --prefer "$2" "${extra[@]}" \
    --seconds "$SECONDS_PER_RUN" 2>>"$work/stderr.log" || echo "failed (exit $?)"
}

ratio() { # ratio ORT ACC
  if [[ $2 =~ ^[0-9.]+$ ]]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; else echo "–"; fi
}

round() { # one decimal for a number, anything else as it is
  if [[ $1 =~ ^[0-9.]+$ ]]; then printf '%.1f' "$1"; else echo "$1"; fi
}

echo "# bench/ort_compare.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
ort_backends=$(cd "$ort_dir" && node -e "const o = require('onnxruntime-node');
  console.log(o.listSupportedBackends().map((b) => b.name + (b.bundled ? '' : ' (not installed)')).join(', '))")
echo "# ONNX Runtime $ORT_VERSION (Node $(node --version); binding backends: $ort_backends); CpuAcc: $([[ $have_acc == 1 ]] && echo "$(readlink -f "$cpu_acc")" || echo missing)"
echo
echo "| case | ORT µs | CpuAcc 1 thr µs | ratio | CpuAcc 2 thr µs | ratio | CpuRef µs |"
echo "|---|---|---|---|---|---|---|"
details=()
overheads=()
for entry in "${cases[@]}"; do
  name=${entry%%|*}
  model=${entry#*|}
  ort_out=$(node bench/ort_compare.mjs "$ort_dir" "$SECONDS_PER_RUN" "$models/identity.onnx" "$model")
  identity_us=$(field median_us "$(head -1 <<<"$ort_out")")
  model_line=$(tail -1 <<<"$ort_out")
  ort_us=$(awk -v m="$(field median_us "$model_line")" -v i="$identity_us" 'BEGIN { printf "%.1f", m - i }')
  overheads+=("$identity_us")
  details+=("$name: $model_line (identity $identity_us µs)")
  acc1=missing acc2=missing
  if [[ $have_acc == 1 ]]; then
    line=$(backplane_run "$model" CpuAcc,CpuRef CpuAcc.intra_op_threads=1)
    details+=("$name: $line")
    acc1=$(field median_us "$line")
    acc1=${acc1:-failed}
    line=$(backplane_run "$model" CpuAcc,CpuRef CpuAcc.intra_op_threads=2)
    details+=("$name: $line")
    acc2=$(field median_us "$line")
    acc2=${acc2:-failed}
  fi
  line=$(backplane_run "$model" CpuRef)
  details+=("$name: $line")
  ref=$(field median_us "$line")
  echo "| $name | $ort_us | $(round "$acc1") | $(ratio "$ort_us" "$acc1") | $(round "$acc2") |" \
    "$(ratio "$ort_us" "$acc2") | $(round "${ref:-failed}") |"
done
echo
echo "ORT µs has the Node binding's per-call cost subtracted: median of identity.onnx in the same" \
  "process, per case: ${overheads[*]} µs."
echo
echo "Host overhead (Runtime::Execute on Identity chains; per extra layer = (t[65] - t[1]) / 64):"
"$bench_bin" --host-overhead --backends "$work/backends" --prefer CpuRef --seconds "$SECONDS_PER_RUN"
if [[ $have_acc == 1 ]]; then
  "$bench_bin" --host-overhead --backends "$work/backends" --prefer CpuAcc \
    --option CpuAcc.intra_op_threads=1 --seconds "$SECONDS_PER_RUN" 2>>"$work/stderr.log" ||
    echo "host overhead on CpuAcc: failed (CpuAcc cannot run Identity chains?)"
fi
echo
clients_seconds=$(awk -v s="$SECONDS_PER_RUN" 'BEGIN { print 3 * s }')
echo "Throughput, 2 client threads against 1 (Runtime::Execute back to back; best of 3 alternating rounds of $SECONDS_PER_RUN s):"
if [[ $have_acc == 1 ]]; then
  prefer=CpuAcc,CpuRef option=(--option CpuAcc.intra_op_threads=1)
else
  prefer=CpuRef option=()
  echo "(CpuAcc missing: on CpuRef)"
fi
for model in "$mnist" "$models/mlp_b64.onnx"; do
  [[ -f $model ]] || continue
  "$bench_bin" --model "$model" --backends "$work/backends" --prefer "$prefer" "${option[@]}" \
    --clients 2 --seconds "$clients_seconds" 2>>"$work/stderr.log" || echo "$model: failed"
done
if [[ $have_acc == 1 && -f $mnist ]]; then
  echo "(control: the same on CpuRef, whose requests share nothing; below ~1.8 the cores were busy)"
  "$bench_bin" --model "$mnist" --backends "$work/backends" --prefer CpuRef --clients 2 \
    --seconds "$clients_seconds" 2>>"$work/stderr.log" || echo "$mnist: failed"
fi
echo
echo "Details (median and p90 per call, where each layer ran):"
printf '%s\n' "${details[@]}"
if [[ -s $work/stderr.log ]]; then
  echo
  echo "stderr of the Backplane runs:"
  sort -u "$work/stderr.log"
fi
echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
