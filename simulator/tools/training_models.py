"""The model shapes behind the names published training tables use, and what a blank shape field defaults to.

A row names its model ("GPT 22B", "LLAMA3_70B", "Qwen3_30B_a3B") and gives some of its dimensions. The row's own
dimensions always win; a family gives what the architecture fixes (norm, gated FFN, tied embeddings, biases,
position embedding) and the documented defaults of its framework for what the row leaves blank (Megatron-LM's
FFN = 4 x hidden, its GPT-2 vocabulary padded to a multiple of 128 x TP, MHA when no key/value head count is
given); a card gives a named model's published dimensions. Every default taken is reported.

Sources (configuration values only; facts, no code taken):
- Megatron-LM (NVIDIA/Megatron-LM, BSD-3-Clause): ``--ffn-hidden-size`` default 4 x hidden, ``--num-query-groups``
  unset = MHA, ``--make-vocab-size-divisible-by`` 128 (x tensor-parallel size), GPT-2 BPE vocabulary 50,257.
- Llama 3 / 3.1: workload/llm/presets.py (Llama Team 2024, Table 3). Llama 2: Touvron et al. 2023 (vocabulary
  32,000, SwiGLU, RMSNorm, RoPE, untied output head).
- Nemotron-3 8B: NVIDIA NeMo (Apache-2.0) nemo/collections/llm/gpt/model/nemotron.py Nemotron3Config8B (32 layers,
  hidden 4096, FFN 16384, 32 heads, MHA, squared-ReLU, LayerNorm1p, RoPE, no bias, untied); vocabulary 256,000.
- Qwen3-30B-A3B, Qwen3-235B-A22B: the released config.json files (Apache-2.0): 48/94 layers, hidden 2048/4096,
  32/64 heads, 4 key/value heads, head size 128, 128 experts, top-8, expert FFN 768/1536, vocabulary 151,936.
- GPT-OSS 120B: NVIDIA-NeMo/Megatron-Bridge (Apache-2.0) src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py
  (36 layers, hidden 2880, 64 heads, 8 query groups, head size 64, 128 experts top-4, expert FFN 2880, gated,
  biases, vocabulary 201,088; sliding-window attention of 128 tokens on every other layer; YaRN RoPE with scaling
  factor 32, whose concentration factor 0.1 ln 32 + 1 = 1.35 makes Megatron-Core run its unfused RoPE:
  NVIDIA/Megatron-LM megatron/core/models/common/embeddings/rope_utils.py since "Fixes for gpt-oss", Nov. 2025).
- Nemotron 3 Nano 30B-A3B: NVIDIA-NeMo/Megatron-Bridge (Apache-2.0) src/megatron/bridge/recipes/nemotronh/h100/
  nemotron_3_nano.py (hybrid_layer_pattern of 23 Mamba-2, 6 attention and 23 MoE layers, hidden 2688, 64 Mamba heads
  of 64, state 128, 8 groups; 32 heads, 2 query groups, kv_channels 128; 128 experts top-6, expert FFN 1856, shared
  expert 3712, squared ReLU; no position embedding, RMSNorm, untied, vocabulary 131,072); the workload preset.
  Nemotron 3.5 Lightning: its perf recipe (v0.6.0 src/megatron/bridge/perf_recipes/nemotronh/) is Nano's with two
  multi-token-prediction depths of pattern "*E" (one attention and one MoE layer each; the recipe shares their
  weights, counted here per depth).
- Nemotron 3 Super 120B-A12B: the workload preset (latent MoE); its perf recipes (Megatron-Bridge v0.4.0-v0.6.0
  scripts/performance/configs/nemotronh, perf_recipes/nemotronh) keep two multi-token-prediction depths "*E" on.
- DeepSeek-V3: its config.json (MIT): 61 layers (the first 3 dense, FFN 18432), hidden 7168, 128 heads with multi-head
  latent attention (query latent 1536, key/value latent 512, head dim 128 + 64 RoPE, value head dim 128), 256
  routed experts top-8 from the best 4 of 8 groups, expert FFN 2048, one shared expert, vocabulary 129,280; the
  workload/llm/presets.py preset. Kimi K2: its config.json (modified MIT): the same layer shapes with 64 heads, 384
  routed experts top-8 (one group), the first layer dense, vocabulary 163,840.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from workload.llm.model import ModelConfig
from workload.llm.presets import PRESETS

GPT2_VOCAB = 50257


@dataclass(frozen=True, slots=True)
class Family:
    """What an architecture fixes, and what its framework takes for a blank dimension."""

    name: str
    fixed: dict[str, Any]
    vocab: int | None = None  # the tokenizer's vocabulary when the row gives none
    pad_vocab: bool = False  # Megatron pads the vocabulary to a multiple of 128 x TP


GPT = Family("Megatron GPT", {"gated_ffn": False, "tied_embeddings": True, "position_embedding": "learned",
                              "norm": "layernorm", "bias": True}, vocab=GPT2_VOCAB, pad_vocab=True)
LLAMA = Family("Llama", {"gated_ffn": True, "tied_embeddings": False, "position_embedding": "rope", "norm": "rmsnorm",
                         "bias": False})
NEMOTRON = Family("Nemotron", {"gated_ffn": False, "tied_embeddings": False, "position_embedding": "rope",
                               "norm": "layernorm", "bias": False}, vocab=256000)
QWEN3_MOE = Family("Qwen3 MoE", {"gated_ffn": True, "tied_embeddings": False, "position_embedding": "rope",
                                 "norm": "rmsnorm", "bias": False, "qk_norm": True}, vocab=151936)
GPT_OSS = Family("GPT-OSS", {"gated_ffn": True, "tied_embeddings": False, "position_embedding": "rope",
                             "norm": "rmsnorm", "bias": True, "window_size": 128, "window_attn_skip_freq": 2,
                             "rope_fused": False, "clamped_glu": True},
                 vocab=201088)
DEEPSEEK = Family("DeepSeek-V3", {"gated_ffn": True, "tied_embeddings": False, "position_embedding": "rope",
                                  "norm": "rmsnorm", "bias": False})
NEMOTRON_H = Family("Nemotron-H (hybrid Mamba-2)", {"gated_ffn": False, "tied_embeddings": False,
                                                    "position_embedding": "none", "norm": "rmsnorm", "bias": False},
                    vocab=131072)


@dataclass(frozen=True, slots=True)
class Card:
    """A named model: its family and published dimensions (ModelConfig field names)."""

    family: Family
    dims: dict[str, int] = field(default_factory=dict)
    source: str = ""


def _preset(name: str) -> dict[str, int]:
    m = PRESETS[name]
    return {"num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_heads": m.num_heads,
            "num_kv_heads": m.kv_heads, "ffn_hidden_size": m.ffn_hidden_size, "vocab_size": m.vocab_size}


def _moe(name: str) -> dict[str, int]:
    """A mixture-of-experts preset's dimensions without its vocabulary (the family's tokenizer gives it)."""
    m = PRESETS[name]
    keys = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "num_experts", "top_k",
            "ffn_hidden_size")
    return {k: m.kv_heads if k == "num_kv_heads" else getattr(m, k) for k in keys}


def _latent_moe(name: str) -> dict[str, int]:
    """A preset's latent-attention, expert and dense-layer fields (beside _preset's)."""
    m = PRESETS[name]
    keys = ("head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "num_experts", "top_k",
            "router_groups", "router_group_topk", "shared_expert_ffn", "dense_layers", "dense_ffn_hidden_size")
    return {k: getattr(m, k) for k in keys}


def _hybrid(name: str) -> dict[str, Any]:
    """A hybrid preset's fields beside _preset's: its layer pattern, Mamba mixer, experts."""
    m = PRESETS[name]
    keys = ("head_dim", "layer_pattern", "mamba_heads", "mamba_head_dim", "mamba_state_dim", "mamba_groups",
            "num_experts", "top_k", "shared_expert_ffn", "moe_latent_size")
    return {**_preset(name), **{k: getattr(m, k) for k in keys}}


# keyed by the model name lower-cased without punctuation or a parenthesised remark
CARDS: dict[str, Card] = {
    "llama38b": Card(LLAMA, _preset("llama3-8b"), "Llama 3 8B (workload/llm/presets.py)"),
    "llama370b": Card(LLAMA, _preset("llama3-70b"), "Llama 3 70B (workload/llm/presets.py)"),
    "llama31405b": Card(LLAMA, _preset("llama3-405b"), "Llama 3.1 405B (workload/llm/presets.py)"),
    "llama27b": Card(LLAMA, {"vocab_size": 32000}, "Llama 2 (vocabulary 32,000)"),
    "llama213b": Card(LLAMA, {"vocab_size": 32000}, "Llama 2 (vocabulary 32,000)"),
    "nemotron8b": Card(NEMOTRON, {"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 16384, "num_heads": 32,
                                  "num_kv_heads": 32}, "NeMo Nemotron3Config8B"),
    "qwen330ba3b": Card(QWEN3_MOE, _moe("qwen3-30b-a3b"), "Qwen3-30B-A3B config.json"),
    "qwen3235ba22b": Card(QWEN3_MOE, _moe("qwen3-235b-a22b"), "Qwen3-235B-A22B config.json"),
    "gptoss120b": Card(GPT_OSS, _moe("gpt-oss-120b"), "Megatron-Bridge GPTOSSProvider120B"),
    "gptoss20b": Card(GPT_OSS, _moe("gpt-oss-20b"), "GPT-OSS 20B config.json"),
    "nemotron3nano": Card(NEMOTRON_H, _hybrid("nemotron-3-nano"), "Megatron-Bridge's Nemotron 3 Nano recipe"),
    "nemotron35lightning": Card(NEMOTRON_H, {**_hybrid("nemotron-3-nano"), "mtp_layers": 2,
                                             "mtp_repeated_layer": True},
                                "Megatron-Bridge's Nemotron 3.5 Lightning perf recipe: Nemotron 3 Nano's with two "
                                "multi-token-prediction depths running one stored block (attention and MoE, '*E'; "
                                "mtp_use_repeated_layer)"),
    "nemotron3super": Card(NEMOTRON_H, {**_hybrid("nemotron-3-super"), "mtp_layers": 2, "mtp_repeated_layer": True},
                           "Megatron-Bridge's Nemotron 3 Super recipe: latent MoE, and two multi-token-prediction "
                           "depths running one stored block ('*E'; mtp_use_repeated_layer)"),
    "deepseekv3": Card(DEEPSEEK, {**_preset("deepseek-v3"), **_latent_moe("deepseek-v3")}, "DeepSeek-V3 config.json"),
    "kimik2": Card(DEEPSEEK, {**_preset("deepseek-v3"), **_latent_moe("deepseek-v3"), "num_heads": 64,
                              "num_kv_heads": 64, "num_experts": 384, "router_groups": 1, "router_group_topk": 1,
                              "dense_layers": 1, "vocab_size": 163840}, "Kimi K2 config.json"),
}
_FAMILY_PREFIXES = (("gptoss", GPT_OSS), ("gpt", GPT), ("llama", LLAMA), ("nemotron", NEMOTRON), ("qwen3", QWEN3_MOE),
                    ("deepseekv3", DEEPSEEK))
ROW_DIMS = {"layers": "num_layers", "hidden": "hidden_size", "ffn_hidden": "ffn_hidden_size", "heads": "num_heads",
            "kv_heads": "num_kv_heads", "vocab": "vocab_size", "seq_len": "seq_len"}


def model_key(name: str) -> str:
    """"Qwen3_30B_a3B (tokendrop)" -> "qwen330ba3b"."""
    return re.sub(r"[^a-z0-9]", "", re.sub(r"\(.*?\)", "", name.lower()))


@dataclass(slots=True)
class ModelChoice:
    """The generator's model fields for a row and the defaults taken."""

    fields: dict[str, Any]
    defaults_used: list[str]
    problem: str = ""  # why no model could be built (a dimension missing with no default)


def model_for(name: str, row_dims: dict[str, int], tp: int) -> ModelChoice:
    """The model of a row named ``name`` whose table gives ``row_dims`` (ModelConfig field names; blanks left
    out), split ``tp`` ways (the vocabulary padding depends on it)."""
    key = model_key(name)
    card = CARDS.get(key)
    family = card.family if card else next((f for prefix, f in _FAMILY_PREFIXES if key.startswith(prefix)), None)
    choice = ModelChoice({}, [])
    if family is None:
        choice.problem = (f"model {name!r}: no model card and no known family (GPT, Llama, Nemotron, Qwen3, GPT-OSS, "
                          "DeepSeek-V3)")
        return choice
    fields: dict[str, Any] = dict(family.fixed)
    for k, v in (card.dims if card else {}).items():
        if k not in row_dims:
            fields[k] = v
            choice.defaults_used.append(f"model {k} = {v} ({card.source})")  # type: ignore[union-attr]
    fields.update(row_dims)
    if "hidden_size" in fields and "ffn_hidden_size" not in fields:
        fields["ffn_hidden_size"] = 4 * fields["hidden_size"]
        choice.defaults_used.append(f"model ffn_hidden_size = 4 x hidden = {fields['ffn_hidden_size']} "
                                    "(Megatron-LM default)")
    if "num_heads" in fields and "num_kv_heads" not in fields:
        fields["num_kv_heads"] = fields["num_heads"]
        choice.defaults_used.append("model num_kv_heads = num_heads (MHA; Megatron-LM default without "
                                    "--num-query-groups)")
    if "vocab_size" not in fields and family.vocab is not None:
        vocab = family.vocab
        if family.pad_vocab:
            multiple = 128 * tp
            vocab = -(-vocab // multiple) * multiple
            choice.defaults_used.append(f"model vocab_size = {vocab} (GPT-2 BPE {family.vocab:,} padded to a multiple "
                                        f"of 128 x TP, as Megatron-LM pads it)")
        else:
            choice.defaults_used.append(f"model vocab_size = {vocab} ({family.name} tokenizer)")
        fields["vocab_size"] = vocab
    missing = [k for k in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len")
               if k not in fields]
    if missing:
        choice.problem = (f"model {name!r}: the table gives no {', '.join(missing)} and no model card has them")
    elif fields.get("tied_embeddings"):
        _untie_for_stated_size(name, fields, choice)
    choice.fields = fields
    return choice


def _untie_for_stated_size(name: str, fields: dict[str, Any], choice: ModelChoice) -> None:
    """Untie the output layer of a model whose name states a parameter count ("GPT 32B") that only a separate
    output layer reaches: the tied count misses it by more than 0.5% and the untied one by less than half that
    (the Megatron-LM README's weak-scaling models count one, SC'21's and GPT-3's do not)."""
    stated = re.search(r"(\d+(?:\.\d+)?)B(?![A-Za-z0-9])", name)
    if stated is None:
        return
    billions = float(stated.group(1)) * 1e9
    tied = ModelConfig(name=name, **fields).total_params()
    untied = ModelConfig(name=name, **{**fields, "tied_embeddings": False}).total_params()
    tied_miss, untied_miss = abs(tied / billions - 1), abs(untied / billions - 1)
    if tied_miss > 0.005 and untied_miss < tied_miss / 2:
        fields["tied_embeddings"] = False
        choice.defaults_used.append(f"untied output layer: the stated {stated.group(0)} parameters count one (tied "
                                    f"{tied / 1e9:.2f}B, untied {untied / 1e9:.2f}B)")
