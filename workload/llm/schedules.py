"""Pipeline schedules: the order in which one stage runs the forward and backward passes of its micro-batches.

``one_f_one_b`` is the non-interleaved 1F1B schedule (PipeDream-Flush, Megatron-LM's default). ``interleaved``
is Megatron-LM's interleaved 1F1B over ``vp`` model chunks per stage (Narayanan et al., SC'21), in the order
Megatron-Core's forward_backward_pipelining_with_interleaving runs it:

- a schedule table lists (micro-batch, chunk) in groups of ``group`` micro-batches (default pp): for each group,
  chunk 0 of its micro-batches, then chunk 1, ...; the backward passes walk the same table with the chunks
  reversed (the last chunk's backward comes first);
- stage s runs (pp - s - 1) x 2 + (vp - 1) x group warm-up forwards (all of them when that is more), then
  alternates one forward (table entry k + warm-up) and one backward (entry k), then the remaining backwards.

On a pipeline with equal stages and no communication time this leaves an idle bubble of (pp - 1) / (vp x m) of
the ideal step, (pp - 1) / m without interleaving (tests/workload/test_llm_schedules.py simulates it).

``receive_points`` says after which step a stage posts each step's receive. Megatron-LM's interleaved schedule
(overlapping its point-to-point communication, the default) posts a forward's receive together with the send of
the previous forward, and a backward's together with the send of the previous backward (the first backward's
after the last warm-up forward); 1F1B posts each step's receive after the step before it. Posted later (after
the other kind's step), a receive would wait for that step's tensor-parallel collectives, and those (one
communication node at a time per rank, as ASTRA-sim runs them) for this stage's own unmatched send: under
--rendezvous-protocol two stages would each wait for the other's receive for ever.
"""

from __future__ import annotations

Step = tuple[str, int, int]  # ("F" | "B", micro-batch, model chunk)


def one_f_one_b(num_stages: int, stage: int, num_micro_batches: int, extra_warmup: int = 0) -> list[tuple[str, int]]:
    """The non-interleaved 1F1B order of ("F" | "B", micro-batch): pp - stage - 1 (+ ``extra_warmup``) warm-up
    forwards, then alternating forward/backward, then the remaining backwards."""
    warmup = min(num_stages - stage - 1 + extra_warmup, num_micro_batches)
    order = [("F", m) for m in range(warmup)]
    for i in range(num_micro_batches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", m) for m in range(num_micro_batches - warmup, num_micro_batches)]
    return order


def schedule_table(num_micro_batches: int, num_chunks: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in the interleaved schedule's forward order (the last group takes what is left)."""
    table = []
    for low in range(0, num_micro_batches, group):
        high = num_micro_batches if low + group >= num_micro_batches else low + group
        table += [(mb, chunk) for chunk in range(num_chunks) for mb in range(low, high)]
    return table


def _interleaved_warmup(num_stages: int, stage: int, total: int, num_chunks: int, group: int,
                        extra: int = 0) -> int:
    return min((num_stages - stage - 1) * 2 + (num_chunks - 1) * group + extra, total)


def interleaved(num_stages: int, stage: int, num_micro_batches: int, num_chunks: int, group: int,
                extra_warmup: int = 0) -> list[Step]:
    """Megatron-LM's interleaved 1F1B order of stage ``stage``."""
    table = schedule_table(num_micro_batches, num_chunks, group)
    total = len(table)
    warmup = _interleaved_warmup(num_stages, stage, total, num_chunks, group, extra_warmup)

    def forward(k: int) -> Step:
        mb, chunk = table[k]
        return "F", mb, chunk

    def backward(k: int) -> Step:
        mb, chunk = table[k]
        return "B", mb, num_chunks - 1 - chunk

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(k + warmup), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def stage_schedule(num_stages: int, stage: int, num_micro_batches: int, num_chunks: int = 1,
                   group: int | None = None, ep_overlap: bool = False) -> list[Step]:
    """The order of stage ``stage``: interleaved with more than one chunk, else 1F1B (chunk 0). With
    ``ep_overlap`` (Megatron-Core's EP A2A overlap) one more warm-up forward, so that every forward of the steady
    phase can run together with the backward after it (combined_1f1b)."""
    extra = 1 if ep_overlap else 0
    if num_chunks == 1:
        return [(kind, mb, 0) for kind, mb in one_f_one_b(num_stages, stage, num_micro_batches, extra)]
    return interleaved(num_stages, stage, num_micro_batches, num_chunks, num_stages if group is None else group,
                       extra)


def receive_points(order: list[Step], warmup: int, interleaved_schedule: bool) -> list[int]:
    """For each step of ``order``, the index of the step after which its input's receive is posted (-1: before
    the first); ``warmup`` is the number of warm-up forwards (see the module's docstring)."""
    if not interleaved_schedule:
        return [i - 1 for i in range(len(order))]
    last = {"F": -1, "B": warmup - 1}  # the first backward's receive comes after the last warm-up forward
    points = []
    for i, (kind, _, _) in enumerate(order):
        points.append(last[kind] if i else -1)
        last[kind] = i
    return points


def _warmup(num_stages: int, stage: int, num_micro_batches: int, num_chunks: int, group: int | None,
            ep_overlap: bool) -> int:
    """Warm-up forwards of ``stage_schedule``'s order."""
    extra = 1 if ep_overlap else 0
    if num_chunks == 1:
        return min(num_stages - stage - 1 + extra, num_micro_batches)
    group = num_stages if group is None else group
    return _interleaved_warmup(num_stages, stage, num_micro_batches * num_chunks, num_chunks, group, extra)


def stage_receive_points(num_stages: int, stage: int, num_micro_batches: int, num_chunks: int = 1,
                         group: int | None = None, ep_overlap: bool = False) -> list[int]:
    """``receive_points`` of ``stage_schedule``'s order."""
    order = stage_schedule(num_stages, stage, num_micro_batches, num_chunks, group, ep_overlap)
    warmup = _warmup(num_stages, stage, num_micro_batches, num_chunks, group, ep_overlap)
    return receive_points(order, warmup, num_chunks > 1)


def merged_pairs(num_stages: int, stage: int, num_micro_batches: int, num_chunks: int = 1, group: int | None = None
                 ) -> list[bool]:
    """For each step of the EP A2A overlap's order: whether it is a forward of the steady phase, which runs together
    with the backward right after it (combined_1f1b); warm-up forwards run alone, even the last one before the
    backwards when every forward is a warm-up one."""
    order = stage_schedule(num_stages, stage, num_micro_batches, num_chunks, group, True)
    warmup = _warmup(num_stages, stage, num_micro_batches, num_chunks, group, True)
    return [kind == "F" and i >= warmup and i + 1 < len(order) and order[i + 1][0] == "B"
            for i, (kind, _, _) in enumerate(order)]
