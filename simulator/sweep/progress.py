"""A progress line for long batches: points done and failed, rate, ETA (redrawn in place on a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


class Progress:
    def __init__(self, total: int, label: str = "sweep", stream: TextIO | None = None, enabled: bool = True,
                 interval_s: float | None = None) -> None:
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.interval_s = interval_s if interval_s is not None else (0.2 if self.tty else 10.0)
        self.done = self.failed = 0
        self.started = time.monotonic()
        self.shown_at = self.started

    def update(self, ok: bool) -> None:
        self.done += 1
        self.failed += not ok
        now = time.monotonic()
        if self.enabled and (now - self.shown_at >= self.interval_s or self.done == self.total):
            self.shown_at = now
            self._show(now)

    def skip(self) -> None:
        """One point fewer to run (another process has it)."""
        self.total -= 1
        if self.enabled and self.done == self.total and self.total:
            self._show(time.monotonic())

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.monotonic()) - self.started
        width = 24
        filled = width * self.done // self.total if self.total else width
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = format_duration((self.total - self.done) / rate) if rate and self.done < self.total else "-"
        return (f"{self.label}: [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} done, "
                f"{self.failed} failed, {rate:.1f} points/s, elapsed {format_duration(elapsed)}, ETA {eta}")

    def _show(self, now: float) -> None:
        if self.tty:
            self.stream.write("\r" + self.line(now) + "\x1b[K")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End an interrupted bar's line."""
        if self.enabled and self.tty and self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()
