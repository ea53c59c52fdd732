"""Checking the values of configuration files: type and range, with one-line errors naming file and key.

One set of checks for every config loader (network YAML, fabric files, the packet section, system and
memory JSON). A boolean is not a number and a number is not a yes/no; NaN and infinities are refused; and
magnitudes are bounded well above any real machine, so that derived integer times (ns, ps) stay exact and
no conversion overflows. Messages quote a value through ``shown`` (bounded, control characters escaped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from workload.errors import ConfigError, LimitError, printable, shown

MAX_BANDWIDTH_GiBps = 1e9  # a million TB/s per link
MAX_LATENCY_NS = 1e12  # 1,000 s per hop
MAX_DELAY_NS = 1e12  # any other delay in ns
MAX_RATE = 1e9  # TFLOP/s, GB/s and other rates of one device
MAX_COUNT = 1 << 31  # counts of things (chunks, queues, nodes, ports)
MAX_NPUS = 1 << 20  # NPUs of one network (trace sets stop at the same count: workload/traceset.py)
MAX_NPUS_ENV = "ASTRASIM_PY_MAX_RANKS"


def number(value: Any, key: str, where: str, *, low: float = 0.0, high: float, positive: bool = False) -> float:
    """A finite real number in [low, high] (above 0 when ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: '{key}' must be a number (got {shown(value)})")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise ConfigError(f"{where}: '{key}' must be a finite number (got {shown(value)})")
    if result < low or result > high or (positive and result <= 0):
        lower = "above 0" if positive and low <= 0 else f"at least {low:g}"
        raise ConfigError(f"{where}: '{key}' must be {lower} and at most {high:g} (got {shown(value)})")
    return result


def whole(value: Any, key: str, where: str, *, low: int = 1, high: int = MAX_COUNT) -> int:
    """A whole number in [low, high]; a float that is a whole number (8.0) is accepted."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: '{key}' must be a whole number (got {shown(value)})")
    if not low <= value <= high:
        raise ConfigError(f"{where}: '{key}' must be a whole number from {low:,} to {high:,} (got {shown(value)})")
    return value


def flag(value: Any, key: str, where: str) -> bool:
    """A yes/no: true/false, or 0/1 as ASTRA-sim's files write it (a string like 'no' is not one)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{where}: '{key}' must be true/false or 0/1 (got {shown(value)})")


def texts(value: Any, key: str, where: str) -> tuple[str, ...]:
    """A list of texts (absent: none), as the ``sources`` and ``assumptions`` of hardware files."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: '{key}' must be a list of texts")
    return tuple(value)


def choice(value: Any, key: str, where: str, options: Sequence[str]) -> str:
    """One of ``options`` (names compare exactly)."""
    if not isinstance(value, str) or value not in options:
        raise ConfigError(f"{where}: '{key}' must be one of {', '.join(options)} (got {shown(value)})")
    return value


def check_size(npus: int, links: int, where: str, what: str) -> None:
    """Refuse, before building it, a network larger than any run could hold (override: ASTRASIM_PY_MAX_RANKS)."""
    from workload.limits import env_limit

    limit = env_limit(MAX_NPUS_ENV, MAX_NPUS)
    if npus > limit or links > 64 * limit:
        size = f"{npus:,} NPUs and {links:,} links" if links else f"{npus:,} NPUs"
        raise LimitError(f"{where}: {what} would have {size}; the limit is {limit:,} NPUs and {64 * limit:,} links "
                         f"(set {MAX_NPUS_ENV}=N to raise it)")


def key_names(keys: Any, most: int = 8) -> str:
    """Unknown keys named in a message: sorted, escaped, at most ``most`` of them."""
    names = sorted(printable(str(k))[:40] for k in keys)
    return ", ".join(names[:most]) + (f" (+{len(names) - most} more)" if len(names) > most else "")
