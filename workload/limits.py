"""Resource limits, checked on estimates before anything is allocated or written.

Reading: trace and workload files must be regular files (a FIFO would block, ``/dev/zero`` never ends) and
gzip data is decompressed incrementally up to a cap, so a compressed bomb fails with its file named instead
of exhausting memory. Writing: tools that write one file per rank estimate the files and bytes first and stop
with a one-line estimate above ``--max-files`` / ``--max-bytes``. Caps that have no command-line flag can be
raised through environment variables named in their messages.
"""

from __future__ import annotations

import argparse
import os
import re
import zlib
from typing import BinaryIO

from workload.errors import InputError, LimitError, TraceError, shown
from workload.files import FileProblem, open_regular, shown_path

INT64_MAX = (1 << 63) - 1
GZIP_MAGIC = b"\x1f\x8b"
# No real per-rank trace comes near this once decompressed; a 4 MB gzip bomb expands to 4 GB.
DEFAULT_MAX_TRACE_BYTES = 2 << 30
MAX_TRACE_BYTES_ENV = "ASTRASIM_PY_MAX_TRACE_BYTES"
DEFAULT_MAX_FILES = 65_536
DEFAULT_MAX_BYTES = 16 << 30
_READ_CHUNK = 1 << 20

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from "1048576", "1MiB", "64KiB", "1.5GB" (KB/MB/GB decimal, KiB/MiB/GiB and K/M/G binary),
    at most 2^63-1 (what a trace's int64 sizes hold)."""
    m = re.fullmatch(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m[2].lower() not in _UNITS:
        raise ValueError(f"not a size: {shown(text)} (use e.g. 1048576, 64KiB, 1MiB, 1GB)")
    whole, _, fraction = m[1].partition(".")
    scale = _UNITS[m[2].lower()]
    numerator = int(whole + fraction) * scale
    denominator = 10 ** len(fraction)
    if numerator % denominator:
        raise ValueError(f"not a whole number of bytes: {shown(text)}")
    value = numerator // denominator
    if value > INT64_MAX:
        raise ValueError(f"size {shown(text)} is larger than 2^63-1 bytes, more than a trace can hold")
    return value


def format_bytes(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def env_limit(name: str, default: int) -> int:
    """A byte or count limit from the environment variable ``name`` (sizes may carry units)."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = parse_size(text)
    except ValueError as e:
        raise InputError(f"environment variable {name}: {e}") from None
    if value < 1:
        raise InputError(f"environment variable {name} must be at least 1")
    return value


def available_memory_bytes() -> int:
    """Memory the machine can still give this process (Linux MemAvailable; free pages elsewhere)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 1 << 62  # unknown: no limit


def gunzip_capped(f: BinaryIO, path: str, limit_bytes: int, limit_hint: str, padding: int = 0) -> bytearray:
    """The decompressed content of the gzip stream ``f`` (every member), followed by ``padding`` zero bytes.

    Decompression stops with a LimitError naming the file as soon as the output exceeds ``limit_bytes``, so
    memory stays within the limit whatever the compression ratio; ``limit_hint`` says how to raise it.
    Corrupt data raises FileProblem.
    """
    out = bytearray()
    decoder = zlib.decompressobj(wbits=31)
    data = b""
    try:
        while True:
            if not data:
                data = f.read(_READ_CHUNK)
                if not data:
                    break
            if decoder.eof:
                data = data.lstrip(b"\x00")  # zero padding after a member, as gzip allows
                if not data:
                    continue
                decoder = zlib.decompressobj(wbits=31)  # the next member of a multi-member file
            out += decoder.decompress(data, limit_bytes + 1 - len(out))
            if len(out) > limit_bytes:
                raise LimitError(f"{shown_path(path)}: decompresses to more than {format_bytes(limit_bytes)}, "
                                 f"more than any real trace holds (a gzip bomb?); {limit_hint}")
            data = decoder.unused_data + decoder.unconsumed_tail if decoder.eof else decoder.unconsumed_tail
    except zlib.error as e:
        raise FileProblem(path, f"corrupt gzip data ({e}); re-create or re-download the file") from None
    if not decoder.eof:
        raise FileProblem(path, "corrupt gzip data: it ends early (truncated file?); re-create or re-download it")
    out += bytes(padding)
    return out


def read_capped(path: str | os.PathLike[str], what: str, limit_bytes: int, limit_hint: str, padding: int = 0
                ) -> bytearray:
    """The bytes of the regular file ``path`` (gunzipped when gzip-compressed, whatever its name) with
    ``padding`` zero bytes after them. FileProblem when it is not a readable regular file or not valid gzip,
    LimitError when it holds more than ``limit_bytes`` (decompressed)."""
    name = os.fspath(path)
    with open_regular(name, what) as f:
        try:
            head = f.read(2)
            f.seek(0)
            if head == GZIP_MAGIC:
                return gunzip_capped(f, name, limit_bytes, limit_hint, padding)
            size = os.fstat(f.fileno()).st_size
            if size > limit_bytes:
                raise LimitError(f"{shown_path(name)}: {format_bytes(size)} is more than the "
                                 f"{format_bytes(limit_bytes)} limit; {limit_hint}")
            data = bytearray(size + padding)
            got = f.readinto(memoryview(data)[:size])
            if got != size or f.read(1):
                raise FileProblem(name, "the file changed while it was read")
            return data
        except OSError as e:
            raise FileProblem(name, f"cannot read: {e.strerror or e}") from None


def read_trace_bytes(path: str | os.PathLike[str], padding: int = 0) -> bytearray:
    """A Chakra ET file's bytes (gunzipped) plus ``padding`` zero bytes; TraceError naming the file on failure."""
    limit = env_limit(MAX_TRACE_BYTES_ENV, DEFAULT_MAX_TRACE_BYTES)
    hint = f"set {MAX_TRACE_BYTES_ENV}=SIZE (e.g. 8GiB) to allow larger traces"
    try:
        return read_capped(path, "trace file", limit, hint, padding)
    except FileProblem as e:
        raise TraceError(e.problem, path=e.path) from None


def add_output_limits(parser: argparse.ArgumentParser) -> None:
    """The ``--max-files`` and ``--max-bytes`` flags of a tool that writes one file per rank."""
    parser.add_argument("--max-files", type=int, default=DEFAULT_MAX_FILES, metavar="N",
                        help=f"refuse to write more files than this (default {DEFAULT_MAX_FILES:,})")
    parser.add_argument("--max-bytes", default=format_bytes(DEFAULT_MAX_BYTES).replace(" ", ""), metavar="SIZE",
                        help=f"refuse to write more bytes than this, estimated before writing (default "
                             f"{format_bytes(DEFAULT_MAX_BYTES)})")


def output_limits(args: argparse.Namespace) -> tuple[int, int]:
    """(max files, max bytes) from the flags ``add_output_limits`` adds."""
    max_files = getattr(args, "max_files", DEFAULT_MAX_FILES)
    if max_files < 1:
        raise InputError(f"--max-files must be at least 1 (got {max_files})")
    text = getattr(args, "max_bytes", None)
    try:
        max_bytes = parse_size(str(text)) if text is not None else DEFAULT_MAX_BYTES
    except ValueError as e:
        raise InputError(f"--max-bytes: {e}") from None
    return max_files, max_bytes


def check_output(what: str, files: int, estimated_bytes: int | None, limits: tuple[int, int]) -> None:
    """Refuse, with a one-line estimate and before writing, output beyond ``limits`` (max files, max bytes);
    ``estimated_bytes`` None checks the file count alone."""
    max_files, max_bytes = limits
    about = f" (about {format_bytes(estimated_bytes)})" if estimated_bytes is not None else ""
    if files > max_files:
        raise LimitError(f"{what} would write {files:,} files{about}; the limit is {max_files:,} files: raise it "
                         "with --max-files N if you mean it")
    if estimated_bytes is not None and estimated_bytes > max_bytes:
        raise LimitError(f"{what} would write about {format_bytes(estimated_bytes)} in {files:,} file(s); the limit "
                         f"is {format_bytes(max_bytes)}: raise it with --max-bytes SIZE if you mean it")


def require_int(flag: str, value: int | None, minimum: int, maximum: int = INT64_MAX) -> None:
    """InputError unless ``value`` (when given) is a whole number in [minimum, maximum]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{flag} must be a whole number (got {shown(value)})")
    if value < minimum:
        raise InputError(f"{flag} must be at least {minimum} (got {value})")
    if value > maximum:
        raise InputError(f"{flag} must be at most {maximum:,} (got {value:,})")
