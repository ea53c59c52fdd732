"""What rescaling an N-rank data-parallel trace to M ranks does to groups, peers and collective sizes.

Communicator groups are re-tiled when they follow a regular pattern:
- all N ranks -> all M ranks;
- equal blocks of consecutive ranks ({0..3}, {4..7}: tensor-parallel-like) -> blocks of the same size over
  M ranks (M a multiple of the block size); the group keeps its size;
- equal strides ({0, 4}, {1, 5}, ...: the data-parallel groups of a model x data layout) -> the same
  number of strided groups over M ranks (M a multiple of the stride); the group grows with M.
Anything else is not rescalable. Send/recv peers are rescalable when every rank has the node with the same
peer offset k (peer = r + k mod N): the output rank r then talks to r + k mod M.

Collective sizes (``comm_size``), for weak scaling (per-rank batch fixed, global batch grows with M) and
strong scaling (global batch fixed: per-rank batch, compute and activations scale by N/M); a group
"grows" when it spans all ranks or a stride, it has a fixed size when it is a block:
- ALL_REDUCE, REDUCE_SCATTER (comm_size = the whole buffer, e.g. gradients): unchanged over a growing
  group; over a fixed-size group unchanged (weak) or x N/M (strong: activations follow the batch).
- ALL_GATHER (comm_size = per-rank input; result = group size x input): x N/M over a growing group, so
  the gathered result keeps its size; over a fixed-size group unchanged (weak) or x N/M (strong).
- ALL_TO_ALL (comm_size = each rank's whole send buffer, its own samples' or tokens' data): unchanged
  (weak) or x N/M (strong), whatever the group.
- BROADCAST and others: unchanged.

The all-to-all of a growing group keeps its per-rank buffer under weak scaling: in DLRM each rank holds
T/M of the T embedding tables for the M x b samples of the global batch, b x T x d values whichever M;
MoE token dispatch sends each rank's own b tokens. Under strong scaling b = B/M, so the buffer shrinks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workload.graph import TraceGraph
from workload.schema import CollectiveType, NodeType


@dataclass(frozen=True, slots=True)
class Tiling:
    """A regular group pattern over N ranks: kind "all", "block" (size) or "stride" (stride)."""

    kind: str
    step: int = 0  # block size or stride

    @property
    def grows(self) -> bool:
        return self.kind != "block"

    def fits(self, npus: int) -> str | None:
        """Why the pattern cannot be laid over ``npus`` ranks (None when it can)."""
        if self.kind != "all" and npus % self.step:
            what = "block size" if self.kind == "block" else "stride"
            return f"{npus} ranks are not a multiple of the group's {what} {self.step}"
        return None

    def members(self, rank: int, npus: int) -> tuple[int, ...]:
        """The group of this pattern holding ``rank`` among ``npus`` ranks."""
        if self.kind == "all":
            return tuple(range(npus))
        if self.kind == "block":
            first = rank - rank % self.step
            return tuple(range(first, first + self.step))
        return tuple(range(rank % self.step, npus, self.step))

    def describe(self) -> str:
        return {"all": "all ranks", "block": f"blocks of {self.step}", "stride": f"stride {self.step}"}[self.kind]


def classify(members: tuple[int, ...], npus: int) -> Tiling | str:
    """The Tiling a group over ``npus`` ranks belongs to, or why it has none."""
    ranks = sorted(members)
    size = len(ranks)
    if ranks == list(range(npus)):
        return Tiling("all")
    if not ranks or ranks[0] < 0 or ranks[-1] >= npus:
        return f"it names ranks outside 0..{npus - 1}"
    if npus % size == 0:
        if ranks == list(range(ranks[0], ranks[0] + size)) and ranks[0] % size == 0:
            return Tiling("block", size)
        stride = npus // size
        if ranks == list(range(ranks[0], npus, stride)) and ranks[0] < stride:
            return Tiling("stride", stride)
    return ("it is neither all ranks, nor an equal block of consecutive ranks, nor every k-th rank of all "
            f"{npus} (a group strided inside a block, as a pipeline stage's data-parallel group, is not re-tiled)")


def size_factor(comm_type: int, grows: bool, strong: bool, old_npus: int, new_npus: int) -> float:
    """What a collective's comm_size is multiplied by (see the module's table)."""
    ratio = old_npus / new_npus
    if comm_type not in (CollectiveType.ALL_REDUCE, CollectiveType.REDUCE_SCATTER, CollectiveType.ALL_GATHER,
                         CollectiveType.ALL_TO_ALL):
        return 1.0
    if not grows:
        return ratio if strong else 1.0
    if comm_type == CollectiveType.ALL_GATHER:
        return ratio
    if comm_type == CollectiveType.ALL_TO_ALL:
        return ratio if strong else 1.0
    return 1.0


def signed_offset(peer: int, rank: int, npus: int) -> int:
    """peer - rank as an offset in (-npus/2, npus/2]."""
    k = (peer - rank) % npus
    return k - npus if k > npus // 2 else k


def peer_offsets(graphs: list[TraceGraph]) -> dict[int, int | str]:
    """For every send/recv node id: its peer offset when all ranks agree on it, else why not."""
    npus = len(graphs)
    seen: dict[int, set[int]] = {}
    count: dict[int, int] = {}
    for rank, g in enumerate(graphs):
        types = g.types
        for ntype, attr in ((NodeType.COMM_SEND_NODE, "comm_dst"), (NodeType.COMM_RECV_NODE, "comm_src")):
            idx = np.flatnonzero(types == int(ntype))
            if not idx.size:
                continue
            peers, present = g.attrs.integers(attr, g.num_nodes, default=-1)
            for i in idx.tolist():
                node_id = g.node_id(i)
                count[node_id] = count.get(node_id, 0) + 1
                offset = signed_offset(int(peers[i]), rank, npus) if present[i] else None
                seen.setdefault(node_id, set()).add(offset if offset is not None else npus)
    out: dict[int, int | str] = {}
    for node_id, offsets in seen.items():
        if count[node_id] != npus:
            out[node_id] = f"only {count[node_id]} of the {npus} ranks have this send/recv (not a ring pattern)"
        elif len(offsets) != 1:
            shown = ", ".join(f"{k:+d}" for k in sorted(offsets))
            out[node_id] = f"its peer offset differs between ranks ({shown}), so it is no neighbour pattern"
        else:
            (k,) = offsets
            out[node_id] = k if k != npus else "it has no peer rank"
    return out
