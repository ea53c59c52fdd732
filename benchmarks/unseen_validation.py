"""The collective model on machines no shipped profile was calibrated on: ``validate`` (no fitting) on the
published tables in benchmarks/data/unseen/, each with the shipped profile of its system.

    python benchmarks/unseen_validation.py

benchmarks/data/unseen/README.md says where every table comes from. Prints per table the geomean |error| of
busbw per size band and the largest error from 1 MiB up (error = predicted / published - 1).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from simulator.collectives.calibration import predict, read_table, summarize
from simulator.collectives.hardware import load_profile
from simulator.collectives.nccl import CollectiveModel

FOLDER = os.path.join(os.path.dirname(__file__), "data", "unseen")
# table -> the shipped profile of its system (the profile was not calibrated on it)
PROFILES = {
    "gcp_a3mega_h100_2node_all_reduce.tsv": "gcp-a3-mega",
}


def cell(value: object) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"  # type: ignore[arg-type]


def main() -> int:
    print(f"{'table':<44} {'profile':<14} {'rows':>5} {'>=1MiB':>8} {'64K-1M':>8} {'<64KiB':>8} {'max>=1MiB':>10}")
    for table, profile in PROFILES.items():
        rows = read_table(os.path.join(FOLDER, table))
        summary = summarize(predict(CollectiveModel(load_profile(profile)), rows))[0]
        print(f"{table:<44} {profile:<14} {len(rows):>5} {cell(summary['geomean_abs_error_ge_1MiB']):>8} "
              f"{cell(summary['geomean_abs_error_64KiB_1MiB']):>8} {cell(summary['geomean_abs_error_lt_64KiB']):>8} "
              f"{cell(summary['max_abs_error_ge_1MiB']):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
