"""Calibrate every shipped hardware profile on the published tables of its GPU/fabric class, in place.

    python benchmarks/calibrate_profiles.py [--shared ../shared]

Which tables calibrate which profile is listed below (and in each profile's assumptions). Where a profile's hardware
differs from the tables' (MI355X's xGMI links are faster than the MI300X/MI325X links the CDNA tables measured; the
A100 clusters other than Azure's have other networks), the fit runs on the profile of the measured machine
(``FITTED_AS``) and its parameters are written into the profile: efficiencies are fractions of the measured machine's
bounds (its links, its NICs behind its GPU-NIC path), so they carry to other links and NICs. The network stage's
efficiency is the transport's: it carries only to a profile of the same transport, others keep their transport's.
NCCL's all-to-all (``direct/Simple/intra``) is fitted on Megatron-Core's measured MoE dispatch exchanges
(benchmarks/data/moe_dispatch/, one node of 8 for the 8-GPU profiles) and on nccl-tests-style peaks of NVLink 5
machines (benchmarks/data/blackwell_nccl/: 8x B200 all-gather, reduce-scatter and all-to-all at 16 GiB; OCI's GB200,
GB300 NVL72 all-to-all). The GB200/GB300 NVL72 racks keep the 8x B200 fit of their other keys (no all-reduce,
all-gather or reduce-scatter table of a rack) and fit all-to-all on the rack's own exchanges.
The fit is deterministic: running this twice gives the same files. Prints the per-table residuals.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from simulator.calibrate import run
from simulator.collectives.calibration import calibrate, read_tables
from simulator.collectives.hardware import PROFILES_DIR, load_profile
from simulator.validate import format_summary
from workload.files import read_yaml

A100 = ["azure_ndv4_a100_1node_all_reduce.tsv", "azure_ndv4_a100_16_32gpu_all_reduce.tsv"]
MOE_DISPATCH = "benchmarks/data/moe_dispatch"  # repository tables (a path with a folder); the others are shared
H200 = ["h200_nvlink4_8gpu_all_reduce_torchbench.tsv", "h200_nvlink4_8gpu_16GiB_ar_ag_rs.tsv",
        f"{MOE_DISPATCH}/h100_all_to_all_ep8.tsv"]
B200 = ["b200_nvlink5_8gpu_all_reduce_torchbench.tsv"]
BLACKWELL = "benchmarks/data/blackwell_nccl"
B200_A2A = [f"{MOE_DISPATCH}/gb200_nvl72_all_to_all_ep8.tsv", f"{BLACKWELL}/b200_nvlink5_8gpu_16GiB_ag_rs_a2a.tsv"]
GB200_DISPATCH = [f"{MOE_DISPATCH}/gb200_nvl72_all_to_all_ep8.tsv",
                  f"{MOE_DISPATCH}/gb200_nvl72_all_to_all_ep16to64.tsv"]
CDNA = ["mi300x_xgmi_8gpu_all_reduce_rccl.tsv", "mi325x_roce_1to8node_ring_all_reduce_rccl.tsv"]
TABLES = {"dgx-a100": A100, "azure-ndv4-a100": A100, "aws-p4d-a100": A100, "oci-a100-b4": A100, "hgx-h100": H200,
          "gcp-a3-mega": H200, "gcp-a3-high": H200, "aws-p5-h100": H200, "hgx-h200": H200, "dgx-b200": B200 + B200_A2A,
          "aws-p6-b200": B200 + B200_A2A, "gcp-a4-b200": B200 + B200_A2A,
          "oci-b300": B200 + B200_A2A, "mi300x": CDNA, "mi325x": CDNA, "mi355x": CDNA}
# NVL72 racks: (the 8-GPU profile whose other keys they keep, its tables; the rack's own all-to-all tables)
RACKS = {name: ("dgx-b200", B200 + B200_A2A, [*GB200_DISPATCH, f"{BLACKWELL}/oci_{name[:5]}_nvl72_all_to_all.tsv"])
         for name in ("gb200-nvl72", "gb300-nvl72")}
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


def rack_section(name: str, table_path: Callable[[str], str]) -> dict[str, Any]:
    """A rack's calibration: its 8-GPU class's fit, with all-to-all fitted on the rack's own exchanges."""
    base, base_tables, own_tables = RACKS[name]
    priors = calibrate(load_profile(base), read_tables([table_path(t) for t in base_tables]))
    own = calibrate(load_profile(name), read_tables([table_path(t) for t in own_tables]))
    carried = {k: v for k, v in priors["parameters"].items() if k not in own["parameters"]}
    return {"method": f"{own['method']}; the other keys ({', '.join(carried)}) are {base}'s fit, carried to the "
                      f"rack (no all-reduce, all-gather or reduce-scatter table of this class)",
            "tables": own["tables"], "priors_from": {"profile": base, "tables": priors["tables"]},
            "parameters": {**carried, **own["parameters"]}, "fit": own["fit"],
            "residuals": own["residuals"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    args = p.parse_args()
    folder = os.path.join(args.shared, "reference", "hardware", "nccl-tests")
    repo = os.path.join(os.path.dirname(__file__), "..")

    def table_path(table: str) -> str:
        return os.path.join(repo, table) if "/" in table else os.path.join(folder, table)

    for name in RACKS:
        print(f"== {name}")
        section = rack_section(name, table_path)
        write_section(str(PROFILES_DIR / f"{name}.yml"), section)
        print("\n".join(format_summary(section["residuals"])))
    for name, tables in TABLES.items():
        path = str(PROFILES_DIR / f"{name}.yml")
        paths = [table_path(t) for t in tables]
        print(f"== {name}")
        stand_in = FITTED_AS.get(name)
        if stand_in is None:
            run(["--profile", path, "--tables", *paths, "-o", path], lambda m: print(m, file=sys.stderr))
            continue
        section = carried(calibrate(load_profile(stand_in), read_tables(paths)), stand_in, name)
        write_section(path, section)
        print("\n".join(format_summary(section["residuals"])))  # type: ignore[arg-type]
    return 0


def write_section(path: str, section: dict[str, Any]) -> None:
    data = read_yaml(path, "hardware profile")
    data["calibration"] = section
    with open(path, "w", encoding="utf-8") as f:
        f.write(yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=False))


if __name__ == "__main__":
    sys.exit(main())
