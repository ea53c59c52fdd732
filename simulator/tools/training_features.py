"""What a published run did, in the LLM generator's own option names: the one table that maps a row's layout to
``generate: llm`` keys, and the framework defaults a blank field takes.

Every feature a row may need is listed once in ``FEATURES`` with the generator option(s) that express it, in
order of preference; the first option the generator has (its key exists and accepts the value) is used. A
feature none of whose options exists is reported ("needs: interleaved pipeline schedule (generator option vp)")
and the row is not simulated: nothing stands in for it. As the generator grows options with these names, the
rows that need them start running without a change here.

Two entries use an older option as an exact equivalent: Megatron's distributed optimizer is ZeRO stage 1 in
the generator (gradients reduce-scattered over data parallelism, the optimizer step on the shard, parameters
all-gathered after it), and FSDP is ZeRO stage 3 (parameters all-gathered per layer, forward and backward).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

VALUE = object()  # in an option: the row's own value (e.g. the number of virtual stages)


@dataclass(frozen=True, slots=True)
class Feature:
    label: str
    options: tuple[tuple[str, Any], ...]  # (generator key, value or VALUE); empty: no generator can express it
    minor: bool = False  # a small effect: without the option the row still runs, the report lists it as left out
    structural: bool = False  # changes the number of ranks: --approximate cannot leave it out


FEATURES: dict[str, Feature] = {
    "tp": Feature("tensor parallelism", (("tp", VALUE),), structural=True),
    "pp": Feature("pipeline parallelism", (("pp", VALUE),), structural=True),
    "dp": Feature("data parallelism", (("dp", VALUE),), structural=True),
    "ep": Feature("expert parallelism", (("ep", VALUE),), structural=True),
    "etp": Feature("expert tensor parallelism apart from tensor parallelism", (("etp", VALUE),)),
    "vp": Feature("interleaved pipeline schedule", (("vp", VALUE), ("virtual_pipeline", VALUE))),
    "cp": Feature("context parallelism", (("cp", VALUE),), structural=True),
    "account_for_embedding": Feature("the embedding counted as a layer in the pipeline split",
                                     (("account_for_embedding", True),)),
    "account_for_loss": Feature("the loss counted as a layer in the pipeline split", (("account_for_loss", True),)),
    "sequence_parallel": Feature("sequence parallelism", (("sequence_parallel", True),)),
    "full_recompute": Feature("full activation recompute", (("recompute", "full"), ("activation_recompute", True))),
    "selective_recompute": Feature("selective activation recompute (attention core)", (("recompute", "selective"),)),
    "recompute_modules": Feature("the modules selective recompute runs again", (("recompute_modules", VALUE),)),
    "distributed_optimizer": Feature("distributed optimizer", (("use_distributed_optimizer", True), ("zero", 1))),
    "fsdp": Feature("FSDP (parameters gathered per layer)", (("fsdp", True), ("zero", 3))),
    "fp8": Feature("FP8 GEMMs", (("precision", "fp8"),)),
    "fp4": Feature("FP4 GEMMs", (("precision", "fp4"),)),
    "fp8_tensorwise": Feature("FP8 current scaling (each tensor's own amax before its cast)",
                              (("fp8_recipe", "tensorwise"),)),
    "fp8_delayed": Feature("FP8 delayed scaling (amax history)", (("fp8_recipe", "delayed"),)),
    "mxfp8": Feature("MXFP8 block scaling", (("fp8_recipe", "mxfp8"),)),
    "overlap_grad_reduce": Feature("gradient reduction overlapped with backward", (("overlap_grad_reduce", True),)),
    "overlap_param_gather": Feature("parameter all-gather overlapped with forward", (("overlap_param_gather", True),)),
    "tp_comm_overlap": Feature("tensor-parallel communication overlapped with GEMMs", (("tp_comm_overlap", True),)),
    "pp_scatter_gather": Feature("pipeline scatter/gather of activations over tensor-parallel ranks",
                                 (("pp_scatter_gather", True),)),
    "no_grad_overlap": Feature("gradient reduction after the whole backward (no overlap)",
                               (("overlap_grad_reduce", False),), minor=True),
    "megatron_buckets": Feature("Megatron-Core's gradient bucket size", (("ddp_bucket_size", "megatron"),),
                                minor=True),
    "grad_reduce_in_fp32": Feature("gradient reduction in fp32", (("grad_reduce_in_fp32", True),), minor=True),
    "fp8_param_gather": Feature("the distributed optimizer's parameter all-gathers in FP8",
                                (("fp8_param_gather", True),), minor=True),
    "unfused_attention": Feature("attention core without a fused kernel (scores materialised, before "
                                 "FlashAttention)", (("attention_backend", "unfused"),)),
    "unfused_cross_entropy": Feature("the loss in fp32 passes over the logits (no cross-entropy fusion)",
                                     (("cross_entropy", "unfused"),)),
    "moe_host_sync": Feature("the dropless MoE dispatcher's host wait for the token counts and the expert "
                             "section's host issue time", (("moe_host_sync", True),)),
    "moe_flex_dispatcher": Feature("the flex MoE dispatcher (DeepEP/HybridEP): a token once per destination rank",
                                   (("moe_dispatcher", "flex"),), minor=True),
    "moe_a2a_overlap": Feature("expert-parallel all-to-alls overlapped with another micro-batch's compute "
                               "(Megatron-Core's EP A2A overlap)", (("moe_a2a_overlap", True),)),
    "moe_flex_backend": Feature("the flex dispatcher's library (HybridEP all-gathers the routing map)",
                                (("moe_flex_backend", VALUE),), minor=True),
    "moe_fused_mlp": Feature("the experts' MLP as Transformer Engine's fused grouped MLP (one kernel per grouped "
                             "GEMM, the activation and casts inside them)", (("moe_fused_mlp", True),), minor=True),
    "activation_offload_layers": Feature("the first layers' activations offloaded to host memory (Megatron-Core's "
                                         "cpu_offloading_num_layers)", (("activation_offload_layers", VALUE),),
                                         minor=True),
    "fp8_attention": Feature("the attention core in FP8 (Megatron-Core's fp8_dot_product_attention)",
                             (("fp8_attention", True),), minor=True),
    "bf16_layers_at_start": Feature("the first layers' GEMMs kept 16-bit under FP8/FP4",
                                    (("bf16_layers_at_start", VALUE),), minor=True),
    "bf16_layers_at_end": Feature("the last layers' GEMMs kept 16-bit under FP8/FP4",
                                  (("bf16_layers_at_end", VALUE),), minor=True),
    "bf16_gemms": Feature("GEMMs kept 16-bit in every layer under FP8/FP4 (quantization recipes by module)",
                          (("bf16_gemms", VALUE),), minor=True),
    "mxfp8_gemms": Feature("GEMMs of an NVFP4 step run in MXFP8 (quantization recipes by module)",
                           (("mxfp8_gemms", VALUE),), minor=True),
    "host_cpu": Feature("the host CPU issuing the kernels", (("host_cpu", VALUE),), minor=True),
    "cuda_graph_scope": Feature("CUDA graphs replaying what they capture without the host",
                                (("cuda_graph_scope", VALUE),), minor=True),
    "iteration_tail": Feature("iteration tail (data loading, gradient clipping, logging)",
                              (("iteration_tail", True),), minor=True),
}


@dataclass(frozen=True, slots=True)
class Framework:
    """What a framework does where a row of its tables says nothing (each value with why)."""

    name: str
    micro_batch: tuple[int, str]
    distributed_optimizer: tuple[bool, str]
    sequence_parallel: tuple[bool, str]  # applied only where TP > 1
    overlap: tuple[bool, str]  # overlap_grad_reduce, overlap_param_gather, tp_comm_overlap
    recompute: tuple[str, str]
    precision: tuple[str, str]
    grad_reduce_in_fp32: tuple[bool, str]
    megatron_buckets: bool  # Megatron-Core's DDP (gradient buckets of max(40M, 1M x dp x cp) parameters)
    attention: tuple[str, str] = ("flash", "fused FlashAttention-style kernels (Transformer Engine)")
    cross_entropy: tuple[str, str] = ("fused", "NeMo/Megatron-Bridge: cross_entropy_loss_fusion on")
    fp8_recipe: tuple[str, str] = ("delayed", "Transformer Engine's default FP8 recipe: delayed scaling")
    # FP8 (per-tensor) GEMM weights kept and all-gathered in FP8 by the distributed optimizer
    fp8_param_gather: tuple[bool, str] = (False, "")
    # no default micro-batch size: without a pipeline, the largest that fits in the GPU's memory (else micro_batch)
    micro_batch_fit: bool = False


_MEGATRON_MBS = (1, "Megatron-LM requires --micro-batch-size and has no default; 1 as in its GPT-3 175B example")
_NONE = (False, "Megatron-LM default: off")
_NEMO = Framework("NeMo / Megatron-Bridge recipes", (1, "the recipes' default micro-batch size"),
                  (True, "NeMo/Megatron-Bridge recipes: use_distributed_optimizer on"),
                  (True, "NeMo/Megatron-Bridge performance recipes: on when TP > 1"),
                  (True, "NeMo/Megatron-Bridge recipes: overlap_grad_reduce, overlap_param_gather, TP comm overlap "
                         "on"),
                  ("none", "NeMo/Megatron-Bridge default: no recompute"),
                  ("bf16", "NeMo/Megatron-Bridge default: BF16 mixed precision"),
                  (True, "NeMo/Megatron-Bridge recipes: grad_reduce_in_fp32"), True)
_BRIDGE = replace(_NEMO, fp8_recipe=("tensorwise", "Megatron-Bridge's performance recipes run FP8 as fp8_cs (current "
                                                   "scaling) or fp8_mx; they have no delayed-scaling recipe"),
                  precision=("fp8", "Megatron-Bridge 25.09 states no precision; its values in parentheses are "
                                           "another FP8 quantization granularity (MXFP8), so the others are FP8"),
                  grad_reduce_in_fp32=(False, "Megatron-Bridge's performance recipes: grad_reduce_in_fp32 False "
                                              "(scripts/performance, every release 25.09-26.08)"),
                  fp8_param_gather=(True, "Megatron-Bridge's fp8_cs precision config "
                                          "(bf16_with_fp8_current_scaling_mixed): fp8_param_gather on; its MXFP8 "
                                          "config gathers 16-bit values through the gradient buffer and casts them "
                                          "after (reuse_grad_buf_for_mxfp8_param_ag)"))
_CE_UNFUSED = ("unfused", "Megatron-LM default: no --cross-entropy-loss-fusion; the vocabulary-parallel cross entropy "
                          "in fp32 over the logits")
_MEGATRON = Framework("Megatron-LM", _MEGATRON_MBS, _NONE, (False, "Megatron-LM default: off"), _NONE,
                      ("none", "Megatron-LM default: no recompute"),
                      ("bf16", "16-bit mixed precision (the MFU/peak the source quotes is the BF16/FP16 one)"),
                      (True, "Megatron-LM reduces bf16 gradients in fp32"), True, cross_entropy=_CE_UNFUSED,
                      micro_batch_fit=True)
_FP16_GRADS = (False, "Megatron-LM of the time: 16-bit gradients")
_UNFUSED = ("unfused", "Megatron-LM before FlashAttention (2021-2022): QK^T and AV as batched GEMMs around a fused "
                       "scaled-masked softmax")
FRAMEWORKS: dict[str, Framework] = {
    "megatron_sc21_t1": Framework("Megatron-LM (2021)", _MEGATRON_MBS,
                                  (False, "not in Megatron-LM in 2021"), (False, "not in Megatron-LM in 2021"),
                                  (False, "not in Megatron-LM in 2021"), _MEGATRON.recompute, _MEGATRON.precision,
                                  _FP16_GRADS, False, _UNFUSED, _CE_UNFUSED, micro_batch_fit=True),
    "korthikanti22_t5": Framework("Megatron-LM (2022)", _MEGATRON_MBS, (False, "Megatron-LM (2022) default: off"),
                                  _MEGATRON.sequence_parallel, (False, "Megatron-LM (2022): not used"),
                                  _MEGATRON.recompute, _MEGATRON.precision, _FP16_GRADS, False, _UNFUSED,
                                  _CE_UNFUSED, micro_batch_fit=True),
    "megatron_readme_h100": _MEGATRON,
    "nemo_2407": _NEMO,
    "nemo_2412": _NEMO,
    "megatron_bridge_perf": _BRIDGE,
    "mlperf_gpt3": _NEMO,
    # Megatron-LM's defaults; each row states the arguments its Megatron-MoE-ModelZoo config and command set
    "megatron_moe_modelzoo": replace(_MEGATRON, name="Megatron-LM (Megatron-MoE-ModelZoo)", micro_batch_fit=False),
}

# Expert tensor parallelism where a source's MoE runs set it apart from TP (Megatron-Core's default is TP).
EXPERT_TP: dict[str, tuple[int, str]] = {
    "megatron_bridge_perf": (1, "Megatron-Bridge's MoE performance recipes (Qwen3, GPT-OSS): "
                                "expert_tensor_parallel_size 1"),
    "megatron_moe_modelzoo": (1, "Megatron-MoE-ModelZoo configs: --expert-tensor-parallel-size 1"),
}


@lru_cache(maxsize=1)
def generator_options() -> dict[str, argparse.Action]:
    """The generator's ``generate: llm`` options by key (the flags of ``trace generate llm``)."""
    from workload.generated import llm_keys
    from workload.llm.cli import configure

    parser = argparse.ArgumentParser(add_help=False)
    configure(parser)
    keys = llm_keys()
    return {a.dest: a for a in parser._actions if a.dest in keys}


def accepts(key: str, value: Any) -> bool:
    """Whether the generator has option ``key`` and it takes ``value``."""
    action = generator_options().get(key)
    if action is None:
        return False
    if action.choices is not None and value not in action.choices:
        return False
    if isinstance(value, bool):
        return action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction)
    if isinstance(value, int):
        return action.type is int
    if action.nargs == 0:
        return False
    if action.type in (None, str):
        return True
    try:  # an option with its own parser (e.g. a size): it must take the value
        action.type(value)  # type: ignore[misc, operator]
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False
    return True


def resolve(name: str, value: Any) -> tuple[str, Any] | None:
    """The (generator key, value) expressing feature ``name`` with the row's ``value``; None when the generator
    has no option for it."""
    for key, template in FEATURES[name].options:
        v = value if template is VALUE else template
        if accepts(key, v):
            return key, v
    return None


def missing_label(name: str) -> str:
    """"interleaved pipeline schedule (generator option vp)"."""
    feature = FEATURES[name]
    keys = " or ".join(k for k, _ in feature.options)
    return f"{feature.label} (generator option {keys})" if keys else feature.label
