"""LLM training trace generator: one iteration of a dense or MoE decoder-only transformer, per rank."""
