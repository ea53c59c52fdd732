"""Regenerate cudnn_sdpa.tsv, cudnn_sdpa_models.tsv, cudnn_norm.tsv and te_gemm_profiling.tsv from bare (or
ordinary) git checkouts of NVIDIA/cudnn-frontend (MIT) and NVIDIA/TransformerEngine (Apache-2.0), at the commits
pinned below.

    python benchmarks/data/kernels/extract_nvidia.py CUDNN_FRONTEND_GIT TRANSFORMER_ENGINE_GIT [OUT_DIR]

Files are read with ``git --git-dir DIR show COMMIT:PATH`` (a bare mirror is enough). What is taken:

- cuDNN SDPA training benchmark, Llama 3.1 attention (64 query / 8 key-value heads, head dim 128, or 128 query heads
  for the B200 set): every successful cuDNN forward and (non-deterministic) backward row, BF16, FP8 and MXFP8,
  causal ("top_left") and not. The TFLOP/s written is recomputed from the source's own time with FlashAttention's
  count (the layout of the attention tables), so the time the table gives back is the measured one. Sets:
  A: GB200 and GB300, cuDNN 9.22, batch 2; B: GB200, GB300, H200, cuDNN 9.19.1, batch 1; D: B200, cuDNN 9.13.1
  (cuDNN frontend called directly, the ``sdpa_fp8`` benchmark's BF16 and FP8 rows), batch 1, 128 query heads.
- The same benchmark on other models' attention (cudnn_sdpa_models.tsv): GPT-OSS's sliding window, DeepSeek-V3's and
  Kimi K2.6's latent attention, Qwen3.5, LTX-2, Wan 2.2; BF16 cuDNN forward and non-deterministic backward rows with
  the source's time and TFLOP/s.
- cuDNN norm benchmark: the cuDNN backend's RMSNorm/LayerNorm forward and backward rows on GB200, GB300 and H200
  (BF16; bytes as the benchmark counts them, the time from those bytes and the source's GB/s, which carries more
  digits than its millisecond column).
- Transformer Engine GEMM profiling guide (docs/examples/gemm_profiling/gemm_profiling.rst): the B300 per-GEMM
  Fprop times (BF16 and each recipe with its quantization, "autocast"), and, for B300 and H200 NVL, each
  recipe's per-pass sums (Fprop, Dgrad, Wgrad: four GEMMs each) of the autocast and the pre-quantized runs.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from extract_vidur import write  # the same TSV writer

CUDNN_SETS = (  # (set, commit, path, device, cuDNN version)
    ("A", "3929da2ef4c1dba1bb8acb68727b9134f26f40c0",
     "benchmark/sdpa_benchmark_training/results/llama3.1/gb200/llama3.1_20260424_100750.csv", "GB200", "9.22"),
    ("A", "3929da2ef4c1dba1bb8acb68727b9134f26f40c0",
     "benchmark/sdpa_benchmark_training/results/llama3.1/gb300/llama3.1_20260424_100757.csv", "GB300", "9.22"),
    ("B", "afa9f7c0be7e4b384c7cdb5729a4247cd34950a8",
     "benchmark/sdpa_benchmark_training/results/gb200_919_only_cudnn/llama3.1_20260226_174648.csv", "GB200", "9.19.1"),
    ("B", "afa9f7c0be7e4b384c7cdb5729a4247cd34950a8",
     "benchmark/sdpa_benchmark_training/results/gb300_919_only_cudnn/llama3.1_20260226_185510.csv", "GB300", "9.19.1"),
    ("B", "afa9f7c0be7e4b384c7cdb5729a4247cd34950a8",
     "benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv", "H200", "9.19.1"),
    ("D", "0b1577c8c83401237d601d0d0db5210506705396",
     "benchmark/sdpa_benchmark_training/artifacts/sdpa_fp8_benchmark_results_NVIDIA_B200.csv", "B200", "9.13.1"),
)
# the same benchmark on other models' attention (cudnn_sdpa_models.tsv), BF16 only: the sliding-window rows (GPT-OSS)
# fit the window's per-tile cost, the multi-head latent attention backward rows (DeepSeek-V3, Kimi K2.6; query/key
# head dim 192, value 128, written as the generator times it: heads of their mean, 160) the backward's head-dim
# exponent; the rest are checks: the latent-attention forward, head dim 256 (Qwen3.5) and long unmasked video-model
# sequences (LTX-2, Wan 2.2)
MODELS_COMMIT = "3929da2ef4c1dba1bb8acb68727b9134f26f40c0"
MODELS_DIR = "benchmark/sdpa_benchmark_training/results"
MODEL_FILES = (  # (path under MODELS_DIR, device, cuDNN version)
    ("gpt_oss/gb200/gpt_oss_20260424_100011.csv", "GB200", "9.22"),
    ("gpt_oss/gb300/gpt_oss_20260424_100022.csv", "GB300", "9.22"),
    ("h200_919_only_cudnn/gpt_oss_20260227_034819.csv", "H200", "9.19.1"),
    ("dsv3/gb200/dsv3_20260424_101009.csv", "GB200", "9.22"),
    ("dsv3/gb300/dsv3_20260424_101002.csv", "GB300", "9.22"),
    ("kimiK26/gb200/kimiK26_20260424_100953.csv", "GB200", "9.22"),
    ("kimiK26/gb300/kimiK26_20260424_100915.csv", "GB300", "9.22"),
    ("qwen35/gb200/qwen35_20260424_095249.csv", "GB200", "9.22"),
    ("qwen35/gb300/qwen35_20260424_095247.csv", "GB300", "9.22"),
    ("ltx2/gb200/ltx2_20260424_095758.csv", "GB200", "9.22"),
    ("ltx2/gb300/ltx2_20260424_095719.csv", "GB300", "9.22"),
    ("wan22/gb200/wan22_20260424_095743.csv", "GB200", "9.22"),
    ("wan22/gb300/wan22_20260424_095741.csv", "GB300", "9.22"),
)
NORM_COMMIT = "3929da2ef4c1dba1bb8acb68727b9134f26f40c0"
NORM_FILES = {"GB200": "benchmark/norms/results/gb200/all_models_20260226_180237.csv",
              "GB300": "benchmark/norms/results/gb300/all_models_20260226_190305.csv",
              "H200": "benchmark/norms/results/h200/all_models_20260227_035147.csv"}
TE_COMMIT = "1609c890ee7da24393ce62a2680e0ebb0b4eb5f6"
TE_FILE = "docs/examples/gemm_profiling/gemm_profiling.rst"

ATTENTION_HEADER = ("device", "kernel", "dtype", "pass", "batch", "heads", "head_dim", "seq", "causal", "tflops",
                    "source_id", "note")
MODELS_HEADER = ("device", "kernel", "dtype", "pass", "batch", "heads", "kv_heads", "head_dim", "seq", "causal",
                 "window", "tflops", "time_us", "source_id", "note")
MEMORY_HEADER = ("device", "op_class", "dtype", "bytes", "flops", "time_us", "source_id", "note")
GEMM_SET_HEADER = ("device", "dtype", "recipe", "quantization", "gemms", "time_us", "source_id", "note")
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "mxfp8": "fp8", "bf16": "bf16"}
# kernel column: MXFP8 attention is a kernel of its own (block-scaled), in the FP8 precision
KERNELS = {"bfloat16": "cudnn", "bf16": "cudnn", "fp8": "cudnn", "mxfp8": "cudnn_mxfp8"}


def show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def _records(text: str) -> list[dict[str, str]]:
    """CSV rows; a failed benchmark's multi-line error message breaks the file's lines, so rows are kept only
    when they parse into the header's columns and say success."""
    return [r for r in csv.DictReader(io.StringIO(text)) if r.get("success", "True") == "True"
            and None not in r and all(v is not None for v in r.values())]


def _tflops(b: int, h: int, d: int, s: int, causal: bool, backward: bool, time_ms: float) -> float:
    flops = 4 * b * s * s * h * d / (2 if causal else 1) * (2.5 if backward else 1.0)
    return flops / (time_ms * 1e-3) / 1e12


def _g(value: float) -> str:
    return f"{value:.6g}"


def attention_rows(cudnn: str) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for name, commit, path, device, version in CUDNN_SETS:
        source = f"cudnn_sdpa_{name.lower()}"
        for r in _records(show(cudnn, commit, path)):
            if name == "D":  # b, s, heads, head_dim, is_causal, precision, forward_time, backward_time (ms)
                precision, causal = r["precision"], r["is_causal"] == "True"
                times = {"fwd": r["forward_time"], "bwd": r["backward_time"]}
                h, d = int(r["num_q_heads"]), int(r["head_dim"])
                kv = r["num_kv_heads"]
            else:
                if r["backend"] != "cudnn" or r["deterministic_bwd"] == "True":
                    continue
                precision, causal = r["data_type"], r["attn_mask"] == "top_left"
                if r["profile_pass"] == "both":
                    times = {"fwd": r["fwd_time_ms"], "bwd": r["bwd_time_ms"]}
                else:
                    times = {r["profile_pass"]: r["time_ms"]}
                h, d = int(r["num_q_heads"]), int(r["head_dim_qk"])
                kv = r["num_kv_heads"]
            b, s = int(r["batch_size"]), int(r["q_seqlen"])
            for pas, t in times.items():
                ms = float(t)
                note = (f"set {name}, cuDNN {version}, {precision}, {h} q / {kv} kv heads, "
                        f"{'causal' if causal else 'no mask'}, {ms:g} ms")
                out.append((device, KERNELS[precision], DTYPES[precision], pas, b, h, d, s, str(causal).lower(),
                            _g(_tflops(b, h, d, s, causal, pas == "bwd", ms)), source, note))
    return out


def model_rows(cudnn: str) -> list[tuple[object, ...]]:
    """Other models' attention: BF16 cuDNN forward and non-deterministic backward rows, with the source's time
    (``time_us``, what the model is compared with) and its own TFLOP/s (its count: window-limited pairs)."""
    out: list[tuple[object, ...]] = []
    for path, device, version in MODEL_FILES:
        for r in _records(show(cudnn, MODELS_COMMIT, f"{MODELS_DIR}/{path}")):
            if r["backend"] != "cudnn" or r["deterministic_bwd"] == "True" or r["data_type"] != "bfloat16":
                continue
            causal = r["attn_mask"] == "top_left"
            window = int(r["sliding_window_size"] or 0) if causal else 0
            times = ({"fwd": (r["fwd_time_ms"], r["fwd_tflops"]), "bwd": (r["bwd_time_ms"], r["bwd_tflops"])}
                     if r["profile_pass"] == "both" else {r["profile_pass"]: (r["time_ms"], r["tflops"])})
            h, kv, b, s = int(r["num_q_heads"]), int(r["num_kv_heads"]), int(r["batch_size"]), int(r["q_seqlen"])
            dqk, dvo = int(r["head_dim_qk"]), int(r["head_dim_vo"])
            kernel = "cudnn" if dqk == dvo else "cudnn_mla"
            d = (dqk + dvo) // 2
            for pas, (t, tflops) in times.items():
                ms = float(t)
                note = (f"{r['model_name']}, cuDNN {version}, bfloat16, {h} q / {kv} kv heads, head dim {dqk}/{dvo}, "
                        f"{'causal' if causal else 'no mask'}{f', window {window}' if window else ''}, {ms:g} ms")
                out.append((device, kernel, "bf16", pas, b, h, kv, d, s, str(causal).lower(), window,
                            _g(float(tflops)), _g(ms * 1e3), "cudnn_sdpa_models", note))
    return out


def norm_rows(cudnn: str) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for device, path in NORM_FILES.items():
        for r in _records(show(cudnn, NORM_COMMIT, path)):
            if r["backend"] != "cudnn":
                continue
            n, c, bias = int(r["N"]), int(r["C"]), r["has_bias"] == "True"
            layer = r["norm_type"] == "layer_norm"
            for pas in ("fwd", "bwd"):
                size = _norm_bytes(layer, n, c, bias, pas)
                gbps = float(r[f"{pas}_gbps"])
                flops = (5 if pas == "fwd" else 10) * n * c  # about 5 per element and pass, as extract_vidur.py
                note = (f"cuDNN {r['norm_type']} {pas}, {r['norm_name']} {n} x {c}, {gbps:g} GB/s as the benchmark "
                        f"counts bytes, cuDNN backend {int(float(r['cudnn_backend_version']))}")
                out.append((device, "norm", "bf16", size, flops, _g(size / gbps / 1e3), f"cudnn_norm_{pas}", note))
    return out


def _norm_bytes(layer: bool, n: int, c: int, bias: bool, pas: str) -> int:
    """Bytes read and written as the benchmark counts them (benchmark_single_norm.compute_bandwidth_bytes), BF16."""
    if pas == "fwd":
        read = (n * c + c + (c if layer and bias else 0)) * 2
        write = n * c * 2 + n * 4 * (2 if layer else 1)
    else:
        read = (2 * n * c + c) * 2 + n * 4 * (2 if layer else 1)
        write = (n * c + c + (c if (layer or bias) else 0)) * 2
    return read + write


# --- Transformer Engine GEMM profiling guide -------------------------------------------------------------------
# The guide's shapes are M x K x N (tokens x input x output features); the table writes M x N x K, as m, n, k of
# the GEMM layout. One layer: hidden 4096, FFN 16384 (gate and up fused), 15,872 tokens.
T, H, F = 15872, 4096, 16384
FPROP = {"QKV Proj": (T, 3 * H, H), "Attn Out": (T, H, H), "MLP Up": (T, F, H), "MLP Down": (T, H, F)}
PASSES = {"Fprop": [(m, n, k) for m, n, k in FPROP.values()],
          "Dgrad": [(m, k, n) for m, n, k in FPROP.values()],  # dX = dY W^T: contracts the output features
          "Wgrad": [(k, n, m) for m, n, k in FPROP.values()]}  # dW = X^T dY: contracts the tokens
RECIPES = {"BF16": ("bf16", "bf16"), "FP8Current": ("fp8", "fp8_current"), "FP8Delayed": ("fp8", "fp8_delayed"),
           "FP8Block": ("fp8", "fp8_block"), "MXFP8": ("mxfp8", "mxfp8"), "NVFP4": ("fp4", "nvfp4")}


def _gemms(shapes: list[tuple[int, int, int]]) -> str:
    return "+".join(f"{m}x{n}x{k}" for m, n, k in shapes)


def _blocks(text: str) -> list[list[str]]:
    """The literal text blocks (``.. code-block:: text``) of the guide, as lists of lines."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == ".. code-block:: text":
            i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
                block.append(lines[i].strip())
                i += 1
            blocks.append([x for x in block if x])
        else:
            i += 1
    return blocks


def te_rows(te: str) -> list[tuple[object, ...]]:
    blocks = _blocks(show(te, TE_COMMIT, TE_FILE))
    # the per-layer blocks, in the guide's order: B300 autocast, B300 pre-quantized, H200 NVL autocast, pre-quantized
    runs = [("B300", "autocast"), ("B300", "pre-quantized"), ("H200 NVL", "autocast"), ("H200 NVL", "pre-quantized")]
    layer_blocks = [b for b in blocks if any(x.startswith("Per-Layer GEMM Time") for x in b)]
    if len(layer_blocks) != len(runs):
        raise SystemExit(f"{TE_FILE}: expected {len(runs)} per-layer blocks, found {len(layer_blocks)}")
    out: list[tuple[object, ...]] = []
    first = layer_blocks[0]
    header = next(x for x in first if x.startswith("Op "))
    recipes = [c.removesuffix(" ms") for c in _columns(header)[2:]]
    for line in first:  # B300 per-GEMM Fprop, autocast
        for op, shape in FPROP.items():
            if line.startswith(op):
                printed, *values = line[len(op):].split()
                m, n, k = shape
                if printed != f"{m}x{k}x{n}":  # the guide prints M x K x N
                    raise SystemExit(f"{TE_FILE}: {op} is {printed}, expected {m}x{k}x{n}")
                for recipe, ms in zip(recipes, values, strict=True):
                    out.append(_te_row("B300", recipe, "autocast", [shape], float(ms), f"Fprop {op}"))
    for (device, run), block in zip(runs, layer_blocks, strict=True):
        start = next(i for i, x in enumerate(block) if x.startswith("Per-Layer GEMM Time"))
        recipes = [c.removesuffix(" ms") for c in block[start + 1].split(" ms") if c.strip()]
        recipes = [c.strip() for c in recipes]
        for line in block[start + 2:]:
            name = line.split(":")[0]
            if name not in PASSES or (device == "B300" and run == "autocast" and name == "Fprop"):
                continue  # B300's autocast Fprop sum is the sum of its per-GEMM rows above
            for recipe, ms in zip(recipes, line.split(":")[1].split(), strict=True):
                # FP8 delayed scaling always quantizes in the timed loop, even in the pre-quantized run
                mode = "autocast" if run == "autocast" or recipe == "FP8Delayed" else "pre-quantized"
                out.append(_te_row(device, recipe, mode, PASSES[name], float(ms), f"{name} sum ({run} run)"))
    return out


def _columns(header: str) -> list[str]:
    """'Op  Shape  BF16 ms FP8Current ms ...' -> ['Op', 'Shape', 'BF16 ms', 'FP8Current ms', ...]."""
    words = header.split()
    cols: list[str] = []
    for w in words:
        if w == "ms" and cols:
            cols[-1] += " ms"
        else:
            cols.append(w)
    return cols


def _te_row(device: str, recipe: str, mode: str, shapes: list[tuple[int, int, int]], ms: float, what: str
            ) -> tuple[object, ...]:
    dtype, name = RECIPES[recipe]
    quantization = "none" if dtype == "bf16" else ("included" if mode == "autocast" else "excluded")
    note = f"{device}, {what}, {recipe} {mode}, {ms:g} ms"
    return (device, dtype, name, quantization, _gemms(shapes), _g(ms * 1e3), "te_gemm_profiling", note)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    cudnn, te = argv[0], argv[1]
    out = argv[2] if len(argv) == 3 else os.path.dirname(os.path.abspath(__file__))
    write(os.path.join(out, "cudnn_sdpa.tsv"), ATTENTION_HEADER, attention_rows(cudnn))
    write(os.path.join(out, "cudnn_sdpa_models.tsv"), MODELS_HEADER, model_rows(cudnn))
    write(os.path.join(out, "cudnn_norm.tsv"), MEMORY_HEADER, norm_rows(cudnn))
    write(os.path.join(out, "te_gemm_profiling.tsv"), GEMM_SET_HEADER, te_rows(te))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
