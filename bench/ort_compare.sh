#!/usr/bin/env bash
# CpuAcc against ONNX Runtime, side by side in one run: for each case and thread count, ONNX
# Runtime 1.30 (CPU, through its Node binding) and `backplane run` on CpuAcc, alternating, on the
# same input values, outputs checked against each other; then the runtime's own cost per layer and
# the throughput of 2 clients against 1. Prints a markdown table (docs/performance.md, "CpuAcc
# against ONNX Runtime", says what each column means).
#
#   bench/ort_compare.sh                      # builds what it needs first
#   BUILD=0 bench/ort_compare.sh              # use build/release as it is
#   CPU_ACC=/path/Backplane_CpuAcc_backend.so bench/ort_compare.sh   # another CpuAcc build
#   CASES='ResNet|MobileNet' THREADS=1 bench/ort_compare.sh           # a subset (regex on the case)
#   INT8=1 bench/ort_compare.sh               # issue 43's table: int8 QDQ models, and CpuAcc float
#
# SECONDS_PER_RUN (default 2): timed seconds per side, case and thread count, split over ROUNDS
# (default 2) alternating rounds: ORT then CpuAcc, then CpuAcc then ORT (ABBA, so that a load
# that rises or falls during a case weighs on both sides alike). Each side's figure is its best
# round median; every round's median is in the details. THREADS (default "1 2"): the intra-op
# threads, the same on both sides: ORT's intraOpNumThreads, CpuAcc's intra_op_threads.
#
# CpuAcc is build/release/backends/Backplane_CpuAcc_backend.so unless CPU_ACC says otherwise;
# when there is none, the CpuAcc columns say "missing" and everything else still runs (the
# throughput part then runs on CpuRef, and says so).
#
# ONNX Runtime: onnxruntime-node@1.30.0 installed with npm into build/release/bench/ort (once) with
# ONNXRUNTIME_NODE_INSTALL=skip, which only skips downloading the CUDA/TensorRT provider binaries
# (not in the npm package); the CPU binding is in the package itself. bench/ort_compare.mjs runs
# one round: sessions with intraOpNumThreads T, interOpNumThreads 1, sequential execution; 20
# warm-up calls, then calls for the round's seconds (20 to 20000). The binding's per-call cost
# (promise, N-API, tensor objects) is the median of the same call on a 1-element Identity model,
# same process, same session options; it is subtracted:
# "ORT µs" = median(model) - median(identity), per round, identity timed just before and just after
# the model and the smaller median taken (noise only adds to a median).
#
# Backplane: `backplane run MODEL --input X.pb --prefer CpuAcc,CpuRef --option
# CpuAcc.intra_op_threads=T --repeat K --output-dir DIR` (Runtime::Execute on the calling thread:
# admission, arena, input checks, per-request memory and output copies included). K is the round's
# seconds over the median of a 10-run probe, 20 to 20000; the first run of a round (which may
# compile for the input's shape) is one of K and does not move the median. Its placement, printed
# after the runs, gives the placement column and the "why not CpuAcc" lines of the details.
#
# Inputs: bench/make_compare_models.py --input writes each case's input once, as a TensorProto
# for `backplane run` and as raw float32 for Node, from the same array: the same values on both
# sides. Outputs: bench/compare_outputs.py checks Backplane's against ORT's: max |difference| <=
# 1e-4 of the output's range; a failing check marks the row.
#
# INT8=1: the cases are the MLP, ResNet- and MobileNetV2-like models (symbolic batch, at batch 1
# and 8) quantized by scripts/quantize_qdq.py (ORT's static QDQ form: per-channel int8 weights,
# uint8 activations calibrated on 32 samples uniform in [-1, 1), the inputs' distribution), both
# sides running the same int8 file; a third side in every round runs CpuAcc on the float model the
# int8 one came from ("CpuAcc float µs", and "float/int8" its time over CpuAcc's int8 time); the
# output check is issue 43's: every element within one quantization step of ORT's
# (compare_outputs.py --steps).
#
# The models (bench/make_compare_models.py, written to build/release/bench/models; its header
# describes each): MLP and LeNet-like with fixed shapes (batch in the file) and with a symbolic
# batch N at batch 1 and 64; a fixed-shape residual block [2,16,32,32]; ResNet-, MobileNetV2- and
# SqueezeNet-like models with a symbolic batch at batch 1, 4 and 64 (a dynamic batcher's
# largest); the same for ResNet-50-like
# bottleneck blocks, MobileNetV3-like (HardSwish, squeeze-and-excite), Inception-like and
# DenseNet-like models; and the real MNIST model
# (../shared/data/models/mnist/model.onnx, batch 1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=build/release

SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-1 2}
CASES=${CASES:-.}
ORT_VERSION=1.30.0
round_seconds=$(awk -v s="$SECONDS_PER_RUN" -v r="$ROUNDS" 'BEGIN { print s / r }')

if [[ ${BUILD:-1} != 0 ]]; then
  source scripts/deps.sh
  backplane_install_deps
  cmake --preset release >/dev/null
  targets=(backplane backplane_cpu_ref backplane_bench_compare)
  # The CpuAcc target, when this tree has one.
  if ninja -C "$build" -t targets all 2>/dev/null | grep -q '^backplane_cpu_acc:'; then
    targets+=(backplane_cpu_acc)
  fi
  cmake --build --preset release -j2 --target "${targets[@]}" >/dev/null
fi

backplane=$build/bin/backplane
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
# The output check's own rule, on seeded random cases, before it judges anything.
check_self_test=$(/usr/bin/python3 bench/compare_outputs.py --self-test | tr '\n' ' ') || {
  echo "bench/compare_outputs.py's self-test failed: $check_self_test" >&2
  exit 1
}
mnist=$root/../shared/data/models/mnist/model.onnx

# case|model file|batch[|the float model of an int8 one]
if [[ ${INT8:-0} == 1 ]]; then
  cases=()
  for entry in "mlp_n|MLP 784-512-512-10" "resnet_n|ResNet-like" "mobilenetv2_n|MobileNetV2-like"; do
    IFS='|' read -r stem name <<<"$entry"
    [[ -f $models/${stem}_int8.onnx && $models/${stem}_int8.onnx -nt $models/$stem.onnx ]] ||
      /usr/bin/python3 scripts/quantize_qdq.py "$models/$stem.onnx" "$models/${stem}_int8.onnx" \
        --backplane "$backplane" --samples 32 --seed 1 --uniform -1 1 2>>"$work/stderr.log"
    for batch in 1 8; do
      cases+=("$name int8, batch N, b$batch|$models/${stem}_int8.onnx|$batch|$models/$stem.onnx")
    done
  done
else
cases=("MLP 784-512-512-10 b1|$models/mlp_b1.onnx|1"
  "MLP 784-512-512-10 b64|$models/mlp_b64.onnx|64"
  "MLP, batch N, b1|$models/mlp_n.onnx|1"
  "MLP, batch N, b64|$models/mlp_n.onnx|64"
  "LeNet-5-like CNN b1|$models/lenet_b1.onnx|1"
  "LeNet-5-like CNN b64|$models/lenet_b64.onnx|64"
  "LeNet, batch N, b1|$models/lenet_n.onnx|1"
  "LeNet, batch N, b64|$models/lenet_n.onnx|64"
  "residual block [2,16,32,32]|$models/residual_block.onnx|2"
  "ResNet-like, batch N, b1|$models/resnet_n.onnx|1"
  "ResNet-like, batch N, b4|$models/resnet_n.onnx|4"
  "ResNet-like, batch N, b64|$models/resnet_n.onnx|64"
  "MobileNetV2-like, batch N, b1|$models/mobilenetv2_n.onnx|1"
  "MobileNetV2-like, batch N, b4|$models/mobilenetv2_n.onnx|4"
  "MobileNetV2-like, batch N, b64|$models/mobilenetv2_n.onnx|64"
  "SqueezeNet-like, batch N, b1|$models/squeezenet_n.onnx|1"
  "SqueezeNet-like, batch N, b4|$models/squeezenet_n.onnx|4"
  "SqueezeNet-like, batch N, b64|$models/squeezenet_n.onnx|64"
  "ResNet-50-like bottlenecks, batch N, b1|$models/resnet_bottleneck_n.onnx|1"
  "ResNet-50-like bottlenecks, batch N, b4|$models/resnet_bottleneck_n.onnx|4"
  "ResNet-50-like bottlenecks, batch N, b64|$models/resnet_bottleneck_n.onnx|64"
  "MobileNetV3-like, batch N, b1|$models/mobilenetv3_n.onnx|1"
  "MobileNetV3-like, batch N, b4|$models/mobilenetv3_n.onnx|4"
  "MobileNetV3-like, batch N, b64|$models/mobilenetv3_n.onnx|64"
  "Inception-like, batch N, b1|$models/inception_n.onnx|1"
  "Inception-like, batch N, b4|$models/inception_n.onnx|4"
  "Inception-like, batch N, b64|$models/inception_n.onnx|64"
  "DenseNet-like, batch N, b1|$models/densenet_n.onnx|1"
  "DenseNet-like, batch N, b4|$models/densenet_n.onnx|4"
  "DenseNet-like, batch N, b64|$models/densenet_n.onnx|64")
if [[ -f $mnist ]]; then
  cases+=("MNIST (real model) b1|$mnist|1")
else
  echo "MNIST: $mnist is missing: that case is left out" >&2
fi
fi

field() { # field NAME LINE: the value of NAME=... in LINE
  sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"
}

min_of() { # the smallest of the numbers given; "failed" when none is a number
  printf '%s\n' "$@" | awk '/^-?[0-9.]+$/ { if (n++ == 0 || $1 < m) m = $1 } END { if (n) printf "%.1f", m; else print "failed" }'
}

max_of() { # the largest of the numbers given
  printf '%s\n' "$@" | awk '/^-?[0-9.]+$/ { if (n++ == 0 || $1 > m) m = $1 } END { if (n) printf "%.1f", m; else print "failed" }'
}

ratio() { # ratio ORT ACC
  if [[ $1 =~ ^-?[0-9.]+$ && $2 =~ ^[0-9.]+$ ]]; then
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
  else
    echo "–"
  fi
}

# One ORT round; sets ort_us (model - identity) and appends its lines to the details.
ort_round() { # ort_round MODEL STEM THREADS OUT_DIR
  local out
  if ! out=$(node bench/ort_compare.mjs "$ort_dir" "$round_seconds" "$3" "$models/identity.onnx" \
    "$1" "$2" "$4" 2>>"$work/stderr.log"); then
    ort_us=failed
    return
  fi
  local identity model
  identity=$(min_of "$(field median_us "$(sed -n 1p <<<"$out")")" \
    "$(field median_us "$(sed -n 3p <<<"$out")")")
  model=$(field median_us "$(sed -n 2p <<<"$out")")
  ort_us=$(awk -v m="$model" -v i="$identity" 'BEGIN { printf "%.1f", m - i }')
  overheads+=("$identity")
  details+=("  ort: $(sed -n 2p <<<"$out" | sed "s|$root/||") identity_median_us=$identity → $ort_us µs")
}

# A probe of 10 runs; sets probe_repeat to how many runs fill a round (20 to 20000), 0 when the
# probe failed (its first line goes to the details).
probe() { # probe MODEL STEM THREADS OUT_DIR
  acc_round "$1" "$2" "$3" 10 "$4"
  if [[ $acc_us == failed ]]; then
    details+=("  backplane run failed: $(grep -m1 'backplane' <<<"$acc_out" || tail -1 <<<"$acc_out")")
    probe_repeat=0
    return
  fi
  probe_repeat=$(awk -v s="$round_seconds" -v m="$acc_us" \
    'BEGIN { k = int(s * 1e6 / (m > 0 ? m : 1)); print k < 20 ? 20 : (k > 20000 ? 20000 : k) }')
}

# One Backplane round; sets acc_us and acc_out (its whole output).
acc_round() { # acc_round MODEL STEM THREADS REPEAT OUT_DIR
  if acc_out=$("$backplane" run "$1" --input "$2.pb" --backends "$work/backends" \
    --prefer CpuAcc,CpuRef --option "CpuAcc.intra_op_threads=$3" --repeat "$4" \
    --output-dir "$5" 2>&1); then
    acc_us=$(sed -n 's/^time per run: median \([0-9.]*\) µs.*/\1/p' <<<"$acc_out")
  else
    acc_us=failed
  fi
  [[ -n $acc_us ]] || acc_us=failed
}

# "on CpuAcc/total, compiled" from `backplane run`'s placement lines; for a symbolic-batch model,
# the layers its shape program compiled at the request's shape ("shape program [..]: N layers
# compiled"), said as "N compiled at the request's shape".
placement_of() {
  awk '/^layer / { total++; if ($0 ~ / on CpuAcc/) { acc++; if ($0 ~ / on CpuAcc[^[]*\[/) compiled++ } }
       /^shape program \[/ && match($0, /: [0-9]+ layers compiled/) { per_shape = substr($0, RSTART + 2, RLENGTH - 18) }
       END { if (per_shape != "") printf "%d/%d on CpuAcc, %d compiled at the request'"'"'s shape", acc, total, per_shape
             else printf "%d/%d on CpuAcc, %d compiled", acc, total, compiled }' <<<"$1"
}

# The "why not" lines of `backplane run`'s placement, one per reason (a trailing "(node '...')"
# left out, so that one missing operator is one line), with how many layers gave it and the first
# three of them.
why_not_of() {
  awk '/^layer / { layer = $2 " (" $3 ")" }
       /^  why not / { sub(/^  why not /, ""); sub(/ \(node [^)]*\)$/, "")
                       if (n[$0]++ < 3) names[$0] = names[$0] (n[$0] > 1 ? ", " : "") layer }
       END { for (r in n) printf "  %d layer(s) not on the first backend asked, e.g. %s: why not %s\n", n[r], names[r], r }' <<<"$1"
}

echo "# bench/ort_compare.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
ort_backends=$(cd "$ort_dir" && node -e "const o = require('onnxruntime-node');
  console.log(o.listSupportedBackends().map((b) => b.name + (b.bundled ? '' : ' (not installed)')).join(', '))")
echo "# ONNX Runtime $ORT_VERSION (Node $(node --version); binding backends: $ort_backends); CpuAcc: $([[ $have_acc == 1 ]] && echo "$(readlink -f "$cpu_acc")" || echo missing)"
echo "# $SECONDS_PER_RUN s per side and row in $ROUNDS alternating rounds (ABBA); each side: its best round median; output check: $check_self_test"
echo
if [[ ${INT8:-0} == 1 ]]; then
  echo "| case | threads | ORT int8 µs | CpuAcc int8 µs | ratio | CpuAcc float µs | float/int8 | max error (steps) | CpuAcc placement |"
  echo "|---|---|---|---|---|---|---|---|---|"
else
  echo "| case | threads | ORT µs | CpuAcc µs | ratio | max error / range | CpuAcc placement |"
  echo "|---|---|---|---|---|---|---|"
fi
details=()
overheads=()
failed_checks=0
for entry in "${cases[@]}"; do
  IFS='|' read -r name model batch float_model <<<"$entry"
  [[ $name =~ $CASES ]] || continue
  stem=$work/inputs/$(basename "$model" .onnx)_b$batch
  /usr/bin/python3 bench/make_compare_models.py --input "$model" "$batch" "$stem"
  for threads in $THREADS; do
    details+=("$name, $threads thread(s):")
    ort_dir_out=$work/out/ort acc_dir_out=$work/out/acc
    rm -rf "$ort_dir_out" "$acc_dir_out"
    ort_times=() acc_times=() float_times=() acc_us=missing acc_out="" model_out=""
    repeat=0 float_repeat=0
    if [[ $have_acc == 1 ]]; then
      probe "$model" "$stem" "$threads" "$acc_dir_out"
      repeat=$probe_repeat
      if [[ -n $float_model ]]; then
        probe "$float_model" "$stem" "$threads" "$work/out/float"
        float_repeat=$probe_repeat
      fi
    fi
    for ((round = 1; round <= ROUNDS; ++round)); do
      # ABBA: ORT first in odd rounds, CpuAcc first in even ones (ABCCBA with a float side).
      for side in $( ((round % 2)) && echo "ort acc float" || echo "float acc ort"); do
        if [[ $side == ort ]]; then
          ort_round "$model" "$stem" "$threads" "$ort_dir_out"
          ort_times+=("$ort_us")
        elif [[ $side == acc ]] && ((repeat > 0)); then
          acc_round "$model" "$stem" "$threads" "$repeat" "$acc_dir_out"
          acc_times+=("$acc_us")
          model_out=$acc_out
          details+=("  backplane: $(grep '^time per run' <<<"$acc_out" || echo "failed: $(tail -1 <<<"$acc_out")")")
        elif [[ $side == float ]] && ((float_repeat > 0)); then
          acc_round "$float_model" "$stem" "$threads" "$float_repeat" "$work/out/float"
          float_times+=("$acc_us")
          details+=("  backplane, float model: $(grep '^time per run' <<<"$acc_out" || echo "failed: $(tail -1 <<<"$acc_out")")")
        fi
      done
    done
    acc_out=$model_out
    ort_best=$(min_of "${ort_times[@]}")
    acc_best=missing placement=missing check="–"
    if [[ $have_acc == 1 ]]; then
      acc_best=$(min_of "${acc_times[@]}")
      if [[ $acc_best == failed ]]; then
        placement="load/run failed (details)"
      else
        placement=$(placement_of "$acc_out")
        while IFS= read -r why; do details+=("$why"); done < <(why_not_of "$acc_out")
        if [[ $ort_best == failed ]]; then
          check="no ORT output"
        elif check_field=$([[ -n $float_model ]] && echo steps || echo relative_error)
          check_line=$(/usr/bin/python3 bench/compare_outputs.py "$ort_dir_out" "$acc_dir_out" \
          ${float_model:+--steps "$model"}); then
          check="$(field "$check_field" "$check_line") ✓"
        else
          check="**FAIL** $(field "$check_field" "$check_line")$(field problem "$check_line")"
          failed_checks=$((failed_checks + 1))
        fi
        details+=("  check: $check_line")
      fi
    fi
    row_ratio=$(ratio "$ort_best" "$acc_best")
    [[ $check == \*\*FAIL* ]] && row_ratio="$row_ratio (wrong output)"
    if [[ -n $float_model ]]; then
      float_best=$(min_of "${float_times[@]}")
      echo "| $name | $threads | $ort_best | $acc_best | $row_ratio | $float_best | $(ratio "$float_best" "$acc_best") | $check | $placement |"
    else
      echo "| $name | $threads | $ort_best | $acc_best | $row_ratio | $check | $placement |"
    fi
  done
done
echo
if ((${#overheads[@]} > 0)); then
  echo "ORT µs has the Node binding's per-call cost subtracted: in every round, the median" \
    "session.run of identity.onnx (1 element in, 1 out) in the same process with the same session" \
    "options, the smaller of its medians just before and just after the model: $(min_of "${overheads[@]}")–$(max_of "${overheads[@]}") µs here. Not subtracted: copying a larger input into the binding's" \
    "tensor and the output out of it, which the Backplane side pays too (its output copy)."
fi
((failed_checks == 0)) || echo "**$failed_checks row(s) FAIL the output check** (max |CpuAcc - ORT| > 1e-4 of the output's range)."
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
echo "Details per row (each round's medians and p90s; ORT's threads_added: threads its session added, 0 = no pool of its own; why a layer is not on CpuAcc; the output check):"
printf '%s\n' "${details[@]}"
if [[ -s $work/stderr.log ]]; then
  echo
  echo "stderr:"
  sort -u "$work/stderr.log"
fi
echo
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
