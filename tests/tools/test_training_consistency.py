"""Rows that state one run with different published times: found, and the least error any prediction can have."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from simulator.tools.training_consistency import Disagreement, disagreements
from simulator.tools.training_table import TrainingRow, read_tables

SHARED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "hardware" / "training"


def _row(row_id: str, **fields: str) -> TrainingRow:
    base = {"row_id": row_id, "source_id": "s", "model": "M", "TP": "1", "PP": "1", "n_gpus": "8", "gpu": "H100"}
    return TrainingRow("t.tsv", 2, {**base, **fields})


def test_same_stated_run_with_different_times_is_found_and_others_are_not() -> None:
    rows = [_row("a"), _row("b"), _row("c", TP="2"), _row("d", TP="2")]
    found = disagreements(rows, {"a": 10.0, "b": 17.7, "c": 5.0, "d": 5.1})
    assert [d.row_ids for d in found] == [("a", "b")]  # c/d differ by 2%: below the 5% threshold
    assert abs(found[0].least_error - 7.7 / 27.7) < 1e-12
    assert disagreements(rows, {"a": 10.0, "b": None}) == []  # a row without a published time takes no part


@given(st.floats(0.1, 100), st.floats(1.0, 5.0), st.floats(0.05, 500))
def test_least_error_is_the_best_any_prediction_does_on_both(a: float, ratio: float, p: float) -> None:
    d = Disagreement(("x", "y"), (a, a * ratio))
    worst = max(abs(p / t - 1) for t in d.published_step_time_s)
    assert worst >= d.least_error - 1e-12
    best = 2 * a * a * ratio / (a + a * ratio)
    assert abs(max(abs(best / t - 1) for t in d.published_step_time_s) - d.least_error) < 1e-9


def test_the_shared_tables_repeat_one_run_far_apart() -> None:
    """Megatron-Bridge prints H100 Qwen3 30B-A3B (16 GPUs, PP2 VP12 EP8) at 28.94 s and at 51.27 s."""
    rows = read_tables(sorted(str(p) for p in SHARED.glob("*.tsv")))
    times = {r.row_id: float(r.text("step_time_s") or r.text("derived_step_time_s") or 0) or None for r in rows}
    widest = disagreements(rows, times)[0]
    assert widest.spread > 1.7 and all("Qwen3_30B" in r for r in widest.row_ids)


def test_cli_reports_them_in_text_and_json(tmp_path: Path) -> None:
    table = SHARED / "megatron_bridge_perf.tsv"
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "simulator", "validate-training", "--tables", str(table),
                           "--plan-only", "--rows", "H100_Qwen3_30B_a3B_16_FP8", "--json", str(out)],
                          capture_output=True, text=True, check=True)
    assert "least |error|" in done.stdout
    found = json.loads(out.read_text())["disagreements"]
    assert len(found) == 1 and found[0]["least_error"] > 0.25
