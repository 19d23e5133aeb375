#!/usr/bin/env bash
# Resident memory of `backplane serve` under bursts (issue 23, item 3; issue 44, item 5), by
# bench/body_burst.py:
#
#   partial  64 clients each announce a 16 MiB body and send all of it but the last MiB, then
#            wait for the answer (503 over max_buffered_body_bytes) or the close (408).
#   rst      the HTTP/2 "rapid reset" flood (CVE-2023-44487): 84,000 gRPC calls opened and
#            cancelled at once (HEADERS + RST_STREAM) on 8 connections, sent as fast as the
#            sockets take them.
#   open     the same 84,000 calls opened (HEADERS) and left open, never cancelled.
#
# Each run starts a fresh server on the embedded default (example models, build's backends) and
# prints VmRSS before the burst, its peak during it (sampled every 100 ms; and when, after the
# burst began) and after it (SETTLE seconds after the last client: 3, and 30 for rst, whose
# memory the server works off for several seconds); the last line per binary and burst is the
# median of RUNS runs, in MiB.
#
#   bench/body_burst.sh                               # build/release/bin/backplane
#   OLD_BACKPLANE=/work/main/build/release/bin/backplane bench/body_burst.sh   # side by side
#   RUNS=5 BURSTS=rst bench/body_burst.sh
#
# Needs the release build (cmake --build --preset release --target backplane) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
NEW=${BACKPLANE:-build/release/bin/backplane}
RUNS=${RUNS:-3}
BURSTS=${BURSTS:-partial rst open}
PORT=${PORT:-18500}
PYTHON=${PYTHON:-/usr/bin/python3}

# One run: prints "before peak after statuses", or nothing when a client could not start its
# flood (a connection closed by the server during it is what the "open" burst should see).
run_once() {
  local binary=$1 burst=$2 log pid address line settle
  log=$(mktemp)
  "$binary" serve --listen "127.0.0.1:$PORT" --grpc-listen "127.0.0.1:$((PORT + 1))" \
    --log-level warn >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    grep -q "listening on grpc://" "$log" && break
    sleep 0.1
  done
  # A few inferences first: the before figure is of a server that has served.
  for _ in 1 2 3; do
    curl -s -X POST -d '{"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}' \
      "http://127.0.0.1:$PORT/v2/models/mlp/infer" >/dev/null
  done
  sleep 0.5
  address="127.0.0.1:$PORT"
  settle=3
  [[ $burst != partial ]] && address="127.0.0.1:$((PORT + 1))"
  [[ $burst == rst ]] && settle=${SETTLE:-30}
  line=$("$PYTHON" bench/body_burst.py "$burst" "$pid" "$address" --settle "$settle" || true)
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$log"
  [[ $burst != partial && $line == *TimeoutError* ]] && return 0  # no SETTINGS exchange
  echo "$line"
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

for burst in $BURSTS; do
  for binary in ${OLD_BACKPLANE:-} "$NEW"; do
    results=()
    for attempt in $(seq $((RUNS * 3))); do
      (( ${#results[@]} >= RUNS )) && break
      line=$(run_once "$binary" "$burst")
      [[ -n $line ]] || continue
      echo "  $burst $binary: $line"
      results+=("$line")
    done
    printf '%s\n' "${results[@]}" > /tmp/body_burst.$$
    echo "$burst $binary median MiB: before $(cut -d' ' -f1 /tmp/body_burst.$$ | median)" \
      "peak $(cut -d' ' -f2 /tmp/body_burst.$$ | median)" \
      "after $(cut -d' ' -f3 /tmp/body_burst.$$ | median) (${#results[@]} runs)"
    rm -f /tmp/body_burst.$$
  done
done
