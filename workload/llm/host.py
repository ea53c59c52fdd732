"""The host (CPU) side of a training step: the framework's Python and library calls that issue the kernels, which
a GPU-only trace leaves out.

The GPU runs kernels in the order the host enqueues them. While the host is ahead (large kernels, few calls) its
own time never shows; it shows where layers are many small kernels (mixture-of-experts layers with many local
experts, small micro-batches) or where the host must wait for the GPU: Megatron-Core's dropless token dispatcher
copies the per-expert token counts to the host and waits for them before the dispatch all-to-all (its
``cuda_sync_point``), so after each MoE layer's routing the GPU's queue is empty and the rest of the layer runs
no faster than the host issues it.

In the trace the host is one chain of CPU nodes per rank, one node per block of a layer pass (attention; dense
MLP; MoE routing; MoE expert section) in program order; a node lasts the block's issue time and the block's last
kernel waits for it, so a block ends no earlier than the host has issued it. The dropless dispatcher's expert
section node also waits for the token counts' all-gather. CUDA graphs (Megatron-Core's ``cuda_graph_scope``)
replace the issue time of what they capture by one graph launch: ``attn``, ``mlp``, ``mamba``, ``moe_router``,
``moe_preprocess`` (the dispatcher's counting before the wait), ``full`` (a whole layer; static shapes only,
i.e. not with the dropless dispatcher) and ``full_iteration`` (no host nodes at all).

Issue times are counts of framework calls per block (Megatron-Core's TE layer spec, alltoall dispatcher,
TEGroupedMLP: forward and autograd backward) times per-call host costs on a reference x86 host, scaled by the
host CPU (``HOST_CPU_SCALE``). Sources (public measurements; docs/compute-model.md lists them):
- a Transformer Engine module call (Linear, LayerNormLinear, DotProductAttention) ~36 us on a DGX H100's Xeon:
  TE Linear forward 99.7 us on a GB200's Grace, and Grace takes 2.75x an x86 Xeon 8480C's time per framework call
  (torch.nn.Linear 37.1 vs 13.5 us; NVIDIA/TransformerEngine issue 2053);
- an eager PyTorch operator 7 us (meta-pytorch/autoparallel's fitted kernel launch overhead on H100, PR 146;
  PyTorch issue 41383: 5-7 us per scalar op);
- an autograd backward replays each call at about twice its forward host time (the engine's node, TE's backward
  work: PyTorch issues 44484, 157407);
- a device-to-host copy the host waits on: ~30 us round trip (kekzl/imp issue 1654);
- Transformer Engine's GroupedLinear per local expert: a quantizer, tensor wrappers and a cuBLASLt heuristic and
  launch per expert in forward, dgrad and wgrad calls plus Megatron DDP's gradient hook per expert weight in
  backward (TE grouped_linear.py, Megatron-Core distributed_data_parallel.py; TE issue 2897 measures 19 / 33 us
  per expert forward / backward on Grace for the fused grouped MLP, which does less per expert);
- a CUDA graph launch ~15 us;
- a GEMM module in FP8 or FP4 (its quantizers: the cast of its input and weight, the scales' bookkeeping) 1.8x its
  16-bit host time, per call and per expert: TE issue 761 measures a host-bound model of te.Linear layers at 140 ms
  per forward in FP8 against 77 ms in BF16 (H100).
Megatron-Core spends more host time per call than these isolated calls take (its hooks, autocast and
parallel-state checks, NVTX ranges, tensor bookkeeping around every module): ``CALL_SCALE`` multiplies the
per-call costs, ``EXPERT_SCALE`` the per-expert ones and ``SYNC_SCALE`` the dropless dispatcher's way from the
token counts' arrival to the dispatch's launch. The first two are fitted to the one published A/B of a Megatron MoE
step's host share found: Megatron-Bridge's CUDA-graph card (Qwen3-30B-A3B on 16 H100, TP2 PP2 EP4, GBS 8 MBS 1:
623 ms eager, 484 ms with attention, router and dispatcher preprocessing graphed); the third to the idle GPU of its
MoE comm-overlap card's profile (the same model on 16 H100, EP16 with HybridEP, GBS 1024 MBS 1: 1.893 s of a
24.714 s step without a kernel, 3,072 waits; about 0.6 ms each, four times the copy's round trip and two calls at
the per-call scale). ``benchmarks/host_calibration.py`` repeats the fit and prints it against the cards and the
other published host-bound and GPU-bound runs.
Per-call costs vary with the software release (TE has cut GroupedLinear's per-expert work several times) and the
CPU's clock: they are an order of magnitude, good for telling a host-bound layer from a GPU-bound one.
"""

from __future__ import annotations

from dataclasses import dataclass

from workload.errors import InputError

HOST_CPUS = ("x86", "grace")
# host time per framework call relative to the reference x86 (Xeon 8480C of a DGX H100). NVIDIA Grace: TE issue
# 2053 times one torch.nn.Linear forward at 2.75x (37.1 us on GB200's Grace vs 13.5 us on the DGX H100's Xeon), which
# with the calibrated costs below makes the shared tables' GB200/GB300 micro-batch-4 Qwen3-30B-A3B rows 76-113% too
# slow; parity leaves them 18-26% too fast. 1.25 is set on those four rows (-17% to -1%), where the published GB200
# step also matches the B200 one of the same recipe (within 1%; the model: 7% apart)
HOST_CPU_SCALE = {"x86": 1.0, "grace": 1.25}
GRAPH_SCOPES = ("attn", "mlp", "mamba", "moe_router", "moe_preprocess", "full", "full_iteration")

MODULE_US = 36.0  # a Transformer Engine module's forward call
OP_US = 7.0  # an eager PyTorch operator (or a torch.distributed call)
BACKWARD_FACTOR = 2.0  # an autograd backward's host time per call relative to the forward's
SYNC_US = 30.0  # the device-to-host copy of the token counts, waited for, until the host runs again
EXPERT_FORWARD_US = 10.0  # one GroupedLinear forward, per local expert
EXPERT_BACKWARD_US = 27.0  # one GroupedLinear backward (dgrad + wgrad, DDP hook), per local expert
GRAPH_LAUNCH_US = 15.0
LOW_PRECISION_FACTOR = 1.8  # a GEMM module's host time in FP8 or FP4 over its 16-bit time (TE issue 761: 140 / 77 ms)
CALL_SCALE = 3.4  # Megatron-Core's host time per module or operator call over the isolated call's (fitted, see above)
EXPERT_SCALE = 1.7  # the same for the per-expert work of TE's GroupedLinear (fitted, see above)
SYNC_SCALE = 14.0  # the same for the dropless dispatcher's way from the token counts' arrival to the dispatch's
# launch (fitted on a profile's idle GPU, see above)

# Framework calls per block, forward (modules, operators), Megatron-Core's TE spec:
ATTENTION_CALLS = (3, 4)  # LayerNormLinear qkv, DotProductAttention, Linear proj; RoPE (2), bias-dropout-add, view
ATTENTION_GEMM_MODULES = 2  # qkv and proj (the ones that quantize)
QK_NORM_MODULES = 2  # with query and key norms (Qwen3): a TE norm module each
MLP_CALLS = (2, 2)  # LayerNormLinear fc1, Linear fc2; activation, bias-dropout-add
# a Mamba-2 block (Megatron-Core's MambaMixer): LayerNormLinear in_proj, the gated RMSNorm, Linear out_proj; the splits
# of in_proj's output, the convolution, the SSD scan's call (its Triton kernels), views, the residual add
MAMBA_CALLS = (3, 8)
ROUTER_CALLS = (1, 12)  # the pre-MLP norm; router GEMM, softmax, top-k, routing map, aux-loss terms
PREPROCESS_OPS = 6  # per-expert counts, their all-gather over the expert-parallel group, views, the copy to host
SYNC_RETURN_OPS = 2  # after the wait: the counts turned into split sizes, the dispatch's call
EXPERT_SECTION_OPS = 8  # the second dispatch all-to-all (probs), permutation, chunk sort, activation, unpermutation,
# combine all-to-all, residual add; plus two GroupedLinear calls (a module each) and their per-expert work
GROUPED_LINEARS = 2
CLAMP_OPS = 4  # the clamped GLU (GPT-OSS): the halves' view, their two clamps, the concatenation
SCALED_BIAS_OPS = (5, 2)  # TEGroupedMLP._apply_bias: splits, concatenation, view, cast; per expert a product, a sum
HEAD_CALLS = (3, 2)  # final norm, output layer, fused cross entropy; the loss scaling


@dataclass(frozen=True, kw_only=True, slots=True)
class HostModel:
    """Per-block host issue times (whole us) of one micro-batch's layer on one rank."""

    cpu: str = "x86"
    graph_scopes: frozenset[str] = frozenset()
    low_precision: bool = False  # the layers' GEMMs run in FP8 or FP4 (the output layer and router never do)

    def __post_init__(self) -> None:
        if self.cpu not in HOST_CPUS:
            raise InputError(f"host CPU must be one of {', '.join(HOST_CPUS)} (got {self.cpu!r})")
        unknown = sorted(self.graph_scopes - set(GRAPH_SCOPES))
        if unknown:
            raise InputError(f"unknown CUDA graph scope {', '.join(unknown)}: valid are {', '.join(GRAPH_SCOPES)}")

    @property
    def active(self) -> bool:
        """False where one graph replays the whole iteration: no host nodes at all."""
        return "full_iteration" not in self.graph_scopes

    def _scaled(self, us: float) -> int:
        return max(1, round(us * HOST_CPU_SCALE[self.cpu]))

    def _us(self, modules: float, ops: float, backward: bool, expert_us: float = 0.0, gemm_modules: int = 0) -> int:
        """Host time of ``modules`` TE module calls (``gemm_modules`` of them quantizing in low precision) and
        ``ops`` eager operators (backward: their autograd nodes), and ``expert_us`` of per-expert work (isolated-call
        costs, before the scales)."""
        low = LOW_PRECISION_FACTOR if self.low_precision else 1.0
        module_us = (modules + (low - 1) * gemm_modules) * MODULE_US
        calls_us = (module_us + ops * OP_US) * (BACKWARD_FACTOR if backward else 1.0)
        # the scales are read here, not bound at import: benchmarks/host_calibration.py refits them in place
        return self._scaled(calls_us * CALL_SCALE + expert_us * low * EXPERT_SCALE)

    def _unless_graphed(self, scope: str, us: int) -> int:
        return self._scaled(GRAPH_LAUNCH_US) if scope in self.graph_scopes or "full" in self.graph_scopes else us

    def attention(self, backward: bool, qk_norm: bool = False) -> int:
        modules, ops = ATTENTION_CALLS
        modules += QK_NORM_MODULES if qk_norm else 0
        return self._unless_graphed("attn", self._us(modules, ops, backward, gemm_modules=ATTENTION_GEMM_MODULES))

    def mlp(self, backward: bool) -> int:
        return self._unless_graphed("mlp", self._us(*MLP_CALLS, backward, gemm_modules=MLP_CALLS[0]))

    def mamba(self, backward: bool) -> int:
        """A hybrid model's Mamba-2 block (Megatron-Core's CUDA graph scope ``mamba`` captures it)."""
        return self._unless_graphed("mamba", self._us(*MAMBA_CALLS, backward, gemm_modules=2))

    def shared_expert(self, backward: bool) -> int:
        """A MoE layer's shared expert (an MLP's calls), captured with the router's graph (Megatron-Core's
        moe_router scope holds the shared expert when it is not overlapped)."""
        return self._unless_graphed("moe_router", self._us(*MLP_CALLS, backward, gemm_modules=MLP_CALLS[0]))

    def routing(self, backward: bool, latent: bool = False) -> int:
        """The MoE layer up to the dispatch: norm, router and the dispatcher's preprocessing (forward), with a latent
        MoE's projection down (a TE module, in the preprocessing's graph scope)."""
        us = self._unless_graphed("moe_router", self._us(*ROUTER_CALLS, backward))
        if latent or not backward:
            ops = 0 if backward else PREPROCESS_OPS
            us += self._unless_graphed("moe_preprocess", self._us(int(latent), ops, backward, gemm_modules=int(latent)))
        return us

    def sync_return(self) -> int:
        """The dropless dispatcher's wait, from the token counts' arrival to the dispatch's launch: the copy's round
        trip and the calls before the dispatch (the GPU has nothing queued meanwhile)."""
        return self._scaled((SYNC_US + SYNC_RETURN_OPS * OP_US) * SYNC_SCALE)

    def copy_wait(self) -> int:
        """A blocking host-to-device copy (a GPU tensor made from a Python number): the host waits for the GPU's
        queue to drain, then makes the next call (the GPU has nothing queued meanwhile)."""
        return self._scaled((SYNC_US + OP_US) * CALL_SCALE)

    def experts(self, local_experts: int, backward: bool, clamped_glu: bool = False, scaled_bias: bool = False,
                latent: bool = False) -> int:
        """The expert section: dispatch, the two grouped linears over ``local_experts``, combine (a whole-layer
        graph captures it only with static shapes: not with the dropless dispatcher, which options refuse); with
        the clamped GLU's clamp and the experts' scaled second-layer biases, their PyTorch calls, and with a latent
        MoE the projection up after the combine (a TE module)."""
        per_expert = EXPERT_BACKWARD_US if backward else EXPERT_FORWARD_US
        ops = EXPERT_SECTION_OPS + (CLAMP_OPS if clamped_glu else 0)
        if scaled_bias:
            ops += SCALED_BIAS_OPS[0] + SCALED_BIAS_OPS[1] * local_experts
        modules = GROUPED_LINEARS + int(latent)
        return self._unless_graphed("full", self._us(modules, ops, backward,
                                                     GROUPED_LINEARS * local_experts * per_expert, modules))

    def head(self, backward: bool) -> int:
        return self._us(*HEAD_CALLS, backward)


def graph_scopes(text: str | None) -> frozenset[str]:
    """``attn,moe_router`` -> frozenset; None or empty -> none."""
    return frozenset(s.strip() for s in (text or "").split(",") if s.strip())
