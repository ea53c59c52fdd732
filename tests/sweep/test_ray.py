"""The Ray executor against a local Ray instance: the same rows as the local executor."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from simulator.sweep import cli as sweep_cli
from tests.conftest import REPO, run_cli
from workload.errors import InputError

SWEEPS = REPO / "configs" / "sweeps"


def points(out: Path) -> list[tuple[object, ...]]:
    db = sqlite3.connect(out / "results.db")
    try:
        return db.execute("SELECT * FROM points ORDER BY idx").fetchall()
    finally:
        db.close()


def test_ray_and_local_executors_give_identical_rows(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    for name in ("workload_backends", "shapes_64"):  # trace files from disk, and generated workloads
        local, ray = tmp_path / f"{name}-local", tmp_path / f"{name}-ray"
        done = run_cli("sweep", str(SWEEPS / f"{name}.yaml"), "--out", str(local), "--jobs", "2")
        assert done.returncode == 0, done.stderr
        done = run_cli("sweep", str(SWEEPS / f"{name}.yaml"), "--out", str(ray), "--executor", "ray", "--jobs", "2")
        assert done.returncode == 0, done.stderr
        assert "on a local Ray instance (2 CPUs)" in done.stderr
        assert points(ray) == points(local)
        assert len(points(ray)) > 20


def test_missing_ray_is_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as if it were not installed
    with pytest.raises(InputError, match=r"--executor ray needs ray, which is not installed: pip install "
                                         r"'astrasim-py\[ray\]'"):
        sweep_cli.run([str(SWEEPS / "workload_backends.yaml"), "--out", str(tmp_path), "--executor", "ray"],
                      print)


def test_ray_address_needs_the_ray_executor(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--ray-address needs --executor ray"):
        sweep_cli.run([str(SWEEPS / "workload_backends.yaml"), "--out", str(tmp_path), "--ray-address", "x:1"], print)
