"""The validation figures the README and docs/compute-model.md quote are those of the committed runs
(benchmarks/data/training_validation.json and unseen_training_validation.json): a run committed again without
its figures updated in the text fails here, so no page quotes a round the data no longer holds."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "benchmarks" / "data"
GENERATIONS = {"A100": ("A100",), "H100": ("H100", "H200"), "Blackwell": ("B200", "B300", "GB200", "GB300")}


def simulated(run: str) -> list[dict[str, Any]]:
    return [r for r in json.loads((DATA / run).read_text())["rows"] if r["status"] == "simulated"]


def is_moe(row: dict[str, Any]) -> bool:
    return int(row["generator"].get("num_experts", 1)) > 1


def figures(rows: Sequence[dict[str, Any]]) -> tuple[str, str, str, str]:
    """Rows, mean |error|, max |error| and mean error as the pages print them."""
    errors = [r["step_time_error"] for r in rows]
    return (str(len(errors)), f"{sum(map(abs, errors)) / len(errors):.1%}", f"{max(map(abs, errors)):.1%}",
            f"{sum(errors) / len(errors):+.1%}")


def table_rows(text: str, header: str) -> dict[str, tuple[str, ...]]:
    """The markdown table under the line starting with ``header``: its first cell -> its other cells."""
    lines = text[text.index(header):].splitlines()
    got = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        got[cells[0]] = tuple(cells[1:])
    return got


def cell(table: dict[str, tuple[str, ...]], label: str) -> tuple[str, ...]:
    found = [v for k, v in table.items() if k.startswith(label)]
    assert len(found) == 1, f"one table row starting {label!r}"
    return found[0]


def dense_in(generation: str) -> Callable[[dict[str, Any]], bool]:
    return lambda r: not is_moe(r) and r["device"] in GENERATIONS[generation]


def held_out_moe_group(row: dict[str, Any]) -> str:
    """The hold-out table's mixture-of-experts group of a row: by source and model family, the rest by release."""
    rid = row["row_id"]
    for pattern, group in (("^zoo_", "zoo"), ("DeepSeek|Kimi", "deepseek"), ("Nano|Lightning", "nano"),
                           ("Super", "super"), (r"_26\.0[68]", "26.06")):
        if re.search(pattern, rid):
            return group
    return "earlier"


def moe_group(group: str) -> Callable[[dict[str, Any]], bool]:
    return lambda r: is_moe(r) and held_out_moe_group(r) == group


DOC = (REPO / "docs" / "compute-model.md").read_text()
README = (REPO / "README.md").read_text()


@pytest.mark.parametrize(("run", "header", "labels"), [
    ("training_validation.json", "| rows | simulated |",
     {"dense, A100": dense_in("A100"), "dense, H100": dense_in("H100"), "dense, Blackwell": dense_in("Blackwell"),
      "all dense rows": lambda r: not is_moe(r), "mixture of experts": is_moe}),
    ("unseen_training_validation.json", "| hold-out rows | simulated |",
     {"dense, A100": dense_in("A100"), "dense, H100": dense_in("H100"), "dense, Blackwell": dense_in("Blackwell"),
      "mixture of experts, releases 26.06": moe_group("26.06"),
      "mixture of experts, releases 25.09": moe_group("earlier"),
      "DeepSeek-V3 and Kimi K2": moe_group("deepseek"), "Nemotron 3 Nano": moe_group("nano"),
      "Nemotron 3 Super": moe_group("super"), "Qwen3 235B-A22B as Megatron-MoE-ModelZoo": moe_group("zoo")}),
], ids=["shared", "hold-out"])
def test_the_docs_tables_quote_the_committed_runs(run: str, header: str, labels: dict) -> None:
    rows = simulated(run)
    table = table_rows(DOC, header)
    for label, chosen in labels.items():
        assert cell(table, label)[:4] == figures([r for r in rows if chosen(r)]), label


def test_the_readme_quotes_the_committed_runs() -> None:
    shared, unseen = simulated("training_validation.json"), simulated("unseen_training_validation.json")
    total = len(json.loads((DATA / "training_validation.json").read_text())["rows"])
    dense = figures([r for r in shared if not is_moe(r)])
    assert f"({len(shared)} of {total} simulated), dense models {dense[1]} mean" in README
    assert f"mixture-of-experts rows {figures([r for r in shared if is_moe(r)])[1]} mean" in README
    for generation in GENERATIONS:
        _, mean, worst, _ = figures([r for r in shared if dense_in(generation)(r)])
        quoted = re.search(rf"{generation} (\d+\.\d)% \(max (\d+(?:\.\d)?)%", README)
        assert quoted and f"{quoted[1]}%" == mean, generation
        assert float(quoted[2]) == pytest.approx(float(worst[:-1]), abs=0.05 if "." in quoted[2] else 0.5)
    held_dense, held_moe = figures([r for r in unseen if not is_moe(r)]), figures([r for r in unseen if is_moe(r)])
    assert f"On {len(unseen)} published runs kept out of calibration" in README
    assert f"dense {held_dense[1]} mean over {held_dense[0]} runs (max {held_dense[2]}" in README
    assert f"MoE {held_moe[1]} over {held_moe[0]} runs" in README
