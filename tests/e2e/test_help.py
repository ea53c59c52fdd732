"""The command explains itself: the top-level --help lists every subcommand, and every subcommand at every level
(trace generate llm, sweep export, ...) has a --help that says in a line what it does."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator

from simulator import cli
from tests.conftest import run_cli


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command, by its command line (``astrasim-py trace generate llm``)."""
    roots = [("astrasim-py", cli.build_parser())]  # report and sweep export build theirs as they run: see below
    roots += [(f"astrasim-py {name}", importlib.import_module(module).build_parser())
              for name, module in cli.SUBCOMMANDS.items() if name != "report"]
    stack = list(roots)
    while stack:
        path, parser = stack.pop(0)
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack += [(f"{path} {name}", child) for name, child in action.choices.items()]


def test_every_subcommand_says_what_it_does() -> None:
    seen = dict(parsers())
    for name in ("trace inspect", "trace analyze", "trace jsonize", "trace visualize", "trace generate collective",
                 "trace generate compute", "trace generate sendrecv", "trace generate memory", "trace generate llm",
                 "trace convert text", "trace convert pytorch", "trace rescale", "trace synthesize", "sweep",
                 "compare", "plot", "validate", "calibrate"):
        assert f"astrasim-py {name}" in seen, name
    for path, parser in seen.items():
        assert parser.description and parser.description.strip(), f"{path}: no description"
        text = parser.format_help()
        assert parser.description.split()[0] in text, path


def test_help_runs_for_every_top_level_command() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    listed = " ".join(top.stdout.split())
    assert "astrasim-py --workload W --network N.yml" in listed
    for name in (*cli.SUBCOMMANDS, "trace generate", "trace convert", "trace rescale", "trace synthesize",
                 "sweep export"):
        assert f"astrasim-py {name}" in listed, name
        done = run_cli(*name.split(), "--help")
        assert done.returncode == 0 and done.stdout.startswith(f"usage: astrasim-py {name}"), name
        description = done.stdout.split("\n\n")[1]  # usage, then what the command does
        assert not description.lstrip().startswith(("positional arguments", "options")), name
