"""``python -m simulator`` under an interpreter that lacks a requirement (check-reference runs it that way when no
astrasim-py is on PATH): the checkout's own virtual environment runs it when there is one, otherwise one line says
what is missing, never an import traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("simulator", "workload", "network", "compute")

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


def checkout(tmp_path: Path) -> Path:
    """A checkout of the packages (linked) without a virtual environment of its own."""
    for name in PACKAGES:
        (tmp_path / name).symlink_to(REPO / name, target_is_directory=True)
    return tmp_path


def run_without_simpy(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ASTRASIM_PY_FROM_CHECKOUT_VENV"}
    return subprocess.run([sys.executable, "-c", HIDE_SIMPY], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


def test_a_missing_requirement_is_one_line(tmp_path: Path) -> None:
    done = run_without_simpy(checkout(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'simpy'" in done.stderr and "pip install" in done.stderr, done.stderr


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests run outside a virtual environment")
def test_the_checkouts_virtual_environment_runs_it(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    (root / ".venv").symlink_to(sys.prefix, target_is_directory=True)  # the environment the README's set-up makes
    done = run_without_simpy(root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("astrasim-py"), done.stdout
