"""A decoder-only transformer's shape, and exact parameter counts (total, active, per rank).

Parameters are counted per tensor: attention Q/K/V/O weights (GQA: K and V have ``num_kv_heads`` heads),
FFN weights (2 matrices, or 3 when gated as in SwiGLU), optional biases, two norms per layer and a final
norm (LayerNorm: weight and bias; RMSNorm: weight), token embeddings, learned position embeddings if any,
and the output head (absent when tied to the token embeddings). A mixture-of-experts FFN holds
``num_experts`` copies of the FFN plus a router (hidden x experts, no bias); each token uses ``top_k`` of them,
with group-limited routing (DeepSeek-V3's) only among the experts of its best ``router_group_topk`` of
``router_groups`` equal groups.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from workload.errors import InputError

NORMS = ("layernorm", "rmsnorm")
# Megatron-Core's hybrid layer pattern (hybrid_layer_pattern): one symbol per layer, each a pre-norm and one block
HYBRID_SYMBOLS = {"M": ("mamba",), "*": ("attention",), "-": ("mlp",), "E": ("moe",)}
POSITION_EMBEDDINGS = ("rope", "learned", "none")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """The shape of a decoder-only transformer. ``num_kv_heads`` None = as many as query heads (MHA);
    ``head_dim`` None = hidden_size / num_heads; ``num_experts`` 1 = a dense FFN."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    gated_ffn: bool = False
    tied_embeddings: bool = False
    position_embedding: str = "rope"
    norm: str = "rmsnorm"
    bias: bool = False
    num_experts: int = 1
    top_k: int = 1
    # group-limited routing (Megatron-Core's moe_router_num_groups / moe_router_group_topk; DeepSeek-V3: 8, 4):
    # a token's top_k experts come from its best router_group_topk of router_groups groups (1, 1: no limit)
    router_groups: int = 1
    router_group_topk: int = 1
    # multi-head latent attention (DeepSeek-V2/V3, Kimi K2; Megatron-Core's MLA) when kv_lora_rank > 0: the
    # queries through a q_lora_rank latent, keys and values through a kv_lora_rank latent (both projected down on
    # every tensor-parallel rank, normed, then up per head); head_dim is the query/key head dim without RoPE,
    # qk_rope_head_dim its RoPE part (the keys share one RoPE head), v_head_dim the value head dim
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None
    # the first dense_layers layers of a mixture-of-experts model are dense, their FFN dense_ffn_hidden_size wide
    # (None: ffn_hidden_size; Megatron-Core's moe_layer_freq [0] * k + [1] * ...; DeepSeek-V3: 3, 18432)
    dense_layers: int = 0
    dense_ffn_hidden_size: int | None = None
    # multi-token prediction (Megatron-Core's mtp_num_layers; DeepSeek-V3: 1): after the decoder, each depth embeds
    # the tokens shifted once more, norms them and the hidden states, projects the pair (2h -> h), runs one more
    # transformer layer and predicts through the shared output layer and a loss of its own, on the last stage
    mtp_layers: int = 0
    # the depths share one stored block (Megatron-Core's mtp_use_repeated_layer; Nemotron 3 Super): each depth runs
    # it (compute as before), its weights and their gradient are held once
    mtp_repeated_layer: bool = False
    # a shared expert beside the routed ones: a dense FFN of this width every token passes through, tensor-parallel
    # like a dense layer's (Megatron-Core's moe_shared_expert_intermediate_size; 0 = none)
    shared_expert_ffn: int = 0
    # latent mixture-of-experts (Nemotron 3 Super; Megatron-Core's moe_latent_size; 0 = none): the routed experts
    # run at this width. Each MoE layer projects its tokens down from the hidden size after the router and before
    # the dispatch (fc1_latent_proj) and back up after the combine (fc2_latent_proj); both weights are held whole
    # by every tensor-parallel rank. The router and a shared expert see the hidden size
    moe_latent_size: int = 0
    dtype_bytes: int = 2
    window_size: int | None = None  # sliding-window attention: keys a query sees (itself included); None = all
    window_attn_skip_freq: int = 0  # with a window, every N-th layer attends to all keys (Megatron-Core's name)
    # RoPE as Transformer Engine's fused kernel; False: Megatron-Core's unfused PyTorch RoPE, which it runs for YaRN
    # with a concentration factor (mscale) other than 1 (GPT-OSS: YaRN factor 32, mscale 1.35)
    rope_fused: bool = True
    # GPT-OSS's gated activation (Megatron-Core's activation_func_clamp_value, with quick-GELU and glu_linear_offset):
    # the experts' GLU inputs clamped. Megatron-Core clamps and re-concatenates them in separate PyTorch kernels
    # before its fused activation, and creates the linear offset as a GPU tensor from a Python number on every call:
    # a blocking host-to-device copy, so the host waits there for the GPU's queue to drain
    clamped_glu: bool = False
    # each query and key head normed after the QKV projection (Qwen3; Megatron-Core's qk_layernorm: a norm module
    # each for the queries and the keys, their weights head_dim long)
    qk_norm: bool = False
    # a hybrid model (Nemotron-H, Nemotron 3; Megatron-Core's hybrid_layer_pattern): one symbol per layer, M a Mamba-2
    # mixer, * self-attention, - a dense MLP, E a mixture-of-experts MLP, each behind its own pre-norm; "" = every
    # layer is attention and an MLP. Multi-token-prediction depths stay attention + MLP layers ("*E" in MCore's terms)
    layer_pattern: str = ""
    # the Mamba-2 mixer (Megatron-Core's mamba_num_heads, mamba_head_dim, mamba_state_dim, mamba_num_groups; the
    # causal convolution's width d_conv and the SSD scan's chunk size as MambaMixer sets them): heads of head_dim
    # channels make the inner width; B and C have state_dim channels per group, the heads split evenly over the groups
    mamba_heads: int = 0
    mamba_head_dim: int = 64
    mamba_state_dim: int = 128
    mamba_groups: int = 8
    mamba_conv_width: int = 4
    mamba_chunk: int = 128

    def windowed(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends through the sliding window: all layers, or (with
        window_attn_skip_freq N) all but every N-th, as Megatron-Core alternates them (GPT-OSS: N = 2)."""
        if not self.window_size:
            return False
        return not (self.window_attn_skip_freq and (layer + 1) % self.window_attn_skip_freq == 0)

    # --- derived shapes ---------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def value_head_size(self) -> int:
        return self.head_size if self.v_head_dim is None else self.v_head_dim

    @property
    def attention_width(self) -> int:
        """Width of the attention's output projection's input (heads x value head size)."""
        return self.num_heads * self.value_head_size

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def attention_params(self) -> tuple[int, int, int, int]:
        """The attention block's parameters (norm weights aside): (split over the tensor-parallel ranks, of which
        in matmuls, held whole by each of them, of which in matmuls)."""
        h, hd = self.hidden_size, self.head_size
        if self.is_mla:
            heads, rope, ql, kl = self.num_heads, self.qk_rope_head_dim, self.q_lora_rank, self.kv_lora_rank
            split = ql * heads * (hd + rope) + kl * heads * (hd + self.value_head_size) + self.attention_width * h
            whole_matmul = h * ql + h * (kl + rope)
            return split, split, whole_matmul + ql + kl, whole_matmul  # whole: with the latents' norm weights
        qkv_width = (self.num_heads + 2 * self.kv_heads) * hd
        matmul = h * qkv_width + self.attention_width * h
        whole = (h if self.bias else 0) + (2 * hd if self.qk_norm else 0)
        return matmul + (qkv_width if self.bias else 0), matmul, whole, 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def moe_at(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based; from num_layers on, a multi-token-prediction depth's) has experts."""
        if self.layer_pattern and layer < len(self.layer_pattern):
            return self.layer_pattern[layer] == "E"
        return self.is_moe and layer >= self.dense_layers

    def layer_kind(self, layer: int) -> str:
        """What layers of the same parameters share: "moe" or "dense" (attention and an MLP), or a hybrid layer's
        pattern symbol."""
        if self.layer_pattern and layer < len(self.layer_pattern):
            return self.layer_pattern[layer]
        return "moe" if self.moe_at(layer) else "dense"

    def layer_blocks(self, layer: int) -> tuple[str, ...]:
        """The blocks of layer ``layer`` in forward order: attention and an MLP ("mlp" dense, "moe" with experts),
        or a hybrid layer's one block ("mamba", "attention", "mlp" or "moe")."""
        kind = self.layer_kind(layer)
        return HYBRID_SYMBOLS.get(kind) or ("attention", "moe" if kind == "moe" else "mlp")

    @property
    def attention_layers(self) -> int:
        """Layers with an attention block (multi-token-prediction depths aside)."""
        return self.layer_pattern.count("*") if self.layer_pattern else self.num_layers

    @property
    def mamba_inner(self) -> int:
        """The Mamba-2 mixer's inner width (heads x head dim)."""
        return self.mamba_heads * self.mamba_head_dim

    def mamba_params(self) -> tuple[int, int, int]:
        """A Mamba-2 mixer's parameters (its pre-norm aside): (split over the tensor-parallel ranks, of which in
        matmuls, held whole). in_proj makes z and x (inner width each), B and C (state_dim per group each) and dt
        (one per head); the depthwise convolution (weights and bias) runs over x, B and C; each head has dt_bias,
        A_log and D; the gated RMSNorm a weight per inner channel; out_proj maps the inner width back. Megatron-Core
        splits heads and groups over tensor-parallel ranks, all of these with them."""
        h, inner, heads = self.hidden_size, self.mamba_inner, self.mamba_heads
        bc = 2 * self.mamba_groups * self.mamba_state_dim
        in_width = 2 * inner + bc + heads
        matmul = h * in_width + inner * h
        conv = (inner + bc) * (self.mamba_conv_width + 1)
        return matmul + conv + 3 * heads + inner, matmul, 0

    @property
    def dense_ffn(self) -> int:
        """A dense layer's FFN width."""
        return self.dense_ffn_hidden_size if self.is_moe and self.dense_ffn_hidden_size else self.ffn_hidden_size

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.gated_ffn else 2

    @property
    def expert_width(self) -> int:
        """The width the routed experts read and write (and the dispatcher sends): the latent or the hidden size."""
        return self.moe_latent_size or self.hidden_size

    def latent_params(self) -> int:
        """A MoE layer's latent projections (hidden -> latent -> hidden; 0 without a latent)."""
        return 2 * self.hidden_size * self.moe_latent_size

    def norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    def ffn_params(self, width: int, io: int | None = None) -> tuple[int, int, int]:
        """A dense FFN ``width`` wide (0: none) reading and writing ``io`` channels (default the hidden size; a
        routed expert's: expert_width): (split over tensor-parallel ranks, of which in matmuls, the row-parallel
        bias held whole)."""
        io = self.hidden_size if io is None else io
        matmul = self.ffn_matrices * io * width
        bias = self.bias and width > 0
        return matmul + ((self.ffn_matrices - 1) * width if bias else 0), matmul, io if bias else 0

    # --- parameter counts -------------------------------------------------------------------------
    def layer_params(self, tp: int = 1, ep: int = 1, etp: int | None = None, moe: bool = True) -> LayerParams:
        """One layer's parameters as held by one rank of a tp-way tensor- and ep-way expert-parallel plan whose
        experts are split etp ways (default tp); ``moe`` False: a dense layer of a mixture-of-experts model."""
        h = self.hidden_size
        f = self.ffn_hidden_size if self.is_moe and moe else self.dense_ffn
        attn_split, attn_split_matmul, attn_whole, attn_whole_matmul = self.attention_params()
        attn_replicated = attn_whole + 2 * self.norm_params()
        ffn_split, ffn_matmul, ffn_replicated = self.ffn_params(f, self.expert_width if self.is_moe and moe else h)
        if not (self.is_moe and moe):
            return LayerParams(dense=(attn_split + ffn_split) // tp + attn_replicated + ffn_replicated, expert=0,
                               dense_matmul=(attn_split_matmul + ffn_matmul) // tp + attn_whole_matmul,
                               replicated=attn_replicated + ffn_replicated)
        local_experts, etp = self.num_experts // ep, tp if etp is None else etp
        whole = h * self.num_experts + self.latent_params()  # the router and the latent projections
        shared_split, shared_matmul, shared_replicated = self.ffn_params(self.shared_expert_ffn)
        return LayerParams(dense=(attn_split + shared_split) // tp + attn_replicated + shared_replicated + whole,
                           expert=local_experts * (ffn_split // etp + ffn_replicated),
                           dense_matmul=(attn_split_matmul + shared_matmul) // tp + attn_whole_matmul + whole,
                           replicated=attn_replicated + shared_replicated + whole
                           + local_experts * ffn_replicated)

    def _hybrid_params(self, symbol: str, tp: int, ep: int, etp: int | None) -> LayerParams:
        """A hybrid layer's parameters on one rank: its pre-norm and its one block."""
        norm = self.norm_params()
        if symbol == "M":
            split, matmul, whole = self.mamba_params()
            return LayerParams(dense=split // tp + whole + norm, expert=0, dense_matmul=matmul // tp,
                               replicated=whole + norm)
        if symbol == "*":
            split, matmul, whole, whole_matmul = self.attention_params()
            return LayerParams(dense=split // tp + whole + norm, expert=0, dense_matmul=matmul // tp + whole_matmul,
                               replicated=whole + norm)
        if symbol == "-":
            split, matmul, whole = self.ffn_params(self.dense_ffn)
            return LayerParams(dense=split // tp + whole + norm, expert=0, dense_matmul=matmul // tp,
                               replicated=whole + norm)
        full = self.layer_params(tp, ep, etp)  # a MoE layer less its attention and that block's norm
        split, matmul, whole, whole_matmul = self.attention_params()
        return LayerParams(dense=full.dense - split // tp - whole - norm, expert=full.expert,
                           dense_matmul=full.dense_matmul - matmul // tp - whole_matmul,
                           replicated=full.replicated - whole - norm)

    def kind_params(self, kind: str, tp: int = 1, ep: int = 1, etp: int | None = None) -> LayerParams:
        """The parameters of a layer of ``kind`` (see layer_kind) on one rank."""
        if kind in HYBRID_SYMBOLS:
            return self._hybrid_params(kind, tp, ep, etp)
        return self.layer_params(tp, ep, etp, moe=kind == "moe")

    def embedding_params(self) -> int:
        """Token embeddings plus learned position embeddings (the lookup tables; no matmul)."""
        pos = self.seq_len * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def shares_embedding(self, pp: int) -> bool:
        """Whether the first and last pipeline stages each hold the token embeddings and sum their gradients:
        tied to the output layer, or read again by multi-token prediction on the last stage."""
        return pp > 1 and (self.tied_embeddings or self.mtp_layers > 0)

    def head_params(self) -> int:
        """The output projection's own parameters (0 when tied to the token embeddings)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def mtp_params(self, tp: int = 1) -> tuple[int, int]:
        """A multi-token-prediction depth's own parameters beside its transformer layer: (its projection, split over
        tp; its three norms, held whole)."""
        return 2 * self.hidden_size * self.hidden_size // tp, 3 * self.norm_params()

    @property
    def stored_mtp_layers(self) -> int:
        """Multi-token-prediction depths with weights of their own (one for a repeated layer)."""
        return min(self.mtp_layers, 1) if self.mtp_repeated_layer else self.mtp_layers

    def _layers(self, depths: int) -> list[tuple[int, LayerParams]]:
        """(count, parameters) of the layers of each kind, with ``depths`` multi-token-prediction depths' layers
        (which have experts when the model has, counted with them; their projections and norms are not)."""
        kinds = [self.layer_kind(i) for i in range(self.num_layers + depths)]
        return [(kinds.count(kind), self.kind_params(kind)) for kind in sorted(set(kinds))]

    def _expert_layers(self, depths: int) -> int:
        """Layers with experts, ``depths`` multi-token-prediction depths' included."""
        return sum(self.moe_at(i) for i in range(self.num_layers + depths))

    def total_params(self) -> int:
        depths = self.stored_mtp_layers
        layers = sum(n * (layer.dense + layer.expert) for n, layer in self._layers(depths))
        return (layers + depths * sum(self.mtp_params()) + self.embedding_params() + self.norm_params()
                + self.head_params())

    def active_params(self) -> int:
        """Parameters one token uses: all but the experts it is not routed to (a repeated multi-token-prediction
        layer's once)."""
        if not self.is_moe:
            return self.total_params()
        per_expert = self.layer_params().expert // self.num_experts
        unused = self._expert_layers(self.stored_mtp_layers) * (self.num_experts - self.top_k) * per_expert
        return self.total_params() - unused

    def matmul_params(self) -> int:
        """Weights one token multiplies (active experts, router and output head; not the embedding lookup,
        norms or biases), each multi-token-prediction depth's: the N of the exact forward matmul count
        2 x N x tokens."""
        expert_matmul = self.top_k * self.ffn_params(self.ffn_hidden_size, self.expert_width)[1]
        return (sum(n * layer.dense_matmul for n, layer in self._layers(self.mtp_layers))
                + self._expert_layers(self.mtp_layers) * expert_matmul
                + self.mtp_layers * self.mtp_params()[0] + (1 + self.mtp_layers) * self.vocab_size * self.hidden_size)

    def validate(self) -> None:
        """Raise InputError (one line) if the shape is inconsistent."""
        for name in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len",
                     "kv_heads", "head_size", "num_experts", "top_k", "dtype_bytes", "router_groups",
                     "router_group_topk", "mamba_head_dim", "mamba_state_dim", "mamba_groups", "mamba_conv_width",
                     "mamba_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"model {self.name}: {name} must be a whole number >= 1 (got {value!r})")
        for name, low in (("window_size", 1), ("window_attn_skip_freq", 0), ("shared_expert_ffn", 0),
                          ("mamba_heads", 0), ("moe_latent_size", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise InputError(f"model {self.name}: {name} must be a whole number >= {low} (got {value!r})")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise InputError(f"model {self.name}: hidden size {self.hidden_size} is not divisible by "
                             f"{self.num_heads} heads (give the head size with --head-dim)")
        if self.num_heads % self.kv_heads:
            raise InputError(f"model {self.name}: {self.num_heads} query heads are not a multiple of "
                             f"{self.kv_heads} key/value heads")
        for name in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"model {self.name}: {name} must be a whole number >= 0 (got {value!r})")
        if self.v_head_dim is not None and (isinstance(self.v_head_dim, bool) or not isinstance(self.v_head_dim, int)
                                            or self.v_head_dim < 1):
            raise InputError(f"model {self.name}: v_head_dim must be a whole number >= 1 (got {self.v_head_dim!r})")
        if not self.is_mla and (self.q_lora_rank or self.qk_rope_head_dim):
            raise InputError(f"model {self.name}: q_lora_rank and qk_rope_head_dim describe multi-head latent "
                             "attention, which needs kv_lora_rank > 0")
        if self.is_mla and (self.kv_heads != self.num_heads or not self.q_lora_rank or self.bias):
            raise InputError(f"model {self.name}: multi-head latent attention is modelled with a query latent "
                             "(q_lora_rank > 0), as many key/value heads as query heads and no biases")
        for name in ("dense_layers", "mtp_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"model {self.name}: {name} must be a whole number >= 0 (got {value!r})")
        if self.mtp_repeated_layer and not self.mtp_layers:
            raise InputError(f"model {self.name}: mtp_repeated_layer shares one block between multi-token-prediction "
                             "depths: it needs mtp_layers >= 1")
        dense_ffn = self.dense_ffn_hidden_size
        if dense_ffn is not None and (isinstance(dense_ffn, bool) or not isinstance(dense_ffn, int) or dense_ffn < 1):
            raise InputError(f"model {self.name}: dense_ffn_hidden_size must be a whole number >= 1 (got "
                             f"{dense_ffn!r})")
        if (self.dense_layers or dense_ffn) and not self.is_moe:
            raise InputError(f"model {self.name}: dense_layers and dense_ffn_hidden_size describe the dense layers of "
                             "a mixture-of-experts model (num_experts > 1)")
        if self.dense_layers >= self.num_layers:
            raise InputError(f"model {self.name}: dense_layers {self.dense_layers} leaves none of the "
                             f"{self.num_layers} layers with experts")
        if self.moe_latent_size and not self.is_moe:
            raise InputError(f"model {self.name}: moe_latent_size {self.moe_latent_size} describes the routed experts' "
                             "width: it needs a mixture-of-experts model (num_experts > 1)")
        if self.shared_expert_ffn and not self.is_moe:
            raise InputError(f"model {self.name}: a shared expert (shared_expert_ffn {self.shared_expert_ffn}) needs "
                             "a mixture-of-experts model (num_experts > 1)")
        if self.qk_norm and self.is_mla:
            raise InputError(f"model {self.name}: qk_norm (query and key heads normed) is modelled for "
                             "multi-head attention, not latent attention (kv_lora_rank > 0)")
        if self.clamped_glu and not (self.is_moe and self.gated_ffn):
            raise InputError(f"model {self.name}: clamped_glu describes the experts' gated activation (GPT-OSS): it "
                             "needs a mixture-of-experts model with gated_ffn")
        if self.top_k > self.num_experts:
            raise InputError(f"model {self.name}: top_k {self.top_k} exceeds {self.num_experts} experts")
        groups, chosen = self.router_groups, self.router_group_topk
        if self.num_experts % groups or chosen > groups or self.top_k > chosen * (self.num_experts // groups):
            raise InputError(f"model {self.name}: group-limited routing needs router_groups dividing the "
                             f"{self.num_experts} experts and top_k {self.top_k} within the experts of "
                             f"router_group_topk of them (got {groups} groups, {chosen} chosen)")
        self._validate_pattern()
        if self.norm not in NORMS:
            raise InputError(f"model {self.name}: norm must be one of {', '.join(NORMS)} (got {self.norm!r})")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise InputError(f"model {self.name}: position_embedding must be one of "
                             f"{', '.join(POSITION_EMBEDDINGS)} (got {self.position_embedding!r})")

    def _validate_pattern(self) -> None:
        pattern, name = self.layer_pattern, self.name
        if not pattern:
            if self.mamba_heads:
                raise InputError(f"model {name}: mamba_heads describes the Mamba layers of a hybrid model: give its "
                                 "layer_pattern (M for a Mamba layer)")
            return
        unknown = sorted(set(pattern) - set(HYBRID_SYMBOLS))
        if unknown:
            raise InputError(f"model {name}: layer_pattern has unknown symbol(s) {' '.join(unknown)}; valid: "
                             f"{' '.join(HYBRID_SYMBOLS)} (Mamba, attention, MLP, mixture-of-experts)")
        if len(pattern) != self.num_layers:
            raise InputError(f"model {name}: layer_pattern has {len(pattern)} layers, num_layers is {self.num_layers}")
        if ("E" in pattern) != self.is_moe:
            raise InputError(f"model {name}: layer_pattern {'has' if 'E' in pattern else 'has no'} mixture-of-experts "
                             f"layers (E) but the model has {self.num_experts} expert(s)")
        if self.dense_layers:
            raise InputError(f"model {name}: dense_layers does not apply to a hybrid model (its layer_pattern says "
                             "which layers have experts)")
        if "M" in pattern and (not self.mamba_heads or self.mamba_heads % self.mamba_groups):
            raise InputError(f"model {name}: Mamba layers (M) need mamba_heads, a multiple of mamba_groups "
                             f"{self.mamba_groups} (got {self.mamba_heads})")


@dataclass(frozen=True, slots=True)
class LayerParams:
    """One layer's parameters on one rank: ``dense`` (attention, norms, router, dense FFN; synchronised over
    data parallelism), ``expert`` (the local experts; synchronised over expert-data parallelism) and
    ``dense_matmul`` (the part of ``dense`` used in matmuls); ``replicated`` counts those of both held whole
    by every tensor-parallel rank (norms, row-parallel biases, router)."""

    dense: int
    expert: int
    dense_matmul: int
    replicated: int


MODEL_FIELDS: dict[str, type] = {f.name: f.type for f in fields(ModelConfig)}  # type: ignore[misc]
REQUIRED_FIELDS = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len")


def model_from_dict(data: dict[str, Any], where: str) -> ModelConfig:
    """A ModelConfig from a mapping of field names (e.g. a YAML file); unknown or missing keys are errors."""
    unknown = sorted(set(data) - set(MODEL_FIELDS))
    if unknown:
        raise InputError(f"{where}: unknown model key(s) {', '.join(unknown)}; valid: {', '.join(MODEL_FIELDS)}")
    missing = [k for k in REQUIRED_FIELDS if data.get(k) is None]
    if missing:
        raise InputError(f"{where}: the model needs {', '.join(missing)} (or start from a --preset)")
    kw = dict(data)
    kw.setdefault("name", "custom")
    for key, value in kw.items():
        want_bool = MODEL_FIELDS[key] == "bool"
        want_str = MODEL_FIELDS[key] == "str"
        if want_bool and not isinstance(value, bool):
            raise InputError(f"{where}: {key} must be true or false (got {value!r})")
        if want_str and not isinstance(value, str):
            raise InputError(f"{where}: {key} must be a string (got {value!r})")
        want_int = not (want_bool or want_str) and value is not None
        if want_int and (isinstance(value, bool) or not isinstance(value, int)):
            raise InputError(f"{where}: {key} must be a whole number (got {value!r})")
    model = ModelConfig(**kw)
    model.validate()
    return model
