"""Sweep results in SQLite (``DIR/results.db``): one row per point, committed as each point finishes.

Tables:
  points  key (hash of the resolved run), idx, status ('ok' | 'failed'), error, warnings, one column per
          swept setting (named as in the sweep file), the metric columns of ``worker.METRICS``, the resolved
          configs as JSON (config_*), version. Everything in it is deterministic.
  runs    one row per execution of a point: key, attempt, status, wall_time_s, worker, finished_at.
  meta    the sweep file and its text, per run of the sweep command.
"""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterable
from typing import Any

from simulator.simulation import VERSION
from simulator.sweep.spec import Point
from simulator.sweep.worker import METRICS
from workload.errors import InputError

CONFIG_COLUMNS = ("config_workload", "config_network", "config_system", "config_memory", "config_comm_groups",
                  "config_options")
DB_NAME = "results.db"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def cell(value: Any) -> Any:
    """A setting as stored: numbers and text as they are, anything else (lists, mappings) as JSON."""
    if value is None or (isinstance(value, (int, float, str)) and not isinstance(value, bool)):
        return value
    if isinstance(value, bool):
        return int(value)
    return json.dumps(value, sort_keys=True)


class ResultStore:
    """The results database of one sweep folder (created on first use)."""

    def __init__(self, directory: str, create: bool = True) -> None:
        self.path = os.path.join(directory, DB_NAME)
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise InputError(f"{directory}: not a folder (--out names the folder that holds {DB_NAME})")
        if not create and not os.path.exists(self.path):
            raise InputError(f"{directory}: no sweep results here ({DB_NAME} not found)")
        try:
            if create:
                os.makedirs(directory, exist_ok=True)
            self.db = sqlite3.connect(self.path)
            self.db.execute("PRAGMA journal_mode=WAL")  # readers (export, plot) never block the sweep
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._create()
        except sqlite3.DatabaseError as e:
            raise InputError(f"{self.path}: not a usable results database ({e})") from None
        except OSError as e:
            raise InputError(f"{directory}: cannot hold the results: {e.strerror}") from None

    def _create(self) -> None:
        metrics = ", ".join(f"{quote(k)} {t}" for k, t in METRICS.items())
        configs = ", ".join(f"{c} TEXT" for c in CONFIG_COLUMNS)
        with self.db:
            self.db.execute(f"CREATE TABLE IF NOT EXISTS points (key TEXT PRIMARY KEY, idx INTEGER, status TEXT NOT "
                            f"NULL, error TEXT, warnings TEXT, {metrics}, {configs}, version TEXT)")
            self.db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL, attempt INTEGER NOT NULL, status "
                            "TEXT NOT NULL, wall_time_s REAL, worker TEXT, finished_at TEXT)")
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")

    def columns(self) -> list[str]:
        return [row[1] for row in self.db.execute("PRAGMA table_info(points)")]

    def add_setting_columns(self, names: Iterable[str]) -> None:
        """A column for every swept setting (a new axis adds a column; older rows hold NULL there)."""
        have = set(self.columns())
        with self.db:
            for name in names:
                if name not in have:
                    self.db.execute(f"ALTER TABLE points ADD COLUMN {quote(name)}")
                    have.add(name)

    def set_meta(self, **values: str) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())

    def status(self) -> dict[str, str]:
        """key -> status of every recorded point."""
        return dict(self.db.execute("SELECT key, status FROM points"))

    def record(self, point: Point, outcome: dict[str, Any]) -> None:
        """Store one finished point (replacing an earlier failed attempt) and its execution, in one commit."""
        run = point.run or {}
        row: dict[str, Any] = {"key": point.key, "idx": point.index, "status": outcome["status"],
                               "error": outcome["error"], "warnings": outcome.get("warnings")}
        row.update({name: cell(value) for name, value in point.settings.items()})
        row.update({k: outcome["metrics"].get(k) for k in METRICS})
        for column in CONFIG_COLUMNS:
            value = run.get(column.removeprefix("config_"))
            row[column] = None if value is None else json.dumps(value, sort_keys=True)
        row["version"] = VERSION
        names = ", ".join(quote(k) for k in row)
        marks = ", ".join("?" for _ in row)
        with self.db:
            attempt = self.db.execute("SELECT COUNT(*) FROM runs WHERE key = ?", (point.key,)).fetchone()[0] + 1
            self.db.execute(f"INSERT OR REPLACE INTO points ({names}) VALUES ({marks})", list(row.values()))
            self.db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)",
                            (point.key, attempt, outcome["status"], round(outcome.get("wall_time_s", 0.0), 6),
                             outcome.get("worker"), time.strftime("%Y-%m-%dT%H:%M:%S")))

    def rows(self, where: str = "", params: Iterable[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        cursor = self.db.execute(f"SELECT * FROM points {where} ORDER BY idx, key", list(params))
        return [d[0] for d in cursor.description], cursor.fetchall()

    def export_csv(self, path: str) -> int:
        """Write every point as CSV ('-' for standard output); returns the number of rows."""
        names, rows = self.rows()
        out = sys.stdout if path == "-" else open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115
        try:
            writer = csv.writer(out)
            writer.writerow(names)
            writer.writerows(rows)
        finally:
            if out is not sys.stdout:
                out.close()
        return len(rows)

    def close(self) -> None:
        self.db.close()
