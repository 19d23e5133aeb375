# Sourced by the bench scripts: one way to start `backplane serve` and stop it again.
#
# bench_serve LOG BINARY SERVE_ARGS...: starts `BINARY serve SERVE_ARGS...`, its log in LOG, and
# waits until it listens: HTTP, and gRPC too unless SERVE_ARGS hold `--grpc-listen off`. Exits
# the script, printing the log, when the server dies first. Sets served_pid, served_http and
# served_grpc (HOST:PORT each, served_grpc empty without gRPC). Give `--listen 127.0.0.1:0` (and
# `--grpc-listen 127.0.0.1:0`) so that free ports are picked.
#
# bench_stop_servers: stops every server bench_serve started (for the script's EXIT trap).
bench_servers=()

bench_serve() {
  local log=$1 binary=$2
  shift 2
  "$binary" serve "$@" 2>"$log" &
  served_pid=$!
  bench_servers+=("$served_pid")
  local wanted="listening on grpc://"
  [[ " $* " != *" --grpc-listen off "* ]] || wanted="listening on http://"
  for _ in $(seq 1 600); do
    grep -qs "$wanted" "$log" && break
    kill -0 "$served_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  served_http=$(grep -o "listening on http://[0-9.:]*" "$log" | sed 's|listening on http://||')
  served_grpc=$(grep -o "listening on grpc://[0-9.:]*" "$log" | sed 's|listening on grpc://||' || true)
}

bench_stop_servers() {
  local pid
  for pid in "${bench_servers[@]}"; do
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  bench_servers=()
}
