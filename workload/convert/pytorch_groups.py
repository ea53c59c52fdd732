"""PyTorch process groups as simulator communicator groups.

PyTorch names groups by strings ("0" is the default group of all ranks, later groups "1", "2", ... or hashes)
and lists their global ranks (an empty list means all ranks). The simulator wants group numbers >= 1 with
the default group left unnamed, so the same name must get the same number on every rank: the table is
filled from every rank's traces first and numbered once.
"""

from __future__ import annotations

from typing import Any

from workload.errors import InputError


class GroupTable:
    """Process groups of all ranks: name -> global ranks, and the number each non-default group gets."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._ranks: dict[str, tuple[int, ...]] = {}
        self._where: dict[str, str] = {}
        self._backend_ids: dict[int, str] = {}
        self._numbers: dict[str, int] | None = None

    def add_config(self, entries: list[dict[str, Any]], where: str) -> None:
        """Add the groups of a process_group:init record or of Kineto's ``pg_config``."""
        for entry in entries:
            name = entry.get("pg_name")
            if name is None:
                continue
            name = str(name)
            ranks = entry.get("ranks")
            if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
                raise InputError(f"{where}: process group {name!r} has no list of 'ranks'")
            if not ranks or entry.get("pg_desc") == "default_pg" or name == "0":
                ranks = list(range(self.world_size))
            self.add(name, tuple(ranks), where)
            for key in ("uid", "backend_id"):
                if isinstance(entry.get(key), int):
                    self._backend_ids[entry[key]] = name

    def add(self, name: str, ranks: tuple[int, ...], where: str) -> None:
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise InputError(f"{where}: process group {name!r} has rank {bad[0]}, but only {self.world_size} "
                             "host traces were given (one per rank)")
        known = self._ranks.get(name)
        if known is not None and sorted(known) != sorted(ranks):
            raise InputError(f"{where}: process group {name!r} has ranks {list(ranks)} but "
                             f"{self._where[name]} gives it ranks {list(known)}")
        if known is None:
            self._ranks[name] = ranks
            self._where[name] = where
        self._numbers = None

    def resolve(self, ref: str | int | None) -> str | None:
        """The group name a collective's record refers to (None when the trace does not say)."""
        if isinstance(ref, int):
            return self._backend_ids.get(ref)
        return ref if ref in self._ranks or ref == "0" else None  # "0" is always the default group

    def _is_default(self, name: str) -> bool:
        """The default group, or any group of every rank (both run over all NPUs)."""
        return name == "0" or len(set(self._ranks[name])) == self.world_size

    def number(self, name: str | None) -> int | None:
        """The simulator group number of a group name; None for the default group (all ranks)."""
        if name is None or name not in self._ranks or self._is_default(name):
            return None
        return self.numbers()[name]

    def numbers(self) -> dict[str, int]:
        """Decimal names keep their number; other names are numbered after them in sorted order."""
        if self._numbers is None:
            names = sorted(n for n in self._ranks if not self._is_default(n))
            decimal = {n: int(n) for n in names if n.isdecimal() and int(n) > 0}
            following = max(decimal.values(), default=0)
            numbers = dict(decimal)
            for n in names:
                if n not in numbers:
                    following += 1
                    numbers[n] = following
            self._numbers = numbers
        return self._numbers

    def ranks_of(self, name: str | None) -> tuple[int, ...]:
        """Global ranks of a group, in group-rank order (all ranks for the default or an unknown group)."""
        if name is None or name not in self._ranks:
            return tuple(range(self.world_size))
        return self._ranks[name]

    def declared(self) -> dict[int, tuple[int, ...]]:
        """{number: ranks} of every non-default group, for the METADATA node."""
        return {number: self._ranks[name] for name, number in sorted(self.numbers().items(), key=lambda x: x[1])}

    def has_subgroups(self) -> bool:
        return bool(self.numbers())
