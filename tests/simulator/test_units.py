"""Every bandwidth astrasim-py prints or stores says its unit, and which GB: the network file's GB = 2^30 B
(ASTRA-sim's reading) or the 10^9 B of nccl-tests' algbw/busbw and of hardware profiles. Results of earlier
versions, whose keys ended in ``_gbps``, still read back."""

from __future__ import annotations

import csv
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

from simulator.units import LEGACY_KEYS, column_units, labelled, setting_unit, upgrade_results
from tests.conftest import REPO, run_cli

RING8 = str(REPO / "configs" / "network" / "ring_8.yml")
SWITCH8 = str(REPO / "configs" / "network" / "hgx_h100_8.yml")
AR8 = str(REPO / "configs" / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce")
UNSEEN = str(REPO / "benchmarks" / "data" / "unseen" / "gcp_a3mega_h100_2node_all_reduce.tsv")

UNIT_SUFFIXES = ("_GBps", "_GiBps", "_Gbps", "_bytes_per_ns")
BANDWIDTH_NAME = re.compile(r"(?i)(bw|bandwidth)")
FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?\s*(?:GB/s|GiB/s|Gb/s)")
BARE = re.compile(r"(?i)\b(?:algbw|busbw|bandwidth)\b[ :=]{0,3}(\d[\d,]*(?:\.\d+)?)(?!\d|\.\d|\s*(?:GB/s|GiB/s|Gb/s|"
                  r"B/s|bytes|%))")


def unlabelled_text(text: str) -> list[str]:
    """Bandwidth figures in ``text`` that do not say their unit, or GB/s figures with no word on which GB."""
    problems = [m.group(0) for m in BARE.finditer(text)]
    if FIGURE.search(text) and not re.search(r"GB = (10\^9|2\^30)", text):
        problems.append(f"GB/s figures without saying which GB: {FIGURE.search(text).group(0)}")  # type: ignore
    return problems


def unlabelled_keys(doc: Any, path: str = "") -> list[str]:
    """Keys of a JSON document that name a bandwidth without carrying its unit (the 'units' entry excepted)."""
    found: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            where = f"{path}.{key}" if path else key
            if key == "units" and not path:
                continue
            if BANDWIDTH_NAME.search(key) and not key.endswith(UNIT_SUFFIXES):
                found.append(where)
            found += unlabelled_keys(value, where)
    elif isinstance(doc, list):
        for item in doc:
            found += unlabelled_keys(item, f"{path}[]")
    return sorted(set(found))


def bandwidth_paths(doc: Any, path: str = "") -> set[str]:
    """The paths (list indices as []) of every key naming a bandwidth."""
    found: set[str] = set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            where = f"{path}.{key}" if path else key
            if BANDWIDTH_NAME.search(key) and path != "units":
                found.add(where)
            found |= bandwidth_paths(value, where)
    elif isinstance(doc, list):
        for item in doc:
            found |= bandwidth_paths(item, f"{path}[]")
    return found


def csv_header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


def test_the_scanner_finds_unlabelled_figures() -> None:
    assert unlabelled_text("busbw 28.48") == ["busbw 28.48"]
    assert unlabelled_text("bandwidth: 50 per link")
    assert unlabelled_text("busbw 28.48 GB/s")  # a GB/s figure, but which GB?
    assert unlabelled_text("busbw 28.48 GB/s (GB = 10^9 B)") == []
    assert unlabelled_keys({"busbw_gbps": 1.0, "x": [{"link_bandwidth": 2}]}) == ["busbw_gbps", "x[].link_bandwidth"]
    assert unlabelled_keys({"busbw_GBps": 1.0, "nic_bandwidth_Gbps": 400, "units": {"bw": "x"}}) == []


def test_simulation_outputs_label_every_bandwidth(tmp_path: Path) -> None:
    """Text summary, JSON (keys with units, each documented in 'units'), CSV headers, the HTML report, on the
    congestion-unaware model (whose busbw exceeds the links here: that note too), the packet backend's link tables
    and a roofline run (the memory bandwidth)."""
    system = json.loads((REPO / "configs" / "system" / "default.json").read_text())
    direct = tmp_path / "direct.json"
    direct.write_text(json.dumps({**system, "all-reduce-implementation": ["direct"]}))
    switch = tmp_path / "switch.yml"
    switch.write_text("topology: [Switch]\nnpus_count: [8]\nbandwidth: [50]\nlatency: [500]\n")
    runs = {"unaware": ["--workload", AR8, "--network", str(switch), "--system", str(direct)],
            "packet": ["--workload", AR8, "--network", RING8, "--backend", "packet"],
            "roofline": ["--workload", AR8, "--network", RING8, "--device", "H100"]}
    for name, args in runs.items():
        out = tmp_path / name
        done = run_cli(*args, "--json", f"{out}.json", "--csv", str(out), "--quiet")
        assert done.returncode == 0, done.stderr
        assert unlabelled_text(done.stdout) == [], (name, done.stdout)
        assert "GB = 10^9 B" in done.stdout and "GB = 2^30 B" in done.stdout
        assert ("exceeds the fastest link's" in done.stdout) == (name == "unaware")
        doc = json.loads(Path(f"{out}.json").read_text())
        assert unlabelled_keys(doc) == []
        documented = {k for k in doc["units"] if not k.startswith("hardware")}
        assert bandwidth_paths(doc) <= documented, bandwidth_paths(doc) - documented
        for table in tmp_path.glob(f"{name}.*.csv"):
            assert unlabelled_keys(dict.fromkeys(csv_header(table))) == [], table
        html = tmp_path / f"{name}.html"
        assert run_cli("report", f"{out}.json", "--html", str(html)).returncode == 0
        page = re.sub(r"<[^>]+>", " ", html.read_text())
        assert unlabelled_text(page) == [] and "GB = 2^30 B" in page and "GB = 10^9 B" in page
    assert doc["config"]["compute"]["memory_bw_GBps"] == 3350.0
    assert "3350 GB/s memory, GB = 10^9 B" in done.stdout
    assert (tmp_path / "packet.links.csv").exists()


def test_compare_validate_and_help_label_every_bandwidth(tmp_path: Path) -> None:
    table = tmp_path / "c.csv"
    for args in (["--network", RING8, "--collective", "all_reduce", "--sizes", "1MiB", "--algorithms", "ring,direct"],
                 ["--network", SWITCH8, "--collective", "all_reduce", "--sizes", "64KiB,16MiB", "--collective-model",
                  "nccl", "--hw-profile", "hgx-h200"],
                 ["--network", SWITCH8, "--collective", "all_reduce", "--hw-profile", "hgx-h200", "--explain",
                  "2MiB"]):
        done = run_cli("compare", *args, "--csv", str(table), "--jobs", "1")
        assert done.returncode == 0, done.stderr
        assert unlabelled_text(done.stdout) == [], done.stdout
        if "--explain" not in args:
            assert unlabelled_keys(dict.fromkeys(csv_header(table))) == []
        # direct on a ring under the congestion-unaware model: busbw above the links, and the table says why
        assert ("note: direct at 1MiB busbw 86.4 GB/s exceeds the fastest link's 53.7 GB/s" in done.stdout) == \
            ("direct" in args[-1])
    out = tmp_path / "v.json"
    done = run_cli("validate", "--profile", "gcp-a3-mega", "--tables", UNSEEN, "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert unlabelled_text(done.stdout) == [] and unlabelled_keys(json.loads(out.read_text())) == []
    for command in ([], ["compare"], ["plot"], ["validate"], ["calibrate"], ["sweep"]):
        text = run_cli(*command, "--help").stdout
        assert unlabelled_text(text) == [], (command, text)
        if "GB/s" in text:
            assert re.search(r"GB = (10\^9|2\^30)", " ".join(text.split())), command


def test_sweep_results_say_their_units_and_read_earlier_names(tmp_path: Path) -> None:
    """A sweep database documents its units in meta; one written with the earlier *_gbps column names still
    plots, exports and resumes (SQLite's column names ignore case)."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base:\n  workload: {generate: collective, type: all_reduce, size: 1MiB}\n"
                     "  network: {topology: [Ring], npus_count: [8], bandwidth: [50], latency: [500]}\n"
                     "axes:\n  network.bandwidth: [25, 50]\n")
    out = tmp_path / "r"
    assert run_cli("sweep", str(sweep), "--out", str(out), "--jobs", "1", "--quiet").returncode == 0
    db = sqlite3.connect(out / "results.db")
    units = json.loads(db.execute("SELECT value FROM meta WHERE name = 'units'").fetchone()[0])
    assert "10^9" in units["busbw_GBps"] and "2^30" in units["network.bandwidth"] and units["finish_ns"] == "ns"
    export = tmp_path / "x.csv"
    assert run_cli("sweep", "export", str(out), "--csv", str(export)).returncode == 0
    header = csv_header(export)
    assert set(unlabelled_keys(dict.fromkeys(header))) <= {"network.bandwidth"}  # a setting: in meta units
    assert "busbw_GBps" in header
    # as an earlier version wrote it
    for old, new in (("algbw_gbps", "algbw_GBps"), ("busbw_gbps", "busbw_GBps")):
        db.execute(f'ALTER TABLE points RENAME COLUMN "{new}" TO "{old}"')
    db.execute("DELETE FROM points WHERE idx = 1")
    db.commit()
    db.close()
    for y in ("busbw_GBps", "busbw_gbps"):
        done = run_cli("plot", str(out), "--x", "network.bandwidth", "--y", y, "--out", str(tmp_path / f"{y}.png"))
        assert done.returncode == 0 and "1 points in 1 line(s)" in done.stderr, done.stderr
    assert run_cli("sweep", "export", str(out), "--csv", str(export)).returncode == 0
    assert "busbw_GBps" in csv_header(export)
    done = run_cli("sweep", str(sweep), "--out", str(out), "--jobs", "1", "--quiet")  # the missing point runs
    assert done.returncode == 0, done.stderr
    assert run_cli("sweep", "export", str(out), "--csv", str(export)).returncode == 0
    with export.open(newline="") as f:
        assert [float(r["busbw_GBps"]) > 0 for r in csv.DictReader(f)] == [True, True]


def test_a_results_file_of_an_earlier_version_still_renders(tmp_path: Path) -> None:
    new = tmp_path / "new.json"
    assert run_cli("--workload", AR8, "--network", RING8, "--json", str(new), "--quiet").returncode == 0
    text = new.read_text()
    for old, current in LEGACY_KEYS.items():
        text = text.replace(f'"{current}"', f'"{old}"')
    old = tmp_path / "old.json"
    old.write_text(text)
    assert upgrade_results(json.loads(text))["collectives"] == json.loads(new.read_text())["collectives"]
    pages = []
    for doc in (new, old):
        html = tmp_path / f"{doc.stem}.html"
        done = run_cli("report", str(doc), "--html", str(html))
        assert done.returncode == 0, done.stderr
        pages.append(html.read_text().replace(str(doc), ""))
    assert pages[0] == pages[1] and "28.48" in pages[0]


def test_axis_labels_and_column_units() -> None:
    assert labelled("network.bandwidth[1]") == "network.bandwidth[1] (GB/s, GB = 2^30 B)"
    assert labelled("network.nic_bandwidth") == "network.nic_bandwidth (GB/s, GB = 2^30 B)"
    assert labelled("busbw_gbps") == labelled("busbw_GBps") == "busbw (GB/s, GB = 10^9 B)"
    assert labelled("system.local-mem-bw") == "system.local-mem-bw (GB/s, GB = 10^9 B)"
    assert labelled("network.latency") == "network.latency" and setting_unit("workload.size") is None
    assert column_units(["busbw_gbps", "finish_ns_mean", "npus", "memory.remote-mem-bw"]) == {
        "busbw_GBps": "GB/s with GB = 10^9 B (as nccl-tests)", "finish_ns_mean": "ns",
        "memory.remote-mem-bw": "bytes/ns"}
