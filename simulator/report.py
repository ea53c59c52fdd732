"""``astrasim-py report RESULTS.json --html FILE``: one self-contained HTML page, charts as inline SVG.

Readable in any browser without a server or network access: no scripts, no external files.
"""

from __future__ import annotations

import html
import json
from typing import Any

from simulator.results import format_bytes, format_ns

COLORS = {"compute": "#4e79a7", "exposed communication": "#e15759", "memory": "#edc948", "idle": "#bab0ac",
          "overlapped communication": "#f28e2b", "comm": "#e15759"}
PARTS = (("compute", "compute_busy_ns"), ("exposed communication", "comm_exposed_ns"),
         ("memory", "memory_exposed_ns"), ("idle", "idle_ns"))


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="{_esc(label)}" viewBox="0 0 {width} {height}">' + "".join(body) + "</svg>")


def _legend(names: list[str], x: int, y: int) -> list[str]:
    out = []
    for k, name in enumerate(names):
        out.append(f'<rect x="{x + 190 * k}" y="{y}" width="12" height="12" fill="{COLORS[name]}"/>'
                   f'<text x="{x + 190 * k + 16}" y="{y + 11}" font-size="12">{_esc(name)}</text>')
    return out


def breakdown_chart(ranks: list[dict[str, Any]], finish_ns: int) -> str:
    """Stacked bars per rank (or min/mean/max over ranks when there are many)."""
    rows: list[tuple[str, dict[str, float]]]
    if len(ranks) <= 64:
        rows = [(f"rank {r['rank']}", {name: r[key] for name, key in PARTS}) for r in ranks]
    else:
        rows = []
        for label, pick in (("fastest rank", min), ("slowest rank", max)):
            r = pick(ranks, key=lambda x: x["finish_ns"])
            rows.append((f"{label} ({r['rank']})", {name: r[key] for name, key in PARTS}))
        rows.insert(1, ("mean", {name: sum(r[key] for r in ranks) / len(ranks) for name, key in PARTS}))
    width, left, bar = 900, 140, 18
    scale = (width - left - 20) / max(finish_ns, 1)
    body = _legend([n for n, _ in PARTS], left, 4)
    for k, (label, parts) in enumerate(rows):
        y = 28 + k * (bar + 6)
        body.append(f'<text x="{left - 8}" y="{y + 13}" font-size="12" text-anchor="end">{_esc(label)}</text>')
        x = float(left)
        for name, _ in PARTS:
            w = parts[name] * scale
            if w > 0:
                body.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar}" fill="{COLORS[name]}">'
                            f'<title>{_esc(label)}: {name} {format_ns(parts[name])}</title></rect>')
            x += w
    return _svg(width, 40 + len(rows) * (bar + 6), body, "time breakdown per rank")


def bar_chart(values: list[tuple[str, float, str]], unit: str, label: str, color: str = "#4e79a7") -> str:
    width, left, bar = 900, 220, 16
    top = max((v for _, v, _ in values), default=0) or 1
    body = []
    for k, (name, value, text) in enumerate(values):
        y = 6 + k * (bar + 6)
        w = value / top * (width - left - 140)
        body.append(f'<text x="{left - 8}" y="{y + 12}" font-size="12" text-anchor="end">{_esc(name)}</text>'
                    f'<rect x="{left}" y="{y}" width="{w:.2f}" height="{bar}" fill="{color}"/>'
                    f'<text x="{left + w + 6:.2f}" y="{y + 12}" font-size="12">{_esc(text)}</text>')
    return _svg(width, 12 + len(values) * (bar + 6), body, label + " " + unit)


def activity_chart(activity: dict[str, Any], finish_ns: int) -> str:
    """Per-rank strips (or the mean over ranks) of compute and communication activity over time."""
    rows = [(f"rank {r['rank']}", r) for r in activity.get("ranks", [])] or [("mean of ranks", activity["mean"])]
    bins = activity["bins"]
    width, left, strip = 900, 140, 7
    cell = (width - left - 20) / bins
    body = _legend(["compute", "comm"], left, 4)
    for k, (label, data) in enumerate(rows):
        y = 26 + k * (2 * strip + 6)
        body.append(f'<text x="{left - 8}" y="{y + 11}" font-size="11" text-anchor="end">{_esc(label)}</text>')
        for row, name in ((0, "compute"), (1, "comm")):
            for b, value in enumerate(data[name]):
                if value > 0:
                    body.append(f'<rect x="{left + b * cell:.2f}" y="{y + row * strip}" width="{cell:.2f}" '
                                f'height="{strip}" fill="{COLORS[name]}" fill-opacity="{min(value, 1):.3f}"/>')
    y = 26 + len(rows) * (2 * strip + 6)
    for k in range(5):
        x = left + k * (width - left - 20) / 4
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        body.append(f'<text x="{x:.1f}" y="{y + 12}" font-size="11" text-anchor="{anchor}">'
                    f'{_esc(format_ns(finish_ns * k / 4))}</text>')
    return _svg(width, y + 18, body, "activity over time")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(result: dict[str, Any], title: str = "astrasim-py report") -> str:
    ranks, finish = result["ranks"], result["finish_ns"]
    cfg = result.get("config", {})
    net = cfg.get("network", {})
    system = cfg.get("system", {})
    run = result.get("run", {})
    summary = [["end-to-end time", f"{format_ns(finish)} ({finish} ns)"], ["ranks", len(ranks)],
               ["network", " x ".join(f"{t}({n})" for t, n in zip(net.get("topology", []), net.get("npus_count", []),
                                                                   strict=False))],
               ["backend", result.get("backend", "")], ["engine", run.get("engine", "")],
               ["workload", cfg.get("workload", "")], ["astrasim-py", result.get("version", "")],
               ["simulation wall time", f"{run.get('wall_time_s', 0)} s"]]
    settings = [[k, v] for k, v in system.items() if k not in ("path", "defaults_used") and v not in (None, {}, ())]
    sections = [f"<h1>{_esc(title)}</h1>", _table(["", ""], summary),
                "<h2>Where the time went</h2>",
                "<p>Each bar is a rank's run split into compute, communication not hidden by compute, remote "
                "memory only, and idle; they add up to the rank's finish time.</p>", breakdown_chart(ranks, finish)]
    collectives = result.get("collectives", [])
    if collectives:
        sections += ["<h2>Collectives</h2>", _table(
            ["collective", "per rank", "bytes per rank", "time per rank", "algbw (GB/s)", "busbw (GB/s)"],
            [[c["kind"], round(c["count_per_rank"], 3), format_bytes(c["bytes_per_rank"]),
              format_ns(c["time_ns_per_rank"]), round(c["algbw_gbps"], 2), round(c["busbw_gbps"], 2)]
             for c in collectives]),
            bar_chart([(c["kind"], c["busbw_gbps"], f"{c['busbw_gbps']:.1f} GB/s") for c in collectives],
                      "GB/s", "bus bandwidth per collective", "#59a14f")]
    links = result.get("links", [])
    if links:
        top = links[:12]
        sections += ["<h2>Busiest links</h2>", _table(
            ["link", "utilization", "bytes", "messages", "max queue"],
            [[r["link"], f"{100 * r['utilization']:.1f}%", format_bytes(r["bytes"]), r["messages"], r["max_queue"]]
             for r in top]),
            bar_chart([(r["link"], r["utilization"], f"{100 * r['utilization']:.1f}%") for r in top],
                      "utilization", "busiest links", "#76b7b2")]
    if result.get("activity"):
        sections += ["<h2>Timeline overview</h2>",
                     "<p>Darker cells: a larger share of the time slice spent computing (top strip) or "
                     "communicating (bottom strip).</p>", activity_chart(result["activity"], finish)]
    sections += ["<h2>Configuration</h2>", _table(["system setting", "value"], settings),
                 _table(["network setting", "value"], [[k, v] for k, v in net.items()])]
    style = ("body{font-family:system-ui,sans-serif;margin:24px;max-width:960px;color:#222}"
             "table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:left;font-size:13px}th{background:#f4f4f4}h2{margin-top:28px}")
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{_esc(title)}</title><style>{style}</style></head><body>" + "".join(sections)
            + "</body></html>\n")


def write_report(results_path: str, html_path: str) -> None:
    from workload.errors import InputError

    try:
        with open(results_path, encoding="utf-8") as f:
            result = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{results_path}: cannot read results JSON ({e})") from None
    if not isinstance(result, dict) or "ranks" not in result or "finish_ns" not in result:
        raise InputError(f"{results_path}: not an astrasim-py results file (write one with --json)")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(render(result))
