"""``python -m simulator`` under an interpreter that lacks a requirement says so on one line (check-reference
runs it that way when no astrasim-py is on PATH), instead of an import traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HIDE_SIMPY = """
import runpy, sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "simpy" or name.startswith("simpy."):
            raise ModuleNotFoundError("No module named 'simpy'", name="simpy")
sys.meta_path.insert(0, Hide())
sys.argv = ["astrasim-py", "--version"]
runpy.run_module("simulator", run_name="__main__")
"""


def test_a_missing_requirement_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-c", HIDE_SIMPY], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'simpy'" in done.stderr and "pip install" in done.stderr, done.stderr
