"""``astrasim-py sweep``, ``sweep export`` and ``plot`` end to end, in subprocesses: a 240-point sweep with two
workers, interrupted part-way (Ctrl-C and kill -9) and run again, failing points, CSV export and charts."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, run_cli, write_trace_file
from workload.schema import NodeType
from workload.writer import make_node

TORUS = REPO / "configs" / "sweeps" / "torus_allreduce.yaml"
POINTS = 240


def rows(out: Path, table: str = "points") -> list[tuple[Any, ...]]:
    db = sqlite3.connect(out / "results.db")
    try:
        order = "idx" if table == "points" else "key, attempt"
        return db.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
    finally:
        db.close()


def count(out: Path, sql: str) -> int:
    if not (out / "results.db").exists():
        return 0
    db = sqlite3.connect(f"file:{out / 'results.db'}?mode=ro", uri=True)  # never create it under the sweep
    try:
        return db.execute(sql).fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        db.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The torus sweep run once, uninterrupted."""
    out = tmp_path_factory.mktemp("reference")
    done = run_cli("sweep", str(TORUS), "--out", str(out), "--jobs", "2")
    assert done.returncode == 0, done.stderr
    assert f"{POINTS} of {POINTS} points ok, 0 failed" in done.stderr
    return out


def test_every_point_is_recorded_once_and_a_rerun_runs_nothing(reference: Path, tmp_path: Path) -> None:
    points = rows(reference)
    assert len(points) == POINTS and {r[2] for r in points} == {"ok"}
    assert count(reference, "SELECT COUNT(DISTINCT key) FROM runs") == count(reference, "SELECT COUNT(*) FROM runs") \
        == POINTS
    again = run_cli("sweep", str(TORUS), "--out", str(reference), "--jobs", "2")
    assert again.returncode == 0
    assert f"{POINTS} points, {POINTS} already done, 0 to run" in again.stderr
    assert count(reference, "SELECT COUNT(*) FROM runs") == POINTS
    assert rows(reference) == points


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_interrupted_sweep_loses_nothing_and_repeats_nothing(reference: Path, tmp_path: Path, sig: int) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # a terminal's job takes Ctrl-C by default; a process started with SIGINT ignored (nohup, a background job, or
    # a test process a library left ignoring it: seen on fresh clones) rightly keeps ignoring it
    proc = subprocess.Popen([sys.executable, "-m", "simulator", "sweep", str(TORUS), "--out", str(out), "--jobs", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    # the 240 points take about a second: interrupt early, and check the sweep is still running after the count
    # (a slow read of the database once let it finish in between, and the test then saw exit status 0)
    while count(out, "SELECT COUNT(*) FROM points") < 10:
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before it could be interrupted"
        time.sleep(0.005)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    os.killpg(proc.pid, sig)  # like Ctrl-C in a terminal, or a scheduler killing the job's processes
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert "interrupted after" in err and "run the same command again" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    kept = count(out, "SELECT COUNT(*) FROM points")
    assert 10 <= kept < POINTS
    assert count(out, "SELECT COUNT(*) FROM runs") == kept  # each recorded point was recorded once

    again = run_cli("sweep", str(TORUS), "--out", str(out), "--jobs", "2")
    assert again.returncode == 0, again.stderr
    assert f"{POINTS} points, {kept} already done, {POINTS - kept} to run" in again.stderr
    assert count(out, "SELECT COUNT(*) FROM runs") == count(out, "SELECT COUNT(DISTINCT key) FROM runs") == POINTS
    assert rows(out) == rows(reference)  # and the results are those of the uninterrupted sweep


def deadlocking_workload(folder: Path) -> str:
    """Two ranks: rank 0 joins an all-reduce that rank 1 never issues."""
    folder.mkdir()
    coll = make_node(0, "ar", NodeType.COMM_COLL_NODE, attrs=[("is_cpu_op", False), ("comm_type", 0),
                                                              ("comm_size", 1 << 20)])
    comp = make_node(0, "c", NodeType.COMP_NODE, duration_micros=5, attrs=[("is_cpu_op", False)])
    write_trace_file(folder / "trace.0.et", [coll])
    write_trace_file(folder / "trace.1.et", [comp])
    return str(folder / "trace")


def test_failing_points_are_recorded_and_the_rest_go_on(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": {"workload": {"generate": "collective", "type": "all_reduce", "size": "1MiB"},
                 "network": {"topology": ["Ring"], "npus_count": [2], "bandwidth": [50], "latency": [500]}},
        "axes": {"workload": [{"generate": "collective", "type": "all_reduce", "size": "1MiB"},
                              deadlocking_workload(tmp_path / "bad")],
                 "network.bandwidth": [50, -1]}}, sort_keys=False))
    out = tmp_path / "out"
    done = run_cli("sweep", str(sweep), "--out", str(out), "--jobs", "2")
    assert done.returncode == 1
    assert "1 of 4 points ok, 3 failed" in done.stderr
    db = sqlite3.connect(out / "results.db")
    status = db.execute("SELECT idx, status, error, finish_ns FROM points ORDER BY idx").fetchall()
    assert status[0][1] == "ok" and status[0][3] > 0
    assert status[1][1] == "failed" and "'bandwidth' must be above 0" in status[1][2]
    assert status[2][1] == "failed" and status[2][2].startswith("deadlock: ") and "rank 0" in status[2][2]
    assert status[2][3] is None
    assert status[3][1] == "failed" and "bandwidth" in status[3][2]
    # running again retries only the failed points
    again = run_cli("sweep", str(sweep), "--out", str(out), "--jobs", "1")
    assert "4 points, 1 already done, 3 to run" in again.stderr
    attempts = db.execute("SELECT key, MAX(attempt) FROM runs GROUP BY key ORDER BY MAX(attempt)").fetchall()
    assert [a for _, a in attempts] == [1, 2, 2, 2]


def test_export_csv_and_plot(reference: Path, tmp_path: Path) -> None:
    target = tmp_path / "results.csv"
    done = run_cli("sweep", "export", str(reference), "--csv", str(target))
    assert done.returncode == 0, done.stderr
    table = list(csv.DictReader(target.open()))
    assert len(table) == POINTS
    first = table[0]
    assert first["network.bandwidth"] == "25" and first["system.all-reduce-implementation"] == "ring"
    assert first["status"] == "ok" and int(first["finish_ns"]) > 0 and float(first["busbw_GBps"]) > 0
    stdout = run_cli("sweep", "export", str(reference), "--csv", "-")
    assert list(csv.DictReader(io.StringIO(stdout.stdout))) == table

    png = tmp_path / "chart.png"
    done = run_cli("plot", str(reference), "--x", "network.bandwidth", "--y", "busbw_gbps", "--hue",
                   "system.all-reduce-implementation", "--where", "network.latency=500", "--where",
                   "system.preferred-dataset-splits=4", "--logx", "--out", str(png))
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "20 points in 4 line(s)" in done.stderr

    ambiguous = run_cli("plot", str(reference), "--x", "network.bandwidth", "--y", "finish_ns")
    assert ambiguous.returncode == 1
    assert "network.latency, system.all-reduce-implementation, system.preferred-dataset-splits also vary" in \
        ambiguous.stderr
    wrong = run_cli("plot", str(reference), "--x", "network.bandwidth", "--y", "finish")
    assert "--y 'finish' is not a metric; valid: npus, finish_ns" in wrong.stderr
    missing = run_cli("sweep", "export", str(tmp_path / "nothing"), "--csv", "x.csv")
    assert missing.returncode == 1 and "no sweep results here" in missing.stderr


def test_dry_run_lists_points_and_runs_nothing(tmp_path: Path) -> None:
    done = run_cli("sweep", str(REPO / "configs" / "sweeps" / "shapes_64.yaml"), "--out", str(tmp_path / "o"),
                   "--dry-run")
    assert done.returncode == 0
    assert "45 points, 0 already done, 45 to run" in done.stderr
    assert "#0: network.topology=['Ring'], network.npus_count=[64], network.bandwidth=50, network.latency=100" in \
        done.stdout
    assert count(tmp_path / "o", "SELECT COUNT(*) FROM points") == 0


def test_shipped_sweeps_load() -> None:
    from simulator.sweep.spec import load_sweep

    sizes = {p.stem: len(load_sweep(str(p)).points) for p in (REPO / "configs" / "sweeps").glob("*.yaml")}
    assert sizes["torus_allreduce"] == POINTS >= 200
    assert all(n > 0 for n in sizes.values())


@pytest.mark.slow
def test_the_commands_in_each_shipped_sweep_file_run(tmp_path: Path) -> None:
    """Each file's header says how to run it and plot it; llm_layouts' plot stopped with 'several points share
    each x and hue value' (tp 8 comes twice in its zipped layouts): the commands are run as written."""
    import shlex

    for sweep in sorted((REPO / "configs" / "sweeps").glob("*.yaml")):
        lines = sweep.read_text().splitlines()
        header = [line[1:].strip() for line in lines[:next(i for i, t in enumerate(lines) if not t.startswith("#"))]]
        commands = " ".join(header).replace("\\ ", "").split("astrasim-py ")[1:]
        assert commands and commands[0].startswith("sweep "), sweep.name
        for command in commands:
            args = [a.replace("results/", f"{tmp_path}/") for a in shlex.split(command)]
            if args[0] == "plot":
                args += ["--out", str(tmp_path / f"{sweep.stem}.png")]
            done = run_cli(*args, cwd=REPO, timeout=900)
            assert done.returncode == 0, (sweep.name, command, done.stderr[-800:])


def test_sweep_says_which_points_ran_with_warnings(tmp_path: Path) -> None:
    """Warnings were stored in the database only: generated LLM layouts without a device (compute of about 0 ns)
    said '2 of 2 points ok' and nothing else; with a device there is nothing to say."""
    spec: dict[str, Any] = {
        "name": "warned",
        "base": {"workload": {"generate": "llm", "preset": "gpt3-1.3b", "num_layers": 2, "tp": 2, "pp": 2, "dp": 2,
                              "global_batch": 4},
                 "network": {"topology": ["Switch", "Switch"], "npus_count": [4, 2], "bandwidth": [400.0, 50.0],
                             "latency": [500.0, 1000.0]}},
        "axes": {"workload.micro_batch_size": [1, 2]}}
    said = []
    for name, options in (("plain", {}), ("device", {"device": "H100"})):
        sweep = tmp_path / f"{name}.yaml"
        sweep.write_text(yaml.safe_dump({**spec, "base": {**spec["base"], "options": options}}))
        done = run_cli("sweep", str(sweep), "--out", str(tmp_path / name), "--jobs", "1")
        assert done.returncode == 0, done.stderr
        said.append(done.stderr)
    assert "2 of the points ok ran with warnings (the 'warnings' column has every one):" in said[0]
    assert "  #0: " in said[0] and "have no recorded duration" in said[0]
    assert "ran with warnings" not in said[1]
    # each generated point has its device-memory estimate, larger for the larger micro-batch
    with sqlite3.connect(tmp_path / "device" / "results.db") as db:
        need = [row[0] for row in db.execute('SELECT device_memory_bytes FROM points ORDER BY '
                                             '"workload.micro_batch_size"')]
        units = json.loads(db.execute("SELECT value FROM meta WHERE name = 'units'").fetchone()[0])
    assert len(need) == 2 and 0 < need[0] < need[1] and units["device_memory_bytes"] == "B"


def test_a_generated_point_over_its_devices_memory_says_so(tmp_path: Path) -> None:
    sweep = tmp_path / "big.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "big",
        "base": {"workload": {"generate": "llm", "preset": "llama3-70b", "num_layers": 2, "tp": 2, "pp": 1, "dp": 1,
                              "global_batch": 64, "micro_batch_size": 64},
                 "network": {"topology": ["Switch"], "npus_count": [2], "bandwidth": [400.0], "latency": [500.0]},
                 "options": {"device": "H100"}},
        "axes": {"workload.seq_len": [8192]}}))
    done = run_cli("sweep", str(sweep), "--out", str(tmp_path / "big"), "--jobs", "1")
    assert done.returncode == 0, done.stderr
    assert "by the memory estimate, more than the H100's 80 GiB" in done.stderr
