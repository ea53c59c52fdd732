"""What a published row measured, and how a predicted step time becomes the same metric.

Sources publish different things: a step (iteration) time, tokens per second per GPU, TFLOP/s per GPU counted
with their own FLOP formula, or MFU. A prediction is one step time; it is compared in the row's own metric
(error = predicted / published - 1, so a throughput error is positive when the prediction is too fast and a
step-time error positive when it is too slow) and, for a figure common to every row, as a step time
(``step_time_error``; the published step time is derived from the row's metric where the source prints none).

FLOP formulas, as the sources define them (our own implementation of the published equations):
- Megatron-LM SC'21 (Narayanan et al. 2021, eq. 3): F = 96 B s l h^2 (1 + s / 6h + V / 16lh), which counts the
  recomputed forward pass (activation recomputation).
- Megatron-Core (Megatron-LM training.py, num_floating_point_operations; its README's H100 table): model FLOPs
  F = 12 B s l h^2 [(1 + g/a + s/h) q/h + (f/h) k m + V / 2lh], with a heads, g key/value groups, q the
  query projection width, f the FFN width, k experts per token, m = 3/2 for a gated FFN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# metric column -> (what it is, True when larger is faster)
METRICS = {"step_time_s": ("step time (s)", False), "tokens_per_s_per_gpu": ("tokens/s per GPU", True),
           "tflops_per_gpu": ("TFLOP/s per GPU", True), "mfu": ("MFU", True)}


def sc21_flops(model: dict[str, Any], global_batch: int) -> float:
    """Megatron-LM SC'21 eq. (3): FLOPs of one iteration with activation recomputation."""
    s, h, layers, vocab = model["seq_len"], model["hidden_size"], model["num_layers"], model["vocab_size"]
    return 96 * global_batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def megatron_core_flops(model: dict[str, Any], global_batch: int, causal: bool = False) -> float:
    """Megatron-Core's model FLOPs of one iteration (forward and backward, no recomputation); ``causal``: the
    attention scores counted over half the matrix, as Megatron-LM's count has done since 2025 (at 1e057005, May
    2025: "only half of the attention matrix is non-zero")."""
    s, h, layers, vocab = model["seq_len"], model["hidden_size"], model["num_layers"], model["vocab_size"]
    heads = model["num_heads"]
    groups = model.get("num_kv_heads") or heads
    head_dim = model.get("head_dim") or h // heads
    gated = 1.5 if model.get("gated_ffn") else 1.0
    top_k = model.get("top_k", 1) if model.get("num_experts", 1) > 1 else 1
    attention = (1 + groups / heads + s / h / (2 if causal else 1)) * (heads * head_dim / h)
    mlp = model["ffn_hidden_size"] / h * top_k * gated
    return 12 * global_batch * s * layers * h * h * (attention + mlp + vocab / (2 * layers * h))


FLOP_FORMULAS: dict[str, tuple[str, Callable[[dict[str, Any], int], float]]] = {
    "megatron_sc21_t1": ("SC'21 eq. (3), counting the recomputed forward", sc21_flops),
    "megatron_readme_h100": ("Megatron-Core model FLOPs", megatron_core_flops),
    "megatron_moe_modelzoo": ("Megatron-LM's model FLOPs (causal attention counted half)",
                              lambda model, global_batch: megatron_core_flops(model, global_batch, causal=True)),
}


@dataclass(frozen=True, slots=True)
class Metric:
    """The row's metric and its published value; ``published_step_time_s`` in every case."""

    name: str  # a key of METRICS
    published: float
    published_step_time_s: float
    step_note: str  # "" when the source prints the step time, else how it was derived
    tokens: int  # tokens per iteration
    n_gpus: int
    flops: float  # the source's FLOPs of one iteration (0 when the metric needs none)
    peak_flops: float  # per GPU, for MFU (0 when not used)

    def predicted(self, step_time_s: float) -> float:
        """The metric of a predicted step time."""
        if self.name == "step_time_s":
            return step_time_s
        if self.name == "tokens_per_s_per_gpu":
            return self.tokens / (step_time_s * self.n_gpus)
        per_gpu = self.flops / (step_time_s * self.n_gpus)
        return per_gpu / 1e12 if self.name == "tflops_per_gpu" else per_gpu / self.peak_flops


def choose_metric(values: dict[str, float | None], source_id: str, model: dict[str, Any], global_batch: int,
                  n_gpus: int, peak_tflops: float | None) -> Metric | str:
    """The row's metric, by preference step time > tokens/s > TFLOP/s > MFU; a text saying why when the row
    gives nothing this can compare."""
    tokens = global_batch * model["seq_len"]
    step = values.get("step_time_s")
    if step:
        return Metric("step_time_s", step, step, "", tokens, n_gpus, 0.0, 0.0)
    rate = values.get("tokens_per_s_per_gpu")
    if rate:
        return Metric("tokens_per_s_per_gpu", rate, tokens / (rate * n_gpus),
                      "step = global batch x sequence / (tokens/s per GPU x GPUs)", tokens, n_gpus, 0.0, 0.0)
    formula = FLOP_FORMULAS.get(source_id)
    tflops, mfu = values.get("tflops_per_gpu"), values.get("mfu")
    if formula is None:
        return (f"no step time or tokens/s, and no FLOP formula for source {source_id!r} to compare TFLOP/s or "
                "MFU with")
    label, count = formula
    flops = count(model, global_batch)
    if tflops:
        return Metric("tflops_per_gpu", tflops, flops / (tflops * 1e12 * n_gpus),
                      f"step = {label} / (TFLOP/s per GPU x GPUs)", tokens, n_gpus, flops, 0.0)
    if mfu and peak_tflops:
        return Metric("mfu", mfu, flops / (mfu * peak_tflops * 1e12 * n_gpus),
                      f"step = {label} / (MFU x peak x GPUs)", tokens, n_gpus, flops, peak_tflops * 1e12)
    return "the row gives no step time, tokens/s, TFLOP/s or MFU"
