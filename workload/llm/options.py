"""How the framework runs the step, beyond how the model is split (workload/llm/plan.py): precision,
communication overlap, gradient buckets, FSDP details and the tail of the iteration.

Names and defaults follow Megatron-Core's DistributedDataParallelConfig and TransformerConfig where they exist:

- ``precision``: the GEMMs' math ("bf16", "fp16", "fp8" or "fp4"; None = the model's dtype). With fp8 or fp4
  (Transformer Engine) the layers' GEMMs (forward, input and weight gradients) run in FP8 (NVFP4), each with the
  quantization kernels of its operands (workload/llm/quantize.py), and with fp8 the sequence-parallel
  all-gathers of GEMM inputs carry FP8 (TE quantizes before gathering; with fp4 they stay 16-bit here);
  reduce-scatters and all-reduces of GEMM outputs, pipeline sends, attention, the router and the output layer
  stay in the model's dtype.
- ``fp8_recipe`` ("delayed"): how FP8 tensors are scaled (Megatron-Core's --fp8-recipe): "delayed" (TE's
  default, amax history), "tensorwise" (current scaling, NeMo/Megatron-Bridge's fp8_cs) or "mxfp8" (Blackwell
  1 x 32 block scaling). fp4 is NVFP4 (--fp4-recipe nvfp4), its only recipe.
- ``grad_reduce_in_fp32`` (False): data-parallel gradient collectives in FP32 instead of the model's dtype
  (Megatron-LM's training script turns it on for bf16 unless --grad-reduce-in-bf16; Llama 3 reduces in FP32).
- ``fp8_param_gather`` (False): the distributed optimizer's parameter all-gathers carry the layers' GEMM
  weights in FP8.
- ``overlap_grad_reduce`` (None): True = Megatron's bucketed gradient reduction during the last micro-batch's
  backward; False = every bucket after the whole backward; None = by ZeRO stage, as this generator always did
  (stages 0, 2 and 3 during the backward, stage 1 after it).
- ``bucket_size`` (None): parameters per gradient bucket. None = one bucket per layer (and one for the
  embedding/output layer); "megatron" = Megatron-Core's default max(40M, 1M x dp x cp), in Megatron's parameter
  order, with one bucket per model chunk on pipeline stages after the first and on chunks after the first.
- ``overlap_param_gather`` (False): the distributed optimizer's parameter all-gathers run per bucket with the
  next iteration's first forward, one bucket ahead: the first at the start, each next one once the one before is
  done and the forward has reached the module waiting for it (Megatron-Core r0.8's forward pre-hook); each
  module's first forward waits for its bucket. Off, they follow the optimizer step.
- ``tp_comm_overlap`` (False): Megatron-Core's --tp-comm-overlap (Transformer Engine userbuffers, needs sequence
  parallelism): the all-gather before the QKV and FC1 GEMMs and before the projection and FC2 input-gradient
  GEMMs becomes a ring exchange of tp - 1 steps feeding tp GEMM chunks; the reduce-scatter after the projection
  and FC2 GEMMs runs per chunk of 4 GEMM chunks. The backward's other all-gather and reduce-scatter run beside
  the GEMMs in any case (Megatron's linear layers overlap them).
- ``reshard_after_forward`` (True) and ``fsdp_grad_sync`` ("every"): ZeRO-3/FSDP (torch FSDP2 names). With
  reshard_after_forward False the layer's parameters gathered for the forward stay for its backward (Llama 3's
  setting); "last" reduce-scatters the gradients only during the last micro-batch's backward (gradient
  accumulation without sync, as torch's pipeline schedules run FSDP).
- ``attention_backend`` ("flash"): the attention core as one fused FlashAttention-style kernel, or "unfused":
  the score matrix materialised between two batched GEMMs with a fused softmax, as Megatron-LM ran it before
  FlashAttention (2021-2022; Megatron-Core's --attention-backend unfused).
- ``cross_entropy`` ("fused"): the loss over the vocabulary as one fused kernel reading the logits once
  (Megatron-Core's --cross-entropy-loss-fusion, on in NeMo and Megatron-Bridge), or "unfused": Megatron-LM's
  default vocabulary-parallel cross entropy, several fp32 passes over the logits (workload/llm/costs.py).
- ``iteration_tail`` (False): the end and start of a real iteration as nodes: a data-loader batch copy per
  micro-batch on the first and last stage (``dataloader_wait_us`` of host wait before it, default 0), the
  gradient norm for clipping (a local norm kernel, a 4-byte all-reduce over the model-parallel group, or over
  every rank with a sharded optimizer, and the scaling kernel; Megatron-LM clips at 1.0 by default), and the
  loss reduction logged each iteration (a kernel over the micro-batch losses and an 8-byte all-reduce over
  dp x cp on the last stage).
- ``host_cpu`` (None): the host issuing the kernels, "x86" or "grace" (NVIDIA Grace: GB200, GB300): one chain of
  CPU nodes per rank, each block of a layer pass ending no earlier than the host has issued it
  (workload/llm/host.py). None: the GPU's work alone (an ideal host), unless ``moe_host_sync`` asks for the host.
- ``moe_host_sync`` (False): Megatron-Core's dropless token dispatcher: the per-expert token counts all-gathered
  over the expert-parallel group and copied to the host, which waits for them before the dispatch all-to-all, so
  the expert section runs no faster than the host then issues it. Implies the host model (x86 unless
  ``host_cpu`` says otherwise). Off: a dispatcher with fixed capacities (token drop), which never waits.
- ``moe_dispatcher`` ("alltoall"): how the expert-parallel exchange moves tokens. "alltoall" (Megatron-Core's
  alltoall dispatcher): each token once per chosen expert, permuted before an NCCL all-to-all. "flex" (its flex
  dispatcher with DeepEP or HybridEP): each token once per destination rank, the copies for several experts on one
  rank made there, and the combine summed on the expert side before it travels back; with routing balanced over
  the experts a token reaches ep x (1 - C(E - E/ep, k) / C(E, k)) of the ep ranks. Timed as the NCCL all-to-all of
  those bytes (the kernels' own speed is not modelled). Where an expert-parallel group spans several NVLink
  domains (``nvlink_domain``), the exchange runs in two stages at once, as DeepEP's and HybridEP's inter-node
  kernels do: a token crosses to each other domain holding one of its experts once, to the rank at its own place
  there (an all-to-all over those peers, group epx), and every rank forwards what it holds to the ranks of its
  domain that need it (the flex bytes above, an all-to-all within the domain, group epd).
- ``moe_flex_backend`` ("deepep", Megatron-Core's default): the flex dispatcher's library. Where each dispatcher
  sorts a rank's tokens by expert: the alltoall dispatcher permutes them before its all-to-all (and back after the
  combine) and, with more than one local expert, sorts the received tokens by local expert after the exchange (and
  back before the combine): four copies of the routed tokens per layer forward. DeepEP permutes the received tokens
  after its dispatch and back before its combine (two copies). HybridEP (``dispatch_with_permute`` /
  ``combine_with_unpermute``) runs the same two copies as kernels of its own, after its dispatch kernel and before
  its combine kernel, from and to its registered buffer; it first all-gathers the routing map (a byte per token and
  expert) over the expert-parallel group, where the others exchange per-expert counts, and where the group spans
  NVLink domains it copies the rank's tokens into its RDMA buffer before each dispatch.
  With FP8/FP4 GEMMs and the dropless alltoall dispatcher the experts also pad each expert's rows to the
  quantization block and unpad their output (two more copies); the flex dispatchers pad while they permute.
- ``moe_hybridep_fused_permute`` (False, Megatron-Core's default): HybridEP's permutation inside its dispatch and
  combine kernels (Megatron-Core's moe_permute_fusion_into_hybridep): no separate permute and unpermute copies.
- ``nvlink_domain`` (None): GPUs per NVLink domain (8 on an HGX/DGX node, 72 on an NVL72 rack; ranks r and r' share
  one when r // n == r' // n), for the flex dispatcher's inter-domain stage. None: one domain holds every rank.
- ``moe_a2a_overlap`` (False): Megatron-Core's EP A2A overlap (--overlap-moe-expert-parallel-comm,
  Megatron-Bridge's moe_a2a_overlap): one more warm-up forward, then each forward of the steady phase runs
  together with the backward after it, layer by layer, so that one's expert-parallel exchanges run beside the
  other's computation (workload/llm/build.py). Needs expert parallelism, virtual pipeline stages when pp > 1, and
  no full recompute (Megatron-Core's conditions).
- ``moe_fused_mlp`` (False): the experts' MLP as Transformer Engine's fused grouped MLP (Megatron-Core's
  use_transformer_engine_op_fuser; on Blackwell the CuTe DSL grouped-GEMM kernels of TE's GroupedMLP op): each of
  the two grouped GEMMs is one kernel over all local experts (not one per expert on four streams), the first
  GEMM's kernel applies the activation and the routing probabilities and writes the second GEMM's quantized input,
  the second GEMM's input-gradient kernel applies the activation's backward and writes the first GEMM's quantized
  output gradient, and each remaining operand is quantized for all experts at once; the clamped GLU and the
  experts' scaled second-layer biases run inside its kernels, not as PyTorch kernels of their own (nor with the
  clamped GLU's blocking copy), and the activation's selective recompute has nothing separate to recompute.
- ``fp8_attention`` (False): the attention core in FP8 (Megatron-Core's --fp8-dot-product-attention, Transformer
  Engine's FP8 fused attention): its kernels timed at the device's FP8 attention efficiency. Needs precision fp8
  and the fused attention kernel.
- ``activation_offload_layers`` (0): Megatron-Core's cpu_offloading_num_layers (activations only): the saved
  activations of the first N layers go to host memory after their forward and come back before their backward,
  on streams of their own. Only the device-memory estimate (workload/llm/memory.py) counts it: the copies are taken
  as hidden under the compute, as Megatron-Core schedules them, and are not in the traces. Needs pp = 1
  (Megatron-Core's condition).
- ``bf16_layers_at_start`` / ``bf16_layers_at_end`` (0): with fp8 or fp4, that many decoder layers at the start
  and at the end of the model run their GEMMs in the model's 16-bit dtype, unquantized (Megatron-Core's
  first_last_layers_bf16 with num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16, 1 and 1 by default there;
  Nemotron 3 Super's NVFP4 recipe: 1 and 14).
- ``bf16_gemms`` (""): with fp8 or fp4, the GEMMs that stay 16-bit in every layer, by group, separated by commas
  (Transformer Engine's quantization recipes by module, as Megatron-Bridge's te_quant.cfg for Nemotron 3 Super):
  ``qkv``, ``attn_out``, ``mlp`` (a dense MLP's two), ``shared`` (a shared expert's two), ``experts``, ``latent``
  (a latent MoE's projections), ``mamba_in``, ``mamba_out``, ``mtp`` (every GEMM of the multi-token-prediction
  depths).
- ``mxfp8_gemms`` (""): with fp4, the GEMM groups (as ``bf16_gemms`` names them) that run in MXFP8 instead, with its
  quantization kernels (te_quant.cfg's Mamba output projection).
- ``cuda_graph_scope`` (""): what CUDA graphs capture, Megatron-Core's names separated by commas (``attn``,
  ``mlp``, ``moe_router``, ``moe_preprocess``, ``full``, ``full_iteration``): a captured block costs the host one
  graph launch instead of its calls. Only with the host model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from workload.errors import InputError
from workload.llm.host import HostModel, graph_scopes
from workload.llm.ranks import RankMap, expert_domains

if TYPE_CHECKING:
    from workload.llm.model import ModelConfig
    from workload.llm.plan import ParallelPlan

PRECISIONS = ("bf16", "fp16", "fp8", "fp4")
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8")
MXFP8_RECIPE = "mxfp8"
FP4_RECIPE = "nvfp4"
ATTENTION_BACKENDS = ("flash", "unfused")
CROSS_ENTROPY = ("fused", "unfused")
MOE_DISPATCHERS = ("alltoall", "flex")
MOE_FLEX_BACKENDS = ("deepep", "hybridep")
DEFAULT_MOE_FLEX_BACKEND = "deepep"  # Megatron-Core's
FSDP_GRAD_SYNC = ("every", "last")
MEGATRON_BUCKET = "megatron"
MEGATRON_MIN_BUCKET_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
RING_EXCHANGE = "ring"  # TE's AG+GEMM overlap: tp chunks
# bf16_gemms groups -> the GEMMs (workload/llm/sizes.py names) each keeps in 16-bit ("mtp": the depths' layers too)
BF16_GEMM_GROUPS = {"qkv": ("qkv",), "attn_out": ("attn_out",), "mlp": ("mlp_in", "mlp_out"),
                    "shared": ("shared_in", "shared_out"), "experts": ("expert_in", "expert_out"),
                    "latent": ("latent_down", "latent_up"), "mamba_in": ("mamba_in",), "mamba_out": ("mamba_out",),
                    "mtp": ("mtp_proj",)}
PIPELINE_RS_SPLITS = 4  # TE's default num_splits of the pipelined GEMM+RS overlap


def _gemm_names(groups: str) -> frozenset[str]:
    """The GEMMs (by name) of comma-separated BF16_GEMM_GROUPS."""
    names = [g.strip() for g in groups.split(",") if g.strip()]
    return frozenset(name for g in names for name in BF16_GEMM_GROUPS.get(g, ()))


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingOptions:
    """Framework settings of one training step (see the module docstring for each)."""

    precision: str | None = None
    fp8_recipe: str = "delayed"
    grad_reduce_in_fp32: bool = False
    fp8_param_gather: bool = False
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool = False
    bucket_size: int | str | None = None
    tp_comm_overlap: bool = False
    reshard_after_forward: bool = True
    fsdp_grad_sync: str = "every"
    attention_backend: str = "flash"
    cross_entropy: str = "fused"
    iteration_tail: bool = False
    dataloader_wait_us: int = 0
    moe_host_sync: bool = False
    moe_dispatcher: str = "alltoall"
    moe_flex_backend: str = DEFAULT_MOE_FLEX_BACKEND
    moe_hybridep_fused_permute: bool = False
    nvlink_domain: int | None = None
    moe_a2a_overlap: bool = False
    moe_fused_mlp: bool = False
    fp8_attention: bool = False
    host_cpu: str | None = None
    cuda_graph_scope: str = ""
    bf16_layers_at_start: int = 0
    bf16_layers_at_end: int = 0
    bf16_gemms: str = ""
    mxfp8_gemms: str = ""
    activation_offload_layers: int = 0

    def fp8(self) -> bool:
        return self.precision == "fp8"

    def gemm_dtype(self) -> str:
        """The layers' GEMM math as the kernel model names it ("fp8", "fp4"; "" = the model's dtype)."""
        return self.precision if self.precision in ("fp8", "fp4") else ""

    def bf16_gemm_names(self) -> frozenset[str]:
        """The GEMMs (by name) ``bf16_gemms`` keeps in 16-bit; none in 16-bit math."""
        return _gemm_names(self.bf16_gemms) if self.gemm_dtype() else frozenset()

    def mxfp8_gemm_names(self) -> frozenset[str]:
        """The GEMMs (by name) ``mxfp8_gemms`` runs in MXFP8; none unless the step is NVFP4."""
        return _gemm_names(self.mxfp8_gemms) if self.precision == "fp4" else frozenset()

    def layer_in_16bit(self, model: ModelConfig, layer: int) -> bool:
        """Whether layer ``layer`` (0-based; from num_layers on, a multi-token-prediction depth's) runs all its
        GEMMs in 16-bit under fp8 or fp4: one of the first or last layers kept so, or an MTP depth with bf16_gemms
        mtp."""
        if not self.gemm_dtype():
            return False
        if layer >= model.num_layers:
            return "mtp_proj" in self.bf16_gemm_names()
        return layer < self.bf16_layers_at_start or layer >= model.num_layers - self.bf16_layers_at_end

    def in_16bit(self) -> TrainingOptions:
        """These options for the layers kept in 16-bit (layer_in_16bit): no FP8/FP4 GEMMs, no FP8 attention."""
        return replace(self, precision=None, fp8_attention=False)

    def recipe(self) -> str | None:
        """The quantization recipe of the layers' GEMMs (workload/llm/quantize.py), None in 16-bit math."""
        return FP4_RECIPE if self.precision == "fp4" else self.fp8_recipe if self.fp8() else None

    def host(self) -> HostModel | None:
        """The host issuing the kernels (None: an ideal host, not in the trace)."""
        if self.host_cpu is None and not self.moe_host_sync:
            return None
        model = HostModel(cpu=self.host_cpu or "x86", graph_scopes=graph_scopes(self.cuda_graph_scope),
                          low_precision=bool(self.gemm_dtype()))
        return model if model.active else None

    def rank_map(self, plan: ParallelPlan, model: ModelConfig | None) -> RankMap:
        """The ranks and communicator groups of ``plan`` under these options (``model`` None: no groups)."""
        return RankMap(plan, model, tail=self.iteration_tail,
                       nvlink_domain=self.nvlink_domain if self.moe_dispatcher == "flex" else None)

    def expert_domains(self, plan: ParallelPlan) -> tuple[int, int] | None:
        """(NVLink domains, ranks in each) of every expert-parallel group the flex dispatcher exchanges over in two
        stages (groups epd, epx); None: one all-to-all over the group."""
        return expert_domains(plan, self.nvlink_domain) if self.moe_dispatcher == "flex" else None

    def hybridep(self) -> bool:
        """The exchange is HybridEP's (the flex dispatcher with that backend)."""
        return self.moe_dispatcher == "flex" and self.moe_flex_backend == "hybridep"

    def grad_bytes(self, dtype_bytes: int) -> int:
        return 4 if self.grad_reduce_in_fp32 else dtype_bytes

    def bucket_params(self, dp: int, cp: int) -> int | None:
        """Parameters per gradient bucket, or None for one bucket per layer."""
        if self.bucket_size == MEGATRON_BUCKET:
            return max(MEGATRON_MIN_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * dp * cp)
        return self.bucket_size if isinstance(self.bucket_size, int) else None

    def validate(self, zero_stage: int, sequence_parallel: bool, tp: int, pp: int = 1) -> None:
        """Raise InputError (one line) for settings that contradict each other or the plan."""
        if isinstance(self.activation_offload_layers, bool) or not isinstance(self.activation_offload_layers, int) \
                or self.activation_offload_layers < 0:
            raise InputError(f"activation_offload_layers must be a whole number >= 0 (got "
                             f"{self.activation_offload_layers!r})")
        if self.activation_offload_layers and pp > 1:
            raise InputError("activation offloading (--activation-offload-layers) needs --pp 1, as Megatron-Core's "
                             "CPU offloading does")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {', '.join(PRECISIONS)} (got {self.precision!r})")
        if self.fp8_recipe not in FP8_RECIPES:
            raise InputError(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)} (got {self.fp8_recipe!r})")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise InputError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)} "
                             f"(got {self.attention_backend!r})")
        if self.cross_entropy not in CROSS_ENTROPY:
            raise InputError(f"cross_entropy must be one of {', '.join(CROSS_ENTROPY)} (got {self.cross_entropy!r})")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise InputError(f"moe_dispatcher must be one of {', '.join(MOE_DISPATCHERS)} "
                             f"(got {self.moe_dispatcher!r})")
        if self.moe_flex_backend not in MOE_FLEX_BACKENDS:
            raise InputError(f"moe_flex_backend must be one of {', '.join(MOE_FLEX_BACKENDS)} "
                             f"(got {self.moe_flex_backend!r})")
        if self.nvlink_domain is not None and (isinstance(self.nvlink_domain, bool)
                                               or not isinstance(self.nvlink_domain, int) or self.nvlink_domain < 1):
            raise InputError(f"the NVLink domain must be a whole number of GPUs >= 1 (got {self.nvlink_domain!r})")
        if self.fsdp_grad_sync not in FSDP_GRAD_SYNC:
            raise InputError(f"fsdp_grad_sync must be one of {', '.join(FSDP_GRAD_SYNC)} "
                             f"(got {self.fsdp_grad_sync!r})")
        size = self.bucket_size
        if size is not None and size != MEGATRON_BUCKET and (isinstance(size, bool) or not isinstance(size, int)
                                                             or size < 1):
            raise InputError(f"the gradient bucket size must be a number of parameters >= 1 or '{MEGATRON_BUCKET}' "
                             f"(got {size!r})")
        if isinstance(self.dataloader_wait_us, bool) or not isinstance(self.dataloader_wait_us, int) \
                or self.dataloader_wait_us < 0:
            raise InputError(f"the data-loader wait must be a whole number of microseconds >= 0 "
                             f"(got {self.dataloader_wait_us!r})")
        if self.fp8_attention and (self.precision != "fp8" or self.attention_backend != "flash"):
            raise InputError(f"fp8_attention needs precision fp8 and the fused attention kernel (got precision "
                             f"{self.precision or 'the model dtype'}, attention {self.attention_backend})")
        if self.overlap_param_gather and zero_stage not in (1, 2):
            raise InputError("overlap_param_gather needs the distributed optimizer (ZeRO stage 1 or 2), whose "
                             f"parameter all-gathers it overlaps (got ZeRO {zero_stage})")
        if self.overlap_param_gather and self.overlap_grad_reduce is False:
            raise InputError("overlap_param_gather needs overlap_grad_reduce (Megatron-LM refuses it without)")
        if self.fp8_param_gather and (self.precision != "fp8" or zero_stage not in (1, 2, 3)):
            raise InputError("fp8_param_gather needs precision fp8 and a sharded optimizer (ZeRO stage 1, 2 or 3)")
        if self.cuda_graph_scope and self.host_cpu is None and not self.moe_host_sync:
            raise InputError("cuda_graph_scope needs the host model (host_cpu or moe_host_sync): CUDA graphs save "
                             "host time only")
        whole = sorted(graph_scopes(self.cuda_graph_scope) & {"full", "full_iteration"})
        if self.moe_host_sync and whole:
            raise InputError(f"the dropless dispatcher's host sync (moe_host_sync) cannot run in a whole-layer or "
                             f"whole-iteration CUDA graph (cuda_graph_scope {whole[0]}): its token counts change "
                             f"every step")
        self.host()  # checks the CPU and the scopes
        for name in ("bf16_gemms", "mxfp8_gemms"):
            unknown = sorted({g.strip() for g in getattr(self, name).split(",") if g.strip()} - set(BF16_GEMM_GROUPS))
            if unknown:
                raise InputError(f"unknown {name} group(s) {', '.join(unknown)}; valid: {', '.join(BF16_GEMM_GROUPS)}")
        if self.mxfp8_gemms and self.precision != "fp4":
            raise InputError(f"mxfp8_gemms runs GEMMs of an NVFP4 step in MXFP8: it needs precision fp4 (got "
                             f"{self.precision or 'the model dtype'})")
        for name in ("bf16_layers_at_start", "bf16_layers_at_end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"{name} must be a whole number of layers >= 0 (got {value!r})")
        if self.tp_comm_overlap and tp > 1 and not sequence_parallel:
            raise InputError("tp_comm_overlap needs sequence parallelism (Megatron-Core overlaps the all-gathers "
                             "and reduce-scatters it brings)")
