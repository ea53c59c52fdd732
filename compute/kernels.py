"""The kernel compute model (``--compute-model kernels``): a compute node's time from its operator and shape on one
device, where the roofline model knows only FLOPs and bytes.

Real kernels reach the roofline only for large, well-shaped work. The model keeps the mechanisms that make them
fall short, each with few parameters fitted per device on public kernel measurements (benchmarks/data/kernels/):

- GEMM: the output is cut into tiles, one per compute unit at a time, so time goes by waves of tiles (a partial
  last wave costs nearly a whole one: wave quantisation), and a tile spends a fixed number of K steps filling
  its pipeline and writing back (small K pays it in full). Small M or N waste part of each tile; the library's
  smaller tiles, slower per FLOP, win there (the model takes the fastest tile, as its heuristics do). Compute
  and operand streaming overlap imperfectly (a p-norm of the two times: skinny GEMMs are memory bound).
  A grouped GEMM run as one kernel per group, a few streams at a time (Transformer Engine's experts), takes
  rounds of that many concurrent kernels.
- Attention (fused, FlashAttention-style): one tile per block of queries walks the key blocks it sees (a
  causal mask halves the walk but computes whole diagonal blocks), plus a fixed per-tile cost; the softmax
  work per score makes small head dimensions slower; the backward pass runs at its own fraction of forward, a
  low precision (FP8) at its own fraction of the efficiency where the device file gives one. A sliding window
  costs each query tile that masks its far edge an extra, the same in both passes, in inverse proportion to the
  window's key blocks. Above head dim 128 the backward loses efficiency by a power of 128 / head dim, where a
  device file fits one (cuDNN's latent-attention backward, head dims 192/128, measures it).
  FLOPs are counted as FlashAttention's benchmarks count them (backward = 2.5 x forward).
- Memory-bound operators (element-wise, norms, activations, softmax, embedding, loss, optimizer step): bytes at a
  per-class fraction of HBM bandwidth, or their FLOPs at the FP32 rate if that is slower; a node that is several
  kernels in a row (``kernel_count``) pays a launch for each.

Every kernel also costs a fixed launch time. A node without a usable shape is timed by a roofline with the
device's large-GEMM and element-wise efficiencies (``fallback_s``). All times are non-decreasing in every
dimension and non-increasing in peak FLOP/s and bandwidth; the efficiency (roofline time / time) is in (0, 1].
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from compute.shapes import DTYPE_BYTES, SCAN_CLASS, AttentionShape, GemmShape, OpShape, math_precision

if TYPE_CHECKING:  # a run that does not time kernels imports neither
    from compute.devices import Device
    from compute.kernel_params import GemmParams

WIDE_HEAD = 128  # the head dim of the attention rows the efficiencies are fitted on; wider heads: _wide_head
MEMORY_CLASSES_BY_OP = {"elementwise", "norm", "activation", "softmax", "embedding", "loss", "optimizer", "quantize"}


class KernelModel:
    """Times operators on ``device``; results are cached per shape (traces repeat a few shapes many times)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.params = device.kernels
        self.bandwidth = device.memory_bw_GBps * 1e9
        self.units = device.compute_units
        self.gap_s = self.params.launch_overhead_us * 1e-6
        self.time_ns = lru_cache(maxsize=1 << 16)(self._time_ns)  # type: ignore[method-assign]

    # --- the entry point -------------------------------------------------------------------------------------
    def _time_ns(self, shape: OpShape | None, num_ops: int, tensor_size: int) -> int:
        """A node's time in whole ns: its shape's model, or (``shape`` None) the fallback on FLOPs and bytes.
        No work at all takes 0 ns (it finishes at once, as in ASTRA-sim's roofline)."""
        seconds = self.seconds(shape, num_ops, tensor_size)
        return 0 if seconds <= 0 else max(1, round(seconds * 1e9))

    def seconds(self, shape: OpShape | None, num_ops: int, tensor_size: int) -> float:
        if shape is None:
            return self.fallback_s(num_ops, tensor_size)
        if shape.gemm is not None:
            return self.gemm_s(shape.gemm, self.device.math_dtype(shape.dtype))
        if shape.attention is not None:
            return self.attention_s(shape.attention, self.device.math_dtype(shape.dtype))
        return self.memory_s(memory_class(shape), tensor_size, num_ops, shape.kernels)

    def efficiency(self, shape: OpShape | None, num_ops: int, tensor_size: int) -> float:
        """Roofline time / modelled time: how close to the device's peaks the kernel runs (0, 1]."""
        seconds = self.seconds(shape, num_ops, tensor_size)
        if seconds <= 0:
            return 1.0
        dtype = self.device.math_dtype(shape.dtype if shape is not None else "bf16")
        flops, size = num_ops, tensor_size
        if shape is not None and shape.gemm is not None:
            flops, size = shape.gemm.flops, gemm_bytes(shape.gemm, dtype)
        elif shape is not None and shape.attention is not None:
            flops, size = shape.attention.flops, attention_bytes(shape.attention, dtype)
        peak = self.device.peak_flops(dtype) if shape is None or shape.gemm or shape.attention else \
            self.device.peak_flops("fp32")
        return max(flops / peak, size / self.bandwidth) / seconds

    # --- GEMM ------------------------------------------------------------------------------------------------
    def gemm_s(self, g: GemmShape, dtype: str) -> float:
        p = self.params.gemm
        scale = self.params.scale("gemm") * (self.params.scale("fp8_gemm") if math_precision(dtype) == "fp8" else 1.0)
        eff = min(1.0, p.efficiency * precision_efficiency(p.dtype_efficiency, dtype) * scale)
        flops = self.device.peak_flops(dtype) * eff
        operand, result = DTYPE_BYTES[dtype], result_bytes(g, dtype)  # bytes per element
        batched = float(gemm_seconds(g.m, g.n, g.k, g.batch, operand, flops, self.units, self.bandwidth, p, result))
        if g.streams and g.batch > g.streams:  # one kernel per product, ``streams`` at a time: rounds of them
            rounds, rest = divmod(g.batch, g.streams)
            seconds = rounds * gemm_seconds(g.m, g.n, g.k, g.streams, operand, flops, self.units, self.bandwidth, p,
                                            result)
            if rest:
                seconds += gemm_seconds(g.m, g.n, g.k, rest, operand, flops, self.units, self.bandwidth, p, result)
            # each round may pick its own tile shape, which one batched kernel cannot: never count that as a gain
            return max(float(seconds), batched) + self.gap_s
        return batched + self.gap_s

    # --- attention -------------------------------------------------------------------------------------------
    def attention_s(self, a: AttentionShape, dtype: str) -> float:
        if not a.flash:
            return self._unfused_attention_s(a, dtype)
        p = self.params.attention
        query_tiles = -(-a.seq_q // p.block_q)
        per_tile = (_key_blocks(a.seq_q, a.seq_kv, a.causal, p.block_q, p.block_kv, a.window) / query_tiles
                    + p.tile_overhead)
        tiles = a.batch * a.heads * query_tiles
        waves = float(_waves(tiles / self.units, p.wave_quantization))
        scale, peak = self.params.scale("attention"), self.device.peak_flops(dtype)
        eff = (p.efficiency * precision_efficiency(p.dtype_efficiency, dtype)
               * a.head_dim / (a.head_dim + p.head_dim_half))
        forward_eff = min(1.0, eff * scale)
        if a.backward:
            eff *= p.backward_efficiency * _wide_head(a.head_dim, p.backward_head_dim_exponent)
        eff = min(1.0, eff * scale)
        forward_block_flops = 4 * p.block_q * p.block_kv * a.head_dim
        block_flops = forward_block_flops * (2.5 if a.backward else 1.0)
        compute = waves * per_tile * block_flops / (peak * eff / self.units)
        if a.window and a.causal and p.window_tile_cost:  # the window's far edge, masked: the same in both passes,
            # shrinking as the window widens (a tile walking many key blocks amortises it); never dearer than the
            # causal kernel without the window (a window covering nearly all keys skips little)
            edge = (_window_edge_tiles(a.seq_q, a.seq_kv, p.block_q, a.window) / query_tiles
                    * p.block_kv / max(a.window, p.block_kv))
            unwindowed = _key_blocks(a.seq_q, a.seq_kv, True, p.block_q, p.block_kv) / query_tiles + p.tile_overhead
            compute = min(compute + waves * edge * p.window_tile_cost * forward_block_flops
                          / (peak * forward_eff / self.units),
                          waves * unwindowed * block_flops / (peak * eff / self.units))
        memory = attention_bytes(a, dtype) / (self.bandwidth * self.params.gemm.memory_efficiency)
        return p.launch_us * 1e-6 + self.gap_s + max(compute, memory)

    def _unfused_attention_s(self, a: AttentionShape, dtype: str) -> float:
        """Scores materialised: batched GEMMs around a softmax over the whole score matrix (backward: four GEMMs
        and the softmax's gradient)."""
        bh = a.batch * a.heads
        scores = round(bh * a.seq_q * a.seq_kv * DTYPE_BYTES[dtype])
        if not a.backward:
            gemms = [GemmShape(a.seq_q, a.seq_kv, a.head_dim, bh), GemmShape(a.seq_q, a.head_dim, a.seq_kv, bh)]
            softmax = self.memory_s("softmax", 2 * scores, 0)
        else:
            gemms = [GemmShape(a.seq_kv, a.head_dim, a.seq_q, bh), GemmShape(a.seq_q, a.seq_kv, a.head_dim, bh),
                     GemmShape(a.seq_q, a.head_dim, a.seq_kv, bh), GemmShape(a.seq_kv, a.head_dim, a.seq_q, bh)]
            softmax = self.memory_s("softmax", 3 * scores, 0)
        return sum(self.gemm_s(g, dtype) for g in gemms) + softmax

    # --- memory-bound operators and the fallback ----------------------------------------------------------------
    def memory_s(self, op_class: str, size_bytes: int, flops: int, kernels: int = 1) -> float:
        """``size_bytes`` and ``flops`` of one class at its bandwidth efficiency, over ``kernels`` launches."""
        launch_us, eff = self.params.memory.of(op_class)
        eff = min(1.0, eff * self.params.scale("memory"))
        # the Mamba-2 scan's products run on the tensor cores (16-bit); every other class's arithmetic is fp32
        peak = self.device.peak_flops("bf16" if op_class == SCAN_CLASS else "fp32")
        work = max(size_bytes / (self.bandwidth * eff), flops / peak)
        return kernels * (launch_us * 1e-6 + self.gap_s) + work if work > 0 else 0.0

    def fallback_s(self, num_ops: int, tensor_size: int) -> float:
        """A node known only by FLOPs and bytes: the roofline at the device's large-GEMM efficiency and its
        element-wise bandwidth efficiency, plus a launch."""
        if num_ops <= 0 and tensor_size <= 0:
            return 0.0
        g = self.params.gemm
        launch_us, eff = self.params.memory.of("elementwise")
        compute = num_ops / (self.device.peak_flops("bf16") * min(1.0, g.efficiency * self.params.scale("gemm")))
        memory = tensor_size / (self.bandwidth * min(1.0, eff * self.params.scale("memory")))
        return launch_us * 1e-6 + self.gap_s + max(compute, memory)


def precision_efficiency(efficiencies: dict[str, float], dtype: str) -> float:
    """A precision's efficiency relative to the 16-bit one; a block-scaled format without its own, its element
    precision's."""
    found = efficiencies.get(dtype)
    return found if found is not None else efficiencies.get(math_precision(dtype), 1.0)


def memory_class(shape: OpShape) -> str:
    """The memory-bound parameter class timing ``shape``: its op_class, except that NVFP4 quantization (quantize in
    fp4: a Hadamard transform, stochastic rounding, 16 x 16 weight blocks) is slower per byte than an FP8 cast and
    has its own class, quantize_fp4."""
    return "quantize_fp4" if shape.op_class == "quantize" and shape.dtype == "fp4" else shape.op_class


def gemm_seconds(m: Any, n: Any, k: Any, batch: Any, dtype_bytes: Any, flops: float, units: int, bandwidth: float,
                 p: GemmParams, result: Any = None) -> Any:
    """GEMM time(s) for scalars or NumPy arrays of dimensions (the fit evaluates whole tables at once); ``flops``:
    the precision's peak times the GEMM efficiency; ``result``: bytes moved per result element (default
    ``dtype_bytes``, written once)."""
    per_unit = flops / units  # one compute unit's FLOP/s on the first tile
    compute: Any = np.inf
    for rows, cols, relative in p.tiles:
        tiles = np.ceil(m / rows) * np.ceil(n / cols) * batch
        waves = _waves(tiles / units, p.wave_quantization)
        compute = np.minimum(compute, waves * 2 * rows * cols * (k + p.k_fill) / (per_unit * relative))
    result = dtype_bytes if result is None else result
    memory = ((m * k + k * n) * dtype_bytes + m * n * result) * batch / (bandwidth * p.memory_efficiency)
    return p.launch_us * 1e-6 + _pnorm(compute, memory, p.overlap)


def gemm_bytes(g: GemmShape, dtype: str) -> int:
    """Operands read (in ``dtype``; FP4 packs two elements in a byte) and the result's traffic (result_bytes)."""
    return round(((g.m * g.k + g.k * g.n) * DTYPE_BYTES[dtype] + g.m * g.n * result_bytes(g, dtype)) * g.batch)


def result_bytes(g: GemmShape, dtype: str) -> float:
    """Bytes moved per element of ``g``'s result: written once in ``dtype``, or read and written at its
    accumulation width (a weight gradient added into its main gradient)."""
    return 2 * g.accumulate_bytes if g.accumulate_bytes else DTYPE_BYTES[dtype]


def attention_bytes(a: AttentionShape, dtype: str) -> int:
    """Q, K, V read and O written (backward: also O, dO read and dQ, dK, dV written)."""
    q = a.batch * a.seq_q * a.heads * a.head_dim
    kv = a.batch * a.seq_kv * a.kv_heads * a.head_dim
    return round((4 * q + 4 * kv if a.backward else 2 * q + 2 * kv) * DTYPE_BYTES[dtype])


def _waves(waves: Any, quantization: float) -> Any:
    """Waves of tiles a kernel takes: between the exact share and whole waves."""
    return quantization * np.ceil(waves) + (1 - quantization) * waves


def _pnorm(a: Any, b: Any, p: float) -> Any:
    """(a^p + b^p)^(1/p), computed from the larger term (no overflow); a and b are non-negative."""
    top = np.maximum(np.maximum(a, b), 1e-300)
    return top * ((a / top) ** p + (b / top) ** p) ** (1 / p)


def _wide_head(head_dim: int, exponent: float) -> float:
    """The backward's efficiency factor at a head dim above 128 (the fitted rows'): (128 / head_dim) ** exponent."""
    return (WIDE_HEAD / head_dim) ** exponent if head_dim > WIDE_HEAD and exponent else 1.0


def _window_edge_tiles(seq_q: int, seq_kv: int, block_q: int, window: int) -> int:
    """Query tiles of one (sequence, head) whose last query's window starts after the first key: the tiles that
    mask the window's far edge."""
    query_tiles = -(-seq_q // block_q)
    offset = max(seq_kv - seq_q, 0)
    ends = np.minimum(np.arange(1, query_tiles + 1, dtype=np.int64) * block_q, seq_q) + offset
    return int(np.count_nonzero(ends > window))


def _key_blocks(seq_q: int, seq_kv: int, causal: bool, block_q: int, block_kv: int, window: int = 0) -> float:
    """Key blocks all query tiles of one (sequence, head) visit. Causal: the queries are the last ``seq_q`` of
    ``seq_kv`` positions, and a tile stops at the block holding its last query's position; with a sliding window
    it starts at the block holding the first key its first query sees."""
    query_tiles = -(-seq_q // block_q)
    if not causal:
        return float(query_tiles * -(-seq_kv // block_kv))
    offset = max(seq_kv - seq_q, 0)
    starts = np.arange(query_tiles, dtype=np.int64) * block_q + offset
    ends = np.minimum(starts - offset + block_q, seq_q) + offset
    first = np.maximum(starts + 1 - window, 0) // block_kv if window else 0
    return float(np.sum(-(-ends // block_kv) - first))
