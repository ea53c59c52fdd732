"""Accuracy on measurements the calibration did not see: fit a profile on part of a GPU class's tables, predict the
rest, and print the error per size band (geomean |predicted/published - 1|) next to the error on the fitted part.

    python benchmarks/holdout_validation.py [--shared ../shared]

Splits: other GPU counts on one node (fit 8 GPUs, predict 2 and 4), other node counts (fit 2 nodes, predict 4;
fit 1-2 nodes, predict 4 and 8), and sizes between the fitted ones (fit every other size, predict the rest).
Deterministic; a few seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from simulator.collectives.calibration import ERROR_MEASURES, Measurement, calibrate, predict, read_tables, summarize
from simulator.collectives.hardware import load_profile
from simulator.collectives.nccl import CollectiveModel

Rows = list[Measurement]
Split = Callable[[Rows], tuple[Rows, Rows]]


def by(test: Callable[[Measurement], bool]) -> Split:
    return lambda rows: ([r for r in rows if not test(r)], [r for r in rows if test(r)])


def every_other_size(rows: Rows) -> tuple[Rows, Rows]:
    sizes = sorted({r.size_bytes for r in rows})
    held = set(sizes[1::2])
    return [r for r in rows if r.size_bytes not in held], [r for r in rows if r.size_bytes in held]


A100 = ["azure_ndv4_a100_1node_all_reduce.tsv", "azure_ndv4_a100_16_32gpu_all_reduce.tsv"]
CASES: list[tuple[str, str, Sequence[str], Split]] = [
    ("2 and 4 GPUs on one node (fit: 8 GPUs, 16 and 32 GPUs)", "dgx-a100", A100, by(lambda r: r.gpus in (2, 4))),
    ("32 GPUs on 4 nodes (fit: 1 node, 16 GPUs on 2 nodes)", "dgx-a100", A100, by(lambda r: r.gpus == 32)),
    ("16 GPUs on 2 nodes (fit: 1 node, 32 GPUs on 4 nodes)", "dgx-a100", A100, by(lambda r: r.gpus == 16)),
    ("4 and 8 nodes of MI325X (fit: 1 and 2 nodes)", "mi325x", ["mi325x_roce_1to8node_ring_all_reduce_rccl.tsv"],
     by(lambda r: r.nodes >= 4)),
    ("A100 sizes between the fitted ones", "dgx-a100", A100, every_other_size),
    ("H200 sizes between the fitted ones", "hgx-h200", ["h200_nvlink4_8gpu_all_reduce_torchbench.tsv"],
     every_other_size),
    ("B200 sizes between the fitted ones", "dgx-b200", ["b200_nvlink5_8gpu_all_reduce_torchbench.tsv"],
     every_other_size),
    ("MI300X sizes between the fitted ones", "mi300x", ["mi300x_xgmi_8gpu_all_reduce_rccl.tsv"], every_other_size),
]


def pooled(summaries: list[dict[str, object]], rows: Rows, model: CollectiveModel) -> dict[str, object]:
    """One summary over all tables of a split (the rows of every table, as one)."""
    merged = [replace(r, table="all") for r in rows]
    return summarize(predict(model, merged))[0]


def cell(value: object) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"  # type: ignore[arg-type]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    args = p.parse_args()
    folder = os.path.join(args.shared, "reference", "hardware", "nccl-tests")
    print(f"busbw per size band: {ERROR_MEASURES} (at >= 1 MiB)")
    print(f"{'held out':<56} {'rows':>5} {'>=64KiB':>8} {'<64KiB':>8} {'max':>7}   {'fitted part':>8} {'<64KiB':>8}")
    for title, name, tables, split in CASES:
        profile = load_profile(name)
        fit_rows, held = split(read_tables([os.path.join(folder, t) for t in tables]))
        section = calibrate(profile, fit_rows)
        model = CollectiveModel(replace(profile, calibration={"parameters": section["parameters"]}))
        test, train = pooled([], held, model), pooled([], fit_rows, model)
        print(f"{title:<56} {len(held):>5} {cell(test['geomean_abs_error_ge_64KiB']):>8} "
              f"{cell(test['geomean_abs_error_lt_64KiB']):>8} {cell(test['max_abs_error_ge_1MiB']):>7}   "
              f"{cell(train['geomean_abs_error_ge_64KiB']):>8} {cell(train['geomean_abs_error_lt_64KiB']):>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
