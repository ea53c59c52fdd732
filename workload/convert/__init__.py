"""Converters from other workload formats into Chakra ET: ASTRA-sim 1.0 text, PyTorch execution traces."""
