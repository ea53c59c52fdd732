"""Blackwell against Hopper in one benchmark: XLA's matmul table (benchmarks/data/kernels/xla_matmul.tsv) times the
same 375 BF16 GEMMs (256-4096 per dimension, batch 1, 2 and 4) on an sm_100 GPU (B200 class) and an sm_90 one (H100
class). A source's own habits (its kernels, its timer) weigh on both GPUs alike, so the ratio of the two times is
the generations' difference alone; the model's ratio (shipped device files, and their kernel fits without the
training-step factor) is set against it, by shape class, beside each GPU's own error.

    python benchmarks/gemm_generations.py

Ratio error = (model's B200 time / model's H100 time) / (measured B200 time / measured H100 time) - 1: negative,
the model's Blackwell is too fast for that class relative to its Hopper.
"""

from __future__ import annotations

import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from compute.devices import Device, device  # noqa: E402
from compute.kernel_data import (  # noqa: E402
    DATA_DIR,
    GENERATION_CLASSES,
    GENERATIONS_TABLE,
    generation_class,
    generation_pairs,
    read_table,
)
from compute.kernels import KernelModel  # noqa: E402

TABLE = os.path.join(DATA_DIR, GENERATIONS_TABLE)
NEW, OLD = "B200", "H100"


def comparison(new: Device, old: Device) -> dict[str, tuple[int, float, float, float]]:
    """Per shape class: rows, the new GPU's and the old one's mean error, and the mean ratio error (geometric)."""
    mn, mo = KernelModel(new), KernelModel(old)
    out: dict[str, list[tuple[float, float, float]]] = {}
    for a, b in generation_pairs(read_table(TABLE), NEW, OLD):
        ea, eb = a.predicted_us(mn) / a.time_us, b.predicted_us(mo) / b.time_us
        for key in (generation_class(a), "all"):
            out.setdefault(key, []).append((ea, eb, ea / eb))
    return {k: (len(v), float(np.mean([x[0] for x in v])) - 1, float(np.mean([x[1] for x in v])) - 1,
                float(np.exp(np.mean(np.log([x[2] for x in v])))) - 1) for k, v in out.items()}


def main() -> int:
    print(__doc__.split("\n\n")[0])
    print()
    print(f"{'devices':34s} {'shape class':22s} {'rows':>4s} {NEW + ' err':>9s} {OLD + ' err':>9s} {'ratio err':>9s}")
    for label, new, old in (("shipped files", device(NEW), device(OLD)),
                            ("kernel fits (no training factor)", device(NEW).kernel_fit(), device(OLD).kernel_fit())):
        result = comparison(new, old)
        for key in [name for name, _ in GENERATION_CLASSES] + ["all"]:
            n, en, eo, ratio = result[key]
            print(f"{label:34s} {key:22s} {n:4d} {en:+9.1%} {eo:+9.1%} {ratio:+9.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
