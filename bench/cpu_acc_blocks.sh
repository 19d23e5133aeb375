#!/bin/sh
# CpuAcc on the block models of bench/make_cpu_acc_block_models.py (ResNet-, MobileNetV2- and
# SqueezeNet-style, batch 1 and 4): Runtime::Execute medians side by side in one run, at
# intra_op_threads 1 and 2, for this build's CpuAcc and, when BASE_BACKENDS names another build's
# backend directory (e.g. main's), for that one too. Each model runs its configurations one after
# the other, ROUNDS times alternating, and the best median of the rounds is printed per
# configuration, so that all columns of a row saw the same machine.
#
#   bench/cpu_acc_blocks.sh                          # build/release as it is
#   BASE_BACKENDS=/work/main/build/release/backends ROUNDS=3 SECONDS_PER_RUN=1 bench/cpu_acc_blocks.sh
set -eu
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build/release}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-1}
MODELS=$BUILD_DIR/bench/block_models
BENCH=$BUILD_DIR/bin/backplane_bench_compare
/usr/bin/python3 bench/make_cpu_acc_block_models.py "$MODELS"

configs="new:$BUILD_DIR/backends"
if [ -n "${BASE_BACKENDS:-}" ]; then
  configs="base:$BASE_BACKENDS $configs"
fi

# Prints "median placement" of one run.
run() {
  "$BENCH" --model "$1" --backends "$2" --prefer CpuAcc,CpuRef --seconds "$SECONDS_PER_RUN" \
    --option "CpuAcc.intra_op_threads=$3" 2>/dev/null |
    sed -n 's/.*placement=\([^ ]*\).*median_us=\([0-9.]*\).*/\2 \1/p'
}

printf '%-14s' model
for config in $configs; do
  printf ' %24s %24s' "${config%%:*} 1 thr us" "${config%%:*} 2 thr us"
done
printf '\n'
for model in resnet_b1 resnet_b4 mobilenet_b1 mobilenet_b4 squeezenet_b1 squeezenet_b4; do
  results=""
  round=0
  while [ "$round" -lt "$ROUNDS" ]; do
    for config in $configs; do
      for threads in 1 2; do
        key="${config%%:*}_$threads"
        line=$(run "$MODELS/$model.onnx" "${config#*:}" "$threads")
        results="$results
$key $line"
      done
    done
    round=$((round + 1))
  done
  printf '%-14s' "$model"
  for config in $configs; do
    for threads in 1 2; do
      key="${config%%:*}_$threads"
      best=$(printf '%s\n' "$results" | awk -v k="$key" '$1 == k { print $2, $3 }' | sort -n | head -1)
      printf ' %24s' "$(printf '%s' "$best" | awk '{ printf "%.1f (%s)", $1, $2 }')"
    done
  done
  printf '\n'
done
