"""Published model shapes (any field can be overridden on the command line).

Sources:
- GPT-3: Brown et al., "Language Models are Few-Shot Learners" (2020), Table 2.1 (n_layers, d_model, n_heads,
  d_head; d_ff = 4 x d_model; context 2048) and section 2.1 (GPT-2 architecture and its 50257-token BPE
  vocabulary; learned position embeddings, LayerNorm, biases, output head tied to the token embeddings).
  Two table entries are inconsistent with themselves and are corrected so that heads x d_head = d_model:
  GPT-3 XL (1.3B) lists 24 heads of 128 for d_model 2048 (we use 16 heads of 128, as Megatron-LM's and
  GPT-Neo's 1.3B configs do; the parameter count does not depend on the head count), and 13B lists
  d_model 5140 with 40 heads of 128 (we use 5120 = 40 x 128).
- Llama 3: Llama Team, "The Llama 3 Herd of Models" (2024), Table 3 (layers, model dimension, FFN dimension,
  heads, 8 key/value heads, SwiGLU, RMSNorm, no biases), pre-training sequence length 8192; vocabulary
  128256 and untied output head from the released models' config.json.
- Mixtral 8x7B: Jiang et al., "Mixtral of Experts" (2024), Table 1 (dim 4096, 32 layers, head_dim 128,
  hidden_dim 14336, 32 heads, 8 kv heads, context_len 32768, vocab_size 32000, 8 experts, top-2), and the
  released config.json (untied output head, RMSNorm, no biases).
- Qwen3-30B-A3B, Qwen3-235B-A22B: the released config.json files (Apache-2.0): 48/94 layers, hidden 2048/4096,
  32/64 heads in 4 key/value groups of 128, RMSNorm on queries and keys, 128 experts top-8 of FFN 768/1536 (SwiGLU),
  untied output head, vocabulary 151,936; sequence length 4,096 as the Qwen3 report's first pre-training stage and
  Megatron-Bridge's recipes; 30.5B / 3.3B and 235B / 22B parameters (the model cards).
- GPT-OSS 120B and 20B: OpenAI's model card and config.json files (Apache-2.0): 36/24 layers, hidden 2880, 64 heads
  of 64 in 8 key/value groups, sliding windows of 128 tokens on every other layer, 128/32 experts top-4 of FFN 2880
  (a clamped SwiGLU), biases, untied output head, vocabulary 201,088; YaRN RoPE, which Megatron-Core runs unfused
  (concentration factor 1.35); sequence length 4,096 as Megatron-Bridge's recipes; 116.8B / 5.1B and 20.9B /
  3.6B parameters (the model card, active without the input embedding).
- Nemotron 3 Nano 30B-A3B: NVIDIA-NeMo/Megatron-Bridge (Apache-2.0) src/megatron/bridge/recipes/nemotronh/h100/
  nemotron_3_nano.py (hybrid_layer_pattern, hidden 2688, 64 Mamba-2 heads of 64, state 128, 8 groups; 32 attention
  heads in 2 query groups of 128; 128 experts top-6 of FFN 1856, a shared expert of 3712, squared ReLU; no position
  embedding); vocabulary 131,072 (Nemotron-H's tokenizer); 31.6B parameters, 3.6B active with the embeddings (the
  model card).
- Nemotron 3 Super 120B-A12B: Megatron-Bridge's Nemotron3SuperProvider (src/megatron/bridge/models/nemotronh/
  nemotron_h_provider.py @72c5b89e; 88 layers, hidden 4096, 128 Mamba-2 heads of 64, 32 attention heads in 2 query
  groups of 128, 512 experts top-22 of FFN 2688 at latent width 1024, a shared expert of 5376) and Megatron-LM's
  nemotron3_super release test (NVIDIA/Megatron-LM, BSD-3; its hybrid_layer_pattern); vocabulary 131,072 and an
  untied output layer, as the published checkpoint's 123,611,033,088 elements (Megatron-Bridge's verification card,
  with its one multi-token-prediction block) confirm; 120.6B parameters, 12.7B active (the technical report).
"""

from __future__ import annotations

from workload.errors import InputError
from workload.llm.model import ModelConfig

NEMOTRON_3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
NEMOTRON_3_SUPER_PATTERN = ("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*"
                            "EMEMEMEME")


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelConfig:
    return ModelConfig(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
                       ffn_hidden_size=4 * hidden, vocab_size=50257, seq_len=2048, gated_ffn=False,
                       tied_embeddings=True, position_embedding="learned", norm="layernorm", bias=True)


def _llama3(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelConfig:
    return ModelConfig(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=8,
                       ffn_hidden_size=ffn, vocab_size=128256, seq_len=8192, gated_ffn=True,
                       tied_embeddings=False, position_embedding="rope", norm="rmsnorm", bias=False)


def _qwen3_moe(name: str, layers: int, hidden: int, heads: int, expert_ffn: int) -> ModelConfig:
    return ModelConfig(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=4, head_dim=128,
                       ffn_hidden_size=expert_ffn, vocab_size=151936, seq_len=4096, gated_ffn=True,
                       tied_embeddings=False, position_embedding="rope", norm="rmsnorm", bias=False, qk_norm=True,
                       num_experts=128, top_k=8)


def _gpt_oss(name: str, layers: int, experts: int) -> ModelConfig:
    return ModelConfig(name=name, num_layers=layers, hidden_size=2880, num_heads=64, num_kv_heads=8, head_dim=64,
                       ffn_hidden_size=2880, vocab_size=201088, seq_len=4096, gated_ffn=True, tied_embeddings=False,
                       position_embedding="rope", norm="rmsnorm", bias=True, num_experts=experts, top_k=4,
                       window_size=128, window_attn_skip_freq=2, rope_fused=False, clamped_glu=True)


PRESETS: dict[str, ModelConfig] = {m.name: m for m in (
    _gpt3("gpt3-1.3b", 24, 2048, 16),
    _gpt3("gpt3-2.7b", 32, 2560, 32),
    _gpt3("gpt3-6.7b", 32, 4096, 32),
    _gpt3("gpt3-13b", 40, 5120, 40),
    _gpt3("gpt3-175b", 96, 12288, 96),
    _llama3("llama3-8b", 32, 4096, 32, 14336),
    _llama3("llama3-70b", 80, 8192, 64, 28672),
    _llama3("llama3-405b", 126, 16384, 128, 53248),
    ModelConfig(name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                ffn_hidden_size=14336, vocab_size=32000, seq_len=32768, gated_ffn=True, tied_embeddings=False,
                position_embedding="rope", norm="rmsnorm", bias=False, num_experts=8, top_k=2),
    _qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 768),
    _qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 1536),
    _gpt_oss("gpt-oss-120b", 36, 128),
    _gpt_oss("gpt-oss-20b", 24, 32),
    # DeepSeek-V3 (its config.json): multi-head latent attention, 3 dense layers then 58 with 256 routed experts
    # (8 per token, from the best 4 of 8 groups) and one shared expert; the multi-token-prediction module left out
    ModelConfig(name="deepseek-v3", num_layers=61, hidden_size=7168, num_heads=128, head_dim=128, q_lora_rank=1536,
                kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, ffn_hidden_size=2048, vocab_size=129280,
                seq_len=4096, gated_ffn=True, num_experts=256, top_k=8, router_groups=8, router_group_topk=4,
                shared_expert_ffn=2048, dense_layers=3, dense_ffn_hidden_size=18432),
    # Nemotron 3 Nano 30B-A3B (Megatron-Bridge's recipe): 23 Mamba-2, 6 attention (GQA, 2 groups, no position
    # embedding) and 23 mixture-of-experts layers (128 experts top-6 and a shared expert, squared-ReLU)
    ModelConfig(name="nemotron-3-nano", num_layers=52, hidden_size=2688, num_heads=32, num_kv_heads=2, head_dim=128,
                ffn_hidden_size=1856, vocab_size=131072, seq_len=8192, gated_ffn=False, tied_embeddings=False,
                position_embedding="none", norm="rmsnorm", bias=False, num_experts=128, top_k=6,
                shared_expert_ffn=3712, layer_pattern=NEMOTRON_3_NANO_PATTERN, mamba_heads=64, mamba_head_dim=64,
                mamba_state_dim=128, mamba_groups=8),
    # Nemotron 3 Super 120B-A12B: 40 Mamba-2, 8 attention and 40 latent mixture-of-experts layers (512 experts top-22
    # working at width 1024, and a shared expert at the hidden size), squared-ReLU, no position embedding
    ModelConfig(name="nemotron-3-super", num_layers=88, hidden_size=4096, num_heads=32, num_kv_heads=2, head_dim=128,
                ffn_hidden_size=2688, vocab_size=131072, seq_len=8192, gated_ffn=False, tied_embeddings=False,
                position_embedding="none", norm="rmsnorm", bias=False, num_experts=512, top_k=22,
                shared_expert_ffn=5376, moe_latent_size=1024, layer_pattern=NEMOTRON_3_SUPER_PATTERN,
                mamba_heads=128, mamba_head_dim=64, mamba_state_dim=128, mamba_groups=8),
)}

# The parameter counts the papers and model cards publish (total, and active per token for MoE).
PUBLISHED_PARAMS: dict[str, tuple[float, float]] = {
    "gpt3-1.3b": (1.3e9, 1.3e9), "gpt3-2.7b": (2.7e9, 2.7e9), "gpt3-6.7b": (6.7e9, 6.7e9),
    "gpt3-13b": (13e9, 13e9), "gpt3-175b": (175e9, 175e9),
    "llama3-8b": (8.03e9, 8.03e9), "llama3-70b": (70.6e9, 70.6e9), "llama3-405b": (405.9e9, 405.9e9),
    "mixtral-8x7b": (46.7e9, 12.9e9), "qwen3-30b-a3b": (30.5e9, 3.3e9), "qwen3-235b-a22b": (235e9, 22e9),
    # GPT-OSS's card counts 5.13B / 3.61B active without the input embedding (201,088 x 2,880), which is counted here
    "gpt-oss-120b": (116.83e9, 5.13e9 + 0.579e9), "gpt-oss-20b": (20.91e9, 3.61e9 + 0.579e9),
    "deepseek-v3": (671e9, 37e9),
    "nemotron-3-nano": (31.6e9, 3.6e9), "nemotron-3-super": (120.6e9, 12.7e9),
}


def preset(name: str) -> ModelConfig:
    """The preset called ``name`` (case-insensitive; "_" and "." may be written as "-")."""
    key = name.strip().lower().replace("_", "-")
    for model in PRESETS.values():
        if key in (model.name, model.name.replace(".", "-")):
            return model
    raise InputError(f"unknown model preset {name!r}; valid: {', '.join(PRESETS)}")
