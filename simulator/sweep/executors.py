"""Where sweep points run: in this process, in a pool of local worker processes, or as Ray tasks.

Every executor yields ``(point, outcome)`` as points finish, in completion order; the caller records them.
Outcomes come from ``worker.run_point``, so a point that fails never stops the others.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from simulator.sweep.spec import Point
from simulator.sweep.worker import run_point
from workload.errors import InputError
from workload.optional import require

Outcome = dict[str, Any]
EXECUTORS = ("local", "ray")


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_points(points: Sequence[Point], executor: str = "local", jobs: int | None = None,
               ray_address: str | None = None) -> Iterator[tuple[Point, Outcome]]:
    if executor == "ray":
        return run_ray(points, jobs, ray_address)
    if executor != "local":
        raise ValueError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    jobs = jobs or default_jobs()
    return run_inline(points) if jobs == 1 or len(points) <= 1 else run_pool(points, jobs)


def _call(point: Point) -> Outcome:
    return run_point(point.run, point.root, point.sources, point.error)


def _call_batch(points: list[Point]) -> list[Outcome]:
    return [_call(point) for point in points]


def run_inline(points: Sequence[Point]) -> Iterator[tuple[Point, Outcome]]:
    for point in points:
        yield point, _call(point)


def _worker_init() -> None:
    # Ctrl-C is the driver's to handle (it stops the workers); and a worker must not outlive a killed driver.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def run_pool(points: Sequence[Point], jobs: int) -> Iterator[tuple[Point, Outcome]]:
    """``jobs`` worker processes; a few points queued per worker so none idles while results are recorded."""
    todo = iter(points)
    window = 2 * jobs
    pool = cf.ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init)
    running: dict[cf.Future[Outcome], Point] = {}
    try:
        while True:
            while len(running) < window:
                point = next(todo, None)
                if point is None:
                    break
                running[pool.submit(_call, point)] = point
            if not running:
                return
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            broken = False
            for future in sorted(done, key=lambda f: running[f].index):
                point = running.pop(future)
                try:
                    yield point, future.result()
                except cf.process.BrokenProcessPool:
                    broken = True
                    yield point, _died(point)
            if broken:  # a worker was killed (out of memory?): the pool is gone with every point in it
                for _future, point in sorted(running.items(), key=lambda fp: fp[1].index):
                    yield point, _died(point)
                running.clear()
                pool.shutdown(wait=False)
                pool = cf.ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init)
    finally:
        _stop(pool)


def _died(point: Point) -> Outcome:
    return {"status": "failed", "metrics": {}, "warnings": None, "wall_time_s": 0.0, "worker": None,
            "error": "a worker process died while this point (or another one running beside it) was simulated, "
                     "e.g. killed for using too much memory; run the sweep again to retry it"}


def _stop(pool: cf.ProcessPoolExecutor) -> None:
    """Stop at once: queued points are dropped and running ones killed (they are simply not recorded)."""
    pool.shutdown(wait=False, cancel_futures=True)
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


def run_ray(points: Sequence[Point], jobs: int | None, address: str | None) -> Iterator[tuple[Point, Outcome]]:
    """Each point a Ray task, on the cluster at ``address`` or on a local Ray instance with ``jobs`` CPUs.

    Workers need astrasim-py installed, and trace files at the same paths (generated workloads need no files).
    """
    ray = require("ray", "ray", "--executor ray")
    started_here = not ray.is_initialized()
    if started_here:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if address:
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = jobs or default_jobs()
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise InputError(f"--executor ray: cannot start or reach {where}: {e}") from None
    task = ray.remote(num_cpus=1, max_retries=1)(_call_batch)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    # Several points per task when there are many: a Ray task costs milliseconds, a small point about as much.
    batch = max(1, min(16, len(points) // (8 * cpus)))
    todo = iter([list(points[i:i + batch]) for i in range(0, len(points), batch)])
    running: dict[Any, list[Point]] = {}
    try:
        while True:
            while len(running) < 2 * cpus:
                group = next(todo, None)
                if group is None:
                    break
                running[task.remote(group)] = group
            if not running:
                return
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                group = running.pop(ref)
                try:
                    outcomes = ray.get(ref)
                except Exception as e:  # the task's worker died (Ray's errors do not share a base class we can name)
                    outcomes = [_died(point) for point in group]
                    for outcome in outcomes:
                        outcome["error"] = f"Ray task failed: {type(e).__name__}: {str(e).splitlines()[0]}"
                yield from zip(group, outcomes, strict=True)
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
