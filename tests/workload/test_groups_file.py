"""Moving METADATA-declared groups to a comm-group file (convert text / pytorch --groups-file): collectives over
every rank that name no group get a group of every rank, numbered after the declared ones (ASTRA-sim 2.x would
number them by every chunk-stream the rank started), and the traces simulate as before."""

from __future__ import annotations

import json
from pathlib import Path

from simulator.api import simulate
from tests.simulator.test_stream_numbers import PAIRING, write_traces
from workload.groups import load_comm_groups, move_groups_to_file
from workload.reader import read_trace
from workload.schema import CollectiveType, NodeType
from workload.writer import make_node, write_trace


def _pg_names(path: Path) -> dict[str, str | None]:
    graph = read_trace(str(path))
    return {graph.name(i): graph.attribute(i, "pg_name") for i in range(graph.num_nodes)
            if int(graph.types[i]) == NodeType.COMM_COLL_NODE}


def test_unnamed_collectives_get_a_group_of_every_rank(tmp_path: Path) -> None:
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    before = write_traces(tmp_path / "before", (1, 0))
    after = write_traces(tmp_path / "after", (1, 0))
    paths = [f"{after}.{r}.et" for r in range(4)]
    written = move_groups_to_file(paths, str(tmp_path / "groups.json"))
    # groups 1-3 as declared, and a new one for the unnamed collectives: group 3 (every rank, too) numbers its own
    # collectives, which need not come in the same order relative to the unnamed ones on every rank
    assert written == {"1": [0, 1], "2": [2, 3], "3": [0, 1, 2, 3], "4": [0, 1, 2, 3]}
    assert json.loads((tmp_path / "groups.json").read_text()) == written
    assert _pg_names(Path(paths[0])) == {"pair_allreduce_0": "1", "world_allreduce": "4"}
    assert _pg_names(Path(paths[2])) == {"world_allreduce": "4"}
    warnings: list[str] = []
    moved = simulate(after, tmp_path / "after" / "n.json", comm_groups=load_comm_groups(tmp_path / "groups.json", 4),
                     warn=warnings.append)
    assert not warnings
    original = simulate(before, tmp_path / "before" / "n.json", warn=warnings.append)
    assert sum(PAIRING in w for w in warnings) == 1  # the original form warns
    assert [(r.finish_ns, r.exposed_comm_ns) for r in moved.ranks] == \
        [(r.finish_ns, r.exposed_comm_ns) for r in original.ranks]


def test_group_zero_is_renamed_and_a_collective_listing_its_dimensions_keeps_them(tmp_path: Path) -> None:
    """pg_name "0" is ASTRA-sim's name for every rank too; a collective with involved_dim keeps its own dimensions
    (a group plan involves every dimension), and traces without any METADATA node are rewritten as well."""
    paths = []
    for rank in range(2):
        nodes = [make_node(1, "zero", NodeType.COMM_COLL_NODE,
                           attrs=[("comm_type", CollectiveType.ALL_REDUCE), ("comm_size", 64), ("pg_name", "0")]),
                 make_node(2, "dims", NodeType.COMM_COLL_NODE, data_deps=[1],
                           attrs=[("comm_type", CollectiveType.ALL_REDUCE), ("comm_size", 64),
                                  ("involved_dim", [True])])]
        paths.append(str(tmp_path / f"t.{rank}.et"))
        write_trace(paths[-1], nodes)
    assert move_groups_to_file(paths, str(tmp_path / "g.json")) == {"1": [0, 1]}
    assert _pg_names(Path(paths[1])) == {"zero": "1", "dims": None}


def test_traces_without_collectives_over_every_rank_get_no_extra_group(tmp_path: Path) -> None:
    prefix = write_traces(tmp_path, (1, 1), pg_name="3")
    assert move_groups_to_file([f"{prefix}.{r}.et" for r in range(4)], str(tmp_path / "g.json")) == \
        {"1": [0, 1], "2": [2, 3], "3": [0, 1, 2, 3]}
