"""validate-training's MoE defaults: Megatron-Core's dropless dispatcher and the recipes' expert tensor
parallelism."""

from __future__ import annotations

from simulator.tools.training_layout import READY, plan_row
from tests.tools.test_validate_training import row


def test_moe_rows_take_the_dropless_dispatcher_and_the_recipes_expert_tensor_parallelism() -> None:
    """A Megatron-Bridge MoE row: dropless dispatch (host sync) unless the model says tokendrop; expert tensor
    parallelism 1 (the recipes') where TP > 1, so EP may span TP x DP ranks."""
    base = {"source_id": "megatron_bridge_perf", "model": "Qwen3_235B_a22B", "seq_len": "4096", "TP": "2", "PP": "1",
            "EP": "64", "global_batch": "1024", "micro_batch": "1", "n_gpus": "64", "gpu": "B200",
            "gpus_per_node": "8", "precision": "FP8", "tokens_per_s_per_gpu": "4000"}
    dropless = plan_row(row({**base, "row_id": "dropless"}))
    assert dropless.status == READY, dropless.reason
    assert dropless.spec["moe_host_sync"] is True and dropless.spec["etp"] == 1
    assert any("expert tensor parallelism 1" in d for d in dropless.defaults_used)
    tokendrop = plan_row(row({**base, "row_id": "drop", "model": "Qwen3_235B_a22B (tokendrop)"}))
    assert "moe_host_sync" not in tokendrop.spec and tokendrop.spec["etp"] == 1
    dense = plan_row(row({**base, "row_id": "dense", "model": "LLAMA3_8B", "EP": "1", "DP": "32"}))
    assert "moe_host_sync" not in dense.spec and "etp" not in dense.spec
