"""The parallelism plan: data (dp), tensor (tp), pipeline (pp) and expert (ep) parallelism, ZeRO stage,
batch split, and the mapping between ranks and their (dp, tp, pp) coordinates and communicator groups.

Rank layout: ``layout`` lists the dimensions innermost first; the default ("tp", "dp", "pp") puts the ranks of
one tensor-parallel group next to each other (rank = tp + TP * (dp + DP * pp)), as Megatron-LM does.

Expert parallelism shards the experts over ``ep`` data-parallel ranks: ep divides dp, and the data-parallel
index d splits into (expert-data index d // ep, expert index d % ep). The ranks sharing a stage, a tensor
index and d // ep form an expert-parallel group (all-to-all); the ranks sharing a stage, a tensor index and
d % ep hold the same experts and form an expert-data-parallel group (the experts' gradients are reduced over
it, the other parameters' over the whole data-parallel group). Each expert is also split tp ways.
"""

from __future__ import annotations

from dataclasses import dataclass

from workload.errors import InputError
from workload.llm.model import ModelConfig

DIMENSIONS = ("tp", "dp", "pp")
GROUP_KINDS = ("tp", "dp", "ep", "edp", "emb")
GROUP_DESCRIPTIONS = {"tp": "tensor parallel", "dp": "data parallel", "ep": "expert parallel",
                      "edp": "expert data parallel", "emb": "tied embeddings (first and last stage)",
                      "pp": "pipeline send/recv"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelPlan:
    """How one training iteration is split over ``dp * tp * pp`` ranks."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    zero_stage: int = 0
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    sequence_parallel: bool = False
    activation_recompute: bool = False
    layout: tuple[str, ...] = DIMENSIONS

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        """Sequences per iteration."""
        return self.dp * self.micro_batch_size * self.num_micro_batches

    def padded_vocab(self, model: ModelConfig) -> int:
        """The vocabulary padded to a multiple of tp, as vocabulary-parallel embeddings need."""
        return -(-model.vocab_size // self.tp) * self.tp

    def validate(self, model: ModelConfig) -> None:
        """Raise InputError (one line) if the plan cannot run ``model``."""
        for name in ("dp", "tp", "pp", "ep", "micro_batch_size", "num_micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"plan: {name} must be a whole number >= 1 (got {value!r})")
        if self.zero_stage not in (0, 1, 2, 3):
            raise InputError(f"plan: the ZeRO stage must be 0, 1, 2 or 3 (got {self.zero_stage!r})")
        if sorted(self.layout) != sorted(DIMENSIONS):
            raise InputError(f"plan: the rank layout must order tp, dp and pp (got {','.join(self.layout)})")
        checks = [
            (model.num_heads % self.tp == 0, f"{model.num_heads} attention heads are not divisible by tp={self.tp}"),
            (model.kv_heads % self.tp == 0,
             f"{model.kv_heads} key/value heads are not divisible by tp={self.tp}"),
            (model.ffn_hidden_size % self.tp == 0,
             f"FFN hidden size {model.ffn_hidden_size} is not divisible by tp={self.tp}"),
            (model.num_layers >= self.pp, f"{model.num_layers} layers cannot fill pp={self.pp} stages"),
            (self.dp % self.ep == 0, f"ep={self.ep} does not divide dp={self.dp} (experts are sharded over "
                                     "data-parallel ranks)"),
            (model.num_experts % self.ep == 0,
             f"{model.num_experts} experts are not divisible by ep={self.ep}"),
            (not self.sequence_parallel or model.seq_len % self.tp == 0,
             f"sequence length {model.seq_len} is not divisible by tp={self.tp} (sequence parallelism)"),
        ]
        if self.ep > 1 and not model.is_moe:
            raise InputError(f"plan for {model.name}: ep={self.ep} needs a mixture-of-experts model (--experts)")
        for ok, problem in checks:
            if not ok:
                raise InputError(f"plan for {model.name}: {problem}")


def batch_split(dp: int, global_batch: int | None, micro_batch_size: int | None,
                micro_batches: int | None) -> tuple[int, int]:
    """(micro-batch size, micro-batches per iteration) from any two of global batch, micro-batch size and
    micro-batch count (micro-batch size defaults to 1); the three must agree: global = dp x size x count."""
    for name, value in (("--global-batch", global_batch), ("--micro-batch-size", micro_batch_size),
                        ("--micro-batches", micro_batches)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be >= 1 (got {value})")
    if global_batch is None:
        return micro_batch_size or 1, micro_batches or 1
    if micro_batch_size is None and micro_batches is not None:
        if global_batch % (dp * micro_batches):
            raise InputError(f"global batch {global_batch} is not divisible by dp={dp} x {micro_batches} "
                             "micro-batches")
        return global_batch // (dp * micro_batches), micro_batches
    size = micro_batch_size or 1
    if global_batch % (dp * size):
        raise InputError(f"global batch {global_batch} is not divisible by dp={dp} x micro-batch size {size}")
    count = global_batch // (dp * size)
    if micro_batches is not None and micro_batches != count:
        raise InputError(f"global batch {global_batch} = dp={dp} x micro-batch size {size} x {count} micro-batches, "
                         f"not {micro_batches}")
    return size, count


@dataclass(frozen=True, slots=True)
class Group:
    """A communicator group: its number (0 = every rank, no pg_name) and its ranks in ring order."""

    gid: int
    ranks: tuple[int, ...]

    @property
    def pg_name(self) -> str:
        return str(self.gid) if self.gid else ""


class RankMap:
    """Rank <-> (dp, tp, pp) coordinates, and the communicator groups of every rank."""

    def __init__(self, plan: ParallelPlan, model: ModelConfig) -> None:
        self.plan = plan
        sizes = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp}
        self.strides: dict[str, int] = {}
        stride = 1
        for dim in plan.layout:
            self.strides[dim] = stride
            stride *= sizes[dim]
        self.groups = self._groups(model)

    def rank(self, *, dp: int, tp: int, pp: int) -> int:
        s = self.strides
        return tp * s["tp"] + dp * s["dp"] + pp * s["pp"]

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, tp, pp) of ``rank``."""
        p, s = self.plan, self.strides
        return (rank // s["dp"]) % p.dp, (rank // s["tp"]) % p.tp, (rank // s["pp"]) % p.pp

    def stage_ranks(self, stage: int) -> list[int]:
        return sorted(self.rank(dp=d, tp=t, pp=stage) for d in range(self.plan.dp) for t in range(self.plan.tp))

    def peer(self, rank: int, stage_offset: int) -> int:
        """The rank with the same dp and tp coordinates ``stage_offset`` stages away."""
        d, t, s = self.coords(rank)
        return self.rank(dp=d, tp=t, pp=s + stage_offset)

    def group(self, rank: int, kind: str) -> Group | None:
        """``rank``'s group of ``kind`` (see GROUP_KINDS), or None when it has no such group (size 1)."""
        return self.groups.get(kind, {}).get(rank)

    def rank_groups(self, rank: int) -> dict[int, tuple[int, ...]]:
        """{group number: ranks} of the numbered groups ``rank`` belongs to (for its METADATA node)."""
        out = {}
        for by_rank in self.groups.values():
            g = by_rank.get(rank)
            if g is not None and g.gid:
                out[g.gid] = g.ranks
        return out

    def _groups(self, model: ModelConfig) -> dict[str, dict[int, Group]]:
        p = self.plan
        members: dict[str, list[tuple[int, ...]]] = {k: [] for k in GROUP_KINDS}
        for s in range(p.pp):
            for d in range(p.dp):
                members["tp"].append(tuple(self.rank(dp=d, tp=t, pp=s) for t in range(p.tp)))
            for t in range(p.tp):
                members["dp"].append(tuple(self.rank(dp=d, tp=t, pp=s) for d in range(p.dp)))
                if model.is_moe:
                    for block in range(p.dp // p.ep):
                        members["ep"].append(tuple(self.rank(dp=block * p.ep + e, tp=t, pp=s) for e in range(p.ep)))
                    for e in range(p.ep):
                        members["edp"].append(tuple(self.rank(dp=b * p.ep + e, tp=t, pp=s)
                                                    for b in range(p.dp // p.ep)))
        if model.tied_embeddings and p.pp > 1:
            for d in range(p.dp):
                for t in range(p.tp):
                    members["emb"].append((self.rank(dp=d, tp=t, pp=0), self.rank(dp=d, tp=t, pp=p.pp - 1)))
        groups: dict[str, dict[int, Group]] = {}
        gid = 1
        for kind in GROUP_KINDS:
            by_rank: dict[int, Group] = {}
            for ranks in members[kind]:
                if len(ranks) < 2:
                    continue
                if len(ranks) == p.world_size:
                    group = Group(0, ranks)
                else:
                    group, gid = Group(gid, ranks), gid + 1
                for r in ranks:
                    by_rank[r] = group
            if by_rank:
                groups[kind] = by_rank
        return groups


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layers of pipeline ``stage``. Equal stages where pp divides the layers; otherwise every stage gets
    ceil(layers / pp) and the first and last stages, then the second and second-to-last, ..., one fewer each
    (they also hold the embedding and the output layer), as Llama 3 405B ran 126 layers on 16 stages."""
    per = -(-num_layers // pp)
    deficit = per * pp - num_layers
    order = [k for pair in zip(range(pp), range(pp - 1, -1, -1), strict=True) for k in pair]
    short = set(list(dict.fromkeys(order))[:deficit])
    counts = [per - (k in short) for k in range(pp)]
    start = sum(counts[:stage])
    return range(start, start + counts[stage])
