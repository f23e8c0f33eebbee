#!/usr/bin/env python3
"""A stand-in for a caller's own (corporate) HTTP proxy, for tests/network.rs: CONNECT tunnels
and absolute-form plain HTTP, every request line appended to LOG. Whatever host a request names
goes to TARGET (host:port): the upstream, not txbox, resolves names, so names that exist nowhere
else work through it. Prints its port on stdout once listening.

    standin_upstream.py LOG TARGET
"""
import socket
import sys
import threading

LOG, TARGET = sys.argv[1], sys.argv[2]
THOST, TPORT = TARGET.rsplit(":", 1)
lock = threading.Lock()


def log(line):
    with lock:
        with open(LOG, "a") as f:
            f.write(line + "\n")


def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def handle(c):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = c.recv(65536)
        if not chunk:
            c.close()
            return
        head += chunk
    head, rest = head.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    log(lines[0])
    method, target, version = lines[0].split(" ", 2)
    up = socket.create_connection((THOST, int(TPORT)))
    if method == "CONNECT":
        c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if rest:
            up.sendall(rest)
    else:
        path = "/" + target.split("://", 1)[1].split("/", 1)[1] if "://" in target else target
        fields = [l for l in lines[1:] if not l.lower().startswith("proxy-")]
        up.sendall(("\r\n".join([f"{method} {path} {version}"] + fields) + "\r\n\r\n").encode("latin-1") + rest)
    t = threading.Thread(target=pump, args=(up, c), daemon=True)
    t.start()
    pump(c, up)
    t.join()
    c.close()
    up.close()


s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
while True:
    conn, _ = s.accept()
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
