"""The device-level knobs of the kernel compute model fitted to whole training steps, with a hold-out by source.

    python benchmarks/training_calibration.py --from-json RUN.json [--verify]
    python benchmarks/training_calibration.py --from-json RUN.json --uniform B200,GB200 [--write]

RUN.json is a run of benchmarks/training_validation.py (``--save``) with the shipped device files. Parameters
(physically meaningful, per device, never per row): ``kernels.efficiency_scale`` of GEMMs, attention and
memory-bound kernels (what the kernel data's fit misses in a training run: clocks under power limits, fused
epilogues, framework kernels slower than the benchmarked ones) and ``kernels.launch_overhead_us`` (the gap a host
leaves between kernels). A step is modelled from its simulated breakdown on the slowest rank: each class's kernel
time scales with 1 / its family's efficiency scale, every kernel gains the gap, the bubble scales with the compute
(it is made of other stages' compute), exposed communication stays. Least squares on log step time over the rows,
Gauss-Newton from the shipped values, with a Gaussian prior pulling every knob to its shipped value (the kernel
data's fit: 1, 0 us) - deterministic, no random start.

Hold-out: leave one source out (fit on the other sources' rows, predict that source's), so every row's held-out
error comes from a fit that never saw its source. ``--verify`` simulates every row again with the all-rows fit
(the surrogate's numbers are only an estimate).

``--uniform DEVICES`` fits what is shipped: one factor per named device on all its kernels' efficiencies (a
sustained clock, as a power-limited GPU runs a training step below its kernel benchmarks), with the same prior
and row scatter, for devices whose GEMM efficiency rests on best-case matmuls only; it prints the rows fitted and
the error when each model family is left out, and ``--write`` records the factor in the device file
(``kernels.efficiency_scale`` and its ``training_calibration`` section). RUN.json must come from a run with the
factors neutral (1) for the devices fitted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.training_validation import error_lines, moe, row_lines, tables
from compute.devices import DEVICES_DIR, device

FAMILY_OF_CLASS = {"matmul": "gemm", "attention": "attention", "elementwise": "memory", "optimizer": "memory"}
FAMILIES = ("gemm", "attention", "memory")
FP8 = "fp8_gemm"
GAP = "launch_overhead_us"
PRIOR_SD = {"gemm": 0.15, FP8: 0.15, "attention": 0.25, "memory": 0.25, GAP: 4.0}  # 1/scale - 1 and us: what the
# kernel data allows (its GEMM fit is within ~10-15% of measured kernels; attention and memory kernels vary more)
ROW_SD = 0.05  # how far a published row may sit from the model for reasons no knob explains (run-to-run, setup)


def simulated(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "simulated" and r.get("breakdown")]


def fp8(r: dict[str, Any]) -> bool:
    return r["generator"].get("precision") == "fp8"


KNOBS = [*FAMILIES, GAP, FP8]  # the knobs fitted (--knobs narrows them)


def parameters(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(device, knob) for every device with rows: three inverse efficiency scales, the launch gap, and the FP8 GEMM
    scale where the device has FP8 rows."""
    out = []
    for d in sorted({r["device"] for r in rows}):
        has_fp8 = any(fp8(r) for r in rows if r["device"] == d)
        out += [(d, k) for k in KNOBS if k != FP8 or has_fp8]
    return out


def features(r: dict[str, Any]) -> tuple[dict[str, float], float, float, float]:
    """(kernel ns by family, kernels, amplification of compute by the bubble, exposed ns) on the slowest rank."""
    b = r["breakdown"]
    by_family = dict.fromkeys(FAMILIES, 0.0)
    for cls, ns in b["compute_ns_by_class"].items():
        by_family[FAMILY_OF_CLASS.get(cls, "memory")] += ns
    kernels = float(sum(b.get("kernels_by_class", {}).values()))
    busy = b["compute_busy_ns"] or 1
    return by_family, kernels, (busy + b["bubble_ns"]) / busy, float(b["exposed_collectives_ns"])


def predict_ns(r: dict[str, Any], theta: dict[tuple[str, str], float]) -> float:
    """The step with knobs ``theta`` (inverse efficiency scales; gap in us)."""
    by_family, kernels, amplify, exposed = features(r)
    d = r["device"]
    compute = sum(ns * theta.get((d, f), 1.0) for f, ns in by_family.items())
    if fp8(r):
        compute += by_family["gemm"] * theta.get((d, "gemm"), 1.0) * (theta.get((d, FP8), 1.0) - 1)
    compute += kernels * theta.get((d, GAP), 0.0) * 1e3
    return amplify * compute + exposed


def fit(rows: Sequence[dict[str, Any]], params: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Gauss-Newton on log(predicted / published) with the prior as extra residuals; the model is linear in the
    knobs, so a few steps converge; knobs stay where they mean something (scale <= 4, gap >= 0)."""
    prior = {p: (0.0 if p[1] == GAP else 1.0) for p in params}
    theta = dict(prior)
    index = {p: i for i, p in enumerate(params)}
    for _ in range(20):
        jac, res = [], []
        for r in rows:
            by_family, kernels, amplify, _ = features(r)
            pred = predict_ns(r, theta)
            row = np.zeros(len(params))
            x8 = theta.get((r["device"], FP8), 1.0) if fp8(r) else 1.0
            for f, ns in by_family.items():
                if (r["device"], f) in index:
                    row[index[r["device"], f]] = amplify * ns * (x8 if f == "gemm" else 1.0) / pred
            if fp8(r) and (r["device"], FP8) in index:
                x = theta.get((r["device"], "gemm"), 1.0)
                row[index[r["device"], FP8]] = amplify * by_family["gemm"] * x / pred
            if (r["device"], GAP) in index:
                row[index[r["device"], GAP]] = amplify * kernels * 1e3 / pred
            jac.append(row / ROW_SD)
            res.append(math.log(pred / (r["published_step_time_s"] * 1e9)) / ROW_SD)
        for p, i in index.items():
            row = np.zeros(len(params))
            row[i] = 1.0 / PRIOR_SD[p[1]]
            jac.append(row)
            res.append((theta[p] - prior[p]) / PRIOR_SD[p[1]])
        step, *_ = np.linalg.lstsq(np.array(jac), -np.array(res), rcond=None)
        for p, i in index.items():
            low, high = (0.0, 50.0) if p[1] == GAP else (0.25, 4.0)
            theta[p] = min(high, max(low, theta[p] + float(step[i])))
        if float(np.max(np.abs(step))) < 1e-9:
            break
    return theta


def errors(rows: Sequence[dict[str, Any]], theta: dict[tuple[str, str], float]) -> dict[str, float]:
    return {r["row_id"]: predict_ns(r, theta) / (r["published_step_time_s"] * 1e9) - 1 for r in rows}


def exposed_share(r: dict[str, Any]) -> float:
    b = r["breakdown"]
    return b["exposed_collectives_ns"] / (b["step_ns"] or 1)


def leave_one_source_out(rows: Sequence[dict[str, Any]], fit_rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Every row predicted by a fit on ``fit_rows`` of the other sources."""
    held: dict[str, float] = {}
    for source in sorted({r["source_id"] for r in rows}):
        train = [r for r in fit_rows if r["source_id"] != source]
        theta = fit(train, parameters(train))
        held.update(errors([r for r in rows if r["source_id"] == source], theta))
    return held


def summary(rows: Sequence[dict[str, Any]], errs: dict[str, float], label: str) -> list[str]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["source_id"], []).append(errs[r["row_id"]])
    groups["all"] = [errs[r["row_id"]] for r in rows]
    return [f"  {label:<9} {name:<22} {len(e):>3} rows  mean|err| {sum(map(abs, e)) / len(e):6.1%}  max|err| "
            f"{max(map(abs, e)):6.1%}  mean {sum(e) / len(e):+6.1%}" for name, e in groups.items()]


def knobs(theta: dict[tuple[str, str], float]) -> dict[str, dict[str, Any]]:
    """Per device: the knobs as a device file writes them (efficiency scales, not their inverses)."""
    out: dict[str, dict[str, Any]] = {}
    for (d, k), v in sorted(theta.items()):
        entry = out.setdefault(d, {"efficiency_scale": {}, GAP: 0.0})
        if k == GAP:
            entry[GAP] = round(v, 2)
        else:
            entry["efficiency_scale"][k] = round(1.0 / v, 4)
    return out


def device_file(name: str, values: dict[str, Any], folder: str) -> str:
    """A copy of the shipped device file ``name`` with the knobs set."""
    path = DEVICES_DIR / f"{''.join(c for c in device(name).name.lower() if c.isalnum())}.yml"
    data = yaml.safe_load(path.read_text())
    data["kernels"][GAP] = values[GAP]
    data["kernels"]["efficiency_scale"] = dict(values["efficiency_scale"])
    out = Path(folder) / path.name
    out.write_text(yaml.safe_dump(data, sort_keys=False, width=120))
    return str(out)


def uniform_fit(rows: Sequence[dict[str, Any]], devices: Sequence[str]) -> dict[str, float]:
    """Per device in ``devices``: the factor on its kernel times (1 / efficiency scale) that best fits ``rows``."""
    out = {}
    for d in devices:
        mine = [r for r in rows if r["device"] == d]
        x = 1.0
        for _ in range(50):  # Gauss-Newton on log(predicted / published), prior x = 1
            num, den = (x - 1) / PRIOR_SD["gemm"] ** 2, 1 / PRIOR_SD["gemm"] ** 2
            for r in mine:
                by_family, _, amplify, exposed = features(r)
                compute = amplify * sum(by_family.values())
                pred = compute * x + exposed
                jac = compute / pred / ROW_SD
                num += jac * math.log(pred / (r["published_step_time_s"] * 1e9)) / ROW_SD
                den += jac * jac
            step = -num / den
            x += step
            if abs(step) < 1e-12:
                break
        out[d] = x
    return out


def uniform_errors(rows: Sequence[dict[str, Any]], factors: dict[str, float]) -> dict[str, float]:
    return errors(rows, {(d, f): x for d, x in factors.items() for f in FAMILIES})


def model_family(r: dict[str, Any]) -> str:
    """The model a row trains, without size suffixes' punctuation (Llama 3 8B and 70B are different models)."""
    return "".join(c for c in str(r["model"]).lower() if c.isalnum())


def leave_one_model_out(rows: Sequence[dict[str, Any]], devices: Sequence[str]) -> dict[str, float]:
    held: dict[str, float] = {}
    for model in sorted({model_family(r) for r in rows}):
        factors = uniform_fit([r for r in rows if model_family(r) != model], devices)
        held.update(uniform_errors([r for r in rows if model_family(r) == model], factors))
    return held


def write_uniform(device_name: str, factor: float, rows: Sequence[dict[str, Any]], fitted: dict[str, float],
                  held: dict[str, float]) -> str:
    """Record ``factor`` in the device file: efficiency scales 1 / factor, and where they come from."""
    from benchmarks.fit_kernel_model import dump

    path = DEVICES_DIR / f"{''.join(c for c in device(device_name).name.lower() if c.isalnum())}.yml"
    data = yaml.safe_load(path.read_text())
    scale = round(1.0 / factor, 4)
    data["kernels"]["efficiency_scale"] = {**data["kernels"]["efficiency_scale"], **dict.fromkeys(FAMILIES, scale)}
    mine = [r for r in rows if r["device"] == device_name]
    data["training_calibration"] = {
        "efficiency_scale": scale,
        "method": "one factor on every kernel's efficiency (a sustained clock below the kernel benchmarks'), least "
                  "squares on log step time with a prior at 1 (sd 0.15) and rows at sd 0.05 "
                  "(benchmarks/training_calibration.py --uniform)",
        "rows": [r["row_id"] for r in mine],
        "why": "the kernel data hold only best-case matmuls for this device's GEMMs (no training shapes)",
        "mean_abs_error": {"before": round(sum(abs(r["step_time_error"]) for r in mine) / len(mine), 4),
                           "fitted": round(sum(abs(fitted[r["row_id"]]) for r in mine) / len(mine), 4),
                           "each_model_left_out": round(sum(abs(held[r["row_id"]]) for r in mine) / len(mine), 4)},
    }
    path.write_text(dump(data))
    return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from-json", required=True, nargs="+", metavar="RUN.json")
    p.add_argument("--verify", action="store_true", help="simulate every row again with the all-rows fit")
    p.add_argument("--save", metavar="FILE.json", help="keep the verifying run")
    p.add_argument("--shared", default=str(Path(__file__).resolve().parent.parent.parent / "shared"))
    p.add_argument("--knobs", help=f"comma-separated subset of {','.join(KNOBS)} to fit (default: all)")
    p.add_argument("--uniform", metavar="DEVICES", help="fit one factor per device on all its kernels (comma-separated "
                                                       "device names) instead of the per-family knobs")
    p.add_argument("--write", action="store_true", help="with --uniform: record the factors in configs/devices")
    p.add_argument("--max-exposed", type=float, default=1.0,
                   help="fit only rows whose exposed communication is at most this share of the step (default 1)")
    args = p.parse_args(argv)
    if args.knobs:
        KNOBS[:] = [k for k in args.knobs.split(",") if k in KNOBS]
    every = simulated([r for f in args.from_json for r in json.loads(Path(f).read_text())["rows"]])
    rows = [r for r in every if not moe(r)]
    fit_rows = [r for r in rows if exposed_share(r) <= args.max_exposed]
    print(f"{len(rows)} dense-model rows ({len(every) - len(rows)} mixture-of-experts rows left out: their error is "
          "not a device property, see the report)")
    if args.uniform:
        devices = [device(d).name for d in args.uniform.split(",")]
        factors = uniform_fit(fit_rows, devices)
        fitted, held = uniform_errors(rows, factors), leave_one_model_out(fit_rows, devices)
        mine = [r for r in rows if r["device"] in devices]
        print("efficiency scale per device: " + ", ".join(f"{d} {1 / x:.4f}" for d, x in factors.items()))
        print("\n".join(summary(mine, errors(mine, {}), "shipped")))
        print("\n".join(summary(mine, fitted, "fitted")))
        print("\n".join(summary(mine, held, "model out")))
        if args.write:
            for d, x in factors.items():
                print("wrote", write_uniform(d, x, rows, fitted, held))
        return 0
    theta = fit(fit_rows, parameters(fit_rows))
    print(f"fitted knobs ({len(fit_rows)} rows with exposed communication <= {args.max_exposed:.0%} of the step):")
    for d, values in knobs(theta).items():
        print(f"  {d}: efficiency_scale {values['efficiency_scale']}, launch_overhead_us {values[GAP]}")
    base = errors(rows, {})
    print("step-time error (surrogate of the simulated breakdown):")
    print("\n".join(summary(rows, base, "shipped")))
    print("\n".join(summary(rows, errors(rows, theta), "fitted")))
    print("\n".join(summary(rows, leave_one_source_out(rows, fit_rows), "held out")))
    if args.verify:
        from simulator.tools.training_table import read_tables
        from simulator.tools.validate_training import evaluate_rows


        ids = {r["row_id"] for r in rows}
        chosen = [r for r in read_tables(tables(Path(args.shared))) if r.row_id in ids]
        with tempfile.TemporaryDirectory() as folder:
            files = {d: device_file(d, v, folder) for d, v in knobs(theta).items()}
            again = evaluate_rows(chosen, devices=files, quiet=False, time_limit_s=600)
        print("simulated again with the all-rows fit:")
        print("\n".join(row_lines(again)))
        print("\n".join(error_lines(again)))
        if args.save:
            Path(args.save).write_text(json.dumps({"rows": again, "knobs": knobs(theta)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
