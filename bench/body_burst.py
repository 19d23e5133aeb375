"""Resident memory of `backplane serve` before, during and after a burst (issues 23 and 44).

    python3 bench/body_burst.py partial PID HOST:PORT [--connections 64] [--body-mib 16]
    python3 bench/body_burst.py rst|open PID HOST:GRPC_PORT [--streams 84000] [--connections 8]

partial: --connections clients each send a header announcing a --body-mib MiB body and all of it
but its last MiB, then wait until the server answers (503 over max_buffered_body_bytes) or closes
(408 at read_timeout_ms). rst: raw HTTP/2 clients open --streams gRPC calls (HEADERS of a
ModelInfer call) and cancel each at once (RST_STREAM), the pattern of the "rapid reset" flood
(CVE-2023-44487), all connections at once and as fast as the sockets take them; open: the same
calls opened and never cancelled. Each connection floods once the SETTINGS are exchanged and
stays open --hold seconds after its last frame.

Prints one line: `before_mib peak_mib after_mib statuses`, VmRSS of PID (from /proc/PID/status)
before the burst, its highest sample (every --sample-ms, 100 ms) during it, and after the last
client has gone and --settle seconds have passed; statuses say per connection how many calls
were sent and in how long, what the server answered (REFUSED_STREAM resets, a GOAWAY), and when
the peak was sampled after the burst began. Standard library only (Debian's python3).
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

    def __init__(self, pid, period):
        super().__init__(daemon=True)
        self.pid, self.period, self.peak, self.stop = pid, period, 0.0, threading.Event()
        self.began, self.peak_at = time.monotonic(), 0.0

    def run(self):
        while not self.stop.is_set():
            rss = rss_mib(self.pid)
            if rss > self.peak:
                self.peak, self.peak_at = rss, time.monotonic() - self.began
            time.sleep(self.period)


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


def rst_client(host, port, streams, hold, reset, statuses, index):
    block = b"".join(literal(n, v) for n, v in [
        (b":method", b"POST"), (b":scheme", b"http"),
        (b":path", b"/inference.GRPCInferenceService/ModelInfer"), (b":authority", host.encode()),
        (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    # Built before the connection opens, so that the sockets, not Python, set the pace.
    pairs = [frame(1, 0x4, 2 * i + 1, block) +  # HEADERS, END_HEADERS
             (frame(3, 0, 2 * i + 1, struct.pack(">I", 8)) if reset else b"")  # RST_STREAM CANCEL
             for i in range(streams)]
    chunks = [b"".join(pairs[i:i + 500]) for i in range(0, len(pairs), 500)]
    sock = socket.create_connection((host, port), timeout=30)
    done = threading.Event()
    sending = threading.Lock()  # two threads' sendall would interleave their frames
    seen = {"refused": 0, "goaway": False}
    # The flood starts once both sides' SETTINGS are acknowledged, as a real client's would: a
    # server may refuse streams that arrive before.
    settled = {"theirs": threading.Event(), "ours": threading.Event()}

    def send(data):
        with sending:
            sock.sendall(data)

    def reader():  # acknowledges SETTINGS and PING, counts refusals, discards the rest
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
                        settled["theirs"].set()
                    elif kind == 4:
                        settled["ours"].set()
                    elif kind == 6 and not flags & 1:
                        send(frame(6, 1, 0, payload))
                    elif kind == 3 and payload == struct.pack(">I", 7):  # REFUSED_STREAM
                        seen["refused"] += 1
                    elif kind == 7:
                        seen["goaway"] = True
        except OSError:
            return

    # The preface goes first: gRPC sends its SETTINGS as soon as it accepts, and a reader already
    # running would acknowledge them before the preface, which closes the connection.
    send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
    listener = threading.Thread(target=reader, daemon=True)
    listener.start()
    sent = 0
    try:
        if not (settled["theirs"].wait(10) and settled["ours"].wait(10)):
            raise TimeoutError("no SETTINGS exchange")
        began = time.monotonic()
        for chunk in chunks:
            send(chunk)
            sent += min(500, streams - sent)
        took = time.monotonic() - began
        time.sleep(hold)
        outcome = f"sent{sent}in{took:.1f}s"
    except OSError as error:
        outcome = f"sent{sent}:{type(error).__name__}"
    finally:
        # The reader leaves its recv before the descriptor is closed: a descriptor closed under
        # it is reused by another client's connection, whose frames it would then steal.
        done.set()
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        listener.join()
        sock.close()
    if seen["refused"]:
        outcome += f",refused{seen['refused']}"
    if seen["goaway"]:
        outcome += ",goaway"
    statuses[index] = outcome


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["partial", "rst", "open"])
    parser.add_argument("pid", type=int)
    parser.add_argument("address")
    parser.add_argument("--connections", type=int)
    parser.add_argument("--body-mib", type=int, default=16)
    parser.add_argument("--streams", type=int, default=84000)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--sample-ms", type=int, default=100)
    parser.add_argument("--hold", type=float, default=0.5,
                        help="rst: seconds each connection stays open after its last frame")
    args = parser.parse_args()
    host, port = args.address.rsplit(":", 1)
    port = int(port)

    before = rss_mib(args.pid)
    sampler = Sampler(args.pid, args.sample_ms / 1000.0)
    sampler.start()
    if args.mode == "partial":
        count = args.connections or 64
        work = lambda i: partial_client(host, port, args.body_mib << 20, statuses, i)
    else:
        count = args.connections or 8
        work = lambda i: rst_client(host, port, args.streams // count, args.hold,
                                    args.mode == "rst", statuses, i)
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
    print(f"{before:.0f} {max(sampler.peak, after):.0f} {after:.0f} {summary}"
          f",peak@{sampler.peak_at:.1f}s")


if __name__ == "__main__":
    main()
