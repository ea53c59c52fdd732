"""The files users give and the files we write, handled safely in one place.

Reading: a config file must be a regular file (not a folder, FIFO or ``/dev/zero``), of bounded size,
UTF-8 text, and JSON/YAML that parses without NaN/Infinity, without nesting that would exhaust the stack
and (YAML) without aliases that expand into more values than any real config holds. Every failure is a
one-line ConfigError naming the file.

Writing: CSV cells that a spreadsheet would run as a formula are made inert, and output names chosen
from user input cannot escape the folder they belong in.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any, BinaryIO

from workload.errors import ConfigError, InputError, printable, shown

MAX_CONFIG_BYTES = 64 << 20  # no configuration file (network, system, sweep, groups) comes near this
MAX_YAML_VALUES = 1_000_000  # values a YAML document may hold once its aliases are expanded


def shown_path(path: str, limit: int = 200) -> str:
    """A path for a message: control characters escaped, at most about ``limit`` characters."""
    text = printable(os.fspath(path))
    return text if len(text) <= limit else text[:limit] + "..."


class FileProblem(InputError):
    """A file that cannot be read as asked: ``problem`` says why, without the file's name."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{shown_path(path)}: {problem}")


def open_regular(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """``path`` opened for binary reading, refusing anything but a regular file without blocking on it."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
    except FileNotFoundError:
        raise FileProblem(name, f"{what} not found") from None
    except IsADirectoryError:
        raise FileProblem(name, f"{what} is a folder, not a file") from None
    except (OSError, ValueError) as e:
        raise FileProblem(name, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder, not a file" if stat.S_ISDIR(mode) else "not a regular file"
            raise FileProblem(name, f"{what} is {kind}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str, what: str, limit_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``; ``what`` names the kind of file in errors."""
    try:
        with open_regular(path, f"{what} file") as f:
            data = f.read(limit_bytes + 1)
    except FileProblem as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"{shown_path(path)}: cannot read: {e.strerror}") from None
    if len(data) > limit_bytes:
        raise ConfigError(f"{shown_path(path)}: {what} is larger than {limit_bytes >> 20} MiB; "
                          "that is not a configuration")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{shown_path(path)}: not UTF-8 text (byte offset {e.start})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:40]} is too large for a number")
    return value


def parse_json(text: str, where: str) -> Any:
    """``text`` parsed as strict JSON (no NaN/Infinity); ``where`` names it in errors."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except ValueError as e:
        raise ConfigError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a configuration") from None


def read_json(path: str, what: str) -> Any:
    """The parsed JSON of ``path``; ``what`` names the kind of file in errors ("system configuration")."""
    return parse_json(read_text(path, what), shown_path(path))


def _expanded_values(root: Any) -> int:
    """How many values a composed YAML node graph holds with its aliases expanded (shared nodes counted
    at every use), computed without expanding: memoised per node, so linear in the document."""
    import yaml

    sizes: dict[int, int] = {}
    order: list[Any] = []
    stack = [root]
    seen: set[int] = set()
    while stack:  # post-order without recursion: deep documents must not exhaust the stack
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.extend((k, v))
    for node in reversed(order):
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(sizes.get(id(c), 1) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(sizes.get(id(k), 1) + sizes.get(id(v), 1) for k, v in node.value)
        else:
            total = 1
        sizes[id(node)] = min(total, MAX_YAML_VALUES + 1)
    return sizes.get(id(root), 0)


def parse_yaml(text: str, where: str) -> Any:
    """``text`` parsed as YAML (safe types only, aliases bounded); ``where`` names it in errors."""
    import yaml

    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None and _expanded_values(node) > MAX_YAML_VALUES:
                raise ConfigError(f"{where}: YAML aliases expand to more than {MAX_YAML_VALUES:,} values; "
                                  "that is not a configuration")
            return loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{where}: not valid YAML{line}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a configuration") from None


def read_yaml(path: str, what: str) -> Any:
    """The parsed YAML of ``path``; ``what`` names the kind of file in errors ("network configuration")."""
    return parse_yaml(read_text(path, what), shown_path(path))


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def csv_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: strings starting like a formula get a leading quote
    (numbers stay numbers)."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def inert_row(row: Any) -> list[Any]:
    """Every cell of ``row`` through ``csv_cell``."""
    return [csv_cell(v) for v in row]


def contained_path(folder: str, name: str, what: str = "output name") -> str:
    """``folder/name``, refusing a ``name`` that is absolute or climbs out of ``folder`` (``../x``)."""
    if not name or os.path.isabs(name) or "\x00" in name:
        raise ConfigError(f"{what} {shown(name)} must be a relative name inside {shown(folder)}")
    base = os.path.realpath(folder)
    full = os.path.realpath(os.path.join(base, name))
    if os.path.commonpath([base, full]) != base:
        raise ConfigError(f"{what} {shown(name)} would write outside {shown(folder)}")
    return os.path.join(folder, name)
