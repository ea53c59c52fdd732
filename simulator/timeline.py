"""Timelines in the Chrome Trace Event format, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

One process per rank (one per node, holding its ranks, when the network has several dimensions: dimension 0
is taken as the NPUs of a node), with tracks for compute, CPU, communication, receives and memory; one slice
per Chakra node carrying its name, type, size, algorithm and id; optionally every chunk-stream phase of the
collectives; send/receive pairs drawn as flow arrows; link utilisation as counters when the backend has
links. Timestamps are in microseconds, as those viewers expect. About 200 bytes per node per rank.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from simulator.breakdown import busy_fractions
from workload.schema import CollectiveType, NodeType

TRACKS = {"compute": 1, "cpu": 2, "communication": 3, "receives": 4, "memory": 5, "other": 6}
_COLLECTIVE_NAMES = {t.value: t.name.lower() for t in CollectiveType}


def parse_ranks(spec: str, num_ranks: int, strict: bool = False) -> list[int]:
    """"0-3,8,12-13" -> [0, 1, 2, 3, 8, 12, 13]; "all" -> every rank. Ranks outside 0..num_ranks-1 are left out,
    or (``strict``) refused, as is a part that names no rank ("5-2"), so that a typo never draws an empty timeline."""
    if spec == "all":
        return list(range(num_ranks))
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"not a rank list: {spec!r} (use e.g. 0-3,8)") from None
        if strict and (a > b or a < 0 or b >= num_ranks):
            raise ValueError(f"{part!r} in {spec!r}: not a rank range within 0-{num_ranks - 1}")
        out.update(r for r in range(a, b + 1) if 0 <= r < num_ranks)
    return sorted(out)


def _track(ntype: int, is_cpu: bool) -> str:
    if ntype == NodeType.COMP_NODE:
        return "cpu" if is_cpu else "compute"
    if ntype == NodeType.COMM_RECV_NODE:
        return "receives"
    if ntype in (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE):
        return "cpu" if is_cpu else "communication"
    if ntype in (NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE):
        return "memory"
    return "other"


class _Builder:
    def __init__(self, npus_per_dim: tuple[int, ...]) -> None:
        self.events: list[dict[str, Any]] = []
        self.by_node = len(npus_per_dim) > 1
        self.per_node = npus_per_dim[0]
        self.named: set[tuple[int, int]] = set()

    def where(self, rank: int, track: int) -> tuple[int, int]:
        if self.by_node:
            return rank // self.per_node, rank * 100 + track
        return rank, track

    def name(self, rank: int, track: int, label: str) -> tuple[int, int]:
        pid, tid = self.where(rank, track)
        if (pid, -1) not in self.named:
            self.named.add((pid, -1))
            pname = f"node {pid} (ranks {pid * self.per_node}-{pid * self.per_node + self.per_node - 1})" \
                if self.by_node else f"rank {rank}"
            self.events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": pname}})
            self.events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        if (pid, tid) not in self.named:
            self.named.add((pid, tid))
            tname = f"rank {rank} {label}" if self.by_node else label
            self.events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": tname}})
            self.events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                                "args": {"sort_index": tid}})
        return pid, tid


def build_timeline(workloads: list[Any], npus_per_dim: tuple[int, ...], ranks: list[int] | None = None,
                   links: dict[Any, Any] | None = None, finish_ns: int = 0, top_links: int = 16,
                   note: str = "") -> dict[str, Any]:
    """The Chrome trace document for the recorded ranks (``ranks``: a subset to include)."""
    b = _Builder(npus_per_dim)
    keep = set(ranks) if ranks is not None else None
    sends: dict[tuple[int, int, int, int], list[tuple[int, int]]] = defaultdict(list)  # key -> [(rank, ts_ns)]
    recvs: dict[tuple[int, int, int, int], list[tuple[int, int]]] = defaultdict(list)
    for w in workloads:
        if w.timeline is None or (keep is not None and w.rank not in keep):
            continue
        graph, table = w.graph, w.table
        for i, start, end in w.timeline.spans:
            ntype = table.types[i]
            track = _track(ntype, table.is_cpu[i])
            pid, tid = b.name(w.rank, TRACKS[track], track)
            args: dict[str, Any] = {"node_id": graph.node_id(i), "type": NodeType(ntype).name}
            if ntype == NodeType.COMM_COLL_NODE:
                args["collective"] = _COLLECTIVE_NAMES.get(table.comm_type[i], table.comm_type[i])
                args["size_bytes"] = table.comm_size[i]
                args["group"] = table.pg_name.get(i, "") or "all"
            elif ntype in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
                args.update(size_bytes=table.comm_size[i], tag=table.comm_tag[i])
            elif ntype in (NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE):
                args["size_bytes"] = table.tensor_size[i]
            b.events.append({"name": graph.name(i) or NodeType(ntype).name, "cat": track, "ph": "X",
                             "ts": start / 1000, "dur": (end - start) / 1000, "pid": pid, "tid": tid, "args": args})
        spans = {i: (s, e) for i, s, e in w.timeline.spans}
        for i, dst, tag, size in w.timeline.sends:
            sends[(w.rank, dst, tag, size)].append((w.rank, spans.get(i, (0, 0))[0]))
        for i, src, tag, size in w.timeline.recvs:
            recvs[(src, w.rank, tag, size)].append((w.rank, spans.get(i, (0, 0))[1]))
        for node, stream, step, kind, name, dim, queue, start, end in w.system.phase_log or ():
            pid, tid = b.name(w.rank, 10 + queue, f"queue {queue} chunk-streams")
            b.events.append({"name": f"{kind} {name} dim {dim}", "cat": "phase", "ph": "X", "ts": start / 1000,
                             "dur": (end - start) / 1000, "pid": pid, "tid": tid,
                             "args": {"node_id": graph.node_id(node) if node >= 0 else None, "stream": stream,
                                      "phase": step, "dimension": dim, "queue": queue}})
    flow = 0
    for key, sent in sends.items():  # the n-th send of a key meets the n-th receive of that key
        for (src, t_send), (dst, t_recv) in zip(sent, recvs.get(key, ()), strict=False):
            flow += 1
            spid, stid = b.where(src, TRACKS["communication"])
            rpid, rtid = b.where(dst, TRACKS["receives"])
            b.events.append({"name": "send", "cat": "p2p", "ph": "s", "id": flow, "ts": t_send / 1000,
                             "pid": spid, "tid": stid})
            b.events.append({"name": "send", "cat": "p2p", "ph": "f", "bp": "e", "id": flow, "ts": t_recv / 1000,
                             "pid": rpid, "tid": rtid})
    if links and finish_ns:
        busiest = sorted(links.values(), key=lambda link: -link.busy_ns)[:top_links]
        pid = -1
        b.events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": "network links"}})
        for link in busiest:
            name = f"link {link.name}"
            bins = 200
            for k, value in enumerate(busy_fractions(link.history or [], finish_ns, bins)):
                b.events.append({"name": name, "ph": "C", "ts": k * finish_ns / bins / 1000, "pid": pid,
                                 "args": {"utilization": value}})
    return {"traceEvents": b.events, "displayTimeUnit": "ns",
            "otherData": {"generator": "astrasim-py", "note": note}}


def write_timeline(path: str, document: dict[str, Any]) -> int:
    """Write the document compactly; returns its size in bytes."""
    text = json.dumps(document, separators=(",", ":"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return len(text)
