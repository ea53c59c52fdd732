"""Calibrate every shipped hardware profile on the published tables of its GPU/fabric class, in place.

    python benchmarks/calibrate_profiles.py [--shared ../shared]

Which tables calibrate which profile is listed below (and in each profile's assumptions). Where a profile's hardware
differs from the tables' (MI355X's xGMI links are faster than the MI300X/MI325X links the CDNA tables measured; the
A100 clusters other than Azure's have other networks), the fit runs on the profile of the measured machine
(``FITTED_AS``) and its parameters are written into the profile: efficiencies are fractions of the measured machine's
bounds (its links, its NICs behind its GPU-NIC path), so they carry to other links and NICs. The network stage's
efficiency is the transport's: it carries only to a profile of the same transport, others keep their transport's.
The fit is deterministic: running this twice gives the same files. Prints the per-table residuals.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from simulator.calibrate import run
from simulator.collectives.calibration import calibrate, read_tables
from simulator.collectives.hardware import PROFILES_DIR, load_profile
from simulator.validate import format_summary
from workload.files import read_yaml

A100 = ["azure_ndv4_a100_1node_all_reduce.tsv", "azure_ndv4_a100_16_32gpu_all_reduce.tsv"]
H200 = ["h200_nvlink4_8gpu_all_reduce_torchbench.tsv", "h200_nvlink4_8gpu_16GiB_ar_ag_rs.tsv"]
B200 = ["b200_nvlink5_8gpu_all_reduce_torchbench.tsv"]
CDNA = ["mi300x_xgmi_8gpu_all_reduce_rccl.tsv", "mi325x_roce_1to8node_ring_all_reduce_rccl.tsv"]
TABLES = {"dgx-a100": A100, "azure-ndv4-a100": A100, "aws-p4d-a100": A100, "oci-a100-b4": A100, "hgx-h100": H200,
          "gcp-a3-mega": H200, "gcp-a3-high": H200, "aws-p5-h100": H200, "hgx-h200": H200, "dgx-b200": B200,
          "aws-p6-b200": B200, "gcp-a4-b200": B200, "oci-b300": B200, "mi300x": CDNA, "mi325x": CDNA, "mi355x": CDNA}
# profile -> the profile of the machine its tables measured
FITTED_AS = {"mi355x": "mi325x", "dgx-a100": "azure-ndv4-a100", "aws-p4d-a100": "azure-ndv4-a100",
             "oci-a100-b4": "azure-ndv4-a100"}


def carried(section: dict[str, Any], measured: str, target: str) -> dict[str, Any]:
    """The calibration of the measured machine as it carries to ``target``: without the network stage's efficiency
    (multi-node Simple keys) where the two transports differ."""
    here, there = load_profile(measured).scale_out, load_profile(target).scale_out
    section = {**section, "method": f"{section['method']}; fitted with the {measured} profile (the measured "
                                    "machine)"}
    if here is None or there is None or here.transport == there.transport:
        return section
    parameters = {}
    for key, values in section["parameters"].items():
        if "/Simple/inter" in key:
            values = {k: v for k, v in values.items() if k != "efficiency"}
        parameters[key] = values
    section["method"] += f"; network stage at the {there.transport} transport's efficiency"
    return {**section, "parameters": parameters}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    args = p.parse_args()
    folder = os.path.join(args.shared, "reference", "hardware", "nccl-tests")
    for name, tables in TABLES.items():
        path = str(PROFILES_DIR / f"{name}.yml")
        paths = [os.path.join(folder, t) for t in tables]
        print(f"== {name}")
        stand_in = FITTED_AS.get(name)
        if stand_in is None:
            run(["--profile", path, "--tables", *paths, "-o", path], lambda m: print(m, file=sys.stderr))
            continue
        section = carried(calibrate(load_profile(stand_in), read_tables(paths)), stand_in, name)
        data = read_yaml(path, "hardware profile")
        data["calibration"] = section
        with open(path, "w", encoding="utf-8") as f:
            f.write(yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=False))
        print("\n".join(format_summary(section["residuals"])))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
