"""Numeric node values as obfuscated distributions: log-spaced bins holding rounded, optionally noised multisets.

A node of the profile names a bin, never a value. Each bin keeps the values that fell into it (durations,
sizes, operation counts), rounded to a few significant digits and, on request, scaled by random noise, as a
multiset of distinct tuples with counts. Generation draws a node's values from its bin: compute values from a
per-class shuffled deck, communication values from a deck dealt over all the profile's shared events (so every
rank of a group, both ends of a message, get the same size); at the original size every bin's multiset is
reproduced.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

ABSENT = -1  # an attribute the original node did not have


def quantize(value: int, bins_per_octave: int) -> int:
    """The log-spaced bin of a value: -1 absent, 0 zero, then 1 + floor(log2(v) * bins_per_octave)."""
    if value < 0:
        return -1
    if value == 0:
        return 0
    return 1 + math.floor(math.log2(value) * bins_per_octave)


def round_significant(value: float, digits: int) -> int:
    """``value`` rounded to ``digits`` significant digits, as an integer (0 digits: just rounded)."""
    if value <= 0:
        return max(0, round(value))
    if digits <= 0:
        return round(value)
    exponent = math.floor(math.log10(value)) + 1 - digits
    return round(round(value / 10.0**exponent) * 10.0**exponent)


def obfuscate(values: Sequence[int], digits: int, noise: float, rng: np.random.Generator) -> tuple[int, ...]:
    """One value tuple as stored in a profile: each present field scaled by a factor in [1-noise, 1+noise], then
    rounded. Absent fields stay absent; a positive value never becomes 0."""
    out = []
    for v in values:
        if v <= 0:
            out.append(v)
            continue
        scaled = v * (1.0 + rng.uniform(-noise, noise)) if noise > 0 else float(v)
        out.append(max(1, round_significant(scaled, digits)))
    return tuple(out)


@dataclass(slots=True)
class Bin:
    """The values of one bin: distinct tuples and how often each occurred."""

    kind: str
    values: list[tuple[int, ...]] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def add(self, value: tuple[int, ...]) -> None:
        try:
            k = self.values.index(value)
        except ValueError:
            self.values.append(value)
            self.counts.append(1)
        else:
            self.counts[k] += 1

    @property
    def total(self) -> int:
        return sum(self.counts)

    def sort(self) -> None:
        """Put the values in ascending order (the order a saved profile has, so draws do not change on reload)."""
        order = sorted(range(len(self.values)), key=lambda k: self.values[k])
        self.values = [self.values[k] for k in order]
        self.counts = [self.counts[k] for k in order]

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "values": [[*v, c] for v, c in zip(self.values, self.counts, strict=True)]}


class Deck:
    """Draws values from bins without replacement, reshuffling a bin when it runs out (one deck per class)."""

    def __init__(self, bins: Sequence[Bin], rng: np.random.Generator) -> None:
        self._bins = bins
        self._rng = rng
        self._decks: dict[int, list[int]] = {}

    def draw(self, bin_index: int) -> tuple[int, ...]:
        deck = self._decks.get(bin_index)
        if not deck:
            b = self._bins[bin_index]
            deck = np.repeat(np.arange(len(b.values)), b.counts)[self._rng.permutation(b.total)].tolist()
            self._decks[bin_index] = deck
        return self._bins[bin_index].values[deck.pop()]


def keyed_uniform(seed: int, *key: object) -> float:
    """A uniform number in [0, 1) that depends only on the seed and the key (the same on every rank)."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64
