"""Regenerate vidur_gemm.tsv and vidur_memory.tsv from a checkout of microsoft/vidur (MIT licence).

    python benchmarks/data/kernels/extract_vidur.py PATH/TO/vidur [OUT_DIR]

Reads data/profiling/compute/{a100,h100}/<model>/mlp.csv (commit 7d47513363ec447a741ac5e47241580b47724fbf):
per-operator CUDA times (ms; the median of the profiler's repeats) of one FP16 transformer block under tensor
parallelism, by number of tokens. Each row becomes the GEMM or memory-bound kernel it times, with the shape
implied by the model's dimensions and the tensor-parallel degree (Megatron-style column/row splits, as the
profiler's sarathi layers do). Token counts are thinned to a fixed grid to keep the tables small.
"""

from __future__ import annotations

import csv
import os
import sys

DEVICES = {"a100": "A100", "h100": "H100"}
TOKENS = {1, 8, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4000, 4096, 6144, 8192,
          12288, 16384, 24576, 32768}
GEMM_HEADER = ("device", "dtype", "m", "n", "k", "batch", "time_us", "tflops", "source_id", "note")
MEMORY_HEADER = ("device", "op_class", "dtype", "bytes", "flops", "time_us", "source_id", "note")


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def extract(root: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    gemm: list[tuple[object, ...]] = []
    memory: list[tuple[object, ...]] = []
    base = os.path.join(root, "data", "profiling", "compute")
    for folder, device in DEVICES.items():
        for org in sorted(os.listdir(os.path.join(base, folder))):
            for model in sorted(os.listdir(os.path.join(base, folder, org))):
                path = os.path.join(base, folder, org, model, "mlp.csv")
                if not os.path.exists(path):
                    continue
                seen: set[tuple[int, int]] = set()
                for r in _rows(path):
                    t, tp = int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])
                    if t not in TOKENS or (t, tp) in seen:
                        continue
                    seen.add((t, tp))
                    gemm += _gemms(device, f"{org}/{model}", r, t, tp)
                    memory += _memory(device, f"{org}/{model}", r, t, tp)
    return _distinct(gemm, (0, 2, 3, 4)), _distinct(memory, (0, 1, 3, 4))


def _distinct(rows: list[tuple[object, ...]], key: tuple[int, ...]) -> list[tuple[object, ...]]:
    """The first row of each shape (models sharing dimensions measure the same kernel again)."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for row in rows:
        k = tuple(row[i] for i in key)
        if k not in seen:
            seen.add(k)
            out.append(row)
    return out


def _fixed(value: float) -> str:
    """Four significant digits, without an exponent."""
    digits = max(0, 4 - len(str(int(abs(value)))))
    return f"{value:.{digits}f}"


def _ms(r: dict[str, str], op: str) -> float:
    return float(r[f"time_stats.{op}.median"])


def _gemms(device: str, model: str, r: dict[str, str], t: int, tp: int) -> list[tuple[object, ...]]:
    heads, kv, h, f = int(r["n_head"]), int(r["n_kv_head"]), int(r["n_embd"]), int(r["n_expanded_embd"])
    hd = h // heads
    gated = r["use_gated_mlp"] == "True"
    shapes = {"attn_pre_proj": (t, (heads + 2 * kv) * hd // tp, h), "attn_post_proj": (t, h, heads * hd // tp),
              "mlp_up_proj": (t, (2 if gated else 1) * f // tp, h), "mlp_down_proj": (t, h, f // tp)}
    out = []
    for op, (m, n, k) in shapes.items():
        us = _ms(r, op) * 1000
        out.append((device, "fp16", m, n, k, 1, _fixed(us), _fixed(2 * m * n * k / us / 1e6), "vidur",
                    f"{model} tp{tp} {op}"))
    return out


def _memory(device: str, model: str, r: dict[str, str], t: int, tp: int) -> list[tuple[object, ...]]:
    h, f = int(r["n_embd"]), int(r["n_expanded_embd"])
    gated = r["use_gated_mlp"] == "True"
    inputs = 3 if not r.get("time_stats.post_attention_layernorm.median") else 2  # phi-2 adds three tensors
    ops = [  # (op, class, bytes moved at 2 bytes per element, FLOPs)
        ("input_layernorm", "norm", 2 * t * h * 2, 5 * t * h),
        ("post_attention_layernorm", "norm", 2 * t * h * 2, 5 * t * h),
        ("mlp_act", "activation", ((3 if gated else 2) * t * f // tp) * 2, 5 * t * f // tp),
        ("add", "elementwise", (inputs + 1) * t * h * 2, (inputs - 1) * t * h),
        ("emb", "embedding", 2 * t * h * 2, 0),
    ]  # attn_rope is left out: rotary embedding is no operator class of the trace contract
    out = []
    for op, cls, size, flops in ops:
        value = r.get(f"time_stats.{op}.median")
        if not value:
            continue
        out.append((device, cls, "fp16", size, flops, _fixed(float(value) * 1000), "vidur", f"{model} tp{tp} {op}"))
    return out


def write(path: str, header: tuple[str, ...], rows: list[tuple[object, ...]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    gemm, memory = extract(argv[0])
    write(os.path.join(out, "vidur_gemm.tsv"), GEMM_HEADER, gemm)
    write(os.path.join(out, "vidur_memory.tsv"), MEMORY_HEADER, memory)
    print(f"{len(gemm)} GEMM rows, {len(memory)} memory-bound rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
