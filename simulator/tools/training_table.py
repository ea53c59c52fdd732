"""Tables of published training runs (the columns of ``../shared/reference/hardware/training/*.tsv``), read into
rows whose fields keep the source's own text.

Published tables write what they know the way the source printed it: ``12 (custom.yaml default)``, ``1 (2)`` (a
second configuration in parentheses), ``44% (of 312 TF peak ...)``, ``implied (--tp-comm-overlap requires
--sequence-parallel)``, or nothing at all. A row therefore keeps every field as text, and the helpers here read
the leading number or flag out of it; what a blank means is decided later, by the framework defaults
(simulator/tools/training_layout.py), so that every default is reported.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from workload.errors import InputError
from workload.files import shown_path

COLUMNS = ("source_id", "source", "source_section", "row_id", "model", "params_B", "layers", "hidden", "ffn_hidden",
           "heads", "kv_heads", "vocab", "seq_len", "TP", "PP", "VP", "CP", "EP", "DP", "seq_parallel",
           "zero_or_dist_opt", "recompute", "global_batch", "micro_batch", "gpu", "n_gpus", "gpus_per_node",
           "intra_node", "inter_node", "precision", "tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu",
           "other_metric", "derived_step_time_s", "derived_note", "notes")
REQUIRED = ("source_id", "row_id", "model", "gpu", "n_gpus")
_NUMBER = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*(%?)")
MAX_ROWS = 100_000


@dataclass(frozen=True, slots=True)
class TrainingRow:
    """One published run: ``fields`` maps every column to the source's text ("" when blank)."""

    table: str  # the file's name
    line: int  # 1-based line in the file
    fields: dict[str, str]

    @property
    def row_id(self) -> str:
        return self.fields["row_id"]

    @property
    def source_id(self) -> str:
        return self.fields["source_id"]

    def text(self, column: str) -> str:
        return self.fields.get(column, "").strip()

    def where(self, column: str) -> str:
        return f"{self.table}:{self.line} ({self.row_id}) column {column}"


def leading_number(text: str) -> tuple[float, str] | None:
    """(value, the rest of the text) when ``text`` starts with a number; a trailing % divides by 100."""
    found = _NUMBER.match(text)
    if not found or not found.group(1):
        return None
    value = float(found.group(1))
    if found.group(2):
        value /= 100
    return value, text[found.end():].strip()


def number(row: TrainingRow, column: str) -> float | None:
    """The leading number of a field, or None when the field is blank or does not start with one."""
    got = leading_number(row.text(column))
    return None if got is None else got[0]


def whole(row: TrainingRow, column: str) -> int | None:
    """The leading whole number of a field (None: blank or not a whole number)."""
    value = number(row, column)
    if value is None or value != int(value):
        return None
    return int(value)


def alternative_note(row: TrainingRow, column: str) -> str:
    """"" or a note when the field gives a second value in parentheses (another configuration of the source)."""
    got = leading_number(row.text(column))
    if got is None:
        return ""
    rest = got[1]
    if rest.startswith("(") and leading_number(rest[1:]) is not None:
        return f"{column}: the value in parentheses {rest} (the source's alternative configuration) is not used"
    return ""


def flag(text: str) -> bool | None:
    """yes/no read from a field's first word (True, yes, implied, on / False, no, none, off); None when blank or
    neither."""
    word = text.strip().split(" ")[0].strip("(),;").lower() if text.strip() else ""
    if word in ("yes", "true", "on", "implied", "enabled", "1"):
        return True
    if word in ("no", "false", "off", "none", "disabled", "0"):
        return False
    return None


def read_tables(paths: list[str]) -> list[TrainingRow]:
    """Every row of the given tables, in file order. A missing required column or value is an InputError naming
    the file (and line)."""
    rows: list[TrainingRow] = []
    seen: dict[str, str] = {}
    for path in paths:
        name = Path(path).name
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t")
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise InputError(f"{shown_path(path)}: not a training table: no column(s) {', '.join(missing)} "
                                 f"(expected the columns {', '.join(COLUMNS[:6])}, ...)")
            for number_, raw in enumerate(reader, start=2):
                if len(rows) >= MAX_ROWS:
                    raise InputError(f"{shown_path(path)}: more than {MAX_ROWS:,} rows")
                fields = {c: (raw.get(c) or "") for c in COLUMNS}
                if not any(v.strip() for v in fields.values()):
                    continue
                row = TrainingRow(name, number_, fields)
                for column in REQUIRED:
                    if not row.text(column):
                        raise InputError(f"{shown_path(path)}:{number_}: column {column} is empty")
                if row.row_id in seen:
                    raise InputError(f"{shown_path(path)}:{number_}: row_id {row.row_id!r} appears twice (also in "
                                     f"{seen[row.row_id]})")
                seen[row.row_id] = f"{name}:{number_}"
                rows.append(row)
    if not rows:
        raise InputError("the training tables hold no rows")
    return rows
