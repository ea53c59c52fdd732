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


def recipe_for(source_id: str, source_section: str, model: str, gpu: str, precision: str) -> Recipe | None:
    """The recipe a row of ``source_id``'s table ran (its release is the section's first word), or None."""
    file = SOURCES.get(source_id)
    if file is None or not source_section.split():
        return None
    return _recipes(file).get((source_section.split()[0], model, gpu, precision))
