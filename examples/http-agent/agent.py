#!/usr/bin/env python3
"""A minimal agent loop over txbox's HTTP API, standard library only.

The "model" here is a fixed plan of shell commands so the example runs without an API key;
replace `next_command` with a call to your LLM, feeding it the JSON results (they are what an
LLM reads best: outcome, exit_code, stdout, stderr, changes).

    TXBOX_URL=http://127.0.0.1:8731 TXBOX_TOKEN=... python3 agent.py
"""
import json
import os
import sys
import urllib.error
import urllib.request

URL = os.environ.get("TXBOX_URL", "http://127.0.0.1:8731").rstrip("/")
TOKEN = os.environ.get("TXBOX_TOKEN", "")


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + TOKEN)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


PLAN = [
    "echo 'print(\"hello\")' > hello.py",   # committed
    "python3 hello.py && rm hello.py && exit 1",  # fails: the rm is rolled back
    "rm -rf /",                             # denied by policy: nothing runs
]


def next_command(history):
    """Stand-in for the model: the next command given the results so far (None = done)."""
    return PLAN[len(history)] if len(history) < len(PLAN) else None


def main():
    history = []
    while (cmd := next_command(history)) is not None:
        status, r = call("POST", "/v1/run", {"command": cmd, "timeout": 60})
        if status != 200:
            # Errors before a result exists: {"error": {"kind": ..., "message": ...}}.
            err = r.get("error") or {}
            sys.exit(f"txbox answered {status} ({err.get('kind')}): {err.get('message')}")
        print(f"$ {cmd}\n  -> {r['outcome']} (exit {r['exit_code']}) changes={r['changes']}")
        if r["outcome"] == "denied":
            print(f"     denied: {r['decision']['reason']}")
        history.append(r)

    # A reviewed multi-step change: begin, exec, diff, then commit (or rollback).
    _, t = call("POST", "/v1/tx", {})
    tx = t["tx"]
    _, r = call("POST", f"/v1/tx/{tx}/exec", {"command": "echo 'x = 1' > config.py"})
    print(f"step in tx {tx}: {r['outcome']}")
    _, d = call("GET", f"/v1/tx/{tx}/diff")
    print(f"pending: added={d['added']} modified={d['modified']} deleted={d['deleted']}")
    _, r = call("POST", f"/v1/tx/{tx}/commit")
    print(f"commit: {r['outcome']}")
    _, log = call("GET", "/v1/log?n=5")
    print(f"last {len(log)} audit entries: {[e['outcome'] for e in log]}")


if __name__ == "__main__":
    main()
