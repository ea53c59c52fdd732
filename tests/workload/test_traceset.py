"""``--workload`` accepts an ASTRA-sim prefix, prefix.et, a folder, or one shared file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import write_trace_file
from workload.errors import InputError
from workload.traceset import TraceLoader, resolve_workload
from workload.writer import make_node


def _ranks(folder: Path, name: str, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(count):
        write_trace_file(folder / f"{name}.{r}.et", [make_node(1, f"rank{r}", 4, duration_micros=r + 1)])


def test_prefix(tmp_path: Path) -> None:
    _ranks(tmp_path, "trace", 12)
    ts = resolve_workload(str(tmp_path / "trace"))
    assert ts.num_ranks == 12 and not ts.shared
    assert ts.file_for(10).endswith("trace.10.et")  # numeric, not lexicographic, rank order


def test_prefix_written_with_et_suffix(tmp_path: Path) -> None:
    _ranks(tmp_path, "trace", 4)
    assert resolve_workload(str(tmp_path / "trace.et")).num_ranks == 4


def test_folder(tmp_path: Path) -> None:
    _ranks(tmp_path / "w", "all_reduce", 3)
    ts = resolve_workload(str(tmp_path / "w"))
    assert ts.num_ranks == 3 and ts.file_for(2).endswith("all_reduce.2.et")


def test_folder_with_two_traces_is_ambiguous(tmp_path: Path) -> None:
    _ranks(tmp_path, "a", 2)
    _ranks(tmp_path, "b", 2)
    with pytest.raises(InputError, match="several traces"):
        resolve_workload(str(tmp_path))


def test_single_shared_file(tmp_path: Path) -> None:
    path = write_trace_file(tmp_path / "one.et", [make_node(1, "n", 4)])
    ts = resolve_workload(str(path))
    assert ts.shared and ts.num_ranks is None and "every rank" in ts.describe()
    ts.check_ranks(64)  # fits any NPU count
    graphs = TraceLoader().load_set(ts, 4)
    assert all(g is graphs[0] for g in graphs)


def test_missing_rank(tmp_path: Path) -> None:
    _ranks(tmp_path, "trace", 4)
    (tmp_path / "trace.2.et").unlink()
    with pytest.raises(InputError, match=r"rank\(s\) 2 are missing"):
        resolve_workload(str(tmp_path / "trace"))


def test_rank_count_must_match_the_network(tmp_path: Path) -> None:
    _ranks(tmp_path, "trace", 4)
    with pytest.raises(InputError, match="4 per-rank traces but the network has 8 NPUs"):
        resolve_workload(str(tmp_path / "trace")).check_ranks(8)


def test_nothing_there(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        resolve_workload(str(tmp_path / "nope"))


def test_identical_files_are_decoded_once(tmp_path: Path) -> None:
    for r in range(3):
        write_trace_file(tmp_path / f"t.{r}.et", [make_node(1, "same", 4)])
    graphs = TraceLoader().load_set(resolve_workload(str(tmp_path / "t")), 3)
    assert graphs[0] is graphs[1] is graphs[2]
