"""Optional dependencies (extras): import them on first use, or say how to install them."""

from __future__ import annotations

import importlib
from types import ModuleType

from workload.errors import InputError


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``module``, or an InputError telling how to install the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError(f"{feature} needs {module}, which is not installed: pip install 'astrasim-py[{extra}]'"
                         ) from None


def pyplot(feature: str) -> ModuleType:
    """matplotlib.pyplot on a file-only backend (no display needed)."""
    matplotlib = require("matplotlib", "plot", feature)
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
