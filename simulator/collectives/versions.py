"""What a given release of the collective library enables and which tuning constants its choice uses.

A profile states ``library_version``; NCCL changed both over its 2.x releases, and a machine measured with an old
release chose what that release's tuning model chose. Two things depend on the version, read from NCCL's public
sources (``src/graph/tuning.cc``, its release notes) at each tag:

- **Availability**: NVLS (in-switch reduction) from 2.17, NVLS-tree from 2.18, PAT from 2.23; LL128 by default on
  Volta and Ampere always, on Hopper from 2.15 and on Blackwell from 2.25.
- **Tuning constants** (the estimate that picks): base and per-step latencies, the LL and LL128 bandwidth caps, the
  tree's per-channel cap, the ring's LL bandwidth factor and its Simple "plateau" latency factor. Each era below
  lists only what differs from the newest release (``library.CONSTANTS``, NCCL 2.23 on).

Only the choice follows the version: the timing of what runs keeps its calibration, whose priors are the newest
constants. A version that does not parse ("2.x") or RCCL's (which keeps its own tables) selects as the newest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from simulator.collectives.library import (
    CONSTANTS,
    NVLS,
    NVLS_TREE,
    PAT,
    RING,
    TREE,
    LibraryConstants,
)

Version = tuple[int, int]
NEWEST: Version = (2, 1_000)
AVAILABLE_FROM: dict[str, Version] = {NVLS: (2, 17), NVLS_TREE: (2, 18), PAT: (2, 23)}
LL128_FROM: dict[str, Version] = {"volta": (2, 0), "ampere": (2, 0), "hopper": (2, 15), "blackwell": (2, 25)}


def parse_version(text: str) -> Version:
    """(major, minor) of "2.9.9" or "2.27"; the newest for text that names no release ("2.x")."""
    match = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?\s*", text)
    return (int(match.group(1)), int(match.group(2))) if match else NEWEST


# Latency tables per algorithm: (LL, LL128, Simple) in microseconds.
_OLD_BASE = {TREE: (4.4, 4.4, 0.0), RING: (3.6, 10.0, 8.4)}
_OLD_NVLINK = {TREE: (0.52, 1.25, 28.0), RING: (0.47, 1.9, 3.4)}
_OLD_NET = {TREE: (5.0, 8.5, 28.0), RING: (2.7, 4.0, 9.6), NVLS: (0.0, 0.0, 0.0)}


@dataclass(frozen=True, slots=True)
class Era:
    """What a range of releases changes against the newest constants (None: as the newest)."""

    until: Version  # first release that no longer uses this era
    base_us: dict[str, tuple[float, float, float]] | None = None
    hop_intra_us: dict[str, tuple[float, float, float]] | None = None
    hop_inter_us: dict[str, tuple[float, float, float]] | None = None
    ring_ll_factor: float | None = None
    ring_plateau: float | None = None
    ll128_per_channel_GBps: dict[str, float] | None = None  # per arch (before 2.12 per collective: all-reduce's)
    tree_per_channel_GBps: dict[str, tuple[float, float, float]] | None = None  # per arch
    ll_max_GBps: dict[str, tuple[float, float, float]] | None = None  # per arch


_AMPERE_TREE = (24.0, 23.6, 17.8)
_HOPPER_LL_OLD = (87.7, 22.5, 19.0)
# Newest first is not needed: eras are checked in order and the first whose ``until`` lies above the version applies.
ERAS = (
    Era((2, 12), _OLD_BASE, _OLD_NVLINK, _OLD_NET, 0.25, 1.9,
        {"volta": 16.9, "ampere": 16.9, "hopper": 16.9}, {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 22.5, 16.0),
                                                          "hopper": (24.0, 22.5, 16.0)},
        {"hopper": _HOPPER_LL_OLD}),
    Era((2, 14), _OLD_BASE, _OLD_NVLINK, {**_OLD_NET, RING: (2.7, 4.0, 28.0)}, 0.25, 1.9,
        {"hopper": 20.0}, {"hopper": _AMPERE_TREE}, {"hopper": _HOPPER_LL_OLD}),
    Era((2, 17), _OLD_BASE, _OLD_NVLINK, _OLD_NET, 0.25, 1.9,
        {"hopper": 20.0}, {"hopper": _AMPERE_TREE}, {"hopper": _HOPPER_LL_OLD}),
    Era((2, 18), {**_OLD_BASE, NVLS: (0.0, 0.0, 40.0)}, {**_OLD_NVLINK, NVLS: (0.0, 0.0, 0.0)}, _OLD_NET, 0.25, 1.9,
        None, {"hopper": (38.7, 41.4, 33.0)}, {"hopper": _HOPPER_LL_OLD}),
    Era((2, 19), {TREE: (6.8, 14.0, 0.0), NVLS: (0.0, 0.0, 23.0), NVLS_TREE: (0.0, 0.0, 23.0)},
        {NVLS: (0.0, 0.0, 0.0), NVLS_TREE: (0.0, 0.0, 0.0)}, {NVLS_TREE: (0.0, 0.0, 19.0)}, 0.25, None, None,
        {"hopper": (38.7, 41.4, 33.0)}, {"hopper": _HOPPER_LL_OLD}),
    Era((2, 21), {TREE: (6.8, 14.0, 0.0)}, {TREE: (0.6, 1.25, 28.0), NVLS: (0.0, 0.0, 23.0),
                                            NVLS_TREE: (0.0, 0.0, 23.0)},
        {TREE: (5.0, 8.5, 28.0)}, 0.25, None, None, None, {"hopper": _HOPPER_LL_OLD}),
    Era((2, 23), {TREE: (6.8, 14.0, 0.0)}, {TREE: (0.6, 1.25, 28.0)}, {TREE: (5.0, 8.5, 28.0)}),
)


def _merge(table: dict[str, tuple[float, float, float]], changes: dict[str, tuple[float, float, float]] | None
           ) -> dict[str, tuple[float, float, float]]:
    return table if changes is None else {**table, **changes}


def tuning_constants(arch: str, library: str, version: str) -> LibraryConstants:
    """The constants the library of ``version`` chooses with on ``arch``."""
    newest = CONSTANTS[arch]
    release = parse_version(version)
    era = next((e for e in ERAS if release < e.until), None) if library == "nccl" else None
    ll128 = newest.ll128 and release >= LL128_FROM.get(arch, (2, 0)) if library == "nccl" else newest.ll128
    if era is None:
        return newest if ll128 == newest.ll128 else replace(newest, ll128=ll128)
    ll128_channel = (era.ll128_per_channel_GBps or {}).get(arch, newest.ll128_per_channel_GBps)
    tree_channel = (era.tree_per_channel_GBps or {}).get(arch, newest.tree_per_channel_GBps)
    ll_max = (era.ll_max_GBps or {}).get(arch, newest.ll_max_GBps)
    return replace(newest, base_us=_merge(newest.base_us, era.base_us),
                   hop_intra_us=_merge(newest.hop_intra_us, era.hop_intra_us),
                   hop_inter_us=_merge(newest.hop_inter_us, era.hop_inter_us),
                   ring_ll_factor=era.ring_ll_factor or newest.ring_ll_factor,
                   ring_plateau=era.ring_plateau or newest.ring_plateau,
                   ll128_per_channel_GBps=ll128_channel, tree_per_channel_GBps=tree_channel, ll_max_GBps=ll_max,
                   ll128=ll128)


def available(algorithm: str, library: str, version: str) -> bool:
    """Whether the library of ``version`` has ``algorithm`` at all (RCCL: as the newest NCCL it follows)."""
    first = AVAILABLE_FROM.get(algorithm)
    return first is None or library != "nccl" or parse_version(version) >= first
