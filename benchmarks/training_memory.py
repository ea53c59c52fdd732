"""The device-memory estimate (workload/llm/memory.py) on the published training runs: every run fitted in its
GPUs, so an estimate above the GPU's memory is the estimate's error or something it leaves out.

    python benchmarks/training_memory.py [--shared ../shared] [--all]

One line per run whose estimate is over its GPU's memory (``--all``: every run), with the estimate over the
capacity, the stage needing the most and what fills it, and why a run may be over where the tool knows: its
release's code runs another layout or batch than the table prints (validate-training's ``code_states``). Activation
offloading a recipe sets (Megatron-Bridge's ``cpu_offloading_num_layers``) is in the estimate. Then how many fit, in
all and by source. The published runs are those of the shared tables and of benchmarks/data/unseen_training/.

Last, the estimate against the peak memory measured runs report (``MEASURED``): the allocator's peak, so the
estimate's runtime buffers are left out of the comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from compute.devices import device
from simulator.tools.training_layout import plan_row
from simulator.tools.training_table import read_tables
from workload.errors import InputError
from workload.generated import llm_peak_memory

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30
_CARDS = ("NVIDIA-NeMo/Megatron-Bridge skills/{} (commit 415e90afd, 2026-08-10; Apache-2.0)")
_LLAMA_SFT = {"generate": "llm", "preset": "llama3-70b", "seq_len": 4096, "global_batch": 32, "micro_batch_size": 1,
              "sequence_parallel": True, "use_distributed_optimizer": True, "precision": "fp8",
              "fp8_recipe": "tensorwise", "fp8_param_gather": True, "vp": 5}
# (what, generate: llm mapping, measured peak GiB, source)
MEASURED = [
    ("Qwen3 30B-A3B, 16 H100, TP1 EP16, BF16, MBS 1",
     {"generate": "llm", "preset": "qwen3-30b-a3b", "tp": 1, "ep": 16, "dp": 16, "global_batch": 1024,
      "micro_batch_size": 1, "use_distributed_optimizer": True}, 62.166,
     _CARDS.format("nemo-mbridge-perf-moe-hardware-configs/SKILL.md: 'Rank-0 peak allocated memory: 62.166 GiB'")),
    *((f"Llama 3 70B SFT, 32 H100, TP{tp} PP{pp} VP5 DP{32 // (tp * pp)}, FP8-CS, seq 4096, MBS 1",
       _LLAMA_SFT | {"tp": tp, "pp": pp, "dp": 32 // (tp * pp)}, peak,
       _CARDS.format("nemo-mbridge-perf-memory-tuning/SKILL.md, 'Measured Results' (Peak Mem (GB))"))
      for tp, pp, peak in ((4, 4, 58.8), (4, 8, 53.2), (8, 4, 50.2))),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--all", action="store_true", help="every run, not only those over their GPU's memory")
    args = parser.parse_args()
    files = sorted(Path(args.shared, "reference", "hardware", "training").glob("*.tsv"))
    files += sorted((ROOT / "benchmarks" / "data" / "unseen_training").glob("*.tsv"))
    runs, over, by_source = 0, [], Counter()
    print(f"{'est/cap':>7}  {'run':64s} {'GPU':6s} {'layout':24s} {'MBS':>3}  estimate of the peak stage")
    for row in read_tables([str(f) for f in files]):
        plan = plan_row(row)
        if not plan.spec or not plan.device:
            continue
        try:
            peak = llm_peak_memory(plan.spec, row.row_id)
        except InputError:
            continue  # a layout the generator refuses is validate-training's to report
        runs += 1
        ratio = peak.total_bytes / device(plan.device).memory_bytes
        by_source[row.source_id, ratio <= 1] += 1
        why = ("; code states " + ", ".join(plan.code_states)) if plan.code_states else ""
        if ratio > 1:
            over.append(ratio)
        if ratio > 1 or args.all:
            print(f"{ratio:7.2f}  {row.row_id[-64:]:64s} {plan.device:6s} {plan.layout:24s} "
                  f"{plan.spec['micro_batch_size']:>3}  {peak.total_bytes / GiB:.0f} GiB on stage {peak.stage}: "
                  f"weights {peak.weights_bytes / GiB:.0f}, gradients {peak.grads_bytes / GiB:.0f}, optimizer "
                  f"{peak.optimizer_bytes / GiB:.0f}, activations {peak.activations_bytes / GiB:.0f} "
                  f"({peak.in_flight} passes){why}")
    print(f"\n{runs} published runs: {runs - len(over)} fit by the estimate, {len(over)} over "
          f"({sum(1 for r in over if r <= 1.07)} by at most 7%)")
    for source in sorted({s for s, _ in by_source}):
        print(f"  {source:24s} {by_source[source, True]:4d} fit {by_source[source, False]:4d} over")
    print("\nmeasured peak memory (the allocator's; GB read as GiB) against the estimate without its runtime buffers:")
    for what, spec, measured, source in MEASURED:
        peak = llm_peak_memory(spec, what)
        estimate = (peak.total_bytes - peak.runtime_bytes) / GiB
        print(f"  {what:60s} measured {measured:6.1f}  estimate {estimate:6.1f} GiB  {estimate / measured - 1:+6.1%}"
              f"  ({source})")


if __name__ == "__main__":
    main()
