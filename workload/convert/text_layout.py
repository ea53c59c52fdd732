"""Which ranks form the model-parallel, data-parallel, expert and pipeline groups of a converted text workload.

Ranks are numbered model-parallel innermost (ASTRA-sim 1.0 gives the model-parallel collectives of
HYBRID_TRANSFORMER and HYBRID_DATA_MODEL the lowest network dimensions), then data-parallel, then pipeline
stage: rank = t + tp * (d + dp * s). HYBRID_MODEL_DATA puts data-parallelism on the lowest dimensions
instead: rank = d + dp * t. Expert groups (SimAI's ``_EP`` collectives) are blocks of ``ep`` consecutive
data-parallel indices; ``_DP_EP`` groups join the ranks with the same index inside those blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from workload.errors import InputError


@dataclass(frozen=True, slots=True)
class Layout:
    npus: int
    tp: int = 1  # model-parallel group size
    pp: int = 1  # pipeline stages
    ep: int = 1  # expert-parallel group size (within the data-parallel ranks)
    model_inner: bool = True

    @property
    def dp(self) -> int:
        return self.npus // (self.tp * self.pp)

    @property
    def stage_size(self) -> int:
        return self.tp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(model-parallel index, data-parallel index, stage) of a rank."""
        if self.model_inner:
            return rank % self.tp, rank // self.tp % self.dp, rank // self.stage_size
        return rank // self.dp, rank % self.dp, 0

    def rank_of(self, t: int, d: int, s: int) -> int:
        if self.model_inner:
            return t + self.tp * (d + self.dp * s)
        return d + self.dp * t

    def group(self, rank: int, kind: str) -> tuple[int, ...]:
        """The ranks of ``rank``'s group of a kind: model, data, EP or DP_EP (sorted)."""
        t, d, s = self.coords(rank)
        if kind == "model":
            members = [self.rank_of(k, d, s) for k in range(self.tp)]
        elif kind == "data":
            members = [self.rank_of(t, k, s) for k in range(self.dp)]
        elif kind == "EP":
            first = d - d % self.ep
            members = [self.rank_of(t, k, s) for k in range(first, first + self.ep)]
        elif kind == "DP_EP":
            members = [self.rank_of(t, k, s) for k in range(d % self.ep, self.dp, self.ep)]
        else:
            raise ValueError(kind)
        return tuple(sorted(members))

    def stage_peer(self, rank: int, delta: int) -> int | None:
        """The rank holding the same model/data position ``delta`` stages away (None past either end)."""
        t, d, s = self.coords(rank)
        return self.rank_of(t, d, s + delta) if 0 <= s + delta < self.pp else None


def make_layout(npus: int, where: str, tp: int = 1, pp: int = 1, ep: int = 1, model_inner: bool = True) -> Layout:
    """A Layout, or an InputError naming ``where`` when the NPU count does not divide into the groups."""
    for name, value in (("the model-parallel group size", tp), ("pp", pp), ("ep", ep)):
        if value < 1:
            raise InputError(f"{where}: {name} must be at least 1 (got {value})")
    if npus % (tp * pp):
        split = f"model-parallel groups of {tp}" + (f" in {pp} pipeline stages" if pp > 1 else "")
        raise InputError(f"{where}: {npus} NPUs cannot be split into {split} ({npus} is not a multiple of "
                         f"{tp * pp}); choose --num-npus accordingly")
    layout = Layout(npus, tp, pp, ep, model_inner)
    if layout.dp % ep:
        raise InputError(f"{where}: ep: {ep} does not divide the {layout.dp} data-parallel ranks of each "
                         f"model-parallel position ({npus} NPUs / model-parallel {tp} / pp {pp})")
    return layout


class GroupTable:
    """Numbers communicator groups (1, 2, ... in order of first use) and remembers each rank's groups."""

    def __init__(self, npus: int) -> None:
        self.npus = npus
        self.ids: dict[tuple[int, ...], int] = {}

    def pg_name(self, members: tuple[int, ...]) -> str:
        """The pg_name of a group: "" when it spans every NPU, else its number."""
        if len(members) == self.npus:
            return ""
        return str(self.ids.setdefault(members, len(self.ids) + 1))

    def members(self) -> dict[int, tuple[int, ...]]:
        return {gid: members for members, gid in self.ids.items()}
