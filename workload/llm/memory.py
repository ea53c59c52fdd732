"""Device memory one rank of each pipeline stage needs at its peak: weights, gradients, optimizer states, the
activations its schedule keeps for the backward, the loss's logits and the runtime's own buffers.

An estimate for deciding whether a layout fits, not an allocator trace. Conventions:
- Weights in the model's dtype, plus a quantized copy of every matmul weight under fp8 (both layouts, as
  Transformer Engine caches them across micro-batches) or fp4; gradients in fp32 or the model's dtype as they
  are reduced (``grad_reduce_in_fp32``); Adam's fp32 master weights and two moments (12 B per parameter). ZeRO 1
  (Megatron's distributed optimizer) shards the optimizer states over the data-parallel ranks (experts' over
  their expert-data-parallel ranks), ZeRO 2 the gradients too, ZeRO 3 / FSDP the weights as well, of which it
  holds two layers gathered at a time.
- Activations per layer and micro-batch follow Korthikanti et al. (MLSys 2023, sec. 4.1), counted from the
  tensors each module saves for its backward: the inputs of the norms and of every GEMM (1 B per element when the
  GEMMs run in fp8/fp4, which saves the quantized input), the attention core's queries, keys, values and output
  (and, with the unfused backend, its softmax), the MLP activation's input, the routed tokens' expert inputs
  and outputs. Dropout masks are not counted (the shipped recipes train without dropout). Sequence parallelism
  divides the norms' tensors by tp, context parallelism every tensor by cp. Full recompute keeps each layer's
  input and, while one layer is recomputed, that layer's tensors; selective recompute drops its modules'. Activation
  offloading (``activation_offload_layers``) leaves one offloaded layer's tensors on the device at a time.
- A stage holds its forward passes from each forward to its backward, in its schedule's order
  (workload/llm/schedules.py): at most pp - stage micro-batches with 1F1B, more chunks of fewer layers with the
  interleaved schedule. The last stage also holds one micro-batch's logits in fp32 for the loss.
- ``RUNTIME_BYTES`` stands for the CUDA context, the communicators' buffers and the libraries' workspaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from workload.llm.model import ModelConfig
from workload.llm.options import TrainingOptions
from workload.llm.plan import ParallelPlan
from workload.llm.schedules import stage_schedule

RUNTIME_BYTES = 2 * 2**30
ADAM_STATE_BYTES = 12  # fp32 master weight, first and second moment
FP32 = 4


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Bytes one rank of pipeline stage ``stage`` holds at its peak, by what they hold."""

    stage: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int  # the saved forward tensors at the schedule's peak (logits included)
    in_flight: int  # (micro-batch, chunk) forward passes held at that peak
    runtime_bytes: int = RUNTIME_BYTES

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.runtime_bytes)


def stage_memory(model: ModelConfig, plan: ParallelPlan, options: TrainingOptions) -> list[StageMemory]:
    """The peak memory of one rank of every pipeline stage."""
    return [_Stage(model, plan, options, s).memory() for s in range(plan.pp)]


def peak_memory(model: ModelConfig, plan: ParallelPlan, options: TrainingOptions) -> StageMemory:
    """The stage whose ranks need the most memory."""
    return max(stage_memory(model, plan, options), key=lambda m: m.total_bytes)


class _Stage:
    def __init__(self, model: ModelConfig, plan: ParallelPlan, options: TrainingOptions, stage: int) -> None:
        self.m, self.p, self.o, self.stage = model, plan, options, stage
        self.first, self.last = stage == 0, stage == plan.pp - 1
        self.chunks = [list(plan.chunk_layers(model.num_layers, stage, c)) for c in range(plan.vp)]
        if self.last:  # multi-token-prediction depths run after the last layer, in the last chunk
            self.chunks[-1] += [model.num_layers + d for d in range(model.mtp_layers)]
        self.a = model.dtype_bytes
        self.gemm_in = 1 if options.gemm_dtype() else self.a  # a saved GEMM input: quantized under fp8/fp4
        self.tokens = plan.micro_batch_size * model.seq_len // plan.cp  # in the GEMMs of one micro-batch
        self.norm_tokens = self.tokens // plan.tp if plan.sequence_parallel else self.tokens

    # --- static state ---------------------------------------------------------------------------------
    def _params(self) -> tuple[int, int, int]:
        """(dense, expert, dense in matmuls) parameters on one rank of the stage (experts' are all in matmuls but
        their biases)."""
        m, p = self.m, self.p
        dense = expert = matmul = 0
        stored_mtp = m.num_layers + m.stored_mtp_layers
        for layer in (x for chunk in self.chunks for x in chunk if x < stored_mtp):
            params = m.kind_params(m.layer_kind(layer), p.tp, p.ep, p.expert_tp)
            dense, expert = dense + params.dense, expert + params.expert
            matmul += params.dense_matmul
            if layer >= m.num_layers:
                proj, norms = m.mtp_params(p.tp)
                dense, matmul = dense + proj + norms, matmul + proj
        vocab_rows = p.padded_vocab(m) // p.tp * m.hidden_size
        if self.first:  # the token (and learned position) embeddings
            dense += vocab_rows + m.embedding_params() - m.vocab_size * m.hidden_size
        if self.last:  # the final norm, the output layer and a copy of shared embeddings (as GradientSync)
            copies = (0 if m.tied_embeddings else 1) + (1 if m.shares_embedding(p.pp) else 0)
            dense, matmul = dense + m.norm_params() + copies * vocab_rows, matmul + vocab_rows
        return dense, expert, matmul

    def _static(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer states) bytes."""
        p, o = self.p, self.o
        dense, expert, matmul = self._params()
        dp_dense = p.dp * p.cp
        dp_expert = max(1, p.tp * p.cp * p.dp // (p.expert_tp * p.ep))
        zero = p.zero_stage

        def shard(params: int, n: int, stage: int) -> float:
            return params / n if zero >= stage else params

        held = shard(dense, dp_dense, 3) + shard(expert, dp_expert, 3)
        held_matmul = shard(matmul, dp_dense, 3) + shard(expert, dp_expert, 3)
        if zero >= 3:  # FSDP gathers a layer ahead of the one it runs
            largest = max((self.m.kind_params(self.m.layer_kind(x), p.tp, p.ep, p.expert_tp)
                           for chunk in self.chunks for x in chunk if x < self.m.num_layers),
                          key=lambda lp: lp.dense + lp.expert, default=None)
            if largest is not None:
                held += 2 * (largest.dense + largest.expert)
                held_matmul += 2 * (largest.dense_matmul + largest.expert)
        # a quantized copy of each matmul weight (fp8: both layouts); fp8 primary weights replace the 16-bit ones
        quantized = {"fp8": 2, "fp4": 1}.get(o.gemm_dtype(), 0) * held_matmul
        primary = self.a * (held - held_matmul if o.fp8_param_gather and o.fp8() else held)
        weights = primary + quantized
        grads = (shard(dense, dp_dense, 2) + shard(expert, dp_expert, 2)) * o.grad_bytes(self.a)
        optimizer = (shard(dense, dp_dense, 1) + shard(expert, dp_expert, 1)) * ADAM_STATE_BYTES
        return int(weights), int(grads), int(optimizer)

    # --- activations ----------------------------------------------------------------------------------
    def _layer_bytes(self, layer: int) -> int:
        """The tensors one micro-batch's forward of ``layer`` keeps for its backward (without recompute)."""
        m = self.m
        total = 0
        for block in m.layer_blocks(layer):
            total += {"attention": self._attention, "mlp": self._mlp, "moe": self._moe,
                      "mamba": self._mamba}[block](layer)
        return total

    def _norm_and_input(self, width: int) -> int:
        """A block's pre-norm input and its first GEMM's input (the norm's output; dropped by layernorm
        recompute)."""
        n = self.norm_tokens * width
        kept = 0 if "layernorm" in self.p.recomputed else n * self.gemm_in
        return n * self.a + kept

    def _attention(self, layer: int) -> int:
        m, p = self.m, self.p
        t, heads = self.tokens, m.num_heads // p.tp
        qk = m.head_size + (m.qk_rope_head_dim if m.is_mla else 0)
        kv_heads = heads if m.is_mla else m.kv_heads // p.tp
        saved = self._norm_and_input(m.hidden_size)
        if m.is_mla:  # the latents feed the per-head up-projections
            saved += t * (m.q_lora_rank + m.kv_lora_rank) * self.gemm_in
        qkv = t * (heads * qk + kv_heads * (qk + m.value_head_size)) * self.a
        saved += 0 if "mla_up_proj" in p.recomputed else qkv
        saved += t * heads * m.value_head_size * self.gemm_in  # the output projection's input
        saved += t * heads * FP32  # the softmax statistics
        if self.o.attention_backend == "unfused" and "core_attn" not in p.recomputed:
            window = m.window_size if m.windowed(layer) else None
            keys = min(window, m.seq_len) if window else m.seq_len
            saved += t * heads * keys * self.a
        return saved

    def _ffn(self, tokens: int, width: int, tp: int) -> int:
        """An FFN's first GEMM output (the activation's input) and the second GEMM's input."""
        activation_in = tokens * width * (2 if self.m.gated_ffn else 1) // tp * self.a
        return activation_in + tokens * width // tp * self.gemm_in

    def _mlp(self, layer: int) -> int:
        if "mlp" in self.p.recomputed:
            return self.norm_tokens * self.m.hidden_size * self.a
        return self._norm_and_input(self.m.hidden_size) + self._ffn(self.tokens, self.m.dense_ffn, self.p.tp)

    def _moe(self, layer: int) -> int:
        m, p = self.m, self.p
        if "moe" in p.recomputed:
            return self.norm_tokens * m.hidden_size * self.a
        saved = self._norm_and_input(m.hidden_size) + self.norm_tokens * m.num_experts * FP32  # router scores
        if m.shared_expert_ffn:
            saved += self._ffn(self.tokens, m.shared_expert_ffn, p.tp)
        routed = self.norm_tokens * m.top_k * p.expert_tp  # token copies this rank's experts run (balanced)
        io = m.expert_width
        saved += routed * io * (self.gemm_in + self.a)  # the experts' input and output (weighted by the router)
        first_out = routed * m.ffn_hidden_size * (2 if m.gated_ffn else 1) // p.expert_tp * self.a
        second_in = 0 if "moe_act" in p.recomputed else routed * m.ffn_hidden_size // p.expert_tp * self.gemm_in
        return saved + first_out + second_in

    def _mamba(self, layer: int) -> int:
        m, t = self.m, self.tokens // self.p.tp  # heads and groups split over tp
        bc = 2 * m.mamba_groups * m.mamba_state_dim
        projected = t * (2 * m.mamba_inner + bc + m.mamba_heads) * self.a  # in_proj's output
        convolved = t * (m.mamba_inner + bc) * self.a
        return self._norm_and_input(m.hidden_size) + projected + convolved + 2 * t * m.mamba_inner * self.a

    def _chunk_bytes(self, chunk: int) -> int:
        layers = self.chunks[chunk]
        if self.p.recompute_mode == "full":
            return len(layers) * self.norm_tokens * self.m.hidden_size * self.a
        offloaded = self.o.activation_offload_layers
        kept = sum(self._layer_bytes(x) for x in layers[offloaded:])
        # an offloaded layer's tensors are on the device while it saves them and again from its prefetch on
        return kept + max((self._layer_bytes(x) for x in layers[:offloaded]), default=0)

    def _activations(self) -> tuple[int, int]:
        """(bytes, passes held) at the schedule's peak."""
        p = self.p
        per_chunk = [self._chunk_bytes(c) for c in range(p.vp)]
        held: set[tuple[int, int]] = set()
        live = peak = peak_passes = 0
        for kind, mb, chunk in stage_schedule(p.pp, self.stage, p.num_micro_batches, p.vp, p.group_size):
            if kind == "F":
                held.add((mb, chunk))
                live += per_chunk[chunk]
                if live > peak:
                    peak, peak_passes = live, len(held)
            else:
                held.discard((mb, chunk))
                live -= per_chunk[chunk]
        if p.recompute_mode == "full":  # the layer being recomputed holds all its tensors for its backward
            peak += max((self._layer_bytes(x) for chunk in self.chunks for x in chunk), default=0)
        if self.last:
            vocab = p.padded_vocab(self.m) // p.tp
            copies = 1 + self.m.mtp_layers
            loss = FP32 + (self.a if self.o.cross_entropy == "unfused" else 0)
            peak += copies * self.tokens * vocab * loss
        return peak, peak_passes

    def memory(self) -> StageMemory:
        weights, grads, optimizer = self._static()
        activations, passes = self._activations()
        return StageMemory(self.stage, weights, grads, optimizer, activations, passes)
