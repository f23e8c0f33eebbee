# The escape suite's unix-socket client (crates/txbox/tests/escapes.rs): run inside the sandbox
# (and natively, to show each attempt works where nothing stops it). argv[1] is JSON:
# {"hosts": {name: path}, "dgrams": {name: path}, "other": [paths]}. Prints one JSON object:
# {attempt: "OK <banner>" | "REFUSED <errno>"}. A host server answers "HOST" on accept.
import ctypes
import json
import os
import shutil
import socket
import sys
import tempfile
import threading

cfg = json.loads(sys.argv[1])
out = {}
libc = ctypes.CDLL(None, use_errno=True)


def attempt(name, fn):
    try:
        out[name] = "OK " + (fn() or "")
    except OSError as e:
        out[name] = "REFUSED %d" % (e.errno or 0)
    except Exception as e:  # noqa: BLE001 - report, never crash the suite
        out[name] = "ERROR %r" % (e,)


def banner(s):
    s.settimeout(5)
    try:
        return s.recv(16).decode(errors="replace")
    except OSError:
        return ""


def connector(path, kind):
    def go():
        c = socket.socket(socket.AF_UNIX, kind)
        c.settimeout(5)
        c.connect(path)
        return banner(c) if kind != socket.SOCK_DGRAM else "connected"

    return go


def kind_of(name):
    if "seqpacket" in name:
        return socket.SOCK_SEQPACKET
    if "dgram" in name:
        return socket.SOCK_DGRAM
    return socket.SOCK_STREAM


cwd = os.getcwd()
for name, path in cfg["hosts"].items():
    k = kind_of(name)
    attempt(name + ":absolute", connector(path, k))
    attempt(name + ":relative", connector(os.path.relpath(path, cwd), k))
    link = "link-%s.sock" % name
    try:
        os.symlink(path, link)
    except FileExistsError:
        pass
    attempt(name + ":symlink-in-workspace", connector(link, k))
    attempt(name + ":proc-self-root", connector("/proc/self/root" + path, k))
    attempt(name + ":proc-thread-self-root", connector("/proc/thread-self/root" + path, k))
    attempt(name + ":proc-self-cwd", connector("/proc/self/cwd/" + os.path.relpath(path, cwd), k))
    attempt(name + ":proc-1-root", connector("/proc/1/root" + path, k))

    def opath(path=path, k=k):
        fd = os.open(path, os.O_PATH)
        return connector("/proc/self/fd/%d" % fd, k)()

    attempt(name + ":o-path-fd", opath)

for name, path in cfg["dgrams"].items():
    def unconnected(path=path):
        d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        d.sendto(b"ESCAPED-sendto", path)

    def by_sendmsg(path=path):
        d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        d.sendmsg([b"ESCAPED-sendmsg"], [], 0, path)

    def on_socketpair(path=path):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.sendto(b"ESCAPED-pair", path)

    def on_socketpair_sendmsg(path=path):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.sendmsg([b"ESCAPED-pair-msg"], [], 0, path)

    def by_sendmmsg(path=path):
        # Two messages, the second to the host: no socket module wrapper, so libc directly.
        d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

        class Iov(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

        class Msg(ctypes.Structure):
            _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.c_void_p),
                        ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                        ("flags", ctypes.c_int), ("len", ctypes.c_uint32)]

        data = ctypes.create_string_buffer(b"ESCAPED-mmsg")
        iov = Iov(ctypes.cast(data, ctypes.c_void_p), 12)
        addr = ctypes.create_string_buffer(socket.AF_UNIX.to_bytes(2, sys.byteorder) + path.encode() + b"\0")
        msgs = (Msg * 2)()
        for m in msgs:
            m.name = ctypes.cast(addr, ctypes.c_void_p)
            m.namelen = len(addr.raw)
            m.iov = ctypes.addressof(iov)
            m.iovlen = 1
        n = libc.sendmmsg(d.fileno(), msgs, 2, 0)
        if n < 0:
            raise OSError(ctypes.get_errno(), "sendmmsg")
        return "sent %d" % n

    attempt(name + ":sendto-unconnected", unconnected)
    attempt(name + ":sendmsg-unconnected", by_sendmsg)
    attempt(name + ":sendto-socketpair", on_socketpair)
    attempt(name + ":sendmsg-socketpair", on_socketpair_sendmsg)
    attempt(name + ":sendmmsg", by_sendmmsg)

for i, path in enumerate(cfg.get("other", [])):
    attempt("other-warm-server-%d" % i, connector(path, socket.SOCK_STREAM))


# Servers the command makes itself: in /tmp, in the workspace, abstract.
def serve(s, answer):
    def loop():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            try:
                c.send(answer)
            except OSError:
                pass
            c.close()

    threading.Thread(target=loop, daemon=True).start()


def own_stream(path, kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_UNIX, kind)
    s.bind(path)
    s.listen(64)
    serve(s, b"OWN")


tmp = tempfile.mkdtemp(prefix="txbox-own-", dir="/tmp")
own_stream(tmp + "/own-stream.sock")
own_stream("own-ws-stream.sock")
own_stream("own-ws-seqpacket.sock", socket.SOCK_SEQPACKET)
own_stream("\0txbox-own-abstract-%d" % os.getpid())
attempt("own:tmp-stream", connector(tmp + "/own-stream.sock", socket.SOCK_STREAM))
attempt("own:workspace-stream", connector("own-ws-stream.sock", socket.SOCK_STREAM))
attempt("own:workspace-stream-absolute", connector(os.path.join(cwd, "own-ws-stream.sock"), socket.SOCK_STREAM))
attempt("own:workspace-seqpacket", connector("own-ws-seqpacket.sock", socket.SOCK_SEQPACKET))
attempt("own:proc-self-cwd", connector("/proc/self/cwd/own-ws-stream.sock", socket.SOCK_STREAM))
attempt("own:abstract", connector("\0txbox-own-abstract-%d" % os.getpid(), socket.SOCK_STREAM))
try:
    os.symlink(tmp + "/own-stream.sock", "own-link.sock")
except FileExistsError:
    pass
attempt("own:symlink-to-tmp", connector("own-link.sock", socket.SOCK_STREAM))


def own_dgram():
    r = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    r.bind(tmp + "/own-dgram.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"own-datagram", tmp + "/own-dgram.sock")
    s.sendmsg([b"own-msg"], [], 0, tmp + "/own-dgram.sock")
    r.settimeout(5)
    return r.recv(64).decode() + "+" + r.recv(64).decode()


attempt("own:dgram-sendto-sendmsg", own_dgram)


def own_rights():
    # A descriptor passed over a socket pair reaches the other end.
    a, b = socket.socketpair()
    r, w = os.pipe()
    socket.send_fds(a, [b"x"], [w])
    _, fds, _, _ = socket.recv_fds(b, 1, 1)
    os.write(fds[0], b"passed")
    return os.read(r, 16).decode()


attempt("own:scm-rights", own_rights)


def tcp():
    t = socket.socket()
    t.bind(("127.0.0.1", 0))
    t.listen()
    serve(t, b"TCP")
    c = socket.create_connection(t.getsockname(), timeout=5)
    return banner(c)


attempt("own:tcp-loopback", tcp)

# A second thread rewrites the address between an own socket and a host one while the first
# connects: whatever the kernel would read, the connection must never reach the host.
race = cfg.get("race")
if race:
    class Sun(ctypes.Structure):
        _fields_ = [("family", ctypes.c_ushort), ("path", ctypes.c_char * 108)]

    own = (tmp + "/own-stream.sock").encode().ljust(108, b"\0")
    host = race.encode().ljust(108, b"\0")
    addr = Sun(socket.AF_UNIX, own)
    stop = []

    def flip():
        base = ctypes.addressof(addr) + 2
        while not stop:
            ctypes.memmove(base, host, 108)
            ctypes.memmove(base, own, 108)

    t = threading.Thread(target=flip, daemon=True)
    t.start()
    seen = {"own": 0, "host": 0, "refused": 0}
    for _ in range(1500):
        s = socket.socket(socket.AF_UNIX)
        if libc.connect(s.fileno(), ctypes.byref(addr), 110) == 0:
            seen["host" if banner(s) == "HOST" else "own"] += 1
        else:
            seen["refused"] += 1
        s.close()
    stop.append(1)
    out["race:address-rewrite"] = "HOST %(host)d own %(own)d refused %(refused)d" % seen

    # A second thread swaps the descriptor under sendto between a UDP socket and a unix
    # datagram socket, while the address names the host's datagram socket.
    target = cfg["race_dgram"].encode()
    dest = ctypes.create_string_buffer(socket.AF_UNIX.to_bytes(2, sys.byteorder) + target + b"\0")
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    fd = os.dup(udp.fileno())
    stop2 = []

    def swap():
        while not stop2:
            os.dup2(unx.fileno(), fd)
            os.dup2(udp.fileno(), fd)

    t2 = threading.Thread(target=swap, daemon=True)
    t2.start()
    sent = 0
    for _ in range(1500):
        if libc.sendto(fd, b"ESCAPED-swap", 12, 0, dest, len(dest.raw)) >= 0:
            sent += 1
    stop2.append(1)
    out["race:descriptor-swap"] = "sent %d" % sent

print(json.dumps(out))
shutil.rmtree(tmp, ignore_errors=True)
for name in os.listdir("."):
    if name.startswith(("own-", "link-")):
        os.unlink(name)
# Nothing this made (links, sockets) is committed.
sys.exit(3)
