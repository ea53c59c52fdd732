"""Vectorised protobuf wire-format scanning with numpy.

Many messages of the same kind are scanned in lock step: each round reads the next field of every
message that still has bytes left, so a million small messages cost a few dozen numpy calls instead
of a million Python-level parses. The results are flat arrays of field occurrences that callers
interpret with protobuf's rules (last scalar wins, repeated fields concatenate).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from workload.errors import TraceError

PADDING = 16  # zero bytes appended to every buffer so that reads a little past a message end stay in bounds
_U64 = np.uint64
_COMPARED_IN_BULK = 64  # string bytes compared position by position across all strings; longer tails one by one
MAX_VARINT_BYTES = 10


def padded_buffer(data: bytes) -> np.ndarray:
    """The bytes as a uint8 array with PADDING zero bytes after the end."""
    buf = np.zeros(len(data) + PADDING, dtype=np.uint8)
    buf[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return buf


def read_varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode one varint at each position: (values as uint64, positions after them, malformed mask)."""
    first = buf[pos]
    values = (first & 0x7F).astype(_U64)
    after = pos + 1
    malformed = np.zeros(len(pos), dtype=bool)
    todo = np.flatnonzero(first >= 0x80)
    shift = 7
    while todo.size:
        if shift > 63:
            malformed[todo] = True
            break
        b = buf[pos[todo] + shift // 7]
        values[todo] |= (b & 0x7F).astype(_U64) << _U64(shift)
        after[todo] += 1
        todo = todo[b >= 0x80]
        shift += 7
    return values, after, malformed


def read_fixed(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Little-endian fixed-width (4 or 8 byte) values at each position, as uint64."""
    windows = np.lib.stride_tricks.as_strided(buf, shape=(len(buf) - width + 1, width), strides=(1, 1),
                                              writeable=False)
    dtype = "<u4" if width == 4 else "<u8"
    return windows[pos].view(dtype).ravel().astype(_U64, copy=False)


@dataclass(slots=True)
class Round:
    """One field of every message that still had bytes left, in ascending message order.

    ``message`` indexes the scanned messages (unique within a round); ``seq`` is the round number, i.e.
    the field's ordinal within its message. ``value`` holds varint and fixed-width values, ``offset`` and
    ``length`` the payload of length-delimited fields (wire type 2).
    """

    seq: int
    message: np.ndarray
    field: np.ndarray
    wire: np.ndarray
    value: np.ndarray
    offset: np.ndarray
    length: np.ndarray

    def where(self, number: int, wire: int) -> np.ndarray:
        """Positions (within the round) of the occurrences of one field written with one wire type."""
        return np.flatnonzero((self.field == number) & (self.wire == wire))


def scan_fields(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, what: str,
                block: int = 1 << 19) -> Iterator[Round]:
    """Scan the fields of the messages buf[starts[i]:ends[i]], one round at a time.

    Messages are scanned in blocks of ``block`` to bound temporary memory; within a message, rounds
    still come in field order. Raises MalformedMessage (with the byte offset and the message index)
    on malformed wire data; ``what`` names the messages in that error.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    for first in range(0, len(starts), block):
        yield from _scan_block(buf, starts, ends, first, min(first + block, len(starts)), what)


def _scan_block(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, lo: int, hi: int, what: str
                ) -> Iterator[Round]:
    cur = starts[lo:hi].copy()
    stop = ends[lo:hi]
    active = np.flatnonzero(cur < stop)
    seq = 0
    while active.size:
        p = cur[active]
        limit = stop[active]
        tag, p, bad = read_varints(buf, p)
        wire = (tag & _U64(7)).astype(np.int8)
        field = (tag >> _U64(3)).astype(np.int64)
        value = np.zeros(active.size, dtype=_U64)
        length = np.zeros(active.size, dtype=np.int64)
        after = p.copy()

        m = np.flatnonzero(wire == 0)
        if m.size:
            v, q, b = read_varints(buf, p[m])
            value[m] = v
            after[m] = q
            bad[m] |= b
        m = np.flatnonzero(wire == 1)
        if m.size:
            value[m] = read_fixed(buf, p[m], 8)
            after[m] = p[m] + 8
        m = np.flatnonzero(wire == 5)
        if m.size:
            value[m] = read_fixed(buf, p[m], 4)
            after[m] = p[m] + 4
        m = np.flatnonzero(wire == 2)
        offset = p
        if m.size:
            offset = p.copy()
            n, q, b = read_varints(buf, p[m])
            bad[m] |= b
            room = np.maximum(limit[m] - q, 0).astype(_U64)
            too_long = n > room
            bad[m] |= too_long
            n = np.where(too_long, _U64(0), n).astype(np.int64)
            offset[m] = q
            length[m] = n
            after[m] = q + n

        bad |= (wire == 3) | (wire == 4) | (wire == 6) | (wire == 7) | (field == 0)
        bad |= after > limit
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            _raise_malformed(buf, int(cur[active[i]]), int(limit[i]), what, lo + int(active[i]))
        yield Round(seq, lo + active, field, wire, value, offset, length)
        cur[active] = after
        active = active[after < limit]
        seq += 1


class MalformedMessage(TraceError):
    """Wire data that is not a valid protobuf message; ``message_index`` says which of the scanned ones."""

    def __init__(self, problem: str, offset: int, message_index: int) -> None:
        super().__init__(problem, offset=offset, hint="the file is corrupt or not a Chakra ET file")
        self.message_index = message_index


def _raise_malformed(buf: np.ndarray, pos: int, limit: int, what: str, index: int) -> None:
    tag, after, bad = read_varints(buf, np.array([pos]))
    wire = int(tag[0] & _U64(7))
    field = int(tag[0] >> _U64(3))
    if bad[0] or after[0] > limit:
        problem = f"malformed field tag in {what}"
    elif field == 0:
        problem = f"invalid field number 0 in {what}"
    elif wire in (3, 4):
        problem = f"unsupported protobuf group (field {field}) in {what}"
    elif wire in (6, 7):
        problem = f"invalid wire type {wire} (field {field}) in {what}"
    else:
        problem = f"field {field} runs past the end of its {what} (truncated or corrupt data)"
    raise MalformedMessage(problem, pos, index)


def expand_packed_varints(buf: np.ndarray, offset: np.ndarray, length: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Decode packed varint payloads: (values as uint64, index of the payload each came from).

    Values keep their order; a payload that ends inside a varint raises TraceError.
    """
    length = np.asarray(length, dtype=np.int64)
    total = int(length.sum())
    if total == 0:
        return np.zeros(0, dtype=_U64), np.zeros(0, dtype=np.int64)
    seg_start = np.cumsum(length) - length
    pos = np.repeat(np.asarray(offset, dtype=np.int64) - seg_start, length) + np.arange(total)
    b = buf[pos]
    is_end = b < 0x80
    nonempty = np.flatnonzero(length > 0)
    last_byte = seg_start[nonempty] + length[nonempty] - 1
    broken = ~is_end[last_byte]
    if broken.any():
        k = int(nonempty[np.flatnonzero(broken)[0]])
        raise TraceError("packed list ends inside a number (truncated or corrupt data)",
                         offset=int(offset[k]), hint="the file is corrupt or not a Chakra ET file")
    end_idx = np.flatnonzero(is_end)
    start_idx = np.concatenate(([0], end_idx[:-1] + 1))
    sizes = end_idx - start_idx + 1
    if sizes.max() > 10:
        k = int(np.flatnonzero(sizes > 10)[0])
        raise TraceError("malformed number in a packed list", offset=int(pos[start_idx[k]]))
    shift = (np.arange(total) - np.repeat(start_idx, sizes)) * 7
    contrib = (b & 0x7F).astype(_U64) << shift.astype(_U64)
    values = np.bitwise_or.reduceat(contrib, start_idx)
    segment = np.repeat(np.arange(len(length)), length)[end_idx]
    return values, segment


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending: np.unique without its check for masked arrays, whose first use imports
    numpy.ma (a run's start-up would pay for it)."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if ordered.size else ordered


def intern_strings(buf: np.ndarray, offset: np.ndarray, length: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Distinct UTF-8 strings among buf[offset[i]:offset[i]+length[i]]: (strings, index of each).

    Made for many occurrences of few distinct short strings (attribute names). Strings are numbered in
    order of first appearance, so results are deterministic.
    """
    count = len(offset)
    if count == 0:
        return [], np.zeros(0, dtype=np.int32)
    length = length.astype(np.int64)
    head = _gather8(buf, offset, np.minimum(length, 8))
    tail = _gather8(buf, offset + np.maximum(length - 8, 0), np.minimum(np.maximum(length - 8, 0), 8))
    with np.errstate(over="ignore"):
        keys = (head * _U64(0x9E3779B97F4A7C15)) ^ (tail * _U64(0xC2B2AE3D27D4EB4F)) ^ length.astype(_U64)
    distinct = sorted_distinct(keys)
    inverse = np.searchsorted(distinct, keys)
    first = np.full(len(distinct), count, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(count))
    rep = first[inverse]
    # (length, first 8 bytes, bytes 8..15) is exact up to 16 bytes; compare longer strings in full
    same = (length == length[rep]) & (head == head[rep]) & (tail == tail[rep])
    long = np.flatnonzero(same & (length > 16))
    for j in range(16, min(int(length.max()), _COMPARED_IN_BULK)):
        live = long[length[long] > j]
        same[live] &= buf[offset[live] + j] == buf[offset[rep[live]] + j]
    for k in long[length[long] > _COMPARED_IN_BULK].tolist():  # rare: compare whole, not byte by byte
        o, r, n = int(offset[k]), int(offset[rep[k]]), int(length[k])
        same[k] = same[k] and bytes(buf[o : o + n]) == bytes(buf[r : r + n])
    if not same.all():  # a hash collision, never seen in practice: fall back to exact Python hashing
        texts = [bytes(buf[o : o + n]) for o, n in zip(offset.tolist(), length.tolist(), strict=True)]
        table: dict[bytes, int] = {}
        idx = np.fromiter((table.setdefault(t, len(table)) for t in texts), dtype=np.int32, count=count)
        return [t.decode("utf-8", "replace") for t in table], idx
    appearance = np.argsort(first, kind="stable")
    number = np.empty(len(distinct), dtype=np.int32)
    number[appearance] = np.arange(len(distinct), dtype=np.int32)
    strings = [buf[offset[first[u]] : offset[first[u]] + length[first[u]]].tobytes().decode("utf-8", "replace")
               for u in appearance.tolist()]
    return strings, number[inverse]


def _gather8(buf: np.ndarray, offset: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Up to 8 bytes at each offset as a little-endian uint64, bytes beyond ``width`` zeroed."""
    raw = read_fixed(buf, offset, 8)
    keep = np.where(width >= 8, ~_U64(0), (_U64(1) << (width.astype(_U64) * _U64(8))) - _U64(1))
    return raw & keep


def message_fields(data: bytes, base: int = 0, what: str = "message") -> list[tuple[int, int, int, int, int]]:
    """The fields of one serialized message, in order, decoded in plain Python (for the few messages read one at a
    time): (field number, wire type, varint or fixed bits, payload start, payload end); payload positions index
    ``data`` and are only set for length-delimited fields. Malformed data raises TraceError with the byte offset
    (``base`` + position in ``data``); ``what`` names the message."""
    out: list[tuple[int, int, int, int, int]] = []
    pos, end = 0, len(data)

    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        for k in range(at, min(at + MAX_VARINT_BYTES, end)):
            b = data[k]
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value & 0xFFFFFFFFFFFFFFFF, k + 1
            shift += 7
        problem = "a number longer than 10 bytes" if end - at >= MAX_VARINT_BYTES else "data ending inside a number"
        raise TraceError(f"malformed {what}: {problem}", offset=base + at, hint=_CORRUPT)

    while pos < end:
        start = pos
        tag, pos = varint(pos)
        number, wire = tag >> 3, tag & 7
        value, first, last = 0, 0, 0
        if number == 0 or wire in (3, 4, 6, 7):
            kind = "field number 0" if number == 0 else f"wire type {wire} (field {number})"
            raise TraceError(f"malformed {what}: invalid {kind}", offset=base + start, hint=_CORRUPT)
        if wire == 0:
            value, pos = varint(pos)
        elif wire == 1 or wire == 5:
            width = 8 if wire == 1 else 4
            if pos + width > end:
                raise TraceError(f"malformed {what}: field {number} runs past its end", offset=base + start,
                                 hint=_CORRUPT)
            value, pos = int.from_bytes(data[pos : pos + width], "little"), pos + width
        else:
            length, first = varint(pos)
            if length > end - first:
                raise TraceError(f"malformed {what}: field {number} claims {length} bytes, {end - first} are left",
                                 offset=base + start, hint=_CORRUPT)
            last = pos = first + length
        out.append((number, wire, value, first, last))
    return out


_CORRUPT = "the file is corrupt or not a Chakra ET file"


def packed_values(data: bytes, wire: int, base: int = 0, what: str = "packed list") -> list[int]:
    """The values of a packed repeated field's payload: varints (wire 0) or little-endian fixed 8 / 4 byte
    values (wire 1 / 5), as unsigned integers. Malformed payloads raise TraceError with the byte offset."""
    if wire in (1, 5):
        width = 8 if wire == 1 else 4
        if len(data) % width:
            raise TraceError(f"malformed {what}: {len(data)} bytes are no whole number of {width}-byte values",
                             offset=base, hint=_CORRUPT)
        return np.frombuffer(data, dtype="<u8" if width == 8 else "<u4").tolist()
    values, pos, end = [], 0, len(data)
    while pos < end:
        value = shift = 0
        for k in range(pos, min(pos + MAX_VARINT_BYTES, end)):
            b = data[k]
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        else:
            raise TraceError(f"malformed {what}: a number is cut off or longer than 10 bytes", offset=base + pos,
                             hint=_CORRUPT)
        values.append(value & 0xFFFFFFFFFFFFFFFF)
        pos = k + 1
    return values
