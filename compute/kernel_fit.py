"""Fitting the kernel model's parameters to published kernel measurements (compute/kernel_data.py), per device.

Least squares on log time (a 2x miss weighs the same on a 5 us kernel as on a 5 ms one), by Levenberg-Marquardt
in NumPy with a numeric Jacobian from a fixed start: the same tables give the same parameters, to the digit.
Parameters live on unbounded scales (fractions through a logistic, positive numbers through a log) so every
step stays in range. Fitted values are rounded to 4 significant digits before the residuals are computed, so a
device file's recorded residuals are what its own numbers give.

Families are fitted apart: GEMM (efficiency, K fill, wave quantisation, overlap, operand-streaming efficiency,
launch time, the smaller tiles' relative efficiency, the FP8 and FP4 efficiencies where such rows exist; a row may
time several GEMMs, summed), attention (one efficiency per measured device and kernel, and the head-dim, per-tile
and backward terms shared by all; or, for one device, its efficiencies, backward and FP8 terms on fixed shape
terms; a sliding window's per-tile cost and the backward's loss above head dim 128, each on its own rows, the rest
fixed), memory-bound classes (an efficiency per class, one launch time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from compute.devices import Device
from compute.kernel_data import Measurement, errors, summarize
from compute.kernel_params import AttentionParams, GemmParams, KernelParams, MemoryParams
from compute.kernels import KernelModel, gemm_seconds, memory_class, precision_efficiency
from compute.shapes import DTYPE_BYTES

Transform = tuple[str, Callable[[float], float], Callable[[float], float]]
FRACTION: tuple[Callable[[float], float], Callable[[float], float]] = (
    lambda z: 1 / (1 + math.exp(-z)), lambda x: math.log(x / (1 - x)))
POSITIVE: tuple[Callable[[float], float], Callable[[float], float]] = (math.exp, math.log)
ABOVE_ONE: tuple[Callable[[float], float], Callable[[float], float]] = (
    lambda z: 1 + math.exp(z), lambda x: math.log(x - 1))


# Memory-bound classes no table measures, and the measured class each is taken to work like: a softmax and a
# cross-entropy loss reduce along rows as a norm does; a fused optimizer step streams its tensors once; a
# low-precision cast (Transformer Engine's cast/cast-transpose with its amax, MXFP8 block quantization) reduces
# along rows or blocks and writes once, as a norm does; NVFP4's quantization is a cast where it is not measured.
ANALOGUES = {"softmax": "norm", "loss": "norm", "optimizer": "elementwise", "quantize": "norm",
             "quantize_fp4": "quantize"}


def round4(x: float) -> float:
    return float(f"{x:.4g}")


def levenberg_marquardt(residuals: Callable[[np.ndarray], np.ndarray], z: np.ndarray, iterations: int = 100,
                        step: float = 1e-6) -> np.ndarray:
    """The z minimising |residuals(z)|^2, from ``z``: damped Gauss-Newton with a forward-difference Jacobian."""
    damping = 1e-3
    r = residuals(z)
    cost = float(r @ r)
    for _ in range(iterations):
        jac = np.empty((len(r), len(z)))
        for j in range(len(z)):
            dz = np.zeros_like(z)
            dz[j] = step
            jac[:, j] = (residuals(z + dz) - r) / step
        a, g = jac.T @ jac, jac.T @ r
        for _ in range(12):
            delta = np.linalg.solve(a + damping * (np.diag(np.diag(a)) + 1e-12 * np.eye(len(z))), -g)
            r_new = residuals(z + delta)
            cost_new = float(r_new @ r_new)
            if np.isfinite(cost_new) and cost_new < cost:
                break
            damping *= 4
        else:
            break  # no step downhill: a minimum
        z, r, damping = z + delta, r_new, max(damping / 3, 1e-9)
        done = cost - cost_new < 1e-10 * cost
        cost = cost_new
        if done:
            break
    return z


class _Vector:
    """Named parameters <-> an unbounded vector."""

    def __init__(self, start: dict[str, float], kinds: dict[str, tuple[Callable[[float], float], ...]]) -> None:
        self.names = list(start)
        self.kinds = kinds
        self.z0 = np.array([kinds[n][1](start[n]) for n in self.names])

    def values(self, z: np.ndarray) -> dict[str, float]:
        return {n: self.kinds[n][0](float(v)) for n, v in zip(self.names, z, strict=True)}


# --- GEMM --------------------------------------------------------------------------------------------------------
LOW_PRECISIONS = ("fp8", "fp4", "mxfp8")  # GEMM precisions with an efficiency of their own (relative to ``efficiency``)


def _gemm_params(base: GemmParams, v: dict[str, float]) -> GemmParams:
    tiles = tuple((r, c, v.get(f"tile{i}", rel)) for i, (r, c, rel) in enumerate(base.tiles))
    dtype_eff = dict(base.dtype_efficiency)
    for dtype in LOW_PRECISIONS:
        if dtype in v:
            dtype_eff[dtype] = v[dtype]
    return replace(base, tiles=tiles, efficiency=v.get("efficiency", base.efficiency),
                   dtype_efficiency=dtype_eff, k_fill=v.get("k_fill", base.k_fill),
                   wave_quantization=v.get("wave_quantization", base.wave_quantization),
                   overlap=v.get("overlap", base.overlap),
                   memory_efficiency=v.get("memory_efficiency", base.memory_efficiency),
                   launch_us=v.get("launch_us", base.launch_us))


def _gemm_arrays(device: Device, rows: Sequence[Measurement]) -> dict[str, np.ndarray]:
    """Every GEMM of ``rows`` (a row may sum several: ``row`` says whose), and each row's time."""
    g = [(i, s) for i, m in enumerate(rows) for s in m.shapes]
    return {"m": np.array([s.gemm.m for _, s in g], float), "n": np.array([s.gemm.n for _, s in g], float),
            "k": np.array([s.gemm.k for _, s in g], float), "batch": np.array([s.gemm.batch for _, s in g], float),
            "bytes": np.array([DTYPE_BYTES[s.dtype] for _, s in g], float),
            "peak": np.array([device.peak_flops(s.dtype) for _, s in g]),
            **{dtype: np.array([s.dtype == dtype for _, s in g]) for dtype in LOW_PRECISIONS},
            "row": np.array([i for i, _ in g]), "time": np.array([m.time_us * 1e-6 for m in rows])}


def gemm_times(device: Device, p: GemmParams, a: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's modelled time: the sum of its GEMMs'."""
    eff = np.full(len(a["m"]), p.efficiency)
    for dtype in LOW_PRECISIONS:
        eff = np.where(a[dtype], p.efficiency * precision_efficiency(p.dtype_efficiency, dtype), eff)
    seconds = gemm_seconds(a["m"], a["n"], a["k"], a["batch"], a["bytes"], a["peak"] * np.minimum(eff, 1.0),
                           device.compute_units, device.memory_bw_GBps * 1e9, p)
    return np.bincount(a["row"], weights=np.asarray(seconds), minlength=len(a["time"]))


def fit_gemm(device: Device, rows: Sequence[Measurement], free: Sequence[str] | None = None) -> GemmParams:
    """The GEMM parameters best fitting ``rows`` (all of ``device``); ``free`` limits which are fitted."""
    base = device.kernels.gemm
    kinds: dict[str, tuple[Callable[[float], float], ...]] = {
        "efficiency": FRACTION, "k_fill": POSITIVE, "wave_quantization": FRACTION, "overlap": ABOVE_ONE,
        "memory_efficiency": FRACTION, "launch_us": POSITIVE, "fp8": FRACTION, "fp4": FRACTION, "mxfp8": FRACTION,
        **{f"tile{i}": FRACTION for i in range(1, len(base.tiles))}}
    start = {"efficiency": min(base.efficiency, 0.99), "k_fill": max(base.k_fill, 1.0),
             "wave_quantization": min(max(base.wave_quantization, 0.01), 0.99), "overlap": max(base.overlap, 1.01),
             "memory_efficiency": min(base.memory_efficiency, 0.99), "launch_us": max(base.launch_us, 0.1),
             **{dtype: min(base.dtype_efficiency.get(dtype, 0.9), 0.99) for dtype in LOW_PRECISIONS},
             **{f"tile{i}": min(base.tiles[i][2], 0.99) for i in range(1, len(base.tiles))}}
    names = list(free) if free is not None else list(start)
    arrays = _gemm_arrays(device, rows)
    names = [n for n in names if n not in LOW_PRECISIONS or arrays[n].any()]
    vec = _Vector({n: start[n] for n in names}, kinds)

    def residuals(z: np.ndarray) -> np.ndarray:
        return np.log(gemm_times(device, _gemm_params(base, vec.values(z)), arrays) / arrays["time"])

    fitted = vec.values(levenberg_marquardt(residuals, vec.z0))
    params = _gemm_params(base, {n: round4(v) for n, v in fitted.items()})
    return replace(params, dtype_efficiency={k: v for k, v in params.dtype_efficiency.items() if device.has(k)})


# --- attention ---------------------------------------------------------------------------------------------------
def fit_attention(groups: dict[tuple[str, str], tuple[Device, list[Measurement]]], base: AttentionParams
                  ) -> tuple[dict[tuple[str, str], float], AttentionParams]:
    """Joint fit over (device, kernel) groups: an efficiency per group, the shared head-dim, per-tile and
    backward terms. Returns the group efficiencies and the shared parameters."""
    keys = sorted(groups)
    kinds: dict[str, tuple[Callable[[float], float], ...]] = {
        "head_dim_half": POSITIVE, "tile_overhead": POSITIVE, "backward_efficiency": FRACTION,
        **{f"eff:{d}:{k}": FRACTION for d, k in keys}}
    start = {"head_dim_half": max(base.head_dim_half, 1.0), "tile_overhead": max(base.tile_overhead, 0.1),
             "backward_efficiency": min(base.backward_efficiency, 0.99), **{f"eff:{d}:{k}": 0.7 for d, k in keys}}
    vec = _Vector(start, kinds)

    def models(v: dict[str, float]) -> dict[tuple[str, str], KernelModel]:
        shared = replace(base, head_dim_half=v["head_dim_half"], tile_overhead=v["tile_overhead"],
                         backward_efficiency=v["backward_efficiency"])
        return {(d, k): KernelModel(_with(dev, attention=replace(shared, efficiency=v[f"eff:{d}:{k}"])))
                for (d, k), (dev, _) in groups.items()}

    def residuals(z: np.ndarray) -> np.ndarray:
        ms = models(vec.values(z))
        return np.concatenate([np.log1p(errors(ms[key], groups[key][1])) for key in keys])

    fitted = {n: round4(v) for n, v in vec.values(levenberg_marquardt(residuals, vec.z0)).items()}
    shared = replace(base, head_dim_half=fitted["head_dim_half"], tile_overhead=fitted["tile_overhead"],
                     backward_efficiency=fitted["backward_efficiency"])
    return {(d, k): fitted[f"eff:{d}:{k}"] for d, k in keys}, shared


def fit_device_attention(device: Device, rows: Sequence[Measurement], kernel: str, free: Sequence[str]
                         ) -> tuple[dict[str, float], AttentionParams]:
    """One device's attention, on fixed head-dim term, in stages so that BF16, what training runs, is fitted on its
    own: (1) the efficiency of ``kernel`` (the production kernel) and the ``free`` terms among backward_efficiency
    and tile_overhead, on ``kernel``'s BF16 rows; (2) the FP8 efficiency (relative to BF16's), on its FP8 rows; (3)
    the efficiency of every other kernel in ``rows``, on its rows, the rest fixed. Returns the efficiency of each
    kernel and the parameters (``efficiency`` that of ``kernel``)."""
    base = device.kernels.attention
    kinds: dict[str, tuple[Callable[[float], float], ...]] = {
        "efficiency": FRACTION, "backward_efficiency": FRACTION, "tile_overhead": POSITIVE, "fp8": FRACTION}
    start = {"efficiency": 0.7, "backward_efficiency": min(base.backward_efficiency, 0.99),
             "tile_overhead": max(base.tile_overhead, 0.1), "fp8": min(base.dtype_efficiency.get("fp8", 0.8), 0.99)}

    def params(p: AttentionParams, v: dict[str, float]) -> AttentionParams:
        dtype_eff = dict(p.dtype_efficiency) | ({"fp8": v["fp8"]} if "fp8" in v else {})
        return replace(p, efficiency=v.get("efficiency", p.efficiency),
                       backward_efficiency=v.get("backward_efficiency", p.backward_efficiency),
                       tile_overhead=v.get("tile_overhead", p.tile_overhead), dtype_efficiency=dtype_eff)

    def fit(p: AttentionParams, names: Sequence[str], group: Sequence[Measurement]) -> AttentionParams:
        vec = _Vector({n: start[n] for n in names}, kinds)

        def residuals(z: np.ndarray) -> np.ndarray:
            return np.log1p(errors(KernelModel(_with(device, attention=params(p, vec.values(z)))), group))

        return params(p, {n: round4(x) for n, x in vec.values(levenberg_marquardt(residuals, vec.z0)).items()})

    def of(k: str, dtype: str | None = None) -> list[Measurement]:
        return [m for m in rows if m.kernel == k and (dtype is None or m.shapes[0].dtype == dtype)]

    fitted = fit(base, ["efficiency", *free], of(kernel, "bf16"))
    if of(kernel, "fp8"):
        fitted = fit(fitted, ["fp8"], of(kernel, "fp8"))
    efficiency = {kernel: fitted.efficiency}
    for k in sorted({m.kernel for m in rows} - {kernel}):
        efficiency[k] = fit(fitted, ["efficiency"], of(k)).efficiency
    return efficiency, fitted


def fit_attention_term(device: Device, rows: Sequence[Measurement], term: str, start: float) -> AttentionParams:
    """One positive attention parameter ``term`` (``window_tile_cost``: a sliding window's per-tile cost, on
    sliding-window rows; ``backward_head_dim_exponent``: the backward's loss above head dim 128, on backward rows of
    wider heads) from a fixed ``start``, every other attention term fixed."""
    base = device.kernels.attention
    vec = _Vector({term: start}, {term: POSITIVE})

    def params(v: dict[str, float]) -> AttentionParams:
        return replace(base, **{term: v[term]})

    def residuals(z: np.ndarray) -> np.ndarray:
        return np.log1p(errors(KernelModel(_with(device, attention=params(vec.values(z)))), rows))

    return params({n: round4(v) for n, v in vec.values(levenberg_marquardt(residuals, vec.z0)).items()})


# --- memory-bound classes ------------------------------------------------------------------------------------------
def fit_memory(device: Device, rows: Sequence[Measurement], launch: bool = True) -> MemoryParams:
    """An efficiency and a launch time per class measured in ``rows``; a class measured at one size only (or every
    class, ``launch`` False) keeps the device's launch time (one size cannot tell the two apart) and fits its
    efficiency."""
    base = device.kernels.memory
    classes = sorted({memory_class(m.shapes[0]) for m in rows})
    sizes = {c: {m.size_bytes for m in rows if memory_class(m.shapes[0]) == c} for c in classes}
    timed = [c for c in classes if len(sizes[c]) > 1 and launch]
    kinds: dict[str, tuple[Callable[[float], float], ...]] = {
        **{f"launch:{c}": POSITIVE for c in timed}, **{c: FRACTION for c in classes}}
    start = {**{f"launch:{c}": max(base.of(c)[0], 0.1) for c in timed},
             **{c: min(base.of(c)[1], 0.99) for c in classes}}
    vec = _Vector(start, kinds)

    def params(v: dict[str, float]) -> MemoryParams:
        return MemoryParams(launch_us={**base.launch_us, **{c: v.get(f"launch:{c}", base.of(c)[0]) for c in classes}},
                            efficiency={**base.efficiency, **{c: v[c] for c in classes}})

    def residuals(z: np.ndarray) -> np.ndarray:
        return np.log1p(errors(KernelModel(_with(device, memory=params(vec.values(z)))), rows))

    fitted = params({n: round4(v) for n, v in vec.values(levenberg_marquardt(residuals, vec.z0)).items()})
    # classes without rows take the measured class they work like (see ANALOGUES)
    launch, eff = dict(fitted.launch_us), dict(fitted.efficiency)
    for cls, like in ANALOGUES.items():  # in order: a class may take one that took another's
        if cls not in classes and like in launch:
            launch[cls], eff[cls] = launch[like], eff[like]
    return MemoryParams(launch_us=launch, efficiency=eff)


def _with(device: Device, **families: Any) -> Device:
    return replace(device, kernels=replace(device.kernels, **families))


def with_params(device: Device, params: KernelParams) -> Device:
    return replace(device, kernels=params)


def residuals_by(model: KernelModel, rows: Sequence[Measurement]) -> dict[str, Any]:
    """Error summaries of ``rows`` by table."""
    out: dict[str, Any] = {}
    for table in sorted({m.table for m in rows}):
        group = [m for m in rows if m.table == table]
        out[table] = summarize(errors(model, group)).to_dict()
    return out
