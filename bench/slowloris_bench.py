"""Latency of ordinary requests while slow clients hold connections (the slowloris attack).

    python3 bench/slowloris_bench.py HOST:PORT [--slow 300] [--requests 300]

Opens --slow connections that each send a request line and then one header byte a second,
never finishing, and meanwhile times --requests inference calls on `mlp` over one keep-alive
connection of its own; the same calls are timed first with no slow client, as the control.
Prints p50, p99 and the maximum in milliseconds, and how many calls failed. Standard library
only (Debian's python3).
"""

import argparse
import http.client
import json
import socket
import statistics
import threading
import time

BODY = json.dumps(
    {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)


def time_requests(host, port, count, budget=30.0):
    """Milliseconds of each call, and the number that failed (a call gets 2 s, the whole run
    `budget` seconds: a front end that the slow clients block would take forever)."""
    connection = http.client.HTTPConnection(host, port, timeout=2)
    latencies, failed = [], 0
    until = time.monotonic() + budget
    for _ in range(count):
        if time.monotonic() > until:
            break
        started = time.perf_counter()
        try:
            connection.request("POST", "/v2/models/mlp/infer", BODY,
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                failed += 1
        except (OSError, http.client.HTTPException):
            failed += 1
            connection.close()
            connection = http.client.HTTPConnection(host, port, timeout=2)
        latencies.append((time.perf_counter() - started) * 1000)
        time.sleep(0.005)
    connection.close()
    return latencies, failed


def trickle(host, port, count, stop, opened):
    """Holds `count` connections, each sending one header byte a second, until `stop`."""
    sockets = []
    for _ in range(count):
        s = socket.create_connection((host, port), timeout=2)
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        sockets.append(s)
    opened.set()
    while not stop.wait(1.0):
        for i, s in enumerate(sockets):
            try:
                s.sendall(b"X")
            except OSError:  # timed out by the server (408 and close): come back as a new one
                s.close()
                s = socket.create_connection((host, port), timeout=2)
                s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
                sockets[i] = s
    for s in sockets:
        s.close()


def summary(label, latencies, failed):
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(f"{label:<22} {len(ordered):>8} {statistics.median(ordered):>9.2f} {p99:>9.2f} "
          f"{ordered[-1]:>9.2f} {failed:>7}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--slow", type=int, default=300)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    host, port = args.address.rsplit(":", 1)
    port = int(port)

    print(f"{'':<22} {'requests':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'failed':>7}")
    summary("alone", *time_requests(host, port, args.requests))
    stop, opened = threading.Event(), threading.Event()
    holder = threading.Thread(target=trickle, args=(host, port, args.slow, stop, opened))
    holder.start()
    opened.wait()
    time.sleep(1.0)  # every slow connection has started its header
    summary(f"with {args.slow} slowloris", *time_requests(host, port, args.requests))
    stop.set()
    holder.join()


if __name__ == "__main__":
    main()
