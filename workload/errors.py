"""User-facing errors: bad input is reported as one line naming where and what, never as a traceback."""

from __future__ import annotations


class InputError(Exception):
    """A problem with the user's input (trace, config, command line); the CLI prints it as one line."""


class ConfigError(InputError):
    """A bad configuration file or value; the message names the file and the key."""


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
