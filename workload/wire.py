"""The ET file framing: messages each preceded by their length as a varint, optionally gzip-compressed."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable

import numpy as np

from workload.errors import TraceError
from workload.limits import read_trace_bytes


def read_trace_buffer(path: str | os.PathLike[str], padding: int) -> np.ndarray:
    """The file's bytes (gunzipped when gzip-compressed, whatever its name) in a uint8 array followed by
    ``padding`` zero bytes. Only regular files are read, and gzip output is capped (workload.limits)."""
    return np.frombuffer(read_trace_bytes(path, padding), dtype=np.uint8)


def frame_messages(data: bytes | memoryview) -> tuple[array, array]:
    """Split a length-prefixed message stream into (payload starts, payload ends).

    Raises TraceError with the byte offset where the stream is truncated or not a message stream.
    """
    starts = array("q")
    ends = array("q")
    push_start = starts.append
    push_end = ends.append
    pos = 0
    n = len(data)
    while pos < n:
        header = pos
        b = data[pos]
        pos += 1
        if b < 0x80:
            length = b
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
