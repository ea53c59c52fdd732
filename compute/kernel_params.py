"""The kernel compute model's parameters for one device (a device file's ``kernels`` section), typed and checked.

Three groups follow the model's operator families (compute/kernels.py says what each parameter does), plus two
device-level knobs left at their neutral values by the kernel-data fit, for a later calibration against whole
training steps to set: ``launch_overhead_us`` (a gap added to every kernel, as a host that cannot keep the GPU
fed leaves) and ``efficiency_scale`` (a factor on the fitted efficiency of each family, and ``fp8_gemm`` one more
on FP8 GEMMs).

    kernels:
      launch_overhead_us: 0.0
      efficiency_scale: {gemm: 1.0, attention: 1.0, memory: 1.0}
      gemm: {tiles: [[128, 256, 1.0], [128, 128, 0.9]], efficiency: 0.76, dtype_efficiency: {fp8: 0.88},
             k_fill: 25, wave_quantization: 0.24, overlap: 2.1, memory_efficiency: 0.96, launch_us: 4.0}
      attention: {block_q: 128, block_kv: 128, efficiency: 0.8, dtype_efficiency: {fp8: 0.8}, head_dim_half: 56,
                  tile_overhead: 2.0, backward_efficiency: 0.88, wave_quantization: 0.5, launch_us: 10,
                  window_tile_cost: 6.5, backward_head_dim_exponent: 0.8}   # the last two optional (0)
      memory: {launch_us: {elementwise: 1.5, norm: 4.0, ...}, efficiency: {elementwise: 0.9, norm: 0.5, ...}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compute.shapes import DTYPES, SCAN_CLASS
from network.values import key_names, number, whole
from workload.errors import ConfigError, shown

FAMILIES = ("gemm", "attention", "memory")
# efficiency_scale keys: the families, and FP8 GEMMs on top of ``gemm`` (the kernel data's FP8 GEMMs are DeepGEMM's;
# a training framework's FP8 GEMMs with their quantization kernels reach a different fraction)
SCALES = (*FAMILIES, "fp8_gemm")
# mamba_ssm's Triton SSD kernels (the Mamba-2 scan: chunk cumulative sum, C B^T, chunk states, state passing, chunk
# scan) reach this fraction of a device's element-wise bandwidth efficiency, counting their bytes as
# workload/llm/mamba.py does: the median over published forward timings on B200 and H200
# (benchmarks/data/ssd_triton.tsv), refitted and printed against them by benchmarks/ssd_kernels.py
SCAN_BANDWIDTH_FRACTION = 0.43
MEMORY_CLASSES = ("elementwise", "norm", "activation", "softmax", "embedding", "loss", "optimizer", "quantize",
                  "quantize_fp4")  # quantize_fp4: op_class quantize in dtype fp4 (compute/kernels.memory_class)
MAX_US = 1e6


@dataclass(frozen=True, slots=True)
class GemmParams:
    tiles: tuple[tuple[int, int, float], ...]  # (rows, columns, efficiency relative to ``efficiency``)
    efficiency: float  # fraction of the precision's peak a full wave of the first tile reaches with a long K
    dtype_efficiency: dict[str, float]  # per precision, relative to ``efficiency`` (absent: 1)
    k_fill: float  # K elements a tile spends on pipeline fill and epilogue
    wave_quantization: float  # 0: partial waves cost their share, 1: a whole wave
    overlap: float  # p of the p-norm joining compute and memory time (1: they add, large: the larger)
    memory_efficiency: float  # fraction of HBM bandwidth when streaming the operands
    launch_us: float  # a kernel's fixed time


@dataclass(frozen=True, slots=True)
class AttentionParams:
    block_q: int  # query rows per tile (one tile per CU at a time)
    block_kv: int  # keys per inner-loop step
    efficiency: float  # forward, of the precision's peak, at head_dim -> infinity
    head_dim_half: float  # head dim at which softmax work halves the efficiency
    tile_overhead: float  # per query tile, in KV blocks (load Q, write O, rescale)
    backward_efficiency: float  # backward's efficiency relative to forward's
    wave_quantization: float
    launch_us: float
    dtype_efficiency: dict[str, float] = field(default_factory=dict)  # per precision, relative to ``efficiency``
    # a sliding-window kernel's extra work per query tile masking the window's far edge, in forward KV blocks at a
    # window of one block (divided by the window's blocks): the same time in the forward and the backward pass
    window_tile_cost: float = 0.0
    # the backward's efficiency at head dims above the fitted rows' 128: times (128 / head_dim) ** this
    backward_head_dim_exponent: float = 0.0


@dataclass(frozen=True, slots=True)
class MemoryParams:
    """By operator class (MEMORY_CLASSES); a class not listed takes the ``elementwise`` value."""

    launch_us: dict[str, float]  # a kernel's fixed time
    efficiency: dict[str, float]  # fraction of HBM bandwidth

    def of(self, op_class: str) -> tuple[float, float]:
        """(launch_us, efficiency) of ``op_class``; the Mamba-2 scan's kernels (SCAN_CLASS) at
        SCAN_BANDWIDTH_FRACTION of the element-wise efficiency."""
        if op_class == SCAN_CLASS:
            launch_us, efficiency = self.of("elementwise")
            return launch_us, efficiency * SCAN_BANDWIDTH_FRACTION
        return (self.launch_us.get(op_class, self.launch_us["elementwise"]),
                self.efficiency.get(op_class, self.efficiency["elementwise"]))


@dataclass(frozen=True, slots=True)
class KernelParams:
    gemm: GemmParams
    attention: AttentionParams
    memory: MemoryParams
    launch_overhead_us: float = 0.0
    efficiency_scale: tuple[tuple[str, float], ...] = ()

    def scale(self, family: str) -> float:
        return dict(self.efficiency_scale).get(family, 1.0)

    def to_dict(self) -> dict[str, Any]:
        """The ``kernels`` section as written in a device file."""
        g, a, m = self.gemm, self.attention, self.memory
        return {
            "launch_overhead_us": self.launch_overhead_us,
            "efficiency_scale": {f: self.scale(f) for f in SCALES},
            "gemm": {"tiles": [list(t) for t in g.tiles], "efficiency": g.efficiency,
                     "dtype_efficiency": dict(g.dtype_efficiency), "k_fill": g.k_fill,
                     "wave_quantization": g.wave_quantization, "overlap": g.overlap,
                     "memory_efficiency": g.memory_efficiency, "launch_us": g.launch_us},
            "attention": {"block_q": a.block_q, "block_kv": a.block_kv, "efficiency": a.efficiency,
                          **({"dtype_efficiency": dict(a.dtype_efficiency)} if a.dtype_efficiency else {}),
                          "head_dim_half": a.head_dim_half, "tile_overhead": a.tile_overhead,
                          "backward_efficiency": a.backward_efficiency, "wave_quantization": a.wave_quantization,
                          "launch_us": a.launch_us,
                          **({"window_tile_cost": a.window_tile_cost} if a.window_tile_cost else {}),
                          **({"backward_head_dim_exponent": a.backward_head_dim_exponent}
                             if a.backward_head_dim_exponent else {})},
            "memory": {"launch_us": dict(m.launch_us), "efficiency": dict(m.efficiency)},
        }


def _section(data: Any, key: str, where: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: '{key}' must be a mapping (got {shown(data)})")
    unknown = set(data) - set(keys)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) in '{key}': {key_names(unknown)}; valid: {', '.join(keys)}")
    missing = [k for k in keys if k not in data and k not in optional]
    if missing:
        raise ConfigError(f"{where}: '{key}' misses {', '.join(missing)}")
    return data


def _fraction(value: Any, key: str, where: str) -> float:
    return number(value, key, where, high=1.0, positive=True)


def _fractions(value: Any, key: str, where: str, names: tuple[str, ...], high: float = 1.0) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: '{key}' must map {', '.join(names)} to numbers (got {shown(value)})")
    bad = set(value) - set(names)
    if bad:
        raise ConfigError(f"{where}: unknown key(s) in '{key}': {key_names(bad)}; valid: {', '.join(names)}")
    return {k: number(v, f"{key}.{k}", where, high=high, positive=True) for k, v in value.items()}


def _tiles(value: Any, where: str) -> tuple[tuple[int, int, float], ...]:
    key = "kernels.gemm.tiles"
    if not isinstance(value, list) or not value or not all(isinstance(t, list) and len(t) == 3 for t in value):
        raise ConfigError(f"{where}: '{key}' must list [rows, columns, relative efficiency] tiles")
    return tuple((whole(r, f"{key}[{i}][0]", where, high=4096), whole(c, f"{key}[{i}][1]", where, high=4096),
                  _fraction(e, f"{key}[{i}][2]", where)) for i, (r, c, e) in enumerate(value))


def parse_kernel_params(data: Any, where: str) -> KernelParams:
    k = _section(data, "kernels", where, ("launch_overhead_us", "efficiency_scale", *FAMILIES),
                 ("launch_overhead_us", "efficiency_scale"))
    g = _section(k["gemm"], "kernels.gemm", where, ("tiles", "efficiency", "dtype_efficiency", "k_fill",
                                                    "wave_quantization", "overlap", "memory_efficiency", "launch_us"),
                 ("dtype_efficiency",))
    a = _section(k["attention"], "kernels.attention", where,
                 ("block_q", "block_kv", "efficiency", "dtype_efficiency", "head_dim_half", "tile_overhead",
                  "backward_efficiency", "wave_quantization", "launch_us", "window_tile_cost",
                  "backward_head_dim_exponent"),
                 ("dtype_efficiency", "window_tile_cost", "backward_head_dim_exponent"))
    m = _section(k["memory"], "kernels.memory", where, ("launch_us", "efficiency"))
    memory_eff = _fractions(m["efficiency"], "kernels.memory.efficiency", where, MEMORY_CLASSES)
    memory_launch = _fractions(m["launch_us"], "kernels.memory.launch_us", where, MEMORY_CLASSES, high=MAX_US)
    for key, values in (("efficiency", memory_eff), ("launch_us", memory_launch)):
        if "elementwise" not in values:
            raise ConfigError(f"{where}: 'kernels.memory.{key}' needs elementwise (the classes not listed take it)")
    return KernelParams(
        gemm=GemmParams(
            tiles=_tiles(g["tiles"], where), efficiency=_fraction(g["efficiency"], "kernels.gemm.efficiency", where),
            dtype_efficiency=_fractions(g.get("dtype_efficiency") or {}, "kernels.gemm.dtype_efficiency", where,
                                        DTYPES),
            k_fill=number(g["k_fill"], "kernels.gemm.k_fill", where, high=1e6),
            wave_quantization=number(g["wave_quantization"], "kernels.gemm.wave_quantization", where, high=1.0),
            overlap=number(g["overlap"], "kernels.gemm.overlap", where, low=1.0, high=64.0),
            memory_efficiency=_fraction(g["memory_efficiency"], "kernels.gemm.memory_efficiency", where),
            launch_us=number(g["launch_us"], "kernels.gemm.launch_us", where, high=MAX_US)),
        attention=AttentionParams(
            block_q=whole(a["block_q"], "kernels.attention.block_q", where, high=4096),
            block_kv=whole(a["block_kv"], "kernels.attention.block_kv", where, high=4096),
            efficiency=_fraction(a["efficiency"], "kernels.attention.efficiency", where),
            head_dim_half=number(a["head_dim_half"], "kernels.attention.head_dim_half", where, high=1e5),
            tile_overhead=number(a["tile_overhead"], "kernels.attention.tile_overhead", where, high=1e5),
            backward_efficiency=_fraction(a["backward_efficiency"], "kernels.attention.backward_efficiency", where),
            wave_quantization=number(a["wave_quantization"], "kernels.attention.wave_quantization", where, high=1.0),
            launch_us=number(a["launch_us"], "kernels.attention.launch_us", where, high=MAX_US),
            dtype_efficiency=_fractions(a.get("dtype_efficiency") or {}, "kernels.attention.dtype_efficiency", where,
                                        DTYPES),
            window_tile_cost=number(a.get("window_tile_cost", 0.0), "kernels.attention.window_tile_cost", where,
                                    high=1e5),
            backward_head_dim_exponent=number(a.get("backward_head_dim_exponent", 0.0),
                                              "kernels.attention.backward_head_dim_exponent", where, high=10.0)),
        memory=MemoryParams(launch_us=memory_launch, efficiency=memory_eff),
        launch_overhead_us=number(k.get("launch_overhead_us", 0.0), "kernels.launch_overhead_us", where, high=MAX_US),
        efficiency_scale=tuple(_fractions(k.get("efficiency_scale") or {}, "kernels.efficiency_scale", where,
                                          SCALES, high=100.0).items()))
