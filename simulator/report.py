"""``astrasim-py report RESULTS.json --html FILE``: one self-contained HTML page, charts as inline SVG.

Readable in any browser without a server or network access: no scripts, no external files.
"""

from __future__ import annotations

import html
import math
from typing import Any

from simulator.results import format_bytes, format_ns, units_note
from simulator.units import NETWORK_GB, upgrade_results
from workload.errors import InputError
from workload.files import parse_json, read_text, shown_path

COLORS = {"compute": "#4e79a7", "communication only": "#e15759", "memory": "#edc948", "idle": "#bab0ac",
          "overlapped communication": "#f28e2b", "comm": "#e15759"}
PARTS = (("compute", "compute_busy_ns"), ("communication only", "comm_only_ns"),
         ("memory", "memory_only_ns"), ("idle", "idle_ns"))
MAX_RESULTS_BYTES = 256 << 20  # a results JSON of 100,000 ranks is a few tens of MiB


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


def compute_text(compute: dict[str, Any]) -> str:
    """The compute model a run used, as the results' config records it."""
    if compute.get("model") == "kernels":
        return (f"kernel model: {compute.get('device')}, {compute.get('peak_tflops', 0):g} TFLOP/s BF16 peak, "
                f"{compute.get('memory_bw_GBps', 0):g} GB/s memory (GB = 10^9 B), efficiencies "
                f"{compute.get('calibration')}")
    if compute.get("model") != "roofline":
        return "durations recorded in the trace"
    device = compute.get("device") or "the system configuration's figures"
    return (f"roofline model: {device}, {compute.get('peak_tflops', 0):g} TFLOP/s peak, "
            f"{compute.get('memory_bw_GBps', 0):g} GB/s memory (GB = 10^9 B)")


def network_text(net: dict[str, Any]) -> str:
    """Topology and per-dimension bandwidth and latency, with ASTRA-sim's GB."""
    dims = " x ".join(f"{t}({n})" for t, n in zip(net.get("topology", []), net.get("npus_count", []), strict=False))
    bandwidths, latencies = net.get("bandwidth_GiBps", []), net.get("latency_ns", [])
    if not bandwidths:
        return dims
    return (f"{dims}; {', '.join(f'{b:g}' for b in bandwidths)} GB/s, {', '.join(f'{x:g}' for x in latencies)} ns "
            f"per dimension ({NETWORK_GB})")


def render(result: dict[str, Any], title: str = "astrasim-py report") -> str:
    """The page of a results mapping already checked by ``check_shape``."""
    ranks, finish = result["ranks"], result["finish_ns"]
    cfg = result.get("config", {})
    net = cfg.get("network", {})
    system = cfg.get("system", {})
    compute = cfg.get("compute")
    run = result.get("run", {})
    summary = [["end-to-end time", f"{format_ns(finish)} ({finish} ns)"], ["ranks", len(ranks)],
               ["network", network_text(net)],
               ["backend", result.get("backend", "")], ["engine", run.get("engine", "")],
               ["workload", cfg.get("workload", "")], ["astrasim-py", result.get("version", "")],
               ["simulation wall time", f"{run.get('wall_time_s', 0)} s"]]
    if compute:
        summary.insert(4, ["compute", compute_text(compute)])
    settings = [[k, v] for k, v in system.items() if k not in ("path", "defaults_used") and v not in (None, {}, ())]
    sections = [f"<h1>{_esc(title)}</h1>", _table(["", ""], summary),
                "<h2>Where the time went</h2>",
                "<p>Each bar is a rank's run split into compute, communication not hidden by compute, remote "
                "memory only, and idle; they add up to the rank's finish time.</p>", breakdown_chart(ranks, finish)]
    collectives = result.get("collectives", [])
    if collectives:
        sections += ["<h2>Collectives</h2>", _table(
            ["collective", "per rank", "bytes per rank", "time per rank", "algbw (GB/s, GB = 10^9 B)",
             "busbw (GB/s, GB = 10^9 B)"],
            [[c["kind"], round(c["count_per_rank"], 3), format_bytes(c["bytes_per_rank"]),
              format_ns(c["time_ns_per_rank"]), round(c["algbw_GBps"], 2), round(c["busbw_GBps"], 2)]
             for c in collectives]),
            f"<p>{_esc(units_note(result.get('backend') == 'nccl'))}.</p>",
            bar_chart([(c["kind"], c["busbw_GBps"], f"{c['busbw_GBps']:.1f} GB/s") for c in collectives],
                      "GB/s (GB = 10^9 B)", "bus bandwidth per collective", "#59a14f")]
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
    sections += ["<h2>Configuration</h2>"]
    if compute:
        sections.append(_table(["compute setting (as run)", "value"], [[k, v] for k, v in compute.items()]))
    sections += [_table(["system setting", "value"], settings),
                 _table(["network setting", "value"], [[k, v] for k, v in net.items()])]
    style = ("body{font-family:system-ui,sans-serif;margin:24px;max-width:960px;color:#222}"
             "table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:left;font-size:13px}th{background:#f4f4f4}h2{margin-top:28px}")
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{_esc(title)}</title><style>{style}</style></head><body>" + "".join(sections)
            + "</body></html>\n")


class _Shape(Exception):
    """Where a results mapping differs from what astrasim-py writes."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Shape(f"{where} is not a mapping")
    return value


def _records(value: Any, where: str, numbers: tuple[str, ...], texts: tuple[str, ...] = ()) -> list[Any]:
    """A list of mappings, each with these number and text fields."""
    if not isinstance(value, list):
        raise _Shape(f"{where} is not a list")
    for k, item in enumerate(value):
        _mapping(item, f"{where}[{k}]")
        for key in numbers:
            if not _is_number(item.get(key)):
                raise _Shape(f"{where}[{k}].{key} is not a number")
        for key in texts:
            if not isinstance(item.get(key), (str, int)):
                raise _Shape(f"{where}[{k}].{key} is missing")
    return value


def _numbers(value: Any, where: str) -> None:
    if not isinstance(value, list) or not all(_is_number(v) for v in value):
        raise _Shape(f"{where} is not a list of numbers")


def check_shape(result: Any) -> None:
    """Raise _Shape unless ``result`` has every field the report draws, of the type it draws."""
    result = _mapping(result, "the document")
    if not _is_number(result.get("finish_ns")):
        raise _Shape("finish_ns is not a number")
    if not _records(result.get("ranks"), "ranks", ("rank", "finish_ns", *(key for _, key in PARTS))):
        raise _Shape("ranks is empty")
    _records(result.get("collectives", []), "collectives",
             ("count_per_rank", "bytes_per_rank", "time_ns_per_rank", "algbw_GBps", "busbw_GBps"), ("kind",))
    _records(result.get("links", []), "links", ("utilization", "bytes", "messages", "max_queue"), ("link",))
    activity = _mapping(result.get("activity") or {}, "activity")
    if activity:
        bins = activity.get("bins")
        if not (isinstance(bins, int) and not isinstance(bins, bool) and 0 < bins <= 100_000):
            raise _Shape("activity.bins is not a count of time slices")
        rows = _records(activity.get("ranks", []), "activity.ranks", ("rank",)) or [
            _mapping(activity.get("mean"), "activity.mean")]
        for k, row in enumerate(rows):
            for name in ("compute", "comm"):
                _numbers(row.get(name), f"activity row {k}.{name}")
    cfg = _mapping(result.get("config", {}), "config")
    net = _mapping(cfg.get("network", {}), "config.network")
    for key in ("topology", "npus_count"):
        if not isinstance(net.get(key, []), list):
            raise _Shape(f"config.network.{key} is not a list")
    _mapping(cfg.get("system", {}), "config.system")
    compute = _mapping(cfg.get("compute") or {}, "config.compute")
    for key in ("peak_tflops", "memory_bw_GBps"):
        if compute.get(key) is not None and not _is_number(compute[key]):
            raise _Shape(f"config.compute.{key} is not a number")
    _mapping(result.get("run", {}), "run")


def write_report(results_path: str, html_path: str) -> None:
    """Read a results JSON (from --json) and write its page; a file of another shape is a one-line error."""
    where = shown_path(results_path)
    # a results file of an earlier version names its bandwidths *_gbps
    result = upgrade_results(parse_json(read_text(results_path, "results JSON", MAX_RESULTS_BYTES), where))
    try:
        check_shape(result)
    except _Shape as e:
        raise InputError(f"{where}: not an astrasim-py results file: {e} (write one with astrasim-py ... --json "
                         "FILE)") from None
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(render(result))
