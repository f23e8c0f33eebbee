"""The HTTP API's cost (issue #18): a `true` transaction over `POST /v1/run`, and transactions
per second from several clients on several workspaces.

One `txbox serve` on a loopback port with a token, its own state directory, one workspace per
client. Clients are Python `http.client` connections kept alive (as an agent's HTTP client
would keep them), so the TCP handshake is not counted.

- `latency`: interleaved, per round: spawning `bash -c true` (what the command itself costs
  natively), `GET /v1/health` (the HTTP round trip through the same server, no transaction) and
  `POST /v1/run {"command": "true"}`. `added_ms` = median(run) - median(health) - median(bash):
  what a transaction adds beyond the round trip and the command's own process.
- `throughput`: `clients` threads, each on its own connection and workspace, sending
  `POST /v1/run {"command": "true"}` back to back for `per_client` requests after a warm-up;
  transactions per second = all requests / wall time from the first to the last.
- `shared`: the same with every client on one workspace (an agent's commands side by side):
  what the warm servers for overlapping runs (`warm::SLOTS`) serve.
"""
import http.client
import json
import os
import secrets
import socket
import subprocess
import threading
import time

from .timing import BenchError, interleave, median_ms, seconds, summary


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`txbox serve` for `workspaces`, stopped on exit."""

    def __init__(self, ctx, workspaces, env=None):
        self.port = free_port()
        self.token = secrets.token_hex(16)
        tok = ctx.scratch.fresh("api-token")
        os.makedirs(tok, exist_ok=True)
        self.token_file = os.path.join(tok, "token")
        with open(self.token_file, "w") as f:
            f.write(self.token + "\n")
        os.chmod(self.token_file, 0o600)
        state = ctx.scratch.fresh("api-state")
        argv = [ctx.txbox, "serve", "--listen", f"127.0.0.1:{self.port}", "--token-file", self.token_file,
                "--state-dir", state]
        for w in workspaces:
            argv += ["-C", w]
        self.log = open(os.path.join(tok, "serve.log"), "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                c = self.connect()
                c.request("GET", "/v1/health")
                c.getresponse().read()
                c.close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise BenchError(f"txbox serve did not come up on port {self.port} (see {self.log.name})")

    def connect(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Runner:
    """One kept-alive connection to the server, running shell commands in one workspace as an
    HTTP agent would: `POST /v1/run {"command", "workspace"}`."""

    def __init__(self, server, workspace):
        self.conn = server.connect()
        self.headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
        self.workspace = workspace

    def run(self, command):
        """(seconds, the transaction's exit code, its result)."""
        body = json.dumps({"command": command, "workspace": self.workspace})
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/run", body=body, headers=self.headers)
        r = self.conn.getresponse()
        data = r.read()
        dt = time.perf_counter() - t0
        if r.status != 200:
            raise BenchError(f"POST /v1/run answered {r.status}: {data[:300]!r}")
        result = json.loads(data)
        return dt, result.get("exit_code"), result


class Client(Runner):
    """A `Runner` that measures the round trip (`GET /v1/health`) and a `true` transaction."""

    def health(self):
        t0 = time.perf_counter()
        self.conn.request("GET", "/v1/health")
        r = self.conn.getresponse()
        r.read()
        dt = time.perf_counter() - t0
        if r.status != 200:
            raise BenchError(f"GET /v1/health answered {r.status}")
        return dt

    def run_true(self):
        dt, code, result = self.run("true")
        if code != 0:
            raise BenchError(f"POST /v1/run of `true` did not succeed: {str(result)[:300]}")
        return dt


def api(ctx):
    """See the module docstring."""
    clients = 4
    workspaces = [ctx.scratch.populated(f"api{i}", ctx.cfg.sizes[0]) for i in range(clients)]
    runs = ctx.cfg.latency_runs
    per_client = max(10, ctx.cfg.throughput_runs // 2)
    with Server(ctx, workspaces) as srv:
        one = Client(srv, workspaces[0])
        s = interleave({
            "bash -c true": lambda r: seconds(["bash", "-c", "true"], workspaces[0]),
            "GET /v1/health": lambda r: one.health(),
            "POST /v1/run true": lambda r: one.run_true(),
        }, runs)
        bash, health, run = (median_ms(s[k]) for k in ("bash -c true", "GET /v1/health", "POST /v1/run true"))
        latency = {"variants": {k: summary(v) for k, v in s.items()}, "added_ms": run - health - bash}
        one.conn.close()

        wall = concurrent(srv, workspaces, per_client)
        shared = concurrent(srv, [workspaces[0]] * clients, per_client)
    return {
        "latency": latency,
        "throughput": {"clients": clients, "requests": clients * per_client, "seconds": wall,
                       "tx_per_s": clients * per_client / wall},
        "shared": {"clients": clients, "requests": clients * per_client, "seconds": shared,
                   "tx_per_s": clients * per_client / shared},
    }


def concurrent(srv, workspaces, per_client):
    """One client per entry of `workspaces` (a workspace may repeat), each warmed up with two
    requests (together, so that overlapping runs find their servers started), then
    `per_client` requests each, all at once. Returns the wall time of the timed part."""
    cs = [Client(srv, w) for w in workspaces]
    errors = []

    def together(n):
        start = threading.Barrier(len(cs) + 1)

        def work(c):
            start.wait()
            try:
                for _ in range(n):
                    c.run_true()
            except Exception as e:  # reported below: a failed request is not a measurement
                errors.append(repr(e))

        threads = [threading.Thread(target=work, args=(c,)) for c in cs]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    together(2)
    time.sleep(0.3)  # a server started by the warm-up is listening by now
    wall = together(per_client)
    for c in cs:
        c.conn.close()
    if errors:
        raise BenchError(f"API throughput: {len(errors)} request(s) failed: {errors[0]}")
    return wall
