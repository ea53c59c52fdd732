"""The Mamba-2 scan's kernels against published timings: fits SCAN_BANDWIDTH_FRACTION and prints each row.

    python benchmarks/ssd_kernels.py

Rows: benchmarks/data/ssd_triton.tsv (mamba_ssm's Triton SSD forward on B200 and H200; the sources and
licences are in benchmarks/data/kernels/README.md). The model times each of the five forward kernels by the bytes
workload/llm/mamba.py counts, at the device's element-wise bandwidth efficiency times the fraction, plus a launch;
the fraction is the one whose median error over the rows is zero.
"""

from __future__ import annotations

import csv
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compute import kernel_params  # noqa: E402
from compute.devices import device  # noqa: E402
from compute.kernels import KernelModel  # noqa: E402
from workload.llm.mamba import MambaMixer  # noqa: E402
from workload.llm.presets import preset  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "ssd_triton.tsv"


def rows() -> list[dict[str, str]]:
    with open(DATA, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def predicted_us(row: dict[str, str], fraction: float) -> float:
    """The model's time of a row's scan forward with ``fraction`` as the scan's bandwidth fraction."""
    base = preset("nemotron-3-nano")
    model = replace(base, mamba_heads=int(row["heads"]), mamba_head_dim=int(row["head_dim"]),
                    mamba_state_dim=int(row["state_dim"]), mamba_groups=int(row["groups"]),
                    mamba_chunk=int(row["chunk"]))
    mixer = MambaMixer(model, int(row["batch"]), int(row["seq_len"]), 1, ("", ""), 0)
    saved = kernel_params.SCAN_BANDWIDTH_FRACTION
    kernel_params.SCAN_BANDWIDTH_FRACTION = fraction
    try:
        km = KernelModel(device(row["device"]))
        return sum(km.seconds(k.shape, k.flops, k.size_bytes) for k in mixer.scan_forward) * 1e6
    finally:
        kernel_params.SCAN_BANDWIDTH_FRACTION = saved


def fit() -> float:
    """The fraction (two decimals) whose median log error over the rows is nearest zero."""
    data = rows()

    def median_error(fraction: float) -> float:
        return statistics.median(predicted_us(r, fraction) / float(r["fwd_us"]) - 1 for r in data)

    return min((f / 100 for f in range(5, 101)), key=lambda f: abs(median_error(f)))


def main() -> None:
    fraction = kernel_params.SCAN_BANDWIDTH_FRACTION
    print(f"{'device':6} {'batch':>5} {'seq':>6} {'heads':>5} {'groups':>6} {'chunk':>5} {'measured us':>11} "
          f"{'model us':>9} {'error':>7}")
    errors = []
    for r in rows():
        model = predicted_us(r, fraction)
        error = model / float(r["fwd_us"]) - 1
        errors.append(error)
        print(f"{r['device']:6} {r['batch']:>5} {r['seq_len']:>6} {r['heads']:>5} {r['groups']:>6} {r['chunk']:>5} "
              f"{float(r['fwd_us']):11.1f} {model:9.1f} {error:+7.1%}")
    print(f"\nSCAN_BANDWIDTH_FRACTION {fraction} (refit: {fit()}); {len(errors)} rows, mean |error| "
          f"{statistics.mean(abs(e) for e in errors):.1%}, max {max(abs(e) for e in errors):.1%}")


if __name__ == "__main__":
    main()
