"""The published runs kept out of calibration (benchmarks/data/unseen_training/) stay readable and plannable, so
that the hold-out run at the end of a round simulates every row they hold whose model the generator knows. A row
of a model with no card (Nemotron 3 Ultra/Super, DeepSeek-V4), one needing a layer kind the generator lacks
(Mamba-2), one whose printed layout no code ran (three 25.11 DeepSeek-V3 rows) or one its source reports as a known
performance regression of its release (two 26.06.01 GPT-OSS rows) is kept as published and reported as such, nothing
else: its layout, batch and metric columns must still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.tools.training_layout import NEEDS, READY, UNSUPPORTED, plan_row
from simulator.tools.training_metrics import METRICS
from simulator.tools.training_table import number, read_tables, whole

TABLES = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "benchmarks" / "data" /
                                 "unseen_training").glob("*.tsv"))


def test_tables_are_shipped() -> None:
    assert len(TABLES) >= 3


@pytest.mark.parametrize("row", read_tables(TABLES), ids=lambda r: r.row_id)
def test_every_row_plans_with_a_published_metric(row) -> None:
    plan = plan_row(row)
    assert plan.n_gpus == int(row.fields["n_gpus"])
    kept = plan.status == UNSUPPORTED and plan.reason.startswith(("the layout as printed does not run",
                                                                   "the source marks this figure as a known"))
    if plan.status == NEEDS or (plan.status == UNSUPPORTED and plan.reason.startswith("model ")) or kept:
        assert plan.layout, "the row's parallel layout does not read"
        assert whole(row, "global_batch") and whole(row, "micro_batch")
        assert any(number(row, c) for c in ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu"))
        return
    assert plan.status == READY, plan.reason
    assert plan.metric is not None and plan.metric.name in METRICS
    assert plan.metric.published_step_time_s > 0
