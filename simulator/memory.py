"""Remote (expansion) memory: each access takes latency + size / bandwidth, served FIFO per channel.

PER_NPU_MEMORY_EXPANSION gives every NPU its own channel (no queueing), PER_NODE_MEMORY_EXPANSION one
channel per node shared by its NPUs, MEMORY_POOL one channel for all. NO_MEMORY_EXPANSION has none.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from simulator.config import MemoryConfig
from simulator.engine import RankEvents
from workload.errors import InputError

Done = Callable[[Any], None]


class RemoteMemory:
    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self._busy: dict[int, bool] = {}
        self._waiting: dict[int, deque[tuple[RankEvents, int, Done, Any]]] = {}
        self.accesses = 0
        self.bytes = 0

    def _channel(self, rank: int) -> int | None:
        kind = self.config.memory_type
        if kind == "PER_NODE_MEMORY_EXPANSION":
            return rank // self.config.npus_per_node
        if kind == "MEMORY_POOL":
            return 0
        return None

    def access(self, rank: int, events: RankEvents, tensor_size: int, done: Done, arg: Any) -> None:
        """Start an access for ``rank``; ``done(arg)`` runs through the rank's events when it completes."""
        if self.config.memory_type == "NO_MEMORY_EXPANSION":
            raise InputError(f"{self.config.path}: the workload has remote-memory load/store nodes but the memory "
                             "type is NO_MEMORY_EXPANSION; give a --memory file with an expansion type")
        self.accesses += 1
        self.bytes += tensor_size
        channel = self._channel(rank)
        if channel is None:
            events.register(self.config.access_time_ns(tensor_size), done, arg)
        elif self._busy.get(channel):
            self._waiting.setdefault(channel, deque()).append((events, tensor_size, done, arg))
        else:
            self._serve(channel, events, tensor_size, done, arg)

    def _serve(self, channel: int, events: RankEvents, tensor_size: int, done: Done, arg: Any) -> None:
        runtime = self.config.access_time_ns(tensor_size)
        events.register(runtime, done, arg)
        events.register(runtime, self._channel_free, channel)
        self._busy[channel] = True

    def _channel_free(self, channel: int) -> None:
        waiting = self._waiting.get(channel)
        if waiting:
            self._serve(channel, *waiting.popleft())
        else:
            self._busy[channel] = False
