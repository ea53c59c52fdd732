"""The roofline compute model: a kernel runs at min(memory bandwidth x arithmetic intensity, peak)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Roofline:
    """Peak FLOP/s and memory bandwidth (bytes/s) of one device."""

    peak_flops: float
    memory_bytes_per_s: float

    def perf(self, intensity: float) -> float:
        """Attainable FLOP/s at ``intensity`` operations per byte."""
        return min(self.memory_bytes_per_s * intensity, self.peak_flops)

    def time_ns(self, num_ops: int, tensor_size: int) -> int:
        """Time of a kernel doing ``num_ops`` operations over ``tensor_size`` bytes, truncated to whole ns
        exactly as ASTRA-sim computes it. A kernel touching no memory or doing no work takes 0 ns."""
        if tensor_size == 0 or num_ops == 0:
            return 0
        perf = self.perf(float(num_ops) / float(tensor_size))
        return int(float(num_ops) / perf * 1e9)
