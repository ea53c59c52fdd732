"""Published rows that state the same run but publish different step times.

A table may print one configuration twice (two container releases, a table and its archive) with step times far
apart, because what changed between them (the dispatcher, CUDA graphs, kernels) is not in its columns. No
prediction made from the stated columns can be right for both: for published times a <= b, the prediction
p = 2ab / (a + b) errs by (b - a) / (a + b) on each and every other p errs more on one of them. The report names
such groups and that least error, so an accuracy claim on those rows is read against what is possible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from simulator.tools.training_table import TrainingRow

# the columns that state a run (everything but where it was published and what it measured)
STATED = ("model", "params_B", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "seq_len", "TP", "PP",
          "VP", "CP", "EP", "DP", "seq_parallel", "zero_or_dist_opt", "recompute", "global_batch", "micro_batch",
          "gpu", "n_gpus", "gpus_per_node", "intra_node", "inter_node", "precision")


@dataclass(frozen=True, slots=True)
class Disagreement:
    """Rows stating the same run, with their published step times (s)."""

    row_ids: tuple[str, ...]
    published_step_time_s: tuple[float, ...]

    @property
    def spread(self) -> float:
        """Slowest / fastest published step time."""
        return max(self.published_step_time_s) / min(self.published_step_time_s)

    @property
    def least_error(self) -> float:
        """The smallest largest |error| any one prediction can have on these rows."""
        lo, hi = min(self.published_step_time_s), max(self.published_step_time_s)
        return (hi - lo) / (hi + lo)


def disagreements(rows: Sequence[TrainingRow], published_step_time_s: Mapping[str, float | None],
                  min_spread: float = 1.05) -> list[Disagreement]:
    """Groups of ``rows`` that state the same run and whose published step times (by row id) differ by at least
    ``min_spread`` (slowest / fastest), widest first."""
    groups: dict[tuple[str, ...], list[TrainingRow]] = {}
    for row in rows:
        if published_step_time_s.get(row.row_id):
            groups.setdefault(tuple(row.text(c).strip().lower() for c in STATED), []).append(row)
    found = []
    for members in groups.values():
        if len(members) > 1:
            times = tuple(float(published_step_time_s[r.row_id]) for r in members)  # type: ignore[arg-type]
            d = Disagreement(tuple(r.row_id for r in members), times)
            if d.spread >= min_spread:
                found.append(d)
    return sorted(found, key=lambda d: (-d.spread, d.row_ids))


def format_disagreements(found: Sequence[Disagreement]) -> list[str]:
    """Report lines (none when every repeated run agrees)."""
    if not found:
        return []
    lines = ["published rows that state the same run with different step times (no prediction from the stated "
             "columns can be closer than 'least |error|' to all of them):"]
    for d in found:
        times = " vs ".join(f"{t:.4g} s" for t in d.published_step_time_s)
        lines.append(f"  {', '.join(d.row_ids)}: {times} ({d.spread:.2f}x; least |error| {d.least_error:.1%})")
    return lines
