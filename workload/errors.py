"""User-facing errors: bad input is reported as one line naming where and what, never as a traceback.

Messages quote what the user gave through ``shown`` (bounded length, control characters escaped), so a
hostile or huge value can neither flood the terminal nor drive it with escape sequences.
"""

from __future__ import annotations

import reprlib

MAX_SHOWN_CHARS = 100  # how much of a user's value an error message quotes


class InputError(Exception):
    """A problem with the user's input (trace, config, command line); the CLI prints it as one line."""


class ConfigError(InputError):
    """A bad configuration file or value; the message names the file and the key."""


class LimitError(InputError):
    """Work that would exceed a resource limit; the message gives the estimate and how to raise the limit."""


_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxdict, _repr.maxlist, _repr.maxtuple, _repr.maxset = 3, 6, 6, 6, 6
_repr.maxstring, _repr.maxother, _repr.maxlong = MAX_SHOWN_CHARS, MAX_SHOWN_CHARS, 40


def printable(text: str) -> str:
    """``text`` with control and format characters (newlines, ESC, bidi overrides, ...) escaped."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def shown(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """A user's value quoted for a message: a bounded repr (never walks a huge or recursive structure),
    control characters escaped, at most about ``limit`` characters."""
    text = printable(_repr.repr(value))
    if len(text) > limit:
        text = text[:limit] + f"...({len(text) - limit} more characters)"
    return text


class TraceError(InputError):
    """A problem in a Chakra trace file, located by file, rank, node id and/or byte offset."""

    def __init__(
        self,
        problem: str,
        *,
        path: str | None = None,
        rank: int | None = None,
        node_id: int | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.problem = problem
        self.path = path
        self.rank = rank
        self.node_id = node_id
        self.offset = offset
        self.hint = hint
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.node_id is not None:
            where.append(f"node {self.node_id}")
        if self.offset is not None:
            where.append(f"byte offset {self.offset}")
        text = ": ".join([", ".join(where), self.problem]) if where else self.problem
        if self.hint:
            text += f" ({self.hint})"
        return text

    def located(self, *, path: str | None = None, rank: int | None = None) -> TraceError:
        """The same error with the file and rank filled in where they were unknown."""
        return TraceError(
            self.problem,
            path=self.path if self.path is not None else path,
            rank=self.rank if self.rank is not None else rank,
            node_id=self.node_id,
            offset=self.offset,
            hint=self.hint,
        )
