"""Published kernel measurements (``benchmarks/data/kernels/*.tsv``) as the kernel model sees them, and its error on
them: what the fit (compute/kernel_fit.py) minimises and benchmarks/kernel_model.py prints.

Four table layouts, told apart by their header:

- GEMM: ``device, dtype, m, n, k, batch, time_us, tflops, source_id, note``;
- GEMM set: ``device, dtype, recipe, quantization, gemms, time_us, source_id, note`` — the summed time of the GEMMs
  ``gemms`` lists (``MxNxK`` each, joined by ``+``: e.g. one layer's four forward GEMMs), as a source that prints
  only such sums gives them; ``recipe`` is the low-precision recipe (bf16, fp8_current, fp8_delayed, fp8_block, mxfp8,
  nvfp4) and ``quantization`` says whether the time includes quantizing the operands (``included``), was taken on
  operands quantized beforehand (``excluded``) or has none (``none``, BF16);
- attention: ``device, kernel, dtype, pass, batch, heads, head_dim, seq, causal, tflops, source_id, note`` (``pass``
  fwd, bwd or fwd_bwd; TFLOP/s as FlashAttention's benchmarks count them, the time derived from it), optionally
  ``kv_heads``, ``window`` (sliding-window keys) and ``time_us`` (the measured time, used where given);
- memory-bound: ``device, op_class, dtype, bytes, flops, time_us, source_id, note``.

A row's device is the name its source uses; aliases in the device files map it (H800 -> H100, GH200 -> H200).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from compute.kernels import KernelModel
from compute.shapes import AttentionShape, GemmShape, OpShape
from workload.errors import ConfigError

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "data", "kernels")
GEMM_COLUMNS = ("device", "dtype", "m", "n", "k", "batch", "time_us")
GEMM_SET_COLUMNS = ("device", "dtype", "recipe", "quantization", "gemms", "time_us")
QUANTIZATION = ("none", "included", "excluded")
# other models' attention (cuDNN's benchmark of them): its sliding-window rows and its latent-attention (``kernel``
# LATENT_KERNEL) backward rows are fitted, the rest are checks
MODELS_TABLE = "cudnn_sdpa_models.tsv"
LATENT_KERNEL = "cudnn_mla"
# XLA's matmul table times one grid of GEMMs on a Blackwell and a Hopper GPU: the Blackwell GEMM shape terms are
# fitted on the ratio of the two (benchmarks/fit_kernel_model.py), never on either GPU's own times
GENERATIONS_TABLE = "xla_matmul.tsv"
ATTENTION_COLUMNS = ("device", "kernel", "dtype", "pass", "batch", "heads", "head_dim", "seq", "causal", "tflops")
MEMORY_COLUMNS = ("device", "op_class", "dtype", "bytes", "flops", "time_us")
# Where each table's rows come from (the ``source_id`` column): pinned address and licence.
SOURCES = {
    "vidur": ("microsoft/vidur profiling data (FP16 kernels of one transformer block, CUDA times by token count)",
              "https://github.com/microsoft/vidur/tree/7d47513363ec447a741ac5e47241580b47724fbf/data/profiling/compute",
              "MIT"),
    "fa2_readme_a100": ("FlashAttention-2 forward+backward benchmark, A100 80GB SXM4 (README figure)",
                        "https://github.com/Dao-AILab/flash-attention/blob/4f285b354796fb17df8636485b9a04df3ebbb7dc/"
                        "assets/flash2_a100_fwd_bwd_benchmark.png", "BSD-3-Clause"),
    "fa2_readme_h100": ("FlashAttention-2 forward+backward benchmark, H100 80GB SXM5 (README figure)",
                        "https://github.com/Dao-AILab/flash-attention/blob/4f285b354796fb17df8636485b9a04df3ebbb7dc/"
                        "assets/flash2_h100_fwd_bwd_benchmark.png", "BSD-3-Clause"),
    "fa3_readme_h100": ("FlashAttention-3 forward benchmark vs FlashAttention-2 and cuDNN, H100 80GB SXM5 (README "
                        "figure)", "https://github.com/Dao-AILab/flash-attention/blob/"
                        "7ef24848cf2f855077cef88fe122775b727dcd74/assets/flash3_fp16_fwd.png", "BSD-3-Clause"),
    "deepgemm_readme": ("DeepGEMM FP8 GEMM throughput on H800 (README tables, first release)",
                        "https://github.com/deepseek-ai/DeepGEMM/blob/a6d97a1c1b48a7a9d7994d0e155ee6f11d0a3f07/README.md",
                        "MIT"),
    "torchao_mx_b200": ("torchao MXFP8 quantization kernel microbenchmarks, B200 1000 W (16384 x 16384 casts)",
                        "https://github.com/pytorch/ao/blob/36027d82d1ad9949597ea16002ff4940374b1b94/docs/source/"
                        "workflows/training.md#quantization-kernel-microbenchmarks", "BSD-3-Clause"),
    "torchao_nvfp4_gb200": ("torchao NVFP4 training kernel benchmarks, GB200 (CuTe DSL kernels, Llama 3 shapes)",
                            "https://github.com/pytorch/ao/blob/36027d82d1ad9949597ea16002ff4940374b1b94/benchmarks/"
                            "prototype/nvfp4_training/README.md", "BSD-3-Clause"),
    "torchao_moe_mxfp8": ("torchao MXFP8 MoE training kernel breakdown, B200 1000 W (DeepSeek-V3 expert GEMMs, "
                          "scaled grouped GEMMs; checks, not fitted)",
                          "https://github.com/pytorch/ao/blob/36027d82d1ad9949597ea16002ff4940374b1b94/torchao/"
                          "prototype/moe_training/README.md#kernel-microbenchmarks-breakdown-by-pass", "BSD-3-Clause"),
    "cudnn_sdpa_a": ("cuDNN SDPA training benchmark, Llama 3.1 attention, GB200 and GB300, cuDNN 9.22 (cudnn-frontend "
                     "benchmark results)", "https://github.com/NVIDIA/cudnn-frontend/tree/"
                     "3929da2ef4c1dba1bb8acb68727b9134f26f40c0/benchmark/sdpa_benchmark_training/results/llama3.1",
                     "MIT"),
    "cudnn_sdpa_models": ("cuDNN SDPA training benchmark, other models' attention (GPT-OSS sliding window; DeepSeek-V3 "
                          "and Kimi K2.6 latent attention, Qwen3.5, LTX-2, Wan 2.2), GB200 and GB300 cuDNN 9.22, H200 "
                          "cuDNN 9.19.1 (cudnn-frontend benchmark results; the window and latent-attention backward "
                          "rows fitted, the rest checks)",
                          "https://github.com/NVIDIA/cudnn-frontend/tree/3929da2ef4c1dba1bb8acb68727b9134f26f40c0/"
                          "benchmark/sdpa_benchmark_training/results", "MIT"),
    "cudnn_sdpa_b": ("cuDNN SDPA training benchmark, Llama 3.1 attention, GB200, GB300 and H200, cuDNN 9.19.1 "
                     "(cudnn-frontend benchmark results)", "https://github.com/NVIDIA/cudnn-frontend/tree/"
                     "afa9f7c0be7e4b384c7cdb5729a4247cd34950a8/benchmark/sdpa_benchmark_training/results", "MIT"),
    "cudnn_sdpa_d": ("cuDNN SDPA training benchmark, Llama 3.1 405B attention, B200, cuDNN 9.13.1 (cudnn-frontend "
                     "artifacts)", "https://github.com/NVIDIA/cudnn-frontend/blob/"
                     "0b1577c8c83401237d601d0d0db5210506705396/benchmark/sdpa_benchmark_training/artifacts/"
                     "sdpa_fp8_benchmark_results_NVIDIA_B200.csv", "MIT"),
    **{f"cudnn_norm_{p}": (f"cuDNN RMSNorm/LayerNorm benchmark, {what} pass, GB200, GB300 and H200, cuDNN 9.19.1 "
                           "(cudnn-frontend benchmark results)", "https://github.com/NVIDIA/cudnn-frontend/tree/"
                           "3929da2ef4c1dba1bb8acb68727b9134f26f40c0/benchmark/norms/results", "MIT")
       for p, what in (("fwd", "forward"), ("bwd", "backward"))},
    "te_gemm_profiling": ("Transformer Engine GEMM profiling guide, B300 and H200 NVL (one layer's GEMMs by recipe)",
                          "https://github.com/NVIDIA/TransformerEngine/blob/1609c890ee7da24393ce62a2680e0ebb0b4eb5f6/"
                          "docs/examples/gemm_profiling/gemm_profiling.rst", "Apache-2.0"),
    "xla_matmul": ("XLA's GPU cost model matmul table: BF16 GEMMs of 256-4096 per dimension, batch 1, 2 and 4, on "
                   "sm_100 (B200 class) and sm_90 (H100 class); its FP8 columns left out (sm_90's exceed H100's FP8 "
                   "peak); the Blackwell shape terms fitted on its Blackwell over Hopper time ratios",
                   "https://github.com/tensorflow/tensorflow/blob/a305421c45a1ea5117c170b8d8a00a51f9dcee8f/third_party/"
                   "xla/xla/backends/gpu/cost_model/matmul_interpolator_data.h", "Apache-2.0"),
    "mamf": ("Maximum achievable matmul FLOPS per accelerator (ml-engineering, mamf-finder.py)",
             "https://github.com/stas00/ml-engineering/blob/744d01e18b79512572f64a6bbd8b5f4a725203a7/compute/"
             "accelerator/README.md#maximum-achievable-matmul-flops-comparison-table", "CC-BY-SA-4.0"),
}


@dataclass(frozen=True, slots=True)
class Measurement:
    """One published kernel time: the operator passes it times (summed: fwd_bwd is two), as the model sees them."""

    table: str
    device: str
    family: str  # gemm | attention | memory
    kernel: str  # the library or kernel where the source names it (fa2, cudnn, fa3), a GEMM set's recipe, else ""
    shapes: tuple[OpShape, ...]
    num_ops: int  # memory-bound rows: FLOPs; else 0 (the shapes carry the work)
    size_bytes: int  # memory-bound rows: bytes moved
    time_us: float
    source_id: str
    note: str

    def predicted_us(self, model: KernelModel) -> float:
        return sum(model.seconds(s, self.num_ops, self.size_bytes) for s in self.shapes) * 1e6

    @property
    def flops(self) -> int:
        return sum(s.gemm.flops if s.gemm else s.attention.flops if s.attention else 0 for s in self.shapes)


def read_table(path: str) -> list[Measurement]:
    name = os.path.basename(path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        return []
    columns = set(rows[0])
    try:
        if set(ATTENTION_COLUMNS) <= columns:
            return [_attention(name, r) for r in rows]
        if set(GEMM_SET_COLUMNS) <= columns:
            return [_gemm_set(name, r) for r in rows]
        if set(GEMM_COLUMNS) <= columns:
            return [_gemm(name, r) for r in rows]
        if set(MEMORY_COLUMNS) <= columns:
            return [_memory(name, r) for r in rows]
    except (KeyError, ValueError) as e:
        raise ConfigError(f"{name}: a row has a missing or bad value ({e})") from None
    raise ConfigError(f"{name}: the header matches no kernel table layout (GEMM, GEMM set, attention, memory-bound)")


def read_tables(paths: Iterable[str] | None = None) -> list[Measurement]:
    """Every table in ``paths`` (default: every .tsv of the shipped data folder), in a fixed order."""
    if paths is None:
        paths = sorted(os.path.join(DATA_DIR, f) for f in os.listdir(DATA_DIR) if f.endswith(".tsv"))
    return [m for p in paths for m in read_table(p)]


def _gemm(table: str, r: dict[str, str]) -> Measurement:
    shape = OpShape("gemm", r["dtype"], gemm=GemmShape(int(r["m"]), int(r["n"]), int(r["k"]), int(r["batch"])))
    return Measurement(table, r["device"], "gemm", "", (shape,), 0, 0, float(r["time_us"]), r.get("source_id", ""),
                       r.get("note", ""))


def _gemm_set(table: str, r: dict[str, str]) -> Measurement:
    """Summed GEMMs: the kernel is the recipe, marked ``+quantize`` when the time includes quantizing the operands."""
    if r["quantization"] not in QUANTIZATION:
        raise ValueError(f"quantization {r['quantization']!r} is not one of {', '.join(QUANTIZATION)}")
    shapes = []
    for gemm in r["gemms"].split("+"):
        m, n, k = (int(x) for x in gemm.lower().split("x"))
        shapes.append(OpShape("gemm", r["dtype"], gemm=GemmShape(m, n, k, 1)))
    kernel = r["recipe"] + ("+quantize" if r["quantization"] == "included" else "")
    return Measurement(table, r["device"], "gemm", kernel, tuple(shapes), 0, 0, float(r["time_us"]),
                       r.get("source_id", ""), r.get("note", ""))


def _attention(table: str, r: dict[str, str]) -> Measurement:
    """Optional columns: ``kv_heads`` (default ``heads``), ``window`` (a sliding window's keys, 0 = none) and
    ``time_us`` (the measured time, where the source prints it: TFLOP/s then only restate it)."""
    b, h, d, s = int(r["batch"]), int(r["heads"]), int(r["head_dim"]), int(r["seq"])
    kv, window = int(r.get("kv_heads") or h), int(r.get("window") or 0)
    causal = r["causal"].lower() == "true"
    passes = {"fwd": (False,), "bwd": (True,), "fwd_bwd": (False, True)}[r["pass"]]
    shapes = tuple(OpShape("attention", r["dtype"], attention=AttentionShape(b, h, kv, d, s, s, causal, backward,
                                                                             window=window))
                   for backward in passes)
    if r.get("time_us"):
        time_us = float(r["time_us"])
    else:
        forward_flops = 4 * b * s * s * h * d / (2 if causal else 1)  # FlashAttention's benchmark count
        flops = forward_flops * sum(2.5 if backward else 1.0 for backward in passes)
        time_us = flops / (float(r["tflops"]) * 1e12) * 1e6
    return Measurement(table, r["device"], "attention", r["kernel"], shapes, 0, 0, time_us, r.get("source_id", ""),
                       r.get("note", ""))


# the generations table's shape classes, by a GEMM's smallest side (rows counted over the batch): how far it is from
# filling the GPU
GENERATION_CLASSES = (("smallest side >= 2048", 2048), ("smallest side 1024", 1024), ("smallest side <= 512", 0))


def generation_class(m: Measurement) -> str:
    """The GENERATION_CLASSES name of a GEMM row."""
    g = m.shapes[0].gemm
    side = min(g.m * g.batch, g.n, g.k)
    return next(name for name, least in GENERATION_CLASSES if side >= least)


def generation_pairs(rows: Sequence[Measurement], new: str, old: str) -> list[tuple[Measurement, Measurement]]:
    """The generations table's rows as (``new`` GPU, ``old`` GPU) pairs timing one GEMM shape, in the table's order
    (``new`` and ``old``: the device names the rows carry)."""
    table = [m for m in rows if m.table == GENERATIONS_TABLE]
    by_shape = {m.shapes[0].gemm: m for m in table if m.device == old}
    return [(m, by_shape[m.shapes[0].gemm]) for m in table if m.device == new and m.shapes[0].gemm in by_shape]


def windowed(m: Measurement) -> bool:
    """A sliding-window attention row."""
    return any(s.attention is not None and s.attention.window > 0 for s in m.shapes)


def _memory(table: str, r: dict[str, str]) -> Measurement:
    shape = OpShape(r["op_class"], r["dtype"])
    return Measurement(table, r["device"], "memory", "", (shape,), int(r["flops"]), int(r["bytes"]),
                       float(r["time_us"]), r.get("source_id", ""), r.get("note", ""))


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """|predicted / measured - 1| over a group of rows."""

    rows: int
    mean: float
    median: float
    p90: float
    max: float
    bias: float  # mean signed error

    def to_dict(self) -> dict[str, float | int]:
        return {"rows": self.rows, "mean_abs_error": _round(self.mean), "median_abs_error": _round(self.median),
                "p90_abs_error": _round(self.p90), "max_abs_error": _round(self.max), "mean_error": _round(self.bias)}


def errors(model: KernelModel, rows: Sequence[Measurement]) -> np.ndarray:
    return np.array([m.predicted_us(model) / m.time_us - 1 for m in rows])


def summarize(errs: np.ndarray) -> ErrorSummary:
    a = np.abs(errs)
    return ErrorSummary(len(errs), float(a.mean()), float(np.median(a)), float(np.percentile(a, 90)), float(a.max()),
                        float(errs.mean()))


def _round(x: float) -> float:
    return float(f"{x:.4g}")
