"""Timing from a Kineto trace (the Chrome-trace JSON torch.profiler exports) linked to a host trace.

Host operators appear in Kineto as complete events (``ph: "X"``) whose ``args`` carry the operator's
``Record function id`` (the host trace's ``rf_id``) and an ``External id``. Device work (``cat`` kernel,
gpu_memcpy, gpu_memset) carries the ``External id`` of the operator that launched it, directly or through
the runtime call it shares a ``correlation`` with. ``distributedInfo`` holds the rank, world size and
process groups.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workload.convert.pytorch_trace import DEVICE_CATEGORIES, HostTrace, duration_us, read_json
from workload.errors import InputError

MIN_MATCHED_FRACTION = 0.5  # of the host operators with an rf_id, how many Kineto must know


@dataclass(slots=True, eq=False)
class DeviceTrace:
    """What a Kineto trace says about one rank's operators, by record-function id."""

    path: str
    pid: int | None
    rank: int | None
    world_size: int | None
    process_groups: list[dict[str, Any]]
    host_us: dict[int, float] = field(default_factory=dict)  # rf_id -> the operator's host duration
    names: dict[int, str] = field(default_factory=dict)  # rf_id -> operator name
    device_us: dict[int, float] = field(default_factory=dict)  # rf_id -> device time it launched itself
    device_events: int = 0


def parse_kineto(doc: Any, path: str) -> DeviceTrace:
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        hint = " (this is a host execution trace: pass it as INPUT)" \
            if isinstance(doc, dict) and "nodes" in doc else ""
        raise InputError(f"{path}: not a Kineto trace: expected a JSON object with a 'traceEvents' list{hint}")
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank, world = info.get("rank"), info.get("world_size")
    config = info.get("pg_config")
    groups = [g for g in config if isinstance(g, dict)] if isinstance(config, list) else []
    trace = DeviceTrace(path, None, rank if isinstance(rank, int) else None,
                        world if isinstance(world, int) else None, groups)
    external_to_rf: dict[int, int] = {}
    correlation_to_external: dict[int, int] = {}
    device: list[tuple[dict[str, Any], float]] = []
    pids: Counter[int] = Counter()
    for ev in doc["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        dur_us = duration_us(ev.get("dur"))
        category = str(ev.get("cat", "")).lower()
        if category in DEVICE_CATEGORIES:
            device.append((args, dur_us))
            continue
        rf = args.get("Record function id")
        external = args.get("External id")
        if isinstance(rf, int):
            trace.host_us[rf] = dur_us
            trace.names[rf] = str(ev.get("name", ""))
            if isinstance(external, int):
                external_to_rf.setdefault(external, rf)
            if isinstance(ev.get("pid"), int):
                pids[ev["pid"]] += 1
        elif isinstance(external, int) and isinstance(args.get("correlation"), int):
            correlation_to_external[args["correlation"]] = external  # a runtime launch call
    for args, dur_us in device:
        external = args.get("External id")
        correlation = args.get("correlation")
        if not isinstance(external, int) and isinstance(correlation, int):
            external = correlation_to_external.get(correlation)
        rf = external_to_rf.get(external) if isinstance(external, int) else None
        if rf is not None:
            trace.device_us[rf] = trace.device_us.get(rf, 0.0) + dur_us
    trace.device_events = len(device)
    trace.pid = pids.most_common(1)[0][0] if pids else None
    return trace


def load_kineto(path: str) -> DeviceTrace:
    return parse_kineto(read_json(path, "Kineto trace"), path)


def check_match(device: DeviceTrace, host: HostTrace) -> None:
    """Refuse a Kineto trace recorded in another process or another window than the host trace."""
    if device.pid is not None and host.pid is not None and device.pid != host.pid:
        raise InputError(f"{device.path}: this Kineto trace is of process {device.pid} but host trace "
                         f"{host.path} is of process {host.pid}: they do not belong together")
    with_rf = [n for n in host.nodes.values() if n.is_operator() and n.rf_id is not None]
    if not with_rf:
        return
    matched = sum(1 for n in with_rf if device.names.get(n.rf_id) == n.name)  # type: ignore[arg-type]
    if matched < MIN_MATCHED_FRACTION * len(with_rf):
        raise InputError(f"{device.path}: does not match host trace {host.path}: only {matched} of "
                         f"{len(with_rf)} operators are found in it by record-function id and name "
                         "(record both in the same torch.profiler session)")


def pair_traces(hosts: list[HostTrace], devices: list[DeviceTrace]) -> list[DeviceTrace]:
    """The Kineto trace of each host trace: by process id when every trace has a distinct one, else by
    position."""
    if len(devices) != len(hosts):
        raise InputError(f"{len(devices)} Kineto trace(s) for {len(hosts)} host trace(s): give one per host "
                         "trace, or none")
    host_pids = [h.pid for h in hosts]
    device_pids = [d.pid for d in devices]
    if None not in host_pids and None not in device_pids and len(set(host_pids)) == len(hosts) \
            and len(set(device_pids)) == len(devices):
        by_pid = {d.pid: d for d in devices}
        for d in devices:
            if d.pid not in host_pids:
                raise InputError(f"{d.path}: this Kineto trace is of process {d.pid}, which none of the host "
                                 f"traces is (their processes: {', '.join(map(str, host_pids))})")
        paired = [by_pid[h.pid] for h in hosts]
    else:
        paired = list(devices)
    for h, d in zip(hosts, paired, strict=True):
        check_match(d, h)
    return paired
