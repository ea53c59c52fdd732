"""Put a simulation together from its inputs, run it, and report results or a deadlock."""

from __future__ import annotations

import gc
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from compute.roofline import Roofline
from network.backends import QUOTIENT_BACKENDS, SYMMETRIC_BACKENDS, make_backend
from network.config import NetworkConfig
from network.messaging import Messaging, MirroredMessaging
from simulator.breakdown import activity, link_table, summarize_collectives
from simulator.checks import COMPUTE_MODELS, ComputeModel, check_same_gpu, check_workload, compute_model
from simulator.chunk_order import ChunkOrders
from simulator.config import IMPLEMENTATION_KEYS, MemoryConfig, SystemConfig, check_memory_fits
from simulator.engine import CheckedEngine, Engine
from simulator.memory import RemoteMemory
from simulator.node_table import COMM_STREAMS, SINGLE_STREAM
from simulator.quotient import Quotient, find_quotient, finer, quotient_of
from simulator.quotient_run import Diverged, QuotientEngine, QuotientMessaging
from simulator.rank import RankWorkload
from simulator.results import SimulationResult, format_ns
from simulator.stream_numbers import StreamNumbers
from simulator.symmetry import symmetry_blockers
from simulator.system import COLLECTIVE, HANDSHAKE, RankSystem, SystemSetup, tag_kind
from simulator.units import with_current_keys
from workload.errors import InputError, shown
from workload.schema import NodeType
from workload.traceset import TraceLoader, TraceSet
from workload.traceset import print_progress as _progress_line
from workload.validate import validate

if TYPE_CHECKING:  # the nccl collective model is imported when a run asks for it
    from simulator.collectives.hardware import HardwareProfile
    from simulator.nccl_run import NcclRun

VERSION = "0.1.0"
SEMANTICS = ("astra-sim", "corrected")
ENGINES = ("auto", "message", "symmetric")
COLLECTIVE_MODELS = ("astra-sim", "nccl")
DEFAULT_BACKEND = "analytical-unaware"
Warn = Callable[[str], None]


class DeadlockError(InputError):
    """The simulation ran out of events with nodes unfinished."""


class WallTimeExceeded(Exception):
    """--max-wall-time ran out: ``result`` holds the statistics of the part simulated so far."""

    def __init__(self, message: str, result: SimulationResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    backend: str = DEFAULT_BACKEND
    queues_per_dim: int = 1
    injection_scale: float = 1.0
    rendezvous: bool = False
    semantics: str = "astra-sim"
    drop_dangling: bool = False
    device: str | None = None  # a device name or device file (compute/devices.py)
    compute_model: str = "roofline"  # roofline (ASTRA-sim's, with --device) | kernels (compute/kernels.py)
    engine: str = "auto"  # auto | message | symmetric
    timeline: bool = False  # keep per-node spans and point-to-point messages for a timeline
    timeline_phases: bool = False  # also each chunk-stream's phases
    progress: bool = True
    strict: bool = False  # refuse instead of warning when compute nodes cannot be timed
    max_wall_time_s: float | None = None  # stop (WallTimeExceeded) after this much wall-clock time
    collective_model: str = "astra-sim"  # astra-sim: ASTRA-sim's chunked algorithms on the network; nccl: the
    # NCCL/RCCL-like model (simulator/nccl_run.py) times every collective and send/receive
    hw_profile: str | None = None  # the nccl model's hardware profile: a shipped name or a profile file (.yml)
    nccl_algorithm: str | None = None  # the nccl model runs this algorithm wherever it can (as NCCL_ALGO)
    comm_streams: str = SINGLE_STREAM  # single: ASTRA-sim's one communication node in flight per rank;
    # communicator: one per communicator (a collective's group, a send's peer), as NCCL's streams
    sm_sharing: bool = False  # running NCCL collectives hold SMs that compute-bound kernels lose (nccl + kernels)


def _finite(value: Any, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
        low <= value <= high)


class Simulation:
    """One run: traces + network + system (+ memory, communicator groups) -> per-rank results."""

    def __init__(self, traces: TraceSet, network: NetworkConfig, system: SystemConfig, memory: MemoryConfig,
                 comm_groups: dict[int, tuple[int, ...]] | None = None, options: RunOptions | None = None,
                 warn: Warn | None = None) -> None:
        self.traces = traces
        self.network = network
        self.system = system
        self.memory = memory
        self.comm_groups = comm_groups or {}
        self.options = options or RunOptions()
        self.workloads: list[RankWorkload] = []
        self.backend: Any = None
        self._orders = ChunkOrders()
        self._fold_failure = ""  # why the last folded run could not be exact
        self._culprits: frozenset[int] = frozenset()  # and the generators of its quotient that caused it
        self._built: dict[int, Any] = {}  # representatives' graphs of a generated workload, by rank
        self.compute = ComputeModel(None, None)
        self.warn = warn or (lambda message: None)
        self._stream_numbers = StreamNumbers(self.warn)  # warns once, whatever runs the simulation takes
        self.hw_profile: HardwareProfile | None = None
        self.nccl: NcclRun | None = None
        if self.options.semantics not in SEMANTICS:
            raise InputError(f"unknown semantics {self.options.semantics!r}; valid: {', '.join(SEMANTICS)}")
        if self.options.engine not in ENGINES:
            raise InputError(f"unknown engine {self.options.engine!r}; valid: {', '.join(ENGINES)}")
        opts = self.options
        if isinstance(opts.queues_per_dim, bool) or not isinstance(opts.queues_per_dim, int) or not (
                1 <= opts.queues_per_dim <= 4096):
            raise InputError("queues per dimension must be a whole number from 1 to 4096, not "
                             f"{shown(opts.queues_per_dim)}")
        if not _finite(opts.injection_scale, 0, 1e6):
            raise InputError(f"the injection scale must be a number from 0 to 1e6, not {shown(opts.injection_scale)}")
        if opts.max_wall_time_s is not None and not (_finite(opts.max_wall_time_s, 0, 1e9) and opts.max_wall_time_s):
            raise InputError("the wall-time limit must be a positive number of seconds, not "
                             f"{shown(opts.max_wall_time_s)}")
        if opts.comm_streams not in COMM_STREAMS:
            raise InputError(f"unknown communication streams {shown(opts.comm_streams)}; valid: "
                             f"{', '.join(COMM_STREAMS)}")
        if opts.sm_sharing and (opts.collective_model != "nccl" or opts.compute_model != "kernels"):
            raise InputError("SM sharing (--sm-sharing) needs --collective-model nccl (the blocks its collectives run) "
                             "and --compute-model kernels (the device's SMs and which kernels are compute-bound)")
        if opts.compute_model not in COMPUTE_MODELS:
            raise InputError(f"unknown compute model {shown(opts.compute_model)}; valid: {', '.join(COMPUTE_MODELS)}")
        self._check_collective_model()

    def _check_collective_model(self) -> None:
        opts = self.options
        if opts.collective_model == "astra-sim" and opts.hw_profile is None and opts.nccl_algorithm is None:
            return
        from simulator.collectives.hardware import load_profile, profile_names
        from simulator.collectives.nccl import ALGORITHMS, algorithm_name

        if opts.collective_model not in COLLECTIVE_MODELS:
            raise InputError(f"unknown collective model {shown(opts.collective_model)}; valid: "
                             f"{', '.join(COLLECTIVE_MODELS)}")
        if opts.hw_profile is not None and not isinstance(opts.hw_profile, str):
            raise InputError(f"the hardware profile must be a name or a file, not {shown(opts.hw_profile)}")
        if opts.nccl_algorithm is not None and (not isinstance(opts.nccl_algorithm, str)
                                                or algorithm_name(opts.nccl_algorithm) is None):
            raise InputError(f"unknown NCCL algorithm {shown(opts.nccl_algorithm)}; valid: {', '.join(ALGORITHMS)}")
        if opts.collective_model == "astra-sim":
            for name, value in (("hardware profile", opts.hw_profile), ("NCCL algorithm", opts.nccl_algorithm)):
                if value is not None:
                    self.warn(f"{name} {shown(value)} has no effect with the astra-sim collective model (it is used "
                              "by --collective-model nccl)")
            return
        if not opts.hw_profile:
            raise InputError("the nccl collective model needs a hardware profile (--hw-profile NAME or FILE.yml); "
                             f"shipped: {', '.join(profile_names())}")
        self.hw_profile = load_profile(opts.hw_profile).for_job(self.network.num_npus)  # a job's slice of a rack
        if opts.backend != DEFAULT_BACKEND:
            self.warn(f"the {opts.backend} backend has no effect with --collective-model nccl: the model times every "
                      "collective and send/receive")

    def run(self) -> SimulationResult:
        started = time.perf_counter()
        opts, npus = self.options, self.network.num_npus
        loader = TraceLoader(drop_dangling=opts.drop_dangling, warn=self.warn)
        check_memory_fits(self.memory, npus)
        self.compute = compute_model(self.system, opts.device, opts.compute_model)
        if self.hw_profile is not None and self.compute.hardware is not None:
            check_same_gpu(self.compute.hardware, self.hw_profile, self.warn)
        if self.compute.kernels is not None and self.compute.kernels.device.calibrated == "assumed":
            d = self.compute.kernels.device
            source = d.calibration.get("derived_from", "another device")
            self.warn(f"device {d.name}: no kernel measurements calibrate its kernel parameters (they are "
                      f"{source}'s), so --compute-model kernels is a rough estimate here; --compute-model roofline "
                      "uses only its peaks")
        roofline = self.compute.roofline
        # the nccl model replaces the system's collective algorithms: check and judge symmetry without them
        system = self.system if self.hw_profile is None else _without_algorithms(self.system, self.network.num_dims)
        blockers: list[str] = []
        quotient = self._generated_quotient(system)
        if quotient is not None:  # a generated workload: only the representatives' traces are ever built
            graphs = self._representatives(loader, quotient)
        else:
            graphs = loader.load_set(self.traces, npus, _progress_line if opts.progress else None)
            if self.traces.shared and self.traces.contents is None:  # a file given, not a generator built in memory
                self.warn(f"one trace file for all {npus} ranks: {self.traces.files[0]}")
        check_workload(graphs, self.traces, system, self.network, self.compute, opts.strict, self.warn)
        if quotient is None:
            blockers = symmetry_blockers(graphs, system, self.memory, self.network.npus_count, self.comm_groups)
            if self.hw_profile is not None:
                pass  # no network backend: the model times collectives alike on every rank
            elif opts.backend not in SYMMETRIC_BACKENDS:
                blockers.append(f"the {opts.backend} backend simulates every message")
            elif self.network.fabric is not None:
                blockers.append("routes on a fabric differ from NPU to NPU")
            if blockers and opts.engine != "message":
                found = self._quotient(graphs, system)
                if isinstance(found, str):
                    blockers.append(found)
                else:
                    quotient = found
        if opts.engine == "symmetric" and blockers and quotient is None:
            raise InputError("the symmetric (representative-rank) engine cannot run this workload: "
                             + "; ".join(blockers) + " (use --engine message)")
        result = None
        reason = "--engine message" if opts.engine == "message" or not blockers else "; ".join(blockers)
        if quotient is not None or (opts.engine != "message" and not blockers):
            result = self._folded(graphs, roofline, started, quotient, loader)
            if result is None:
                reason = self._fold_failure
                if quotient is not None and self.traces.structure is not None:
                    graphs = loader.load_set(self.traces, npus,  # every rank's own trace, after all
                                             _progress_line if opts.progress else None)
        if result is None:
            # ASTRA-sim's own networks keep its chunk order (chunk_order.py) unless ranks disagree into a deadlock
            enforce = (opts.semantics == "corrected" or self.network.fabric is not None
                       or opts.backend not in SYMMETRIC_BACKENDS)
            try:
                result = self._simulate(graphs, roofline, started, symmetric=False, enforce_order=enforce)
            except DeadlockError:
                if enforce or not self._orders.diverged:
                    raise
                self.warn("ranks of a ring started chunks of their collectives in different orders (their timing "
                          "differs), which deadlocks ASTRA-sim 2.x; simulating again with one agreed chunk order "
                          "per ring, as collective libraries run them")
                result = self._simulate(graphs, roofline, started, symmetric=False, enforce_order=True)
            result.simulated_ranks = npus
            result.engine_reason = f"every rank: {reason}"
        return result

    def _folded(self, graphs: list[Any], roofline: Roofline | None, started: float, quotient: Quotient | None,
                loader: TraceLoader) -> SimulationResult | None:
        """The run with one representative (``quotient`` None) or one per class; None when it cannot be exact
        (``_fold_failure`` says why), and the caller simulates every rank. Where real ranks of a class would order
        same-time events differently, a finer quotient (without the shifts that reverse them) is tried first."""
        dropped: list[str] = []
        while True:
            result = self._simulate(graphs, roofline, started, symmetric=quotient is None, quotient=quotient)
            if result is not None or quotient is None or not self._culprits:
                break
            names = [s.name for k, s in enumerate(quotient.shifts) if k in self._culprits]
            dropped.append(f"not under {' or '.join(names)}: {self._fold_failure}")
            quotient = finer(quotient, self._culprits)
            if quotient is None:
                self._fold_failure = "; ".join(dropped)
                break
            if self.traces.structure is not None:
                graphs = self._representatives(loader, quotient)
        if result is None:
            if self.options.engine == "symmetric":
                raise InputError(f"{self._fold_failure}, so representatives cannot give exact results (use --engine "
                                 "message)")
            # no warning: the results are exact either way, nothing in the input is wrong, and the engine line
            # (engine_reason) says why every rank was simulated
        elif quotient is None:
            result.simulated_ranks = 1
            result.engine_reason = "every rank behaves like rank 0, shifted: one representative"
        else:
            result.simulated_ranks = len(quotient.representatives)
            result.engine_reason = (f"{len(quotient.representatives):,} classes of {quotient.orbit_size:,} "
                                    f"equivalent ranks under {quotient.described}"
                                    + "".join(f"; {why}" for why in dropped) + _unfolded(quotient, dropped))
        return result

    def _fold_blocker(self) -> str | None:
        """Why classes of equivalent ranks cannot be folded here (None: they can)."""
        if self.hw_profile is not None:
            return "replayed communication" if self.system.replay_only else None
        if self.options.backend not in QUOTIENT_BACKENDS or self.network.fabric is not None:
            return (f"classes of equivalent ranks are folded on the {' and '.join(QUOTIENT_BACKENDS)} backends "
                    "without a fabric")
        if self.system.replay_only or self.memory.memory_type in ("PER_NODE_MEMORY_EXPANSION", "MEMORY_POOL"):
            return "replayed communication or shared remote memory"
        return None

    def _quotient(self, graphs: list[Any], system: SystemConfig) -> Quotient | str:
        """The classes of equivalent ranks, or why the quotient engine does not apply."""
        blocker = self._fold_blocker()
        if blocker is not None:
            return blocker
        found = find_quotient(graphs, self.comm_groups, *self._fold_network(), system, self._fold_blocks())
        return found if found is not None else "no shift of ranks maps the workload and the network onto themselves"

    def _fold_network(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The network symmetries must keep: the network's, or with --collective-model nccl, none but the
        profile's nodes and NICs (_fold_blocks)."""
        if self.hw_profile is not None:
            return (self.network.num_npus,), ("Switch",)
        return tuple(self.network.npus_count), tuple(self.network.topology)

    def _fold_blocks(self) -> tuple[np.ndarray, ...]:
        """With --collective-model nccl: rank -> node, rank -> NIC, which every symmetry must map onto themselves."""
        if self.hw_profile is None:
            return ()
        ranks = np.arange(self.network.num_npus)
        return ranks // self.hw_profile.gpus_per_node, self.hw_profile.nic_of(ranks)

    def _generated_quotient(self, system: SystemConfig) -> Quotient | None:
        """For a generated workload that describes its ranks (TraceSet.structure): the classes, found without
        building any trace."""
        structure = self.traces.structure
        if structure is None or self.options.engine == "message" or self.comm_groups or self._fold_blocker():
            return None
        described = [structure(r) for r in range(self.network.num_npus)]
        return quotient_of([k for k, _ in described], [v for _, v in described], *self._fold_network(), system,
                           self._fold_blocks())

    def _representatives(self, loader: TraceLoader, quotient: Quotient) -> list[Any]:
        """Per rank, its representative's graph: only the representatives' traces are built and decoded."""
        built = self._built
        for r in quotient.representatives:
            if r not in built:
                built[r] = loader.load(self.traces.file_for(r), r, self.traces.contents)
        return [built[rep] for rep in quotient.rep_of.tolist()]

    def _simulate(self, graphs: list[Any], roofline: Roofline | None, started: float, symmetric: bool,
                  enforce_order: bool = True, quotient: Quotient | None = None) -> SimulationResult | None:
        """One run with every rank, with one representative rank, or with one per class of equivalent ranks
        (``quotient``); None if a folded run turns out ambiguous."""
        opts, npus = self.options, self.network.num_npus
        self._orders = ChunkOrders(enforce_order)
        self._stream_numbers.new_run()
        engine = (QuotientEngine(quotient) if quotient is not None else CheckedEngine() if symmetric else Engine())
        if self.hw_profile is not None:  # the run's NCCL-like model is its network too (sends/receives)
            from simulator.nccl_classes import NcclClasses
            from simulator.nccl_run import NcclRun

            classes = None
            if quotient is not None:
                classes = NcclClasses(quotient, self.hw_profile)
            simulated_ranks = quotient.representatives if quotient is not None else (0,) if symmetric else range(npus)
            backend = self.nccl = NcclRun(engine, self.hw_profile, npus, simulated_ranks, opts.nccl_algorithm,
                                          self.warn, classes)
        else:
            backend = make_backend(opts.backend, self.network, engine, symmetric=symmetric, classes=quotient)
        if opts.timeline and hasattr(backend, "enable_history"):
            backend.enable_history()
        elif opts.timeline and hasattr(backend, "keep_history"):
            backend.keep_history = True
        self.backend = backend
        if quotient is not None:
            messaging: Messaging = QuotientMessaging(engine, backend, quotient)  # type: ignore[arg-type]
        elif symmetric:
            messaging = MirroredMessaging(engine, backend, self.network.npus_count)
        else:
            messaging = Messaging(engine, backend)
        folded = symmetric or quotient is not None
        setup = SystemSetup(engine=engine, messaging=messaging, config=self.system,
                            npus_per_dim=self.network.npus_count, queues_per_dim=opts.queues_per_dim,
                            injection_scale=opts.injection_scale, rendezvous=opts.rendezvous,
                            chunk_orders=None if folded else self._orders, stream_numbers=self._stream_numbers)
        memory = RemoteMemory(self.memory)
        ranks = []
        simulated = quotient.representatives if quotient is not None else range(1 if symmetric else npus)
        for r in simulated:
            graph = graphs[r]
            ranks.append(RankWorkload(
                r, self.traces.file_for(r), graph, validate(graph, drop_dangling=opts.drop_dangling),
                RankSystem(r, setup), memory=memory, roofline=roofline, kernels=self.compute.kernels,
                replay_only=self.system.replay_only,
                corrected=opts.semantics == "corrected", comm_groups=self.comm_groups, warn=self.warn,
                timeline=opts.timeline, nccl=self.nccl, comm_streams=opts.comm_streams,
                sm_sharing=opts.sm_sharing))
            if opts.timeline_phases:
                ranks[-1].system.phase_log = []
        if isinstance(messaging, QuotientMessaging):
            messaging.groups_of = {w.rank: w.groups for w in ranks}
            if self.nccl is not None and self.nccl.classes is not None:
                self.nccl.classes.groups_of = messaging.groups_of
        try:
            for w in ranks:
                if isinstance(engine, QuotientEngine):
                    engine.start_rank(w.rank)
                w.wake()
            monitor = self._run_events(engine, ranks, started)
        except Diverged as e:  # real ranks of a class would order same-time events differently
            self._fold_failure = str(e)
            self._culprits = e.culprits
            return None
        if folded and engine.ambiguous:  # type: ignore[attr-defined]
            self._fold_failure = "same-time events make ranks diverge"
            return None
        if quotient is not None and not monitor.expired and any(w.finish_ns is None for w in ranks):
            self._fold_failure = "representatives did not finish"  # the full run finds out why (a real deadlock)
            return None
        if monitor.expired:
            raise WallTimeExceeded(monitor.stop_message(), self._partial_result(engine, ranks, messaging, started))

        unfinished = [w for w in ranks if w.finish_ns is None]
        if unfinished:
            blocked = getattr(backend, "blocked_links", lambda: [])()
            if blocked:
                advice = ("with a virtual channel per hop this cannot happen: please report it as a bug"
                          if backend.hop_channels else "set the packet section's virtual_channels: hops (a channel per "
                          "hop cannot deadlock), raise its buffer_bytes or set flow_control: none")
                raise DeadlockError(
                    f"deadlock in the packet network: {len(blocked)} link(s) wait for buffer room that never frees "
                    f"(a cycle of full queues, e.g. {', '.join(blocked[:4])}); {advice}")
            raise DeadlockError(deadlock_report(unfinished, messaging, self.nccl))
        if setup.group_rings:
            keys = ", ".join(f"'{k.replace('_', '-')}-implementation' {list(self.system.implementation(k))}"
                             for k in sorted(setup.group_rings))
            self.warn(f"collectives on communicator groups of fewer than all {npus} NPUs ran as one ring over the "
                      f"group's members, as ASTRA-sim runs them on a network of several dimensions: the system's "
                      f"{keys} applies only to collectives over all NPUs")
        stats = [w.stats() for w in ranks]
        negative = [s.rank for s in stats if s.exposed_signed_ns < 0]
        if negative:
            self.warn(f"rank(s) {', '.join(map(str, negative[:8]))}: GPU work overlapped itself (in replay-only mode "
                      "communication is replayed as GPU work), so exposed communication is negative; like ASTRA-sim, "
                      "exposed_comm_ns reports it as an unsigned 64-bit number")
        representative: list[int] = []
        everyone = ranks
        if symmetric:
            stats = [replace(stats[0], rank=r) for r in range(npus)]
            representative = [0] * npus
        elif quotient is not None:
            by_rank = {s.rank: s for s in stats}
            representative = quotient.rep_of.tolist()
            stats = [replace(by_rank[representative[r]], rank=r) for r in range(npus)]
            of = {w.rank: w for w in ranks}
            everyone = [of[representative[r]] for r in range(npus)]  # each rank as its representative
        finish = max(s.finish_ns for s in stats)
        self.workloads = ranks  # for timelines
        links = getattr(backend, "links", None)
        copies = npus if symmetric else quotient.orbit_size if quotient is not None else 1
        return SimulationResult(
            finish_ns=finish, ranks=stats, backend=self.backend_name,
            config=self.config_summary(), version=VERSION, wall_time_s=time.perf_counter() - started,
            events=engine.events_processed, messages=messaging.messages * copies,
            engine="symmetric" if folded else "message",
            collectives=summarize_collectives([w.collective_log for w in everyone]),
            links=link_table(links, finish, folded) if links is not None else [],
            activity=activity(everyone, finish), network=network_stats(backend), representative=representative)

    def _partial_result(self, engine: Engine, ranks: list[RankWorkload], messaging: Messaging, started: float
                        ) -> SimulationResult:
        """What a run stopped part-way has to show: per-rank times so far, links, network statistics."""
        now = int(engine.now)
        links = getattr(self.backend, "links", None)
        return SimulationResult(
            finish_ns=now, ranks=[w.stats() for w in ranks], backend=self.backend_name,
            config=self.config_summary(), version=VERSION, wall_time_s=time.perf_counter() - started,
            events=engine.events_processed, messages=messaging.messages, engine="message",
            notes=[f"stopped at {now} ns of simulated time: {sum(w.finish_ns is None for w in ranks)} rank(s) "
                   "unfinished"],
            collectives=summarize_collectives([w.collective_log for w in ranks]),
            links=link_table(links, now, False) if links is not None else [], network=network_stats(self.backend),
            complete=False)

    def _run_events(self, engine: Engine, ranks: list[RankWorkload], started: float) -> RunMonitor:
        # What exists before the first event (traces, tables, configuration) lives through the run: frozen, the
        # cyclic garbage collector stops re-scanning it on every full collection (a tenth of a long run's time)
        ours = gc.get_freeze_count() == 0  # a caller that froze objects itself keeps them frozen
        if ours:
            gc.freeze()
        try:
            return self._event_loop(engine, ranks, started)
        finally:
            if ours:
                gc.unfreeze()

    def _event_loop(self, engine: Engine, ranks: list[RankWorkload], started: float) -> RunMonitor:
        env = engine.env
        monitor = RunMonitor(ranks, started, self.options, env, self.backend, time.perf_counter())
        count = 0
        last_progress = -1
        batch = 0x4000  # events between checks of the wall-time limit and progress lines
        while not monitor.expired:
            while True:
                done = engine.run_batch(batch)
                count += done
                if done < batch or monitor.check(count) or monitor.expired:
                    break
            if monitor.expired:
                break
            stalled = [w for w in ranks if w.finish_ns is None and w.stalled]
            progress = sum(w.feeder.finished for w in ranks)
            if not stalled or progress == last_progress:
                break
            last_progress = progress
            # ASTRA-sim would stop here without finishing these ranks: zero-time nodes released children that
            # it only issues at the rank's next event, and there is none.
            self.warn(f"rank(s) {', '.join(str(w.rank) for w in stalled[:8])} would stall in ASTRA-sim 2.x "
                      "(children of zero-time nodes wait for an event that never comes); issuing them at "
                      f"{env.now} ns (use --semantics corrected to issue them at once)")
            for w in stalled:
                if isinstance(engine, QuotientEngine):
                    engine.start_rank(w.rank, stalled=True)
                w.wake()
        engine.events_processed = count
        return monitor

    @property
    def backend_name(self) -> str:
        return "nccl" if self.hw_profile is not None else self.options.backend

    def config_summary(self) -> dict[str, Any]:
        """The configuration as run: the system as the compute model applied it (a --device turns roofline on)."""
        compute = self.compute
        system = replace(self.system, roofline_enabled=compute.roofline is not None,
                         device=compute.device or self.system.device)
        summary = {
            "workload": self.traces.source, "network": self.network.summary(),
            "system": with_current_keys(asdict(system)), "compute": compute.summary(), "memory": asdict(self.memory),
            "comm_groups": {str(k): list(v) for k, v in self.comm_groups.items()}, "options": asdict(self.options),
        }
        if self.hw_profile is not None:  # --collective-model nccl: the profile as loaded
            p = self.hw_profile
            summary["hardware"] = {"name": p.name, "gpu": p.gpu, "gpus_per_node": p.gpus_per_node,
                                   "library": p.library, "library_version": p.library_version, "arch": p.arch,
                                   "path": p.path}
        return summary


def _unfolded(quotient: Quotient, dropped: list[str]) -> str:
    """Why two classes that run the same trace stay apart, when no dropped shift already says so."""
    if quotient.alike is None or dropped:
        return ""
    a, b = quotient.alike
    return (f"; ranks {a} and {b} run the same trace up to the ranks it names, but no shift of ranks found maps "
            "one onto the other with their peers, communicator groups and network positions")


def _without_algorithms(system: SystemConfig, dims: int) -> SystemConfig:
    """The system as the nccl model uses it: its collective algorithms (and reductions) are the model's, so they
    are neither checked nor a reason to simulate every rank."""
    return replace(system, implementations={kind: ("ring",) * dims for kind in IMPLEMENTATION_KEYS.values()},
                   local_mem_bw_GBps=system.local_mem_bw_GBps or 1.0)


def network_stats(backend: Any) -> dict[str, Any]:
    stats = getattr(backend, "message_stats", None)
    return stats() if stats is not None else {}


class RunMonitor:
    """Progress lines for long runs, with an estimate of the work left, and the --max-wall-time guard."""

    def __init__(self, ranks: list[RankWorkload], started: float, options: RunOptions, env: Any, backend: Any,
                 events_started: float | None = None) -> None:
        self.ranks = ranks
        self.started = started
        # the pace is measured from the first event, not from the run's start: building a large workload before
        # it took seconds and made the first estimates 20x too long
        self.events_started = started if events_started is None else events_started
        self.show = options.progress
        self.env = env
        self.backend = backend
        self.limit_s = options.max_wall_time_s
        self.deadline = started + options.max_wall_time_s if options.max_wall_time_s else None
        self.report_at = started + 5.0
        self._last = (self.events_started, 0.0)  # (time, fraction of the work done) at the last progress line
        self.total_nodes = sum(w.feeder.num_nodes for w in ranks) or 1
        self.expired = False
        self.events = 0
        if hasattr(backend, "tick"):
            backend.tick = self.check_backend

    def check_backend(self, now_ns: int) -> bool:
        """Called by a backend that runs its own event loop; True: stop."""
        return self.check(self.events)

    def check(self, events: int) -> bool:
        self.events = max(self.events, events)
        now = time.perf_counter()
        if self.deadline is not None and now > self.deadline:
            self.expired = True
            return True
        if self.show and now >= self.report_at:
            self.report_at = now + 10.0
            print("astrasim-py: " + self.line(now), file=sys.stderr, flush=True)
        return False

    def line(self, now: float) -> str:
        done_nodes = sum(w.feeder.finished for w in self.ranks)
        fraction = (done_nodes + self._collectives_under_way()) / self.total_nodes
        elapsed = now - self.events_started
        ranks_done = sum(w.finish_ns is not None for w in self.ranks)
        parts = [f"simulated {format_ns(self.env.now)}", f"{100 * fraction:.1f}% of trace nodes done",
                 f"{ranks_done}/{len(self.ranks)} ranks finished"]
        hops = getattr(self.backend, "packet_hops", None)
        if hops:
            parts.append(f"{hops / elapsed:,.0f} packet-hops/s")
        parts.append(self._estimate(now, fraction))
        return ", ".join(parts)

    def _estimate(self, now: float, fraction: float) -> str:
        """The time left from the pace since the last line and from the whole run; a range where they differ,
        none while nothing moves (an estimate that does not move with the run is worse than none)."""
        last_time, last_fraction = self._last
        self._last = (now, fraction)
        if fraction <= 0:
            return "no estimate of the time left until a first node finishes"
        overall = (now - self.events_started) * (1 - fraction) / fraction
        if fraction <= last_fraction:
            return f"no trace node finished in the last {now - last_time:,.0f} s, so no estimate of the time left"
        recent = (now - last_time) * (1 - fraction) / (fraction - last_fraction)
        low, high = sorted((overall, recent))
        if high > 2 * low:
            return f"between {low:,.0f} and {high:,.0f} s left (the pace varies)"
        return f"about {(low + high) / 2:,.0f} s left"

    def _collectives_under_way(self) -> float:
        """The finished share of the collectives under way (phases of their chunks done), in nodes."""
        return sum(d.phases_done / d.phases_total for w in self.ranks
                   for d in getattr(w, "collectives", {}).values() if d.phases_total)

    def stop_message(self) -> str:
        done = sum(w.feeder.finished for w in self.ranks)
        return (f"stopped by --max-wall-time {self.limit_s:g} s at {self.env.now} ns of simulated time, "
                f"{done} of {self.total_nodes} trace nodes done; the statistics below cover the part simulated")


def deadlock_report(unfinished: list[RankWorkload], messaging: Messaging, nccl: NcclRun | None = None,
                    per_rank: int = 4) -> str:
    """Which ranks are stuck, on which nodes, waiting for what."""
    pending_from: dict[int, list[str]] = {}
    for tag, src, dst, size, _, state in messaging.unmatched():
        user_tag, kind_id = tag_kind(tag)
        kind = "collective" if kind_id == COLLECTIVE else f"tag {user_tag}"
        if kind_id >= HANDSHAKE:
            kind = f"rendezvous handshake for {'a collective' if kind_id - HANDSHAKE == COLLECTIVE else kind}"
        pending_from.setdefault(dst, []).append(f"{kind} message of {size} B from rank {src} ({state})")
    lines = [f"deadlock: the simulation ran out of events with {len(unfinished)} rank(s) unfinished"]
    stuck_sends = 0
    for w in unfinished[:16]:
        g = w.graph
        ongoing = sorted(set(w.start_ns))
        parts = []
        for i in ongoing[:per_rank]:
            what = f"node {g.node_id(i)} ({g.name(i)!r}, {NodeType(w.table.types[i]).name})"
            if i in w.waiting_recv:
                src, size, tag = w.waiting_recv[i]
                what += f" waits for a send from rank {src} with tag {tag} and {size} bytes"
            elif w.table.types[i] == NodeType.COMM_SEND_NODE and w.system.rendezvous:
                stuck_sends += 1
                what += (f" waits for rank {w.table.comm_dst[i]} to post its receive (tag {w.table.comm_tag[i]}), "
                         "as --rendezvous-protocol has every send wait")
            elif i in w.collectives:
                waits = [m for m in pending_from.get(w.rank, []) if m.startswith("collective")]
                if nccl is not None:
                    waits = nccl.waiting_for(w.rank)[:1]
                what += " waits for " + (waits[0] if waits else "other ranks to join the collective")
            parts.append(what)
        blocked = w.feeder.num_nodes - w.feeder.finished - len(ongoing)
        extra = f"; {blocked} more node(s) wait for these" if blocked > 0 else ""
        more = f" (+{len(ongoing) - per_rank} more running)" if len(ongoing) > per_rank else ""
        lines.append(f"  rank {w.rank} ({w.path}): " + "; ".join(parts) + more + extra)
    if len(unfinished) > 16:
        lines.append(f"  ... and {len(unfinished) - 16} more rank(s)")
    if stuck_sends:
        lines.append("with --rendezvous-protocol a send waits until its receive is posted: ranks that each send to "
                     "the other before receiving wait for ever (without it, sends are eager and complete)")
    lines.append(("else, " if stuck_sends else "") + "check that every rank issues the same collectives in the same "
                 "order, and that every receive has a send with the same tag and size")
    return "\n".join(lines)
