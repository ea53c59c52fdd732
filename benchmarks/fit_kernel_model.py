"""Fit the kernel compute model to the kernel measurements in benchmarks/data/kernels/ and rewrite the ``kernels``
and ``calibration`` sections of every shipped device file (configs/devices/*.yml).

    python benchmarks/fit_kernel_model.py [--check]

``--check`` fits and compares without writing: exit status 1 if a device file differs from the fit (the files are
what this script writes; the test suite runs the same comparison on the fitted values).

Devices with their own GEMM and memory-bound tables (A100, H100) are fitted on them; attention is fitted jointly
on every FlashAttention/cuDNN row of A100 and H100 (an efficiency per device and kernel, the head-dim, per-tile and
backward terms shared). The others take the fitted shape terms of a measured device of the same kind and fit only
what their own rows determine: H200 and H200 NVL are H100's silicon (no fit; their rows check it); the AMD devices
fit their GEMM efficiency to their maximum-achievable-matmul rows, and their attention efficiency follows their
GEMM efficiency in proportion. TPUs have no kernel data: H100's values, marked assumed.

Maximum-achievable-matmul rows are the best shape of a search, a ceiling: a curve fitted on typical shapes
predicts its device's ceiling some percent slow, and a device fitted on its ceiling rows only is fitted to that
same relation (its rows' times scaled by the reference device's ceiling error), so a device is not made faster
than the reference relative to its own ceiling only because its data are ceilings. FP8 GEMMs are those of cuBLAS
(what Transformer Engine runs, and what the ceiling rows measure): H100's FP8 efficiency is fitted the same way on
its cuBLAS FP8 row; DeepGEMM's fine-grained-scaling kernels (deepgemm_fp8.tsv) shape the H100 curve and their own
FP8 efficiency is recorded under fitted as fp8_deepgemm.

The Blackwell GPUs (fit_blackwell) take their GEMM shape terms (tiles, K fill, wave quantization, launch) from XLA's
matmul table, which times one grid of BF16 GEMMs on a B200-class and an H100-class GPU: fitted on its Blackwell over
Hopper time ratios applied to H100's fitted curve (generation_gemm), so that the benchmark's own kernels and timer
cancel; the operand-streaming terms stay H100's. B300's GEMM, FP8 and FP4 efficiencies are fitted
on Transformer Engine's B300 GEMM rows (BF16; FP8 per-tensor and NVFP4 pre-quantized); B200 and GB200 fit their
GEMM and FP8 efficiencies on their ceiling rows at B300's ceiling error, and take B300's measured NVFP4-over-FP8
GEMM speed for FP4; GB300 takes B300's GEMM fit on its own peaks. Attention is fitted per GPU on its cuDNN rows
(B300 takes GB300's), norms on the cuDNN norm rows and the element-wise and optimizer classes on their forward
(streaming) rows (B200 takes GB200's, B300 GB300's). The quantization class (Transformer Engine's casts of low-
precision GEMM operands) is fitted once on the B200 and GB200 cast rows (torchao's MXFP8 and NVFP4 kernels) for
every Blackwell GPU. A device with FP4 math and no FP4 fit takes its FP8 efficiency relative to the FP4 peak.
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
from compute.kernel_data import (  # noqa: E402
    GENERATIONS_TABLE,
    LATENT_KERNEL,
    MODELS_TABLE,
    SOURCES,
    Measurement,
    errors,
    generation_pairs,
    read_tables,
    summarize,
    windowed,
)
from compute.kernel_fit import (  # noqa: E402
    ANALOGUES,
    fit_attention,
    fit_attention_term,
    fit_device_attention,
    fit_gemm,
    fit_memory,
    round4,
    with_params,
)
from compute.kernel_params import AttentionParams, GemmParams, MemoryParams  # noqa: E402
from compute.kernels import KernelModel  # noqa: E402

MEASURED = ("A100", "H100")
PRODUCTION_ATTENTION = {"A100": "fa2", "H100": "cudnn"}  # what Megatron-Core/Transformer Engine runs there
DERIVED = {"H200": ("H100", ()), "H200NVL": ("H100", ()), "MI300X": ("H100", ("efficiency",)),
           "MI325X": ("H100", ("efficiency",)), "MI355X": ("H100", ("efficiency",))}
# Blackwell: GEMM shape terms from XLA's Blackwell over Hopper GEMM times; GEMM efficiencies from B300's typical-shape
# rows (Transformer Engine's guide), the others' ceilings fitted to B300's relation; attention and memory-bound
# classes fitted on each GPU's cuDNN rows
BLACKWELL = ("B200", "B300", "GB200", "GB300")
GEMM_REFERENCE = "B300"  # the Blackwell GPU with typical-shape GEMM rows
GENERATION_GPU = "B200"  # the Blackwell GPU of the generations table (XLA's sm_100 grid), beside its H100 grid
# what the generations table's ratios fit: the tiles, K fill, wave quantization and launch; the operand-streaming
# terms (overlap, memory efficiency) stay H100's (freed too, the ratios fit as well, but the efficiencies each GPU
# then fits on its own large GEMMs bend the ratio by 3-6 points between small and large shapes)
GENERATION_FREE = ("efficiency", "k_fill", "wave_quantization", "launch_us", "tile1", "tile2")
TE_TABLE = "te_gemm_profiling.tsv"
TE_FITTED = ("bf16", "fp8_current", "nvfp4")  # recipes fitted (BF16; FP8 per-tensor and NVFP4 pre-quantized)
TE_MXFP8 = "mxfp8"  # fitted: MXFP8's own efficiency (B300's pre-quantized rows; the others at B300's MXFP8/FP8 ratio)
CEILING_ONLY = ("B200", "GB200")  # GEMM rows: their maximum-achievable-matmul ceilings only
SAME_GPU = {"GB300": "B300"}  # no GEMM measurements of its own: the named device's GEMM fit, on its own peaks
ATTENTION_ROWS = {"B200": "B200", "GB200": "GB200", "GB300": "GB300", "B300": "GB300"}  # fitted on whose rows
# other models' attention (cudnn-frontend's benchmark): the sliding-window rows fit the window's per-tile cost, the
# latent-attention backward rows the backward's head-dim exponent (on whose rows: B200 has none, GB200 is the same
# Blackwell SM), the rest are checks
MODELS_ROWS = {"B200": "GB200", "GB200": "GB200", "GB300": "GB300", "B300": "GB300"}
HOPPER_WINDOW_ROWS = "H200"  # H100's window cost: H200's rows (window 1024), the same SM
MEMORY_ROWS = {"B200": "GB200", "GB200": "GB200", "GB300": "GB300", "B300": "GB300"}
BLACKWELL_ULTRA = ("B300", "GB300")  # doubled softmax-exponential throughput: half H100's head-dim term
NORM_TABLE = "cudnn_norm.tsv"
STREAMING = "cudnn_norm_fwd"  # read once, write once: the element-wise classes' bandwidth on Blackwell
# Quantization kernels (Transformer Engine's casts): measured on B200 and GB200 (the same HBM3e at 8,000 GB/s), fitted
# once for the Blackwell GPUs; the others take the class they work like (kernel_fit.ANALOGUES).
QUANTIZE_FAMILY = ("B200", "B300", "GB200", "GB300")
QUANTIZE = ("quantize", "quantize_fp4")
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
    # kernel data are fitted with neutral device-level knobs: a training-step calibration's efficiency scales
    # (kernels.efficiency_scale, benchmarks/training_calibration.py) sit on top of the fit and are kept on writing
    shipped = {d.name: load_device_file(str(DEVICES_DIR / f"{d.name.lower()}.yml")).kernel_fit()
               for d in map(device, _names())}
    rows_of = by_device(rows)
    fitted: dict[str, Device] = {}
    deepgemm_fp8: dict[str, float] = {}
    for name in MEASURED:
        d = shipped[name]
        own = [m for m in rows_of[name] if m.table != GENERATIONS_TABLE]
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
                            launch_us=d.kernels.gemm.launch_us, window_tile_cost=0.0)
        fitted[name] = with_params(d, replace(d.kernels, attention=attention))
    # Hopper's sliding window: on H200's rows (H100's SM, H100's fit derived), given to H100 and what derives from it
    hopper = _derive(shipped[HOPPER_WINDOW_ROWS], fitted["H100"], [], ())
    windows = [m for m in rows_of.get(HOPPER_WINDOW_ROWS, []) if m.table == MODELS_TABLE and windowed(m)]
    cost = fit_attention_term(hopper, windows, "window_tile_cost", 1.0).window_tile_cost
    h = fitted["H100"]
    fitted["H100"] = with_params(h, replace(h.kernels, attention=replace(h.kernels.attention, window_tile_cost=cost)))
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
    out |= fit_blackwell(shipped, fitted["H100"], rows_of)
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
    return [*MEASURED, *DERIVED, *BLACKWELL, *ASSUMED]


def fit_blackwell(shipped: dict[str, Device], h100: Device, rows_of: dict[str, list[Measurement]]
                  ) -> dict[str, tuple[Device, dict[str, Any]]]:
    """The Blackwell GPUs: GEMM shape terms generation_gemm's; GEMM efficiencies (BF16, FP8, FP4) fitted on B300's
    Transformer Engine rows, B200's and GB200's on their ceilings at B300's ceiling error, GB300 B300's; attention
    fitted per GPU on its cuDNN rows (B300 GB300's); memory-bound norm and element-wise classes on the cuDNN norm
    rows (B200 GB200's, B300 GB300's)."""
    ref = GEMM_REFERENCE
    shape = with_params(h100, replace(h100.kernels, gemm=generation_gemm(shipped[GENERATION_GPU], h100, rows_of)))
    d = _derive(shipped[ref], shape, [], ())
    te = [m for m in rows_of[ref] if m.table == TE_TABLE]
    gemm = fit_gemm(d, [m for m in te if m.kernel in TE_FITTED], ("efficiency", "fp8", "fp4"))
    fp8_only = with_params(d, replace(d.kernels, gemm=gemm))
    mxfp8 = fit_gemm(fp8_only, [m for m in te if m.kernel == TE_MXFP8], (TE_MXFP8,)).dtype_efficiency[TE_MXFP8]
    eff = gemm.dtype_efficiency
    mxfp8_ratio = round4(mxfp8 / eff["fp8"])
    gemm = replace(gemm, dtype_efficiency={**eff, TE_MXFP8: mxfp8})
    gemms = {ref: with_params(d, replace(d.kernels, gemm=gemm))}
    bias = ceiling_error(gemms[ref], rows_of[ref])
    fp4_gain = round4(eff["fp4"] * d.peak_flops("fp4") / (eff["fp8"] * d.peak_flops("fp8")))
    for name in CEILING_ONLY:
        ceilings = [m for m in rows_of[name] if m.table == CEILING_TABLE]  # other GEMM rows are checks
        dn = _derive(shipped[name], shape, ceilings, ("efficiency", "fp8"), bias)
        g = dn.kernels.gemm
        fp4 = round4(g.dtype_efficiency["fp8"] * fp4_gain * dn.peak_flops("fp8") / dn.peak_flops("fp4"))
        gemms[name] = with_params(dn, replace(dn.kernels, gemm=replace(g, dtype_efficiency={
            **g.dtype_efficiency, "fp4": fp4, TE_MXFP8: round4(g.dtype_efficiency["fp8"] * mxfp8_ratio)})))
    for name, source in SAME_GPU.items():
        gemms[name] = _derive(shipped[name], gemms[source], [], ())
    attention: dict[str, tuple[dict[str, float], AttentionParams]] = {}
    for name in sorted(set(ATTENTION_ROWS.values())):
        dn = gemms[name]
        h = h100.kernels.attention
        base = replace(h, launch_us=dn.kernels.gemm.launch_us, dtype_efficiency={},
                       head_dim_half=round4(h.head_dim_half / (2 if name in BLACKWELL_ULTRA else 1)))
        rows = [m for m in rows_of[name] if m.family == "attention" and m.table != MODELS_TABLE]
        attention[name] = fit_device_attention(with_params(dn, replace(dn.kernels, attention=base)), rows, "cudnn",
                                               ("backward_efficiency", "tile_overhead"))
    window_cost: dict[str, float] = {}
    wide_head: dict[str, float] = {}
    for name in sorted(set(MODELS_ROWS.values())):
        dn = gemms[name]
        dn = with_params(dn, replace(dn.kernels, attention=replace(attention[ATTENTION_ROWS[name]][1],
                                                                   launch_us=dn.kernels.gemm.launch_us)))
        models = [m for m in rows_of[name] if m.table == MODELS_TABLE]
        window_cost[name] = fit_attention_term(dn, [m for m in models if windowed(m)], "window_tile_cost",
                                               1.0).window_tile_cost
        latent_backward = [m for m in models if m.kernel == LATENT_KERNEL
                           and all(s.attention is not None and s.attention.backward for s in m.shapes)]
        wide_head[name] = fit_attention_term(dn, latent_backward, "backward_head_dim_exponent",
                                             0.5).backward_head_dim_exponent
    memory: dict[str, MemoryParams] = {}
    for name in sorted(set(MEMORY_ROWS.values())):
        dn = gemms[name]
        norms = [m for m in rows_of[name] if m.table == NORM_TABLE]
        fitted = fit_memory(dn, norms)
        streaming = [replace(m, shapes=(replace(m.shapes[0], op_class="elementwise"),)) for m in norms
                     if m.source_id == STREAMING]
        stream = fit_memory(dn, streaming).efficiency["elementwise"]
        memory[name] = replace(fitted, efficiency={**fitted.efficiency, "elementwise": stream, "optimizer": stream})
    out: dict[str, tuple[Device, dict[str, Any]]] = {}
    for name in BLACKWELL:
        effs, params = attention[ATTENTION_ROWS[name]]
        d = gemms[name]
        d = with_params(d, replace(d.kernels, attention=replace(
            params, launch_us=d.kernels.gemm.launch_us, window_tile_cost=window_cost[MODELS_ROWS[name]],
            backward_head_dim_exponent=wide_head[MODELS_ROWS[name]]), memory=memory[MEMORY_ROWS[name]]))
        own = rows_of.get(name, [])
        cal = _calibration(d, own, "derived", SAME_GPU.get(name, "H100"), None)
        k = d.kernels.to_dict()
        fitted_gemm = {} if name in SAME_GPU else {"efficiency": k["gemm"]["efficiency"],
                                                     **k["gemm"]["dtype_efficiency"]}
        cal = {**{key: cal[key] for key in ("status", "method", "derived_from")}, "attention_kernel": "cudnn",
               "data": cal["data"]}
        cal["fitted"] = {**({"gemm": fitted_gemm} if fitted_gemm else {}),
                         "attention": {"kernel_efficiency": effs,
                                       **{key: k["attention"][key] for key in ("dtype_efficiency", "tile_overhead",
                                                                                 "backward_efficiency",
                                                                                 "window_tile_cost",
                                                                                 "backward_head_dim_exponent")}},
                         "memory": {c: {"efficiency": d.kernels.memory.efficiency[c],
                                        "launch_us": d.kernels.memory.launch_us[c]} for c in ("norm", "elementwise")}}
        cal["assumptions"] = _blackwell_assumptions(d, bias, fp4_gain, mxfp8_ratio)
        cal["residuals"] = residuals(d, own, effs)
        out[name] = (d, cal)
    return out


def generation_gemm(blackwell: Device, h100: Device, rows_of: dict[str, list[Measurement]]) -> GemmParams:
    """Blackwell's GEMM parameters fitted on the generations table's Blackwell times over its Hopper times for the
    same GEMMs, applied to H100's fitted curve: what the benchmark's own kernels and timer add weighs on both GPUs
    and cancels, H100's curve (fitted on typical shapes) carries the level. Only the shape terms are kept: each
    Blackwell GPU's efficiencies are fitted on its own rows after."""
    hopper_model = KernelModel(h100)
    pairs = generation_pairs(rows_of[blackwell.name] + rows_of[h100.name], blackwell.name, h100.name)
    targets = [replace(new, time_us=old.predicted_us(hopper_model) * new.time_us / old.time_us) for new, old in pairs]
    return fit_gemm(_derive(blackwell, h100, [], ()), targets, GENERATION_FREE)


def _blackwell_assumptions(d: Device, bias: float, fp4_gain: float, mxfp8_ratio: float) -> list[str]:
    name, ref = d.name, GEMM_REFERENCE
    a = d.kernels.attention
    out = [f"memory-bound {cls} (no measurements) works like {like}" for cls, like in ANALOGUES.items()]
    out.append("GEMM shape terms (tiles, K fill, wave quantization, launch) fitted on XLA's matmul table: its "
               f"{GENERATION_GPU} over H100 times for the same BF16 GEMMs (256-4096 per dimension) applied to H100's "
               "fitted curve; the operand-streaming terms (overlap, memory efficiency) are H100's")
    if name == ref:
        out.append("GEMM efficiency, FP8 and FP4 efficiencies fitted on Transformer Engine's B300 rows: BF16, and FP8 "
                   "per-tensor (current scaling) and NVFP4 with the operands quantized beforehand (the trace times "
                   "Transformer Engine's quantization kernels apart); the rows that include the quantization, and "
                   f"the maximum-achievable-matmul ceilings (predicted {bias:+.1%} slow), are checks")
        out.append(f"MXFP8 GEMMs at their own efficiency, fitted on Transformer Engine's pre-quantized MXFP8 rows "
                   f"({mxfp8_ratio}x the per-tensor FP8 one: the block scales' handling)")
    elif name in SAME_GPU:
        out.append(f"GEMM: {SAME_GPU[name]}'s fit (the same Blackwell Ultra GPU; no {name} GEMM measurements), on "
                   f"{name}'s own peaks")
    else:
        out.append(f"GEMM and FP8 efficiencies fitted on its maximum-achievable-matmul rows (ceilings), fitted "
                   f"{bias:+.1%} slow, as {ref}'s fit on Transformer Engine's typical shapes predicts {ref}'s ceiling")
        out.append(f"FP4 (NVFP4) GEMMs have no measurements here: {ref}'s measured NVFP4 over FP8 GEMM speed "
                   f"({fp4_gain}x, operands quantized beforehand) on this GPU's FP8 efficiency")
        out.append(f"FP8 GEMMs run at cuBLAS's per-tensor efficiency; MXFP8 ones at {mxfp8_ratio}x it, {ref}'s "
                   "measured MXFP8 over per-tensor FP8 efficiency (operands quantized beforehand)")
    rows_from = ATTENTION_ROWS[name]
    out.append(("attention fitted on its own cuDNN rows" if rows_from == name else
                f"attention: {rows_from}'s fit on its cuDNN rows (the same Blackwell Ultra GPU; no {name} attention "
                "rows)") + ": efficiency, backward efficiency and per-tile cost on BF16, then the FP8 efficiency on "
               "FP8, MXFP8's efficiency recorded under fitted; cuDNN is what Transformer Engine runs there")
    if name in BLACKWELL_ULTRA:
        out.append(f"head-dim term {a.head_dim_half}: H100's halved, for Blackwell Ultra's doubled softmax-exponential "
                   "throughput (the rows have head dim 128 only, where it and the efficiency cannot be told apart)")
    else:
        out.append(f"head-dim term {a.head_dim_half} is H100's (the rows have head dim 128 only)")
    window_from = MODELS_ROWS[name]
    out.append(f"sliding window: {a.window_tile_cost} KV blocks of extra work per query tile masking the window's far "
               f"edge, over the window's blocks, the same time in both passes, fitted on {window_from}'s GPT-OSS "
               "window-128 rows"
               + ("" if window_from == name else f" (the same Blackwell SM; no {name} window rows)"))
    out.append(f"backward above head dim 128: its efficiency times (128 / head dim) ** {a.backward_head_dim_exponent}, "
               f"fitted on {window_from}'s latent-attention backward rows (DeepSeek-V3, Kimi K2.6: query/key head dim "
               "192, value 128, timed as their mean 160); the other models' rows in cudnn_sdpa_models.tsv are checks")
    if name == "B200":
        out.append("B200's attention rows are cuDNN 9.13.1's (GB200's 9.19-9.22): part of the difference is the "
                   "library's")
    mem_from = MEMORY_ROWS[name]
    out.append(("norms fitted on its own cuDNN norm rows" if mem_from == name else
                f"memory-bound classes: {mem_from}'s fit (the same HBM3e at 8,000 GB/s; no {name} rows)")
               + "; element-wise and optimizer kernels at the bandwidth fraction cuDNN's forward norm (read once, "
                 "write once) reaches, with H100's element-wise launch time; activation and embedding are H100's")
    return out


def ceiling_error(d: Device, rows: list[Measurement]) -> float:
    """The model's error on ``d``'s BF16 ceiling row(s) (mean of predicted / measured - 1)."""
    ceiling = [m for m in rows if m.table == CEILING_TABLE and m.shapes[0].dtype == "bf16"]
    return round4(float(errors(KernelModel(d), ceiling).mean())) if ceiling else 0.0


def scaled(rows: list[Measurement], error: float) -> list[Measurement]:
    """Ceiling rows with their times scaled by 1 + ``error``: the targets of a ceiling-relative fit."""
    return [replace(m, time_us=m.time_us * (1 + error)) if m.table == CEILING_TABLE else m for m in rows]


def _with_fp4(d: Device, gemm: GemmParams) -> GemmParams:
    """FP4 without an efficiency of its own (no kernel measurements) at the FP8 efficiency relative to its own peak,
    where the device has FP4."""
    eff = dict(gemm.dtype_efficiency)
    if d.has("fp4") and "fp8" in eff and "fp4" not in eff:
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
    gemm_rows = [m for m in rows if m.family == "gemm"]
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
    quantize_tables = {t for t, _ in tables}
    data = [x for x in cal["data"] if x["table"] not in quantize_tables]
    cal["data"] = data + [{"table": t, "rows": n, "source": SOURCES[s][0], "url": SOURCES[s][1],
                           "licence": SOURCES[s][2]} for (t, s), n in sorted(tables.items())]
    memory = d.kernels.memory
    cal.setdefault("fitted", {}).setdefault("memory", {}).update(
        {c: {"efficiency": memory.efficiency[c], "launch_us": memory.launch_us[c]} for c in QUANTIZE})
    cal["assumptions"] = [a for a in cal["assumptions"] if not a.startswith("memory-bound quantize")] + [
        f"quantization kernels (FP8/MXFP8 casts, NVFP4 quantization): an efficiency and a launch each, fitted on "
        f"{', '.join(QUANTIZE_FAMILY[::2])} rows for {', '.join(QUANTIZE_FAMILY)}; torchao's kernels stand in for "
        "Transformer Engine's"]
    residual = {k: v for k, v in cal["residuals"].items() if k.split(":")[0] not in quantize_tables}
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
                                                                                 "backward_efficiency",
                                                                                 "window_tile_cost")
                                          if key in k["attention"]}},
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
        cost = d.kernels.attention.window_tile_cost
        out.append(f"sliding window: {cost} KV blocks of extra work per query tile masking the window's far edge, "
                   f"over the window's blocks, the same time in both passes, fitted on {HOPPER_WINDOW_ROWS}'s "
                   "GPT-OSS window-1024 rows (the same SM)" if cost else
                   "sliding window: no window measurements, a window costs the key blocks its tiles walk")
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


def dump(data: dict[str, Any]) -> str:
    """A device file's text as the fits write it."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def write(d: Device, calibration: dict[str, Any], check: bool) -> bool:
    """Rewrite the device file's kernels and calibration; True when it changed."""
    path = d.path
    with open(path) as f:
        text = f.read()
    data = yaml.safe_load(text)
    knobs = {k: data["kernels"][k] for k in ("launch_overhead_us", "efficiency_scale") if k in data["kernels"]}
    data["kernels"] = {**d.kernels.to_dict(), **knobs}
    data["calibration"] = calibration
    new = dump(data)
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
