"""The Ray executor against a local Ray instance: the same rows as the local executor."""

from __future__ import annotations

import ipaddress
import os
import socket
import sqlite3
import sys
from pathlib import Path

import pytest

from simulator.sweep import cli as sweep_cli
from simulator.sweep import executors
from simulator.sweep.spec import load_sweep
from tests.conftest import REPO, run_cli
from tests.sweep.test_spec import write_sweep
from workload.errors import InputError

SWEEPS = REPO / "configs" / "sweeps"


def points(out: Path) -> list[tuple[object, ...]]:
    db = sqlite3.connect(out / "results.db")
    try:
        return db.execute("SELECT * FROM points ORDER BY idx").fetchall()
    finally:
        db.close()


def test_ray_and_local_executors_give_identical_rows(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray is not installed (pip install 'astrasim-py[ray]')")
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


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def _listening(pids: set[int]) -> set[str]:
    """The addresses the processes ``pids`` listen on for TCP."""
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    addresses = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                raw = bytes.fromhex(fields[1].split(":")[0])
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # per 32-bit word, host order
                addresses.add(socket.inet_ntop(family, raw))
    return addresses


@pytest.mark.slow  # a Ray start-up; every default run's Ray sweep is checked to be on 127.0.0.1 by run_ray itself
def test_a_local_ray_instance_listens_on_loopback_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason="ray is not installed (pip install 'astrasim-py[ray]')")
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # restored after the test
    pts = list(load_sweep(write_sweep(tmp_path, {"network.latency": [100, 200, 300]})).points)
    seen = {}
    for point, outcome in executors.run_ray(pts, 1, None):
        seen[point.index] = outcome["status"]
        addresses = _listening(_descendants(os.getpid()))
        assert addresses, "found none of Ray's services"
        assert all(ipaddress.ip_address(a).is_loopback or a.startswith("::ffff:127.") for a in addresses), addresses
    assert seen == {0: "ok", 1: "ok", 2: "ok"}
