"""Calibrate every shipped hardware profile on the published tables of its GPU/fabric class, in place.

    python benchmarks/calibrate_profiles.py [--shared ../shared]

Which tables calibrate which profile is listed below (and in each profile's assumptions). The fit is
deterministic: running this twice gives the same files. Prints the per-table residuals.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from simulator.calibrate import run
from simulator.collectives.hardware import PROFILES_DIR

A100 = ["azure_ndv4_a100_1node_all_reduce.tsv", "azure_ndv4_a100_16_32gpu_all_reduce.tsv"]
H200 = ["h200_nvlink4_8gpu_all_reduce_torchbench.tsv", "h200_nvlink4_8gpu_16GiB_ar_ag_rs.tsv"]
B200 = ["b200_nvlink5_8gpu_all_reduce_torchbench.tsv"]
CDNA = ["mi300x_xgmi_8gpu_all_reduce_rccl.tsv", "mi325x_roce_1to8node_ring_all_reduce_rccl.tsv"]
TABLES = {"dgx-a100": A100, "azure-ndv4-a100": A100, "hgx-h100": H200, "gcp-a3-mega": H200, "aws-p5-h100": H200,
          "hgx-h200": H200,
          "dgx-b200": B200, "aws-p6-b200": B200, "mi300x": CDNA, "mi325x": CDNA, "mi355x": CDNA}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    args = p.parse_args()
    folder = os.path.join(args.shared, "reference", "hardware", "nccl-tests")
    for name, tables in TABLES.items():
        path = str(PROFILES_DIR / f"{name}.yml")
        print(f"== {name}")
        run(["--profile", path, "--tables", *[os.path.join(folder, t) for t in tables], "-o", path],
            lambda m: print(m, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
