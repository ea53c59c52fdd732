"""``astrasim-py validate``: the collective model against published measurements, with no fitting.

    astrasim-py validate --profile hgx-h200 --tables h200.tsv [...] [--json FILE] [--plot FILE.png]

Per row: published and predicted busbw (GB/s, GB = 10^9 B, nccl-tests' definition), the algorithm and protocol
the model picked (or was forced to by the row's ``algo``), and error = predicted / published - 1. Per table:
geomean |error| for sizes >= 1 MiB, 64 KiB - 1 MiB, below 64 KiB and all >= 64 KiB (a geomean of factors,
exp(mean |ln(predicted / published)|) - 1), and the largest |error| >= 1 MiB.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence

from simulator.collectives.calibration import (
    ERROR_MEASURES,
    Prediction,
    check_fits,
    predict,
    read_tables,
    summarize,
)
from simulator.collectives.hardware import load_profile
from simulator.collectives.nccl import CollectiveModel
from workload.optional import pyplot
from workload.tools.generate import size_label

PROG = "astrasim-py validate"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Compare the NCCL/RCCL-like collective model with published "
                                "nccl-tests tables (busbw in GB/s, GB = 10^9 bytes). No fitting.")
    p.add_argument("--profile", required=True, help="hardware profile: a shipped name or a .yml file")
    p.add_argument("--tables", required=True, nargs="+", help="TSV tables (system, collective, gpus, nodes, bytes, "
                                                              "busbw_GBps, source_url, algo)")
    p.add_argument("--json", help="write rows and per-table summaries to this JSON file")
    p.add_argument("--plot", help="draw predicted vs published busbw per table and GPU count (needs matplotlib)")
    return p


def format_rows(predictions: Sequence[Prediction]) -> list[str]:
    lines = [f"{'table':<40} {'coll':<14} {'gpus':>4} {'nodes':>5} {'size':>8} {'published':>10} {'predicted':>10} "
             f"{'algorithm':<10} {'protocol':<8} {'error':>7}"]
    for p in predictions:
        r = p.row
        lines.append(f"{r.table[:40]:<40} {r.collective:<14} {r.gpus:>4} {r.nodes:>5} {size_label(r.size_bytes):>8} "
                     f"{r.busbw_GBps:>10.2f} {p.busbw_GBps:>10.2f} {p.algorithm:<10} {p.protocol:<8} "
                     f"{p.error:>+7.1%}")
    return lines


def format_summary(summary: Sequence[dict[str, object]]) -> list[str]:
    def pct(v: object) -> str:
        return "-" if v is None else f"{v:.1%}"  # type: ignore[str-format]

    lines = [f"{'table':<48} {'rows':>4} {'>=1MiB':>8} {'64K-1M':>8} {'<64KiB':>8} {'>=64KiB':>8} "
             f"{'max>=1MiB':>10}"]
    for t in summary:
        lines.append(f"{str(t['table'])[:48]:<48} {t['rows']:>4} {pct(t['geomean_abs_error_ge_1MiB']):>8} "
                     f"{pct(t['geomean_abs_error_64KiB_1MiB']):>8} {pct(t['geomean_abs_error_lt_64KiB']):>8} "
                     f"{pct(t['geomean_abs_error_ge_64KiB']):>8} "
                     f"{pct(t['max_abs_error_ge_1MiB']):>10}")
    return [*lines, f"({ERROR_MEASURES})"]


def rows_json(predictions: Sequence[Prediction]) -> list[dict[str, object]]:
    return [{"system": p.row.system, "table": p.row.table, "collective": p.row.collective, "gpus": p.row.gpus,
             "nodes": p.row.nodes, "bytes": p.row.size_bytes, "busbw_GBps": p.row.busbw_GBps,
             "predicted_busbw_GBps": round(p.busbw_GBps, 4), "algorithm": p.algorithm, "protocol": p.protocol,
             "channels": p.channels, "forced_algorithm": p.row.algo, "error": round(p.error, 5)}
            for p in predictions]


def draw(path: str, predictions: Sequence[Prediction], title: str) -> None:
    plt = pyplot("validate --plot")
    curves: dict[tuple[str, str, int, str | None], list[Prediction]] = {}
    for p in predictions:
        curves.setdefault((p.row.table, p.row.collective, p.row.gpus, p.row.algo), []).append(p)
    fig, ax = plt.subplots(figsize=(10, 6.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((table, coll, gpus, algo), preds) in enumerate(sorted(curves.items(), key=lambda kv: str(kv[0]))):
        preds.sort(key=lambda p: p.row.size_bytes)
        color = colors[i % len(colors)]
        label = f"{table.removesuffix('.tsv')[:34]} {coll} {gpus} GPUs" + (f" ({algo})" if algo else "")
        xs = [p.row.size_bytes for p in preds]
        ax.plot(xs, [p.row.busbw_GBps for p in preds], "o", color=color, markersize=3.5, label=label)
        ax.plot(xs, [p.busbw_GBps for p in preds], "-", color=color, linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes, nccl-tests: the whole buffer)")
    ax.set_ylabel("busbw (GB/s, GB = 10^9 B)")
    ax.set_title(f"{title}: published (dots) vs predicted (lines)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(argv: list[str], warn: Callable[[str], None]) -> int:
    args = build_parser().parse_args(argv)
    if args.plot:
        pyplot("validate --plot")  # say it is missing before any work
    profile = load_profile(args.profile)
    rows = read_tables(args.tables)
    check_fits(rows, profile)
    predictions = predict(CollectiveModel(profile), rows)
    summary = summarize(predictions)
    if not profile.parameters():
        warn(f"profile {profile.name} has no calibration: the model uses the library's constants only "
             "(run astrasim-py calibrate)")
    print(f"profile {profile.name} ({profile.library} {profile.library_version}, {profile.arch}); busbw in GB/s, "
          "GB = 10^9 B; error = predicted / published - 1")
    print("\n".join(format_rows(predictions)))
    print()
    print("\n".join(format_summary(summary)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"profile": profile.name, "rows": rows_json(predictions), "tables": summary}, f, indent=1,
                      allow_nan=False)
            f.write("\n")
    if args.plot:
        draw(args.plot, predictions, profile.name)
        print(args.plot)
    if any(not math.isfinite(p.busbw_GBps) for p in predictions):
        warn("some rows have no finite prediction")
    return 0
