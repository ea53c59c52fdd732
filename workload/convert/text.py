"""``astrasim-py trace convert text``: ASTRA-sim 1.0 text workloads -> per-rank Chakra ET files.

Every parallelism keyword of ASTRA-sim 1.0 converts (text_build describes each training loop), including
HYBRID_TRANSFORMER and HYBRID_TRANSFORMER_FWD_IN_BCKWD, which Chakra's converter rejects, and SimAI's
``ep`` / ``pp`` / ``ga`` / ``pp_comm`` parameters. Communicator groups (text_layout) are declared in each
rank's METADATA node and named by the collectives' ``pg_name``; a group spanning every NPU has none.

Times: ASTRA-sim 1.0 counts cycles of a 1 GHz clock (ns); ET durations are whole µs. Each compute time is
rounded with its remainder carried into the next compute of the rank, so a rank's total compute time stays
within 0.5 µs of the text file's (Chakra's converter instead writes the cycle count as µs, 1000x too long).
Not modelled, with a warning: the weight-update delay column, vpp (interleaved stages), and ASTRA-sim 1.0's
one-cycle steps between loop states.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import replace

from workload.convert.text_build import PHASE_GROUPS, Plan, build_rank
from workload.convert.text_format import (
    DLRM,
    TRANSFORMER,
    TextWorkload,
    read_text_workload,
    unknown_parameters,
)
from workload.convert.text_layout import GroupTable, make_layout
from workload.errors import InputError, printable
from workload.groups import GROUPS_FILE_HELP, move_groups_to_file
from workload.limits import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    add_output_limits,
    check_output,
    output_limits,
    require_int,
)
from workload.writer import serialize, write_trace

Warn = Callable[[str], None]
CONVERTED_VERSION = "1.0.0"
_GROUP_SIZE_KEYWORDS = (*TRANSFORMER, "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA")
_FIRST_IG_SKIPPED = ("MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA")  # no input-gradient collective at layer 0
# Header parameters (lower case) each parallelism reads; others are reported as ignored.
_USES = {
    "HYBRID_TRANSFORMER": {"model_parallel_npu_group", "ep", "expert_parallel_npu_group", "pp", "vpp", "ga",
                           "pp_comm"},
    "HYBRID_DATA_MODEL": {"model_parallel_npu_group"},
    "HYBRID_MODEL_DATA": {"model_parallel_npu_group"},
    "HYBRID_DLRM": {"last bottom layer", "dlrm_last_bottom_layer"},
}
_USES["HYBRID_TRANSFORMER_FWD_IN_BCKWD"] = _USES["HYBRID_TRANSFORMER"] | {"checkpoints", "checkpoint_initiates"}
_USES["HYBRID_DLRM_ENHANCED"] = _USES["HYBRID_DLRM"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Convert an ASTRA-sim 1.0 text workload (MICRO, DATA, MODEL, HYBRID_DATA_MODEL, "
                          "HYBRID_MODEL_DATA, HYBRID_DLRM[_ENHANCED], HYBRID_TRANSFORMER[_FWD_IN_BCKWD], "
                          "DISTRIBUTED_INFERENCE) into PREFIX.<rank>.et files, one per NPU.")
    parser.add_argument("input", metavar="INPUT", help="the text workload file")
    parser.add_argument("--groups-file", action="store_true", help=GROUPS_FILE_HELP)
    parser.add_argument("--output", "-o", required=True, metavar="PREFIX",
                        help="output prefix: writes PREFIX.0.et ... PREFIX.<N-1>.et")
    parser.add_argument("--num-npus", type=int, required=True, metavar="N", help="number of NPUs (ranks)")
    parser.add_argument("--num-passes", type=int, default=1, metavar="P",
                        help="training iterations, each starting when the previous one ends (default 1)")
    parser.add_argument("--model-parallel-npus", type=int, metavar="K",
                        help="model-parallel group size; replaces the file's model_parallel_NPU_group (needed "
                             "by HYBRID_DATA_MODEL / HYBRID_MODEL_DATA files, which have none)")
    parser.add_argument("--ga", type=int, metavar="G",
                        help="micro-batches per pass of a HYBRID_TRANSFORMER workload; replaces the file's ga "
                             "(use 1 for AICB/SimAI files, whose layer list already holds every micro-batch)")
    parser.add_argument("--time-unit", choices=("ns", "us"), default="ns",
                        help="unit of the file's compute times: ns = ASTRA-sim 1.0 cycles (default) or us")
    add_output_limits(parser)


def main(args: argparse.Namespace, warn: Warn) -> None:
    paths = convert(args.input, args.output, args.num_npus, args.num_passes,
                    model_parallel_npus=args.model_parallel_npus, ga=args.ga, time_unit=args.time_unit, warn=warn,
                    limits=output_limits(args))
    print(printable(args.output))
    if args.groups_file:
        move_groups_to_file(paths, f"{args.output}.comm_groups.json")
        print(printable(f"{args.output}.comm_groups.json"))


def convert(path: str, prefix: str, num_npus: int, num_passes: int = 1, *, model_parallel_npus: int | None = None,
            ga: int | None = None, time_unit: str = "ns", warn: Warn | None = None,
            limits: tuple[int, int] = (DEFAULT_MAX_FILES, DEFAULT_MAX_BYTES)) -> list[str]:
    """Convert the text workload at ``path`` and write ``<prefix>.<rank>.et``; returns the paths. ``limits``
    (max files, max bytes) bound the output, estimated before anything is written."""
    warn = warn or (lambda message: None)
    require_int("--num-npus", num_npus, 1)
    require_int("--num-passes", num_passes, 1)
    what = f"trace convert text for {num_npus:,} NPUs"
    check_output(what, num_npus, None, limits)
    workload = read_text_workload(path, 1000.0 if time_unit == "us" else 1.0)
    plan = make_plan(workload, num_npus, num_passes, model_parallel_npus, ga, warn)
    check_output(what, num_npus, _estimated_bytes(plan), limits)
    directory = os.path.dirname(prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)
    groups = GroupTable(num_npus)
    metadata = {"converted_from": os.path.basename(path), "parallelism": workload.keyword}
    paths, max_shift_ns, dropped = [], 0.0, 0
    for rank in range(num_npus):
        program = build_rank(plan, rank, groups)
        out = f"{prefix}.{rank}.et"
        write_trace(out, program.finished_nodes(), version=CONVERTED_VERSION, metadata=metadata)
        paths.append(out)
        max_shift_ns = max(max_shift_ns, program.clock.max_shift_ns)
        dropped = max(dropped, program.dropped_single)
    if dropped:
        warn(f"{path}: {dropped} collective(s) per rank are over one-rank groups and were left out")
    if max_shift_ns >= 1:
        warn(f"{path}: compute times are rounded to whole µs with the remainder carried to the next compute, so "
             f"each rank's total stays within 0.5 µs; single nodes move by up to {max_shift_ns:.0f} ns")
    return paths


def _estimated_bytes(plan: Plan) -> int:
    """The output's size from one pass of the ranks of each distinct group layout position (rank 0, and the
    last rank, which differ in the pipeline); every pass emits the same nodes."""
    one = replace(plan, passes=1)
    sizes = []
    for rank in sorted({0, plan.layout.npus - 1}):
        nodes = build_rank(one, rank, GroupTable(plan.layout.npus)).finished_nodes()
        sizes.append(sum(len(serialize(n)) + 4 for n in nodes))
    return max(sizes) * plan.passes * plan.layout.npus


def make_plan(wl: TextWorkload, npus: int, passes: int, model_parallel_npus: int | None = None,
              ga: int | None = None, warn: Warn | None = None) -> Plan:
    """Check the workload's parameters against the NPU count and say what becomes of each."""
    warn = warn or (lambda message: None)
    h, kw, where = wl.header, wl.keyword, f"{wl.path}:1"
    unknown = unknown_parameters(h)
    for name in unknown:
        warn(f"{where}: unknown parameter {name!r} ignored")
    for name in h.given:
        if name.lower() not in _USES.get(kw, set()) | {"all_gpus"} and name not in unknown:
            warn(f"{where}: {kw} does not use {name!r} (ASTRA-sim 1.0 ignores it too)")
    if h.all_gpus is not None and h.all_gpus != npus:
        warn(f"{where}: the file was written for all_gpus: {h.all_gpus}; converting for {npus} NPUs")
    tp = 1
    if model_parallel_npus is not None:
        if model_parallel_npus < 1:
            raise InputError(f"--model-parallel-npus must be at least 1 (got {model_parallel_npus})")
        if kw not in _GROUP_SIZE_KEYWORDS:
            warn(f"{where}: {kw} has no model-parallel groups; --model-parallel-npus is ignored")
        elif h.tp is not None and h.tp != model_parallel_npus:
            warn(f"{where}: --model-parallel-npus {model_parallel_npus} replaces model_parallel_NPU_group: {h.tp}")
    if kw in _GROUP_SIZE_KEYWORDS:
        tp = model_parallel_npus or h.tp or 0
        if not tp:
            raise InputError(f"{where}: {kw} needs the model-parallel group size: add 'model_parallel_NPU_group: "
                             "K' to the first line or pass --model-parallel-npus K")
    transformer = kw in TRANSFORMER
    pp = _given(h.pp) if transformer else 1
    layout = make_layout(npus, where, tp, pp, _given(h.ep) if transformer else 1, kw != "HYBRID_MODEL_DATA")
    micro_batches = 1
    if ga is not None and not transformer:
        warn(f"{where}: {kw} has no micro-batches; --ga is ignored")
    if transformer:
        micro_batches = ga if ga is not None else _given(h.ga)
        if micro_batches < 1:
            raise InputError(f"{where if ga is None else '--ga'}: ga must be at least 1 (got {micro_batches})")
        if ga is None and micro_batches > 1:
            warn(f"{where}: ga: {micro_batches}: each pass runs the layer list as {micro_batches} micro-batches "
                 "(weight-gradient collectives after the last); AICB/SimAI files already list every micro-batch: "
                 "pass --ga 1 to run the list once")
        if pp > 1 and not h.pp_comm_bytes:
            raise InputError(f"{where}: pp: {pp} needs the activation size sent between stages: add 'pp_comm: "
                             "BYTES' to the first line")
        if pp > 1 and (h.vpp or 1) > 1:
            warn(f"{where}: vpp: {h.vpp} (interleaved virtual stages) is not modelled: each of the {pp} stages "
                 "runs the layer list as one chunk")
    _check_layers(wl, warn)
    return Plan(kw, wl.layers, layout, passes, micro_batches, h.pp_comm_bytes or 0, _recompute(wl),
                _last_bottom(wl))


def _given(value: int | None) -> int:
    return 1 if value is None else value


def _check_layers(wl: TextWorkload, warn: Warn) -> None:
    kw = wl.keyword
    fwd_kind, ig_kind, wg_kind = PHASE_GROUPS[kw]
    ignored: dict[str, list[int]] = {}
    for layer in wl.layers:
        for phase, comm, kind in (("forward", layer.fwd.comm, fwd_kind), ("input-gradient", layer.ig.comm, ig_kind),
                                  ("weight-gradient", layer.wg.comm, wg_kind)):
            if comm is None:
                continue
            if comm.group and kw not in TRANSFORMER:
                raise InputError(f"{wl.path}:{layer.line}: {comm.word}: expert-parallel groups (_EP, _DP_EP) exist "
                                 "only in HYBRID_TRANSFORMER workloads")
            if comm.group and wl.header.ep is None:
                raise InputError(f"{wl.path}:{layer.line}: {comm.word} needs the expert-parallel group size: add "
                                 "'ep: K' to the first line")
            first_ig = phase == "input-gradient" and layer.index == 0
            dlrm_ignores = kw in DLRM and ((phase == "forward" and comm.word != "ALLTOALL")
                                           or (phase == "input-gradient" and layer.index > 0))
            if kind is None or dlrm_ignores or (kw in _FIRST_IG_SKIPPED and first_ig):
                ignored.setdefault(phase, []).append(layer.line)
    for phase, lines in ignored.items():
        shown = ", ".join(map(str, lines[:5])) + (" ..." if len(lines) > 5 else "")
        warn(f"{wl.path}: {kw} issues no {phase} collective for these layers (as in ASTRA-sim 1.0); "
             f"ignored on line(s) {shown}")
    words = {c.word for layer in wl.layers for c in (layer.fwd.comm, layer.ig.comm, layer.wg.comm) if c}
    if any(w.startswith("ALLREDUCE_ALLTOALL") or w.startswith("ALLREDUCEALLTOALL") for w in words):
        warn(f"{wl.path}: ALLREDUCEALLTOALL becomes an all-reduce followed by an all-to-all of the same size")
    if kw == "MICRO" and any(layer.fwd.compute_ns or layer.ig.compute_ns or layer.wg.compute_ns
                             for layer in wl.layers):
        warn(f"{wl.path}: MICRO runs only the weight-gradient collectives; compute times are ignored")
    longest = max(layer.update_ns for layer in wl.layers)
    if longest > 0:
        warn(f"{wl.path}: the weight-update delay column (up to {longest:g} ns after a collective) is not modelled")


def _recompute(wl: TextWorkload) -> dict[int, tuple[int, ...]]:
    """Initiating layer -> the layers whose forward it recomputes (from the nearest checkpoint at or below it
    up to the layer before it; the layer itself when it is its own checkpoint)."""
    h = wl.header
    if wl.keyword != "HYBRID_TRANSFORMER_FWD_IN_BCKWD" or not h.checkpoint_initiates:
        return {}
    count = len(wl.layers)
    checkpoints = sorted(set(h.checkpoints or ()))
    for name, values in (("checkpoints", checkpoints), ("checkpoint_initiates", h.checkpoint_initiates)):
        for k in values:
            if not 0 <= k < count:
                raise InputError(f"{wl.path}:1: {name} names layer {k}, but layers are numbered 0..{count - 1}")
    out: dict[int, tuple[int, ...]] = {}
    for t in sorted(set(h.checkpoint_initiates)):
        below = [c for c in checkpoints if c <= t]
        if not below:
            raise InputError(f"{wl.path}:1: checkpoint_initiates layer {t} has no checkpoint at or below it "
                             "(list the layer its recomputation starts from in checkpoints)")
        start = below[-1]
        out[t] = tuple(range(start, t)) if start < t else (t,)
    return out


def _last_bottom(wl: TextWorkload) -> int:
    if wl.keyword not in DLRM:
        return 0
    bottom = wl.header.last_bottom_layer
    if bottom is None:
        raise InputError(f"{wl.path}:1: {wl.keyword} needs the last bottom-MLP layer after the keyword, e.g. "
                         f"'{wl.keyword} 3' or '{wl.keyword} DLRM_LAST_BOTTOM_LAYER: 3'")
    if not 0 <= bottom < len(wl.layers) - 1:
        raise InputError(f"{wl.path}:1: the last bottom layer {bottom} must be below the last layer "
                         f"({len(wl.layers) - 1})")
    return bottom
