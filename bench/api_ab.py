#!/usr/bin/env python3
"""Interleaved A/B of `txbox serve` per `POST /v1/run`, per docs/BENCHMARKS.md's method.

    bench/api_ab.py 30 50 before=/path/to/old/txbox after=target/release/txbox
    CMD='touch "f$RANDOM"' HOMEWS=1 bench/api_ab.py 10 30 before=... after=...

One server per binary, side by side (each with its own workspace, state directory and token,
under $ROOT, default /tmp/txbox-api-ab), ROUNDS rounds of BATCH requests each on a kept-alive
connection, 2 ms apart, the servers' order reversed every round. Per binary: the median
latency, the median over batches of serve's own CPU per request (its threads' schedstat: the
children excluded) and its warm servers' (separately), with ratios to the first. `CMD`: the
command (default `true`); `HOMEWS=1`: the server's HOME is its workspace.
"""
import http.client, json, os, secrets, socket, subprocess, sys, time, statistics, shutil


def cpu_ns(pid):
    t = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                t += int(f.read().split()[0])
        except OSError:
            pass
    return t


def warm_pids(state):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cl = f.read()
        except OSError:
            continue
        if state.encode() in cl and b"serve" not in cl.split(b"\0")[1:2]:
            out.append(int(p))
    return out


class Srv:
    def __init__(self, name, binary, root):
        self.name = name
        d = os.path.join(root, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        self.ws = os.path.join(d, "ws")
        os.makedirs(self.ws)
        with open(os.path.join(self.ws, "f"), "w") as f:
            f.write("x\n")
        self.state = os.path.join(d, "state")
        self.token = secrets.token_hex(16)
        tf = os.path.join(d, "token")
        with open(tf, "w") as f:
            f.write(self.token + "\n")
        os.chmod(tf, 0o600)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(os.path.join(d, "serve.log"), "w")
        env = dict(os.environ)
        if os.environ.get("HOMEWS"):
            env["HOME"] = self.ws
        self.proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{self.port}", "-C", self.ws,
                                      "--token-file", tf, "--state-dir", self.state],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(300):
            try:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                self.conn.request("GET", "/v1/health")
                self.conn.getresponse().read()
                break
            except OSError:
                time.sleep(0.05)
        self.hdr = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        self.body = json.dumps({"command": os.environ.get("CMD", "true")})
        self.lat, self.cpu, self.wcpu = [], [], []

    def one(self):
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/run", body=self.body, headers=self.hdr)
        r = self.conn.getresponse()
        data = r.read()
        dt = time.perf_counter() - t0
        if r.status != 200 or json.loads(data).get("exit_code") != 0:
            raise SystemExit(f"{self.name}: {r.status} {data[:300]!r}")
        return dt

    def batch(self, n, record=True):
        warm = warm_pids(self.state)
        c0 = cpu_ns(self.proc.pid)
        w0 = sum(cpu_ns(p) for p in warm if os.path.exists(f"/proc/{p}"))
        lat = []
        for _ in range(n):
            lat.append(self.one())
            time.sleep(0.002)
        c1 = cpu_ns(self.proc.pid)
        w1 = sum(cpu_ns(p) for p in warm if os.path.exists(f"/proc/{p}"))
        if record:
            self.lat += lat
            self.cpu.append((c1 - c0) / n / 1e3)
            self.wcpu.append((w1 - w0) / n / 1e3)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def main():
    rounds, batch = int(sys.argv[1]), int(sys.argv[2])
    root = os.environ.get("ROOT", "/tmp/txbox-api-ab")
    servers = [Srv(*a.split("=", 1), root) for a in sys.argv[3:]]
    try:
        for s in servers:
            s.batch(20, record=False)
        for r in range(rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for s in order:
                s.batch(batch)
        base = servers[0]
        ml = lambda s: statistics.median(s.lat) * 1e3
        mc = lambda s: statistics.median(s.cpu)
        mw = lambda s: statistics.median(s.wcpu)
        print(f"{'binary':10} {'n':>5} {'lat ms':>8} {'ratio':>6} {'serve us/req':>12} {'ratio':>6} {'warm us/req':>11}")
        for s in servers:
            print(f"{s.name:10} {len(s.lat):5} {ml(s):8.3f} {ml(s)/ml(base):6.3f} {mc(s):12.1f} {mc(s)/mc(base):6.3f} {mw(s):11.1f}")
        print("serve cpu per batch:", {s.name: [round(x) for x in s.cpu] for s in servers})
    finally:
        for s in servers:
            s.stop()


main()
