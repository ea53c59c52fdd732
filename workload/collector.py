"""The cyclic garbage collector paused while millions of small objects are built.

Decoding a trace set or generating an LLM iteration makes millions of small, acyclic objects (nodes, ops,
kernels) that live until the run ends. The cyclic collector would rescan all of them at every full collection,
several times over as they accumulate, and has nothing to free: pausing it makes building several times faster.
Reference counting still frees what becomes unreachable.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block (restoring its state after, also on errors)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
