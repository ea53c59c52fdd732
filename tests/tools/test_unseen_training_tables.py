"""The published runs kept out of calibration (benchmarks/data/unseen_training/) stay readable and plannable, so
that the hold-out run at the end of a round simulates every row they hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.tools.training_layout import READY, plan_row
from simulator.tools.training_metrics import METRICS
from simulator.tools.training_table import read_tables

TABLES = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "benchmarks" / "data" /
                                 "unseen_training").glob("*.tsv"))


def test_tables_are_shipped() -> None:
    assert len(TABLES) >= 3


@pytest.mark.parametrize("row", read_tables(TABLES), ids=lambda r: r.row_id)
def test_every_row_plans_with_a_published_metric(row) -> None:
    plan = plan_row(row)
    assert plan.status == READY, plan.reason
    assert plan.metric is not None and plan.metric.name in METRICS
    assert plan.metric.published_step_time_s > 0
    assert plan.n_gpus == int(row.fields["n_gpus"])
