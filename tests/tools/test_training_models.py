"""The model a training row names: a stated parameter count decides whether the GPT output layer is tied."""

from __future__ import annotations

from simulator.tools.training_models import model_for

# the Megatron-LM README's weak-scaling 32B model and GPT-3 175B, as their tables give them
MLM_32B = {"num_layers": 48, "hidden_size": 7168, "num_heads": 56, "vocab_size": 131072, "seq_len": 4096}
GPT3_175B = {"num_layers": 96, "hidden_size": 12288, "num_heads": 96, "seq_len": 2048}


def test_a_stated_count_only_an_untied_output_layer_reaches_unties_it() -> None:
    choice = model_for("GPT 32B", MLM_32B, tp=8)
    assert choice.fields["tied_embeddings"] is False
    assert any(d.startswith("untied output layer: the stated 32B parameters count one (tied 30.57B, untied 31.51B)")
               for d in choice.defaults_used)


def test_a_count_the_tied_model_already_meets_keeps_the_megatron_default() -> None:
    for name in ("GPT 175B", "GPT-3 175B (MLPerf reference)", "GPT3-175B"):
        choice = model_for(name, GPT3_175B, tp=8)
        assert choice.fields["tied_embeddings"] is True, name
        assert not any("untied" in d for d in choice.defaults_used)


def test_a_name_without_a_count_keeps_the_default() -> None:
    assert model_for("GPT", MLM_32B, tp=8).fields["tied_embeddings"] is True
