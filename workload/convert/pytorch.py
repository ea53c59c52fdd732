"""``astrasim-py trace convert pytorch``: PyTorch execution traces -> per-rank Chakra ET files.

Input: one host execution trace per rank (ExecutionTraceObserver JSON, plain or gzip, schemas 1.0.2 to
1.1.1), optionally with the Kineto trace torch.profiler recorded in the same session for each rank (operator
and GPU-kernel durations, the rank number). Output: ``<PREFIX>.<rank>.et`` per rank (see pytorch_build for
what becomes a node and how dependencies are drawn).

Ranks: a host trace's rank is the ``distributedInfo.rank`` of its Kineto trace when given, otherwise its
position among the inputs. Each INPUT is a file, a folder (its host traces ``*.json``/``*.json.gz``, other
JSON files such as Kineto traces are ignored) or a glob pattern; files found in a folder or through a
pattern are taken in natural order of their names (rank2 before rank10).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import os
import re
from collections.abc import Callable

from workload.collector import collector_paused
from workload.convert.pytorch_build import RankBuilder, Report, find_units, register_groups
from workload.convert.pytorch_groups import GroupTable
from workload.convert.pytorch_kineto import DeviceTrace, load_kineto, pair_traces
from workload.convert.pytorch_trace import HostTrace, load_host_trace
from workload.errors import InputError, TraceError, printable
from workload.groups import GROUPS_FILE_HELP, move_groups_to_file
from workload.writer import write_trace

Warn = Callable[[str], None]
CONVERTED_VERSION = "1.0.0"
_PEEK_BYTES = 4096


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Convert PyTorch host execution traces (torch.profiler.ExecutionTraceObserver JSON, "
                          "schemas 1.0.2-1.1.1, plain or .gz), one per rank, into <PREFIX>.<rank>.et files: "
                          "top-level operators become compute nodes, c10d/NCCL/gloo collectives and send/recv "
                          "become communication nodes, process groups become communicator groups.")
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="host traces in rank order: files, a folder (its host-trace JSON files) or a glob "
                             "pattern such as 'et/rank*.json.gz' (folders and patterns in natural name order)")
    parser.add_argument("--output", "-o", required=True, metavar="PREFIX",
                        help="output prefix: writes PREFIX.0.et, PREFIX.1.et, ...")
    parser.add_argument("--groups-file", action="store_true", help=GROUPS_FILE_HELP)
    parser.add_argument("--kineto", nargs="+", metavar="FILE",
                        help="Kineto traces (torch.profiler Chrome-trace JSON) of the same step, one per rank, "
                             "as files, a folder or a pattern: durations come from them (GPU kernel time when "
                             "they hold kernels) and ranks from their distributedInfo")


def main(args: argparse.Namespace, warn: Warn) -> None:
    paths = convert(expand_inputs(args.inputs, "host"), args.output,
                    expand_inputs(args.kineto, "kineto") if args.kineto else None, warn=warn)
    print(printable(args.output))
    if args.groups_file:
        move_groups_to_file(paths, f"{args.output}.comm_groups.json")
        print(printable(f"{args.output}.comm_groups.json"))


def convert(host_paths: list[str], prefix: str, kineto_paths: list[str] | None = None,
            warn: Warn | None = None) -> list[str]:
    """Convert one host trace per rank (with optional Kineto traces) and write ``<prefix>.<rank>.et``;
    returns the paths written, in rank order."""
    with collector_paused():
        return _convert(host_paths, prefix, kineto_paths, warn or (lambda message: None))


def _convert(host_paths: list[str], prefix: str, kineto_paths: list[str] | None, warn: Warn) -> list[str]:
    hosts = [load_host_trace(p) for p in host_paths]
    devices: list[DeviceTrace | None] = [None] * len(hosts)
    if kineto_paths:
        paired = pair_traces(hosts, [load_kineto(p) for p in kineto_paths])
        hosts, devices = _rank_order(hosts, paired)
    world = len(hosts)
    _check_world_size(hosts, warn)
    groups = GroupTable(world)
    for host, device in zip(hosts, devices, strict=True):
        groups.add_config(host.process_groups, host.path)
        if device is not None:
            groups.add_config(device.process_groups, device.path)
    units = [find_units(h) for h in hosts]
    for host, rank_units in zip(hosts, units, strict=True):
        register_groups(rank_units, groups, host.path)
    report = Report()
    traces = []
    for rank, (host, rank_units, device) in enumerate(zip(hosts, units, devices, strict=True)):
        try:
            traces.append(RankBuilder(rank, host, rank_units, device, groups, report).build())
        except TraceError as e:
            raise e.located(path=host.path, rank=rank) from None
    for rank, nodes in enumerate(traces):
        if not nodes:
            warn(f"{hosts[rank].path}: rank {rank} has no operator to convert")
    for line in report.warnings(world):
        warn(line)
    directory = os.path.dirname(prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)
    paths = []
    for rank, (host, nodes) in enumerate(zip(hosts, traces, strict=True)):
        path = f"{prefix}.{rank}.et"
        write_trace(path, nodes, version=CONVERTED_VERSION,
                    metadata={"schema": host.schema, "source": os.path.basename(host.path), "rank": rank})
        paths.append(path)
    return paths


def _check_world_size(hosts: list[HostTrace], warn: Warn) -> None:
    """Warn when the default process group says the job had more ranks than host traces were given."""
    for host in hosts:
        for entry in host.process_groups:
            size = entry.get("group_size")
            default = str(entry.get("pg_name")) == "0" or entry.get("pg_desc") == "default_pg"
            if default and isinstance(size, int) and size != len(hosts):
                warn(f"{host.path}: recorded in a job of {size} ranks, but {len(hosts)} host trace(s) were given: "
                     f"the output has {len(hosts)} rank(s); give one host trace per rank, or run one converted "
                     "file on every NPU (--workload PREFIX.0.et) if the ranks are alike")
                return


def _rank_order(hosts: list[HostTrace], devices: list[DeviceTrace]
                ) -> tuple[list[HostTrace], list[DeviceTrace | None]]:
    """Reorder (host, Kineto) pairs by the ranks the Kineto traces state, if they all state one."""
    ranks = [d.rank for d in devices]
    for d in devices:
        if d.world_size is not None and d.world_size != len(hosts):
            raise InputError(f"{d.path}: recorded with {d.world_size} ranks, but {len(hosts)} host traces were "
                             "given (give one per rank)")
    if any(r is None for r in ranks):
        return hosts, list(devices)
    if sorted(ranks) != list(range(len(hosts))):  # type: ignore[type-var]
        raise InputError(f"the Kineto traces' ranks are {ranks}: expected each of 0..{len(hosts) - 1} once")
    order = sorted(range(len(hosts)), key=lambda i: ranks[i])  # type: ignore[arg-type, return-value]
    return [hosts[i] for i in order], [devices[i] for i in order]


def expand_inputs(items: list[str], kind: str) -> list[str]:
    """Files as given; folders and glob patterns as the matching trace files in natural order."""
    paths: list[str] = []
    for item in items:
        if os.path.isdir(item):
            found = [os.path.join(item, f) for f in os.listdir(item) if f.endswith((".json", ".json.gz"))]
            found = [f for f in found if os.path.isfile(f) and _looks_like(f) == kind]
            if not found:
                raise InputError(f"{item}: the folder holds no {_KINDS[kind]} (*.json or *.json.gz)")
            paths.extend(sorted(found, key=_natural_key))
        elif os.path.exists(item):
            paths.append(item)
        elif glob.has_magic(item):
            found = sorted((f for f in glob.glob(item) if os.path.isfile(f)), key=_natural_key)
            if not found:
                raise InputError(f"{item}: no file matches this pattern")
            paths.extend(found)
        else:
            raise InputError(f"{item}: no such file or folder")
    return paths


_KINDS = {"host": "PyTorch host execution traces", "kineto": "Kineto traces"}


def _looks_like(path: str) -> str | None:
    """'host' or 'kineto' from the first bytes of a JSON file, None when neither."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            text = f.read(_PEEK_BYTES).decode("utf-8", "replace")
    except (OSError, EOFError):
        return None
    if re.search(r'"traceEvents"|"schemaVersion"', text):
        return "kineto"
    if re.search(r'"schema"\s*:', text) or '"nodes"' in text:
        return "host"
    return None


def _natural_key(path: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]
