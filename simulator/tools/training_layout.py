"""A published training row -> everything one simulated iteration needs: the ``generate: llm`` mapping, the
hardware profile, the compute device and the network; or the reason it cannot be simulated as published.

Nothing is silently replaced. A blank field takes the framework's documented default and is listed in
``defaults_used``; a feature the generator cannot express yet makes the row ``needs`` (named by the generator
option that would express it, simulator/tools/training_features.py); a machine without a shipped profile, a
model without a card, or numbers that do not add up make it ``unsupported`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from compute.devices import device as device_preset
from network.config import NetworkConfig
from simulator.tools.training_features import EXPERT_TP, FEATURES, FRAMEWORKS, Framework, missing_label, resolve
from simulator.tools.training_hardware import choose_hardware, network_for, stated_machine
from simulator.tools.training_metrics import Metric, choose_metric
from simulator.tools.training_models import ROW_DIMS, model_for
from simulator.tools.training_recipes import Recipe, recipe_for, stated_arguments, stated_recipe
from simulator.tools.training_table import TrainingRow, alternative_note, flag, leading_number, number, whole
from workload.errors import ConfigError, InputError
from workload.generated import llm_peak_memory, llm_plan
from workload.llm.plan import parse_pipeline_layout

READY, NEEDS, UNSUPPORTED = "ready", "needs", "unsupported"
ACCOUNTING_SOURCES = ("megatron_bridge_perf", "nemo_2407")  # frameworks with Megatron-Bridge's recipes
# a row whose notes carry this phrase transcribes a figure its source itself reports as a release's regression
KNOWN_REGRESSION = "known performance regression"


@dataclass(slots=True)
class RowPlan:
    row: TrainingRow
    status: str = READY
    reason: str = ""
    spec: dict[str, Any] = field(default_factory=dict)  # the generate: llm mapping
    model: dict[str, Any] = field(default_factory=dict)  # its model fields
    profile: str = ""
    device: str = ""
    network: NetworkConfig | None = None
    n_gpus: int = 0
    layout: str = ""
    defaults_used: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # minor features the generator has no option for
    approximable: bool = False  # --approximate may simulate it without what it needs
    metric: Metric | None = None
    code_states: dict[str, str] = field(default_factory=dict)  # what the release's code states otherwise (recipe)
    code_values: dict[str, str] = field(default_factory=dict)  # of those, what plan_row(code_values=True) ran

    def refuse(self, status: str, reason: str) -> RowPlan:
        if self.status == READY:
            self.status, self.reason = status, reason
        return self


def code_states_differing(row: TrainingRow, recipe: Recipe) -> dict[str, str]:
    """The values the release's code states (``recipe.code_states``) that ``row`` prints otherwise (a VP blank, 1 or
    none alike: no virtual stages)."""
    def plain(column: str, value: str) -> str:
        return "1" if column == "VP" and value.lower() in ("", "1", "none") else value

    return {column: value for column, value in recipe.code_states
            if plain(column, row.text(column)) != plain(column, value)}


# the columns of a row's layout and batch that its release's code values can replace (plan_row's code_values)
CODE_VALUE_COLUMNS = ("TP", "PP", "VP", "CP", "EP", "seq_len", "global_batch", "micro_batch")


def with_code_values(row: TrainingRow) -> tuple[TrainingRow, dict[str, str]]:
    """``row`` with the layout and batch its release's code states where it prints others (the recipe's
    code_states), and the values taken. DP then follows from the GPUs (GPUs / (TP x PP x CP))."""
    recipe = recipe_for(row.source_id, row.text("source_section"), row.text("model"), row.text("gpu"),
                        row.text("precision"))
    taken = {c: v for c, v in code_states_differing(row, recipe).items() if c in CODE_VALUE_COLUMNS} \
        if recipe is not None else {}
    if not taken:
        return row, {}
    # VP "none": 1, not blank, which a recipe's VP would fill
    fields = {**row.fields, **{c: "1" if c == "VP" and v.lower() == "none" else v for c, v in taken.items()}}
    if {"TP", "PP", "CP"} & set(taken):
        fields["DP"] = ""
    return replace(row, fields=fields), taken


def code_states_note(row: TrainingRow, recipe: Recipe, differing: dict[str, str]) -> str:
    """The note on a row whose release's code states other values (``differing``) than the row prints."""
    code = ", ".join(f"{column} {value}" for column, value in differing.items())
    printed = ", ".join(f"{column} {row.text(column) or 'blank'}" for column in differing)
    return (f"{recipe.where} states {code} where the table prints {printed}: the table's values are simulated, "
            "and the published number may be of the code's run")


def _framework(row: TrainingRow, plan: RowPlan) -> Framework:
    found = FRAMEWORKS.get(row.source_id)
    if found is None:
        plan.defaults_used.append(f"framework defaults: Megatron-LM's (source {row.source_id!r} is not one we know)")
        return FRAMEWORKS["megatron_readme_h100"]
    return found


def _parallel(row: TrainingRow, plan: RowPlan) -> dict[str, int] | None:
    dims: dict[str, int] = {}
    for column in ("TP", "PP", "CP", "EP"):
        value = whole(row, column)
        if value is None:
            if row.text(column):
                plan.refuse(UNSUPPORTED, f"{column} {row.text(column)!r} is not a whole number")
                return None
            value = 1  # blank: not used
        note = alternative_note(row, column)
        if note and note not in plan.notes:
            plan.notes.append(note)
        dims[column.lower()] = value
    n = plan.n_gpus
    model_parallel = dims["tp"] * dims["pp"] * dims["cp"]
    dp = whole(row, "DP")
    if dp is None:
        if n % model_parallel:
            plan.refuse(UNSUPPORTED, f"{n} GPUs are not divisible by TP x PP x CP = {model_parallel}")
            return None
        dp = n // model_parallel
        plan.defaults_used.append(f"DP = GPUs / (TP x PP x CP) = {dp}")
    if dp * model_parallel != n:
        plan.refuse(UNSUPPORTED, f"TP x PP x CP x DP = {dp * model_parallel}, not the row's {n} GPUs")
        return None
    dims["dp"] = dp
    vp_text = row.text("VP")
    vp = whole(row, "VP")
    if vp is None and vp_text:
        if dims["pp"] > 1:
            plan.refuse(UNSUPPORTED, f"VP {vp_text!r}: an interleaved schedule without its number of virtual stages "
                                     "(no framework default)")
            return None
        plan.notes.append(f"VP {vp_text!r} has no effect with PP = 1")
        vp = 1
    dims["vp"] = vp or 1
    return dims


def _zero(row: TrainingRow, fw: Framework, plan: RowPlan, dp: int) -> list[str]:
    text = row.text("zero_or_dist_opt").lower()
    features: list[str] = []
    fsdp = leading_number(text[text.find("fsdp=") + 5:]) if "fsdp=" in text else None
    if fsdp is not None and fsdp[0] > 0:
        features.append("fsdp")
    elif "dist" in text and "opt" in text:
        features.append("distributed_optimizer")
    elif text.startswith("zero"):
        stage = whole(row, "zero_or_dist_opt") or 0
        features += ["distributed_optimizer"] if stage in (1, 2) else ["fsdp"] if stage == 3 else []
    elif fw.distributed_optimizer[0] and dp > 1:
        features.append("distributed_optimizer")
        plan.defaults_used.append(f"distributed optimizer ({fw.distributed_optimizer[1]})")
    elif dp > 1:
        plan.defaults_used.append(f"no distributed optimizer ({fw.distributed_optimizer[1]})")
    return [f for f in features if dp > 1]


def _requirements(row: TrainingRow, fw: Framework, plan: RowPlan, dims: dict[str, int], recipe: Recipe | None
                  ) -> list[tuple[str, Any]]:
    """The (feature, value) pairs the row's run used (``recipe``: its release's, where known)."""
    reqs: list[tuple[str, Any]] = [(k, dims[k]) for k in ("tp", "pp", "dp")]
    reqs += [(k, dims[k]) for k in ("ep", "vp", "cp") if dims[k] > 1]
    tp, dp = dims["tp"], dims["dp"] * dims["cp"]
    sp = flag(row.text("seq_parallel"))
    if sp is None and tp > 1:
        sp = fw.sequence_parallel[0]
        plan.defaults_used.append(f"sequence parallelism {'on' if sp else 'off'} ({fw.sequence_parallel[1]})")
    if sp and tp > 1:
        reqs.append(("sequence_parallel", True))
    recompute = row.text("recompute").lower()
    if not recompute and recipe is not None and recipe.recompute_modules:
        recompute = "selective"
        reqs.append(("recompute_modules", recipe.recompute_modules))
        plan.defaults_used.append(f"selective recompute of {recipe.recompute_modules} ({recipe.where})")
    elif not recompute:
        recompute = fw.recompute[0]
        plan.defaults_used.append(f"recompute {recompute} ({fw.recompute[1]})")
    if recompute.startswith("selective"):
        reqs.append(("selective_recompute", True))
    elif recompute.startswith(("full", "yes", "true")):
        reqs.append(("full_recompute", True))
    zero = _zero(row, fw, plan, dp)
    reqs += [(f, True) for f in zero]
    text = " ".join(row.text(c) for c in ("zero_or_dist_opt", "seq_parallel", "notes")).lower()
    stated = {k: f"--{k.replace('_', '-')}" in text for k in ("overlap_grad_reduce", "overlap_param_gather",
                                                              "tp_comm_overlap")}
    relevant = {"overlap_grad_reduce": dp > 1, "overlap_param_gather": dp > 1 and "distributed_optimizer" in zero,
                "tp_comm_overlap": tp > 1}
    if any(stated.values()):
        reqs += [(k, True) for k, on in stated.items() if on and relevant[k]]
    elif fw.overlap[0] and any(relevant.values()):
        off = set(recipe.overlaps_off if recipe is not None else ())
        if "overlap_grad_reduce" in off:  # Megatron-Core overlaps no parameter gather without it
            off.add("overlap_param_gather")
        chosen = {k: on and k not in off for k, on in relevant.items()}
        reqs += [(k, True) for k, on in chosen.items() if on]
        if any(chosen.values()):
            plan.defaults_used.append(f"communication overlap: {', '.join(k for k, on in chosen.items() if on)} "
                                      f"({fw.overlap[1]})")
        turned_off = sorted(off & {k for k, on in relevant.items() if on})
        if turned_off and recipe is not None:
            plan.defaults_used.append(f"no {', '.join(turned_off)} ({recipe.where})")
    if dp > 1 and ("overlap_grad_reduce", True) not in reqs:
        reqs.append(("no_grad_overlap", True))
    if dp > 1 and fw.megatron_buckets:
        reqs.append(("megatron_buckets", True))
    reqs.append(("iteration_tail", True))
    etp, why = EXPERT_TP.get(row.source_id, (tp, ""))
    if dims["ep"] > 1 and etp != tp:
        reqs.append(("etp", etp))
        plan.defaults_used.append(f"expert tensor parallelism {etp} ({why})")
    if dims["ep"] > 1 and recipe is not None and recipe.cuda_graph_scope == "full_iteration":
        plan.defaults_used.append(f"MoE dispatch without a host sync ({recipe.where}: whole-iteration CUDA graphs, "
                                  "HybridEP with fixed buffers)")
    elif dims["ep"] > 1 and not _token_drop(row, recipe):
        reqs.append(("moe_host_sync", True))
        why = recipe.where if recipe is not None and recipe.moe_token_drop is not None else \
            "Megatron-Core's default; the row states no token drop"
        plan.defaults_used.append(f"MoE dispatch dropless ({why}): host waits for the token counts, expert section "
                                  "host-issued")
    if dims["ep"] > 1 and recipe is not None and recipe.moe_dispatcher:
        if recipe.moe_dispatcher == "flex":
            reqs.append(("moe_flex_dispatcher", True))
            if recipe.moe_flex_backend:
                reqs.append(("moe_flex_backend", recipe.moe_flex_backend))
        backend = f" ({recipe.moe_flex_backend})" if recipe.moe_flex_backend else ""  # only flex names one
        plan.defaults_used.append(f"MoE dispatcher {recipe.moe_dispatcher}{backend} ({recipe.where})")
    if dims["ep"] > 1 and recipe is not None and recipe.moe_a2a_overlap:
        if dims["pp"] > 1 and dims["vp"] <= 1:
            plan.notes.append(f"{recipe.where} overlaps the expert-parallel all-to-alls (EP A2A overlap), which "
                              "needs virtual pipeline stages with pp > 1; the row's layout has none, so it runs "
                              "without")
        else:
            reqs.append(("moe_a2a_overlap", True))
            plan.defaults_used.append(f"EP A2A overlap ({recipe.where}: each steady-state forward runs with the "
                                      "next backward, one's all-to-alls beside the other's compute)")
    if dims["ep"] > 1 and recipe is not None and recipe.moe_fused_mlp:
        reqs.append(("moe_fused_mlp", True))
        plan.defaults_used.append(f"the experts' MLP as Transformer Engine's fused grouped MLP ({recipe.where})")
    if fw.cross_entropy[0] == "unfused" and "--cross-entropy-loss-fusion" not in stated_arguments(row.text("notes")):
        reqs.append(("unfused_cross_entropy", True))
        plan.defaults_used.append(f"cross entropy unfused ({fw.cross_entropy[1]})")
    if fw.attention[0] == "unfused":
        reqs.append(("unfused_attention", True))
        plan.defaults_used.append(f"attention unfused ({fw.attention[1]})")
    if "scatter/gather optimization on" in text and dims["pp"] > 1 and tp > 1:
        reqs.append(("pp_scatter_gather", True))
    precision = row.text("precision").lower()
    if not precision:
        precision = fw.precision[0]
        plan.defaults_used.append(f"precision {precision} ({fw.precision[1]})")
    reqs += _low_precision(precision.split("(")[0], fw, plan)
    if ("fp8_tensorwise", True) in reqs and fw.fp8_param_gather[0] and {"distributed_optimizer", "fsdp"} & set(zero):
        reqs.append(("fp8_param_gather", True))
        plan.defaults_used.append(f"parameter all-gathers in FP8 ({fw.fp8_param_gather[1]})")
    low = ("fp8", True) in reqs or ("fp4", True) in reqs
    if recipe is not None and low and (any(recipe.bf16_layers) or recipe.bf16_gemms):
        start, end = recipe.bf16_layers
        reqs += [(k, n) for k, n in (("bf16_layers_at_start", start), ("bf16_layers_at_end", end)) if n]
        if recipe.bf16_gemms:
            reqs.append(("bf16_gemms", recipe.bf16_gemms))
        kept = [f"the first {start} and last {end} layers" if any(recipe.bf16_layers) else "",
                f"the {recipe.bf16_gemms} GEMMs" if recipe.bf16_gemms else ""]
        plan.defaults_used.append(f"{' and '.join(k for k in kept if k)} in 16-bit ({recipe.where})")
    if recipe is not None and ("fp4", True) in reqs and recipe.mxfp8_gemms:
        reqs.append(("mxfp8_gemms", recipe.mxfp8_gemms))
        plan.defaults_used.append(f"the {recipe.mxfp8_gemms} GEMMs in MXFP8 ({recipe.where})")
    if recipe is not None and recipe.activation_offload_layers and dims["pp"] == 1:
        reqs.append(("activation_offload_layers", recipe.activation_offload_layers))
        plan.defaults_used.append(f"activations of the first {recipe.activation_offload_layers} layers offloaded to "
                                  f"host memory ({recipe.where}: cpu_offloading_num_layers; in the memory estimate, "
                                  "the copies taken as hidden under compute)")
    if recipe is not None and recipe.fp8_attention and ("fp8", True) in reqs:
        reqs.append(("fp8_attention", True))
        plan.defaults_used.append(f"attention in FP8 ({recipe.where}: fp8_dot_product_attention)")
    if dp > 1 and fw.grad_reduce_in_fp32[0] and "fp16" not in precision:
        reqs.append(("grad_reduce_in_fp32", True))
        plan.defaults_used.append(f"gradient reduction in fp32 ({fw.grad_reduce_in_fp32[1]})")
    elif dp > 1 and not fw.grad_reduce_in_fp32[0]:
        plan.defaults_used.append(f"gradient reduction in the parameters' precision ({fw.grad_reduce_in_fp32[1]})")
    return reqs


def _token_drop(row: TrainingRow, recipe: Recipe | None) -> bool:
    """Whether the row's MoE dispatcher drops tokens (a fixed capacity, no host sync): its recipe's word, else its
    model name's ("Qwen3_30B_a3B (tokendrop)"); Megatron-Core's default is dropless."""
    if recipe is not None and recipe.moe_token_drop is not None:
        return recipe.moe_token_drop
    return "tokendrop" in row.text("model").lower()


def _low_precision(precision: str, fw: Framework, plan: RowPlan) -> list[tuple[str, Any]]:
    """The GEMM precision and quantization recipe a row's precision names ("FP8-CS", "MXFP8", "FP8-MX", "NVFP4";
    a plain "FP8" takes the framework's recipe; a value in parentheses is another run's)."""
    text = precision.strip().lower()
    if "fp4" in text:
        return [("fp4", True)]
    if "fp8" not in text:
        return []
    if "mx" in text:
        return [("fp8", True), ("mxfp8", True)]
    if "cs" in text:
        return [("fp8", True), ("fp8_tensorwise", True)]
    if "ds" in text or "delayed" in text:
        return [("fp8", True), ("fp8_delayed", True)]
    plan.defaults_used.append(f"FP8 recipe {fw.fp8_recipe[0]} ({fw.fp8_recipe[1]})")
    return [("fp8", True), (f"fp8_{fw.fp8_recipe[0]}", True)]


def _pipeline_split(row: TrainingRow, plan: RowPlan, dims: dict[str, int], layers: int | None
                    ) -> list[tuple[str, Any]]:
    """Megatron-Bridge's recipes count the embedding and the loss as pipeline layers where the transformer layers
    alone do not fill every virtual stage equally (Llama 3.1 405B: 126 + 2 on 8 x 8 stages; Qwen3 235B: 94 + 2 on
    8 x 2); the tables do not say so, so it is taken where the plain split cannot run and the accounted one can."""
    pp, vp = dims["pp"], dims["vp"]
    stated = stated_arguments(row.text("notes"))
    if pp > 1 and "--account-for-embedding-in-pipeline-split" in stated:
        plan.defaults_used.append("the embedding counts as a layer in the pipeline split (the row's Megatron-LM "
                                  "arguments)")
        return [("account_for_embedding", True)] + ([("account_for_loss", True)]
                                                    if "--account-for-loss-in-pipeline-split" in stated else [])
    if pp == 1 or layers is None or row.source_id not in ACCOUNTING_SOURCES:
        return []
    plain = layers % pp == 0 and (layers // pp) % vp == 0
    if plain or (layers + 2) % (pp * vp):
        return []
    plan.defaults_used.append(f"the embedding and the loss each count as a layer in the pipeline split: {layers} + 2 "
                              f"places over {pp} x {vp} virtual stages (Megatron-Bridge's recipes set "
                              "account_for_embedding/loss_in_pipeline_split where the layers alone do not split)")
    return [("account_for_embedding", True), ("account_for_loss", True)]


def _batch(row: TrainingRow, fw: Framework, plan: RowPlan, dims: dict[str, int], recipe: Recipe | None = None
           ) -> tuple[int, int] | None:
    """(global batch, micro-batch size); a micro-batch size of 0 is chosen later by memory (_fit_micro_batch)."""
    dp = dims["dp"]
    gbs = whole(row, "global_batch")
    if gbs is None:
        plan.refuse(UNSUPPORTED, "no global batch size")
        return None
    mbs = whole(row, "micro_batch")
    if mbs is None and recipe is not None and recipe.micro_batch:
        mbs = recipe.micro_batch
        plan.defaults_used.append(f"micro-batch size {mbs} ({recipe.where}; the table leaves it blank)")
    if mbs is None and fw.micro_batch_fit and dims["pp"] == 1 and gbs % dp == 0:
        return gbs, 0
    if mbs is None:
        mbs = fw.micro_batch[0]
        plan.defaults_used.append(f"micro-batch size {mbs} ({fw.micro_batch[1]})")
    if gbs % (dp * mbs):
        plan.refuse(UNSUPPORTED, f"global batch {gbs} is not a whole number of micro-batches of {mbs} on DP = {dp}")
        return None
    return gbs, mbs


def _fit_micro_batch(plan: RowPlan, fw: Framework, dp: int, device_name: str) -> None:
    """The micro-batch size of a row that states none, of a framework without a default, with no pipeline: the
    largest dividing the data-parallel rank's sequences whose estimated memory (workload/llm/memory.py) fits the
    GPU's. A run without a pipeline has no bubble that smaller micro-batches would shrink, while larger ones run
    larger GEMMs and leave the gradient reduction a longer last backward to overlap; tuned runs take the largest
    that fits."""
    spec = plan.spec
    per_rank = spec["global_batch"] // dp
    capacity = device_preset(device_name).memory_bytes if device_name else 0
    if not capacity:
        spec["micro_batch_size"] = fw.micro_batch[0]
        plan.defaults_used.append(f"micro-batch size {fw.micro_batch[0]} ({fw.micro_batch[1]})")
        return
    for size in sorted((d for d in range(1, per_rank + 1) if per_rank % d == 0), reverse=True):
        try:
            need = llm_peak_memory(spec | {"micro_batch_size": size}, plan.row.row_id).total_bytes
        except InputError:
            continue
        if need <= capacity or size == 1:
            spec["micro_batch_size"] = size
            fits = (f"the largest dividing its {per_rank} sequences per data-parallel rank that fits in the "
                    f"{device_name}'s {capacity / 2**30:g} GiB" if need <= capacity
                    else "none fits by the estimate, so the smallest")
            plan.defaults_used.append(
                f"micro-batch size {size} ({fw.name} has no default; without a pipeline {fits}: "
                f"{need / 2**30:.1f} GiB per GPU by the memory estimate)")
            return
    spec["micro_batch_size"] = fw.micro_batch[0]  # no size runs: the layout's own error is reported later
    plan.defaults_used.append(f"micro-batch size {fw.micro_batch[0]} ({fw.micro_batch[1]})")


def _add(plan: RowPlan, feature: str, value: Any) -> None:
    """A minor feature into the row's mapping, or into what it leaves out when the generator has no option."""
    got = resolve(feature, value)
    if got is not None:
        plan.spec[got[0]] = got[1]
    else:
        plan.left_out.append(missing_label(feature))


def _graphs(plan: RowPlan, recipe: Recipe | None) -> None:
    """The CUDA graphs the row's recipe captured (none where no recipe says: the frameworks' default)."""
    if recipe is None or not recipe.cuda_graph_scope:
        return
    scope = recipe.cuda_graph_scope
    if scope == "full" and plan.spec.get("moe_host_sync"):
        plan.notes.append(f"{recipe.where} captures whole layers, which the dropless dispatcher's host sync forbids: "
                          "no graphs taken")
        return
    _add(plan, "cuda_graph_scope", scope)
    plan.defaults_used.append(f"CUDA graphs on {scope} ({recipe.where})")


def plan_row(row: TrainingRow, hw_profile: str | None = None, code_values: bool = False) -> RowPlan:
    """What it takes to simulate ``row`` (``hw_profile`` overrides the matched profile; ``code_values``: the layout
    and batch its release's code states where the row prints others, rather than the printed ones)."""
    printed = row
    taken: dict[str, str] = {}
    if code_values:
        row, taken = with_code_values(row)
    n = whole(row, "n_gpus")
    plan = RowPlan(row, n_gpus=n or 0, code_values=taken)
    if taken:
        plan.notes.append("simulated with its release's code values " + ", ".join(f"{c} {v}" for c, v in taken.items())
                          + " instead of the printed " + ", ".join(f"{c} {printed.text(c) or 'blank'}" for c in taken))
    if not n:
        return plan.refuse(UNSUPPORTED, f"n_gpus {row.text('n_gpus')!r} is not a whole number")
    fw = _framework(row, plan)
    dims = _parallel(row, plan)
    if dims is None:
        return plan
    recipe = recipe_for(row.source_id, row.text("source_section"), row.text("model"), row.text("gpu"),
                        row.text("precision"))
    if recipe is None:
        try:
            recipe, unread = stated_recipe(row.text("source_section"), row.text("notes"))
        except ConfigError as e:
            return plan.refuse(UNSUPPORTED, str(e))
        plan.left_out += [f"{flag} (a stated Megatron-LM argument the model does not read)" for flag in unread]
    plan.code_states = code_states_differing(row, recipe) if recipe is not None else {}
    if recipe is not None and plan.code_states:
        plan.notes.append(code_states_note(row, recipe, plan.code_states))
    if recipe is not None and recipe.vp and not row.text("VP") and dims["pp"] > 1:
        dims["vp"] = recipe.vp
        plan.defaults_used.append(f"VP {recipe.vp} ({recipe.where}; the table leaves VP blank)")
    if not row.text("layers") and not row.text("TP"):
        return plan.refuse(UNSUPPORTED, "the source states no parallel layout or model dimensions")
    plan.layout = " ".join(f"{k.upper()}{dims[k]}" for k in ("tp", "pp", "vp", "cp", "ep", "dp")
                           if dims[k] > 1 or k in ("tp", "pp", "dp"))
    if KNOWN_REGRESSION in row.text("notes").lower():
        return plan.refuse(UNSUPPORTED, "the source marks this figure as a known performance regression of its "
                                        "release (the row's notes): it times a software fault, not the stack modelled")
    row_dims = {f: v for c, f in ROW_DIMS.items() if (v := whole(row, c)) is not None}
    chosen = model_for(row.text("model"), row_dims, dims["tp"])
    plan.defaults_used += chosen.defaults_used
    plan.model = chosen.fields
    if chosen.problem:
        return plan.refuse(UNSUPPORTED, chosen.problem)
    reqs = _requirements(row, fw, plan, dims, recipe)
    layout = recipe.pipeline_layout if recipe is not None and dims["pp"] > 1 else ""
    if layout:  # the recipe places every virtual stage's layers (and any multi-token-prediction depth) itself
        mtp = parse_pipeline_layout(layout)[1]
        chosen.fields["mtp_layers"] = mtp
        plan.defaults_used.append(f"pipeline layout {layout} ({recipe.where})"  # type: ignore[union-attr]
                                  + (f", {mtp} multi-token-prediction depth(s)" if mtp else ""))
    else:
        reqs += _pipeline_split(row, plan, dims, chosen.fields.get("num_layers"))
    batch = _batch(row, fw, plan, dims, recipe)
    if batch is None:
        return plan
    missing: list[str] = []
    structural = False  # a missing feature that changes the rank count: no approximation
    spec: dict[str, Any] = {"generate": "llm", "model_name": row.row_id[:64], **chosen.fields}
    if layout:
        spec["pipeline_layout"] = layout
    for name, value in reqs:
        got = resolve(name, value)
        if got is not None:
            spec[got[0]] = got[1]
        elif FEATURES[name].minor:
            plan.left_out.append(missing_label(name))
        else:
            missing.append(missing_label(name))
            structural = structural or FEATURES[name].structural
    spec["global_batch"], spec["micro_batch_size"] = batch
    plan.spec = spec
    stated = stated_machine(row.text("gpu"), row.text("intra_node"), row.text("inter_node"),
                            whole(row, "gpus_per_node"))
    hardware = choose_hardware(stated, hw_profile)
    plan.defaults_used += hardware.defaults_used
    if hardware.profile is not None:
        plan.profile = hardware.profile.name
        plan.device = hardware.device or ""
        _add(plan, "host_cpu", hardware.profile.host_cpu)
        if spec.get("moe_dispatcher") == "flex":  # the flex dispatcher's inter-domain stage needs the domains
            spec["nvlink_domain"] = hardware.profile.for_job(n).gpus_per_node
    _graphs(plan, recipe)
    if spec["micro_batch_size"] == 0:
        _fit_micro_batch(plan, fw, dims["dp"], plan.device)
    values = {c: number(row, c) for c in ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")}
    peak = device_preset(plan.device).peak_tflops if plan.device else None
    metric = choose_metric(values, row.source_id, chosen.fields, batch[0], n, peak)
    if isinstance(metric, str):
        return plan.refuse(UNSUPPORTED, metric)
    plan.metric = metric
    plan.needs = missing
    if hardware.problem:
        return plan.refuse(UNSUPPORTED, hardware.problem)
    if hardware.profile is not None:
        try:
            plan.network = network_for(hardware.profile, n, row.row_id)
        except InputError as e:
            return plan.refuse(UNSUPPORTED, str(e))
    if missing:
        plan.approximable = not structural
        plan.refuse(NEEDS, "; ".join(missing))
        return plan
    try:  # a layout the table prints but no code ran (and no recipe places) is refused here, not mid-run
        llm_plan(spec, row.row_id)
    except InputError as e:
        return plan.refuse(UNSUPPORTED, f"the layout as printed does not run: {e}")
    _memory_note(plan)
    return plan


def _memory_note(plan: RowPlan) -> None:
    """A note when the run as planned needs more device memory per GPU than its GPU has by the estimate
    (workload/llm/memory.py): every published run fitted, so the estimate, or the layout as printed, is off."""
    if not plan.device:
        return
    short = device_preset(plan.device).memory_shortfall(llm_peak_memory(plan.spec, plan.row.row_id).total_bytes)
    if short:
        plan.notes.append(f"the run as planned {short} (a printed batch or layout the run did not use, or "
                          "memory-saving settings the row and its recipe do not state, would explain it)")
