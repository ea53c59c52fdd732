"""``astrasim-py trace generate llm``: per-rank traces of one training iteration of a transformer."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from workload.errors import InputError, TraceError, printable
from workload.files import contained_path, read_yaml
from workload.limits import add_output_limits, check_output, output_limits
from workload.llm.host import GRAPH_SCOPES, HOST_CPUS
from workload.llm.model import NORMS, POSITION_EMBEDDINGS, ModelConfig, model_from_dict
from workload.llm.options import (
    ATTENTION_BACKENDS,
    BF16_GEMM_GROUPS,
    CROSS_ENTROPY,
    DEFAULT_MOE_FLEX_BACKEND,
    FP8_RECIPES,
    FSDP_GRAD_SYNC,
    MEGATRON_BUCKET,
    MOE_DISPATCHERS,
    MOE_FLEX_BACKENDS,
    PRECISIONS,
    TrainingOptions,
)
from workload.llm.plan import DIMENSIONS, RECOMPUTE, ParallelPlan, batch_split, parse_pipeline_layout
from workload.llm.presets import PRESETS, preset
from workload.traceset import check_rank_count, print_progress

# flag -> ModelConfig field (every field can be given or overridden on the command line)
MODEL_INT_FLAGS = {"--layers": "num_layers", "--hidden": "hidden_size", "--heads": "num_heads",
                   "--kv-heads": "num_kv_heads", "--head-dim": "head_dim", "--ffn-hidden": "ffn_hidden_size",
                   "--vocab": "vocab_size", "--seq-len": "seq_len", "--experts": "num_experts", "--top-k": "top_k",
                   "--dtype-bytes": "dtype_bytes", "--window-size": "window_size",
                   "--window-attn-skip-freq": "window_attn_skip_freq", "--moe-router-num-groups": "router_groups",
                   "--moe-router-group-topk": "router_group_topk",
                   "--moe-shared-expert-intermediate-size": "shared_expert_ffn", "--q-lora-rank": "q_lora_rank",
                   "--kv-lora-rank": "kv_lora_rank", "--qk-pos-emb-head-dim": "qk_rope_head_dim",
                   "--v-head-dim": "v_head_dim", "--dense-layers": "dense_layers",
                   "--dense-ffn-hidden": "dense_ffn_hidden_size", "--mtp-num-layers": "mtp_layers",
                   "--mamba-num-heads": "mamba_heads", "--mamba-head-dim": "mamba_head_dim",
                   "--mamba-state-dim": "mamba_state_dim", "--mamba-num-groups": "mamba_groups",
                   "--moe-latent-size": "moe_latent_size"}
MODEL_BOOL_FLAGS = {"--gated-ffn": "gated_ffn", "--tied-embeddings": "tied_embeddings", "--bias": "bias",
                    "--rope-fused": "rope_fused", "--clamped-glu": "clamped_glu",
                    "--qk-norm": "qk_norm", "--mtp-use-repeated-layer": "mtp_repeated_layer"}
MODEL_CHOICE_FLAGS = {"--norm": ("norm", NORMS), "--position-embedding": ("position_embedding", POSITION_EMBEDDINGS)}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Per-rank Chakra traces of one training iteration of a decoder-only transformer (dense or "
                          "mixture-of-experts) under data, tensor, pipeline (1F1B or interleaved), context and "
                          "expert parallelism and ZeRO/FSDP, as Megatron-LM runs it. Writes OUT/<name>.<rank>.et and "
                          "prints the prefix.")
    m = parser.add_argument_group("model (a preset, a YAML file of ModelConfig fields, flags, or a mix: flags win)")
    m.add_argument("--preset", help=f"one of {', '.join(PRESETS)}")
    m.add_argument("--model-file", metavar="YAML", help="model fields (e.g. num_layers: 4, hidden_size: 256, ...); "
                                                        "may name a 'preset' to start from")
    m.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    m.add_argument("--name", dest="model_name", help="trace file name stem (default: the model's name)")
    for flag, fieldname in MODEL_INT_FLAGS.items():
        m.add_argument(flag, type=int, dest=fieldname, metavar="N")
    for flag, fieldname in MODEL_BOOL_FLAGS.items():
        m.add_argument(flag, dest=fieldname, action=argparse.BooleanOptionalAction, default=None)
    for flag, (fieldname, choices) in MODEL_CHOICE_FLAGS.items():
        m.add_argument(flag, dest=fieldname, choices=choices)
    m.add_argument("--hybrid-layer-pattern", "--layer-pattern", dest="layer_pattern", metavar="PATTERN",
                   help="a hybrid model's layers, one symbol each (Megatron-Core's hybrid_layer_pattern): M Mamba-2, "
                        "* attention, - MLP, E mixture-of-experts (Nemotron 3 Nano: 'MEMEM*EME...'); with "
                        "--mamba-num-heads and, unless the defaults 64, 128, 8 apply, --mamba-head-dim, "
                        "--mamba-state-dim, --mamba-num-groups")
    p = parser.add_argument_group("parallelism plan (Megatron-LM's names in brackets)")
    p.add_argument("--dp", type=int, help="data-parallel ranks (default: --npus / (tp x pp x cp), else 1)")
    p.add_argument("--tp", "--tensor-model-parallel-size", dest="tp", type=int, default=1,
                   help="tensor-parallel ranks (Megatron-LM style)")
    p.add_argument("--pp", "--pipeline-model-parallel-size", dest="pp", type=int, default=1,
                   help="pipeline stages (1F1B schedule)")
    p.add_argument("--cp", "--context-parallel-size", dest="cp", type=int, default=1,
                   help="context-parallel ranks: each sequence split over them, attention across them")
    p.add_argument("--cp-comm-type", choices=("p2p", "all_gather", "allgather", "a2a"), default="p2p",
                   help="context-parallel attention: p2p ring (default), all_gather of K/V, or a2a (Ulysses)")
    p.add_argument("--vp", "--virtual-pipeline", "--num-virtual-stages-per-pipeline-rank", dest="vp", type=int,
                   default=1, help="model chunks per pipeline stage: the interleaved 1F1B schedule when > 1")
    p.add_argument("--microbatch-group-size", "--microbatch-group-size-per-vp-stage", dest="microbatch_group_size",
                   type=int, help="micro-batches per group of the interleaved schedule (default pp)")
    p.add_argument("--decoder-first-pipeline-num-layers", type=int, metavar="N",
                   help="layers on the first pipeline stage (the others split the rest evenly)")
    p.add_argument("--decoder-last-pipeline-num-layers", type=int, metavar="N",
                   help="layers on the last pipeline stage")
    p.add_argument("--pipeline-model-parallel-layout", "--pipeline-layout", dest="pipeline_layout", metavar="LAYOUT",
                   help="layers of every virtual stage in model order, Megatron-Core's syntax: E (embedding), t "
                        "(layer), m (multi-token prediction), L (loss), '|' between stages, x*N and (...)*N repeat "
                        "(DeepSeek-V3 on pp 2 x vp 8: 'Et*4|(t*4|)*14tmL')")
    p.add_argument("--account-for-embedding-in-pipeline-split", dest="account_for_embedding", action="store_true",
                   help="the embedding counts as a layer in the pipeline split (Megatron-Core; with "
                        "--account-for-loss-in-pipeline-split, how Megatron-Bridge splits 126 layers on 8 x 8 stages)")
    p.add_argument("--account-for-loss-in-pipeline-split", dest="account_for_loss", action="store_true",
                   help="the output layer and loss count as a layer in the pipeline split")
    p.add_argument("--ep", "--expert-model-parallel-size", dest="ep", type=int, default=1,
                   help="expert-parallel ranks (experts sharded over data-parallel ranks)")
    p.add_argument("--etp", "--expert-tensor-parallel-size", dest="etp", type=int,
                   help="ranks each expert is split over (default tp)")
    p.add_argument("--npus", type=int, help="world size; must equal dp x tp x pp x cp")
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage (3 = FSDP)")
    p.add_argument("--use-distributed-optimizer", action="store_true",
                   help="Megatron's distributed optimizer: ZeRO stage 1 (gradients reduce-scattered, optimizer "
                        "state and update sharded, parameters all-gathered)")
    p.add_argument("--global-batch", type=int, help="sequences per iteration (= dp x micro-batch size x "
                                                    "micro-batches)")
    p.add_argument("--micro-batch-size", type=int, help="sequences per micro-batch (default 1)")
    p.add_argument("--micro-batches", type=int, help="micro-batches per iteration per data-parallel rank")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="tensor-parallel all-gather/reduce-scatter pairs instead of all-reduces")
    p.add_argument("--recompute", "--recompute-granularity", dest="recompute", choices=RECOMPUTE, default="none",
                   help="activation recompute: selective (the attention core) or full (each layer's forward)")
    p.add_argument("--recompute-modules", metavar="MODULES",
                   help="with --recompute selective, what runs again in the backward, Megatron-Core's names separated "
                        "by commas: core_attn (the default), layernorm, moe_act, mla_up_proj, mlp, moe (the whole "
                        "mixture-of-experts block)")
    p.add_argument("--activation-recompute", action="store_true", help="= --recompute full")
    p.add_argument("--layout", default=",".join(DIMENSIONS),
                   help="rank layout, innermost dimension first (default tp,dp,pp; cp goes after tp unless named)")
    t = parser.add_argument_group("training step (workload/llm/options.py has the details)")
    t.add_argument("--precision", choices=PRECISIONS,
                   help="GEMM math: fp8 (fp4) runs the layers' GEMMs in FP8 (NVFP4) with Transformer Engine's "
                        "quantization kernels; default: the model's dtype")
    t.add_argument("--fp8-recipe", choices=FP8_RECIPES, default="delayed",
                   help="FP8 scaling: delayed (TE's default), tensorwise (current scaling, fp8_cs) or mxfp8 "
                        "(Blackwell block scaling); default delayed")
    t.add_argument("--grad-reduce-in-fp32", "--accumulate-allreduce-grads-in-fp32", dest="grad_reduce_in_fp32",
                   action="store_true", help="data-parallel gradient collectives in fp32 (Megatron-LM with bf16)")
    t.add_argument("--fp8-param-gather", action="store_true",
                   help="the sharded optimizer's parameter all-gathers carry FP8 GEMM weights")
    t.add_argument("--overlap-grad-reduce", action=argparse.BooleanOptionalAction, default=None,
                   help="reduce gradients in buckets during the last micro-batch's backward (or, with --no-, after "
                        "the whole backward); default: by ZeRO stage")
    t.add_argument("--overlap-param-gather", action="store_true",
                   help="distributed optimizer: parameter all-gathers overlap the next forward")
    t.add_argument("--ddp-bucket-size", type=bucket_size, metavar="PARAMS|megatron",
                   help="gradient bucket size in parameters, or 'megatron' for max(40M, 1M x dp x cp); default: "
                        "one bucket per layer")
    t.add_argument("--tp-comm-overlap", action="store_true",
                   help="Megatron-Core's TP communication overlap (ring-exchange and pipelined GEMM chunks)")
    t.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                   help="FSDP: all-gather the parameters again for the backward (--no-: keep them, Llama 3)")
    t.add_argument("--fsdp-grad-sync", choices=FSDP_GRAD_SYNC, default="every",
                   help="FSDP: reduce-scatter gradients every micro-batch, or only in the last")
    t.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="flash",
                   help="attention core: one fused FlashAttention-style kernel (default), or unfused: the score "
                        "matrix materialised between two batched GEMMs, as Megatron-LM ran before FlashAttention")
    t.add_argument("--cross-entropy", choices=CROSS_ENTROPY, default="fused",
                   help="the loss as one fused kernel (default; --cross-entropy-loss-fusion, NeMo's setting) or "
                        "unfused: Megatron-LM's default, several fp32 passes over the logits")
    t.add_argument("--iteration-tail", action="store_true",
                   help="add batch loading, gradient-norm clipping and loss logging nodes")
    t.add_argument("--dataloader-wait-us", type=int, default=0, metavar="US",
                   help="host wait before each batch is loaded (with --iteration-tail)")
    t.add_argument("--moe-host-sync", action="store_true",
                   help="MoE layers as Megatron-Core's dropless dispatcher runs them: the token counts copied to the "
                        "host, which waits for them before the all-to-all, so the expert section runs no faster "
                        "than the host issues it (implies --host-cpu x86 unless given)")
    t.add_argument("--moe-dispatcher", choices=MOE_DISPATCHERS, default="alltoall",
                   help="the expert-parallel exchange: alltoall (Megatron-Core's alltoall dispatcher: a token once per "
                        "chosen expert) or flex (DeepEP/HybridEP: once per destination rank, combined on the expert "
                        "side)")
    t.add_argument("--moe-flex-backend", choices=MOE_FLEX_BACKENDS,
                   help="the flex dispatcher's library (with --moe-dispatcher flex): deepep (Megatron-Core's "
                        "default) or hybridep (its routing map all-gathered first); both permute the received "
                        "tokens by expert after the dispatch")
    t.add_argument("--moe-hybridep-fused-permute", action="store_true",
                   help="HybridEP's permutation fused into its dispatch and combine kernels (Megatron-Core's "
                        "--moe-permute-fusion-into-hybridep); default: its separate permute and unpermute kernels")
    t.add_argument("--nvlink-domain", type=int, metavar="GPUS",
                   help="GPUs per NVLink domain (8: HGX/DGX node, 72: NVL72 rack): with --moe-dispatcher flex, an "
                        "expert-parallel group spanning domains sends a token once per other domain and forwards it "
                        "over NVLink (default: one domain)")
    t.add_argument("--moe-a2a-overlap", action="store_true",
                   help="Megatron-Core's EP A2A overlap (--overlap-moe-expert-parallel-comm): each steady-state "
                        "forward runs layer by layer with the next backward, one's all-to-alls beside the other's "
                        "compute (needs --ep > 1, and --vp > 1 with --pp > 1)")
    t.add_argument("--moe-fused-mlp", action="store_true",
                   help="the experts' MLP as Transformer Engine's fused grouped MLP (Megatron-Core's "
                        "--use-transformer-engine-op-fuser): each grouped GEMM one kernel for all local experts, "
                        "the activation (GPT-OSS's clamp, the scaled expert biases) and the casts between the "
                        "GEMMs inside them")
    t.add_argument("--activation-offload-layers", type=int, default=0, metavar="N",
                   help="Megatron-Core's --cpu-offloading-num-layers (activations): the first N layers' saved "
                        "activations wait in host memory between forward and backward; the memory estimate counts "
                        "it, the copies are taken as hidden under compute (needs --pp 1)")
    t.add_argument("--fp8-attention", action="store_true",
                   help="the attention core in FP8 (Megatron-Core's --fp8-dot-product-attention; needs --precision "
                        "fp8)")
    t.add_argument("--num-layers-at-start-in-bf16", dest="bf16_layers_at_start", type=int, default=0, metavar="N",
                   help="with fp8/fp4: the first N decoder layers' GEMMs stay 16-bit (Megatron-Core's "
                        "--first-last-layers-bf16, which defaults to 1 and 1)")
    t.add_argument("--num-layers-at-end-in-bf16", dest="bf16_layers_at_end", type=int, default=0, metavar="N",
                   help="with fp8/fp4: the last N decoder layers' GEMMs stay 16-bit")
    t.add_argument("--bf16-gemms", default="", metavar="GROUPS",
                   help="with fp8/fp4: GEMMs that stay 16-bit in every layer (Transformer Engine's quantization "
                        f"recipes by module): {', '.join(BF16_GEMM_GROUPS)}")
    t.add_argument("--mxfp8-gemms", default="", metavar="GROUPS",
                   help="with --precision fp4: GEMMs (the groups --bf16-gemms names) that run in MXFP8 instead")
    t.add_argument("--host-cpu", choices=HOST_CPUS,
                   help="model the host issuing the kernels on this CPU (grace: GB200/GB300 nodes): each block of "
                        "a layer ends no earlier than the framework's calls issuing it (workload/llm/host.py)")
    t.add_argument("--cuda-graph-scope", default="", metavar="SCOPES",
                   help=f"what CUDA graphs capture (comma-separated: {', '.join(GRAPH_SCOPES)}): a captured block "
                        "costs the host one graph launch")
    o = parser.add_argument_group("output")
    o.add_argument("--output", "-o", help="output folder (omit with --summary to only print the summary)")
    o.add_argument("--device", help="fill compute durations from a roofline estimate on this device preset "
                                    "(A100, H100, ...); default: durations 0, simulate with --device")
    o.add_argument("--groups-file", action="store_true",
                   help="write the communicator groups to OUT/<name>.comm_groups.json (ASTRA-sim's "
                        "--comm-group-configuration) instead of a METADATA node in every trace: ASTRA-sim 2.x stops "
                        "at METADATA nodes; simulate here with --comm-groups OUT/<name>.comm_groups.json")
    o.add_argument("--summary", action="store_true",
                   help="print parameters, FLOPs, bytes per communicator group kind and node counts; with --device "
                        "or --hw-profile, also the predicted step time, TFLOP/s per GPU, MFU and where the time goes "
                        "(one simulated iteration)")
    o.add_argument("--hw-profile", metavar="NAME|FILE.yml",
                   help="with --summary: the hardware profile of the predicted step (default: the device's reference "
                        "system, e.g. hgx-h100 for H100); without --device, the device is the profile's GPU")
    o.add_argument("--quiet", action="store_true", help="no progress lines while the traces are written")
    add_output_limits(o)


def _model(args: argparse.Namespace) -> ModelConfig:
    values: dict[str, Any] = {}
    where = "command line"
    if args.model_file:
        where = args.model_file
        data = read_yaml(args.model_file, "model")
        if not isinstance(data, dict):
            raise InputError(f"{args.model_file}: expected a mapping of model fields (num_layers: ..., "
                             "hidden_size: ...)")
        values.update(data)
    start = values.pop("preset", None)
    start = args.preset or start
    if start is not None:
        base = preset(str(start))
        values = {**{f.name: getattr(base, f.name) for f in fields(base)}, **values}
    names = [*MODEL_INT_FLAGS.values(), *MODEL_BOOL_FLAGS.values(), *(f for f, _ in MODEL_CHOICE_FLAGS.values()),
             "layer_pattern"]
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if start is None and not args.model_file and not given:
        raise InputError(f"give a model: --preset (one of {', '.join(PRESETS)}), --model-file, or --layers, "
                         "--hidden, --heads, --ffn-hidden, --vocab and --seq-len")
    return model_from_dict({**values, **given}, where)


def bucket_size(text: str) -> int | str:
    """--ddp-bucket-size: a parameter count or 'megatron'."""
    if text.strip().lower() == MEGATRON_BUCKET:
        return MEGATRON_BUCKET
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of parameters or '{MEGATRON_BUCKET}', not {text!r}") \
            from None


def plan_from_args(args: argparse.Namespace) -> ParallelPlan:
    """The plan the flags describe (not yet validated against a model)."""
    for name in ("tp", "pp", "cp", "vp", "ep", "etp", "dp", "npus"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name} must be >= 1 (got {value})")
    model_ranks = args.tp * args.pp * args.cp
    cp_text = f" x cp={args.cp}" if args.cp > 1 else ""
    dp = args.dp
    if dp is None:
        dp = 1
        if args.npus is not None:
            if args.npus % model_ranks:
                raise InputError(f"--npus {args.npus} is not divisible by tp={args.tp} x pp={args.pp}{cp_text}")
            dp = args.npus // model_ranks
    if args.npus is not None and dp * model_ranks != args.npus:
        raise InputError(f"world size mismatch: dp={dp} x tp={args.tp} x pp={args.pp}{cp_text} = "
                         f"{dp * model_ranks}, not --npus {args.npus}")
    size, count = batch_split(dp, args.global_batch, args.micro_batch_size, args.micro_batches)
    layout = tuple(d.strip() for d in args.layout.split(","))
    zero = args.zero
    if args.use_distributed_optimizer:
        if zero not in (0, 1):
            raise InputError(f"--use-distributed-optimizer is ZeRO stage 1, not --zero {zero}")
        zero = 1
    return ParallelPlan(dp=dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, etp=args.etp, vp=args.vp,
                        zero_stage=zero, micro_batch_size=size, num_micro_batches=count,
                        sequence_parallel=args.sequence_parallel, activation_recompute=args.activation_recompute,
                        recompute=args.recompute,
                        recompute_modules=tuple((args.recompute_modules or "").replace(",", " ").split()),
                        cp_comm_type="all_gather" if args.cp_comm_type == "allgather"
                        else args.cp_comm_type, first_stage_layers=args.decoder_first_pipeline_num_layers,
                        last_stage_layers=args.decoder_last_pipeline_num_layers,
                        account_for_embedding=args.account_for_embedding, account_for_loss=args.account_for_loss,
                        microbatch_group_size=args.microbatch_group_size, layout=layout,
                        **_layout_fields(args.pipeline_layout))


def _layout_fields(text: str | None) -> dict[str, Any]:
    """The plan's pipeline_layout and pipeline_layout_mtp from a --pipeline-model-parallel-layout string."""
    if not text:
        return {}
    layers, mtp = parse_pipeline_layout(text)
    return {"pipeline_layout": layers, "pipeline_layout_mtp": mtp}


def options_from_args(args: argparse.Namespace, plan: ParallelPlan) -> TrainingOptions:
    """The training-step settings the flags describe, checked against ``plan``."""
    options = TrainingOptions(precision=args.precision, fp8_recipe=args.fp8_recipe,
                              grad_reduce_in_fp32=args.grad_reduce_in_fp32,
                              fp8_param_gather=args.fp8_param_gather, overlap_grad_reduce=args.overlap_grad_reduce,
                              overlap_param_gather=args.overlap_param_gather, bucket_size=args.ddp_bucket_size,
                              tp_comm_overlap=args.tp_comm_overlap, reshard_after_forward=args.reshard_after_forward,
                              fsdp_grad_sync=args.fsdp_grad_sync, attention_backend=args.attention_backend,
                              cross_entropy=args.cross_entropy,
                              iteration_tail=args.iteration_tail,
                              dataloader_wait_us=args.dataloader_wait_us, moe_host_sync=args.moe_host_sync,
                              moe_dispatcher=args.moe_dispatcher,
                              moe_flex_backend=args.moe_flex_backend or DEFAULT_MOE_FLEX_BACKEND,
                              moe_hybridep_fused_permute=args.moe_hybridep_fused_permute,
                              nvlink_domain=args.nvlink_domain,
                              moe_a2a_overlap=args.moe_a2a_overlap, moe_fused_mlp=args.moe_fused_mlp,
                              fp8_attention=args.fp8_attention,
                              host_cpu=args.host_cpu,
                              cuda_graph_scope=args.cuda_graph_scope,
                              bf16_layers_at_start=args.bf16_layers_at_start,
                              bf16_layers_at_end=args.bf16_layers_at_end, bf16_gemms=args.bf16_gemms,
                              mxfp8_gemms=args.mxfp8_gemms,
                              activation_offload_layers=args.activation_offload_layers)
    options.validate(plan.zero_stage, plan.sequence_parallel, plan.tp, plan.pp)
    return options


def plan_text(plan: ParallelPlan) -> str:
    """The plan in one line, for the traces' METADATA."""
    extra = "".join(f" {name}={value}" for name, value in (("cp", plan.cp), ("vp", plan.vp)) if value > 1)
    return f"dp={plan.dp} tp={plan.tp} pp={plan.pp} ep={plan.ep} zero={plan.zero_stage}{extra}"


def list_presets() -> str:
    width = max(len(m.name) for m in PRESETS.values())
    rows = [f"{'name':{width}s} layers  hidden  heads/kv  ffn     gated  vocab   seq    experts     params"]
    for m in PRESETS.values():
        experts = f"{m.num_experts} top-{m.top_k}" if m.is_moe else "-"
        rows.append(f"{m.name:{width}s} {m.num_layers:6d}  {m.hidden_size:6d}  {m.num_heads:3d}/{m.kv_heads:<4d} "
                    f"{m.ffn_hidden_size:6d}  {'yes' if m.gated_ffn else 'no':5s}  {m.vocab_size:6d}  "
                    f"{m.seq_len:5d}  {experts:11s} {m.total_params() / 1e9:.2f}B")
    return "\n".join(rows)


def main(args: argparse.Namespace, warn: Callable[[str], None]) -> None:
    from compute.devices import device as device_preset
    from compute.roofline import Roofline
    from workload.llm.build import build_programs
    from workload.llm.emit import TraceEmitter
    from workload.llm.summary import format_summary, summarize

    if args.list_presets:
        print(list_presets())
        return
    if not args.output and not args.summary:
        raise InputError("give --output FOLDER (or --summary to only print the summary)")
    limits = output_limits(args)
    model = _model(args)
    plan = plan_from_args(args)
    plan.validate(model)
    options = options_from_args(args, plan)
    prefix = contained_path(args.output, args.model_name or model.name, "--name") if args.output else None
    what = f"trace generate llm ({model.name}, dp={plan.dp} tp={plan.tp} pp={plan.pp})"
    if prefix:
        check_output(what, plan.world_size, None, limits)  # the file count first: it costs nothing
        check_output(what, plan.world_size, estimated_bytes(model, plan, options), limits)
    else:
        check_rank_count(plan.world_size, 0, what)
    if options.moe_dispatcher == "flex" and options.rank_map(plan, None).ep_splits_unevenly():
        warn(f"the expert-parallel groups do not split evenly over NVLink domains of {options.nvlink_domain} GPUs: "
             "the flex exchange runs as one all-to-all over each group, every destination rank's copy crossing "
             "between domains (a two-stage exchange needs as many of a group's ranks in each of its domains)")
    if args.moe_flex_backend and options.moe_dispatcher != "flex":
        warn(f"--moe-flex-backend {args.moe_flex_backend} has no effect with the {options.moe_dispatcher} dispatcher: "
             "it picks the flex dispatcher's library (add --moe-dispatcher flex)")
    if args.moe_hybridep_fused_permute and not options.hybridep():
        warn("--moe-hybridep-fused-permute has no effect without HybridEP (add --moe-dispatcher flex "
             "--moe-flex-backend hybridep)")
    if plan.zero_stage and plan.dp == 1:
        warn(f"ZeRO stage {plan.zero_stage} with dp=1 shards nothing: no gradient or parameter collectives")
    device = device_preset(args.device) if args.device else None
    low = options.gemm_dtype()
    if device is not None and low and not device.has(low) and not args.summary:  # --summary simulates: it says so
        better = "H100" if low == "fp8" else "B200"
        warn(f"--precision {low} with --device {device.name}, which has no {low.upper()} math: its {low.upper()} "
             f"GEMMs run at the {device.math_dtype(low).upper()} rate, in the durations written here and when "
             f"simulated with --device {device.name}; a GPU with {low.upper()} (e.g. --device {better}) runs them "
             "faster")
    mxfp8 = options.recipe() == "mxfp8" or bool(options.mxfp8_gemm_names())
    if device is not None and mxfp8 and "mxfp8" not in device.block_scaled:
        # Transformer Engine refuses MXFP8 on a GPU without it: no run on one has these durations
        warn(f"MXFP8 GEMMs with --device {device.name}, which has no MXFP8 math (its device file's block_scaled): "
             f"they are timed at its {device.math_dtype('fp8').upper()} rate with MXFP8's quantization, a run its "
             "GPUs cannot make; --fp8-recipe tensorwise or delayed is what they run (or give a GPU with MXFP8, e.g. "
             "--device B200)")
    started = time.perf_counter()
    programs = build_programs(model, plan, options)
    ranks = options.rank_map(plan, model)
    if prefix:
        metadata = {"generator": "astrasim-py trace generate llm", "model": model.name, "plan": plan_text(plan)}
        try:
            TraceEmitter(programs, ranks, device, metadata, groups_file=args.groups_file).write(
                prefix, None if args.quiet else print_progress)
        except TraceError as e:
            raise InputError(f"{what}: node {e.node_id}: {e.problem}: the model is too large for the trace "
                             "format's 64-bit fields") from None
        print(printable(prefix))
        if args.groups_file:
            print(printable(f"{prefix}.comm_groups.json"))
        if device is None:
            warn("the compute nodes carry FLOPs and bytes but no duration: simulate them with --device NAME (e.g. "
                 "--device H100), or they take about 0 time; or generate with --device NAME to record durations")
    elapsed = time.perf_counter() - started
    if args.summary:
        if device is None and args.hw_profile:  # the profile's GPU, as --device would name it
            from simulator.tools.step_summary import profile_device

            inferred = profile_device(args.hw_profile)
            device = device_preset(inferred) if inferred else None
        roofline = Roofline(device.peak_tflops * 1e12, device.memory_bw_GBps * 1e9) if device else None
        summary = summarize(model, plan, programs, ranks, roofline, options)
        text = format_summary(summary)
        if device is not None and device.memory_bytes:
            short = device.memory_shortfall(max(m["total_bytes"] for m in summary["memory_by_stage"]))
            if short:
                warn(f"the layout {short}: a smaller --micro-batch-size, --recompute, more --tp/--pp, "
                     "--zero/--use-distributed-optimizer or --activation-offload-layers would need less")
            else:
                text += f"\n  fits in the {device.name}'s {device.memory_GiB:g} GiB"
        if device is not None:
            text += "\n" + _prediction(args, summary, device.name, warn)
        elif args.hw_profile:
            text += (f"\npredicted step: no compute device model for the GPU of hardware profile {args.hw_profile}: "
                     "give --device NAME")
        else:
            text += "\npredicted step: give --device NAME (and --hw-profile) to simulate one iteration"
        print("\n".join(printable(line) for line in text.split("\n")))  # the model name is the user's
        if args.output:
            print(f"generated {plan.world_size} trace files in {elapsed:.2f} s")


def _prediction(args: argparse.Namespace, summary: dict[str, Any], device_name: str,
                warn: Callable[[str], None]) -> str:
    """The predicted-step lines of the summary on ``device_name`` (simulator/tools/step_summary.py)."""
    from simulator.tools.step_summary import format_prediction, predict
    from workload.generated import llm_keys

    given = {k: getattr(args, k) for k in llm_keys() if k != "device" and getattr(args, k) is not None}
    spec = {"generate": "llm", **given}
    iteration, profile, why = predict(spec, summary["plan"]["world_size"], device_name, args.hw_profile, warn)
    return format_prediction(iteration, summary, device_name, profile, why)


def estimated_bytes(model: ModelConfig, plan: ParallelPlan, options: TrainingOptions | None = None) -> int:
    """The bytes the traces of ``plan`` take, from the traces of one and two micro-batches (a program grows by the
    same ops with every micro-batch; of one and two groups of the interleaved schedule), one rank per stage, without
    building the whole iteration."""
    from workload.llm.build import build_programs
    from workload.llm.emit import TraceEmitter

    options = options or TrainingOptions()
    step = plan.group_size if plan.vp > 1 else 1

    def stage_bytes(groups: int) -> list[int]:
        small = replace(plan, num_micro_batches=groups * step, microbatch_group_size=step if plan.vp > 1 else None)
        ranks = options.rank_map(small, model)
        emitter = TraceEmitter(build_programs(model, small, options), ranks)
        return [len(emitter.rank_bytes(ranks.rank(dp=0, tp=0, pp=s))) for s in range(plan.pp)]

    total = 0
    for b1, b2 in zip(stage_bytes(1), stage_bytes(2), strict=True):
        total += (b1 + (plan.num_micro_batches - step) * max(b2 - b1, 0) // step) * plan.dp * plan.tp * plan.cp
    return total
