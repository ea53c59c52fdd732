"""The collective model on machines no shipped profile was calibrated on: ``validate`` (no fitting) on the
published tables in benchmarks/data/unseen/, each with the shipped profile of its system.

    python benchmarks/unseen_validation.py [--set development|holdout|all|final|third] [--rows]

benchmarks/data/unseen/README.md says where every table comes from and which tables are the final hold-out (split
before the model was run on them). ``all`` is the first round's development and hold-out tables; ``final`` the second
round's hold-out; ``third`` the third round's, run once after the last model change of that round. Prints per table
the rows, the geomean |error| of busbw per size band and the largest error from 1 MiB up (error = predicted /
published - 1), then the same pooled over the set; ``--rows`` adds every row (published and predicted busbw, the chosen
algorithm and protocol).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from simulator.collectives.calibration import ERROR_MEASURES, Prediction, predict, read_table, summarize
from simulator.collectives.hardware import load_profile
from simulator.collectives.nccl import CollectiveModel

FOLDER = os.path.join(os.path.dirname(__file__), "data", "unseen")
# table -> (the shipped profile of its system, the set it belongs to)
TABLES = {
    "aws_p5_h100_2to32node_all_reduce.tsv": ("aws-p5-h100", "development"),
    "aws_p5_h100_2to32node_all_to_all.tsv": ("aws-p5-h100", "development"),
    "aws_p6_b200_4node_all_reduce_torchbench.tsv": ("aws-p6-b200", "holdout"),
    "azure_ndv4_a100_64_128gpu_all_reduce.tsv": ("azure-ndv4-a100", "development"),
    "gcp_a3high_h100_2node_all_gather.tsv": ("gcp-a3-high", "holdout"),
    "gcp_a3mega_h100_2node_all_reduce.tsv": ("gcp-a3-mega", "development"),
    "gcp_a3mega_h100_2node_all_gather.tsv": ("gcp-a3-mega", "development"),
    "gcp_a4_b200_roce_2node_all_reduce.tsv": ("gcp-a4-b200", "holdout"),
    "lambda_b200_ib_2node_all_reduce.tsv": ("dgx-b200", "development"),
    "mi300x_roce_2node_all_reduce_rccl.tsv": ("mi300x", "holdout"),
    "mi355x_pollara_2node_all_reduce_rccl.tsv": ("mi355x", "development"),
    "nebius_h100_ib_2node_all_reduce.tsv": ("hgx-h100", "holdout"),
    "oci_mi355x_pollara_1to4node_all_reduce_all_to_all_rccl.tsv": ("mi355x", "development"),
}
# The second round's final hold-out (benchmarks/data/unseen/README.md): collected and split off before the model was
# run on any of them, run once after the last model change. The first round's hold-out above has been looked at and
# is development data since.
FINAL_TABLES = {
    "aws_p4d_a100_2node_all_reduce.tsv": ("aws-p4d-a100", "final"),
    "lambda_h100_4gpu_1node_all_reduce.tsv": ("hgx-h100", "final"),
    "oci_a100_b4_2node_ring_all_reduce.tsv": ("oci-a100-b4", "final"),
    "oci_mi300x_2node_all_reduce_rccl.tsv": ("mi300x", "final"),
    "stanage_a100_4gpu_1node_all_reduce.tsv": ("dgx-a100", "final"),
}
# The third round's final hold-out (README.md): collected and split off before the model was run on any of them, run
# once after the last model change of the round. The second round's hold-out above is development data since.
THIRD_TABLES = {
    "aws_p4d_a100_1to4node_all_reduce_nccl299.tsv": ("aws-p4d-a100", "third"),
    "aws_p5_h100_2to32node_all_gather.tsv": ("aws-p5-h100", "third"),
    "aws_p6_b200_1node_4to8gpu_all_reduce_nvls.tsv": ("aws-p6-b200", "third"),
    "h200_1node_4to8gpu_all_reduce_nvls.tsv": ("hgx-h200", "third"),
    "oci_b300_1to2node_all_reduce_all_to_all.tsv": ("oci-b300", "third"),
}
SETS = ("development", "holdout", "all", "final", "third")
EVERY = {**TABLES, **FINAL_TABLES, **THIRD_TABLES}


def cell(value: object) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"  # type: ignore[arg-type]


def predictions(chosen: str) -> dict[str, list[Prediction]]:
    out = {}
    for table, (profile, which) in EVERY.items():
        if chosen == which or (chosen == "all" and which not in ("final", "third")):
            rows = read_table(os.path.join(FOLDER, table))
            out[table] = predict(CollectiveModel(load_profile(profile)), rows)
    return out


def line(name: str, profile: str, summary: dict[str, object]) -> str:
    return (f"{name:<60} {profile:<16} {summary['rows']:>5} {cell(summary['geomean_abs_error_ge_1MiB']):>8} "
            f"{cell(summary['geomean_abs_error_64KiB_1MiB']):>8} {cell(summary['geomean_abs_error_lt_64KiB']):>8} "
            f"{cell(summary['max_abs_error_ge_1MiB']):>10}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", choices=SETS, default="development", help="which tables (default: development)")
    p.add_argument("--rows", action="store_true", help="print every row")
    args = p.parse_args()
    found = predictions(args.set)
    print(f"{'table':<60} {'profile':<16} {'rows':>5} {'>=1MiB':>8} {'64K-1M':>8} {'<64KiB':>8} {'max>=1MiB':>10}")
    for table, preds in found.items():
        print(line(table, EVERY[table][0], summarize(preds)[0]))
        if args.rows:
            for q in preds:
                r = q.row
                print(f"    {r.collective:<14} {r.gpus:>4} GPUs {r.nodes:>3} nodes {r.size_bytes:>12} B  published "
                      f"{r.busbw_GBps:9.3f}  predicted {q.busbw_GBps:9.3f} GB/s  {100 * q.error:+7.1f}%  "
                      f"{q.algorithm}/{q.protocol}")
    pooled = [replace(q, row=replace(q.row, table="pooled")) for preds in found.values() for q in preds]
    print(line(f"pooled ({args.set})", "", summarize(pooled)[0]))
    print(f"({ERROR_MEASURES})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
