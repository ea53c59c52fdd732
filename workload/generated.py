"""Workloads without files: a generator mapping, built in memory rank by rank.

A ``--workload`` YAML file (or a sweep's ``workload`` mapping) that holds ``generate: KIND`` describes the traces
instead of naming them: ``generate: llm`` takes the keys of ``astrasim-py trace generate llm`` (``preset``, the
model fields, ``tp``, ``pp``, ``dp``, ``cp``, ``vp``, ``ep``, ``zero``, ``global_batch``, ``recompute``,
``precision``, ``overlap_grad_reduce``, ...: the flags' destinations, ``_`` for ``-``), the microbenchmarks
(``collective``, ``compute``, ``sendrecv``, ``memory``) those of ``trace generate KIND``. Each rank's trace is
serialized when the loader asks for it and never written to disk.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workload.errors import InputError, printable, shown
from workload.files import read_yaml, shown_path
from workload.traceset import TraceSet

GENERATOR_SUFFIXES = (".yml", ".yaml")


def _llm_parser() -> argparse.ArgumentParser:
    from workload.llm.cli import configure

    parser = argparse.ArgumentParser(add_help=False)
    configure(parser)
    return parser


def llm_keys() -> dict[str, Any]:
    """The keys of a ``generate: llm`` mapping with their defaults (the flags of ``trace generate llm``)."""
    skip = {"output", "summary", "list_presets", "max_files", "max_bytes", "groups_file", "hw_profile"}
    return {k: v for k, v in vars(_llm_parser().parse_args([])).items() if k not in skip}


def llm_aliases() -> dict[str, str]:
    """The flags' own spellings as keys (``layers`` for ``num_layers``, ``kv_heads``, ``tensor_model_parallel_size``,
    ...), so that a mapping may use the names ``trace generate llm --help`` shows, ``_`` for ``-``."""
    keys = llm_keys()
    aliases = {}
    for action in _llm_parser()._actions:
        for flag in action.option_strings:
            name = flag.lstrip("-").replace("-", "_")
            negated = isinstance(action, argparse.BooleanOptionalAction) and flag.startswith("--no-")
            if flag.startswith("--") and not negated and name != action.dest and action.dest in keys:
                aliases[name] = action.dest
    return aliases


def _llm_args(spec: dict[str, Any], where: str) -> argparse.Namespace:
    parser = _llm_parser()
    args = parser.parse_args([])
    keys = llm_keys()
    aliases = llm_aliases()
    unknown = sorted(str(k) for k in spec if k != "generate" and k not in keys and k not in aliases)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(printable(k)[:40] for k in unknown[:10])} for a "
                         f"generated llm workload; valid: {', '.join(sorted(keys))}")
    named: dict[str, str] = {}
    for key in spec:
        dest = aliases.get(key, key)
        if dest in named:
            raise InputError(f"{where}: '{named[dest]}' and '{key}' name the same setting; give one")
        named[dest] = key
    spec = {aliases.get(k, k): v for k, v in spec.items()}
    kinds = {a.dest: a for a in parser._actions}
    for key, value in spec.items():
        if key == "generate":
            continue
        action = kinds[key]
        if isinstance(action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction)):
            ok = isinstance(value, bool) or value is None
        elif action.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif callable(action.type):  # a parsed value (e.g. ddp_bucket_size: a number or a name)
            try:
                ok = not isinstance(value, bool) and isinstance(value, (int, str))
                value = action.type(str(value)) if ok else value
            except (argparse.ArgumentTypeError, ValueError):
                ok = False
        else:
            ok = isinstance(value, str) or (key == "layout" and isinstance(value, list))
            if key == "layout" and isinstance(value, list):
                value = ",".join(map(str, value))
        if ok and action.choices is not None and value not in action.choices:
            ok = False
        if not ok:
            expected = "true or false" if action.type is None and action.nargs == 0 else (
                "a whole number" if action.type is int else
                "a number or a name" if callable(action.type) else "a name")
            choices = f" (one of {', '.join(map(str, action.choices))})" if action.choices else ""
            raise InputError(f"{where}: '{key}' must be {expected}{choices}, not {shown(value)}")
        setattr(args, key, value)
    return args


def _llm_parts(spec: dict[str, Any], where: str) -> tuple[argparse.Namespace, Any, Any, Any]:
    """(arguments, model, validated plan, training options) of a ``generate: llm`` mapping."""
    from workload.llm.cli import _model, options_from_args, plan_from_args

    args = _llm_args(spec, where)
    try:
        model = _model(args)
        plan = plan_from_args(args)
        plan.validate(model)
        options = options_from_args(args, plan)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return args, model, plan, options


def _llm(spec: dict[str, Any], npus: int, where: str) -> TraceSet:
    return llm_workload(spec, npus, where)[0]


def llm_workload(spec: dict[str, Any], npus: int, where: str) -> tuple[TraceSet, Any, list[Any]]:
    """(in-memory traces, validated plan, stage programs) of a ``generate: llm`` mapping for ``npus`` ranks, the
    programs built once (tools that simulate the traces and need to know what each node is)."""
    from compute.devices import device as device_preset
    from workload.llm.build import build_programs
    from workload.llm.cli import plan_text
    from workload.llm.emit import TraceEmitter

    args, model, plan, options = _llm_parts(spec, where)
    if plan.world_size != npus:
        cp = f" x cp {plan.cp}" if plan.cp > 1 else ""
        raise InputError(f"{where}: the plan has {plan.world_size:,} ranks (dp {plan.dp} x tp {plan.tp} x pp "
                         f"{plan.pp}{cp}) but the network has {npus:,} NPUs: they must match")
    device = device_preset(args.device) if args.device else None
    metadata = {"generator": "astrasim-py generate: llm", "model": model.name, "plan": plan_text(plan)}
    programs = build_programs(model, plan, options)
    emitter = TraceEmitter(programs, options.rank_map(plan, model), device, metadata)
    label = f"{where} ({model.name}, dp {plan.dp} tp {plan.tp} pp {plan.pp}, generated)"
    traces = _in_memory(label, npus, emitter.rank_bytes, shared=False)
    return replace(traces, structure=emitter.structure), plan, programs


def _microbenchmark(spec: dict[str, Any], npus: int, where: str) -> TraceSet:
    from workload.tools.generate import GENERATED_VERSION, from_spec
    from workload.wire import frame_payloads
    from workload.writer import make_metadata, serialize

    traces = from_spec(spec, npus, where)
    header = serialize(make_metadata(GENERATED_VERSION))

    def rank_bytes(rank: int) -> bytes:
        return frame_payloads([header, *(serialize(node) for node in traces.stream(rank))])

    return _in_memory(f"{where} (generated)", npus, rank_bytes, shared=traces.same_on_every_rank)


def _in_memory(label: str, npus: int, contents: Callable[[int], bytes], shared: bool) -> TraceSet:
    if shared:
        return TraceSet(label, (f"{label} rank 0",), shared=True, contents=contents)
    return TraceSet(label, tuple(f"{label} rank {r}" for r in range(npus)), shared=False, contents=contents)


def generated_traces(spec: dict[str, Any], npus: int, where: str = "workload") -> TraceSet:
    """The in-memory traces of a generator mapping for ``npus`` ranks."""
    from workload.tools.generate import GENERATOR_KEYS

    kind = spec.get("generate")
    if kind == "llm":
        return _llm(spec, npus, where)
    if kind in GENERATOR_KEYS:
        return _microbenchmark(spec, npus, where)
    raise InputError(f"{where}: 'generate' must be one of llm, {', '.join(GENERATOR_KEYS)} (got {shown(kind)})")


def read_generator(path: str) -> dict[str, Any] | None:
    """The generator mapping a ``--workload`` YAML file holds, or None when ``path`` is not such a file."""
    if not path.endswith(GENERATOR_SUFFIXES):
        return None
    data = read_yaml(path, "workload generator")
    if not isinstance(data, dict) or "generate" not in data:
        raise InputError(f"{shown_path(path)}: a workload YAML file must be a generator mapping (generate: llm, "
                         "preset: ..., tp: ..., or generate: collective, type: ..., size: ...)")
    return data


def workload_traces(workload: str, npus: int) -> TraceSet:
    """The traces a ``--workload`` argument names: trace files, or a generator YAML file built for ``npus``."""
    from workload.traceset import resolve_workload

    spec = read_generator(workload)
    if spec is None:
        return resolve_workload(workload)
    return generated_traces(spec, npus, shown_path(workload))


def llm_plan(spec: dict[str, Any], where: str) -> tuple[Any, Any]:
    """(model, validated plan) of a ``generate: llm`` mapping, without building anything (an InputError says why
    the generator refuses it)."""
    _, model, plan, _ = _llm_parts(spec, where)
    return model, plan


def llm_peak_memory(spec: dict[str, Any], where: str) -> Any:
    """The StageMemory of the pipeline stage needing the most device memory per rank under a ``generate: llm``
    mapping (workload/llm/memory.py; an InputError says why the generator refuses the mapping)."""
    from workload.llm.memory import peak_memory

    _, model, plan, options = _llm_parts(spec, where)
    return peak_memory(model, plan, options)


def llm_programs(spec: dict[str, Any], where: str) -> tuple[Any, Any, list[Any]]:
    """(model, validated plan, stage programs) of a ``generate: llm`` mapping: what its traces are built from, for
    tools that need to know what each generated node is."""
    from workload.llm.build import build_programs

    _, model, plan, options = _llm_parts(spec, where)
    return model, plan, build_programs(model, plan, options)
