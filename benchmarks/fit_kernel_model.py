"""Fit the kernel compute model to the kernel measurements in benchmarks/data/kernels/ and rewrite the ``kernels``
and ``calibration`` sections of every shipped device file (configs/devices/*.yml).

    python benchmarks/fit_kernel_model.py [--check]

``--check`` fits and compares without writing: exit status 1 if a device file differs from the fit (the files are
what this script writes; the test suite runs the same comparison on the fitted values).

Devices with their own GEMM and memory-bound tables (A100, H100) are fitted on them; attention is fitted jointly
on every FlashAttention/cuDNN row (an efficiency per device and kernel, the head-dim, per-tile and backward terms
shared). The others take the fitted shape terms of a measured device of the same kind and fit only what their
own rows determine: H200 is H100's silicon with faster memory (no fit; its rows check it); B200, B300, GB200 and
the AMD devices fit their GEMM efficiency (and the NVIDIA ones their FP8 efficiency) to their maximum-achievable-
matmul rows, and their attention efficiency follows their GEMM efficiency in proportion; GB300 takes B300's fit
(the same Blackwell Ultra GPU, no measurements of its own). TPUs have no kernel data: H100's values, marked assumed.
The quantization class (Transformer Engine's casts of low-precision GEMM operands) is fitted once on the B200 and
GB200 cast rows (torchao's MXFP8 and NVFP4 kernels) for every Blackwell GPU.

Maximum-achievable-matmul rows are the best shape of a search, a ceiling: the H100 curve (fitted on typical shapes)
predicts H100's BF16 ceiling some percent slow, and every device fitted on its ceiling rows is fitted to that same
relation (its rows' times scaled by H100's BF16 ceiling error), so a device is not made faster than H100 relative
to its own ceiling only because its data are ceilings. FP8 GEMMs are those of cuBLAS (what Transformer Engine
runs, and what the ceiling rows measure): H100's FP8 efficiency is fitted the same way on its cuBLAS FP8 row;
DeepGEMM's fine-grained-scaling kernels (deepgemm_fp8.tsv) shape the H100 curve and their own FP8 efficiency is
recorded under fitted as fp8_deepgemm. FP4 (NVFP4) has no kernel measurements: a device with FP4 math takes its
FP8 efficiency relative to the FP4 peak (an assumption every such device file states).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from compute.devices import DEVICES_DIR, Device, device, load_device_file  # noqa: E402
from compute.kernel_data import SOURCES, Measurement, errors, read_tables, summarize  # noqa: E402
from compute.kernel_fit import ANALOGUES, fit_attention, fit_gemm, fit_memory, round4, with_params  # noqa: E402
from compute.kernel_params import GemmParams  # noqa: E402
from compute.kernels import KernelModel  # noqa: E402

MEASURED = ("A100", "H100")
PRODUCTION_ATTENTION = {"A100": "fa2", "H100": "cudnn"}  # what Megatron-Core/Transformer Engine runs there
DERIVED = {"H200": ("H100", ()), "H200NVL": ("H100", ()),
           "B200": ("H100", ("efficiency", "fp8")), "B300": ("H100", ("efficiency", "fp8")),
           "GB200": ("H100", ("efficiency", "fp8")), "MI300X": ("H100", ("efficiency",)),
           "MI325X": ("H100", ("efficiency",)), "MI355X": ("H100", ("efficiency",))}
# Quantization kernels (Transformer Engine's casts): measured on B200 and GB200 (the same HBM3e at 8,000 GB/s), fitted
# once for the Blackwell GPUs; the others take the class they work like (kernel_fit.ANALOGUES).
QUANTIZE_FAMILY = ("B200", "B300", "GB200", "GB300")
QUANTIZE = ("quantize", "quantize_fp4")
SAME_GPU = {"GB300": "B300"}  # no measurements of its own: the named device's fit, on its own peaks
# Tables read and checked against, not yet fitted on
PENDING = ("cudnn_sdpa.tsv", "cudnn_norm.tsv", "te_gemm_profiling.tsv")
CEILING_TABLE = "mamf.tsv"  # best-shape-of-a-search rows: see the module docstring
CUBLAS_FP8_TABLES = ("mamf.tsv",)  # FP8 GEMMs as cuBLAS (and so Transformer Engine) runs them
ASSUMED = {"TPUv4": "H100", "TPUv5p": "H100"}
METHOD = ("least squares on log time, Levenberg-Marquardt from a fixed start (compute/kernel_fit.py, "
          "benchmarks/fit_kernel_model.py)")


def by_device(rows: list[Measurement]) -> dict[str, list[Measurement]]:
    out: dict[str, list[Measurement]] = {}
    for m in rows:
        out.setdefault(device(m.device).name, []).append(m)
    return out


def fit_all(rows: list[Measurement]) -> dict[str, tuple[Device, dict[str, Any]]]:
    """Every shipped device with fitted parameters, and its calibration section."""
    shipped = {d.name: load_device_file(str(DEVICES_DIR / f"{d.name.lower()}.yml")) for d in map(device, _names())}
    rows_of = by_device(rows)
    fitted: dict[str, Device] = {}
    deepgemm_fp8: dict[str, float] = {}
    for name in MEASURED:
        d = shipped[name]
        own = rows_of[name]
        gemm = fit_gemm(d, [m for m in own if m.family == "gemm"])
        memory = fit_memory(d, [m for m in own if m.family == "memory"])
        fitted[name] = with_params(d, replace(d.kernels, gemm=gemm, memory=memory))
    bias = ceiling_error(fitted["H100"], rows_of["H100"])
    for name in MEASURED:
        cublas = [m for m in rows_of[name] if m.table in CUBLAS_FP8_TABLES and m.shapes[0].dtype == "fp8"]
        if cublas and fitted[name].has("fp8"):
            d = fitted[name]
            deepgemm_fp8[name] = d.kernels.gemm.dtype_efficiency["fp8"]
            gemm = fit_gemm(d, scaled(cublas, bias), ("fp8",))
            fitted[name] = with_params(d, replace(d.kernels, gemm=gemm))
    groups = {(name, m.kernel): (fitted[name], []) for name in MEASURED for m in rows_of[name]
              if m.family == "attention"}
    for name in MEASURED:
        for m in rows_of[name]:
            if m.family == "attention":
                groups[name, m.kernel][1].append(m)
    efficiencies, shared = fit_attention(groups, fitted["H100"].kernels.attention)
    kernel_eff: dict[str, dict[str, float]] = {}
    for (name, kernel), eff in efficiencies.items():
        kernel_eff.setdefault(name, {})[kernel] = eff
    for name in MEASURED:
        d = fitted[name]
        attention = replace(shared, efficiency=kernel_eff[name][PRODUCTION_ATTENTION[name]],
                            launch_us=d.kernels.gemm.launch_us)
        fitted[name] = with_params(d, replace(d.kernels, attention=attention))
    out: dict[str, tuple[Device, dict[str, Any]]] = {}
    for name in MEASURED:
        cal = _calibration(fitted[name], rows_of[name], "fitted", None, kernel_eff[name])
        if name in deepgemm_fp8:
            cal["fitted"]["gemm"]["fp8_deepgemm"] = deepgemm_fp8[name]
        out[name] = (fitted[name], cal)
    for name, (source, free) in DERIVED.items():
        d = _derive(shipped[name], fitted[source], rows_of.get(name, []), free, bias)
        out[name] = (d, _calibration(d, rows_of.get(name, []), "derived" if free else "derived (no fit)", source,
                                     None, free, bias))
    for name, source in SAME_GPU.items():
        d = _derive(shipped[name], out[source][0], [], ())
        out[name] = (d, _calibration(d, [], "derived (no fit)", source, None))
    quantize = [m for name in QUANTIZE_FAMILY for m in rows_of.get(name, []) if m.family == "memory"
                and m.shapes[0].op_class == "quantize"]
    if quantize:
        fitted_q = fit_memory(out[QUANTIZE_FAMILY[0]][0], quantize)
        for name in QUANTIZE_FAMILY:
            d, cal = out[name]
            m = d.kernels.memory
            memory = replace(m, launch_us={**m.launch_us, **{c: fitted_q.launch_us[c] for c in QUANTIZE}},
                             efficiency={**m.efficiency, **{c: fitted_q.efficiency[c] for c in QUANTIZE}})
            d = with_params(d, replace(d.kernels, memory=memory))
            out[name] = (d, _with_quantize(d, cal, quantize))
    for name, source in ASSUMED.items():
        d = _derive(shipped[name], fitted[source], [], ())
        out[name] = (d, _calibration(d, [], "assumed", source, None))
    return out


def _names() -> list[str]:
    return [*MEASURED, *DERIVED, *SAME_GPU, *ASSUMED]


def ceiling_error(d: Device, rows: list[Measurement]) -> float:
    """The model's error on ``d``'s BF16 ceiling row(s) (mean of predicted / measured - 1)."""
    ceiling = [m for m in rows if m.table == CEILING_TABLE and m.shapes[0].dtype == "bf16"]
    return round4(float(errors(KernelModel(d), ceiling).mean())) if ceiling else 0.0


def scaled(rows: list[Measurement], error: float) -> list[Measurement]:
    """Ceiling rows with their times scaled by 1 + ``error``: the targets of a ceiling-relative fit."""
    return [replace(m, time_us=m.time_us * (1 + error)) if m.table == CEILING_TABLE else m for m in rows]


def _with_fp4(d: Device, gemm: GemmParams) -> GemmParams:
    """FP4 (no kernel measurements) at the FP8 efficiency relative to its own peak, where the device has FP4."""
    eff = dict(gemm.dtype_efficiency)
    if d.has("fp4") and "fp8" in eff:
        eff["fp4"] = eff["fp8"]
    return replace(gemm, dtype_efficiency=eff)


def _derive(target: Device, source: Device, rows: list[Measurement], free: tuple[str, ...], bias: float = 0.0
            ) -> Device:
    """``target`` with ``source``'s fitted terms (its own tile shapes kept), then what its rows determine (ceiling
    rows fitted to ``bias``, the reference device's error on its own ceiling)."""
    sg = source.kernels.gemm
    tiles = tuple((r, c, sg.tiles[i][2] if i < len(sg.tiles) else rel)
                  for i, (r, c, rel) in enumerate(target.kernels.gemm.tiles))
    gemm = replace(sg, tiles=tiles, dtype_efficiency={k: v for k, v in sg.dtype_efficiency.items() if target.has(k)})
    d = with_params(target, replace(target.kernels, gemm=gemm, memory=source.kernels.memory))
    gemm_rows = [m for m in rows if m.family == "gemm" and m.table not in PENDING]
    if free and gemm_rows:
        gemm = fit_gemm(d, scaled(gemm_rows, bias), free)
    gemm = _with_fp4(target, gemm)
    ratio = gemm.efficiency / sg.efficiency
    attention = replace(source.kernels.attention, efficiency=round4(min(0.95, source.kernels.attention.efficiency
                                                                        * ratio)), launch_us=gemm.launch_us)
    return with_params(d, replace(d.kernels, gemm=gemm, attention=attention))


def _with_quantize(d: Device, cal: dict[str, Any], rows: list[Measurement]) -> dict[str, Any]:
    """``cal`` with the Blackwell quantization-kernel fit: its data, fitted values, assumption and residuals."""
    tables: dict[tuple[str, str], int] = {}
    for m in rows:
        tables[m.table, m.source_id] = tables.get((m.table, m.source_id), 0) + 1
    data = [x for x in cal["data"] if not str(x["table"]).startswith("torchao")]
    cal["data"] = data + [{"table": t, "rows": n, "source": SOURCES[s][0], "url": SOURCES[s][1],
                           "licence": SOURCES[s][2]} for (t, s), n in sorted(tables.items())]
    cal.setdefault("fitted", {})["memory"] = {c: {"efficiency": d.kernels.memory.efficiency[c],
                                                  "launch_us": d.kernels.memory.launch_us[c]} for c in QUANTIZE}
    cal["assumptions"] = [a for a in cal["assumptions"] if not a.startswith("memory-bound quantize")] + [
        f"quantization kernels (FP8/MXFP8 casts, NVFP4 quantization): an efficiency and a launch each, fitted on "
        f"{', '.join(QUANTIZE_FAMILY[::2])} rows for {', '.join(QUANTIZE_FAMILY)}; torchao's kernels stand in for "
        "Transformer Engine's"]
    residual = {k: v for k, v in cal["residuals"].items() if not k.startswith("torchao")}
    cal["residuals"] = residual | residuals(d, rows, None)
    return cal


def _calibration(d: Device, rows: list[Measurement], status: str, source: str | None,
                 kernel_eff: dict[str, float] | None, free: tuple[str, ...] = (), bias: float = 0.0
                 ) -> dict[str, Any]:
    k = d.kernels.to_dict()
    cal: dict[str, Any] = {"status": status, "method": METHOD}
    if source:
        cal["derived_from"] = source
    if kernel_eff:
        cal["attention_kernel"] = PRODUCTION_ATTENTION[d.name]
    tables: dict[tuple[str, str], int] = {}
    for m in rows:
        tables[m.table, m.source_id] = tables.get((m.table, m.source_id), 0) + 1
    cal["data"] = [{"table": t, "rows": n, "source": SOURCES[s][0], "url": SOURCES[s][1], "licence": SOURCES[s][2]}
                   for (t, s), n in sorted(tables.items())]
    if status == "fitted":
        cal["fitted"] = {"gemm": {key: v for key, v in k["gemm"].items() if key != "tiles"} | {
                             "tile_efficiency": [t[2] for t in d.kernels.gemm.tiles]},
                         "attention": {"kernel_efficiency": kernel_eff,
                                       **{key: k["attention"][key] for key in ("head_dim_half", "tile_overhead",
                                                                                 "backward_efficiency")}},
                         "memory": k["memory"]}
    elif free:
        cal["fitted"] = {"gemm": {key: (k["gemm"]["dtype_efficiency"].get("fp8") if key == "fp8" else k["gemm"][key])
                                  for key in free}}
    cal["assumptions"] = _assumptions(d, status, source, free, bias)
    cal["residuals"] = residuals(d, rows, kernel_eff)
    return cal


def _assumptions(d: Device, status: str, source: str | None, free: tuple[str, ...], bias: float = 0.0
                 ) -> list[str]:
    out = [f"memory-bound {cls} (no measurements) works like {like}" for cls, like in ANALOGUES.items()]
    if free and bias:
        out.append(f"its maximum-achievable-matmul rows (ceilings) are fitted {bias:+.1%} slow, as the H100 curve "
                   "predicts H100's BF16 ceiling")
    if "fp8" in d.kernels.gemm.dtype_efficiency:
        out.append("FP8 GEMMs run at cuBLAS's efficiency (Transformer Engine's per-tensor and MXFP8 GEMMs alike)")
    if "fp4" in d.kernels.gemm.dtype_efficiency:
        out.append("FP4 (NVFP4) GEMMs have no kernel measurements: the FP8 efficiency, relative to the FP4 peak")
    if d.name in PRODUCTION_ATTENTION:
        out.append(f"attention runs {PRODUCTION_ATTENTION[d.name]} (the kernel Megatron-Core/Transformer Engine uses "
                   "there); the other kernels' efficiencies are recorded under fitted")
    if source and status != "assumed":
        kept = "GEMM shape terms, attention shape terms, memory-bound classes"
        out.append(f"{kept} are {source}'s" + (f"; only {', '.join(free)} fitted here" if free else ""))
        out.append(f"attention efficiency is {source}'s scaled by the ratio of the GEMM efficiencies")
    if status == "assumed":
        out.append(f"no kernel measurements: every kernel parameter is {source}'s, uncalibrated for this device")
    return out


def residuals(d: Device, rows: list[Measurement], kernel_eff: dict[str, float] | None) -> dict[str, Any]:
    """Error summaries by table (attention: by table and kernel, each with its own fitted efficiency)."""
    out: dict[str, Any] = {}
    keys = sorted({(m.table, m.kernel) for m in rows})
    for table, kernel in keys:
        group = [m for m in rows if m.table == table and m.kernel == kernel]
        model = KernelModel(d)
        if kernel and kernel_eff and kernel in kernel_eff:
            attention = replace(d.kernels.attention, efficiency=kernel_eff[kernel])
            model = KernelModel(with_params(d, replace(d.kernels, attention=attention)))
        out[f"{table}:{kernel}" if kernel else table] = summarize(errors(model, group)).to_dict()
    return out


class _Dumper(yaml.SafeDumper):
    """Block style, except collections of a few scalars (tiles, per-class values) on one line."""


def _flat(values: list[Any]) -> bool:
    return len(values) <= 8 and all(isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) < 24)
                                    for v in values)


_Dumper.add_representer(dict, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data.items(),
                                                                    flow_style=_flat(list(data.values()))))
_Dumper.add_representer(list, lambda d, data: d.represent_sequence("tag:yaml.org,2002:seq", data,
                                                                     flow_style=_flat(data)))


def write(d: Device, calibration: dict[str, Any], check: bool) -> bool:
    """Rewrite the device file's kernels and calibration; True when it changed."""
    path = d.path
    with open(path) as f:
        text = f.read()
    data = yaml.safe_load(text)
    data["kernels"] = d.kernels.to_dict()
    data["calibration"] = calibration
    new = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
    if new == text:
        return False
    if not check:
        with open(path, "w") as f:
            f.write(new)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="fit and compare, write nothing")
    args = p.parse_args(argv)
    changed = []
    for name, (d, cal) in fit_all(read_tables()).items():
        if write(d, cal, args.check):
            changed.append(name)
        res = cal["residuals"]
        print(f"{name:7} {cal['status']:16} " + "; ".join(f"{t} {r['rows']} rows mean |err| {r['mean_abs_error']:.3f}"
                                                        for t, r in res.items()))
    if changed:
        print(("differ from the fit: " if args.check else "rewrote: ") + ", ".join(changed))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
