"""Published collective measurements (nccl-tests / rccl-tests tables), the model's error on them, and the fit of a
profile's timing parameters.

A table is a TSV with the columns ``system, collective, gpus, nodes, bytes, busbw_GBps, source_url, algo``
(``bytes``: the nccl-tests size; ``busbw_GBps``: GB = 10^9 B; ``algo``: set where the run forced the algorithm).

The fit is robust (soft-L1) least squares on log time, per calibration key (algorithm/protocol/scope, the
library's choice for each row), with the library's constants as priors: a key no row selects keeps its priors.
Rows far off a first fit are set aside as noise; a nearly absolute-error fit replaces the least-squares one where
its mean |log error| is smaller (the validation reports geomean |error|). Levenberg-Marquardt in NumPy from a
fixed start: the same tables give the same parameters, byte for byte.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.collectives.algorithms import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER
from simulator.collectives.hardware import PARAMETER_KEYS, HardwareProfile
from simulator.collectives.nccl import CollectiveModel, Communicator, bus_factor
from workload.errors import ConfigError, shown
from workload.files import read_text, shown_path

COLUMNS = ("system", "collective", "gpus", "nodes", "bytes", "busbw_GBps")
COLLECTIVES = {"all_reduce": ALL_REDUCE, "allreduce": ALL_REDUCE, "all_gather": ALL_GATHER,
               "allgather": ALL_GATHER, "reduce_scatter": REDUCE_SCATTER, "reducescatter": REDUCE_SCATTER,
               "all_to_all": ALL_TO_ALL, "alltoall": ALL_TO_ALL}
BANDS = (("ge_1MiB", 1 << 20, math.inf), ("64KiB_1MiB", 1 << 16, 1 << 20), ("lt_64KiB", 0, 1 << 16),
         ("ge_64KiB", 1 << 16, math.inf))
PRIOR_WEIGHT = {"latency_us": 0.05, "hop_latency_us": 0.05, "efficiency": 0.02, "fill_us": 0.02, "fill_MB": 0.05}
# Stepped algorithms (rings, trees, all-pairs) with the LL protocols: the library's base latency is a real
# launch-and-setup cost, held close, and the per-step latency left free, so that a table measured at one GPU count
# puts the rest of the latency per step, which is what other GPU counts need. With Simple, the other way round:
# its large per-call start-up is the same at 2, 4 and 8 GPUs (A100 tables), so the base is free and the step held.
STEPPED = ("ring", "tree", "msccl")
STEPPED_WEIGHT = {**PRIOR_WEIGHT, "latency_us": 0.5, "hop_latency_us": 0.01}
STEPPED_SIMPLE_WEIGHT = {**PRIOR_WEIGHT, "latency_us": 0.01, "hop_latency_us": 0.5}
MIN_ROWS_PER_SIZE = 3
ROBUST_SCALE = 1.0  # log-time residual beyond which a row counts linearly, not quadratically
ABS_SCALE = 0.02  # the nearly absolute-error fit tried beside it
TRIM_FACTOR, TRIM_FLOOR, TRIM_MIN_ROWS = 2.0, 0.2, 6
FLOORS = {"latency_us": 1.0, "hop_latency_us": 0.1, "fill_us": 1.0, "fill_MB": 1.0}
# A key whose rows are all so small that moving the bytes takes under this share of their time (at the priors)
# can tell its latencies only: a wiggle of the latency curve would set the terms that grow with size (MI300X's
# ring/LL rows of 8-512 B made its efficiency 0.0004, and a forced ring of 512 KiB took 5 ms; holding only the
# efficiency, a 2.5 ms start-up took its place), so those are held at the library's priors.
BANDWIDTH_SHARE_MIN = 0.05
SIZE_TERMS = ("efficiency", "fill_us", "fill_MB")
HELD_WEIGHT = 10.0


@dataclass(frozen=True, slots=True)
class Measurement:
    table: str
    system: str
    collective: str
    gpus: int
    nodes: int
    size_bytes: int
    busbw_GBps: float
    algo: str | None
    line: int = 0  # in its table, for messages

    @property
    def comm(self) -> Communicator:
        return Communicator.packed(self.gpus, self.nodes)

    @property
    def time_us(self) -> float:
        return self.size_bytes * bus_factor(self.collective, self.gpus) / (self.busbw_GBps * 1e3)


def read_table(path: str) -> list[Measurement]:
    """The rows of one TSV table, checked: a bad cell is a one-line error naming file and line."""
    where = shown_path(path)
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    lines = read_text(path, "measurement table").splitlines()
    reader = csv.DictReader(lines, delimiter="\t")
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{where}: a measurement table needs the columns {', '.join(COLUMNS)}; missing "
                          f"{', '.join(missing)}")
    rows = []
    for line, r in enumerate(reader, start=2):
        try:
            collective = COLLECTIVES[r["collective"].strip().lower()]
            gpus, nodes, size = int(r["gpus"]), int(r["nodes"]), int(r["bytes"])
            busbw = float(r["busbw_GBps"])
        except (KeyError, ValueError, AttributeError):
            raise ConfigError(f"{where}: line {line}: bad row {shown(list(r.values()))} (collective one of "
                              f"{', '.join(sorted(set(COLLECTIVES.values())))}; gpus, nodes, bytes whole numbers; "
                              "busbw_GBps a number)") from None
        if not (1 <= nodes <= gpus <= 1 << 20 and 0 < size < 1 << 50 and 0 < busbw < 1e6 and gpus % nodes == 0):
            raise ConfigError(f"{where}: line {line}: out of range (need 1 <= nodes <= gpus, gpus a multiple of "
                              "nodes, bytes and busbw_GBps above 0)")
        if gpus == 1:
            continue  # nothing moves: no bus bandwidth to compare
        algo = (r.get("algo") or "").strip() or None
        rows.append(Measurement(name, r["system"], collective, gpus, nodes, size, busbw, algo, line))
    if not rows:
        raise ConfigError(f"{where}: no measurements")
    return rows


def read_tables(paths: Sequence[str]) -> list[Measurement]:
    return [m for p in paths for m in read_table(p)]


def check_fits(rows: Sequence[Measurement], profile: HardwareProfile) -> None:
    """Refuse rows the profile's machine cannot have been: more GPUs per node than its nodes hold (a prediction for
    them would be a number about nothing)."""
    for m in rows:
        per_node = -(-m.gpus // m.nodes)
        if per_node > profile.gpus_per_node:
            raise ConfigError(f"{m.table}: line {m.line}: {m.gpus} GPUs on {m.nodes} node(s) is {per_node} per node, "
                              f"but profile {profile.name} has {profile.gpus_per_node} GPUs per node")


@dataclass(frozen=True, slots=True)
class Prediction:
    row: Measurement
    busbw_GBps: float
    algorithm: str
    protocol: str
    channels: int

    @property
    def error(self) -> float:
        """predicted / published - 1."""
        return self.busbw_GBps / self.row.busbw_GBps - 1


def predict(model: CollectiveModel, rows: Iterable[Measurement]) -> list[Prediction]:
    out = []
    for row in rows:
        chosen = model.plan(row.collective, row.size_bytes, row.comm, row.algo).chosen
        out.append(Prediction(row, chosen.busbw_GBps, chosen.algorithm, chosen.protocol, chosen.channels))
    return out


# What the summaries' numbers mean: the geomean is of factors, so it can exceed the largest |error| of the same rows
# when the model predicts too little (every row -33%: geomean 49%, max 33%).
ERROR_MEASURES = ("geomean |error| = exp(mean |ln(predicted / published)|) - 1, a factor: 33% too low counts as 49%, "
                  "as 49% too high does; max = the largest |predicted / published - 1|")


def geomean_abs_error(errors: Sequence[float]) -> float | None:
    """exp(mean |log(predicted / published)|) - 1; None without rows."""
    if not errors:
        return None
    return math.exp(sum(abs(math.log1p(e)) for e in errors) / len(errors)) - 1


def summarize(predictions: Sequence[Prediction]) -> list[dict[str, object]]:
    """Per table: geomean |error| in the size bands (>= 1 MiB, 64 KiB - 1 MiB, below) and the largest >= 1 MiB."""
    tables: dict[str, list[Prediction]] = {}
    for p in predictions:
        tables.setdefault(p.row.table, []).append(p)
    out = []
    for name, preds in tables.items():
        entry: dict[str, object] = {"table": name, "rows": len(preds)}
        for band, low, high in BANDS:
            errs = [p.error for p in preds if low <= p.row.size_bytes < high]
            g = geomean_abs_error(errs)
            entry[f"geomean_abs_error_{band}"] = None if g is None else round(g, 4)
        big = [abs(p.error) for p in preds if p.row.size_bytes >= 1 << 20]
        entry["max_abs_error_ge_1MiB"] = round(max(big), 4) if big else None
        out.append(entry)
    return out


# --- fitting ---------------------------------------------------------------------------------------------------------
def _to_vector(params: dict[str, float], prior: dict[str, float]) -> np.ndarray:
    z = []
    for k in PARAMETER_KEYS:
        if k == "efficiency":
            z.append(math.log(params[k] / (1 - params[k])) - math.log(prior[k] / (1 - prior[k])))
        else:
            z.append(math.log(max(params[k], 1e-9) / prior[k]))
    return np.array(z)


def _from_vector(z: np.ndarray, prior: dict[str, float]) -> dict[str, float]:
    out = {}
    for k, v in zip(PARAMETER_KEYS, z, strict=True):
        if k == "efficiency":
            logit = math.log(prior[k] / (1 - prior[k])) + float(v)
            out[k] = 1 / (1 + math.exp(-max(-50.0, min(50.0, logit))))
        else:
            out[k] = prior[k] * math.exp(max(-50.0, min(50.0, float(v))))
    return out


def _prior(model: CollectiveModel, row: Measurement, algorithm: str, protocol: str) -> dict[str, float]:
    base = model.default_parameters(algorithm, protocol, row.collective, row.comm)
    prior = {k: max(base[k], FLOORS.get(k, 0.0)) for k in PARAMETER_KEYS}
    prior["efficiency"] = min(max(base["efficiency"], 0.05), 0.95)
    return prior


Rows = Sequence[tuple[Measurement, str, str]]


def _residual_function(model: CollectiveModel, rows: Rows, prior: dict[str, float], scale: float,
                       held: tuple[str, ...] = ()) -> Callable[[np.ndarray], np.ndarray]:
    """The robust log-time residuals of ``rows`` plus the prior terms, as a function of the parameter vector
    (``held``: parameters the rows cannot tell, kept at their priors)."""
    algorithm, protocol = rows[0][1], rows[0][2]
    chosen = PRIOR_WEIGHT if algorithm not in STEPPED else (
        STEPPED_SIMPLE_WEIGHT if protocol == "Simple" else STEPPED_WEIGHT)
    weights = np.array([HELD_WEIGHT if k in held else chosen[k] for k in PARAMETER_KEYS])
    measured = np.array([math.log(r.time_us) for r, _, _ in rows])

    def residuals(z: np.ndarray) -> np.ndarray:
        params = _from_vector(z, prior)
        pred = [model.candidate(a, p, r.collective, r.size_bytes, r.comm, params).time_us for r, a, p in rows]
        r = np.log(np.maximum(pred, 1e-9)) - measured
        # soft-L1: quadratic within ROBUST_SCALE, linear beyond it, so one noisy row cannot pull a whole curve
        robust = np.sign(r) * scale * np.sqrt(2 * (np.sqrt(1 + (r / scale) ** 2) - 1))
        return np.concatenate([robust, weights * z])

    return residuals


def _solve(model: CollectiveModel, rows: Rows, prior: dict[str, float], z: np.ndarray, iterations: int,
           scale: float = ROBUST_SCALE, held: tuple[str, ...] = ()) -> tuple[np.ndarray, float]:
    """Levenberg-Marquardt from ``z`` on the robust log-time residuals of ``rows`` plus the prior terms: the
    solution and its cost."""
    residuals = _residual_function(model, rows, prior, scale, held)
    res = residuals(z)
    cost = float(res @ res)
    damping = 1e-3
    for _ in range(iterations):
        jac = np.empty((len(res), len(z)))
        for j in range(len(z)):
            step = np.zeros_like(z)
            step[j] = 1e-6
            jac[:, j] = (residuals(z + step) - res) / 1e-6
        grad = jac.T @ res
        normal = jac.T @ jac
        improved = False
        while damping < 1e10:
            delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -grad)
            trial = residuals(z + delta)
            trial_cost = float(trial @ trial)
            if trial_cost < cost:
                z, res, cost, improved = z + delta, trial, trial_cost, True
                damping = max(damping / 10, 1e-12)
                break
            damping *= 10
        if not improved or float(np.max(np.abs(delta))) < 1e-9:
            break
    return z, cost


def _best_start(model: CollectiveModel, rows: Rows, prior: dict[str, float], iterations: int,
                held: tuple[str, ...] = ()) -> np.ndarray:
    """The lowest-cost solution from the priors, from start-ups (fill) of the rows' own scale (the fill term has
    little slope near its prior, so a descent from there alone can miss it) and from the efficiency that the rows'
    times ask for (where another bound is the slower at the prior efficiency, its slope is zero there: 2-node
    NVLS-tree rows of 8 and 16 GiB on B300 were fitted with a 4.5 ms start-up instead, 63x the time at 4 MiB).
    Fixed starts: deterministic."""
    fill_us, fill_MB = PARAMETER_KEYS.index("fill_us"), PARAMETER_KEYS.index("fill_MB")
    times = sorted(r.time_us for r, _, _ in rows)
    sizes = sorted(r.size_bytes for r, _, _ in rows)
    starts = [np.zeros(len(PARAMETER_KEYS))]
    if "efficiency" not in held:  # the best of a grid of efficiencies, the other parameters at their priors
        def misfit(e: float) -> float:
            params = {**prior, "efficiency": e}
            return sum(math.log(model.candidate(a, p, r.collective, r.size_bytes, r.comm, params).time_us
                                / r.time_us) ** 2 for r, a, p in rows)

        wanted = min((0.99 * 0.85 ** k for k in range(25)), key=misfit)
        z = np.zeros(len(PARAMETER_KEYS))
        z[PARAMETER_KEYS.index("efficiency")] = (math.log(wanted / (1 - wanted))
                                                 - math.log(prior["efficiency"] / (1 - prior["efficiency"])))
        starts.append(z)
    for t in (times[len(times) // 2], times[-1] / 2):
        for size in (sizes[len(sizes) // 4], sizes[len(sizes) // 2]):
            z = np.zeros(len(PARAMETER_KEYS))
            z[fill_us] = math.log(t / prior["fill_us"])
            z[fill_MB] = math.log(max(size / 1e6, 1e-3) / prior["fill_MB"])
            starts.append(z)
    best, best_cost = starts[0], math.inf
    for start in starts:
        z, cost = _solve(model, rows, prior, start, iterations, held=held)
        if cost < best_cost:
            best, best_cost = z, cost
    return best


def _log_errors(model: CollectiveModel, rows: Rows, params: dict[str, float]
                ) -> list[float]:
    return [math.log(model.candidate(a, p, r.collective, r.size_bytes, r.comm, params).time_us / r.time_us)
            for r, a, p in rows]


def _mean_abs(values: Sequence[float]) -> float:
    return sum(abs(v) for v in values) / len(values)


def bandwidth_share(model: CollectiveModel, rows: Rows, params: dict[str, float]) -> float:
    """The largest share of a row's time spent moving bytes under ``params``: halving the efficiency adds the
    bandwidth term once more, so the share is (time at half the efficiency - time) / time."""
    half = {**params, "efficiency": params["efficiency"] / 2}
    share = 0.0
    for r, a, p in rows:
        t = model.candidate(a, p, r.collective, r.size_bytes, r.comm, params).time_us
        share = max(share, model.candidate(a, p, r.collective, r.size_bytes, r.comm, half).time_us / t - 1)
    return share


def fit_key(model: CollectiveModel, rows: Rows, iterations: int = 200
            ) -> tuple[dict[str, float], float]:
    """Fitted parameters of one key from its rows, and the RMS of log(predicted / measured) time.

    Rows far off the first fit (beyond TRIM_FACTOR x the median error, and TRIM_FLOOR) are measurement noise a
    smooth curve cannot follow: they are set aside and the key refitted on the rest (at most a quarter of them)."""
    first, algorithm, protocol = rows[0]
    prior = _prior(model, first, algorithm, protocol)
    held = SIZE_TERMS if bandwidth_share(model, rows, prior) < BANDWIDTH_SHARE_MIN else ()
    all_rows = rows
    z = _best_start(model, rows, prior, iterations, held)
    if len(rows) >= TRIM_MIN_ROWS:
        errors = np.abs(_log_errors(model, rows, _from_vector(z, prior)))
        limit = max(TRIM_FLOOR, TRIM_FACTOR * float(np.median(errors)))
        order = sorted(range(len(rows)), key=lambda i: -errors[i])
        drop = {i for i in order[: len(rows) // 4] if errors[i] > limit}
        if drop:
            rows = [x for i, x in enumerate(rows) if i not in drop]
            z, _ = _solve(model, rows, prior, z, iterations, held=held)
    # the reported error is a geomean of |error|: where a nearly absolute-error fit has the smaller mean |log
    # error| on the rows kept, it is the better curve
    z_abs, _ = _solve(model, rows, prior, z, iterations, scale=ABS_SCALE, held=held)
    if _mean_abs(_log_errors(model, rows, _from_vector(z_abs, prior))) < _mean_abs(
            _log_errors(model, rows, _from_vector(z, prior))):
        z = z_abs
    rows = all_rows
    params = _from_vector(z, prior)
    logs = _log_errors(model, rows, params)
    rms = math.sqrt(sum(x * x for x in logs) / len(logs))
    return {k: float(f"{params[k]:.6g}") for k in PARAMETER_KEYS}, rms


def calibrate(profile: HardwareProfile, rows: Sequence[Measurement]) -> dict[str, object]:
    """The profile's ``calibration`` section fitted on ``rows``: parameters per key, and per-key fit residuals."""
    uncalibrated = CollectiveModel(_without_calibration(profile))
    groups: dict[str, list[tuple[Measurement, str, str]]] = {}
    for row in rows:
        chosen = uncalibrated.plan(row.collective, row.size_bytes, row.comm, row.algo).chosen
        key = CollectiveModel.key(chosen.algorithm, chosen.protocol, row.comm)
        groups.setdefault(key, []).append((row, chosen.algorithm, chosen.protocol))
    parameters: dict[str, dict[str, float]] = {}
    fit: dict[str, dict[str, float]] = {}
    for key in sorted(groups):
        rows_of_key = groups[key]
        params, rms = fit_key(uncalibrated, rows_of_key)
        parameters[key] = params
        fit[key] = {"rows": len(rows_of_key), "rms_log_time": round(rms, 4)}
        sizes = sorted({r.gpus for r, _, _ in rows_of_key})
        if len(sizes) > 1:  # refine per communicator size where several were measured
            for gpus in sizes:
                subset = [x for x in rows_of_key if x[0].gpus == gpus]
                if len(subset) >= MIN_ROWS_PER_SIZE:
                    params, rms = fit_key(uncalibrated, subset)
                    parameters[f"{key}@{gpus}"] = params
                    fit[f"{key}@{gpus}"] = {"rows": len(subset), "rms_log_time": round(rms, 4)}
    calibrated = CollectiveModel(_with_parameters(profile, parameters))
    tables = sorted({r.table for r in rows})
    return {"method": "astrasim-py calibrate: least squares on log time per algorithm/protocol/scope, library "
                      "constants as priors", "tables": tables, "parameters": parameters, "fit": fit,
            "residuals": summarize(predict(calibrated, rows))}


def _without_calibration(profile: HardwareProfile) -> HardwareProfile:
    from dataclasses import replace

    return replace(profile, calibration={})


def _with_parameters(profile: HardwareProfile, parameters: dict[str, dict[str, float]]) -> HardwareProfile:
    from dataclasses import replace

    return replace(profile, calibration={"parameters": parameters})
