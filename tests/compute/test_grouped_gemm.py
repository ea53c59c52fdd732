"""A grouped GEMM run as one kernel per group, a few at a time (Transformer Engine's GroupedLinear over the local
experts): rounds of concurrent kernels, never faster than one batched kernel, carried by ``gemm_streams``."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from compute.devices import DEVICES, device
from compute.kernels import KernelModel
from compute.shapes import GemmShape, OpShape, shape_from_attributes

NAMES = sorted(DEVICES)
dims = st.integers(1, 1 << 14)


def seconds(model: KernelModel, m: int, n: int, k: int, batch: int, streams: int = 0) -> float:
    return model.seconds(OpShape("gemm", "bf16", gemm=GemmShape(m, n, k, batch, streams)), 0, 0)


def test_rounds_of_streams_golden() -> None:
    """16 experts on 4 streams: 4 rounds of 4 concurrent GEMMs; 6 experts: a round of 4 and one of 2."""
    model = KernelModel(device("H100"))
    gap = model.gap_s
    assert math.isclose(seconds(model, 1024, 1536, 2048, 16, 4), 4 * (seconds(model, 1024, 1536, 2048, 4) - gap) + gap)
    assert math.isclose(seconds(model, 1024, 1536, 2048, 6, 4), seconds(model, 1024, 1536, 2048, 4)
                        + seconds(model, 1024, 1536, 2048, 2) - gap)
    assert seconds(model, 1024, 1536, 2048, 3, 4) == seconds(model, 1024, 1536, 2048, 3)  # fewer than the streams


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMES), dims, dims, dims, st.integers(1, 64), st.integers(1, 8), st.integers(1, 16))
def test_streams_never_beat_one_batched_kernel_and_grow_with_groups(name: str, m: int, n: int, k: int, batch: int,
                                                                    streams: int, more: int) -> None:
    model = KernelModel(device(name))
    grouped = seconds(model, m, n, k, batch, streams)
    assert seconds(model, m, n, k, batch) <= grouped * (1 + 1e-9)
    assert grouped <= seconds(model, m, n, k, batch + more, streams) * (1 + 1e-9)


def test_streams_attribute_round_trip() -> None:
    shape = OpShape("gemm", "fp8", gemm=GemmShape(256, 768, 2048, 16, 4))
    assert ("gemm_streams", 4) in shape.attributes()
    assert shape_from_attributes(dict(shape.attributes()))[0] == shape
    plain = OpShape("gemm", "bf16", gemm=GemmShape(256, 768, 2048, 16))
    assert all(key != "gemm_streams" for key, _ in plain.attributes())  # traces without it are unchanged
    assert shape_from_attributes(dict(plain.attributes()))[0] == plain
