"""The astrasim-py command run in the test's own process: its entry point, without a new interpreter's start-up."""

from __future__ import annotations

import subprocess

import pytest

from simulator.cli import main


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)
