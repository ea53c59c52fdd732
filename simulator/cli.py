"""The ``astrasim-py`` command: ``astrasim-py trace ...`` for the trace tools."""

from __future__ import annotations

import sys

from workload.errors import InputError
from workload.tools import cli as trace_cli

PROG = "astrasim-py"


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (1 for bad input, reported on one line)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["trace"]:
            return trace_cli.run(argv[1:], _warn)
        print(f"usage: {PROG} trace {{inspect,jsonize,generate,visualize}} ...", file=sys.stderr)
        return 2
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
