"""Trace synthesis: learn an obfuscated profile of per-rank traces and generate look-alike traces of any size.

``learn`` (learn.py) turns traces into a ``Profile`` (profile.py: what is kept, what is removed, the JSON form);
``generate`` (generate.py) samples per-rank traces from it; layout.py places ranks on a grid of parallelism
dimensions, values.py stores numbers as rounded, binned multisets, stats.py measures a workload's character.
"""
