"""Timelines, breakdowns, per-link statistics, CSV exports, trace analysis and the HTML report."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from simulator.report import render
from simulator.timeline import build_timeline, parse_ranks
from tests.conftest import REFERENCE, REPO, run_cli, simulate, simulation, write_trace_file
from workload.schema import NodeType
from workload.writer import make_node

STG = REFERENCE / "cases" / "stg-gpt-dp2tp2pp2-L8-aware"


def stg_args(*extra: str) -> list[str]:
    return ["--workload", str(STG / "workload" / "trace"), "--network", str(STG / "network.yml"), "--system",
            str(STG / "system.json"), "--comm-groups", str(STG / "comm_groups.json"), "--backend", "analytical-aware",
            *extra]


def check_timeline(doc: dict, finish_by_rank: dict[int, int], by_node: int = 0) -> None:
    assert set(doc) >= {"traceEvents", "displayTimeUnit"}
    ends: dict[int, float] = {}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M", "s", "f", "C") and "pid" in e and "name" in e
        if e["ph"] == "X":
            assert {"ts", "dur", "tid", "cat", "args"} <= set(e) and e["dur"] >= 0
            rank = e["tid"] // 100 if by_node else e["pid"]
            if e["cat"] != "phase":
                ends[rank] = max(ends.get(rank, 0.0), e["ts"] + e["dur"])
    for rank, finish in finish_by_rank.items():
        assert ends[rank] == pytest.approx(finish / 1000)  # µs, ending at the rank's finish time


def test_timeline_schema_units_and_ends(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "t.json"
    result_json = tmp_path / "r.json"
    # every rank drawn (a folded run draws one rank per class: test_folded_timeline_draws_the_representatives)
    run = run_cli(*stg_args("--timeline", str(out), "--timeline-phases", "--json", str(result_json), "--engine",
                            "message"))
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    result = json.loads(result_json.read_text())
    check_timeline(doc, {r["rank"]: r["finish_ns"] for r in result["ranks"]})
    events = doc["traceEvents"]
    assert any(e["ph"] == "X" and e["cat"] == "phase" for e in events)  # chunk-stream phases on request
    flows = [e for e in events if e["ph"] in ("s", "f")]
    assert len(flows) == 16 and {e["ph"] for e in flows} == {"s", "f"}  # 8 send/recv pairs as arrows
    assert any(e["ph"] == "C" and e["name"].startswith("link ") for e in events)  # link utilisation
    slice_ = next(e for e in events if e["ph"] == "X" and e["args"]["type"] == "COMM_COLL_NODE")
    assert {"node_id", "collective", "size_bytes", "group"} <= set(slice_["args"])


def test_folded_timeline_draws_the_representatives(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "t.json"
    run = run_cli(*stg_args("--timeline", str(out)))
    assert run.returncode == 0, run.stderr
    assert "folded run): only those are drawn" in run.stderr
    pids = {e["pid"] for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"}
    assert pids == {0, 4}  # one rank per class: the two pipeline stages


def test_folded_timeline_draws_asked_ranks_as_the_ranks_they_behave_like(tmp_path: Path, reference: Path) -> None:
    """--timeline-ranks on a folded run: a rank that was not simulated is drawn as its class's representative (it
    was silently left out, so asking for rank 5 wrote an empty timeline)."""
    out = tmp_path / "t.json"
    run = run_cli(*stg_args("--timeline", str(out), "--timeline-ranks", "5"))
    assert run.returncode == 0, run.stderr
    assert "--timeline-ranks 5 draws rank(s) 4, the ranks they behave like" in run.stderr
    pids = {e["pid"] for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"}
    assert pids == {4}


def test_timeline_rank_list_naming_no_rank_of_the_network_is_refused_before_the_run(tmp_path: Path,
                                                                                   reference: Path) -> None:
    """A rank list outside the network (or a reversed range) used to be dropped silently after the whole run,
    leaving an empty timeline; flags that shape a timeline without --timeline say they have no effect."""
    for spec in ("8", "5-2", "0-3,9"):
        run = run_cli(*stg_args("--timeline", str(tmp_path / "t.json"), "--timeline-ranks", spec))
        assert run.returncode == 1 and "astrasim-py: error: --timeline-ranks:" in run.stderr, run.stderr
        assert "within 0-7" in run.stderr and "end-to-end" not in run.stdout
    assert not (tmp_path / "t.json").exists()
    run = run_cli(*stg_args("--timeline-phases", "--quiet"))
    assert run.returncode == 0 and "without --timeline FILE.json they have no effect" in run.stderr


def test_timeline_phases_under_the_nccl_model_say_there_are_none(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    run = run_cli("--workload", "configs/workloads/all_reduce/8npus_1MiB/all_reduce", "--network",
                  "configs/network/hgx_h100_8.yml", "--collective-model", "nccl", "--hw-profile", "hgx-h200",
                  "--timeline", str(out), "--timeline-phases", "--quiet", cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "the NCCL-like collective model runs no chunk-stream phases" in run.stderr
    assert not any(e.get("cat") == "phase" for e in json.loads(out.read_text())["traceEvents"])


def test_timeline_groups_ranks_by_node_on_multi_dimensional_networks(tmp_path: Path) -> None:
    nodes = [make_node(1, "c", NodeType.COMP_NODE, duration_micros=3),
             make_node(2, "ar", NodeType.COMM_COLL_NODE, data_deps=[1], attrs={"comm_type": 0, "comm_size": 1 << 16})]
    net = {"topology": ["Ring", "Switch"], "npus_count": [4, 2], "bandwidth": [100.0, 50.0], "latency": [10.0, 10.0]}
    sim, sim_result = simulation(tmp_path, [nodes] * 8, net, {"all-reduce-implementation": ["ring", "ring"]},
                                 engine="message", timeline=True)
    doc = build_timeline(sim.workloads, (4, 2))
    check_timeline(doc, {r.rank: r.finish_ns for r in sim_result.ranks}, by_node=True)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"node 0 (ranks 0-3)", "node 1 (ranks 4-7)"}


def test_timeline_for_1024_ranks_stays_small(tmp_path: Path) -> None:
    """Documented: about 200 bytes per node per rank; 1,024 ranks x 12 nodes stays under 4 MiB."""
    traces = []
    for r in range(1024):
        group = str(r // 8 + 1)
        nodes = [make_node(k, f"layer{k}", NodeType.COMP_NODE, data_deps=[k - 1] if k else [], duration_micros=5)
                 for k in range(10)]
        nodes += [make_node(10 + k, f"ar{k}", NodeType.COMM_COLL_NODE, data_deps=[9 + k],
                            attrs={"comm_type": 0, "comm_size": 1 << 20, "pg_name": group}) for k in range(2)]
        traces.append(nodes)
    groups = {g + 1: tuple(range(8 * g, 8 * g + 8)) for g in range(128)}
    net = {"topology": ["Ring", "Switch"], "npus_count": [8, 128], "bandwidth": [200.0, 50.0],
           "latency": [100.0, 1000.0]}
    sim, result = simulation(tmp_path, traces, net, {"all-reduce-implementation": ["ring", "ring"]}, groups=groups,
                             timeline=True, engine="message")  # every rank drawn (a folded run draws one per class)
    from simulator.timeline import write_timeline

    size = write_timeline(str(tmp_path / "big.json"), build_timeline(sim.workloads, (8, 128)))
    assert size < 4 * 2**20
    doc = json.loads((tmp_path / "big.json").read_text())
    check_timeline(doc, {r.rank: r.finish_ns for r in result.ranks}, by_node=True)
    assert parse_ranks("0-3,1023,5000", 1024) == [0, 1, 2, 3, 1023]


def test_breakdown_parts_add_up_to_each_finish_time(tmp_path: Path) -> None:
    from simulator.api import simulate as run_api
    from tests.e2e.test_reference_cases import CASES

    for case in CASES:
        exp = json.loads((case / "expected.json").read_text())
        groups = case / "comm_groups.json"
        result = run_api(case / "workload" / "trace", case / "network.yml", case / "system.json",
                         case / "memory.json", groups if groups.exists() else None, backend=exp["backend"])
        for r in result.ranks:
            assert r.compute_busy_ns + r.comm_only_ns + r.memory_only_ns + r.idle_ns == r.finish_ns
            assert 0 <= r.overlap_ns <= min(r.compute_busy_ns, r.comm_ns)
    mixed = [make_node(1, "ld", NodeType.MEM_LOAD_NODE, attrs={"tensor_size": 5000}),
             make_node(2, "c", NodeType.COMP_NODE, data_deps=[1], duration_micros=2),
             make_node(3, "ar", NodeType.COMM_COLL_NODE, data_deps=[1], attrs={"comm_type": 0, "comm_size": 1 << 20})]
    result = simulate(tmp_path, [mixed] * 4, memory={"memory-type": "PER_NPU_MEMORY_EXPANSION",
                                                     "remote-mem-latency": 100, "remote-mem-bw": 1})
    r = result.ranks[0]
    assert r.memory_only_ns == 5100 and r.overlap_ns == 2000
    assert r.compute_busy_ns + r.comm_only_ns + r.memory_only_ns + r.idle_ns == r.finish_ns


def test_collective_statistics_and_busiest_links(tmp_path: Path) -> None:
    incast = [[make_node(1, "s", NodeType.COMM_SEND_NODE, attrs={"comm_dst": 0, "comm_size": 1 << 20,
                                                                 "comm_tag": r})] for r in range(1, 4)]
    receiver = [make_node(k, "r", NodeType.COMM_RECV_NODE, attrs={"comm_src": k, "comm_size": 1 << 20, "comm_tag": k})
                for k in range(1, 4)]
    net = {"topology": ["Switch"], "npus_count": [4], "bandwidth": [50.0], "latency": [500.0]}
    result = simulate(tmp_path, [receiver, *incast], net, backend="analytical-aware")
    top = result.links[0]
    assert top["link"] == "4->0" and top["bytes"] == 3 << 20 and top["max_queue"] == 2  # the receiver's downlink
    ar = simulate(tmp_path, [[make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0,
                                                                                 "comm_size": 1 << 20})]] * 8)
    (c,) = ar.collectives
    assert c.kind == "all_reduce" and c.count_per_rank == 1 and c.bytes_per_rank == 1 << 20
    assert c.busbw_GBps == pytest.approx(c.algbw_GBps * 2 * 7 / 8)
    assert c.algbw_GBps == pytest.approx((1 << 20) / ar.finish_ns)


def test_csv_exports(tmp_path: Path, reference: Path) -> None:
    run = run_cli(*stg_args("--csv", str(tmp_path / "stg")))
    assert run.returncode == 0, run.stderr
    ranks = list(csv.DictReader((tmp_path / "stg.ranks.csv").open()))
    assert len(ranks) == 8 and {"finish_ns", "comm_only_ns", "idle_ns"} <= set(ranks[0])
    colls = list(csv.DictReader((tmp_path / "stg.collectives.csv").open()))
    assert {c["collective"] for c in colls} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert all(int(c["count"]) > 0 for c in colls)  # one rank's count: a whole number ('2', was '2.0')
    links = list(csv.DictReader((tmp_path / "stg.links.csv").open()))
    assert links and {"link", "bytes", "busy_ns", "utilization", "max_queue"} <= set(links[0])


def test_trace_analyze_finds_imbalanced_collectives(tmp_path: Path) -> None:
    for r in range(4):
        size = 3 << 20 if r == 2 else 1 << 20
        write_trace_file(tmp_path / f"t.{r}.et", [
            make_node(1, "ar", NodeType.COMM_COLL_NODE, attrs={"comm_type": 0, "comm_size": 1 << 20}),
            make_node(2, "ag", NodeType.COMM_COLL_NODE, data_deps=[1], attrs={"comm_type": 2, "comm_size": size}),
            make_node(3, "c", NodeType.COMP_NODE, data_deps=[2], duration_micros=r)])
    out = run_cli("trace", "analyze", str(tmp_path / "t"), "--json", "--heatmap", str(tmp_path / "h.png"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (imb,) = doc["imbalances"]
    assert (imb["collective"], imb["ordinal"], imb["ratio"], imb["ranks_at_max"]) == ("all_gather", 0, 3.0, [2])
    assert [r["compute_micros"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run_cli("trace", "analyze", str(tmp_path / "t")).stdout
    assert "1 collective(s) differ" in text and "x3" in text


def test_html_report_is_self_contained(tmp_path: Path, reference: Path) -> None:
    result_json = tmp_path / "r.json"
    assert run_cli(*stg_args("--json", str(result_json))).returncode == 0
    page = tmp_path / "report.html"
    out = run_cli("report", str(result_json), "--html", str(page))
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<svg") >= 4
    assert "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched from anywhere
    assert "<script" not in text
    assert "Where the time went" in render(json.loads(result_json.read_text()))


def test_html_report_opens_in_headless_chromium(tmp_path: Path, reference: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("Chromium is not installed (CI installs it)")
    result_json = tmp_path / "r.json"
    run_cli(*stg_args("--json", str(result_json)))
    page = tmp_path / "report.html"
    run_cli("report", str(result_json), "--html", str(page))
    shot = tmp_path / "shot.png"
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
                           f"--screenshot={shot}", "--window-size=1000,2000", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 10_000
    assert "Uncaught" not in proc.stderr and "ERR_FILE_NOT_FOUND" not in proc.stderr
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--no-first-run", f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert "Busiest links" in dom.stdout and dom.stdout.count("<svg") >= 4
