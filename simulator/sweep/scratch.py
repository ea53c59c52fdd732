"""Scratch folders (generated workload traces) and the signals that end a sweep, so nothing is left behind.

A scratch folder is named ``astrasim-py-generated-<pid>-<random>`` after the process that owns it and is
removed when that process ends its work, whatever the way: normally, Ctrl-C, SIGTERM or SIGHUP. A process
killed outright (SIGKILL) cannot clean up; the next sweep on this machine removes folders whose process is gone.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PREFIX = "astrasim-py-generated-"
_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)-[A-Za-z0-9_]+")


class Terminated(BaseException):
    """The sweep was told to stop by a signal other than SIGINT (which raises KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def make_folder(parent: str | None = None) -> str:
    """A new scratch folder owned by this process (inside ``parent``, else in the system's temporary folder)."""
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent)


def remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def remove_stale(folder: str | None = None) -> int:
    """Remove scratch folders left by processes that no longer exist; returns how many."""
    folder = folder or tempfile.gettempdir()
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        m = _OWNED.fullmatch(entry.name)
        if m and int(m[1]) != os.getpid() and entry.is_dir(follow_symlinks=False) and not pid_alive(int(m[1])):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += not os.path.exists(entry.path)
    return removed


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise Terminated in the main thread, so ``finally`` blocks clean up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
