#!/usr/bin/env bash
# Thread-count options within what the machine can run (issue 44, item 4), against a real
# `backplane serve` with MNIST on CpuAcc:
#
#   1. PUT intra_op_threads 1024: refused (400) with the bound; the server's thread count.
#   2. intra_op_threads = the usable CPUs, CLIENTS concurrent clients for REQUESTS requests each:
#      thread count and p50.
#   3. intra_op_threads 1, the same load again: thread count (the surplus workers released) and
#      p50.
#   4. Under a cgroup pids limit that leaves no thread to create (only as root with a writable
#      cgroup pids hierarchy): with the usable CPUs again, requests answer 503 naming the limit
#      and the server stays up; with room again, 200.
#
#   bench/thread_options.sh                     # build/release/bin/backplane
#   BACKPLANE=/path/to/backplane CLIENTS=8 bench/thread_options.sh
# Needs the release build (cmake --build --preset release --target backplane) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
BINARY=${BACKPLANE:-build/release/bin/backplane}
CLIENTS=${CLIENTS:-4}
REQUESTS=${REQUESTS:-300}
PORT=${PORT:-$((20000 + $$ % 20000))}
PYTHON=${PYTHON:-/usr/bin/python3}
MNIST=${MNIST:-../shared/data/models/mnist/model.onnx}

work=$(mktemp -d)
group=""
cleanup() {
  [[ -n ${pid:-} ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  [[ -n $group ]] && rmdir "$group" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/models/mnist/1"
cp "$MNIST" "$work/models/mnist/1/model.onnx"
echo '{"backends": ["CpuAcc", "CpuRef"]}' >"$work/models/mnist/config.json"
"$BINARY" serve --models "$work/models" --backends build/release/backends \
  --listen "127.0.0.1:$PORT" --grpc-listen off --log-level warn >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/log"; exit 1; }
  sleep 0.1
done

threads() { ls "/proc/$pid/task" | wc -l; }
settled_threads() {  # once three samples 50 ms apart agree
  local last now same=0
  last=$(threads)
  while ((same < 3)); do
    sleep 0.05
    now=$(threads)
    if [[ $now == "$last" ]]; then same=$((same + 1)); else same=0; last=$now; fi
  done
  echo "$last"
}
put_threads() {
  curl -s -o "$work/put" -w '%{http_code}' -X PUT -H 'Content-Type: application/json' \
    -d "{\"intra_op_threads\": $1}" "http://127.0.0.1:$PORT/v2/backends/CpuAcc/options"
}
# CLIENTS clients, REQUESTS each: "p50_ms statuses"
load() {
  "$PYTHON" - "$PORT" "$CLIENTS" "$REQUESTS" <<'PY'
import json, sys, threading, time, urllib.request, urllib.error, collections
port, clients, requests = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
body = json.dumps({"inputs": [{"name": "Input3", "shape": [1, 1, 28, 28], "datatype": "FP32",
                               "data": [0.5] * 784}]}).encode()
url = f"http://127.0.0.1:{port}/v2/models/mnist/infer"
times, statuses, first_error, lock = [], collections.Counter(), [], threading.Lock()
def client():
    for _ in range(requests):
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body), timeout=30) as r:
                r.read(); status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
            with lock:
                if not first_error: first_error.append(e.read().decode()[:300])
        except Exception as e:
            status = type(e).__name__
        elapsed = time.perf_counter() - start
        with lock:
            statuses[status] += 1
            if status == 200: times.append(elapsed)
threads = [threading.Thread(target=client) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
times.sort()
p50 = f"{times[len(times) // 2] * 1000:.2f}" if times else "-"
print(p50, dict(statuses), first_error[0] if first_error else "")
PY
}

cpus=$("$PYTHON" -c 'import os; print(len(os.sched_getaffinity(0)))')
echo "usable CPUs (affinity): $cpus; clients: $CLIENTS x $REQUESTS requests"
echo "idle server: $(settled_threads) threads"
code=$(put_threads 1024)
echo "PUT intra_op_threads 1024: $code $(cat "$work/put")"
read -r p50 rest < <(load)
echo "intra_op_threads 1: p50 $p50 ms $rest; $(settled_threads) threads"
code=$(put_threads "$cpus")
read -r p50 rest < <(load)
echo "intra_op_threads $cpus (PUT $code): p50 $p50 ms $rest; $(settled_threads) threads"
code=$(put_threads 1)
read -r p50 rest < <(load)
echo "intra_op_threads 1 again (PUT $code): p50 $p50 ms $rest; $(settled_threads) threads"

# 4: a pids limit with no room (cgroup v2 at /sys/fs/cgroup, or v1's pids hierarchy).
for hierarchy in /sys/fs/cgroup /sys/fs/cgroup/pids; do
  [[ -w $hierarchy/cgroup.procs ]] || continue
  candidate=$hierarchy/backplane-thread-options-$$
  mkdir "$candidate" 2>/dev/null || continue
  if [[ -e $candidate/pids.max ]]; then group=$candidate; break; fi
  rmdir "$candidate"
done
if [[ -z $group ]]; then
  echo "no writable cgroup pids hierarchy: pids-limit case skipped"
  exit 0
fi
echo "$pid" >"$group/cgroup.procs"
code=$(put_threads "$cpus")  # compiled while there is room
echo "max" >"$group/pids.max"
cat "$group/pids.current" >"$group/pids.max"
read -r p50 rest < <(load)
echo "intra_op_threads $cpus under pids.max $(cat "$group/pids.max") (PUT $code): $rest"
kill -0 "$pid" && echo "server alive: $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v2/health/live")"
echo "max" >"$group/pids.max"
read -r p50 rest < <(load)
echo "pids.max max again: p50 $p50 ms $rest; $(settled_threads) threads"
