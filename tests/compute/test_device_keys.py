"""Device files name their memory bandwidth ``memory_bw_GBps`` (GB/s, GB = 10^9 B); a file written for an earlier
version, with ``memory_bw_gbps`` (which reads as gigabits), still loads to the same device and the same run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from compute.devices import RENAMED_KEYS, device, device_names, load_device_file
from tests.conftest import REPO, run_cli
from workload.errors import ConfigError

AR8 = str(REPO / "configs" / "workloads" / "all_reduce" / "8npus_1MiB" / "all_reduce")
RING8 = str(REPO / "configs" / "network" / "ring_8.yml")


def earlier(tmp_path: Path, name: str = "H100") -> Path:
    """The shipped device file as an earlier version spelled it."""
    text = Path(device(name).path).read_text()
    assert "memory_bw_GBps:" in text and "memory_bw_gbps" not in text
    old = tmp_path / f"{name.lower()}_old.yml"
    old.write_text(text.replace("memory_bw_GBps:", "memory_bw_gbps:"))
    return old


def test_an_earlier_device_file_loads_as_the_current_one(tmp_path: Path) -> None:
    assert RENAMED_KEYS == {"memory_bw_gbps": "memory_bw_GBps"}
    for name in ("H100", "MI300X", "TPUv5p"):
        old = device(str(earlier(tmp_path, name)))
        assert old.memory_bw_GBps == device(name).memory_bw_GBps > 0
        assert replace(old, path="") == replace(device(name), path="")


def test_a_device_file_with_both_names_is_refused(tmp_path: Path) -> None:
    both = tmp_path / "both.yml"
    both.write_text(Path(device("H100").path).read_text() + "memory_bw_gbps: 3350\n")
    with pytest.raises(ConfigError, match=r"both.yml: both 'memory_bw_gbps' \(its earlier name\) and "
                                          r"'memory_bw_GBps'; keep 'memory_bw_GBps'"):
        device(str(both))
    # the current key missing and the earlier one absent too: the error names the current key
    none = tmp_path / "none.yml"
    none.write_text(Path(device("H100").path).read_text().replace("memory_bw_GBps: 3350.0\n", ""))
    with pytest.raises(ConfigError, match=r"none\.yml: the device file misses memory_bw_GBps"):
        device(str(none))


def test_a_run_with_an_earlier_device_file_matches_the_preset(tmp_path: Path) -> None:
    """End to end: ``--device old.yml`` gives the preset's numbers, and the results say memory_bw_GBps."""
    docs = []
    for which in ("H100", str(earlier(tmp_path))):
        out = tmp_path / f"{len(docs)}.json"
        done = run_cli("--workload", AR8, "--network", RING8, "--device", which, "--json", str(out), "--quiet")
        assert done.returncode == 0, done.stderr
        docs.append(json.loads(out.read_text()))
    assert docs[0]["ranks"] == docs[1]["ranks"] and docs[0]["collectives"] == docs[1]["collectives"]
    assert docs[1]["config"]["compute"]["memory_bw_GBps"] == 3350.0


def test_every_shipped_device_states_its_memory_and_a_file_may_leave_it_out(tmp_path: Path) -> None:
    sizes = {name: device(name).memory_GiB for name in device_names()}
    assert sizes["H100"] == sizes["A100"] == 80 and sizes["B200"] == 180 and sizes["MI300X"] == 192
    assert all(v > 0 for v in sizes.values())
    assert device("H100").memory_bytes == 80 * 2**30
    text = "\n".join(line for line in Path(device("H100").path).read_text().splitlines()
                     if not line.startswith("memory_GiB:"))
    bare = tmp_path / "bare.yml"
    bare.write_text(text)
    assert load_device_file(str(bare)).memory_bytes == 0  # unknown: nothing is checked against it
    bad = tmp_path / "bad.yml"
    bad.write_text(text + "\nmemory_GiB: -1\n")
    with pytest.raises(ConfigError, match=r"bad\.yml.*memory_GiB"):
        load_device_file(str(bad))


def test_memory_shortfall_says_how_far_over_and_nothing_when_it_fits_or_is_unknown() -> None:
    h100 = device("H100")
    assert h100.memory_shortfall(80 * 2**30) == ""
    assert h100.memory_shortfall(96 * 2**30) == ("needs 96.0 GiB per GPU by the memory estimate, more than the "
                                                 "H100's 80 GiB")
    assert replace(h100, memory_GiB=0.0).memory_shortfall(10**15) == ""
