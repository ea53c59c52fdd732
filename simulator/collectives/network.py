"""The scale-out stage of a collective that spans nodes: what the node's NICs allow each algorithm, how well a
transport fills them, and how a chunked network pipeline fills them at mid sizes.

Why a module of its own: the scale-up fabric is calibrated per GPU class on published single-node tables, but most
profiles have no multi-node table at all, so their network timing must follow from the hardware (NIC count and
speed), the transport, and how NCCL/RCCL drive the network. Three pieces, all structural:

- **Bus-bandwidth bounds** (nccl-tests busbw, GB/s) from the NICs one node puts behind the communicator
  (``node_nic_GBps``). A ring crosses every node boundary once per channel, so its busbw is bounded by the node's
  NICs (ring, PAT). Trees of nodes (tree, NVLS-tree) send each node's buffer once up and once down the tree: their
  algorithm bandwidth is bounded by the node's NICs on two nodes (each node sends and receives the buffer once) and
  by half of them on more (a tree node sends up and to two children). SHARP (CollNet) reduces in
  the switch: the buffer crosses each node's NICs once each way. All-to-all sends the share of every GPU's buffer
  bound off the node through the node's NICs: busbw <= NICs x (n - 1) / (ppn x (n - ppn)).
- **Transport latency**: each network step waits one one-way latency, or two where the receiver must also wait
  for a completion (``latencies_per_step``).
- **Transport efficiency**: the fraction of NIC line rate a long NCCL stream achieves (``scale_out.efficiency`` or
  the transport's default below, each with its public basis).
- **In-flight limit**: NCCL moves Simple-protocol data through the network in chunks, with ``NCCL_STEPS`` (8) slots
  per connection (a ring's all-reduce chunk spans 4 of them); a slot is reused only when the receiver's credit comes
  back, one network round trip later. A channel therefore carries at most ``slots x chunk`` per round trip, which
  caps its bandwidth when chunks are small: NCCL shrinks them for small buffers (the NVLS-tree rules below follow
  ``enqueue.cc``), which is why multi-node busbw climbs slowly through the MiB sizes, and faster on fast-latency
  fabrics. The round trip is the library's per-step network latency (Simple: a step's send, completion and credit)
  plus the transport's one-way latency both ways.
"""

from __future__ import annotations

from dataclasses import dataclass

NCCL_STEPS = 8  # slots per connection
DEFAULT_BUFFSIZE_BYTES = 4 << 20  # NCCL_BUFFSIZE: a slot is buffsize / NCCL_STEPS
DEFAULT_NVLS_CHUNK_BYTES = 128 << 10  # NCCL_NVLS_CHUNKSIZE
DEFAULT_P2P_NET_CHUNK_BYTES = 128 << 10  # NCCL_P2P_NET_CHUNKSIZE
SIMPLE_NET_HOP_US = 14.0  # the library's per-step network latency with Simple (tuning.cc), its proxy included


@dataclass(frozen=True, slots=True)
class TransportDefaults:
    """What a profile assumes when it does not state the figure (each is stated in the profiles that use it)."""

    efficiency: float  # achievable fraction of NIC line rate for long NCCL streams
    basis: str
    unpack: bool = False  # received data lands in bounce buffers a GPU kernel unpacks once the plugin reports it


TRANSPORT_DEFAULTS = {
    "ib": TransportDefaults(0.94, "NCCL maintainers: 46-48 GB/s per 400 Gb/s NDR NIC through NCCL (nccl-tests#290)"),
    "roce": TransportDefaults(0.88, "the RCCL ring over 8x 400 Gb/s RoCE on 1-8 MI325X nodes (shared table): 352 of "
                                    "400 GB/s"),
    "efa": TransportDefaults(0.91, "NCCL ring on 4 p5en nodes, 364.9 GB/s busbw at 16 GiB over 3,200 Gb/s EFA "
                                   "(stas00/ml-engineering todo.md, 2026-08-07)"),
    "tcp": TransportDefaults(0.85, "assumption: no published TCP(X/XO) ring figure; below RDMA transports", True),
}


def latencies_per_step(transport: str, protocol: str) -> int:
    """One-way transport latencies a network step waits for: Simple's receiver also waits for the flush of the data
    (a second one); so does every protocol over GPUDirect-TCPX(O) ("tcp"), whose plugin hands received data to an
    unpack kernel only after reporting the receive complete (google/nccl-plugin-gpudirecttcpx: DEV_UNPACK devices),
    where LL and LL128 otherwise let the GPU poll flags in the data as it arrives."""
    return 2 if protocol == "Simple" or TRANSPORT_DEFAULTS[transport].unpack else 1


def node_nic_GBps(nics_per_node: int, nic_GBps: float, per_node: int, gpus_per_node: int) -> float:
    """The NIC bandwidth (GB/s, one direction) one node puts behind ``per_node`` of its GPUs: every GPU uses the NICs
    nearest to it, so a partial node uses its share (at least one NIC)."""
    nics = min(nics_per_node, max(1.0, per_node * nics_per_node / gpus_per_node))
    return nics * nic_GBps


def net_busbw_bound(algorithm: str, kind: str, ranks: int, nodes: int, per_node: int, node_GBps: float) -> float:
    """The busbw (nccl-tests convention) the node's NICs allow ``algorithm`` on ``nodes`` nodes (> 1)."""
    n, ppn = ranks, per_node
    if algorithm in ("nvls_tree", "tree"):  # algorithm bandwidth: the node's NICs (2 nodes) or half of them (more)
        algbw = node_GBps if nodes <= 2 else node_GBps / 2
        return algbw * 2 * (n - 1) / n
    if algorithm == "collnet":
        return node_GBps * (2 * (n - 1) / n if kind == "all_reduce" else 1.0)
    if algorithm == "direct":  # every GPU's off-node share through the node's NICs
        remote = n - ppn
        return node_GBps * (n - 1) / (ppn * remote) if remote > 0 else float("inf")
    return node_GBps  # ring, PAT, p2p: the ring crosses each node's NICs once per channel


def network_channels(algorithm: str, per_node: int) -> int:
    """Channels that carry network traffic: two per GPU of the node (NCCL's usual count on 8-GPU, 8-NIC nodes);
    point-to-point counts one per GPU, its connections to every peer in flight at once."""
    return max(1, per_node) if algorithm in ("direct", "p2p") else max(2, 2 * per_node)


def chunk_bytes(algorithm: str, kind: str, size_bytes: int, ranks: int, channels: int, per_node: int,
                buffsize_bytes: int = DEFAULT_BUFFSIZE_BYTES, nvls_chunk_bytes: int = DEFAULT_NVLS_CHUNK_BYTES,
                p2p_chunk_bytes: int = DEFAULT_P2P_NET_CHUNK_BYTES) -> tuple[float, int]:
    """(bytes per network message, slots in flight per connection) with the Simple protocol. The library's rules are
    staircases in the buffer size; a continuous version of each keeps the call's time monotone in its size."""
    step = buffsize_bytes / NCCL_STEPS
    if algorithm == "nvls_tree":  # enqueue.cc halves the chunk while the buffer is small for the concurrent ops
        ops = channels * max(1, per_node)
        return min(float(nvls_chunk_bytes), max(32768.0, size_bytes / (2 * ops))), NCCL_STEPS
    if algorithm in ("direct", "p2p"):  # grouped point-to-point: a connection (and its slots) per off-node peer
        return min(float(p2p_chunk_bytes), size_bytes / max(1, ranks)), NCCL_STEPS * max(1, ranks - per_node)
    if algorithm == "ring":  # an all-reduce chunk spans 4 slots; while a step's data fits one chunk the ring is
        steps = 4 if kind == "all_reduce" else 2  # latency-bound (its per-step latency), not credit-bound
        return step * steps, NCCL_STEPS // steps
    return min(step, max(32768.0, size_bytes / max(1, channels))), NCCL_STEPS  # tree, collnet, PAT: a slot each


def inflight_factor(chunk: float, slots: int, channel_GBps: float, round_trip_us: float) -> float:
    """The fraction of a channel's bandwidth its connection keeps busy: at most ``slots`` chunks per round trip."""
    if channel_GBps <= 0 or round_trip_us <= 0:
        return 1.0
    busy_bytes = channel_GBps * 1e3 * round_trip_us  # bytes the channel could move during one round trip
    return min(1.0, slots * chunk / (chunk + busy_bytes))
