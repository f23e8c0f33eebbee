"""The results of a run as Markdown tables ready for docs/BENCHMARKS.md, and the verdict on
each DESIGN §8 target. Every function takes the results dict that bench/run.py writes as JSON."""
import os


def ms(v):
    if v is None:
        return "–"
    if abs(v) >= 100:
        return f"{v:,.0f} ms"
    return f"{v:.1f} ms" if abs(v) >= 10 else f"{v:.2f} ms"


def times(v):
    return "–" if v is None else f"{v:.2f}×"


def code(s):
    """`s` as Markdown inline code (backticks inside become quotes)."""
    return "`" + s.replace("`", "'") + "`"


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def ten_k_change(res):
    """The change-size entry for the largest number of new files in a new directory."""
    cands = [c for c in res.get("change_size", []) if c["files"] and not c["existing_dir"]]
    return max(cands, key=lambda c: c["files"]) if cands else None


def policy_set(res):
    """The policy latency set the target is judged on: the agent corpus when it was measured."""
    sets = res.get("policy", {}).get("sets", [])
    return sets[-1] if sets else None


def targets(res):
    """[(measure, result text, target text, met)] for each DESIGN §8 target measured."""
    out = []
    lat, sc, thr, rb = res.get("latency"), res.get("scaling"), res.get("throughput"), res.get("rollback")
    if lat:
        v = lat["added_ms"]["txbox run -- true"]
        out.append(("added latency of `txbox run -- true` over bare `true` (median)", ms(v), "≤ 3 ms", v <= 3))
    if sc:
        big, small = sc["sizes"][-1], sc["sizes"][0]
        v = sc["true_ratio"][str(big)]
        out.append((f"`txbox run -- true` on {big:,} files vs {small:,}", times(v), "≤ 1.2", v <= 1.2))
    ch = ten_k_change(res)
    if ch:
        v = ch["over_native"]
        out.append((f"commit of {ch['files']:,} new small files vs writing them natively", times(v), "≤ 1.5×", v <= 1.5))
    if rb:
        worst = max(rb, key=lambda r: r["return_after_exit_ms"]["median"])
        v = worst["return_after_exit_ms"]["median"]
        out.append((f"rollback: return after the command exits (worst case: {worst['label']})",
                    f"{ms(v)} (max {ms(worst['return_after_exit_ms']['max'])})", "≤ 50 ms", v <= 50))
    ps = policy_set(res)
    if ps:
        v = ps["p99_us"]
        out.append((f"policy evaluation p99 ({ps['strings']:,} strings)", f"{v:.1f} µs", "≤ 50 µs", v <= 50))
    if thr:
        v = thr["true_tx_per_s"]
        out.append(("sequential `txbox run -- true` throughput", f"{v:.0f} tx/s", "≥ 300 tx/s", v >= 300))
    ses = res.get("session")
    if ses:
        v = ses["overhead_pct"]
        out.append(("replayed agent session, overhead over `bash -c` (#18)", f"{v:+.1f}%", "≤ 5%", v <= 5))
        if "api" in ses:
            v = ses["api"]["overhead_pct"]
            out.append(("the same session over the HTTP API (#18)", f"{v:+.1f}%", "≤ 5%", v <= 5))
    if ps:
        v = ps["p99_us"]
        out.append(("policy evaluation p99 (#18)", f"{v:.1f} µs", "≤ 20 µs", v <= 20))
    ap = res.get("api")
    if ap:
        v = ap["latency"]["added_ms"]
        out.append(("`true` over `POST /v1/run`, added over `bash -c true` and the HTTP round trip (#18)",
                    ms(v), "≤ 1 ms", v <= 1))
        v = ap["throughput"]["tx_per_s"]
        out.append((f"`true` over the API, {ap['throughput']['clients']} clients on as many workspaces (#18)",
                    f"{v:.0f} tx/s", "≥ 400 tx/s", v >= 400))
    return out


def header(meta):
    m = meta
    quick = " — **--quick: few iterations, small sizes; not for conclusions**" if m["quick"] else ""
    return (f"### {m['date']} — {m['nproc']} cores, {m['memory_gib']:.0f} GiB, Linux {m['kernel']}, "
            f"{m['filesystem']}{quick}\n\n"
            f"Command: `{m['command']}` (txbox {m['txbox_commit']}, {m['cpu']}). Load average at start "
            f"{m['load_start']}, at end {m['load_end']}.\n")


def latency_section(lat):
    v = lat["variants"]
    tx = v["txbox run -- true"]["median_ms"]
    rows = []
    for name, s in v.items():
        added = lat["added_ms"].get(name)
        rows.append([f"`{name}`" if name.startswith(("bare", "txbox")) else name, ms(s["median_ms"]),
                     ms(added) if added is not None else "–", times(s["median_ms"] / tx), s["n"]])
    big = lat["big"]
    out = (f"Per-transaction latency on a {lat['workspace_files']:,}-file workspace (interleaved):\n\n"
           + table(["variant", "median", "added over bare `true`", "relative to txbox", "runs"], rows))
    brows = [[k, ms(s["median_ms"]), s["n"]] for k, s in big["variants"].items()]
    out += (f"\nOn a {big['workspace_files']:,}-file workspace, the naive snapshot takes "
            f"{times(big['naive_over_txbox'])} txbox's time:\n\n" + table(["variant", "median", "runs"], brows))
    return out


def scaling_section(sc):
    rows = [[f"{n:,}", ms(sc["true"][str(n)]["median_ms"]), times(sc["true_ratio"][str(n)]),
             ms(sc["one_file_commit"][str(n)]["median_ms"]), times(sc["one_file_commit_ratio"][str(n)])]
            for n in sc["sizes"]]
    return ("Workspace size (interleaved; ratio to the smallest workspace):\n\n"
            + table(["files", "`txbox run -- true`", "ratio", "one-file commit", "ratio"], rows))


def change_section(changes):
    rows = [[c["label"], ms(c["variants"]["native"]["median_ms"]), ms(c["variants"]["native-sync"]["median_ms"]),
             ms(c["variants"]["txbox"]["median_ms"]), times(c["over_native"]), times(c["over_native_sync"]),
             c["variants"]["txbox"]["n"]] for c in changes]
    return ("Commit cost against change size (interleaved; native = `bash -c`, native + sync = then "
            "`sync -f`, as durable as a txbox commit):\n\n"
            + table(["change", "native", "native + sync", "txbox run", "÷ native", "÷ native + sync", "rounds"], rows))


def rollback_section(rb):
    rows = [[r["label"], ms(r["variants"]["native"]["median_ms"]), ms(r["variants"]["txbox"]["median_ms"]),
             ms(r["excess_ms"]), ms(r["return_after_exit_ms"]["median"]), ms(r["return_after_exit_ms"]["max"]),
             ms(r["next_recover_ms"]["median"])] for r in rb]
    return ("Rollback of a failing command (interleaved; *after exit* = txbox's own phases after the "
            "command exited, from `TXBOX_TIMING=1`; *recover* = the `recover` phase that starts each run, "
            "where what is left of the previous rollback's layer is deleted):\n\n"
            + table(["failing command", "native", "txbox run", "excess", "after exit (median)", "after exit (max)",
                     "recover (median)"], rows))


def throughput_section(thr):
    return (f"Sequential throughput ({thr['runs']} runs back to back): `txbox run -- true` "
            f"{thr['true_tx_per_s']:.0f} tx/s; one-file commit {thr['one_file_commit_tx_per_s']:.0f} tx/s.\n")


def api_section(ap):
    lat, thr = ap["latency"], ap["throughput"]
    rows = [[k, ms(v["median_ms"]), ms(v["min_ms"]), v["n"]] for k, v in lat["variants"].items()]
    return ("HTTP API (`txbox serve` on loopback, kept-alive connections; interleaved):\n\n"
            + table(["request", "median", "min", "runs"], rows)
            + f"\nAdded by a transaction beyond the round trip and `bash -c true`: {ms(lat['added_ms'])}. "
            f"Throughput: {thr['clients']} clients on {thr['clients']} workspaces, {thr['requests']} "
            f"`true` transactions in {thr['seconds']:.2f} s: {thr['tx_per_s']:.0f} tx/s"
            + (f"; the same {ap['shared']['clients']} clients on one workspace: {ap['shared']['tx_per_s']:.0f} tx/s"
               if "shared" in ap else "")
            + ".\n")


def set_label(name):
    """A string set's name for the table: a file path shortened to its file name, a described
    set (`representative (benches/…/commands.txt)`) kept whole."""
    return os.path.basename(name) if name.startswith("/") else name


def policy_section(pol):
    if "skipped" in pol:
        return f"Policy evaluation: skipped ({pol['skipped']}).\n"
    rows = [[set_label(s["set"]), f"{s['strings']:,}", f"{s['median_us']:.1f} µs", f"{s['p99_us']:.1f} µs", f"{s['max_us']:.0f} µs"]
            for s in pol["sets"]]
    slow = "; ".join(f"{x['us']:.0f} µs for {x['bytes']:,} bytes ({code(x['start'][:40])})"
                     for x in pol["sets"][-1].get("slowest", [])[:3])
    return ("Policy evaluation, in process, one string at a time:\n\n" + table(["strings", "n", "median", "p99", "max"], rows)
            + (f"\nSlowest strings (fastest of the rounds): {slow}.\n" if slow else ""))


def session_section(s):
    rows = [["native (`bash -c` per command)", f"{s['native_s']:.2f} s", "–", "–"],
            ["`txbox run -c` per command", f"{s['txbox_s']:.2f} s", f"{s['overhead_pct']:+.1f}%", f"{s['per_tx_ms']:.1f} ms"]]
    if "api" in s:
        a = s["api"]
        rows.append([f"`POST /v1/run` per command (native {a['native_s']:.2f} s in its median round)",
                     f"{a['txbox_s']:.2f} s", f"{a['overhead_pct']:+.1f}%", f"{a['per_tx_ms']:.1f} ms"])
    rows.append(["paper (arXiv 2512.12806), its own workload", "–", f"+{s['paper']['overhead_pct']}%",
                 f"~{s['paper']['per_tx_s'] * 1000:,.0f} ms"])
    check = ("the replays ended with identical trees and identical exit statuses" if s["identical"] else
             f"**MISMATCH**: exit statuses differ for {s['exit_mismatches']}; trees differ at {s['tree_differences']}")
    added = ", ".join(f"{code(a['cmd'])} {a['added_ms']:+.0f} ms" for a in s["most_added"][:3])
    return (f"Agent session replayed ({s['commands']} commands, {s['failing_commands']} of them failing; median of "
            f"{s['rounds']} round(s)):\n\n" + table(["replay", "total", "overhead", "per transaction"], rows)
            + f"\nCorrectness check: {check}. Most added: {added}.\n")


def target_section(res):
    rows = [[m, r, t, "met" if ok else "**not met**"] for m, r, t, ok in targets(res)]
    return "DESIGN §8 targets:\n\n" + table(["measure", "result", "target", "status"], rows)


SECTIONS = [("latency", latency_section), ("scaling", scaling_section), ("change_size", change_section),
            ("rollback", rollback_section), ("throughput", throughput_section), ("policy", policy_section),
            ("session", session_section), ("api", api_section)]


def markdown(res, charts=()):
    """The whole report; `charts` are paths of SVG files relative to where it is written."""
    parts = [header(res["meta"])]
    if targets(res):
        parts.append(target_section(res))
    parts += [fn(res[key]) for key, fn in SECTIONS if key in res]
    if charts:
        parts.append("Charts: " + ", ".join(f"![{os.path.basename(c)}]({c})" for c in charts) + "\n")
    return "\n".join(parts)
