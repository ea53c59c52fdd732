"""Executors and workers: every point comes back exactly once, whatever happens to it."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest

from simulator.sweep import executors, worker
from simulator.sweep.progress import Progress, format_duration
from simulator.sweep.spec import Point, load_sweep
from tests.sweep.test_spec import write_sweep


def points(tmp_path: Path, n: int) -> list[Point]:
    return list(load_sweep(write_sweep(tmp_path, {"network.latency": list(range(100, 100 + n))})).points)


def _dies_on_point_3(point: Point) -> dict[str, Any]:
    if point.index == 3:
        os._exit(1)  # as if the kernel killed the worker for its memory
    return worker.run_point(point.run, point.root, point.sources)


def test_pool_gives_the_same_outcomes_as_inline(tmp_path: Path) -> None:
    pts = points(tmp_path, 7)
    inline = {p.index: o for p, o in executors.run_inline(pts)}
    pool = {p.index: o for p, o in executors.run_pool(pts, 2)}
    assert sorted(pool) == list(range(7))
    for i in range(7):
        assert pool[i]["status"] == inline[i]["status"] == "ok"
        assert pool[i]["metrics"] == inline[i]["metrics"]


def test_a_dead_worker_fails_its_points_and_the_sweep_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.setattr(executors, "_call", _dies_on_point_3)
    pts = points(tmp_path, 12)
    seen = list(executors.run_pool(pts, 2))
    assert sorted(p.index for p, _ in seen) == list(range(12))  # each exactly once
    by_index = {p.index: o for p, o in seen}
    assert by_index[3]["status"] == "failed"
    assert by_index[3]["error"].startswith("the worker process simulating this point exited with status 1")
    assert all(by_index[i]["status"] == "ok" for i in range(12) if i != 3)  # only the point that killed its worker


def test_bugs_become_failed_points_with_the_evidence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def __init__(self, *args: Any) -> None:
            raise ZeroDivisionError("boom")

    monkeypatch.setattr(worker, "Simulation", Broken)
    (point,) = points(tmp_path, 1)
    outcome = worker.run_point(point.run, point.root, point.sources)
    assert outcome["status"] == "failed"
    assert outcome["error"].startswith("internal error: ZeroDivisionError: boom (at test_executors.py:")
    assert outcome["metrics"] == {}


def test_unknown_executor() -> None:
    with pytest.raises(ValueError, match="valid: local, ray"):
        executors.run_points([], "dask")


def test_progress_line() -> None:
    out = io.StringIO()
    bar = Progress(4, "demo", stream=out, interval_s=0)
    for ok in (True, False, True, True):
        bar.update(ok)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[1].startswith("demo: [############............] 2/4 done, 1 failed, ")
    assert lines[-1].endswith("ETA -")
    assert [format_duration(s) for s in (5, 65, 7300)] == ["5s", "1m05s", "2h01m"]
