"""Same-time ties in quotient runs: a tie that real ranks of a class order differently stops the folded run and
it is retried without the shifts that reverse it; a tie every shift orders alike folds. Every result equals the
message engine's, rank by rank."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from simulator.api import simulate as run
from tests.conftest import simulate
from workload.schema import NodeType
from workload.writer import make_node

SMALL = {"num_layers": 2, "hidden_size": 256, "num_heads": 8, "num_kv_heads": 4, "ffn_hidden_size": 512,
         "vocab_size": 1000, "seq_len": 64}


def ring_of_sends(rank: int, ring: list[int]) -> list[Any]:
    """Send to the next rank of ``ring`` and receive from the previous one; then a 10 us compute after the send
    and a 20 us one after the receive (one compute lane: whichever completes first runs first), and a second
    message after the first compute."""
    i = ring.index(rank)
    nxt, prev = ring[(i + 1) % len(ring)], ring[i - 1]
    base = 100 * rank

    def p2p(nid: int, kind: NodeType, peer: int, tag: int, deps: list[int]) -> Any:
        attrs = {"comm_dst" if kind == NodeType.COMM_SEND_NODE else "comm_src": peer, "comm_size": 1 << 20,
                 "comm_tag": tag}
        return make_node(base + nid, f"p2p{nid}", kind, data_deps=[base + d for d in deps], attrs=attrs)

    return [p2p(1, NodeType.COMM_SEND_NODE, nxt, 1, []), p2p(2, NodeType.COMM_RECV_NODE, prev, 1, []),
            make_node(base + 3, "after_send", NodeType.COMP_NODE, data_deps=[base + 1], duration_micros=10),
            make_node(base + 4, "after_recv", NodeType.COMP_NODE, data_deps=[base + 2], duration_micros=20),
            p2p(5, NodeType.COMM_SEND_NODE, nxt, 2, [3]), p2p(6, NodeType.COMM_RECV_NODE, prev, 2, [4])]


SWITCH = {"topology": ["Switch"], "npus_count": [4], "bandwidth": [50.0], "latency": [500.0]}
NCCL = {"collective_model": "nccl", "hw_profile": "aws-p4d-a100"}  # 4 NICs: GPUs 2k and 2k + 1 share NIC k


def test_a_ring_of_sends_is_a_genuine_tie(tmp_path: Path) -> None:
    """Every rank's trace is the same up to a shift, yet the first rank of the ring completes its own send
    before the receive from its predecessor (ranks start in rank order) and every other rank the reverse: the
    full run gives rank 0 other times than the rest. The folded run sees the tie and simulates every rank."""
    ring = [0, 1, 2, 3]
    traces = [ring_of_sends(r, ring) for r in ring]
    fast = simulate(tmp_path, traces, SWITCH)
    slow = simulate(tmp_path, traces, SWITCH, engine="message")
    assert fast.ranks == slow.ranks
    assert fast.simulated_ranks == 4 and "not under translation" in fast.engine_reason
    assert alike(slow.ranks) == [False, True, True]


def test_under_the_nccl_model_a_ring_of_sends_completes_alike_on_every_rank(tmp_path: Path) -> None:
    """The NCCL model completes a rank's same-instant send and receive in the order that rank issued them (a
    delivery's halves join their own rank's completions), so no rank of the ring is first: every rank gets the
    same times, and the run folds as far as the profile's NICs allow (GPUs 2k and 2k + 1 share one), exactly."""
    ring = [0, 1, 2, 3]
    traces = [ring_of_sends(r, ring) for r in ring]
    fast = simulate(tmp_path, traces, SWITCH, **NCCL)
    slow = simulate(tmp_path, traces, SWITCH, engine="message", **NCCL)
    assert fast.ranks == slow.ranks
    assert fast.simulated_ranks == 2 and "diverge" not in fast.engine_reason, fast.engine_reason
    assert alike(slow.ranks) == [True, True, True]


def alike(ranks: list[Any]) -> list[bool]:
    """Whether each rank's results equal the previous rank's (rank numbers aside)."""
    return [replace(a, rank=0) == replace(b, rank=0) for a, b in itertools.pairwise(ranks)]


def test_rings_fold_along_the_shifts_that_keep_their_order(tmp_path: Path) -> None:
    """Two rings of four (ranks 0-3 and 4-7): shifting one onto the other keeps which rank of a ring starts
    first, so the run folds to one ring, exactly."""
    network = {**SWITCH, "npus_count": [8]}
    traces = [ring_of_sends(r, [b, b + 1, b + 2, b + 3]) for b in (0, 4) for r in range(b, b + 4)]
    fast = simulate(tmp_path, traces, network)
    slow = simulate(tmp_path, traces, network, engine="message")
    assert fast.simulated_ranks == 4 and fast.ranks == slow.ranks
    assert alike(slow.ranks)[0] is False  # the tie is there, and alike in both rings
    assert [replace(r, rank=0) for r in slow.ranks[:4]] == [replace(r, rank=0) for r in slow.ranks[4:]]


def test_under_the_nccl_model_two_rings_fold_without_a_tie(tmp_path: Path) -> None:
    """No tie: every rank of both rings alike; the shift of one ring onto the other folds (no shift inside a
    ring keeps the NIC pairs and the ranks' peers: the traces name no groups)."""
    network = {**SWITCH, "npus_count": [8]}
    traces = [ring_of_sends(r, [b, b + 1, b + 2, b + 3]) for b in (0, 4) for r in range(b, b + 4)]
    fast = simulate(tmp_path, traces, network, **NCCL)
    slow = simulate(tmp_path, traces, network, engine="message", **NCCL)
    assert fast.ranks == slow.ranks
    assert fast.simulated_ranks == 4 and "diverge" not in fast.engine_reason, fast.engine_reason
    assert all(alike(slow.ranks))


def generated(tmp_path: Path, spec: dict[str, Any], network: dict[str, Any], **options: Any) -> tuple[Any, Any]:
    workload = tmp_path / f"w{len(list(tmp_path.iterdir()))}.yaml"
    workload.write_text(json.dumps({"generate": "llm", **SMALL, **spec}))
    net = tmp_path / f"n{len(list(tmp_path.iterdir()))}.yml"
    net.write_text(json.dumps(network))
    fast = run(str(workload), str(net), device="H100", **options)
    slow = run(str(workload), str(net), device="H100", engine="message", **options)
    assert fast.ranks == slow.ranks and fast.collectives == slow.collectives
    return fast, slow


def test_tensor_parallel_ring_exchange_falls_back_to_a_finer_quotient(tmp_path: Path) -> None:
    """--tp-comm-overlap's ring exchange ties like any ring: the tensor-parallel shift is dropped and the
    data-parallel one still folds."""
    fast, _ = generated(tmp_path, {"tp": 4, "dp": 2, "global_batch": 4, "sequence_parallel": True,
                                   "tp_comm_overlap": True},
                        {"topology": ["Switch"], "npus_count": [8], "bandwidth": [400.0], "latency": [500.0]})
    assert fast.simulated_ranks == 4, fast.engine_reason
    # the tensor-parallel shift, named by the data-parallel groups it moves onto each other
    assert "; not under shift of groups [0, 4] -> [1, 5] -> ... (order 4)" in fast.engine_reason
    assert "diverge" in fast.engine_reason


def test_context_parallel_rings_fold_along_data_parallelism(tmp_path: Path) -> None:
    fast, _ = generated(tmp_path, {"cp": 4, "dp": 2, "global_batch": 4},
                        {"topology": ["Switch"], "npus_count": [8], "bandwidth": [400.0], "latency": [500.0]})
    assert fast.simulated_ranks == 4


def test_the_engine_line_names_two_classes_that_run_the_same_trace(tmp_path: Path) -> None:
    """cp 2 x dp 2: the gradients' ring all-reduce runs over all four ranks (context-parallel pairs [0, 1] and
    [2, 3]); swapping the members of each pair is no rotation of that ring, so ranks 0 and 1 stay in two classes
    (their traces equal up to the ranks they name) and the engine line says why the run does not fold further."""
    fast, _ = generated(tmp_path, {"cp": 2, "dp": 2, "global_batch": 4},
                        {"topology": ["Switch"], "npus_count": [4], "bandwidth": [400.0], "latency": [500.0]})
    assert fast.simulated_ranks == 2, fast.engine_reason
    assert "under translation along dimension 1 by 2 (order 2)" in fast.engine_reason  # the data-parallel shift
    assert "; ranks 0 and 1 run the same trace up to the ranks it names, but no shift" in fast.engine_reason


def test_groups_of_the_same_ranks_stay_apart(tmp_path: Path) -> None:
    """With ep = dp and one tensor-parallel rank, the data- and expert-parallel groups hold the same ranks under
    different numbers: a message of one is delivered to the image of that group, not of the other."""
    fast, _ = generated(tmp_path, {"pp": 2, "dp": 4, "global_batch": 4, "num_experts": 4, "top_k": 2, "ep": 4},
                        {"topology": ["Switch"], "npus_count": [8], "bandwidth": [400.0], "latency": [500.0]})
    assert fast.simulated_ranks == 2, fast.engine_reason


def test_the_nccl_model_folds_a_3d_layout_to_one_rank_per_stage(tmp_path: Path) -> None:
    """tp 2 x dp 4 x pp 2 on two 8-GPU nodes under the NCCL model: one rank per pipeline stage, each rank's
    times equal to the full run's (calls start when every class of member has issued them)."""
    fast, _ = generated(tmp_path, {"tp": 2, "pp": 2, "dp": 4, "global_batch": 8},
                        {"topology": ["Switch", "Switch"], "npus_count": [8, 2], "bandwidth": [400.0, 50.0],
                         "latency": [500.0, 1000.0]}, collective_model="nccl", hw_profile="hgx-h100")
    assert fast.simulated_ranks == 2, fast.engine_reason
    assert fast.collectives and all(c.choices for c in fast.collectives)


def test_the_cli_says_how_many_ranks_ran_under_the_nccl_model(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    workload = tmp_path / "w.yaml"
    workload.write_text(json.dumps({"generate": "llm", **SMALL, "tp": 2, "pp": 2, "dp": 4, "global_batch": 8}))
    network = tmp_path / "n.yml"
    network.write_text('{"topology": ["Switch", "Switch"], "npus_count": [8, 2], "bandwidth": [400, 50], '
                       '"latency": [500, 1000]}')
    args = ["--workload", str(workload), "--network", str(network), "--device", "H100", "--collective-model", "nccl",
            "--hw-profile", "hgx-h100"]
    folded = run_cli(*args)
    full = run_cli(*args, "--engine", "message")
    assert folded.returncode == 0 and full.returncode == 0, folded.stderr + full.stderr
    assert "engine: 2 of 16 rank(s) simulated (2 classes of 8 equivalent ranks under " in folded.stdout
    assert folded.stdout.splitlines()[0] == full.stdout.splitlines()[0]  # the same end-to-end time


def test_a_fold_that_falls_back_is_said_in_the_engine_line_not_warned(tmp_path: Path) -> None:
    """A genuine tie makes the folded run simulate every rank: the results are exact either way and nothing in
    the input is wrong, so the engine line says why and no warning is printed."""
    ring = [0, 1, 2, 3]
    warnings: list[str] = []
    fast = simulate(tmp_path, [ring_of_sends(r, ring) for r in ring], SWITCH, warn=warnings.append)
    assert fast.simulated_ranks == 4 and fast.engine_reason and warnings == []
