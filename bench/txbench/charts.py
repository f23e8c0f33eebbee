"""Two small SVG charts of a run's results, written by hand (no plotting library):
- workspace-size.svg: median ms against workspace size (log-log) for `txbox run -- true`, a
  one-file txbox commit and the naive snapshot: flat lines are costs independent of the size;
- change-size.svg: median ms per change size (log scale) for native writes, native writes
  followed by `sync -f`, and txbox, with txbox's ratio to native above its bar.
"""
import math
import os
from xml.sax.saxutils import escape

W, H = 560, 330
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 40, 74
COLORS = {"txbox": "#1f77b4", "commit": "#2ca02c", "naive": "#d62728", "native": "#7f7f7f", "sync": "#bcbd22"}


def log_scale(lo, hi, a, b):
    """Map [lo, hi] to pixels [a, b] on a log10 scale."""
    llo, lhi = math.log10(lo), math.log10(hi)
    return lambda v: a + (math.log10(v) - llo) / ((lhi - llo) or 1) * (b - a)


def decade_bounds(values):
    """The powers of ten just below the smallest and just above the largest value."""
    vals = [v for v in values if v and v > 0]
    return 10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals)))


def text(x, y, s, anchor="middle", size=11, color="#222"):
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{color}">{escape(s)}</text>'


def frame(title, ylabel, ylo, yhi):
    """Title, plot border, and a log y axis with gridlines at each decade; returns (parts, y)."""
    y = log_scale(ylo, yhi, H - BOTTOM, TOP)
    parts = [f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>', text(W / 2, 22, title, size=14),
             f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" fill="none" stroke="#999"/>']
    v = ylo
    while v <= yhi * 1.0001:
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e5e5"/>')
        parts.append(text(LEFT - 6, y(v) + 4, f"{v:g}", anchor="end"))
        v *= 10
    parts.append(f'<text x="16" y="{(TOP + H - BOTTOM) / 2:.0f}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 16 {(TOP + H - BOTTOM) / 2:.0f})">{escape(ylabel)}</text>')
    return parts, y


def legend(items, y0):
    """One row of coloured squares with labels under the plot."""
    parts, x = [], LEFT
    for label, color in items:
        parts += [f'<rect x="{x}" y="{y0 - 9}" width="10" height="10" fill="{color}"/>', text(x + 14, y0, label, anchor="start")]
        x += 24 + 6.5 * len(label)
    return parts


def document(parts):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
            f'font-family="sans-serif">\n' + "\n".join(parts) + "\n</svg>\n")


def workspace_chart(res):
    """SVG text of median ms against workspace size, or None without the needed measures."""
    sc, lat = res.get("scaling"), res.get("latency")
    if not sc:
        return None
    series = [("txbox run -- true", COLORS["txbox"], {int(n): s["median_ms"] for n, s in sc["true"].items()}),
              ("txbox one-file commit", COLORS["commit"], {int(n): s["median_ms"] for n, s in sc["one_file_commit"].items()})]
    if lat:
        naive = {lat["workspace_files"]: lat["variants"]["naive snapshot"]["median_ms"],
                 lat["big"]["workspace_files"]: lat["big"]["variants"]["naive snapshot"]["median_ms"]}
        series.append(("naive snapshot (cp -a) of true", COLORS["naive"], naive))
    ylo, yhi = decade_bounds([v for _, _, pts in series for v in pts.values()])
    parts, y = frame("Cost against workspace size (median, log-log)", "ms", ylo, yhi)
    sizes = sorted({n for _, _, pts in series for n in pts})
    x = log_scale(sizes[0] / 2, sizes[-1] * 2, LEFT, W - RIGHT)
    for n in sizes:
        parts.append(text(x(n), H - BOTTOM + 16, f"{n:,} files"))
    for _, color, pts in series:
        coords = [(x(n), y(v)) for n, v in sorted(pts.items())]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                     + " ".join(f"{a:.1f},{b:.1f}" for a, b in coords) + '"/>')
        parts += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{color}"/>' for a, b in coords]
    parts += legend([(label, color) for label, color, _ in series], H - 24)
    return document(parts)


def change_chart(res):
    """SVG text of median ms per change size (grouped bars), or None without the measure."""
    changes = res.get("change_size")
    if not changes:
        return None
    kinds = [("native", "native", COLORS["native"]), ("native-sync", "native + sync -f", COLORS["sync"]),
             ("txbox", "txbox run", COLORS["txbox"])]
    ylo, yhi = decade_bounds([c["variants"][k]["median_ms"] for c in changes for k, _, _ in kinds])
    parts, y = frame("Commit cost against change size (median, log scale)", "ms", ylo, yhi)
    slot = (W - LEFT - RIGHT) / len(changes)
    bar = slot / (len(kinds) + 1.5)
    for i, c in enumerate(changes):
        x0 = LEFT + i * slot + bar * 0.75
        for j, (k, _, color) in enumerate(kinds):
            top = y(c["variants"][k]["median_ms"])
            parts.append(f'<rect x="{x0 + j * bar:.1f}" y="{top:.1f}" width="{bar - 2:.1f}" '
                         f'height="{H - BOTTOM - top:.1f}" fill="{color}"/>')
        tx_top = y(c["variants"]["txbox"]["median_ms"])
        parts.append(text(x0 + 2.5 * bar, tx_top - 4, f"{c['over_native']:.1f}×", size=10))
        for n, line in enumerate(wrap(c["label"], 18)):
            parts.append(text(LEFT + (i + 0.5) * slot, H - BOTTOM + 14 + 12 * n, line, size=10))
    parts += legend([(label, color) for _, label, color in kinds], H - 12)
    return document(parts)


def wrap(s, width):
    """Split `s` into lines of at most about `width` characters at spaces."""
    lines, cur = [], ""
    for word in s.split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}".strip()
    return lines + [cur] if cur else lines


def write(res, directory):
    """Write the charts the results allow into `directory`; returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, svg in (("workspace-size.svg", workspace_chart(res)), ("change-size.svg", change_chart(res))):
        if svg:
            path = os.path.join(directory, name)
            with open(path, "w") as f:
                f.write(svg)
            written.append(path)
    return written
