"""Where sweep points run: in local worker processes, or as Ray tasks.

Every executor yields ``(point, outcome)`` as points finish, in completion order; the caller records them.
Outcomes come from ``worker.run_point``, so a point that fails never stops the others. Local points always
run in child processes, one point at a time per process: a point that exhausts memory, crashes or is killed
takes only its own process down and becomes a failed outcome saying how it ended.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from simulator.sweep import scratch, worker
from simulator.sweep.spec import Point
from simulator.sweep.worker import run_point
from workload.errors import InputError
from workload.optional import require

Outcome = dict[str, Any]
Heartbeat = Callable[[], None]
EXECUTORS = ("local", "ray")
HEARTBEAT_S = 30.0  # how often a long wait calls the heartbeat (the caller renews its claims)


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def capped_jobs(requested: int | None, force: bool, warn: Callable[[str], None]) -> int:
    """``requested`` (default: every core), at most the cores there are unless ``force``."""
    cores = default_jobs()
    if requested is None:
        return cores
    if requested < 1:
        raise InputError("--jobs must be at least 1")
    if requested > cores and not force:
        warn(f"--jobs {requested} is more than the {cores} core(s) this process may use: running {cores} at once "
             "(more would only compete for the same cores; --force-jobs runs them anyway)")
        return cores
    return requested


def run_points(points: Iterable[Point], executor: str = "local", jobs: int | None = None,
               ray_address: str | None = None, memory_limit_bytes: int | None = None,
               heartbeat: Heartbeat | None = None) -> Iterator[tuple[Point, Outcome]]:
    """Run ``points`` (taken lazily, as workers free up) on ``jobs`` workers."""
    if executor == "ray":
        return run_ray(list(points), jobs, ray_address, heartbeat)
    if executor != "local":
        raise ValueError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    return run_pool(points, jobs or default_jobs(), memory_limit_bytes, heartbeat)


def _call(point: Point) -> Outcome:
    return run_point(point.run, point.root, point.sources, point.error)


def _call_batch(points: list[Point]) -> list[Outcome]:
    try:
        return [_call(point) for point in points]
    finally:
        worker.discard_generated()  # a Ray worker lives on after its tasks: leave nothing behind


def run_inline(points: Iterable[Point]) -> Iterator[tuple[Point, Outcome]]:
    """In this process (no isolation: for tests and the API)."""
    for point in points:
        yield point, _call(point)


def die_with_parent() -> None:
    """This child process is killed when its parent ends, however it ends (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _worker_init(memory_limit_bytes: int | None) -> None:
    # Ctrl-C is the driver's to handle (it stops the workers); and a worker must not outlive a killed driver.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)  # not the driver's handlers, inherited through fork
    die_with_parent()
    if memory_limit_bytes:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = memory_limit_bytes if hard == resource.RLIM_INFINITY else min(memory_limit_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _serve(conn: mpc.Connection, folder: str, memory_limit_bytes: int | None) -> None:
    """A worker process: run the points sent to it, one at a time, until told to stop (None)."""
    _worker_init(memory_limit_bytes)
    worker.use_scratch(folder, memory_limit_bytes)
    while True:
        try:
            point = conn.recv()
        except (EOFError, OSError):
            return
        if point is None:
            return
        conn.send(_call(point))


class _Worker:
    """One child process and the point it is running."""

    def __init__(self, ctx: Any, folder: str, memory_limit_bytes: int | None) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, folder, memory_limit_bytes), daemon=True)
        self.process.start()
        child.close()
        self.point: Point | None = None

    def start(self, point: Point) -> bool:
        try:
            self.conn.send(point)
        except (BrokenPipeError, OSError):  # it died while idle
            return False
        self.point = point
        return True

    def outcome(self) -> Outcome | None:
        """The finished point's outcome, or None when the process died instead."""
        try:
            if self.conn.poll():
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        return None

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class _Beat:
    """Calls the heartbeat when HEARTBEAT_S have passed since the last call."""

    def __init__(self, heartbeat: Heartbeat | None) -> None:
        self.heartbeat = heartbeat
        self.due = time.monotonic() + HEARTBEAT_S

    def wait_s(self) -> float:
        return max(0.0, self.due - time.monotonic())

    def __call__(self) -> None:
        if self.heartbeat is not None and time.monotonic() >= self.due:
            self.heartbeat()
            self.due = time.monotonic() + HEARTBEAT_S


def _context() -> Any:
    # fork: workers start in milliseconds and need nothing re-imported
    return mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()


def run_pool(points: Iterable[Point], jobs: int, memory_limit_bytes: int | None = None,
             heartbeat: Heartbeat | None = None) -> Iterator[tuple[Point, Outcome]]:
    """``jobs`` worker processes, each given its next point when it finishes one; a dead worker is replaced."""
    scratch.remove_stale()
    folder = scratch.make_folder()
    ctx = _context()
    todo = iter(points)
    idle: list[_Worker] = []
    busy: dict[Any, _Worker] = {}  # by the worker's connection
    beat = _Beat(heartbeat)
    try:
        exhausted = False
        while True:
            while not exhausted and len(busy) < jobs:
                point = next(todo, None)
                if point is None:
                    exhausted = True
                    break
                w = idle.pop() if idle else _Worker(ctx, folder, memory_limit_bytes)
                while not w.start(point):
                    w.kill()
                    w = _Worker(ctx, folder, memory_limit_bytes)
                busy[w.conn] = w
            if not busy:
                return
            waits = list(busy) + [w.process.sentinel for w in busy.values()]
            ready = set(mpc.wait(waits, timeout=beat.wait_s()))
            beat()
            for conn, w in list(busy.items()):
                if conn not in ready and w.process.sentinel not in ready:
                    continue
                del busy[conn]
                point, w.point = w.point, None
                assert point is not None
                outcome = w.outcome()
                if outcome is None:
                    w.kill()
                    outcome = _died(w.process.exitcode, memory_limit_bytes)
                else:
                    idle.append(w)
                yield point, outcome
    finally:
        for w in [*idle, *busy.values()]:
            w.kill()
        scratch.remove(folder)


LOOPBACK = "127.0.0.1"


def _loopback_only(ray: Any) -> None:
    """The same switch as the environment variable, for a Ray imported before it was set."""
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        constants.ENABLE_RAY_CLUSTER = False


def _died(exitcode: int | None, memory_limit_bytes: int | None = None) -> Outcome:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        why = " (a crash)" if -exitcode in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT) else ""
        if why and memory_limit_bytes:
            why = (f" (a crash, most often an allocation refused by the --worker-memory limit of "
                   f"{memory_limit_bytes / 2**30:.3g} GiB)")
        elif -exitcode == signal.SIGKILL:
            why = " (most often the kernel's out-of-memory killer: the point needed more memory than was free)"
        how = f"was killed by {name}{why}"
    else:
        how = f"exited with status {exitcode}"
    return {"status": "failed", "metrics": {}, "warnings": None, "wall_time_s": 0.0, "worker": None, "compute": None,
            "error": f"the worker process simulating this point {how}; run the sweep again to retry it"}


def run_ray(points: Sequence[Point], jobs: int | None, address: str | None, heartbeat: Heartbeat | None = None
            ) -> Iterator[tuple[Point, Outcome]]:
    """Each point a Ray task, on the cluster at ``address`` or on a local Ray instance with ``jobs`` CPUs.

    A local instance listens on 127.0.0.1 only. Workers need astrasim-py installed, and trace files at the
    same paths (generated workloads need no files).
    """
    if not address:
        # Ray's own switch for a node reachable from this machine only (its default on macOS and Windows):
        # every service it starts then listens on 127.0.0.1. Read at import, and by the processes Ray starts.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = require("ray", "ray", "--executor ray")
    started_here = not ray.is_initialized()
    if started_here:
        scratch.remove_stale()
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if address:
            kwargs["address"] = address
        else:
            _loopback_only(ray)
            kwargs.update(num_cpus=jobs or default_jobs(), _node_ip_address=LOOPBACK)
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise InputError(f"--executor ray: cannot start or reach {where}: {e}") from None
        if not address and {n.get("NodeManagerAddress") for n in ray.nodes()} != {LOOPBACK}:
            ray.shutdown()
            raise InputError("--executor ray: this Ray version would listen on more than 127.0.0.1; start a Ray "
                             "cluster as you need it and give its --ray-address")
    task = ray.remote(num_cpus=1, max_retries=1)(_call_batch)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    # Several points per task when there are many: a Ray task costs milliseconds, a small point about as much.
    batch = max(1, min(16, len(points) // (8 * cpus)))
    todo = iter([list(points[i:i + batch]) for i in range(0, len(points), batch)])
    running: dict[Any, list[Point]] = {}
    beat = _Beat(heartbeat)
    try:
        while True:
            while len(running) < 2 * cpus:
                group = next(todo, None)
                if group is None:
                    break
                running[task.remote(group)] = group
            if not running:
                return
            done, _ = ray.wait(list(running), num_returns=1, timeout=beat.wait_s())
            beat()
            for ref in done:
                group = running.pop(ref)
                try:
                    outcomes = ray.get(ref)
                except Exception as e:  # the task's worker died (Ray's errors do not share a base class we can name)
                    outcomes = [_died(None) for _ in group]  # the message is replaced below
                    for outcome in outcomes:
                        outcome["error"] = f"Ray task failed: {type(e).__name__}: {str(e).splitlines()[0]}"
                yield from zip(group, outcomes, strict=True)
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
