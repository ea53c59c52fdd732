"""A corpus of hostile inputs, run through the installed command; kept apart from the test suite.

    python benchmarks/fuzz_corpus.py [--jobs N] [--only SUBSTRING] [--mutations N] [--list]

Every case runs ``astrasim-py`` in a fresh subprocess with an address-space limit (2 GiB) and a time limit
(60 s), and is classified: ``ok`` (exit 0), ``error`` (exit 1, one error line), ``deadlock`` (exit 1 with
a deadlock report, only where the case expects one), or a failure: ``traceback``, ``hang`` (time limit),
``blow-up`` (memory limit or a memory error), ``messy`` (an error of several lines, or control characters
reaching the terminal) or ``wrong`` (a result that differs from the one the case knows to be right).
The families: configs of every kind with hostile values at every key, byte-mutated traces, semantically
broken traces, hostile names, resource bombs and inputs whose right answer is known. Prints counts per family
and outcome, then every failure; exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workload.schema import NodeType  # noqa: E402
from workload.tools.generate import write_rank_traces  # noqa: E402
from workload.writer import make_node  # noqa: E402

MEMORY_LIMIT = 2 << 30
TIME_LIMIT_S = 60
CONFIGS = REPO / "configs"
TRACE8 = CONFIGS / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce"
RING8 = CONFIGS / "network" / "ring_8.yml"
HOSTILE_VALUES: list[Any] = [True, False, None, 0, -1, 1, 2**31, 2**63, 2**64, 10**400, 1e308, -1e308, math.nan,
                             math.inf, -math.inf, 0.5, "", "x", "\x1b[2J\x07", "=cmd|' /C calc'!A0", "é" * 300,
                             [], {}, [1], [True], [[1, 2]], {"a": 1}, "1" * 500, -(2**63)]


@dataclass
class Case:
    family: str
    name: str
    argv: list[str]
    expect: str = "ok-or-error"  # ok-or-error | deadlock | error | ok
    check: Callable[[str], str | None] | None = None  # given stdout: None, or what is wrong
    files: dict[str, bytes] = field(default_factory=dict)  # written into the case's folder first


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_case(case: Case, root: Path, exe: list[str]) -> tuple[Case, str, str]:
    """(case, outcome, detail): outcome is ok, error, deadlock, traceback, hang, blow-up, messy or wrong."""
    folder = root / f"{case.family}-{abs(hash(case.name)) % 10**10}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    argv = [a.replace("{dir}", str(folder)) for a in case.argv]
    try:
        p = subprocess.run([*exe, *argv], capture_output=True, timeout=TIME_LIMIT_S, cwd=folder, preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        return case, "hang", f"no answer in {TIME_LIMIT_S} s"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    err, out = p.stderr.decode("utf-8", "replace"), p.stdout.decode("utf-8", "replace")
    outcome, detail = _classify(p.returncode, out, err)
    if outcome in ("ok", "error", "deadlock"):
        allowed = {"ok-or-error": ("ok", "error"), "ok-or-deadlock": ("ok", "error", "deadlock"),
                   "error": ("error",), "deadlock": ("deadlock",), "ok": ("ok",)}[case.expect]
        if outcome not in allowed:
            return case, "wrong", f"{outcome} where {case.expect} was right: {(detail or out.strip())[:300]}"
        if outcome == "ok" and case.check is not None:
            problem = case.check(out)
            if problem:
                return case, "wrong", problem
    return case, outcome, detail


def _classify(status: int, out: str, err: str) -> tuple[str, str]:
    if "Traceback" in err:
        return "blow-up" if "MemoryError" in err else "traceback", err.strip().splitlines()[-1][:300]
    if status < 0 or "out of memory" in err:
        return "blow-up", f"exit {status}: {err.strip()[-200:]}"
    if "\x1b" in err or "\x07" in err:
        return "messy", "control characters reached the terminal"
    if status == 0:
        return "ok", ""
    if status == 2 and err.startswith("usage:"):  # argparse refused an option value
        return "error", err.strip().splitlines()[-1][:200]
    if status != 1:
        return "traceback", f"exit {status}: {err.strip()[-300:]}"
    lines = [line for line in err.splitlines() if not line.startswith("astrasim-py: warning:")]
    if lines and lines[0].startswith("astrasim-py sweep:") and "failed" in err:  # failed points are rows
        return "error", [line for line in lines if "failed" in line][-1][:200]
    if not lines or not lines[0].startswith("astrasim-py: error:"):
        return "messy", err.strip()[:300]
    if "deadlock" in lines[0]:
        return "deadlock", lines[0][:200]
    return ("error", lines[0][:200]) if len(lines) == 1 else ("messy", err.strip()[:300])


# --- the corpus -----------------------------------------------------------------------------------------
def _dump(kind: str, data: Any) -> bytes:
    if kind == "yml":
        import yaml

        try:
            return yaml.safe_dump(data).encode()
        except (yaml.YAMLError, ValueError):
            return str(data).encode()
    try:
        return json.dumps(data).encode()
    except (ValueError, TypeError):
        return str(data).encode()


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path of a nested document (the places a hostile value can go)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = _replace(doc[path[0]], path[1:], value)
    return copy


def config_cases() -> Iterator[Case]:
    import yaml

    trace8 = ["--workload", str(TRACE8), "--quiet"]
    kinds = {
        "network": ("yml", yaml.safe_load(RING8.read_text()), lambda f: [*trace8, "--network", f]),
        "network-2d": ("yml", {"topology": ["Ring", "Switch"], "npus_count": [4, 2], "bandwidth": [50, 25],
                               "latency": [500, 10]}, lambda f: [*trace8, "--network", f]),
        "fabric-fat-tree": ("yml", {"fabric": "fat-tree", "npus": 8, "npus_per_leaf": 4, "spines": 2, "bandwidth": 50,
                                    "latency": 500}, lambda f: [*trace8, "--network", f]),
        "fabric-torus": ("yml", {"fabric": "torus", "dims": [2, 4], "bandwidth": [100, 50], "latency": 200},
                         lambda f: [*trace8, "--network", f]),
        "fabric-dragonfly": ("yml", {"fabric": "dragonfly", "routers_per_group": 2, "npus_per_router": 2,
                                     "global_links_per_router": 1, "groups": 2,
                                     "bandwidth": {"terminal": 100, "local": 100, "global": 50},
                                     "latency": {"terminal": 100, "local": 200, "global": 1000}},
                             lambda f: [*trace8, "--network", f]),
        "fabric-rail": ("yml", {"fabric": "rail-optimized", "nodes": 2, "gpus_per_node": 4, "nvlink_bandwidth": 450,
                                "nvlink_latency": 100, "nic_bandwidth": 50, "nic_latency": 1000},
                        lambda f: [*trace8, "--network", f]),
        "fabric-links": ("yml", yaml.safe_load((CONFIGS / "network" / "links_example.yml").read_text()),
                         lambda f: ["--workload", str(TRACE8) + ".0.et", "--network", f, "--quiet"]),
        "system": ("json", json.loads((CONFIGS / "system" / "default.json").read_text()),
                   lambda f: [*trace8, "--network", str(RING8), "--system", f]),
        "memory": ("json", json.loads((CONFIGS / "memory" / "per_node_8.json").read_text()),
                   lambda f: [*trace8, "--network", str(RING8), "--memory", f]),
        "groups": ("json", json.loads((CONFIGS / "comm_groups" / "two_halves_of_8.json").read_text()),
                   lambda f: [*trace8, "--network", str(RING8), "--comm-groups", f]),
        "packet": ("yml", yaml.safe_load((CONFIGS / "packet" / "default.yml").read_text()),
                   lambda f: [*trace8, "--network", str(RING8), "--backend", "packet", "--packet-config", f]),
        "sweep": ("yml", {"base": {"workload": {"generate": "collective", "type": "all_reduce", "size": "1MiB"},
                                   "network": {"topology": ["Ring"], "npus_count": [8], "bandwidth": [50],
                                               "latency": [500]}},
                          "axes": {"network.bandwidth": [25, 50]}},
                  lambda f: ["sweep", f, "--out", "{dir}/out", "--jobs", "1"]),
    }
    for kind, (suffix, doc, argv) in kinds.items():
        name = f"config.{suffix}"
        for path in _paths(doc):
            for value in HOSTILE_VALUES:
                bad = _replace(doc, path, value)
                yield Case("config", f"{kind} {path}={value!r:.40}", argv(f"{{dir}}/{name}"),
                           files={name: _dump(suffix, bad)})
        for value in HOSTILE_VALUES[:12]:
            if isinstance(doc, dict):
                yield Case("config", f"{kind} extra key {value!r:.30}", argv(f"{{dir}}/{name}"),
                           files={name: _dump(suffix, {**doc, str(value): value})})
        for raw in (b"", b"\xff\xfe\x00", b"[" * 50000, b"{" * 50000, b"\x00" * 1000, b"- - - -\n" * 1000,
                    b"a: &a [x,x,x,x,x,x,x,x,x]\n" + b"".join(
                        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n".encode()
                        for i in range(8))):
            yield Case("config", f"{kind} raw {raw[:12]!r}", argv(f"{{dir}}/{name}"), files={name: raw})
        yield Case("config", f"{kind} is a folder", argv("{dir}"))
        yield Case("config", f"{kind} is /dev/zero", argv("/dev/zero"))


def _mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.choice(["flip", "set", "insert", "delete", "truncate", "splice", "varint"])
        i = rng.randrange(len(out) + 1)
        if op == "flip" and out:
            out[min(i, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == "set" and out:
            out[min(i, len(out) - 1)] = rng.randrange(256)
        elif op == "insert":
            out[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == "delete":
            del out[i:i + rng.randint(1, 32)]
        elif op == "truncate":
            del out[i:]
        elif op == "splice":
            out[i:i] = out[rng.randrange(len(out) + 1):][:rng.randint(1, 200)]
        elif op == "varint":
            out[i:i] = b"\xff" * rng.randint(9, 20)
    return bytes(out)


def trace_cases(mutations: int) -> Iterator[Case]:
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-seed-"))
    try:
        subprocess.run([sys.executable, "-m", "simulator", "trace", "generate", "llm", "--preset", "gpt3-1.3b",
                        "--dp", "2", "--tp", "2", "--pp", "2", "--global-batch", "8", "--layers", "2", "-o",
                        str(tmp / "llm")], capture_output=True, cwd=REPO, check=False)
        seeds = {"allreduce": (TRACE8.with_suffix(".0.et").read_bytes(), 8, RING8)}
        llm = sorted((tmp / "llm").rglob("*.0.et"))
        if llm:
            seeds["llm"] = (llm[0].read_bytes(), 8, RING8)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rng = random.Random(1)
    for seed_name, (data, npus, network) in seeds.items():
        for k in range(mutations):
            files = {f"t/trace.{r}.et": data for r in range(npus)}
            mutated = _mutate(data, rng)
            victim = rng.choice(["one", "all"])
            for r in range(npus):
                if victim == "all" or r == 3:
                    files[f"t/trace.{r}.et"] = mutated
            common = ["--workload", "{dir}/t/trace", "--network", str(network), "--quiet"]
            expect = "ok-or-error" if victim == "all" else "ok-or-deadlock"
            yield Case("trace-bytes", f"{seed_name} mutation {k} ({victim})", common, expect=expect, files=files)
            yield Case("trace-bytes", f"{seed_name} mutation {k} jsonize", ["trace", "jsonize", "{dir}/t/trace",
                                                                           "-o", "{dir}/out.json"], files=files)
            yield Case("trace-bytes", f"{seed_name} mutation {k} inspect", ["trace", "inspect", "{dir}/t/trace"],
                       files=files)


def _et(nodes: list[Any]) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        write_rank_traces(f"{tmp}/t", [nodes])
        return Path(f"{tmp}/t.0.et").read_bytes()


def _coll(i: int, size: int, deps: list[int] | None = None, **attrs: Any) -> Any:
    return make_node(i, f"c{i}", NodeType.COMM_COLL_NODE, data_deps=deps or [],
                     attrs={"comm_type": 0, "comm_size": size, **attrs})


def _comp(i: int, micros: int, deps: list[int] | None = None, name: str | None = None, **attrs: Any) -> Any:
    return make_node(i, name or f"p{i}", NodeType.COMP_NODE, data_deps=deps or [], duration_micros=micros,
                     attrs=attrs)


def _p2p(i: int, kind: str, peer: int, size: int, tag: int, deps: list[int] | None = None) -> Any:
    node_type = NodeType.COMM_SEND_NODE if kind == "send" else NodeType.COMM_RECV_NODE
    key = "comm_dst" if kind == "send" else "comm_src"
    return make_node(i, f"{kind}{i}", node_type, data_deps=deps or [],
                     attrs=[(key, peer), ("comm_size", size), ("comm_tag", "int64_val", tag)])


def _finish(rank: int, want: int) -> Callable[[str], str | None]:
    def check(out: str) -> str | None:
        if f"sys[{rank}] finished, {want} cycles" in out:
            return None
        return f"rank {rank} should finish at {want}: {out[:300]}"
    return check


def semantic_cases() -> Iterator[Case]:
    ring2 = {"topology": ["Ring"], "npus_count": [2], "bandwidth": [50], "latency": [500]}
    net2 = ("net.yml", json.dumps(ring2).encode())
    astra = ["--format", "astra-sim", "--quiet"]

    def two(rank0: list[Any], rank1: list[Any], name: str, expect: str = "ok-or-error",
            check: Callable[[str], str | None] | None = None) -> Case:
        return Case("trace-semantic", name, ["--workload", "{dir}/t/trace", "--network", "{dir}/net.yml", *astra],
                    expect=expect, check=check,
                    files={"t/trace.0.et": _et(rank0), "t/trace.1.et": _et(rank1), net2[0]: net2[1]})

    size = 1 << 20
    message_ns = int(500 + size / (50 * (1 << 30) / 1e9))
    yield two([_p2p(0, "send", 1, size, 5), _comp(1, 3000), _p2p(2, "send", 1, size, 500_000_005, [1])],
              [_p2p(0, "recv", 0, size, 500_000_005), _p2p(1, "recv", 0, size, 5, [0])],
              "tags never alias modulo 5e8", expect="ok", check=_finish(1, 3_000_000 + message_ns))
    yield two([_comp(0, 2**63)], [_comp(0, 1)], "a 2^63 us node", expect="error")
    yield two([_comp(i, 2**62, [i - 1] if i else []) for i in range(8)], [_comp(0, 1)], "8 chained 2^62 us nodes",
              expect="error")
    limit = (2**63 - 1) // 1000
    yield two([_comp(0, limit), _comp(1, limit, [0])], [_comp(0, 1)], "the longest durations add up", expect="ok",
              check=_finish(0, 2 * limit * 1000))
    yield two([_coll(0, size)], [_coll(0, size * 2)], "mismatched collective sizes", expect="deadlock")
    yield two([_coll(0, size)], [_comp(0, 5)], "a collective one rank never issues", expect="deadlock")
    yield two([_p2p(0, "recv", 1, size, 1)], [_comp(0, 5)], "a receive nobody sends", expect="deadlock")
    yield two([_coll(0, size, [1]), _coll(1, size, [0])], [_coll(0, size)], "a dependency cycle", expect="error")
    yield two([_coll(0, size, [7])], [_coll(0, size)], "a dangling dependency", expect="error")
    yield two([_coll(0, size), _coll(0, size)], [_coll(0, size)], "duplicate node ids", expect="error")
    yield two([_comp(0, 5, name="\x1b[2J\x07evil\nname")], [_comp(0, 5)], "control characters in a name")
    yield two([_coll(0, size, pg_name="not-a-number")], [_coll(0, size)], "pg_name text", expect="error")
    yield two([_coll(0, size, pg_name="7")], [_coll(0, size, pg_name="7")], "undefined group", expect="error")
    yield two([_coll(0, size, involved_dim=[True] * 1000)], [_coll(0, size)], "1000 involved dims")
    yield two([make_node(0, "x", 99)], [_comp(0, 1)], "unknown node type", expect="error")
    yield two([_coll(0, 2**63 - 1)], [_coll(0, 2**63 - 1)], "the largest comm_size", expect="ok")
    yield two([_p2p(0, "send", 5, size, 1)], [_comp(0, 1)], "a send to a rank that does not exist", expect="error")
    yield two([_p2p(0, "send", 0, size, 1)], [_comp(0, 1)], "a send to itself", expect="error")
    # files named after impossible ranks, and bombs
    big = {"t/trace.1000000000000.et": TRACE8.with_suffix(".0.et").read_bytes()}
    yield Case("names", "rank 10^12 in a file name", ["--workload", "{dir}/t/trace", "--network", str(RING8)],
               expect="error", files=big)
    yield Case("names", "a trace name starting with = (CSV formula)",
               ["--workload", "{dir}/t/=cmd", "--network", str(RING8), "--csv", "{dir}/out", "--quiet"],
               files={f"t/=cmd.{r}.et": TRACE8.with_suffix(f".{r}.et").read_bytes() for r in range(8)})
    bomb = gzip.compress(b"\x00" * (400 << 20))
    yield Case("bombs", "a gzip bomb as a trace", ["--workload", "{dir}/t/trace", "--network", str(RING8)],
               expect="error", files={f"t/trace.{r}.et": bomb for r in range(8)})
    yield Case("bombs", "/dev/zero as the system", ["--workload", str(TRACE8), "--network", str(RING8), "--system",
                                                   "/dev/zero"], expect="error")
    huge_sweep = {"s.yml": json.dumps({
        "base": {"workload": {"generate": "collective", "type": "all_reduce", "size": "1MiB"}, "network": str(RING8)},
        "axes": {"network.latency[0]": list(range(1000)), "network.bandwidth": list(range(1, 1001)),
                 "system.preferred-dataset-splits": list(range(1, 1001))}}).encode()}
    yield Case("bombs", "a 10^9-point sweep, dry run (counts, shows a few)",
               ["sweep", "{dir}/s.yml", "--out", "{dir}/o", "--dry-run"], expect="ok", files=huge_sweep)
    yield Case("bombs", "a 10^9-point sweep", ["sweep", "{dir}/s.yml", "--out", "{dir}/o"], expect="error",
               files=huge_sweep)
    yield Case("bombs", "a fat-tree of radix 10^4", ["--workload", str(TRACE8), "--network", "{dir}/n.yml"],
               expect="error", files={"n.yml": b"fabric: fat-tree\nk: 10000\nbandwidth: 50\nlatency: 500\n"})
    yield Case("bombs", "a torus of 10^10 NPUs", ["--workload", str(TRACE8), "--network", "{dir}/n.yml"],
               expect="error", files={"n.yml": b"fabric: torus\ndims: [100000, 100000]\nbandwidth: 50\nlatency: 5\n"})
    yield Case("bombs", "10^9 NPUs", ["--workload", str(TRACE8), "--network", "{dir}/n.yml"], expect="error",
               files={"n.yml": b"topology: [Ring]\nnpus_count: [1000000000]\nbandwidth: [50]\nlatency: [5]\n"})
    yield Case("bombs", "preferred-dataset-splits 10^9", ["--workload", str(TRACE8), "--network", str(RING8),
                                                         "--system", "{dir}/s.json"], expect="error",
               files={"s.json": json.dumps({"preferred-dataset-splits": 10**9, "all-reduce-implementation": ["ring"],
                                            "local-mem-bw": 1600}).encode()})
    yield Case("bombs", "rescale to 10^8 ranks", ["trace", "rescale", str(TRACE8), "--npus", "100000000", "-o",
                                                 "{dir}/r/trace"], expect="error")
    yield Case("bombs", "generate 10^9 ranks", ["trace", "generate", "collective", "--type", "all_reduce", "--size",
                                               "1MiB", "--npus", "1000000000", "-o", "{dir}/g"], expect="error")
    yield Case("names", "generate --name ../x", ["trace", "generate", "compute", "--npus", "2", "--count", "1",
                                                "--duration-us", "1", "--name", "../../x", "-o", "{dir}/g"],
               expect="error")
    yield Case("names", "generate --count -1", ["trace", "generate", "compute", "--npus", "2", "--count", "-1",
                                               "-o", "{dir}/g"], expect="error")
    yield Case("names", "report of a truncated results file", ["report", "{dir}/r.json", "--html", "{dir}/r.html"],
               expect="error", files={"r.json": b'{"finish_ns": 1, "ranks": [{"rank"'})
    yield Case("names", "report of another JSON", ["report", "{dir}/r.json", "--html", "{dir}/r.html"],
               expect="error", files={"r.json": b'[1, 2, 3]'})
    yield Case("names", "an unwritable --json", ["--workload", str(TRACE8), "--network", str(RING8), "--json",
                                                "/proc/version/x.json", "--quiet"], expect="error")
    yield Case("names", "visualize into .png", ["trace", "visualize", str(TRACE8), "-o", "{dir}/g.png"],
               expect="error")


def corpus(mutations: int, configs: int) -> list[Case]:
    """The cases: ``configs`` hostile config values sampled (deterministically) from all of them."""
    every_config = list(config_cases())
    sample = random.Random(0).sample(every_config, min(configs, len(every_config)))
    return [*sample, *trace_cases(mutations), *semantic_cases()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", default="", help="run the cases whose family or name contains this")
    parser.add_argument("--mutations", type=int, default=150, help="byte mutations per seed trace")
    parser.add_argument("--configs", type=int, default=1000,
                        help="hostile config values to try, sampled from every key of every config kind (all: 5000)")
    parser.add_argument("--list", action="store_true", help="list the cases and stop")
    args = parser.parse_args()
    cases = [c for c in corpus(args.mutations, args.configs) if args.only in f"{c.family} {c.name}"]
    if args.list:
        for c in cases:
            print(f"{c.family:16} {c.name}")
        return 0
    exe = [shutil.which("astrasim-py") or sys.executable] + ([] if shutil.which("astrasim-py") else ["-m", "simulator"])
    counts: Counter[tuple[str, str]] = Counter()
    failures = []
    root = Path(tempfile.mkdtemp(prefix="astrasim-fuzz-"))
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            for done, (case, outcome, detail) in enumerate(pool.map(lambda c: run_case(c, root, exe), cases), 1):
                counts[(case.family, outcome)] += 1
                if outcome in ("traceback", "hang", "blow-up", "messy", "wrong"):
                    failures.append((case, outcome, detail))
                if done % 100 == 0:
                    print(f"... {done}/{len(cases)} cases", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    families = sorted({f for f, _ in counts})
    outcomes = ["ok", "error", "deadlock", "traceback", "hang", "blow-up", "messy", "wrong"]
    print(f"{'family':<16}" + "".join(f"{o:>10}" for o in outcomes))
    for f in families:
        print(f"{f:<16}" + "".join(f"{counts[(f, o)]:>10}" for o in outcomes))
    print(f"{len(cases)} cases, {len(failures)} failure(s)")
    for case, outcome, detail in failures:
        print(f"  {outcome:<9} {case.family}: {case.name}: {detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
