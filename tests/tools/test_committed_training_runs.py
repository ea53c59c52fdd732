"""The committed validation runs (benchmarks/data/training_validation.json and unseen_training_validation.json,
which the README and docs/compute-model.md quote) are runs of what validate-training plans now: every simulated
row's generator mapping, defaults and the values its release's code states otherwise are the ones the current
tables, cards and recipes give. A change to a default, a card or a recipe fails here until the rows it touches are
run again (benchmarks/training_validation.py --resume keeps the others)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.tools.training_layout import plan_row
from simulator.tools.training_table import read_tables
from tests.conftest import SHARED

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
RUNS = (("training_validation.json", SHARED / "reference" / "hardware" / "training"),
        ("unseen_training_validation.json", DATA / "unseen_training"))


@pytest.mark.parametrize(("run", "folder"), RUNS, ids=[r for r, _ in RUNS])
def test_committed_rows_are_runs_of_the_current_plans(run: str, folder: Path) -> None:
    if not folder.is_dir():
        pytest.skip(f"needs {folder} (../shared beside this checkout, as CI has it)")
    saved = {r["row_id"]: r for r in json.loads((DATA / run).read_text())["rows"]}
    rows = read_tables(sorted(str(p) for p in folder.glob("*.tsv")))
    assert sorted(saved) == sorted(r.row_id for r in rows), "the committed run is not of these tables"
    stale = []
    for row in rows:
        got = saved[row.row_id]
        if got["status"] != "simulated":
            continue
        plan = plan_row(row)
        if (json.loads(json.dumps(plan.spec)) != got["generator"] or plan.defaults_used != got["defaults_used"]
                or plan.code_states != got.get("code_states", {})):
            stale.append(row.row_id)
    assert not stale, f"{len(stale)} committed rows were run with other settings than planned now: {stale[:5]}"
