#!/usr/bin/env python3
"""What txbox's proxy adds per connection, per exchange and per MB (issue #15), against the host's
network: interleaved A/B of any number of variants, each `NAME=TXBOX:host` (`--network host`)
or `NAME=TXBOX:proxy` (`--allow-host 127.0.0.1:PORT`, through the proxy).

    bench/netproxy_relay.py [--rounds 5] [--n 100] [--sizes 1024,204800,1048576] \\
        host=target/release/txbox:host old=/tmp/txbox-main:proxy new=target/release/txbox:proxy

A stand-in origin on loopback (keep-alive HTTP/1.1, `GET /N` answers N bytes) serves a client
that runs inside `txbox run`: it opens connections (through the proxy: a CONNECT tunnel each),
times N sequential GETs of each size on one of them (TCP_NODELAY on, as curl, cargo and Go
do), then N/10 more of 1 KiB on a fresh connection with each request in two writes and Nagle
on behind the proxy only (as urllib3 does, and so pip and requests). The client also counts
its network namespace's delayed acknowledgements (through the proxy: the sandbox's own
namespace, so only its connections to the proxy). Prints the medians over rounds of each
run's medians, in µs, and the load average.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading

CLIENT = r'''
import json, os, socket, statistics, sys, time
port, n, sizes = int(sys.argv[1]), int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
proxy = os.environ.get("HTTPS_PROXY")

def delayed_acks():
    names, values = [l.split() for l in open("/proc/self/net/netstat").read().splitlines()[:2]]
    return int(values[names.index("DelayedACKs")])

def response(s, buf):
    while b"\r\n\r\n" not in buf:
        d = s.recv(262144)
        if not d:
            raise EOFError
        buf += d
    head, buf = buf.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(buf) < length:
        d = s.recv(262144)
        if not d:
            raise EOFError
        buf += d
    return buf[length:]

def connect(nodelay=True):
    t = time.perf_counter()
    if proxy:
        s = socket.create_connection(("127.0.0.1", int(proxy.rsplit(":", 1)[1])))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % port)
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
    else:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))
    return s, (time.perf_counter() - t) * 1e6

out = {}
conns = [connect() for _ in range(max(n // 10, 5))]
out["connect"] = [dt for _, dt in conns]
s = conns[0][0]
for size in sizes:
    req, buf, ts = b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % size, b"", []
    for _ in range(n):
        t = time.perf_counter()
        s.sendall(req)
        buf = response(s, buf)
        ts.append((time.perf_counter() - t) * 1e6)
    out[str(size)] = ts
s, _ = connect(nodelay=not proxy)
before, buf, ts = delayed_acks(), b"", []
for _ in range(max(n // 10, 5)):
    t = time.perf_counter()
    s.sendall(b"GET /1024 HTTP/1.1\r\n")
    s.sendall(b"Host: x\r\n\r\n")
    buf = response(s, buf)
    ts.append((time.perf_counter() - t) * 1e6)
out["split"] = ts
out = {k: statistics.median(v) for k, v in out.items()}
out["delayed-acks"] = delayed_acks() - before
print(json.dumps(out))
'''


def origin():
    """A keep-alive HTTP/1.1 server on loopback: GET /N answers N bytes. Returns its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)

    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf, bodies = b"", {}
        while True:
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    c.close()
                    return
                buf += d
            head, buf = buf.split(b"\r\n\r\n", 1)
            size = int(head.split(b" ")[1].rsplit(b"/", 1)[1])
            if size not in bodies:
                bodies[size] = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
            c.sendall(bodies[size])

    def accept():
        while True:
            c, _ = listener.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=100, help="exchanges per size per run")
    ap.add_argument("--sizes", default="1024,204800,1048576")
    ap.add_argument("--python", default=None, help="the Python the client runs on (default: python3's own)")
    ap.add_argument("variants", nargs="+", help="NAME=TXBOX:host|proxy")
    args = ap.parse_args()
    python = args.python or subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                                           capture_output=True, text=True, check=True).stdout.strip()
    port = origin()
    root = tempfile.mkdtemp(prefix="txbox-bench-relay-", dir="/var/tmp")
    variants = []
    for v in args.variants:
        name, spec = v.split("=", 1)
        txbox, net = spec.rsplit(":", 1)
        ws, state = os.path.join(root, name, "ws"), os.path.join(root, name, "state")
        os.makedirs(ws)
        os.makedirs(state)
        with open(os.path.join(ws, "client.py"), "w") as f:
            f.write(CLIENT)
        netargs = ["--network", "host"] if net == "host" else ["--allow-host", f"127.0.0.1:{port}"]
        cmd = [os.path.abspath(txbox), "--state-dir", state, "--json", "run", "-C", ws] + netargs + \
            ["--", python, "client.py", str(port), str(args.n), args.sizes]
        variants.append((name, cmd, []))

    def once(cmd):
        p = subprocess.run(cmd, capture_output=True, text=True)
        r = json.loads(p.stdout)
        if r["outcome"] != "committed":
            sys.exit(f"{cmd}: {r['outcome']}: {r['stderr'][-2000:]}")
        return json.loads(r["stdout"])

    for _, cmd, _ in variants:
        once(cmd)  # warm-up
    loads = [os.getloadavg()[0]]
    for i in range(args.rounds):
        k = i % len(variants)
        order = variants[k:] + variants[:k]
        for _, cmd, results in (order if i % 2 == 0 else order[::-1]):
            results.append(once(cmd))
        loads.append(os.getloadavg()[0])
    keys = list(variants[0][2][0].keys())
    print(f"{args.rounds} interleaved rounds, {args.n} exchanges per size; load average (1 min) "
          f"{min(loads):.2f}-{max(loads):.2f}; medians in µs (delayed-acks: a count)")
    print(f"{'variant':<12}" + "".join(f"{k:>14}" for k in keys))
    for name, _, results in variants:
        print(f"{name:<12}" + "".join(f"{statistics.median(r[k] for r in results):>14.1f}" for k in keys))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
