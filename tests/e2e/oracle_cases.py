"""Deterministic random ASTRA-sim cases for the regression suite in test_oracle_cases.py.

``build_case(seed, folder)`` writes per-rank traces and ASTRA-sim config files for one case; the same seed
always gives the same case. Keep this generator unchanged: oracle_expected.json holds, per seed, the
per-rank results that ASTRA-sim 2.x itself printed for exactly these files.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from workload.schema import NodeType
from workload.tools.generate import write_rank_traces
from workload.writer import make_node


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


def _network(rng: random.Random, aware: bool) -> dict[str, list[Any]]:
    ndims = 1 if aware else rng.choice([1, 1, 2, 2, 3])
    while True:
        counts = [rng.choice([2, 3, 4, 4, 5, 8, 8, 16]) for _ in range(ndims)]
        if math.prod(counts) <= 64:
            break
    return {"topology": [rng.choice(["Ring", "FullyConnected", "Switch"]) for _ in range(ndims)],
            "npus_count": counts,
            "bandwidth": [rng.choice([12.5, 25.0, 50.0, 100.0, 200.0, 400.0, 37.3]) for _ in range(ndims)],
            "latency": [rng.choice([0.0, 1.0, 100.0, 500.0, 936.25, 1000.0, 17.7]) for _ in range(ndims)]}


def _algorithms(rng: random.Random, counts: list[int], kind: str) -> list[str]:
    if rng.random() < 0.12:
        options = ["oneRing", "oneDirect"] + (["oneHalvingDoubling"] if _pow2(math.prod(counts)) and kind != "a2a"
                                              else [])
        return [rng.choice(options)] * len(counts)
    out = []
    for c in counts:
        options = ["ring", "ring", "direct", f"direct{rng.randint(1, 4)}"]
        if _pow2(c) and kind != "a2a":
            options.append("halvingDoubling")
        if _pow2(c) and kind == "ar":
            options.append("doubleBinaryTree")
        out.append(rng.choice(options))
    if rng.random() < 0.1 and len(counts) > 1:
        out = out[: rng.randint(1, len(counts) - 1)]
    return out


def _system(rng: random.Random, counts: list[int], roofline: bool) -> dict[str, Any]:
    s: dict[str, Any] = {
        "scheduling-policy": rng.choice(["LIFO", "LIFO", "FIFO", "EXPLICIT"]),
        "collective-optimization": rng.choice(["localBWAware", "localBWAware", "baseline"]),
        "active-chunks-per-dimension": rng.choice([1, 1, 1, 2, 3, 4]),
        "preferred-dataset-splits": rng.choice([1, 2, 4, 4, 8, 3]),
        "all-reduce-implementation": _algorithms(rng, counts, "ar"),
        "all-gather-implementation": _algorithms(rng, counts, "ag"),
        "reduce-scatter-implementation": _algorithms(rng, counts, "rs"),
        "all-to-all-implementation": _algorithms(rng, counts, "a2a"),
        "local-mem-bw": rng.choice([1600, 3350, 50, 1000.5]),
    }
    if rng.random() < 0.85:
        s["endpoint-delay"] = rng.choice([0, 1, 10, 10, 25, 100])
    if roofline:
        s["roofline-enabled"] = 1
        s["peak-perf"] = rng.choice([100, 700, 989.4])
    if rng.random() < 0.05:
        s["replay-only"] = 1
    return s


def _collective(ctype: int, size: int, pg: str | None = None, involved: list[bool] | None = None,
                priority: int | None = None) -> list[tuple[str, Any]]:
    attrs: list[tuple[str, Any]] = [("is_cpu_op", False), ("comm_type", ctype), ("comm_size", size)]
    if pg is not None:
        attrs.append(("pg_name", pg))
    if involved is not None:
        attrs.append(("involved_dim", involved))
    if priority is not None:
        attrs.append(("comm_priority", priority))
    return attrs


def _symmetric(rng: random.Random, npus: int, ndims: int, roofline: bool, memory: bool) -> list[list[Any]]:
    nodes = []
    for i in range(rng.randint(1, 7)):
        r = rng.random()
        deps = sorted(set(rng.sample(range(i), k=min(i, rng.randint(0, 2))))) if i else []
        if r < 0.55:
            size = rng.choice([1 << 20, 1 << 16, 12345, 1000, 3 << 18, 64, 0, 7]) if rng.random() < 0.9 else \
                rng.randint(1, 5_000_000)
            involved = [rng.random() < 0.8 for _ in range(ndims)] if rng.random() < 0.2 else None
            priority = rng.randint(0, 5) if rng.random() < 0.5 else None
            nodes.append(make_node(i, f"c{i}", NodeType.COMM_COLL_NODE, data_deps=deps,
                                   attrs=_collective(rng.choice([0, 0, 2, 7, 6]), size, None, involved, priority)))
        elif r < 0.85:
            attrs: list[tuple[str, Any]] = [("is_cpu_op", rng.random() < 0.15)]
            if roofline:
                attrs += [("num_ops", rng.choice([10**9, 10**6, 12345678, 1])),
                          ("tensor_size", rng.choice([10**6, 10**8, 1, 0, 4096]))]
            nodes.append(make_node(i, f"p{i}", NodeType.COMP_NODE, data_deps=deps,
                                   duration_micros=rng.choice([0, 1, 5, 50, 300]), attrs=attrs))
        elif r < 0.93 and memory:
            nodes.append(make_node(i, f"m{i}", rng.choice([NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE]),
                                   data_deps=deps,
                                   attrs=[("is_cpu_op", False), ("tensor_size", rng.choice([1 << 20, 4096, 777]))]))
        else:
            extra = [("num_ops", 5), ("tensor_size", 100)] if roofline else []
            nodes.append(make_node(i, f"i{i}", rng.choice([NodeType.INVALID_NODE, NodeType.COMP_NODE]),
                                   data_deps=deps, duration_micros=3, attrs=[("is_cpu_op", False), *extra]))
    return [list(nodes) for _ in range(npus)]


def _sendrecv(rng: random.Random, npus: int) -> list[list[Any]]:
    iterations, size, shift = rng.randint(1, 3), rng.choice([1 << 20, 4096, 100000]), rng.randint(1, npus - 1)
    traces = []
    for r in range(npus):
        nodes: list[Any] = []
        previous: list[int] = []
        for k in range(iterations):
            base = 3 * k
            nodes += [
                make_node(base, "s", NodeType.COMM_SEND_NODE, data_deps=previous, attrs=[
                    ("is_cpu_op", False), ("comm_dst", (r + shift) % npus), ("comm_size", size), ("comm_tag", k)]),
                make_node(base + 1, "r", NodeType.COMM_RECV_NODE, data_deps=previous, attrs=[
                    ("is_cpu_op", False), ("comm_src", (r - shift) % npus), ("comm_size", size), ("comm_tag", k)]),
                make_node(base + 2, "c", NodeType.COMP_NODE, data_deps=[base + 1],
                          duration_micros=rng.choice([0, 2, 10]), attrs=[("is_cpu_op", False)]),
            ]
            previous = [base, base + 2]
        traces.append(nodes)
    return traces


def _groups(rng: random.Random, npus: int) -> tuple[list[list[Any]], dict[str, list[int]]]:
    ranks = list(range(npus))
    rng.shuffle(ranks)
    size = rng.choice([d for d in range(2, npus + 1) if npus % d == 0])
    groups = {str(g + 1): ranks[g * size:(g + 1) * size] for g in range(npus // size)}
    plan = [(rng.choice([0, 2, 7, 6]), rng.choice([1 << 20, 65536, 5000])) for _ in range(rng.randint(1, 4))]
    traces: list[list[Any]] = [[] for _ in range(npus)]
    for gid, members in groups.items():
        for r in members:
            for i, (ctype, nbytes) in enumerate(plan):
                traces[r].append(make_node(i, f"g{i}", NodeType.COMM_COLL_NODE, data_deps=[i - 1] if i else [],
                                           attrs=_collective(ctype, nbytes, gid)))
    if rng.random() < 0.4:  # declare the groups in a METADATA node instead of the JSON file
        text = json.dumps([{"pg_name": g, "ranks": m} for g, m in groups.items()])
        for nodes in traces:
            for n in nodes:
                n.id += 1
                n.data_deps[:] = [d + 1 for d in n.data_deps] or [0]
            nodes.insert(0, make_node(0, "pg", NodeType.METADATA_NODE, attrs=[("is_cpu_op", False)],
                                      inputs={"values": str([text]), "shapes": "", "types": ""}))
        groups = {}
    return traces, groups


def build_case(seed: int, folder: Path) -> dict[str, Any]:
    """Write case ``seed`` into ``folder``; returns its run settings (backend, rendezvous, queues, scale)."""
    rng = random.Random(seed)
    aware = rng.random() < 0.35
    net = _network(rng, aware)
    npus = math.prod(net["npus_count"])
    kind = rng.choices(["sym", "sendrecv", "groups"], [0.7, 0.15, 0.15])[0]
    roofline = kind == "sym" and rng.random() < 0.2
    memory = kind == "sym" and rng.random() < 0.2
    system = _system(rng, net["npus_count"], roofline)
    mem: dict[str, Any] = {"memory-type": "NO_MEMORY_EXPANSION"}
    if memory:
        mtype = rng.choice(["PER_NPU_MEMORY_EXPANSION", "PER_NODE_MEMORY_EXPANSION", "MEMORY_POOL"])
        mem = {"memory-type": mtype, "remote-mem-latency": rng.choice([0, 100, 1000]),
               "remote-mem-bw": rng.choice([1, 50, 1000])}
        if mtype == "PER_NODE_MEMORY_EXPANSION":
            per = rng.choice([d for d in range(1, npus + 1) if npus % d == 0])
            mem.update({"num-nodes": npus // per, "num-npus-per-node": per})
    groups: dict[str, list[int]] = {}
    if kind == "sym":
        traces = _symmetric(rng, npus, len(net["npus_count"]), roofline, memory)
    elif kind == "sendrecv":
        traces = _sendrecv(rng, npus)
    else:
        traces, groups = _groups(rng, npus)
    (folder / "workload").mkdir(parents=True, exist_ok=True)
    write_rank_traces(str(folder / "workload" / "trace"), traces)
    (folder / "network.yml").write_text("".join(f"{k}: [ {', '.join(str(x) for x in net[k])} ]\n"
                                                for k in ("topology", "npus_count", "bandwidth", "latency")))
    (folder / "system.json").write_text(json.dumps(system, indent=1))
    (folder / "memory.json").write_text(json.dumps(mem))
    if groups:
        (folder / "comm_groups.json").write_text(json.dumps(groups))
    return {"backend": "analytical-aware" if aware else "analytical-unaware",
            "rendezvous": rng.random() < 0.15, "queues": rng.choice([1, 1, 1, 2, 3]),
            "injection": rng.choice([1.0, 1.0, 2.0, 0.5])}
