"""``astrasim-py calibrate``: fit a hardware profile's collective timing parameters on published measurements.

    astrasim-py calibrate --profile hgx-h200 --tables h200_a.tsv h200_b.tsv -o my-h200.yml

Least squares on log time per algorithm/protocol/scope (the library's choice for each row), with the library's
constants as priors; deterministic. The output is the profile with its ``calibration`` section replaced: the
fitted parameters, the tables, the fit per key and the residuals per table (see ``astrasim-py validate``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import yaml

from simulator.collectives.calibration import calibrate, check_fits, read_tables
from simulator.collectives.hardware import load_profile
from simulator.validate import format_summary
from workload.files import read_yaml

PROG = "astrasim-py calibrate"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Fit a hardware profile's collective timing parameters "
                                "(least squares on log time, library constants as priors) on nccl-tests tables.")
    p.add_argument("--profile", required=True, help="hardware profile: a shipped name or a .yml file")
    p.add_argument("--tables", required=True, nargs="+", help="TSV tables (system, collective, gpus, nodes, bytes, "
                                                              "busbw_GBps, source_url, algo)")
    p.add_argument("-o", "--out", required=True, help="the calibrated profile to write (.yml)")
    return p


def run(argv: list[str], warn: Callable[[str], None]) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    profile = load_profile(args.profile)
    rows = read_tables(args.tables)
    check_fits(rows, profile)
    section = calibrate(profile, rows)
    data = read_yaml(profile.path, "hardware profile")
    data["calibration"] = section
    text = yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=False)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print("\n".join(format_summary(section["residuals"])))  # type: ignore[arg-type]
    print(f"{args.out}: {len(section['parameters'])} calibrated key(s) from {len(rows)} rows "  # type: ignore[arg-type]
          f"in {time.perf_counter() - started:.1f} s")
    return 0
