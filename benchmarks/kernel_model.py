"""The kernel compute model against the published kernel measurements in benchmarks/data/kernels/: predicted vs
measured time per row, with the error, and a summary per device and kernel class.

    python benchmarks/kernel_model.py [--device NAME] [--family gemm|attention|memory] [--rows] [--tsv FILE]

Each row is predicted with the shipped device file of its device (aliases: H800 -> H100, GH200 -> H200). Attention
rows of a kernel other than the device's production one (e.g. FlashAttention-2 and -3 on H100, whose file models
cuDNN) use that kernel's fitted efficiency, recorded in the file's calibration (a kernel without one, as the
latent-attention rows ``cudnn_mla``, the production kernel's). Attention classes end in ``:window`` for the
sliding-window rows and ``:others`` for the other models' check rows (cudnn_sdpa_models.tsv). Error = predicted /
measured - 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from compute.devices import Device, device  # noqa: E402
from compute.kernel_data import LATENT_KERNEL, MODELS_TABLE, Measurement, read_tables, summarize, windowed  # noqa: E402
from compute.kernels import KernelModel  # noqa: E402


def model_for(d: Device, kernel: str) -> KernelModel:
    """The device's model as its kernel data fit it; for an attention kernel it does not run by default, that
    kernel's fitted efficiency."""
    d = d.kernel_fit()
    eff = ((d.calibration.get("fitted") or {}).get("attention") or {}).get("kernel_efficiency") or {}
    if kernel and kernel in eff:
        attention = replace(d.kernels.attention, efficiency=eff[kernel])
        d = replace(d, kernels=replace(d.kernels, attention=attention))
    return KernelModel(d)


def describe(m: Measurement) -> str:
    s = m.shapes[0]
    if s.gemm and len(m.shapes) > 1:
        return f"gemm {m.kernel} sum of {len(m.shapes)} ({s.gemm.m}x{s.gemm.n}x{s.gemm.k}, ...)"
    if s.gemm:
        g = s.gemm
        return (f"gemm {m.kernel + ' ' if m.kernel else ''}{s.dtype} {g.m}x{g.n}x{g.k}"
                + (f" x{g.batch}" if g.batch > 1 else ""))
    if s.attention:
        a = s.attention
        passes = "+".join("bwd" if x.attention and x.attention.backward else "fwd" for x in m.shapes)
        return (f"attention {m.kernel} {passes} b{a.batch} h{a.heads} d{a.head_dim} s{a.seq_q}"
                f"{' causal' if a.causal else ''}{f' w{a.window}' if a.window else ''}")
    return f"{s.op_class} {m.size_bytes / 1e6:.3g} MB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", help="only rows of this device (after aliases)")
    p.add_argument("--family", choices=("gemm", "attention", "memory"))
    p.add_argument("--rows", action="store_true", help="print every row, not only the summaries")
    p.add_argument("--tsv", help="also write every row with its prediction to this TSV file")
    args = p.parse_args(argv)
    rows = read_tables()
    results: list[tuple[Measurement, str, float]] = []
    models: dict[tuple[str, str], KernelModel] = {}
    for m in rows:
        d = device(m.device)
        if (args.device and d.name != device(args.device).name) or (args.family and m.family != args.family):
            continue
        key = (d.name, m.kernel)
        if key not in models:
            models[key] = model_for(d, m.kernel)
        results.append((m, d.name, m.predicted_us(models[key])))
    if args.rows:
        print(f"{'device':7} {'table':20} {'kernel':48} {'measured_us':>12} {'predicted_us':>12} {'error':>7}")
        for m, name, pred in results:
            print(f"{name:7} {m.table:20} {describe(m):48} {m.time_us:12.4g} {pred:12.4g} {pred / m.time_us - 1:+7.1%}")
    if args.tsv:
        with open(args.tsv, "w") as f:
            f.write("device\ttable\tkernel\tmeasured_us\tpredicted_us\terror\tnote\n")
            for m, name, pred in results:
                f.write(f"{name}\t{m.table}\t{describe(m)}\t{m.time_us:.6g}\t{pred:.6g}\t{pred / m.time_us - 1:.4f}\t"
                        f"{m.note}\n")
    print(f"{'device':7} {'class':30} {'rows':>5} {'mean|err|':>9} {'median':>7} {'p90':>7} {'max':>7} {'bias':>7}")
    groups: dict[tuple[str, str], list[float]] = {}
    for m, name, pred in results:
        cls = m.family if m.family != "memory" else f"memory:{m.shapes[0].op_class}"
        if m.family == "attention":  # by kernel, precision where not 16-bit, sliding window, other models' checks
            cls = (f"attention:{m.kernel}" + ("" if m.shapes[0].dtype in ("bf16", "fp16") else f":{m.shapes[0].dtype}")
                   + (":window" if windowed(m) else ":others" if m.table == MODELS_TABLE and m.kernel != LATENT_KERNEL
                      else ""))
        elif m.family == "gemm" and m.kernel:  # a recipe's GEMMs (Transformer Engine): by recipe
            cls = f"gemm:{m.shapes[0].dtype}:{m.kernel}"
        elif m.family == "gemm":
            cls = f"gemm:{m.shapes[0].dtype}" + (":large" if m.flops >= 1e11 else "")
        groups.setdefault((name, cls), []).append(pred / m.time_us - 1)
    for (name, cls), errs in sorted(groups.items()):
        s = summarize(np.array(errs))
        print(f"{name:7} {cls:30} {s.rows:5} {s.mean:9.1%} {s.median:7.1%} {s.p90:7.1%} {s.max:7.1%} {s.bias:+7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
