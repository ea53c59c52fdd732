"""Ranks <-> parallel coordinates, and the communicator groups every rank belongs to.

A rank has a tensor (tp), context (cp), data (dp) and pipeline (pp) coordinate; ``ParallelPlan.layout`` orders
the dimensions innermost first (default tp, cp, dp, pp: the ranks of one tensor-parallel group are neighbours,
as Megatron-LM's default order tp-cp-ep-dp-pp puts them). The groups are logical, whatever the layout:

- tp, cp, dp: the ranks that differ only in that coordinate; dpcp: in the data and context coordinates (dense
  gradients are reduced over it when cp > 1, as Megatron-Core's dp-cp group);
- the expert grid (Megatron-Core's decoupled expert layout): within a stage, the index f = tp + TP x (cp + CP x
  dp) splits into (expert-tensor index f % ETP, expert index (f // ETP) % EP, expert-data index f // (ETP x EP));
  etp, ep and edp groups vary one of the three. With etp = tp and cp = 1 the experts are sharded over ``ep``
  consecutive data-parallel ranks, as before;
- emb: the first and last stage's copies of a tied embedding; mp: the model-parallel ranks (tp x pp of one data
  and context index) and world (every rank) that sum the gradient norm for clipping (the iteration tail);
- epd, epx: an ep group cut by NVLink domains (``nvlink_domain`` ranks each, rank // nvlink_domain), for the flex
  dispatcher's two-stage exchange: epd the group's ranks in one domain, epx its ranks at the same place in every
  domain (the RDMA peers). Made only where every ep group spans several domains with as many of its ranks in each.

Group numbers are given in GROUP_KINDS order; a group of a newer kind (cp, dpcp, etp, mp) equal to an earlier
group reuses its number, and a group of every rank is the world (number 0, no pg_name), so plans without the
newer dimensions number their groups as they always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workload.llm.model import ModelConfig
    from workload.llm.plan import ParallelPlan

GROUP_KINDS = ("tp", "dp", "ep", "edp", "emb", "cp", "dpcp", "etp", "mp", "world", "epd", "epx")
GROUP_DESCRIPTIONS = {"tp": "tensor parallel", "dp": "data parallel", "ep": "expert parallel",
                      "edp": "expert data parallel", "emb": "tied embeddings (first and last stage)",
                      "cp": "context parallel", "dpcp": "data x context parallel", "etp": "expert tensor parallel",
                      "mp": "model parallel (gradient norm)", "world": "every rank (gradient norm)",
                      "epd": "expert parallel within an NVLink domain", "epx": "expert parallel across NVLink domains",
                      "pp": "pipeline send/recv"}
REUSING_KINDS = ("cp", "dpcp", "etp", "mp", "world")
# which coordinate a send/receive peer moves along (Op.peer = (dimension, offset); the offset wraps around)
PEER_DIMENSIONS = ("pp", "tp", "cp")


@dataclass(frozen=True, slots=True)
class Group:
    """A communicator group: its number (0 = every rank, no pg_name) and its ranks in ring order."""

    gid: int
    ranks: tuple[int, ...]

    @property
    def pg_name(self) -> str:
        return str(self.gid) if self.gid else ""


class RankMap:
    """Rank <-> (dp, tp, pp, cp) coordinates, and the communicator groups of every rank."""

    def __init__(self, plan: ParallelPlan, model: ModelConfig | None, *, tail: bool = False,
                 nvlink_domain: int | None = None) -> None:
        """``model`` None: coordinates only, no groups; ``nvlink_domain``: ranks per NVLink domain (epd, epx)."""
        self.plan = plan
        self.sizes = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp, "cp": plan.cp}
        self.strides: dict[str, int] = {}
        stride = 1
        for dim in plan.full_layout:
            self.strides[dim] = stride
            stride *= self.sizes[dim]
        self.nvlink_domain = nvlink_domain
        self.groups = {} if model is None else self._groups(model, tail)

    def rank(self, *, dp: int, tp: int, pp: int, cp: int = 0) -> int:
        s = self.strides
        return tp * s["tp"] + dp * s["dp"] + pp * s["pp"] + cp * s["cp"]

    def coord(self, rank: int, dim: str) -> int:
        return (rank // self.strides[dim]) % self.sizes[dim]

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, tp, pp) of ``rank``."""
        return self.coord(rank, "dp"), self.coord(rank, "tp"), self.coord(rank, "pp")

    def stage_ranks(self, stage: int) -> list[int]:
        p = self.plan
        return sorted(self.rank(dp=d, tp=t, pp=stage, cp=c) for d in range(p.dp) for t in range(p.tp)
                      for c in range(p.cp))

    def peer(self, rank: int, offset: int | tuple[str, int]) -> int:
        """The rank ``offset`` places away along one dimension (an int: pipeline stages), wrapping around: the
        interleaved schedule sends from the last stage to the first."""
        dim, step = ("pp", offset) if isinstance(offset, int) else offset
        here = self.coord(rank, dim)
        return rank + (((here + step) % self.sizes[dim]) - here) * self.strides[dim]

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

    def _expert_grid(self, stage: int) -> dict[str, list[tuple[int, ...]]]:
        """The etp, ep and edp groups of one stage (Megatron-Core's expert rank order etp-ep-edp)."""
        p = self.plan
        etp, ep = p.expert_tp, p.ep
        edp = p.tp * p.cp * p.dp // (etp * ep)
        flat = [self.rank(dp=f // (p.tp * p.cp), tp=f % p.tp, pp=stage, cp=(f // p.tp) % p.cp)
                for f in range(p.tp * p.cp * p.dp)]

        def at(et: int, e: int, ed: int) -> int:
            return flat[et + etp * (e + ep * ed)]

        return {"etp": [tuple(at(et, e, ed) for et in range(etp)) for e in range(ep) for ed in range(edp)],
                "ep": [tuple(at(et, e, ed) for e in range(ep)) for et in range(etp) for ed in range(edp)],
                "edp": [tuple(at(et, e, ed) for ed in range(edp)) for et in range(etp) for e in range(ep)]}

    def _ep_groups(self) -> list[tuple[int, ...]]:
        return [g for s in range(self.plan.pp) for g in self._expert_grid(s)["ep"]]

    def _ep_domain_shapes(self) -> set[tuple[int, frozenset[int]]]:
        """Per ep group: (NVLink domains it spans, the counts of its ranks in them); empty without domains."""
        size = self.nvlink_domain
        if not size or self.plan.ep < 2:
            return set()
        shapes = set()
        for ranks in self._ep_groups():
            counts: dict[int, int] = {}
            for r in ranks:
                counts[r // size] = counts.get(r // size, 0) + 1
            shapes.add((len(counts), frozenset(counts.values())))
        return shapes

    @staticmethod
    def _even_split(shapes: set[tuple[int, frozenset[int]]]) -> tuple[int, int] | None:
        """(domains, ranks in each) where every group has the one shape, over several domains, evenly."""
        if len(shapes) != 1:
            return None
        ((domains, per_domain),) = shapes
        return (domains, next(iter(per_domain))) if domains > 1 and len(per_domain) == 1 else None

    def expert_domains(self) -> tuple[int, int] | None:
        """(NVLink domains an ep group spans, its ranks in each) where every ep group spans more than one domain
        with equally many ranks in each (the flex dispatcher's two-stage exchange); None otherwise."""
        return self._even_split(self._ep_domain_shapes())

    def ep_splits_unevenly(self) -> bool:
        """Some ep group spans several NVLink domains, but not every group evenly (no two-stage exchange)."""
        shapes = self._ep_domain_shapes()
        return self._even_split(shapes) is None and any(domains > 1 for domains, _ in shapes)

    def _domain_split(self) -> dict[str, list[tuple[int, ...]]]:
        """The epd and epx groups (none unless ``expert_domains`` says the ep groups split evenly)."""
        if self.expert_domains() is None:
            return {}
        size = self.nvlink_domain or 1
        out: dict[str, list[tuple[int, ...]]] = {"epd": [], "epx": []}
        for ranks in self._ep_groups():
            by_domain: dict[int, list[int]] = {}
            for r in ranks:
                by_domain.setdefault(r // size, []).append(r)
            parts = list(by_domain.values())
            out["epd"] += [tuple(p) for p in parts]
            out["epx"] += [tuple(p[i] for p in parts) for i in range(len(parts[0]))]
        return out

    def _groups(self, model: ModelConfig, tail: bool) -> dict[str, dict[int, Group]]:
        p = self.plan
        members: dict[str, list[tuple[int, ...]]] = {k: [] for k in GROUP_KINDS}
        for s in range(p.pp):
            for c in range(p.cp):
                for d in range(p.dp):
                    members["tp"].append(tuple(self.rank(dp=d, tp=t, pp=s, cp=c) for t in range(p.tp)))
                for t in range(p.tp):
                    members["dp"].append(tuple(self.rank(dp=d, tp=t, pp=s, cp=c) for d in range(p.dp)))
            for t in range(p.tp):
                for d in range(p.dp):
                    members["cp"].append(tuple(self.rank(dp=d, tp=t, pp=s, cp=c) for c in range(p.cp)))
                if p.cp > 1:
                    members["dpcp"].append(tuple(self.rank(dp=d, tp=t, pp=s, cp=c) for d in range(p.dp)
                                                 for c in range(p.cp)))
            if model.is_moe:
                for kind, groups in self._expert_grid(s).items():
                    members[kind] += groups
        if model.is_moe:
            for kind, groups in self._domain_split().items():
                members[kind] += groups
        if model.shares_embedding(p.pp):
            for c in range(p.cp):
                for d in range(p.dp):
                    for t in range(p.tp):
                        members["emb"].append((self.rank(dp=d, tp=t, pp=0, cp=c),
                                               self.rank(dp=d, tp=t, pp=p.pp - 1, cp=c)))
        if tail:
            members["world"].append(tuple(range(p.world_size)))
            for c in range(p.cp):
                for d in range(p.dp):
                    # tensor index outermost: a shift along tp rotates the list (the symmetric engines fold it)
                    members["mp"].append(tuple(self.rank(dp=d, tp=t, pp=s, cp=c) for t in range(p.tp)
                                               for s in range(p.pp)))
        groups: dict[str, dict[int, Group]] = {}
        numbered: dict[tuple[int, ...], Group] = {}
        gid = 1
        for kind in GROUP_KINDS:
            by_rank: dict[int, Group] = {}
            for ranks in members[kind]:
                if len(ranks) < 2:
                    continue
                group = numbered.get(ranks) if kind in REUSING_KINDS else None
                if group is None:
                    if len(ranks) == p.world_size:
                        group = Group(0, ranks)
                    else:
                        group, gid = Group(gid, ranks), gid + 1
                    numbered[ranks] = group
                for r in ranks:
                    by_rank[r] = group
            if by_rank:
                groups[kind] = by_rank
        return groups


@lru_cache(maxsize=64)
def expert_domains(plan: ParallelPlan, nvlink_domain: int | None) -> tuple[int, int] | None:
    """RankMap.expert_domains of ``plan`` cut into domains of ``nvlink_domain`` ranks (computed once per plan)."""
    return RankMap(plan, None, nvlink_domain=nvlink_domain).expert_domains()
