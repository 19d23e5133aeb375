"""Resident memory of `backplane serve` before, during and after a burst (issue 23, item 3).

    python3 bench/body_burst.py partial PID HOST:PORT [--connections 64] [--body-mib 16]
    python3 bench/body_burst.py rst PID HOST:GRPC_PORT [--streams 20000] [--connections 1]

partial: --connections clients each send a header announcing a --body-mib MiB body and all of it
but its last MiB, then wait until the server answers (503 over max_buffered_body_bytes) or closes
(408 at read_timeout_ms). rst: raw HTTP/2 clients open --streams gRPC calls (HEADERS of a
ModelInfer call) and cancel each at once (RST_STREAM), the pattern of the "rapid reset" flood.

Prints one line: `before_mib peak_mib after_mib statuses`, VmRSS of PID (from /proc/PID/status)
before the burst, its highest sample (every 20 ms) during it, and after the last client has gone
and --settle seconds have passed. Standard library only (Debian's python3).
"""

import argparse
import socket
import struct
import threading
import time


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for {pid}")


class Sampler(threading.Thread):
    """Highest VmRSS seen while it runs."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(0.02)


def partial_client(host, port, body_bytes, statuses, index):
    head = (f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {body_bytes}\r\n\r\n").encode()
    chunk = b" " * (1 << 20)
    status = "closed"
    try:
        with socket.create_connection((host, port), timeout=30) as sock:
            sock.sendall(head)
            for _ in range(body_bytes // len(chunk) - 1):  # all but the last MiB
                sock.sendall(chunk)
            answer = sock.recv(64)  # blocks until the 503, the 408, or the close
            if answer.startswith(b"HTTP/1.1 "):
                status = answer[9:12].decode()
    except OSError as error:
        # A refused client may still be sending when the server closes after its drain: the 503
        # then arrives as a reset. Counted apart.
        status = "reset" if isinstance(error, ConnectionResetError) else type(error).__name__
    statuses[index] = status


# ---- HTTP/2, the little of it that opening and cancelling a call needs

def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def literal(name, value):
    # HPACK "literal header field without indexing, new name", no Huffman; lengths < 127.
    return bytes([0, len(name)]) + name + bytes([len(value)]) + value


def rst_client(host, port, streams, statuses, index):
    block = b"".join(literal(n, v) for n, v in [
        (b":method", b"POST"), (b":scheme", b"http"),
        (b":path", b"/inference.GRPCInferenceService/ModelInfer"), (b":authority", host.encode()),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    sock = socket.create_connection((host, port), timeout=30)
    done = threading.Event()
    sending = threading.Lock()  # two threads' sendall would interleave their frames

    def send(data):
        with sending:
            sock.sendall(data)

    def reader():  # acknowledges SETTINGS and PING, discards the rest
        buffer = b""
        try:
            while not done.is_set():
                data = sock.recv(65536)
                if not data:
                    return
                buffer += data
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    kind, flags = buffer[3], buffer[4]
                    payload = buffer[9:9 + length]
                    buffer = buffer[9 + length:]
                    if kind == 4 and not flags & 1:
                        send(frame(4, 1, 0))
                    elif kind == 6 and not flags & 1:
                        send(frame(6, 1, 0, payload))
        except OSError:
            return

    listener = threading.Thread(target=reader, daemon=True)
    listener.start()
    send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
    sent = 0
    try:
        batch = []
        for i in range(streams):
            stream = 2 * i + 1
            batch.append(frame(1, 0x4, stream, block))  # HEADERS, END_HEADERS
            batch.append(frame(3, 0, stream, struct.pack(">I", 8)))  # RST_STREAM CANCEL
            if len(batch) >= 200:
                send(b"".join(batch))
                sent += len(batch) // 2
                batch = []
        send(b"".join(batch))
        sent += len(batch) // 2
        time.sleep(0.5)
        statuses[index] = f"sent{sent}"
    except OSError as error:
        statuses[index] = f"sent{sent}:{type(error).__name__}"
    finally:
        done.set()
        sock.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["partial", "rst"])
    parser.add_argument("pid", type=int)
    parser.add_argument("address")
    parser.add_argument("--connections", type=int)
    parser.add_argument("--body-mib", type=int, default=16)
    parser.add_argument("--streams", type=int, default=20000)
    parser.add_argument("--settle", type=float, default=3.0)
    args = parser.parse_args()
    host, port = args.address.rsplit(":", 1)
    port = int(port)

    before = rss_mib(args.pid)
    sampler = Sampler(args.pid)
    sampler.start()
    if args.mode == "partial":
        count = args.connections or 64
        work = lambda i: partial_client(host, port, args.body_mib << 20, statuses, i)
    else:
        count = args.connections or 1
        work = lambda i: rst_client(host, port, args.streams // count, statuses, i)
    statuses = [None] * count
    clients = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    time.sleep(args.settle)
    sampler.stop.set()
    sampler.join()
    after = rss_mib(args.pid)
    tally = {}
    for status in statuses:
        tally[status] = tally.get(status, 0) + 1
    summary = ",".join(f"{k}x{v}" for k, v in sorted(tally.items()))
    print(f"{before:.0f} {max(sampler.peak, after):.0f} {after:.0f} {summary}")


if __name__ == "__main__":
    main()
