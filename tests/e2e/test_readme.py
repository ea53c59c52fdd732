"""Every command in README.md (and in the docs pages) runs as written, on shipped files, and prints what the page
shows.

What counts as a command: each line of a ```sh block (a line ending in a backslash continues on the next; `#`
lines are comments), a whole ```python block, and in the README the inline ``astrasim-py ...`` example of each
row of a table. A ```text
block right after a ```sh block (or after one line ending in "prints:" that follows it) is what the block's last
command prints (the test command aside): without a "..." line, exactly; with them, each run of lines between
"..." lines appears in that order (the first at the top). ```text blocks elsewhere are synopses, not run.

A page's commands run in page order, in one temporary folder holding copies of configs/, benchmarks/data/ and
tests/workload/fixtures/ (later commands read what earlier ones wrote), with ``astrasim-py`` meaning this
checkout's code. The install command runs from its simulation part; the test command is the one .ci/run runs
(compared, not run).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCS = sorted((REPO / "docs").glob("*.md"))


@dataclass(frozen=True)
class Command:
    line: int  # where it is written (1-based), for messages
    text: str
    expected: tuple[str, ...] | None = None  # what it prints, when the page shows it
    python: bool = False  # a Python program rather than a shell command


def commands(page: Path) -> list[Command]:
    """The commands of a page in order, each with the output the page shows for it (if any)."""
    lines = page.read_text(encoding="utf-8").split("\n")
    found: list[Command] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            if page.name == "README.md" and lines[i].startswith("|"):
                found += [Command(i + 1, m) for m in re.findall(r"`(astrasim-py [^`]+)`", lines[i])]
            i += 1
            continue
        end = lines.index("```", i + 1)
        body = lines[i + 1:end]
        if fence[1] == "python":
            found.append(Command(i + 2, "\n".join(body), python=True))
        elif fence[1] == "sh":
            block = [Command(i + 2 + k, text) for k, text in _joined(body)]
            j = _next_text(lines, end + 1)
            if j < len(lines) and lines[j].rstrip().endswith("prints:"):
                j = _next_text(lines, j + 1)
            if j < len(lines) and lines[j] == "```text":
                out_end = lines.index("```", j + 1)
                k = max(n for n, c in enumerate(block) if "pytest" not in c.text)
                block[k] = Command(block[k].line, block[k].text, tuple(lines[j + 1:out_end]))
                end = out_end
            found += block
        i = end + 1
    return found


def _next_text(lines: list[str], i: int) -> int:
    """The index of the first non-blank line from ``i`` (len(lines) if none)."""
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i


def _joined(body: list[str]) -> list[tuple[int, str]]:
    """(offset, command) for each command of a sh block: comments dropped, continued lines joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for k, raw in enumerate(body):
        text = raw.strip()
        if pending is None and (not text or text.startswith("#")):
            continue
        start, before = pending if pending is not None else (k, "")
        if text.endswith("\\"):
            pending = (start, before + text[:-1].rstrip() + " ")
            continue
        pending = None
        out.append((start, before + text))
    return out


def _workspace(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A folder like a checkout's (configs/, benchmarks/data/) with ``../shared`` beside it, as CI has it, and an
    environment where astrasim-py is this code; returns (environment, the folder)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "configs", checkout / "configs")
    shutil.copytree(REPO / "benchmarks" / "data", checkout / "benchmarks" / "data")
    shutil.copytree(REPO / "tests" / "workload" / "fixtures", checkout / "tests" / "workload" / "fixtures")
    if (REPO.parent / "shared").is_dir():
        (tmp_path / "shared").symlink_to(REPO.parent / "shared", target_is_directory=True)
    shim = tmp_path / ".bin" / "astrasim-py"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m simulator "$@"\n')
    shim.chmod(0o755)
    return dict(os.environ, PATH=f"{shim.parent}{os.pathsep}{os.environ['PATH']}", MPLBACKEND="Agg",
                PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")), checkout


def _shown(expected: tuple[str, ...], printed: list[str]) -> str | None:
    """None if ``printed`` is what the page shows, else what differs."""
    if "..." not in expected:
        return None if list(expected) == printed else "output differs"
    at = 0
    for k, part in enumerate("\n".join(expected).split("\n...")):
        want = [line for line in part.strip("\n").split("\n") if line]
        if not want:
            continue
        starts = [s for s in range(at, len(printed) - len(want) + 1) if printed[s:s + len(want)] == want]
        if not starts or (k == 0 and starts[0] != 0):
            return f"not printed (in this order): {want[0]!r}"
        at = starts[0] + len(want)
    return None


def run_page(page: Path, tmp_path: Path) -> int:
    env, checkout = _workspace(tmp_path)
    ran = 0
    for command in commands(page):
        text = command.text
        where = f"{page.name}:{command.line}: {text}"
        if "pytest" in text:  # the test command: what CI runs
            ci = (REPO / ".ci" / "run").read_text().strip().split("\n")[-1]
            assert text.replace(" -q", "") == ci.replace(" -q", ""), f"{where}: not what .ci/run runs: {ci}"
            continue
        if "pip install" in text:  # the install command: its simulation part
            text = text.split(" && ")[-1]
            assert text.startswith("astrasim-py "), where
        argv = [sys.executable, "-c", text] if command.python else ["bash", "-c", text]
        done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{where}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, f"{where}\n{done.stderr[-2000:]}"
        if command.expected is not None:
            differs = _shown(command.expected, [line.rstrip() for line in done.stdout.rstrip("\n").split("\n")])
            assert differs is None, f"{where}: {differs}\n--- printed:\n{done.stdout}"
        ran += 1
    return ran


def test_the_parser_reads_blocks_tables_and_outputs(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text("intro\n```sh\n# a comment\nastrasim-py a \\\n  --b c\n\nastrasim-py d\n```\n\n```text\nout\n```\n"
                    "| x | `astrasim-py e` |\n```text\nastrasim-py synopsis\n```\n```python\nprint(1)\n```\n")
    assert commands(page) == [Command(4, "astrasim-py a --b c"), Command(7, "astrasim-py d", ("out",)),
                              Command(13, "astrasim-py e"), Command(18, "print(1)", python=True)]
    assert _shown(("a", "...", "c"), ["a", "b", "c", "d"]) is None
    assert _shown(("b", "..."), ["a", "b"]) is not None  # the first lines are the top of the output
    assert _shown(("a", "b"), ["a", "b", "c"]) is not None  # without "...", exactly


def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    """The set-up command's sample output, the commands at a glance, the LLM example and its output."""
    listed = commands(REPO / "README.md")
    assert sum(c.expected is not None for c in listed) >= 2 and len(listed) >= 15
    assert run_page(REPO / "README.md", tmp_path) == len(listed) - 1  # all but the test command


@pytest.mark.slow
@pytest.mark.parametrize("page", DOCS, ids=[p.stem for p in DOCS])
def test_every_docs_command_runs_as_written(page: Path, tmp_path: Path) -> None:
    run_page(page, tmp_path)
