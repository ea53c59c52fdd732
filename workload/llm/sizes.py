"""What one rank of a stage computes and sends per micro-batch: token counts, activation bytes, the kernels of a
layer, and each weight tensor's parameters on the rank (for gradient buckets).

Context parallelism splits every sequence over ``cp`` ranks and sequence parallelism the tokens outside the
tensor-parallel GEMMs over ``tp``; a rank therefore sees ``b x s / cp`` tokens in its GEMMs and
``b x s / (cp x tp)`` (sequence parallel) in norms, residuals and pipeline sends. With precision fp8 the layers'
GEMMs are FP8 (fp4: NVFP4), each with its operands' quantization kernels (workload/llm/quantize.py; the output
layer and the router stay in the model's dtype, as Megatron-LM runs them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from compute.shapes import MXFP8
from workload.llm import costs, quantize
from workload.llm.costs import Matmul
from workload.llm.mamba import MambaMixer
from workload.llm.model import HYBRID_SYMBOLS, ModelConfig
from workload.llm.options import MXFP8_RECIPE, TrainingOptions
from workload.llm.plan import ParallelPlan

FP8_BYTES = 1
# Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP) runs one cuBLAS GEMM per local expert,
# round-robin over a fixed set of compute streams (transformer_engine/common/util/multi_stream.cpp: 4;
# gemm/cublaslt_gemm.cu multi_stream_cublas_gemm), so at most that many experts' GEMMs run at a time.
GROUPED_GEMM_STREAMS = 4
COUNT_BYTES = 8  # one expert's token count (int64), all-gathered over the expert-parallel group


def matmul(name: str, tokens: int, k: int, n: int, dtype_bytes: int, *, grad_bytes: int, weights: int = 1,
           dtype: str = "") -> Matmul:
    """A layer's weight as a Matmul in ``dtype`` ("fp8", "mxfp8", "fp4"; "" = the model's; the kernel model reads
    the precision, the bytes stay the model's), its weight gradient added into a main gradient of ``grad_bytes``
    per element."""
    return Matmul(name, tokens, k, n, dtype_bytes, weights, dtype, grad_bytes=grad_bytes)


def flex_copies(experts: int, top_k: int, parts: int, groups: int = 1, group_topk: int = 1) -> float:
    """Copies of a token the flex dispatcher (DeepEP, HybridEP) sends: one per part (an expert-parallel rank, or an
    NVLink domain of them) holding at least one of its ``top_k`` experts, the ``experts`` split evenly and in
    order over the ``parts``. In expectation over routing balanced across the experts: the token's top_k are
    distinct experts drawn uniformly, with group-limited routing from the experts of ``group_topk`` of ``groups``
    equal groups drawn uniformly (a part missing all of them with probability C(pool - held, top_k) /
    C(pool, top_k), ``held`` its experts in the chosen groups' ``pool``)."""
    return _flex_copies(experts, top_k, parts, groups, group_topk)


@lru_cache(maxsize=1024)
def _flex_copies(experts: int, top_k: int, parts: int, groups: int, group_topk: int) -> float:
    per_part, per_group = experts // parts, experts // groups
    pool = group_topk * per_group
    subsets, draws = math.comb(groups, group_topk), math.comb(pool, top_k)
    copies = 0.0
    for part in range(parts):
        lo, hi = part * per_part, (part + 1) * per_part
        # ways to choose j groups holding s of this part's experts, over the groups one at a time
        ways: dict[tuple[int, int], int] = {(0, 0): 1}
        for g in range(groups):
            held = max(0, min(hi, (g + 1) * per_group) - max(lo, g * per_group))
            grown = dict(ways)
            for (j, s), w in ways.items():
                if j < group_topk:
                    grown[(j + 1, s + held)] = grown.get((j + 1, s + held), 0) + w
            ways = grown
        missed = sum(w * math.comb(pool - s, top_k) for (j, s), w in ways.items() if j == group_topk)
        copies += 1.0 - missed / (subsets * draws)
    return copies


@dataclass(frozen=True, slots=True)
class Ffn:
    """A dense, tensor-parallel FFN on one rank: the column-parallel GEMM ``up`` (its weight tensor's name, e.g.
    mlp_in, names the FFN: mlp, shared), the activation (forward, backward) and the row-parallel GEMM ``down``."""

    up: Matmul
    act: tuple[costs.Kernel, costs.Kernel]
    down: Matmul

    @property
    def name(self) -> str:
        return self.up.name.removesuffix("_in")


def ffn(name: str, m: ModelConfig, tokens: int, width: int, low: str, grad_bytes: int, act: str = "activation"
        ) -> Ffn:
    """The FFN ``name`` (its GEMMs ``name``_in and ``name``_out, its activation kernel ``act``) over ``tokens``
    tokens, ``width`` wide on this rank."""
    h, d, gates = m.hidden_size, m.dtype_bytes, 2 if m.gated_ffn else 1
    return Ffn(matmul(f"{name}_in", tokens, h, gates * width, d, dtype=low, grad_bytes=grad_bytes),
               costs.elementwise(act, tokens * width, costs.ACTIVATION_FLOPS[m.gated_ffn], gates, 1, d,
                                 op_class="activation"),
               matmul(f"{name}_out", tokens, width, h, d, dtype=low, grad_bytes=grad_bytes))


class LatentAttention:
    """Multi-head latent attention's projections on one rank: the query and key/value latents projected down from
    the rank's own tokens (every tensor-parallel rank holds those weights whole), normed, gathered over the
    tensor-parallel ranks with sequence parallelism, then projected up to this rank's heads."""

    def __init__(self, m: ModelConfig, tokens: int, local_tokens: int, heads: int, d: int, low: str, grad_bytes: int
                 ) -> None:
        ql, kl, rope, g = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, grad_bytes
        self.q_down = matmul("q_down", local_tokens, m.hidden_size, ql, d, dtype=low, grad_bytes=g)
        self.kv_down = matmul("kv_down", local_tokens, m.hidden_size, kl + rope, d, dtype=low, grad_bytes=g)
        self.q_up = matmul("q_up", tokens, ql, heads * (m.head_size + rope), d, dtype=low, grad_bytes=g)
        self.kv_up = matmul("kv_up", tokens, kl, heads * (m.head_size + m.value_head_size), d, dtype=low,
                            grad_bytes=g)
        self.norm = costs.elementwise("latent_norm", local_tokens * (ql + kl), costs.NORM_FLOPS[m.norm], 2, 2, d,
                                      op_class="norm")
        self.latent_bytes = (ql + kl + rope) * d  # per token: the latents and the keys' RoPE part
        self.gather_bytes = local_tokens * self.latent_bytes
        self.reduce_bytes = tokens * self.latent_bytes


class StageSizes:
    """Per-micro-batch sizes and kernels of one rank (every rank of a stage has the same)."""

    def __init__(self, model: ModelConfig, plan: ParallelPlan, options: TrainingOptions) -> None:
        m, p, d = model, plan, model.dtype_bytes
        self.dtype_bytes = d
        b, s, h, tp = p.micro_batch_size, m.seq_len, m.hidden_size, p.tp
        self.sp = p.sequence_parallel and tp > 1
        self.recipe = options.recipe()  # the layers' GEMMs' quantization recipe (None: 16-bit GEMMs)
        self.host = options.host()  # the host issuing the kernels (None: an ideal host)
        low = options.gemm_dtype()
        if self.recipe == MXFP8_RECIPE:  # block-scaled FP8: the kernel model's MXFP8 efficiency, where it has one
            low = MXFP8
        bf16, mxfp8 = options.bf16_gemm_names(), options.mxfp8_gemm_names()

        def low_for(gemm: str) -> str:  # a GEMM's precision: the layers' low one unless kept in 16-bit or MXFP8
            return "" if gemm in bf16 else MXFP8 if gemm in mxfp8 else low
        t = b * s // p.cp  # tokens per rank in the tensor-parallel GEMMs
        t_local = t // tp if self.sp else t  # tokens per rank outside them
        heads, kv, hd, f = m.num_heads // tp, m.kv_heads // tp, m.head_size, m.ffn_hidden_size // tp
        # the main gradients the weight gradients are added into (Megatron's DDP buffers, in fp32 or the model's dtype)
        g = options.grad_bytes(d)
        self.mla: LatentAttention | None = None
        if m.is_mla:
            self.mla = LatentAttention(m, t, t_local, heads, d, low, g)
            # the core attends with query/key heads of head_dim + qk_rope_head_dim and value heads of v_head_dim:
            # timed as heads of their mean, which keeps its FLOPs and bytes
            hd = (m.head_size + m.qk_rope_head_dim + m.value_head_size) // 2
        self.batch, self.heads, self.kv_heads, self.head_dim = b, heads, kv, hd
        self.tokens, self.local_tokens = t, t_local
        self.act_bytes = t * h * d
        self.act_local_bytes = t_local * h * d
        # an FP8 GEMM's input gathered over tp travels in FP8 (Transformer Engine quantizes before gathering)
        self.fp8_gather_bytes = t_local * h * FP8_BYTES
        self.norm = costs.elementwise("norm", t_local * h, costs.NORM_FLOPS[m.norm], 2, 2, d)
        self.final_norm = costs.elementwise("final_norm", t_local * h, costs.NORM_FLOPS[m.norm], 1, 1, d)
        self.qkv = matmul("qkv", t, h, (heads + 2 * kv) * hd, d, dtype=low_for("qkv"), grad_bytes=g)
        self.qk_norm = costs.elementwise("qk_norm", t * (heads + kv) * hd, costs.NORM_FLOPS[m.norm], 1, 1, d,
                                         op_class="norm") if m.qk_norm else None
        self.flash = flash = options.attention_backend == "flash"
        self.attention_dtype = "fp8" if options.fp8_attention else ""  # "": the model's
        att = self.attention_dtype
        self.attn = costs.attention(b, s // p.cp, heads, kv, hd, d, flash=flash, dtype=att)
        self.attn_window = costs.attention(b, s, heads, kv, hd, d, window=m.window_size, flash=flash, dtype=att) \
            if m.window_size and m.window_size < s else self.attn  # sliding-window layers (no context parallelism)
        self.attn_out = matmul("attn_out", t, heads * m.value_head_size, h, d, dtype=low_for("attn_out"),
                               grad_bytes=g)
        self.dense: Ffn | None = None  # a dense layer's FFN (of a mixture-of-experts model: its first layers')
        self.shared: Ffn | None = None  # a mixture-of-experts layer's shared expert
        self.latent: tuple[Matmul, Matmul] | None = None  # a latent MoE layer's projections (down, up)
        self.rope = costs.rope(t, heads, kv, hd, d, fused=m.rope_fused) if m.position_embedding == "rope" else None
        if self.mla is not None and self.rope is not None:  # the queries' RoPE parts and the keys' shared one
            self.rope = costs.rope(t, heads, 1, m.qk_rope_head_dim, d, fused=m.rope_fused) \
                if m.qk_rope_head_dim else None
        if m.is_moe:  # the experts' kernels (mlp_in, act, mlp_out)
            etp, e = p.expert_tp, m.expert_width  # e: the width the experts and the dispatcher see
            experts, ef = m.num_experts // p.ep, m.ffn_hidden_size // etp
            in_width = (2 if m.gated_ffn else 1) * ef
            # alltoall dispatcher: each rank routes its own tokens, then the expert-tensor ranks gather theirs
            # (unless they are tensor-parallel ranks that hold the same tokens: no sequence parallelism)
            self.expert_gather = etp > 1 and (self.sp or etp != tp)
            moe_tokens = t_local * m.top_k * (etp if self.expert_gather else 1)
            self.router = matmul("router", t_local, h, m.num_experts, d, grad_bytes=g)
            self.mlp_in = matmul("expert_in", moe_tokens, e, in_width, d, weights=experts, dtype=low_for("expert_in"),
                                 grad_bytes=g)
            self.mlp_out = matmul("expert_out", moe_tokens, ef, e, d, weights=experts, dtype=low_for("expert_out"),
                                  grad_bytes=g)
            if m.moe_latent_size:  # on the rank's own tokens (every tensor-parallel rank holds the weights whole)
                self.latent = (matmul("latent_down", t_local, h, e, d, dtype=low_for("latent_down"), grad_bytes=g),
                               matmul("latent_up", t_local, e, h, d, dtype=low_for("latent_up"), grad_bytes=g))
            self.expert_gather_bytes = t_local * m.top_k * e * d
            flex = options.moe_dispatcher == "flex"
            routing = (m.router_groups, m.router_group_topk)
            copies = flex_copies(m.num_experts, m.top_k, p.ep, *routing) if flex else m.top_k
            self.dispatch_bytes = round(t_local * copies * e * d)
            # the flex dispatcher across NVLink domains: a token crosses to each other domain holding one of its
            # experts once (to the rank at its own place there), which forwards it to the others over NVLink
            self.expert_domains = options.expert_domains(p)
            # the library running the flex dispatcher's exchange (its network leg's efficiency differs from NCCL's)
            self.exchange_library = options.moe_flex_backend if flex else ""
            self.dispatch_domain_bytes = 0
            if self.expert_domains is not None:
                domains = self.expert_domains[0]
                self.dispatch_domain_bytes = round(t_local * flex_copies(m.num_experts, m.top_k, domains, *routing)
                                                   * e * d)
            # Transformer Engine's fused grouped MLP: each grouped GEMM one kernel, the activation in their epilogues
            self.fused_mlp = options.moe_fused_mlp
            if experts > 1 and not self.fused_mlp:  # TE's GroupedLinear: a GEMM per local expert, a few streams
                self.mlp_in, self.mlp_out = (replace(g, streams=GROUPED_GEMM_STREAMS)
                                             for g in (self.mlp_in, self.mlp_out))
            self.moe_host_sync = options.moe_host_sync
            # where the rank sorts its tokens by expert (TrainingOptions.moe_flex_backend): "send" (the alltoall
            # dispatcher, before its exchange), "receive" (DeepEP and HybridEP, after it) or "" (HybridEP with
            # the permutation fused into its exchange kernels); the alltoall dispatcher also sorts the received
            # tokens by local expert and back (sort_chunks)
            hybridep = options.hybridep()
            self.permute_at = "send" if not flex else "" if hybridep and options.moe_hybridep_fused_permute \
                else "receive"
            self.sort_chunks = costs.elementwise("sort_chunks", moe_tokens * e, 1, 1, 1, d) \
                if not flex and experts > 1 else None
            # FP8/FP4 GEMMs need each expert's rows in multiples of the quantization block: with the dropless
            # alltoall dispatcher TEGroupedMLP pads them in a copy of its own and unpads the output (Transformer
            # Engine's Fp8Padding / Fp8Unpadding); the flex dispatchers' permutations pad as they permute
            self.quantization_padding = costs.elementwise("quantization_padding", moe_tokens * e, 1, 1, 1, d) \
                if self.mlp_in.dtype and not flex and options.moe_host_sync else None
            # what the dispatcher all-gathers over the expert-parallel group before the exchange: each expert's
            # token count, or (HybridEP) the routing map, a byte per token and expert
            self.gathers_routing_map = hybridep  # with or without the host sync
            self.dispatch_gather_bytes = (t_local if hybridep else COUNT_BYTES) * m.num_experts
            # HybridEP across NVLink domains first copies the rank's tokens into its RDMA buffer (each dispatch)
            self.rdma_staging = costs.elementwise("rdma_staging", t_local * e, 0, 1, 1, d)[0] \
                if hybridep and self.expert_domains is not None and self.expert_domains[0] > 1 else None
            self.local_experts = experts
            self.act = costs.elementwise("activation", moe_tokens * ef, costs.ACTIVATION_FLOPS[m.gated_ffn],
                                         2 if m.gated_ffn else 1, 1, d)
            # Megatron-Core's unfused pieces around the experts' fused kernels (TEGroupedMLP): the clamped GLU's
            # clamp, and the second layer's biases, which it scales by the routing probabilities itself (both inside
            # Transformer Engine's kernels with its fused MLP)
            unfused = not options.moe_fused_mlp
            self.act_clamp = costs.tensor_passes("activation_clamp", moe_tokens * in_width, costs.CLAMP_PASSES, d) \
                if m.clamped_glu and unfused else None
            self.expert_bias = costs.tensor_passes("expert_bias", moe_tokens * e, costs.SCALED_BIAS_PASSES, d) \
                if m.bias and unfused else None
            if m.dense_layers or "-" in m.layer_pattern:  # the model's first (or its hybrid MLP) layers are dense
                self.dense = ffn("mlp", m, t, m.dense_ffn // tp, low_for("mlp_in"), g)
            if m.shared_expert_ffn:
                self.shared = ffn("shared", m, t, m.shared_expert_ffn // tp, low_for("shared_in"), g,
                                  act="shared_activation")
        else:
            self.dense = ffn("mlp", m, t, f, low_for("mlp_in"), g)
        self.mamba = MambaMixer(m, b, s // p.cp, tp, (low_for("mamba_in"), low_for("mamba_out")), g) \
            if "M" in m.layer_pattern else None
        # multi-token prediction: the two norms (embedding, hidden states) and the projection of their pair
        self.mtp_norms = costs.elementwise("norm", t_local * 2 * h, costs.NORM_FLOPS[m.norm], 2, 2, d)
        self.mtp_proj = matmul("mtp_proj", t, 2 * h, h // tp, d, dtype=low_for("mtp_proj"), grad_bytes=g)
        vocab = p.padded_vocab(m) // tp
        self.head = matmul("lm_head", t, h, vocab, d, grad_bytes=g)
        self.loss = costs.cross_entropy(t, vocab, d) if options.cross_entropy == "unfused" else \
            costs.elementwise("loss", t * vocab, costs.LOSS_FLOPS, 1, 1, d)
        self.embed = costs.elementwise("embedding", t * h, 1, 1, 1, d)

    def quantize(self, name: str, gemm: Matmul, operand: str) -> tuple[costs.Kernel, ...]:
        """The kernels quantizing ``gemm``'s ``operand`` ("input", "grad" or "weight") under the recipe; none for a
        16-bit GEMM (the output layer and router are never quantized)."""
        if self.recipe is None or not gemm.dtype:
            return ()
        # an MXFP8 GEMM of an NVFP4 step (mxfp8_gemms) is quantized with MXFP8's kernels
        recipe = MXFP8_RECIPE if gemm.dtype == MXFP8 else self.recipe
        elements = {"input": quantize.input_elements, "grad": quantize.grad_elements,
                    "weight": quantize.weight_elements}[operand](gemm)
        return quantize.operand_kernels(name, elements, recipe, quantize.launches(gemm, operand, recipe))

    def rows(self, matmul_: Matmul, parts: int) -> list[Matmul]:
        """``matmul_`` split into ``parts`` GEMMs over its rows (the chunks of an overlapped GEMM; the FLOPs add up)."""
        return list(_split_rows(matmul_, parts))


@lru_cache(maxsize=1024)
def _split_rows(matmul_: Matmul, parts: int) -> tuple[Matmul, ...]:
    base, extra = divmod(matmul_.tokens, parts)
    return tuple(replace(matmul_, tokens=base + (i < extra)) for i in range(parts))


def tensor_params(model: ModelConfig, plan: ParallelPlan, moe: bool = True) -> dict[str, tuple[str, int]]:
    """One layer's weight tensors on one rank, in backward (gradient-ready) order: name -> (buffer, parameters),
    buffer "dense" or "expert" (``moe`` False: a dense layer of a mixture-of-experts model). Norm weights count with
    the norm; a row-parallel bias with its GEMM."""
    m, tp = model, plan.tp
    h, hd = m.hidden_size, m.head_size
    f = m.ffn_hidden_size if m.is_moe and moe else m.dense_ffn
    qkv_width = (m.num_heads + 2 * m.kv_heads) * hd
    bias = m.bias
    out: dict[str, tuple[str, int]] = {}
    if m.is_moe and moe:
        etp, local, e = plan.expert_tp, m.num_experts // plan.ep, m.expert_width
        ffn_in = (m.ffn_matrices - 1) * (e * f + (f if bias else 0)) // etp
        if m.moe_latent_size:
            out["latent_up"] = ("dense", e * h)
        out["expert_out"] = ("expert", local * (e * f // etp + (e if bias else 0)))
        out["expert_in"] = ("expert", local * ffn_in)
        if m.moe_latent_size:
            out["latent_down"] = ("dense", h * e)
        out["router"] = ("dense", h * m.num_experts)
        if m.shared_expert_ffn:
            out.update(_ffn_tensors("shared", m, m.shared_expert_ffn, tp))
    else:
        out.update(_ffn_tensors("mlp", m, f, tp))
    out["mlp_norm"] = ("dense", m.norm_params())
    out["attn_out"] = ("dense", m.attention_width * h // tp + (h if bias else 0))
    if m.is_mla:
        heads, rope, ql, kl = m.num_heads, m.qk_rope_head_dim, m.q_lora_rank, m.kv_lora_rank
        out["q_up"] = ("dense", ql * heads * (hd + rope) // tp)
        out["kv_up"] = ("dense", kl * heads * (hd + m.value_head_size) // tp)
        out["q_down"] = ("dense", h * ql + ql)  # with its latent's norm weights
        out["kv_down"] = ("dense", h * (kl + rope) + kl)
    else:
        # with the query and key norms' weights (held whole)
        out["qkv"] = ("dense", (h * qkv_width + (qkv_width if bias else 0)) // tp + (2 * hd if m.qk_norm else 0))
    out["attn_norm"] = ("dense", m.norm_params())
    return out


def kind_tensors(model: ModelConfig, plan: ParallelPlan, kind: str) -> dict[str, tuple[str, int]]:
    """tensor_params of a layer of ``kind`` (ModelConfig.layer_kind: "moe", "dense" or a hybrid pattern symbol)."""
    return _hybrid_tensors(model, plan, kind) if kind in HYBRID_SYMBOLS else tensor_params(model, plan, kind == "moe")


ATTENTION_TENSORS = ("attn_out", "q_up", "kv_up", "q_down", "kv_down", "qkv", "attn_norm")


def _hybrid_tensors(m: ModelConfig, plan: ParallelPlan, symbol: str) -> dict[str, tuple[str, int]]:
    """A hybrid layer's weight tensors on one rank in backward order: its block's, then its pre-norm's."""
    if symbol == "M":  # out_proj; the convolution, the heads' dt_bias, A_log and D, the gated norm; in_proj
        split, matmul, _ = m.mamba_params()
        out = m.mamba_inner * m.hidden_size
        return {"mamba_out": ("dense", out // plan.tp), "mamba_mix": ("dense", (split - matmul) // plan.tp),
                "mamba_in": ("dense", (matmul - out) // plan.tp), "mamba_norm": ("dense", m.norm_params())}
    attention = symbol == "*"
    return {k: v for k, v in tensor_params(m, plan, moe=symbol == "E").items() if (k in ATTENTION_TENSORS) == attention}


def _ffn_tensors(name: str, m: ModelConfig, width: int, tp: int) -> dict[str, tuple[str, int]]:
    """A dense FFN's weight tensors on one rank in backward order: the row-parallel one (with its bias, held whole),
    then the column-parallel one (its gate and up matrices, their biases)."""
    h, bias = m.hidden_size, m.bias
    return {f"{name}_out": ("dense", h * width // tp + (h if bias else 0)),
            f"{name}_in": ("dense", (m.ffn_matrices - 1) * (h * width + (width if bias else 0)) // tp)}
