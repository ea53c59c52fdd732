"""Sweep results in SQLite (``DIR/results.db``): one row per point, committed as each point finishes.

Tables:
  points  key (hash of the resolved run), idx, status ('ok' | 'failed'), error, warnings, one column per
          swept setting (named as in the sweep file), the metric columns of ``worker.METRICS``, the resolved
          configs as JSON (config_*, config_compute: the compute model as run), version. All deterministic.
  runs    one row per execution of a point: key, attempt, status, wall_time_s, worker, finished_at.
  claims  the points a sweep process is running now: key, owner, host, pid, lease_until (epoch seconds). Two
          sweeps on one folder skip each other's points; a claim whose process is gone, or whose lease ran
          out (its holder stopped renewing it), is free again.
  meta    the schema, the sweep file and its text, per run of the sweep command; 'units': {column: unit} of
          every time and rate column as JSON (busbw_GBps: GB = 10^9 B; network.bandwidth: GB = 2^30 B).
"""

from __future__ import annotations

import csv
import json
import os
import socket
import sqlite3
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from simulator.simulation import VERSION
from simulator.sweep.scratch import pid_alive
from simulator.sweep.spec import Point
from simulator.sweep.worker import METRICS
from simulator.units import column_units, current_key
from workload.errors import InputError
from workload.files import inert_row, shown_path

CONFIG_COLUMNS = ("config_workload", "config_network", "config_system", "config_memory", "config_comm_groups",
                  "config_options")
DB_NAME = "results.db"
SCHEMA = "astrasim-py sweep results 2"
LEASE_S = 600.0  # a claim not renewed for this long is free (its holder renews it every HEARTBEAT_S)
BUSY_TIMEOUT_S = 60.0  # how long a write waits for another sweep process's transaction
# what a results.db of the first schema (no 'schema' in meta) already has; the rest is added on first write
_FIRST_SCHEMA = {"points": {"key", "idx", "status", "error", "warnings", "version"},
                 "runs": {"key", "attempt", "status", "wall_time_s", "worker", "finished_at"},
                 "meta": {"name", "value"}}


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def cell(value: Any) -> Any:
    """A setting as stored: numbers and text as they are, anything else (lists, mappings, integers beyond
    SQLite's 64 bits) as JSON text."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < 1 << 63:
        return json.dumps(value)
    if value is None or (isinstance(value, (int, float, str)) and not isinstance(value, bool)):
        return value
    if isinstance(value, bool):
        return int(value)
    return json.dumps(value, sort_keys=True)


class ResultStore:
    """The results database of one sweep folder: created on first use, or opened read-only (``create=False``)."""

    def __init__(self, directory: str, create: bool = True) -> None:
        self.path = os.path.join(directory, DB_NAME)
        self.writable = create
        self.host = socket.gethostname()
        self.owner = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        where = shown_path(directory)
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise InputError(f"{where}: not a folder (--out names the folder that holds {DB_NAME})")
        if not create and not os.path.exists(self.path):
            raise InputError(f"{where}: no sweep results here ({DB_NAME} not found)")
        try:
            if create:
                os.makedirs(directory, exist_ok=True)
                # autocommit: transactions are explicit (BEGIN IMMEDIATE), so a claim is checked and taken at once
                self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                self._check_schema()
                self.db.execute("PRAGMA journal_mode=WAL")  # readers (export, plot) never block the sweep
                self.db.execute("PRAGMA synchronous=NORMAL")
                self._create()
            else:
                self.db = _connect_read_only(self.path, directory)
                self._check_schema()
        except sqlite3.DatabaseError as e:
            raise InputError(f"{shown_path(self.path)}: not a usable results database ({e})") from None
        except OSError as e:
            raise InputError(f"{where}: cannot hold the results: {e.strerror}") from None

    def _check_schema(self) -> None:
        """Refuse a database that is not sweep results (another program's, or a newer astrasim-py's)."""
        tables = {name: {row[1] for row in self.db.execute(f"PRAGMA table_info({quote(name)})")}
                  for (name,) in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            if not self.writable:
                raise InputError(f"{shown_path(self.path)}: no sweep results in this database (it is empty)")
            return
        schema = None
        if {"name", "value"} <= tables.get("meta", set()):
            row = self.db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            schema = row[0] if row else None
        if schema == SCHEMA:
            return
        if schema is None and all(columns <= tables.get(name, set()) for name, columns in _FIRST_SCHEMA.items()):
            return  # an earlier astrasim-py's results: readable as they are, completed by _create on a write
        what = f"schema {schema!r}" if schema else "tables " + ", ".join(sorted(tables)[:8])
        raise InputError(f"{shown_path(self.path)}: a database of another schema ({what}), not the sweep results "
                         f"this astrasim-py writes ({SCHEMA!r}); use another results folder")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, holding the database's write lock from its start (BEGIN IMMEDIATE)."""
        if self.db.in_transaction:  # a signal (SIGTERM, Ctrl-C) stopped an earlier one between its BEGIN and its end
            self.db.execute("ROLLBACK")
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _create(self) -> None:
        metrics = ", ".join(f"{quote(k)} {t}" for k, t in METRICS.items())
        configs = ", ".join(f"{c} TEXT" for c in (*CONFIG_COLUMNS, "config_compute"))
        with self._transaction() as db:
            db.execute(f"CREATE TABLE IF NOT EXISTS points (key TEXT PRIMARY KEY, idx INTEGER, status TEXT NOT "
                       f"NULL, error TEXT, warnings TEXT, {metrics}, {configs}, version TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL, attempt INTEGER NOT NULL, status "
                       "TEXT NOT NULL, wall_time_s REAL, worker TEXT, finished_at TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT "
                       "NOT NULL, pid INTEGER NOT NULL, lease_until REAL NOT NULL)")
            # SQLite's column names ignore case: an earlier version's busbw_gbps column holds busbw_GBps
            have = {row[1].lower() for row in db.execute("PRAGMA table_info(points)")}
            wanted = {**METRICS, **{c: "TEXT" for c in (*CONFIG_COLUMNS, "config_compute")}}
            for name, kind in wanted.items():  # an earlier schema's table gains the newer columns
                if name.lower() not in have:
                    db.execute(f"ALTER TABLE points ADD COLUMN {quote(name)} {kind}")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (SCHEMA,))

    def columns(self) -> list[str]:
        return [current_key(row[1]) for row in self.db.execute("PRAGMA table_info(points)")]

    def add_setting_columns(self, names: Iterable[str]) -> None:
        """A column for every swept setting (a new axis adds a column; older rows hold NULL there)."""
        with self._transaction() as db:
            have = {row[1] for row in db.execute("PRAGMA table_info(points)")}
            for name in names:
                if name not in have:
                    db.execute(f"ALTER TABLE points ADD COLUMN {quote(name)}")
                    have.add(name)
            # what the numbers mean: {column: unit} for every time and rate column, settings included
            columns = [row[1] for row in db.execute("PRAGMA table_info(points)")]
            db.execute("INSERT OR REPLACE INTO meta VALUES ('units', ?)",
                       (json.dumps(column_units(columns), sort_keys=True),))

    def set_meta(self, **values: str) -> None:
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())

    def status(self) -> dict[str, str]:
        """key -> status of every recorded point."""
        return dict(self.db.execute("SELECT key, status FROM points"))

    def claim(self, key: str) -> str:
        """Take point ``key`` for this process: 'claimed', or 'done' (ok already) or 'held' (another live sweep
        process has it). Checked and taken in one transaction, so two processes never both take a point."""
        now = time.time()
        with self._transaction() as db:
            row = db.execute("SELECT status FROM points WHERE key = ?", (key,)).fetchone()
            if row is not None and row[0] == "ok":
                return "done"
            held = db.execute("SELECT owner, host, pid, lease_until FROM claims WHERE key = ?", (key,)).fetchone()
            if held is not None and held[0] != self.owner and self._live(held[1], held[2], held[3], now):
                return "held"
            db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)",
                       (key, self.owner, self.host, os.getpid(), now + LEASE_S))
        return "claimed"

    def _live(self, host: str, pid: int, lease_until: float, now: float) -> bool:
        if lease_until < now:
            return False
        return host != self.host or pid_alive(pid)

    def renew_claims(self) -> None:
        """Keep this process's claims (its points are still running)."""
        with self._transaction() as db:
            db.execute("UPDATE claims SET lease_until = ? WHERE owner = ?", (time.time() + LEASE_S, self.owner))

    def release_claims(self) -> None:
        """Give back the points this process claimed and did not finish (it is stopping)."""
        if self.writable:
            with self._transaction() as db:
                db.execute("DELETE FROM claims WHERE owner = ?", (self.owner,))

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
        compute = outcome.get("compute")
        row["config_compute"] = None if compute is None else json.dumps(compute, sort_keys=True)
        row["version"] = VERSION
        names = ", ".join(quote(k) for k in row)
        marks = ", ".join("?" for _ in row)
        with self._transaction() as db:
            attempt = db.execute("SELECT COUNT(*) FROM runs WHERE key = ?", (point.key,)).fetchone()[0] + 1
            db.execute(f"INSERT OR REPLACE INTO points ({names}) VALUES ({marks})", list(row.values()))
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)",
                       (point.key, attempt, outcome["status"], round(outcome.get("wall_time_s", 0.0), 6),
                        outcome.get("worker"), time.strftime("%Y-%m-%dT%H:%M:%S")))
            db.execute("DELETE FROM claims WHERE key = ? AND owner = ?", (point.key, self.owner))

    def rows(self, where: str = "", params: Iterable[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        cursor = self.db.execute(f"SELECT * FROM points {where} ORDER BY idx, key", list(params))
        return [current_key(d[0]) for d in cursor.description], cursor.fetchall()  # earlier *_gbps as *_GBps

    def export_csv(self, path: str) -> int:
        """Write every point as CSV ('-' for standard output), formula-like cells made inert; returns the rows."""
        names, rows = self.rows()
        out = sys.stdout if path == "-" else open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115
        try:
            writer = csv.writer(out)
            writer.writerow(inert_row(names))
            writer.writerows(inert_row(row) for row in rows)
        finally:
            if out is not sys.stdout:
                out.close()
        return len(rows)

    def close(self) -> None:
        self.db.close()


def _connect_read_only(path: str, directory: str) -> sqlite3.Connection:
    """Read without writing anything, also in a folder we may not write to (an archive, another user's)."""
    uri = "file:" + urllib.parse.quote(os.path.abspath(path))
    db = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:
        db.close()
        if os.access(directory, os.W_OK):
            raise
    # A WAL database needs its -shm file, which a read-only folder cannot hold: nobody can be writing it there.
    return sqlite3.connect(uri + "?immutable=1", uri=True)
