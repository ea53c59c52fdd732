"""Fuzzing the command line: mutated traces and hostile config values end in a result or in one clear error.

Runs ``simulator.cli.main`` in this process (the code the ``astrasim-py`` command runs; an exception escaping
it is what a user would see as a traceback), with an alarm against hangs. The larger corpus, with memory
limits and every subcommand in subprocesses, is ``benchmarks/fuzz_corpus.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from tests.conftest import REPO

SECONDS_PER_RUN = 20
TRACE = REPO / "configs" / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce.0.et"
RING8 = REPO / "configs" / "network" / "ring_8.yml"
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

HOSTILE = st.one_of(
    st.sampled_from([True, False, None, 0, -1, 1, 2**31, 2**63, 2**64, 10**400, 1e308, -1e308, math.nan, math.inf,
                     -math.inf, 0.5, "", "x", "\x1b[2J\x07", "ring", "Ring", "é" * 300, [], {}, [1], [True], ["ring"],
                     {"a": 1}, [[1, 2]], "1" * 500]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.lists(st.integers(-3, 10**9), max_size=5),
)


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def expired(*_: Any) -> None:
        raise TimeoutError(f"no answer within {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    with alarm(SECONDS_PER_RUN):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse
            status = int(e.code or 0)
    return status, capsys.readouterr().err


def assert_clean(status: int, err: str) -> None:
    """A result (0), or exit 1 with one error line (a deadlock report may list ranks below its first line)."""
    assert status in (0, 1), (status, err[-2000:])
    lines = [line for line in err.splitlines() if not line.startswith("astrasim-py: warning: ")]
    if status == 0:
        assert not lines, err[-2000:]
        return
    assert lines and lines[0].startswith("astrasim-py: error: "), err[-2000:]
    assert len(lines) == 1 or "deadlock" in lines[0], err[-2000:]
    assert all(len(line) < 2000 for line in lines), "an error quoted unbounded input"
    assert "\x1b" not in err and "\x07" not in err


MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice"]),
                               st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4)


def mutate(data: bytes, operations: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for op, where, value in operations:
        i = where % (len(out) + 1)
        if op == "flip" and out:
            out[min(i, len(out) - 1)] ^= 1 << (value % 8)
        elif op == "set" and out:
            out[min(i, len(out) - 1)] = value
        elif op == "insert":
            out[i:i] = bytes([value]) * (1 + value % 9)
        elif op == "delete":
            del out[i:i + 1 + value % 16]
        elif op == "truncate":
            del out[i:]
        elif op == "splice":
            out[i:i] = out[: value % 64]
    return bytes(out)


@FUZZ
@given(operations=MUTATIONS, ranks=st.sampled_from(["one", "all"]))
def test_mutated_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str], operations: list[tuple[str, int, int]],
                        ranks: str) -> None:
    folder = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    original = TRACE.read_bytes()
    for rank in range(8):
        mutated = ranks == "all" or rank == 3
        (folder / f"trace.{rank}.et").write_bytes(mutate(original, operations) if mutated else original)
    assert_clean(*run(["--workload", str(folder / "trace"), "--network", str(RING8), "--quiet"], capsys))
    for tool in ("inspect", "jsonize"):  # a viewer shows what decodes, and refuses the rest in one line
        status, err = run(["trace", tool, str(folder / "trace"), *(["-o", str(folder / "x.json")]
                                                                   if tool == "jsonize" else [])], capsys)
        assert_clean(status, err)


NETWORK = {"topology": ["Ring", "Switch"], "npus_count": [4, 2], "bandwidth": [50.0, 25.0], "latency": [500.0, 10.0]}
SYSTEM = json.loads((REPO / "configs" / "system" / "torus_2d.json").read_text())
MEMORY = {"memory-type": "PER_NODE_MEMORY_EXPANSION", "remote-mem-latency": 100, "remote-mem-bw": 50,
          "num-nodes": 2, "num-npus-per-node": 4}
GROUPS = {"1": [0, 1, 2, 3], "2": [4, 5, 6, 7]}
FABRIC = yaml.safe_load((REPO / "configs" / "network" / "rail_optimized_4x8.yml").read_text())


def corrupt(document: Any, path: list[Any], value: Any) -> Any:
    """``document`` with the value at ``path`` (indices into nested lists/dicts, wrapped) replaced."""
    if not path or not isinstance(document, (dict, list)) or not document:
        return value
    keys = list(document) if isinstance(document, dict) else list(range(len(document)))
    key = keys[path[0] % len(keys)]
    copy = dict(document) if isinstance(document, dict) else list(document)
    copy[key] = corrupt(document[key], path[1:], value)
    return copy


@FUZZ
@given(kind=st.sampled_from(["network", "system", "memory", "groups", "fabric", "packet"]),
       path=st.lists(st.integers(0, 50), min_size=1, max_size=3), value=HOSTILE, rename=st.booleans())
def test_hostile_config_values(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, path: list[int],
                               value: Any, rename: bool) -> None:
    base = {"network": NETWORK, "system": SYSTEM, "memory": MEMORY, "groups": GROUPS, "fabric": FABRIC,
            "packet": {"mtu_bytes": 4096, "header_bytes": 0, "buffer_bytes": 1 << 20, "flow_control": "credit"}}[kind]
    document = corrupt(base, path, value)
    if rename and isinstance(document, dict) and document:  # a key of the wrong name or type
        document = {**document, value if isinstance(value, (str, int)) else "bogus": 1}
    folder = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    config = folder / ("config.yml" if kind in ("network", "fabric", "packet") else "config.json")
    try:
        text = yaml.safe_dump(document) if config.suffix == ".yml" else json.dumps(document)
    except (ValueError, yaml.YAMLError):
        text = str(document)  # what no serializer writes (NaN in JSON is written by json.dumps; huge ints are not)
    config.write_text(text, encoding="utf-8")
    npus = 32 if kind == "fabric" else 8
    trace = REPO / "configs" / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce"
    argv = ["--workload", str(trace if npus == 8 else TRACE), "--network", str(RING8), "--quiet"]
    if kind in ("network", "fabric"):
        argv[3] = str(config)
    else:
        flags = {"system": "--system", "memory": "--memory", "groups": "--comm-groups", "packet": "--packet-config"}
        argv += [flags[kind], str(config)]
        if kind == "packet":
            argv += ["--backend", "packet"]
    assert_clean(*run(argv, capsys))
