"""A framework release's own recipes: what a published row of its performance tables ran with but does not state
(virtual pipeline stages left blank, CUDA graph scopes, the MoE dispatcher), read from the framework's code at that
release (configs/recipes/*.yml, one file per framework, each entry with the release's commit).

A recipe fills only what the row leaves unstated; a value the row states wins, and the report names every
value taken from a recipe (``defaults_used``). Where the release's code states another value than the row prints
(``code_states``: a stale layout or batch copied into the table), the row's value is still the one simulated, and
the report says so in a note: the published number may be of the code's run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from workload.errors import ConfigError
from workload.files import read_yaml
from workload.llm.options import MOE_DISPATCHERS, MOE_FLEX_BACKENDS

RECIPES_DIR = Path(__file__).resolve().parents[2] / "configs" / "recipes"
SOURCES = {"megatron_bridge_perf": "megatron_bridge.yml"}  # training-table source -> its framework's recipes
COMM_OVERLAPS = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")  # on unless a recipe says off
KEYS = {"release", "model", "gpu", "precision", "vp", "cuda_graph_scope", "moe_dispatcher", "moe_token_drop",
        "moe_a2a_overlap", "recompute_modules", "pipeline_layout", "micro_batch", "moe_fused_mlp", "fp8_attention",
        "bf16_layers", "bf16_gemms", "mxfp8_gemms", "code_states", "activation_offload_layers", *COMM_OVERLAPS}
# the table columns a recipe's code_states may name (what the release's code sets and the row prints otherwise)
CODE_STATES_COLUMNS = ("TP", "PP", "VP", "CP", "EP", "seq_len", "global_batch", "micro_batch", "zero_or_dist_opt",
                       "recompute")


@dataclass(frozen=True, slots=True)
class Recipe:
    vp: int | None
    cuda_graph_scope: str
    moe_token_drop: bool | None  # None: the recipe does not say (a dense model)
    moe_dispatcher: str  # the generator's name ("alltoall", "flex"), "" where the recipe does not say
    moe_a2a_overlap: bool  # Megatron-Core's EP A2A overlap
    recompute_modules: str  # selective recompute's modules ("layernorm,moe_act"); "" where the recipe sets none
    where: str  # "Megatron-Bridge 26.02.01 recipe (v0.3.1 @9c9dd848)"
    pipeline_layout: str = ""  # Megatron-Core's pipeline_model_parallel_layout ("Et*4|(t*4|)*14tmL"), "" if none
    micro_batch: int | None = None  # the recipe's micro-batch size where the table leaves it blank
    moe_fused_mlp: bool = False  # Megatron-Core's use_transformer_engine_op_fuser (the experts' fused MLP)
    moe_flex_backend: str = ""  # the flex dispatcher's library ("deepep", "hybridep"), "" where the recipe does not say
    fp8_attention: bool = False  # Megatron-Core's fp8_dot_product_attention
    overlaps_off: tuple[str, ...] = ()  # the COMM_OVERLAPS the recipe turns off (the framework's default is on)
    bf16_layers: tuple[int, int] = (0, 0)  # with FP8/FP4: decoder layers at the start and at the end kept 16-bit
    bf16_gemms: str = ""  # with FP8/FP4: GEMM groups kept 16-bit in every layer (TrainingOptions.bf16_gemms)
    mxfp8_gemms: str = ""  # with FP4: GEMM groups run in MXFP8 (TrainingOptions.mxfp8_gemms)
    code_states: tuple[tuple[str, str], ...] = ()  # (table column, the release's code's value) the row prints otherwise
    activation_offload_layers: int = 0  # Megatron-Core's cpu_offloading_num_layers (activations to host memory)


@cache
def _recipes(file: str) -> dict[tuple[str, str, str, str], Recipe]:
    data: dict[str, Any] = read_yaml(str(RECIPES_DIR / file), "framework recipes")
    out = {}
    for n, r in enumerate(data["recipes"], 1):
        unknown = sorted(set(r) - KEYS)
        if unknown or str(r.get("moe_dispatcher", "alltoall")).split("-")[0] not in MOE_DISPATCHERS:
            raise ConfigError(f"{RECIPES_DIR / file}: recipe {n} ({r.get('release')} {r.get('model')} {r.get('gpu')}): "
                              f"unknown key(s) {', '.join(unknown) or '-'} or moe_dispatcher "
                              f"{r.get('moe_dispatcher')!r}; valid keys: {', '.join(sorted(KEYS))}")
        release = data["releases"][r["release"]]
        where = f"{data['framework']} {r['release']} recipe ({release['ref']} @{str(release['commit'])[:8]})"
        key = (r["release"], r["model"], r["gpu"], r.get("precision", ""))
        dispatcher, _, backend = str(r.get("moe_dispatcher", "")).partition("-")  # flex-hybridep: flex, hybridep
        code_states = r.get("code_states") or {}
        wrong = sorted(set(code_states) - set(CODE_STATES_COLUMNS))
        if wrong:
            raise ConfigError(f"{RECIPES_DIR / file}: recipe {n}: code_states column(s) {', '.join(wrong)} unknown; "
                              f"valid are {', '.join(CODE_STATES_COLUMNS)}")
        if backend and backend not in MOE_FLEX_BACKENDS:
            raise ConfigError(f"{RECIPES_DIR / file}: recipe {n}: flex backend {backend!r} is not one of "
                              f"{', '.join(MOE_FLEX_BACKENDS)}")
        out[key] = Recipe(r.get("vp"), r.get("cuda_graph_scope", ""), r.get("moe_token_drop"), dispatcher,
                          bool(r.get("moe_a2a_overlap", False)), str(r.get("recompute_modules", "")), where,
                          str(r.get("pipeline_layout", "")), r.get("micro_batch"), bool(r.get("moe_fused_mlp", False)),
                          backend, bool(r.get("fp8_attention", False)),
                          tuple(k for k in COMM_OVERLAPS if r.get(k) is False),
                          tuple(r.get("bf16_layers", (0, 0))), str(r.get("bf16_gemms", "")),
                          str(r.get("mxfp8_gemms", "")),
                          tuple((c, str(code_states[c])) for c in CODE_STATES_COLUMNS if c in code_states),
                          int(r.get("activation_offload_layers", 0)))
    return out


ARGUMENTS_NOTE = "megatron-lm arguments:"  # in a row's notes: the run's own command line follows, up to a ";"
# the stated arguments a recipe takes (the EP A2A overlap implies the delayed weight gradients in the model; the
# graphs' implementation goes with their scope); any other is listed in the row's left_out
ARGUMENTS_READ = ("--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--moe-enable-deepep",
                  "--recompute-granularity", "--recompute-modules", "--overlap-moe-expert-parallel-comm",
                  "--combined-1f1b", "--combined-1f1b-recipe", "--delay-wgrad-compute", "--cuda-graph-scope",
                  "--cuda-graph-impl", "--moe-expert-capacity-factor")
# the stated arguments the planner reads elsewhere (the notes' overlap flags, the row's columns: precision,
# FSDP, full recompute), or that the model has as they are (fused permutation, grouped GEMM, forced balance,
# MXFP8's 16-bit parameter gathers through the gradient buffer)
ARGUMENTS_ELSEWHERE = ("--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
                       "--use-distributed-optimizer", "--sequence-parallel", "--expert-tensor-parallel-size",
                       "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                       "--moe-router-force-load-balancing", "--cross-entropy-loss-fusion", "--moe-permute-fusion",
                       "--moe-router-fusion", "--moe-grouped-gemm", "--bf16",
                       "--fp8-recipe", "--fp8-format", "--fp8-param-gather", "--reuse-grad-buf-for-mxfp8-param-ag",
                       "--use-custom-fsdp", "--data-parallel-sharding-strategy", "--recompute-method",
                       "--recompute-num-layers")


def stated_arguments(notes: str) -> dict[str, list[str]]:
    """The Megatron-LM arguments a row's notes state after "Megatron-LM arguments:" (up to a ";"): flag -> its
    values ({} when the notes state none)."""
    start = notes.lower().find(ARGUMENTS_NOTE)
    if start < 0:
        return {}
    text = notes[start + len(ARGUMENTS_NOTE):].split(";")[0]
    args: dict[str, list[str]] = {}
    flag = ""
    for word in text.split():
        if word.startswith("--"):
            flag = word
            args[flag] = []
        elif flag:
            args[flag].append(word)
    return args


def stated_recipe(source_section: str, notes: str) -> tuple[Recipe | None, list[str]]:
    """What a row that states its run's Megatron-LM arguments ran with, as a recipe (None when it states none),
    and the stated arguments the model does not read."""
    args = stated_arguments(notes)
    if not args:
        return None, []
    dispatcher = (args.get("--moe-token-dispatcher-type") or [""])[0]
    # --moe-enable-deepep: Megatron-Core's flag before the flex dispatcher named its backend (2025)
    backend = (args.get("--moe-flex-dispatcher-backend") or (["deepep"] if "--moe-enable-deepep" in args else [""]))[0]
    if (dispatcher and dispatcher not in MOE_DISPATCHERS) or (backend and backend not in MOE_FLEX_BACKENDS):
        raise ConfigError(f"the row's Megatron-LM arguments name dispatcher {dispatcher!r} / flex backend "
                          f"{backend!r}; the model has {', '.join(MOE_DISPATCHERS)} / {', '.join(MOE_FLEX_BACKENDS)}")
    selective = (args.get("--recompute-granularity") or [""])[0] == "selective"
    where = f"the row's Megatron-LM arguments ({source_section})"
    recipe = Recipe(vp=None, cuda_graph_scope=",".join(args.get("--cuda-graph-scope", [])),
                    moe_token_drop="--moe-expert-capacity-factor" in args, moe_dispatcher=dispatcher,
                    # --combined-1f1b with the ep_a2a recipe: the EP A2A overlap's name before it had its own flag
                    moe_a2a_overlap="--overlap-moe-expert-parallel-comm" in args
                    or "ep_a2a" in args.get("--combined-1f1b-recipe", []),
                    recompute_modules=",".join(args.get("--recompute-modules", [])) if selective else "",
                    where=where, moe_flex_backend=backend)
    unread = [f for f in args if f not in ARGUMENTS_READ and f not in ARGUMENTS_ELSEWHERE]
    return recipe, unread


def recipe_for(source_id: str, source_section: str, model: str, gpu: str, precision: str) -> Recipe | None:
    """The recipe a row of ``source_id``'s table ran (its release is the section's first word), or None."""
    file = SOURCES.get(source_id)
    if file is None or not source_section.split():
        return None
    return _recipes(file).get((source_section.split()[0], model, gpu, precision))
