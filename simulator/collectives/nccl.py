"""The NCCL/RCCL-like collective model: which algorithm and protocol the library picks, and how long it takes.

Two halves, as in the libraries themselves:

- **Selection** follows the library's own tuning model (NCCL's ``tuning.cc``, RCCL's derivative): for every
  enabled (algorithm, protocol) an estimate ``latency + size / bandwidth`` from fixed per-architecture constants
  (base and per-hop latencies, LL/LL128 caps, bus-to-algorithm bandwidth ratios) and the topology's bandwidth;
  the cheapest wins. The estimate is the library's, so its sub-optimal choices are reproduced too.
- **Timing** of the chosen pair uses the profile's calibrated parameters (``calibration.parameters``, fitted by
  ``astrasim-py calibrate`` on published nccl-tests/rccl-tests tables), per key ``algorithm/protocol/scope``
  (scope ``intra``: one node, ``inter``: several), refined per communicator size where tables measured several
  (``ring/LL/intra@8``; other sizes use the pooled key)::

      time_us = latency_us + hops x hop_latency_us + bus_bytes / (efficiency x raw_busbw)
                + fill_us x (1 - exp(-size_bytes / fill_MB))

  ``hops`` counts the call's latency steps: one per step on the scale-up fabric, and per step over the network
  the library's own ratio of a network step to a scale-up step (tree/LL: 5.0 / 0.6 us), so that a fit on one
  node count carries to others.

  ``raw_busbw`` is the hardware bound of the algorithm in nccl-tests' bus bandwidth (GB = 10^9 B): a ring never
  exceeds the slowest link it crosses (efficiency <= 1); NVLS and SHARP reduce in the switch and may exceed the
  links. The fill term is the start-up of a large call (pipeline filling up): it grows with the buffer's size,
  the same at every rank count (2, 4 and 8 A100s measure the same), and saturates at ``fill_us``. Keys
  without calibration use the library's constants (latencies) and its bandwidth factors (efficiency).
- **Across nodes** (bounds.py, network.py) every network step adds the transport's latency (twice with Simple,
  whose receiver flushes), and a Simple call runs as two pipelined stages: the scale-up part at the efficiency
  its GPU class measured on one node, and the network part at the transport's efficiency of the NICs' bound,
  reduced while too few chunks are in flight per round trip; the slower stage sets the rate. An uncalibrated
  multi-node key starts from the one-node key of its class (start-up, per-step latency, fill), and its network
  efficiency is the class's calibrated multi-node ring where a multi-node table of the same transport exists, else
  the transport's. The NICs' bound includes the machine's GPU-NIC path (``scale_out.path_efficiency``, bounds.py),
  so a multi-node calibration is a fraction of the measured machine's bound and carries to other machines.
- **MSCCL** (RCCL): where the profile lists MSCCL programs the library loads (``msccl``), a call they cover runs
  the program (all-pairs exchanges over the node's links) and the tuning model is not consulted, as in RCCL.

Sizes are nccl-tests sizes: the whole buffer (all-gather: the gathered output; reduce-scatter: the input).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from simulator.collectives.algorithms import ALL_REDUCE
from simulator.collectives.estimate import LibraryEstimate
from simulator.collectives.exchange import exchange_library
from simulator.collectives.hardware import HardwareProfile
from simulator.collectives.library import (
    ALGORITHMS,
    COLLNET,
    CONSTANTS,
    DIRECT,
    MSCCL,
    NVLS,
    NVLS_TREE,
    P2P,
    PAT,
    PROTOCOL_INDEX,
    RING,
    SEND_RECV,
    SIMPLE,
    TREE,
    Communicator,
    algorithm_name,
    bus_factor,
    tree_correction,
)
from simulator.collectives.network import (
    SIMPLE_NET_HOP_US,
    chunk_bytes,
    inflight_factor,
    latencies_per_step,
    network_channels,
)
from simulator.collectives.tuner import tuner_choice
from simulator.collectives.versions import tuning_constants
from workload.errors import InputError


@dataclass(frozen=True, slots=True)
class Candidate:
    """One (algorithm, protocol): the library's estimate and the calibrated time, in microseconds."""

    algorithm: str
    protocol: str
    channels: int
    library_us: float  # the library's own estimate, which picks
    latency_us: float  # the size-independent part of the calibrated time (does not slow down when links are shared)
    transfer_us: float  # the bandwidth part (shares links with concurrent traffic)
    bus_bytes: float
    calibrated: bool = False  # timed with fitted parameters (else with the library's constants)

    @property
    def time_us(self) -> float:
        return self.latency_us + self.transfer_us

    @property
    def busbw_GBps(self) -> float:
        return self.bus_bytes / self.time_us / 1e3 if self.time_us > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str
    size_bytes: int
    comm: Communicator
    chosen: Candidate
    candidates: tuple[Candidate, ...]  # every enabled candidate, the library's cheapest first

    @property
    def time_ns(self) -> int:
        return round(self.chosen.time_us * 1e3)


@dataclass(frozen=True, slots=True)
class _Fixed:
    """The size-independent terms of one candidate on one communicator."""

    library_us: float  # the library's latency estimate
    library_algbw: float  # and its algorithm bandwidth (GB/s)
    channels: int
    raw: float  # hardware bound, bus bandwidth (GB/s)
    params: dict[str, float]  # timing parameters (calibrated or priors)
    calibrated: bool
    steps: float  # latency steps in scale-up steps
    net_latency_us: float  # the transport's latency over the call's network steps
    up_rate: float = 0.0  # multi-node Simple: the scale-up stage's bus bandwidth (GB/s); 0: a single stage
    net_raw: float = 0.0  # and the NICs' bound
    net_channels: int = 0  # channels carrying network traffic
    channel_GBps: float = 0.0  # line rate per network channel
    round_trip_us: float = 0.0  # a slot's credit round trip
    bus_factor: float = 1.0  # bus bytes per buffer byte
    # derived from ``params`` once (planning a new size then costs only the size-dependent terms)
    latency_us: float = field(init=False)  # start-up + per-step latencies + the transport's
    efficiency: float = field(init=False)
    fill_us: float = field(init=False)
    fill_bytes: float = field(init=False)

    def __post_init__(self) -> None:
        p = self.params
        object.__setattr__(self, "latency_us", self.latency_with(p))
        object.__setattr__(self, "efficiency", p["efficiency"])
        object.__setattr__(self, "fill_us", p["fill_us"])
        object.__setattr__(self, "fill_bytes", p["fill_MB"] * 1e6)

    def latency_with(self, params: dict[str, float]) -> float:
        """Start-up, per-step and transport latency (us) under timing parameters ``params``."""
        return params["latency_us"] + self.steps * params["hop_latency_us"] + self.net_latency_us


class CollectiveModel(LibraryEstimate):
    """The model for one hardware profile; ``plan`` is cached per (kind, size, communicator, forced algorithm)."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile
        self.constants = CONSTANTS[profile.arch]  # the newest release's: the timing's priors
        self.tuning = tuning_constants(profile.arch, profile.library, profile.library_version)  # its release's choice
        self.parameters = profile.parameters()
        self._cache: dict[tuple[str, int, Communicator, str | None, str], Plan] = {}
        self._fixed_cache: dict[tuple[str, str, str, Communicator], _Fixed] = {}
        # (kind, communicator) -> the enabled (algorithm, protocol) pairs, in the library's order, and their terms
        self._enabled_cache: dict[tuple[str, Communicator], dict[tuple[str, str], _Fixed | None]] = {}

    # --- calibrated timing ----------------------------------------------------------------------------------------
    def hops(self, algorithm: str, protocol: str, kind: str, comm: Communicator) -> float:
        """Latency steps of one call in scale-up steps: a network step weighs the library's network / scale-up
        per-step latency."""
        p = PROTOCOL_INDEX[protocol]
        s_intra, s_inter = self._steps(algorithm, kind, comm)
        if not s_inter:
            return float(s_intra)
        intra, inter = self._intra_hops(self.constants)[algorithm][p], self.constants.hop_inter_us[algorithm][p]
        return s_intra + s_inter * (inter / intra if intra > 0 and inter > 0 else 1.0)

    def default_parameters(self, algorithm: str, protocol: str, kind: str, comm: Communicator) -> dict[str, float]:
        """The priors: the library's latencies, and its bandwidth factors as the efficiency."""
        p = PROTOCOL_INDEX[protocol]
        hop = self._intra_hops(self.constants)[algorithm][p] or self.constants.hop_inter_us[algorithm][p]
        raw = self.raw_busbw(algorithm, kind, comm)
        lib_algbw, _ = self.library_bandwidth(algorithm, protocol, kind, comm)
        eff = min(1.0, lib_algbw * bus_factor(kind, comm.ranks) / raw) if math.isfinite(raw) and raw > 0 else 0.8
        if algorithm in (DIRECT, P2P) and comm.nodes == 1:  # Simple copies over the same links as the ring's
            eff = self.parameters.get(f"{RING}/{SIMPLE}/intra", {}).get("efficiency", eff)
        out = self.profile.scale_out
        if comm.nodes > 1 and protocol == SIMPLE and out is not None:  # the network stage's: measured on this
            eff = self.parameters.get(f"{RING}/{SIMPLE}/inter", {}).get("efficiency", out.stream_efficiency)  # class
        base = self.constants.base_us[algorithm][p] if algorithm not in (NVLS, NVLS_TREE) else 0.0
        prior = {"latency_us": base, "hop_latency_us": hop, "efficiency": max(eff, 0.05), "fill_us": 0.0,
                 "fill_MB": 1.0}
        if comm.nodes > 1:  # the start-up and per-step latency measured on one node of the class carry over
            intra = NVLS if algorithm == NVLS_TREE else algorithm
            fitted = self.parameters.get(f"{intra}/{protocol}/intra")
            if fitted:
                prior.update({k: fitted[k] for k in ("latency_us", "hop_latency_us", "fill_us", "fill_MB")
                              if k in fitted})
        return prior

    @staticmethod
    def key(algorithm: str, protocol: str, comm: Communicator) -> str:
        return f"{algorithm}/{protocol}/{'inter' if comm.nodes > 1 else 'intra'}"

    def _fixed(self, algorithm: str, protocol: str, kind: str, comm: Communicator) -> _Fixed:
        """The size-independent terms of a candidate (cached)."""
        key = (algorithm, protocol, kind, comm)
        fixed = self._fixed_cache.get(key)
        if fixed is None:
            lib_algbw, channels = self.library_bandwidth(algorithm, protocol, kind, comm)
            name = self.key(algorithm, protocol, comm)
            fitted = self.parameters.get(f"{name}@{comm.ranks}") or self.parameters.get(name, {})
            params = {**self.default_parameters(algorithm, protocol, kind, comm), **fitted}
            out = self.profile.scale_out
            net_us = 0.0
            staged = comm.nodes > 1 and protocol == SIMPLE and out is not None
            if comm.nodes > 1 and out is not None:  # the transport's latency on every network step in sequence
                sequential = 1 if algorithm in (DIRECT, P2P) else self._steps(algorithm, kind, comm)[1]
                net_us = sequential * out.latency_us * latencies_per_step(out.transport, protocol)
            net_channels = network_channels(algorithm, comm.per_node)
            fixed = _Fixed(self.library_latency_us(algorithm, protocol, kind, comm) + net_us, lib_algbw, channels,
                           self.raw_busbw(algorithm, kind, comm), params, bool(fitted),
                           self.hops(algorithm, protocol, kind, comm), net_us,
                           self._scale_up_rate(algorithm, kind, comm) if staged else 0.0,
                           self.net_busbw(algorithm, kind, comm) if staged else 0.0, net_channels,
                           self.network_GBps(comm) / net_channels if staged else 0.0,
                           SIMPLE_NET_HOP_US + 2 * out.latency_us if staged and out is not None else 0.0,
                           1.0 if kind == SEND_RECV else bus_factor(kind, comm.ranks))
            if len(self._fixed_cache) < 100_000:
                self._fixed_cache[key] = fixed
        return fixed

    def _scale_up_rate(self, algorithm: str, kind: str, comm: Communicator) -> float:
        """Bus bandwidth (GB/s) the scale-up part of a multi-node Simple call reaches: the hardware bound times the
        calibrated efficiency of the same kind of transfer on one node (its GPU class's tables)."""
        raw = self.up_busbw(algorithm, kind, comm)
        if not math.isfinite(raw):
            return math.inf
        intra = {NVLS_TREE: NVLS, COLLNET: NVLS, TREE: RING, PAT: RING}.get(algorithm, algorithm)
        fitted = self.parameters.get(f"{intra}/{SIMPLE}/intra", {}).get("efficiency")
        if fitted is None:
            one_node = Communicator(comm.per_node, 1, comm.per_node)
            fitted = self.default_parameters(intra, SIMPLE, kind, one_node)["efficiency"]
        if algorithm in (RING, TREE, PAT) and comm.per_node > 1:
            # the efficiency was measured on a closed ring of per_node scale-up hops; across nodes a node's segment
            # is a chain of per_node - 1 of them (the last hop is the network stage's), never beyond the links
            return min(raw, fitted * raw * comm.per_node / (comm.per_node - 1))
        return fitted * raw

    def _pipelined_GBps(self, algorithm: str, kind: str, size_bytes: int, comm: Communicator, fixed: _Fixed,
                        efficiency: float) -> float:
        """Bus bandwidth of a multi-node Simple call: the slower of its scale-up part and its network part, which
        reaches ``efficiency`` of the NICs' bound only when enough chunks are in flight (see network.py)."""
        out = self.profile.scale_out
        assert out is not None
        chunk, slots = chunk_bytes(algorithm, kind, size_bytes, comm.ranks, fixed.net_channels, comm.per_node,
                                   out.buffsize_bytes, out.nvls_chunk_bytes)
        in_flight = inflight_factor(chunk, slots, fixed.channel_GBps * efficiency, fixed.round_trip_us)
        net = efficiency * fixed.net_raw * in_flight
        return min(fixed.up_rate, net)

    def candidate(self, algorithm: str, protocol: str, kind: str, size_bytes: int, comm: Communicator,
                  params: dict[str, float] | None = None, fixed: _Fixed | None = None) -> Candidate:
        """One (algorithm, protocol) at ``size_bytes``; ``params`` overrides the profile's (calibration); ``fixed``:
        its size-independent terms when the caller has them."""
        if fixed is None:
            fixed = self._fixed(algorithm, protocol, kind, comm)
        calibrated = fixed.calibrated
        if params is None:
            latency, efficiency, fill_us = fixed.latency_us, fixed.efficiency, fixed.fill_us
            fill_bytes = fixed.fill_bytes
        else:
            calibrated = True
            latency = fixed.latency_with(params)
            efficiency, fill_us, fill_bytes = params["efficiency"], params["fill_us"], params["fill_MB"] * 1e6
        algbw = fixed.library_algbw
        if algorithm == TREE and kind == ALL_REDUCE:  # the library's medium-size correction of its tree estimate
            algbw *= tree_correction(protocol, size_bytes)
        library_us = fixed.library_us + size_bytes / (1e3 * algbw) if algbw > 0 else math.inf
        if algorithm == RING and protocol == SIMPLE and comm.nodes > 1 and kind == ALL_REDUCE and (
                size_bytes >= comm.ranks / 16 * 65536):
            library_us += fixed.library_us * (self.tuning.ring_plateau - 1)  # the ring's plateau
        bus_bytes = size_bytes * fixed.bus_factor
        if fixed.up_rate > 0:  # a multi-node Simple call: scale-up and network stages, chunked over the network
            rate = self._pipelined_GBps(algorithm, kind, size_bytes, comm, fixed, efficiency)
            transfer = bus_bytes / (1e3 * rate) if math.isfinite(rate) else 0.0
        else:
            raw = fixed.raw
            transfer = bus_bytes / (1e3 * efficiency * raw) if math.isfinite(raw) else 0.0
        if fill_us > 0:  # per buffer byte, not per bus byte: the same start-up at every rank count
            transfer += fill_us * -math.expm1(-size_bytes / fill_bytes)
        channels = self.channels_for(protocol, size_bytes, fixed.channels, comm.ranks)
        return Candidate(algorithm, protocol, channels, library_us, latency, transfer, bus_bytes, calibrated)

    def runs(self, algorithm: str, kind: str, size_bytes: int, comm: Communicator) -> bool:
        """Whether ``algorithm`` (any spelling) can run this call, so that forcing it (NCCL_ALGO) is possible."""
        name = algorithm_name(algorithm)
        if name == MSCCL:
            return any(m.runs(kind, size_bytes, comm.ranks, comm.nodes) for m in self.profile.msccl)
        return any(a == name for a, _ in self.enabled(kind, comm))

    def plan(self, kind: str, size_bytes: int, comm: Communicator, algorithm: str | None = None,
             exchange: str = "") -> Plan:
        """The library's choice for one call (or its best protocol for a forced ``algorithm``), timed.
        ``exchange``: an expert-parallel exchange library (exchange.py) runs the call instead; across nodes its
        network stage runs at that library's measured efficiency."""
        cache_key = (kind, size_bytes, comm, algorithm, exchange)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        if comm.ranks < 1:
            raise InputError("a collective needs at least one rank")
        enabled = self._enabled_cache.get((kind, comm))
        if enabled is None:  # the pairs, their terms filled in by the first call that moves data
            enabled = {pair: None for pair in self.enabled(kind, comm)}
            if len(self._enabled_cache) < 100_000:
                self._enabled_cache[(kind, comm)] = enabled
        pairs = list(enabled)
        if comm.ranks == 1 or size_bytes == 0:  # nothing moves
            only = Candidate(pairs[0][0], pairs[0][1], 1, 0.0, 0.0, 0.0, 0.0)
            return Plan(kind, size_bytes, comm, only, (only,))
        for pair, terms in enabled.items():
            if terms is None:
                enabled[pair] = self._fixed(*pair, kind, comm)
        program = next((m for m in self.profile.msccl if m.runs(kind, size_bytes, comm.ranks, comm.nodes)),
                       None) if self.profile.msccl and not exchange else None
        if program is not None:  # the library runs a loaded MSCCL program before consulting its tuning model
            pairs = [(MSCCL, program.protocol), *pairs]
        if algorithm is not None:
            name = algorithm_name(algorithm)
            forced = [(a, p) for a, p in pairs if a == name]
            if not forced:
                valid = sorted({a for a, _ in pairs})
                raise InputError(f"algorithm {algorithm!r} cannot run {kind} on {comm.ranks} GPU(s) over "
                                 f"{comm.nodes} node(s) with profile {self.profile.name}; valid: {', '.join(valid)}")
            pairs = forced
        fixed = {pair: enabled.get(pair) for pair in pairs}
        runs_it = exchange_library(exchange) if exchange else None
        if runs_it is not None and comm.nodes > 1:
            efficiency = runs_it.network_efficiency(comm.nodes)
            fixed = {pair: replace(terms, params={**terms.params, "efficiency": efficiency})
                     if terms is not None and terms.net_raw > 0 else terms for pair, terms in fixed.items()}
        candidates = sorted((self.candidate(a, p, kind, size_bytes, comm, fixed=fixed[(a, p)]) for a, p in pairs),
                            key=lambda c: (c.algorithm != MSCCL, c.library_us, ALGORITHMS.index(c.algorithm),
                                           PROTOCOL_INDEX[c.protocol]))
        if program is not None and candidates[0].algorithm == MSCCL:
            candidates[0] = replace(candidates[0], channels=program.channels)
        elif algorithm is None and self.profile.tuner is not None:  # a tuner plugin overrides the library's choice
            pick = tuner_choice(self.profile.tuner, kind, size_bytes, comm.ranks, comm.nodes, set(pairs))
            if pick is not None:
                candidates.sort(key=lambda c: (c.algorithm, c.protocol) != pick)
        plan = Plan(kind, size_bytes, comm, candidates[0], tuple(candidates))
        if len(self._cache) < 100_000:
            self._cache[cache_key] = plan
        return plan
