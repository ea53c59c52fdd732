"""What astrasim-py writes for people: compare tables and CSV, plot filters, CSV exports, the HTML report."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.compare import Row, write_csv
from tests.conftest import REPO, run_cli
from tests.sweep.in_process import cli

RING8 = str(REPO / "configs" / "network" / "ring_8.yml")
AR8 = str(REPO / "configs" / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce")



def test_compare_all_gather_sizes_and_bandwidths_follow_nccl_tests(tmp_path: Path) -> None:
    table = tmp_path / "ag.csv"
    done = run_cli("compare", "--network", RING8, "--collective", "all_gather", "--sizes", "8MiB,1001",
                   "--algorithms", "ring", "--csv", str(table), "--jobs", "1")
    assert done.returncode == 0, done.stderr
    assert "algbw (GB/s)" in done.stdout and "busbw (GB/s)" in done.stdout and "GB = 10^9 bytes" in done.stdout
    assert "--sizes 1001B: all_gather over 8 ranks gathers 1000 bytes (125 per rank), as nccl-tests rounds" in \
        done.stderr
    rows = list(csv.DictReader(table.open()))
    assert [(r["size_bytes"], r["rank_bytes"]) for r in rows] == [("8388608", "1048576"), ("1000", "125")]
    for r in rows:  # nccl-tests: algbw = the gathered output / time, busbw = algbw x (n-1)/n
        assert float(r["algbw_GBps"]) == pytest.approx(int(r["size_bytes"]) / float(r["time_ns"]))
        assert float(r["busbw_GBps"]) == pytest.approx(float(r["algbw_GBps"]) * 7 / 8)
    helptext = run_cli("compare", "--help").stdout
    assert "all_gather: the gathered output" in " ".join(helptext.split())


def test_compare_device_is_passed_to_every_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    done = cli(capsys, "compare", "--network", RING8, "--workload", AR8, "--algorithms", "ring", "--device", "h100",
               "--jobs", "1")
    assert done.returncode == 0, done.stderr
    assert ", analytical-unaware, H100;" in done.stdout.splitlines()[0]
    wrong = cli(capsys, "compare", "--network", RING8, "--workload", AR8, "--algorithms", "ring", "--device", "Z9")
    assert wrong.returncode == 1 and "unknown device 'Z9'; valid: A100, H100" in wrong.stderr
    assert "simulations on" not in wrong.stderr


def test_compare_plot_without_matplotlib_fails_before_simulating(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('matplotlib is not installed (test shim)')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "shim"), str(REPO)]))
    done = subprocess.run([sys.executable, "-m", "simulator", "compare", "--network", RING8, "--collective",
                           "all_reduce", "--algorithms", "ring", "--plot", str(tmp_path / "c.png")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stderr == ("astrasim-py: error: --plot needs matplotlib, which is not installed: pip install "
                           "'astrasim-py[plot]'\n")


def test_compare_csv_cells_are_inert(tmp_path: Path) -> None:
    outcome = {"status": "failed", "error": "=cmd|' /C calc'!A0", "metrics": {}}
    write_csv(str(tmp_path / "c.csv"), [Row("@SUM(1)", 1 << 20, outcome)], "all_reduce")
    row = next(csv.DictReader((tmp_path / "c.csv").open()))
    assert row["algorithm"] == "'@SUM(1)" and row["error"].startswith("'=cmd")


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("swept")
    sweep = folder / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": {"workload": {"generate": "collective", "type": "all_reduce", "size": "1MiB"},
                 "network": {"topology": ["Ring", "Ring"], "npus_count": [2, 2], "bandwidth": [50, 50],
                             "latency": [500, 500]}},
        "axes": {"network.bandwidth": [50, 100], "system.all-reduce-implementation": ["ring", ["ring", "direct"]],
                 "options.rendezvous": [False, True]}}))
    done = run_cli("sweep", str(sweep), "--out", str(folder / "out"), "--jobs", "1")
    assert done.returncode == 0, done.stderr
    return folder / "out"


@pytest.mark.parametrize("value", ["ring,direct", "[ring, direct]", '["ring","direct"]', " ring , direct"])
def test_plot_where_takes_list_values_as_people_write_them(swept: Path, tmp_path: Path, value: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    done = cli(capsys, "plot", str(swept), "--x", "network.bandwidth", "--where",
                   f"system.all-reduce-implementation={value}", "--where", "options.rendezvous=true", "--out",
                   str(tmp_path / "p.png"))
    assert done.returncode == 0, done.stderr
    assert "2 points in 1 line(s)" in done.stderr


def test_plot_where_without_a_match_lists_the_values(swept: Path) -> None:  # in a subprocess: the real thing
    done = run_cli("plot", str(swept), "--x", "network.bandwidth", "--where", "system.all-reduce-implementation=rign")
    assert done.returncode == 1
    assert done.stderr.strip().endswith("no successful point has system.all-reduce-implementation = 'rign'; its "
                                        "values: 'ring', ['ring', 'direct']")


def run_json(tmp_path: Path, *extra: str) -> Path:
    path = tmp_path / "r.json"
    done = run_cli("--workload", AR8, "--network", RING8, "--json", str(path), "--quiet", *extra)
    assert done.returncode == 0, done.stderr
    return path


def test_csv_links_file_only_with_a_link_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = cli(capsys, "--workload", AR8, "--network", RING8, "--csv", str(tmp_path / "u"), "--quiet")
    assert plain.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.collectives.csv", "u.ranks.csv"]
    rows = list(csv.DictReader((tmp_path / "u.collectives.csv").open()))  # the representative rank stands for all
    assert [r["rank"] for r in rows] == [str(i) for i in range(8)] and len({r["time_ns"] for r in rows}) == 1
    assert f"note: {tmp_path / 'u'}.links.csv not written: the analytical-unaware network has no link model" in \
        plain.stderr
    aware = cli(capsys, "--workload", AR8, "--network", RING8, "--csv", str(tmp_path / "a"), "--quiet", "--backend",
                    "analytical-aware")
    assert aware.returncode == 0 and "not written" not in aware.stderr
    links = list(csv.DictReader((tmp_path / "a.links.csv").open()))
    assert links and all(int(r["bytes"]) > 0 for r in links)
    nccl = cli(capsys, "--workload", AR8, "--network", RING8, "--csv", str(tmp_path / "n"), "--quiet",
               "--collective-model", "nccl", "--hw-profile", "hgx-h200")
    assert nccl.returncode == 0 and "the NCCL-like collective model shares GPU ports and NICs" in nccl.stderr
    rows = list(csv.DictReader((tmp_path / "n.collectives.csv").open()))
    assert len(rows) == 8 and {r["chosen"] for r in rows} == {"ring/LL x32"}


def test_report_shows_the_compute_model_as_run(tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    done = run_cli("report", str(run_json(tmp_path, "--device", "H100")), "--html", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "roofline model: H100, 989.4 TFLOP/s peak, 3350 GB/s memory" in text
    assert "compute setting (as run)" in text


@pytest.mark.parametrize(("content", "message"), [
    (b'{"finish_ns": 5, "ranks": [', "not valid JSON (line 1"),
    (b"\xff\xfe{}", "not UTF-8 text (byte offset 0)"),
    (b"[1, 2]", "not an astrasim-py results file: the document is not a mapping"),
    (b'{"finish_ns": 5, "ranks": [{"rank": 0}]}', "not an astrasim-py results file: ranks[0].finish_ns is not"),
    (b'{"finish_ns": 5, "ranks": []}', "not an astrasim-py results file: ranks is empty"),
    (b'{"finish_ns": NaN, "ranks": []}', "not valid JSON (NaN is not a number JSON allows)"),
])
def test_report_of_a_broken_or_foreign_json_is_one_line(tmp_path: Path, content: bytes, message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    done = cli(capsys, "report", str(path), "--html", str(tmp_path / "x.html"))
    assert done.returncode == 1
    assert message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "x.html").exists()


def test_report_of_a_result_with_odd_fields_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    result = json.loads(run_json(tmp_path).read_text())
    for field, value in (("activity", {"bins": 0}), ("collectives", [{"kind": "x"}]), ("config", {"compute": 3})):
        bad = tmp_path / f"{field}.json"
        bad.write_text(json.dumps({**result, field: value}))
        done = cli(capsys, "report", str(bad), "--html", str(tmp_path / "x.html"))
        assert done.returncode == 1 and "not an astrasim-py results file" in done.stderr, done.stderr


def test_text_says_why_the_unaware_model_exceeds_the_links(tmp_path: Path) -> None:
    """Direct all-reduce on a switch: every message uses a link's whole bandwidth at once, so busbw exceeds it;
    the summary says why in one line. A ring stays under its links and gets no such line."""
    from simulator.results import format_text
    from tests.conftest import simulate
    from workload.schema import NodeType
    from workload.writer import make_node

    node = make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 1 << 20})
    switch = {"topology": ["Switch"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0]}
    direct = format_text(simulate(tmp_path, [[node]] * 8, switch, {"all-reduce-implementation": ["direct"]}))
    assert "exceeds the fastest link's 53.7 GB/s: the congestion-unaware model" in direct
    ring = format_text(simulate(tmp_path, [[node]] * 8, switch, {"all-reduce-implementation": ["ring"]}))
    assert "exceeds the fastest link" not in ring
