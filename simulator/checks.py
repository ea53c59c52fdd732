"""Checks of a workload against its configuration, made before anything is simulated.

Two kinds: what would fail part-way through a run (a collective without an algorithm, an algorithm that
cannot run on its dimension, roofline nodes without the attributes the model needs) is refused at once;
what would give a number silently meaningless (compute nodes that nothing can time) is said in a warning
that names the option fixing it, or refused under ``strict``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from compute.kernels import KernelModel
from compute.roofline import Roofline
from compute.shapes import DTYPES
from compute.trace_timing import NodeTimes, describe, is_gpu_compute, node_times
from network.config import NetworkConfig
from simulator.collectives.registry import check_dimensions, check_supported, parse_algorithm
from simulator.config import SystemConfig
from simulator.node_table import node_table
from workload.errors import InputError, TraceError
from workload.graph import TraceGraph
from workload.schema import NodeType
from workload.traceset import TraceSet

if TYPE_CHECKING:
    from compute.devices import Device
    from simulator.collectives.hardware import HardwareProfile

COLLECTIVE_NAMES = {0: "all_reduce", 2: "all_gather", 7: "reduce_scatter", 6: "all_to_all"}
COMPUTE_MODELS = ("roofline", "kernels")
# the attributes check_workload reads: a variant trace (workload/variants.py) that differs from its template in
# none of them needs no check of its own
_CHECKED_ATTRIBUTES = frozenset(("is_cpu_op", "comm_type", "num_ops", "tensor_size", "involved_dim"))


@dataclass(frozen=True, slots=True)
class ComputeModel:
    """How GPU compute nodes are timed in a run: by recorded durations, by a roofline model, or by the kernel
    model (``kernels``: compute/kernels.py, with the roofline of the same device for reference)."""

    roofline: Roofline | None
    device: str | None  # the preset whose figures the roofline uses, if any
    kernels: KernelModel | None = None
    hardware: Device | None = None  # that preset, when a device (not a system file's figures) times compute

    def summary(self) -> dict[str, Any]:
        """The effective compute configuration, as recorded with results."""
        if self.roofline is None:
            return {"model": "durations", "device": None, "peak_tflops": None, "memory_bw_GBps": None}
        out = {"model": "kernels" if self.kernels else "roofline", "device": self.device,
               "peak_tflops": self.roofline.peak_flops / 1e12, "memory_bw_GBps": self.roofline.memory_bytes_per_s / 1e9}
        if self.kernels is not None:
            out["calibration"] = self.kernels.device.calibrated
            if self.kernels.device.path:
                out["device_file"] = self.kernels.device.path
        return out


def compute_model(system: SystemConfig, device_name: str | None, model: str = "roofline") -> ComputeModel:
    """The compute model the system config (or a device) asks for. A device named on the command line
    (``device_name``) turns the roofline model on: that is what naming one asks for; ``model`` "kernels" times
    compute nodes by operator and shape on that device instead."""
    if model not in COMPUTE_MODELS:
        raise InputError(f"unknown compute model {model!r}; valid: {', '.join(COMPUTE_MODELS)}")
    if model == "kernels" and not system.replay_only:
        from compute.devices import device, device_names  # device presets: imported when a run names one

        name = device_name or system.device
        if not name:
            raise InputError("the kernels compute model needs a device: --device NAME or a device file (.yml); "
                             f"shipped: {', '.join(device_names())}")
        d = device(name)
        return ComputeModel(Roofline(d.peak_tflops * 1e12, d.memory_bw_GBps * 1e9), d.name, KernelModel(d), d)
    if system.replay_only or not (system.roofline_enabled or device_name):
        return ComputeModel(None, None)
    peak, bw = system.peak_perf_tflops, system.local_mem_bw_GBps
    name = device_name or system.device
    preset = None
    if name:
        from compute.devices import device

        preset = device(name)
        peak, bw, name = preset.peak_tflops, preset.memory_bw_GBps, preset.name
    if not peak or not bw:
        raise InputError(f"{system.path}: roofline-enabled needs 'peak-perf' (TFLOP/s) and 'local-mem-bw' (GB/s, "
                         "GB = 10^9 B), or a device preset (--device or \"device\")")
    return ComputeModel(Roofline(peak * 1e12, bw * 1e9), name, hardware=preset)


def _roofline_way_out(system: SystemConfig) -> str:
    """How to replay recorded durations instead: what turned the roofline model on is what to undo."""
    if system.roofline_enabled:
        return f"or set roofline-enabled to 0 in {system.path} to replay durations"
    return ("--device turns the roofline model on: leave it out to replay the recorded durations, or add "
            "--compute-model kernels, which replays nodes without them")


def check_workload(graphs: Sequence[TraceGraph], traces: TraceSet, system: SystemConfig, network: NetworkConfig,
                   compute: ComputeModel, strict: bool, warn: Callable[[str], None]) -> None:
    """Refuse what would fail part-way; warn (or, ``strict``, refuse) where compute cannot be timed."""
    needs: set[int] = set()
    untimed = _Untimed()
    estimated = NodeTimes([])
    example_path = ""
    total_compute = 0
    seen: set[int] = set()
    short: list[str] = []  # collectives whose involved_dim names fewer dimensions than the network has
    counted: dict[int, tuple[int, int]] = {}  # a graph's untimed nodes (and those with FLOPs), as counted
    slower = _SlowerPrecision(compute)
    for r, graph in enumerate(graphs):
        if id(graph) in seen:
            continue
        seen.add(id(graph))
        variant = graph.variant
        if (variant is not None and id(variant.template) in counted and compute.kernels is None
                and not variant.attributes & _CHECKED_ATTRIBUTES):  # checked as its template, counted alike
            count, with_flops = counted[id(variant.template)]
            untimed.count += count
            untimed.with_flops += with_flops
            continue
        before = (untimed.count, untimed.with_flops)
        try:
            t = node_table(graph)
        except TraceError as e:
            raise e.located(path=traces.file_for(r), rank=r) from None
        for i, flags in t.involved_dim.items():
            if len(flags) < network.num_dims and not short:
                short.append(f"{traces.file_for(r)}: node {graph.node_id(i)} ({graph.name(i)!r}): involved_dim "
                             f"{[bool(f) for f in flags]}")
        types = np.asarray(t.types)
        coll = (types == NodeType.COMM_COLL_NODE) & ~np.asarray(t.is_cpu, dtype=bool)
        needs.update(np.asarray(t.comm_type)[coll].tolist())
        gpu_compute = is_gpu_compute(types, np.asarray(t.is_cpu, dtype=bool))
        slower.add(graph, traces.file_for(r), gpu_compute)
        if compute.kernels is not None:
            times = node_times(graph, compute.kernels, gpu_compute, t.num_ops, t.tensor_size,
                               np.asarray(t.has_num_ops) | np.asarray(t.has_tensor_size))
            total_compute += int(np.count_nonzero(gpu_compute))
            estimated.estimated.update(times.estimated)
            estimated.replayed += times.replayed
            if times.example and not estimated.example:
                estimated.example, example_path = times.example, traces.file_for(r)
            no_duration = gpu_compute & (graph.duration_micros == 0) & ~(np.asarray(t.has_num_ops)
                                                                          | np.asarray(t.has_tensor_size))
            untimed.add(graph, traces.file_for(r), no_duration, flops=None)
        elif compute.roofline is not None:
            lacking = np.flatnonzero(gpu_compute & ~(np.asarray(t.has_num_ops) & np.asarray(t.has_tensor_size)))
            if lacking.size:
                i = int(lacking[0])
                raise InputError(f"{traces.file_for(r)}: rank {r}: node {graph.node_id(i)} ({graph.name(i)!r}): the "
                                 "roofline model needs 'num_ops' and 'tensor_size' on GPU compute nodes "
                                 f"({_roofline_way_out(system)})")
            untimed.add(graph, traces.file_for(r), gpu_compute & (np.asarray(t.tensor_size) == 0)
                        & (np.asarray(t.num_ops) > 0), flops=None)
        else:
            no_duration = gpu_compute & (graph.duration_micros == 0)
            untimed.add(graph, traces.file_for(r), no_duration, flops=no_duration & (np.asarray(t.num_ops) > 0))
        counted[id(graph)] = (untimed.count - before[0], untimed.with_flops - before[1])
    if short:
        warn(f"{short[0]} names fewer dimensions than the network's {network.num_dims}: as in ASTRA-sim 2.x (which "
             "reads past the list), the missing dimensions are not involved; list every dimension to be explicit")
    if slower.count:
        warn(slower.message())
    kernel_message = describe(estimated, total_compute, example_path)
    if kernel_message:
        if strict:
            raise InputError(kernel_message + " (refused under --strict)")
        warn(kernel_message)
    message = untimed.message(compute.roofline is not None and compute.kernels is None, system.replay_only)
    if message:
        if strict:
            raise InputError(message + " (refused under --strict)")
        warn(message)
    if not system.replay_only:
        _check_algorithms(needs, system, network, warn)


def check_same_gpu(device: Device, profile: HardwareProfile, warn: Callable[[str], None]) -> None:
    """Warn when the device timing compute and the hardware profile timing collectives are different GPUs."""
    from compute.devices import device as named_device
    from compute.devices import device_names, same_gpu
    from simulator.collectives.hardware import load_profile, profile_names

    if same_gpu(device, profile.gpu):
        return
    names = [n for n in profile_names() if same_gpu(device, load_profile(n).gpu)]
    theirs = [n for n in device_names() if same_gpu(named_device(n), profile.gpu)]
    fix = (f"--hw-profile {' or '.join(names)}" if names else f"a hardware profile of {device.name} GPUs") + \
        (f", or --device {theirs[0]}" if theirs else f", or a device file of the {profile.gpu}")
    warn(f"--device {device.name} and --hw-profile {profile.name} name different GPUs ({device.name} and "
         f"{profile.gpu}): compute is timed on the {device.name}, collectives on {profile.name}'s {profile.gpu}; "
         f"for one machine give {fix}")


class _SlowerPrecision:
    """GPU compute nodes in a precision the run's device lacks (FP8 on an A100), which run at its BF16 rate."""

    def __init__(self, compute: ComputeModel) -> None:
        self.device = compute.hardware
        self.kernels = compute.kernels is not None
        self.count = 0
        self.dtypes: set[str] = set()
        self.example = ""

    def add(self, graph: TraceGraph, path: str, gpu_compute: np.ndarray) -> None:
        d = self.device
        if d is None or not graph.attrs.has("dtype"):
            return
        # a quantization kernel's dtype is the precision it casts to, not math it runs: it is timed the same anywhere
        classes = graph.attrs.strings("op_class", strict=False) if graph.attrs.has("op_class") else {}
        for i, dtype in graph.attrs.strings("dtype", strict=False).items():
            if dtype in DTYPES and not d.has(dtype) and gpu_compute[i] and classes.get(i) != "quantize":
                self.count += 1
                self.dtypes.add(dtype)
                if not self.example:
                    self.example = f"e.g. {path}: node {graph.node_id(i)} ({graph.name(i)!r})"

    def message(self) -> str:
        d = self.device
        assert d is not None
        names = "/".join(sorted(x.upper() for x in self.dtypes))
        rate = d.math_dtype(sorted(self.dtypes)[0]).upper()
        example = "B200" if self.dtypes & {"fp4", "mxfp8"} else "H100"
        better = f"--device NAME of a GPU with it (e.g. --device {example})"
        if not self.kernels:
            better += " and --compute-model kernels (the roofline model times every node at the BF16 peak)"
        return (f"--device {d.name} has no {names} math: {self.count} GPU compute node(s) in {names} ({self.example}) "
                f"run at its {rate} rate; to time them in {names}, give {better}")


class _Untimed:
    """GPU compute nodes no model can time, counted over the distinct traces of a run."""

    def __init__(self) -> None:
        self.count = 0
        self.with_flops = 0
        self.example = ""

    def add(self, graph: TraceGraph, path: str, mask: np.ndarray, flops: np.ndarray | None) -> None:
        hits = np.flatnonzero(mask)
        if not hits.size:
            return
        if not self.example:
            i = int(hits[0])
            self.example = f"e.g. {path}: node {graph.node_id(i)} ({graph.name(i)!r})"
        self.count += int(hits.size)
        self.with_flops += int(np.count_nonzero(flops)) if flops is not None else 0

    def message(self, roofline: bool, replay_only: bool) -> str:
        if not self.count:
            return ""
        if roofline:
            return (f"{self.count} GPU compute node(s) have FLOPs but tensor_size 0, so the roofline model times them "
                    f"at 0 ns as ASTRA-sim does ({self.example}); give them the bytes they move")
        text = (f"{self.count} GPU compute node(s) have no recorded duration and take 1 ns each, as in ASTRA-sim "
                f"({self.example}), so the run's compute time is close to zero")
        if self.with_flops and not replay_only:
            return text + f"; {self.with_flops} of them carry FLOPs: time them with --device NAME (e.g. --device H100)"
        return text + "; they carry no FLOPs either, so only durations recorded in the trace can time them"


def _check_algorithms(needs: set[int], system: SystemConfig, network: NetworkConfig,
                      warn: Callable[[str], None]) -> None:
    for ctype in sorted(needs):
        kind = COLLECTIVE_NAMES.get(ctype)
        if not kind:
            continue
        key = f"'{kind.replace('_', '-')}-implementation'"
        if system.custom(kind) is not None:
            continue  # its ET is read (and checked) when the first such collective runs
        algorithms = system.implementation(kind)
        if not algorithms:
            raise InputError(f"{system.path}: the workload has {kind.replace('_', '-')} collectives but there is no "
                             f"{key}")
        for name in algorithms:
            check_supported(parse_algorithm(name), kind, f"{system.path}: {key}")
        check_dimensions(algorithms, network.npus_count, f"{system.path}: {key}")
        dims = network.num_dims
        if len(algorithms) < dims and not any(parse_algorithm(a).whole_network for a in algorithms):
            warn(f"{system.path}: {key} lists {len(algorithms)} algorithm(s) for a {dims}-dimensional network: as in "
                 f"ASTRA-sim, these collectives then use only dimension(s) 0..{len(algorithms) - 1}")
    if needs & {0, 7} and not system.local_mem_bw_GBps:
        raise InputError(f"{system.path}: 'local-mem-bw' (GB/s, GB = 10^9 B) is needed to charge the reductions of "
                         "all-reduce and reduce-scatter collectives")
