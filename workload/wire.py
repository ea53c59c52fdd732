"""The ET file framing: messages each preceded by their length as a varint, optionally gzip-compressed."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable

import numpy as np

from workload.errors import LimitError, TraceError
from workload.limits import available_memory_bytes, format_bytes, read_trace_bytes


def read_trace_buffer(path: str | os.PathLike[str], padding: int) -> np.ndarray:
    """The file's bytes (gunzipped when gzip-compressed, whatever its name) in a uint8 array followed by
    ``padding`` zero bytes. Only regular files are read, and gzip output is capped (workload.limits)."""
    return np.frombuffer(read_trace_bytes(path, padding), dtype=np.uint8)


def frame_messages(data: bytes | memoryview, max_messages: int | None = None, notes: list[str] | None = None
                   ) -> tuple[array, array]:
    """Split a length-prefixed message stream into (payload starts, payload ends).

    Raises TraceError with the byte offset where the stream is truncated or not a message stream, and
    LimitError beyond ``max_messages``. Zero bytes to the end of the stream (a zero-filled tail) end it, as the
    official readers end at an empty message, with a line in ``notes``; other runs of empty messages are
    corrupt data.
    """
    starts = array("q")
    ends = array("q")
    push_start = starts.append
    push_end = ends.append
    pos = 0
    n = len(data)
    count = 0
    limit = n if max_messages is None else max_messages
    while pos < n:
        header = pos
        b = data[pos]
        pos += 1
        if b < 0x80:
            length = b
            if b == 0 and pos < n and data[pos] == 0:  # two empty messages in a row: zero-filled data
                if np.frombuffer(data, dtype=np.uint8, offset=header).any():
                    raise TraceError("a run of zero bytes inside the message stream: corrupt or not a Chakra ET "
                                     "file", offset=header)
                if notes is not None:
                    notes.append(f"the last {n - header:,} bytes are zeros (a zero-filled tail), ignored as the "
                                 "official tools ignore what follows an empty message")
                break
        else:
            length = b & 0x7F
            shift = 7
            while True:
                if pos >= n:
                    raise TraceError("file ends inside a message length prefix (truncated file?)",
                                     offset=header)
                b = data[pos]
                pos += 1
                length |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if shift > 35:
                    raise TraceError("malformed message length prefix: not a Chakra ET file?", offset=header)
        end = pos + length
        if end > n:
            raise TraceError(
                f"message of {length} bytes runs past the end of the file ({n - pos} bytes left): "
                "truncated file, or not a Chakra ET file",
                offset=header,
            )
        count += 1
        if count > limit:
            raise LimitError(f"more than {limit:,} messages (at byte offset {header:,} of {n:,}): decoding them "
                             f"would take more memory than is available ({format_bytes(available_memory_bytes())})")
        push_start(pos)
        push_end(end)
        pos = end
    return starts, ends


def encode_varint(value: int) -> bytes:
    """The protobuf base-128 varint encoding of a non-negative integer."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def frame_payloads(payloads: Iterable[bytes]) -> bytes:
    """Join serialized messages into one stream, each preceded by its length."""
    out = bytearray()
    for p in payloads:
        out += encode_varint(len(p))
        out += p
    return bytes(out)
