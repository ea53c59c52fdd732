"""Sweeps under stress, through the CLI: stopped by signals, two at once on one folder, workers dying, huge
or hostile sweep files, read-only and foreign results folders."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.sweep import executors, worker
from simulator.sweep.spec import Point, load_sweep
from simulator.sweep.store import ResultStore
from tests.conftest import REPO, run_cli
from tests.sweep.in_process import cli
from tests.sweep.test_spec import write_sweep

Cap = pytest.CaptureFixture[str]
RING4 = {"topology": ["Ring"], "npus_count": [4], "bandwidth": [50], "latency": [500]}
TORUS = {"topology": ["Ring", "Ring"], "npus_count": [4, 8], "bandwidth": [50, 50], "latency": [500, 500]}


def sweep_file(tmp_path: Path, axes: dict[str, Any], base: dict[str, Any] | None = None, name: str = "s") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"base": base or {"workload": {"generate": "collective", "type": "all_reduce",
                                                                  "size": "1MiB"}, "network": RING4},
                                    "axes": axes}, sort_keys=False))
    return str(path)


def start(*args: str, tmpdir: Path | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.Popen([sys.executable, "-m", "simulator", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def query(out: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(f"file:{out / 'results.db'}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        db.close()


def wait_for_points(proc: subprocess.Popen[str], out: Path, n: int) -> None:
    deadline = time.monotonic() + 60
    while not (out / "results.db").exists() or query(out, "SELECT COUNT(*) FROM points")[:1] < [(n,)]:
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended too soon"
        time.sleep(0.02)


def scratch_folders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("astrasim-py-generated-"))


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_sigterm_leaves_no_scratch_folders_and_the_next_sweep_removes_stale_ones(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    stale = tmpdir / f"astrasim-py-generated-{dead_pid()}-abc"  # as a sweep killed with SIGKILL leaves it
    stale.mkdir()
    sweep = sweep_file(tmp_path, {"network.bandwidth": list(range(10, 410))}, {
        "workload": {"generate": "collective", "type": "all_reduce", "size": "64MiB"}, "network": TORUS})
    out = tmp_path / "out"
    proc = start("sweep", sweep, "--out", str(out), "--jobs", "2", tmpdir=tmpdir)
    wait_for_points(proc, out, 3)
    assert not stale.exists()
    assert len(scratch_folders(tmpdir)) == 1  # the sweep's own, its workers' folders inside it
    os.killpg(proc.pid, signal.SIGTERM)  # the driver and its workers, as a scheduler stops a job
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM after" in err and "run the same command again" in err
    assert scratch_folders(tmpdir) == []
    assert query(out, "SELECT COUNT(*) FROM claims") == [(0,)]  # its points are free for the next run


def test_two_sweeps_on_one_folder_run_each_point_once(tmp_path: Path) -> None:
    sweep = sweep_file(tmp_path, {"network.bandwidth": list(range(10, 30))}, {  # about 0.3 s a point
        "workload": {"generate": "collective", "type": "all_reduce", "size": "64MiB"},
        "network": {**TORUS, "npus_count": [8, 8]}, "options": {"engine": "message"}})
    out = tmp_path / "out"
    first = start("sweep", sweep, "--out", str(out), "--jobs", "1", "--quiet")
    wait_for_points(first, out, 2)
    second = start("sweep", sweep, "--out", str(out), "--jobs", "1", "--quiet")
    errors = [p.communicate(timeout=120)[1] for p in (first, second)]
    assert first.returncode == second.returncode == 0, errors
    assert query(out, "SELECT COUNT(*), COUNT(DISTINCT key) FROM runs") == [(20, 20)]
    assert query(out, "SELECT COUNT(*) FROM points WHERE status = 'ok'") == [(20,)]
    ran = [int(e.split(" run now in")[0].rsplit("(", 1)[1]) for e in errors]
    assert sum(ran) == 20 and min(ran) > 0, errors  # both worked, neither repeated the other's points
    assert query(out, "SELECT COUNT(*) FROM claims") == [(0,)]


def test_claims_of_live_and_dead_processes(tmp_path: Path, capsys: Cap) -> None:
    sweep = sweep_file(tmp_path, {"network.bandwidth": [10, 20, 30]})
    keys = [p.key for p in load_sweep(sweep).points]
    out = tmp_path / "out"
    store = ResultStore(str(out))
    try:
        store.db.execute("INSERT INTO claims VALUES (?, 'other', ?, ?, ?)",
                         (keys[0], store.host, os.getpid(), time.time() + 600))  # a live sweep's point
        store.db.execute("INSERT INTO claims VALUES (?, 'gone', ?, ?, ?)",
                         (keys[1], store.host, dead_pid(), time.time() + 600))  # a killed sweep's point
        store.db.execute("INSERT INTO claims VALUES (?, 'hung', 'elsewhere', 1, ?)", (keys[2], time.time() - 1))
    finally:
        store.close()
    done = cli(capsys, "sweep", sweep, "--out", str(out), "--jobs", "1")
    assert done.returncode == 0, done.stderr
    assert "2 of 3 points ok, 0 failed, 1 running in another sweep process on this folder" in done.stderr
    assert sorted(k for (k,) in query(out, "SELECT key FROM points")) == sorted(keys[1:])
    assert query(out, "SELECT owner FROM claims") == [("other",)]


def _killed(point: Point) -> dict[str, Any]:
    if point.index == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does
    return worker.run_point(point.run, point.root, point.sources)


def test_a_killed_worker_fails_only_its_point_also_with_one_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setattr(executors, "_call", _killed)
    pts = list(load_sweep(write_sweep(tmp_path, {"network.latency": [100, 200, 300]})).points)
    outcomes = {p.index: o for p, o in executors.run_points(pts, "local", 1)}
    assert [outcomes[i]["status"] for i in range(3)] == ["ok", "failed", "ok"]
    assert outcomes[1]["error"].startswith("the worker process simulating this point was killed by SIGKILL (most "
                                           "often the kernel's out-of-memory killer")


@pytest.mark.slow
def test_a_point_over_the_worker_memory_limit_fails_alone(tmp_path: Path) -> None:
    sweep = sweep_file(tmp_path, {"workload.count": [1, 3_000_000]}, {
        "workload": {"generate": "compute", "count": 1, "duration_us": 1},
        "network": {**RING4, "npus_count": [2]}})
    out = tmp_path / "out"
    done = run_cli("sweep", sweep, "--out", str(out), "--jobs", "1", "--worker-memory", "400MiB")
    assert done.returncode == 1
    assert "1 of 2 points ok, 1 failed" in done.stderr
    ((error,),) = query(out, "SELECT error FROM points WHERE status = 'failed'")
    # MemoryError, a C extension's failed allocation, or a crash: each message names the limit
    assert "a worker may use 0.391 GiB of memory (--worker-memory)" in error or \
        "--worker-memory limit of 0.391 GiB" in error, error
    assert "Traceback" not in done.stderr


def test_jobs_are_capped_at_the_cores_unless_forced(tmp_path: Path, capsys: Cap) -> None:
    sweep = sweep_file(tmp_path, {"network.bandwidth": [10]})
    cores = executors.default_jobs()
    capped = cli(capsys, "sweep", sweep, "--out", str(tmp_path / "o"), "--jobs", str(cores + 62), "--dry-run")
    assert capped.returncode == 0
    assert f"--jobs {cores + 62} is more than the {cores} core(s)" in capped.stderr and "--force-jobs" in capped.stderr
    assert f"on {cores} local worker(s)" in capped.stderr
    forced = cli(capsys, "sweep", sweep, "--out", str(tmp_path / "o"), "--jobs", str(cores + 62), "--force-jobs",
                     "--dry-run")
    assert f"on {cores + 62} local worker(s)" in forced.stderr and "warning" not in forced.stderr
    assert not (tmp_path / "o").exists()  # a dry run writes nothing


def test_a_billion_point_sweep_is_counted_not_built(tmp_path: Path, capsys: Cap) -> None:
    sweep = sweep_file(tmp_path, {"network.latency[0]": list(range(1000)), "network.bandwidth": list(range(1, 1001)),
                                  "workload.repeat": list(range(1, 1001))})
    started = time.monotonic()
    dry = cli(capsys, "sweep", sweep, "--out", str(tmp_path / "o"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "1,000,000,000 points (1000 x 1000 x 1000), more than --max-points 100,000" in dry.stderr
    assert "#0: network.latency[0]=0, network.bandwidth=1, workload.repeat=1" in dry.stdout
    assert "... and 999,999,980 more" in dry.stdout
    real = cli(capsys, "sweep", sweep, "--out", str(tmp_path / "o"))
    assert real.returncode == 1
    assert real.stderr.strip().endswith("1,000,000,000 points (1000 x 1000 x 1000) is more than the limit of "
                                        "100,000; shorten the axes, or raise the limit with --max-points 1000000000")
    assert time.monotonic() - started < 20
    assert not (tmp_path / "o").exists()
    small = cli(capsys, "sweep", sweep_file(tmp_path, {"network.bandwidth": [1, 2, 3]}, name="small"), "--out",
                    str(tmp_path / "o"), "--max-points", "2")
    assert "3 points (3) is more than the limit of 2" in small.stderr


@pytest.mark.parametrize(("workload", "message"), [
    ({"generate": "collective", "type": ["all_reduce"], "size": "1MiB"},
     "workload: generated workload: 'type' takes one value, not ['all_reduce']; to sweep over values, make it an "
     "axis: workload.type: ['all_reduce']"),
    ({"generate": "collective", "type": "all_reduce", "size": ["1MiB"]}, "'size' takes one value, not ['1MiB']"),
    ({"generate": "collective", "type": {"a": 1}, "size": "1MiB"}, "'type' takes one value, not {'a': 1}"),
    ({"generate": ["collective"], "type": "all_reduce", "size": "1MiB"}, "'generate' takes one value"),
])
def test_list_values_in_generated_workloads_are_one_line_errors(tmp_path: Path, workload: dict[str, Any],
                                                                message: str, capsys: Cap) -> None:
    done = cli(capsys, "sweep", sweep_file(tmp_path, {"network.bandwidth": [10]}, {"workload": workload,
                                                                               "network": RING4}),
                   "--out", str(tmp_path / "o"))
    assert done.returncode == 1
    assert message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_list_from_an_axis_fails_its_point_with_the_reason(tmp_path: Path, capsys: Cap) -> None:
    out = tmp_path / "o"
    done = cli(capsys, "sweep", sweep_file(tmp_path, {"workload.size": ["1MiB", ["1MiB", "2MiB"]]}), "--out", str(out))
    assert done.returncode == 1 and "1 of 2 points ok, 1 failed" in done.stderr
    ((error,),) = query(out, "SELECT error FROM points WHERE status = 'failed'")
    assert error.startswith("generated workload: 'size' takes one value, not ['1MiB', '2MiB']")


def test_yaml_alias_bombs_are_refused_and_quoted_values_bounded(tmp_path: Path, capsys: Cap) -> None:
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1},"
              f" *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\nbase: {network: *a8}\n")
    started = time.monotonic()
    done = cli(capsys, "sweep", str(bomb), "--out", str(tmp_path / "o"))
    assert done.returncode == 1 and "YAML aliases expand to more than 1,000,000 values" in done.stderr
    assert time.monotonic() - started < 20
    wide = tmp_path / "wide.yaml"  # a few thousand values, quoted in a message
    wide.write_text("big: &big [" + ", ".join(["word"] * 3000) + "]\nbase: {workload: *big, network: {}}\n"
                    "axes: {network.bandwidth: [1]}\n")
    done = cli(capsys, "sweep", str(wide), "--out", str(tmp_path / "o"))
    assert done.returncode == 1 and len(done.stderr) < 400, done.stderr


def test_results_of_another_schema_are_refused_in_one_line(tmp_path: Path, capsys: Cap) -> None:
    sweep = sweep_file(tmp_path, {"network.bandwidth": [10]})
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    db = sqlite3.connect(foreign / "results.db")
    db.execute("CREATE TABLE results (id INTEGER, value REAL)")
    db.commit()
    db.close()
    for args in (["sweep", sweep, "--out", str(foreign)], ["sweep", "export", str(foreign), "--csv", "-"],
                 ["plot", str(foreign), "--x", "network.bandwidth"]):
        done = cli(capsys, *args)
        assert done.returncode == 1
        assert "results.db: a database of another schema (tables results), not the sweep results this " \
               "astrasim-py writes" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.db").write_text("not a database at all " * 100)
    junk = cli(capsys, "sweep", sweep, "--out", str(tmp_path / "junk"))
    assert junk.returncode == 1 and "not a usable results database" in junk.stderr


def test_results_of_the_first_schema_are_completed_and_kept(tmp_path: Path, capsys: Cap) -> None:
    sweep = sweep_file(tmp_path, {"network.bandwidth": [10, 20]})
    out = tmp_path / "old"
    assert cli(capsys, "sweep", sweep, "--out", str(out), "--jobs", "1").returncode == 0
    db = sqlite3.connect(out / "results.db")  # back to what an earlier astrasim-py wrote
    db.execute("DROP TABLE claims")
    db.execute("DELETE FROM meta WHERE name = 'schema'")
    db.execute("ALTER TABLE points DROP COLUMN config_compute")
    db.execute("DELETE FROM points WHERE idx = 1")
    db.commit()
    db.close()
    again = cli(capsys, "sweep", sweep, "--out", str(out), "--jobs", "1")
    assert again.returncode == 0, again.stderr
    assert "2 points, 1 already done, 1 to run" in again.stderr
    assert query(out, "SELECT idx, config_compute IS NULL FROM points ORDER BY idx") == [(0, 1), (1, 0)]


def test_export_and_plot_read_a_read_only_folder(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -m to mount a read-only folder")
    out = tmp_path / "out"
    sweep = sweep_file(tmp_path, {"network.bandwidth": [10, 20]})
    assert run_cli("sweep", sweep, "--out", str(out), "--jobs", "1").returncode == 0
    before = sorted(os.listdir(out))
    script = (f"mount --bind -o ro {out} {out} && {sys.executable} -m simulator sweep export {out} --csv "
              f"{tmp_path / 'r.csv'} && {sys.executable} -m simulator plot {out} --x network.bandwidth --out "
              f"{tmp_path / 'p.png'}")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 3 and (tmp_path / "p.png").stat().st_size > 0
    assert sorted(os.listdir(out)) == before


def test_exported_cells_never_run_as_formulas(tmp_path: Path, capsys: Cap) -> None:
    sweep = sweep_file(tmp_path, {"system.all-reduce-implementation": ["ring", "=HYPERLINK(\"x\")", "+1", "@A1"]})
    out = tmp_path / "out"
    cli(capsys, "sweep", sweep, "--out", str(out), "--jobs", "1")
    done = cli(capsys, "sweep", "export", str(out), "--csv", "-")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    for evil in ('\'=HYPERLINK(""x"")', "'+1", "'@A1"):
        assert any(evil in line for line in lines), evil
    assert not any(",=" in line or ",+1" in line or ",@" in line for line in lines)


def test_settings_beyond_sqlite_integers_are_stored_as_text() -> None:
    from simulator.sweep.store import cell

    assert cell(2**64) == "18446744073709551616" and cell(-(2**63)) == -(2**63) and cell(True) == 1


def test_a_transaction_a_signal_left_open_is_rolled_back_before_the_next(tmp_path: Path) -> None:
    """SIGTERM can land between a write's BEGIN and its end (the race that once made the cleanup's release of
    claims fail with "cannot start a transaction within a transaction"): the next write rolls the stopped one back
    and runs."""
    sweep = sweep_file(tmp_path, {"network.bandwidth": [10, 20]})
    keys = [p.key for p in load_sweep(sweep).points]
    store = ResultStore(str(tmp_path / "out"))
    try:
        assert store.claim(keys[0]) == "claimed"
        store.db.execute("BEGIN IMMEDIATE")  # as a stopped write leaves it
        store.db.execute("DELETE FROM claims")
        assert store.db.in_transaction
        store.release_claims()
        assert not store.db.in_transaction
        assert store.claim(keys[1]) == "claimed"
    finally:
        store.close()
    assert query(tmp_path / "out", "SELECT key FROM claims") == [(keys[1],)]
