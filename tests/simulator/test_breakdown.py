"""Per-collective summaries read a folded run's shared logs once and still add every record's bandwidth term in
rank and record order: the figures equal those of one plain loop over every record, to the last bit."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.breakdown import BUS_FACTORS, algorithm_bytes, summarize_collectives
from simulator.recording import CollectiveRecord

KINDS = sorted(BUS_FACTORS)


def plain_sums(logs: list[list[CollectiveRecord]]) -> dict[str, tuple[int, int, int, float, float]]:
    """(count, bytes, ns, algorithm bytes, bus bytes) per type, one record at a time in rank order."""
    out: dict[str, list] = defaultdict(lambda: [0, 0, 0, 0.0, 0.0])
    for log in logs:
        for r in log:
            s = out[r.kind]
            data = algorithm_bytes(r)
            s[0] += 1
            s[1] += r.size_bytes
            s[2] += r.end_ns - r.start_ns
            s[3] += data
            s[4] += data * BUS_FACTORS[r.kind](r.participants) if r.participants > 1 else 0.0
    return {k: tuple(v) for k, v in out.items()}


records = st.builds(CollectiveRecord, node=st.integers(0, 9), kind=st.sampled_from(KINDS),
                    size_bytes=st.integers(1, 1 << 34), participants=st.integers(1, 4096), group=st.just(0),
                    start_ns=st.integers(0, 1000), end_ns=st.integers(1001, 10**9))


@settings(max_examples=60, deadline=None)
@given(distinct=st.lists(st.lists(records, max_size=12), min_size=1, max_size=4), data=st.data())
def test_shared_logs_sum_as_one_loop_over_every_record(distinct: list[list[CollectiveRecord]],
                                                       data: st.DataObject) -> None:
    ranks = data.draw(st.lists(st.integers(0, len(distinct) - 1), min_size=1, max_size=40))
    shared = [distinct[k] for k in ranks]  # a folded run: ranks of a class share one list
    plain = plain_sums(shared)
    summary = summarize_collectives(shared)
    assert summary == summarize_collectives([list(log) for log in shared])  # copies: nothing shared
    assert [s.kind for s in summary] == sorted(plain)
    for s in summary:
        count, size, ns, alg, bus = plain[s.kind]
        assert s.count_per_rank == count / len(shared)
        assert s.bytes_per_rank == round(size / len(shared)) and s.time_ns_per_rank == round(ns / len(shared))
        assert s.algbw_GBps == (alg / ns if ns else 0.0) and s.busbw_GBps == (bus / ns if ns else 0.0)
