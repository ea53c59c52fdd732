"""Reading ASTRA-sim 1.0 text workloads: the parallelism line, the layer count, one 12-column line per layer.

First line: a parallelism keyword, then ``name: value`` parameters (``model_parallel_NPU_group: 8``,
``ep:``, ``pp:``, ``vpp:``, ``ga:``, ``all_gpus:``, ``pp_comm:``, ``checkpoints: COUNT L1 L2 ...``,
``checkpoint_initiates: COUNT ...``; the DLRM keywords take the last bottom layer as a bare number or as
``DLRM_LAST_BOTTOM_LAYER: n``). Second line: the number of layers. Then per layer: name, reserved,
forward compute time, forward collective, forward size, input-gradient time, collective, size,
weight-gradient time, collective, size, weight-update delay. Times are cycles of ASTRA-sim 1.0's 1 GHz
clock (ns); sizes are bytes. Collective words: ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL,
ALLREDUCEALLTOALL or NONE, optionally suffixed ``_EP`` / ``_DP_EP`` (SimAI's expert-parallel groups).

Every problem is an InputError naming ``file:line``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from workload.errors import InputError
from workload.files import read_text
from workload.schema import CollectiveType

Warn = Callable[[str], None]

TRANSFORMER = ("HYBRID_TRANSFORMER", "HYBRID_TRANSFORMER_FWD_IN_BCKWD")
DLRM = ("HYBRID_DLRM", "HYBRID_DLRM_ENHANCED")
KEYWORDS = ("MICRO", "DATA", "MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA", *DLRM, *TRANSFORMER,
            "DISTRIBUTED_INFERENCE")

# Collective words -> the collectives they become (ALLREDUCEALLTOALL: an all-reduce, then an all-to-all).
COLLECTIVE_WORDS: dict[str, tuple[CollectiveType, ...]] = {
    "ALLREDUCE": (CollectiveType.ALL_REDUCE,),
    "ALLGATHER": (CollectiveType.ALL_GATHER,),
    "REDUCESCATTER": (CollectiveType.REDUCE_SCATTER,),
    "ALLTOALL": (CollectiveType.ALL_TO_ALL,),
    "ALLREDUCEALLTOALL": (CollectiveType.ALL_REDUCE, CollectiveType.ALL_TO_ALL),
    "ALLREDUCE_ALLTOALL": (CollectiveType.ALL_REDUCE, CollectiveType.ALL_TO_ALL),
}
GROUP_SUFFIXES = ("_DP_EP", "_EP")  # longest first
# Header parameter spellings -> field of Header.
_PARAMETERS = {"model_parallel_npu_group": "tp", "ep": "ep", "expert_parallel_npu_group": "ep", "pp": "pp",
               "vpp": "vpp", "ga": "ga", "all_gpus": "all_gpus", "pp_comm": "pp_comm_bytes",
               "dlrm_last_bottom_layer": "last_bottom_layer"}
_LAYER_LISTS = {"checkpoints": "checkpoints", "checkpoint_initiates": "checkpoint_initiates"}
COLUMNS = ("name", "reserved", "fwd time", "fwd comm", "fwd size", "ig time", "ig comm", "ig size",
           "wg time", "wg comm", "wg size", "update time")


@dataclass(frozen=True, slots=True)
class Comm:
    """One collective a layer phase issues."""

    word: str  # as written, e.g. ALLTOALL_EP
    types: tuple[CollectiveType, ...]
    group: str  # "" (the phase's usual group), "EP" or "DP_EP"
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Phase:
    """Forward, input-gradient or weight-gradient part of a layer."""

    compute_ns: float
    comm: Comm | None  # None: NONE


@dataclass(frozen=True, slots=True)
class Layer:
    index: int
    name: str
    line: int
    fwd: Phase
    ig: Phase
    wg: Phase
    update_ns: float


@dataclass(slots=True)
class Header:
    """The first line's parameters (None when not given)."""

    keyword: str
    tp: int | None = None
    ep: int | None = None
    pp: int | None = None
    vpp: int | None = None
    ga: int | None = None
    all_gpus: int | None = None
    pp_comm_bytes: int | None = None
    last_bottom_layer: int | None = None
    checkpoints: tuple[int, ...] | None = None
    checkpoint_initiates: tuple[int, ...] | None = None
    given: list[str] = field(default_factory=list)  # parameter names as written, in order


@dataclass(frozen=True, slots=True)
class TextWorkload:
    path: str
    header: Header
    layers: tuple[Layer, ...]
    count_line: int  # the line holding the layer count

    @property
    def keyword(self) -> str:
        return self.header.keyword


def read_text_workload(path: str, time_scale_ns: float = 1.0) -> TextWorkload:
    """Parse an ASTRA-sim 1.0 text workload; compute and update times are multiplied by ``time_scale_ns``."""
    lines = read_text(path, "text workload").splitlines()
    numbered = [(n, text) for n, text in enumerate(lines, 1) if text.strip()]
    if not numbered:
        raise InputError(f"{path}: the file is empty (expected a parallelism keyword such as DATA on line 1)")
    header = parse_header(path, *numbered[0])
    if len(numbered) < 2:
        raise InputError(f"{path}:{numbered[0][0]}: the number of layers is missing (expected on the next line)")
    count_line, count_text = numbered[1]
    count = _whole(path, count_line, count_text.strip(), "the number of layers")
    if count < 1:
        raise InputError(f"{path}:{count_line}: the workload must have at least one layer (got {count})")
    rows = numbered[2:]
    if len(rows) > count:
        raise InputError(f"{path}:{rows[count][0]}: more layer lines than the {count} announced on line "
                         f"{count_line}")
    if len(rows) < count:
        raise InputError(f"{path}:{count_line}: announces {count} layers but the file has {len(rows)} layer "
                         f"line(s)")
    layers = tuple(_layer(path, n, text, i, time_scale_ns) for i, (n, text) in enumerate(rows))
    return TextWorkload(path, header, layers, count_line)


def parse_header(path: str, line: int, text: str) -> Header:
    tokens = text.split()
    keyword = tokens[0]
    if keyword not in KEYWORDS:
        hint = " (HYBRID_CUSTOMIZED's per-layer policies are not supported)" if keyword == "HYBRID_CUSTOMIZED" \
            else ""
        raise InputError(f"{path}:{line}: unknown parallelism {keyword!r}{hint}; valid: {', '.join(KEYWORDS)}")
    header = Header(keyword)
    i = 1
    while i < len(tokens):
        token = tokens[i]
        if i == 1 and keyword in DLRM and _is_number(token):  # ASTRA-sim 1.0: "HYBRID_DLRM 3"
            header.last_bottom_layer = _whole(path, line, token, "the last bottom layer")
            header.given.append("last bottom layer")
            i += 1
            continue
        if not token.endswith(":") and token.lower() != "pp_comm":
            raise InputError(f"{path}:{line}: unexpected {token!r} on the parallelism line (parameters are "
                             "written 'name: value', e.g. 'model_parallel_NPU_group: 8')")
        name = token.rstrip(":")
        key = name.lower()
        if i + 1 >= len(tokens):
            raise InputError(f"{path}:{line}: parameter {name!r} has no value")
        if key in _LAYER_LISTS:
            count = _whole(path, line, tokens[i + 1], f"the count of {name}")
            values = tokens[i + 2 : i + 2 + count]
            if len(values) < count:
                raise InputError(f"{path}:{line}: {name} announces {count} layer(s) but lists {len(values)}")
            setattr(header, _LAYER_LISTS[key], tuple(_whole(path, line, v, f"a layer of {name}") for v in values))
            i += 2 + count
        else:
            value = _whole(path, line, tokens[i + 1], f"parameter {name!r}")
            if key in _PARAMETERS:
                setattr(header, _PARAMETERS[key], value)
            i += 2
        header.given.append(name)
    return header


def unknown_parameters(header: Header) -> list[str]:
    """Parameter names of the first line this converter does not know."""
    known = set(_PARAMETERS) | set(_LAYER_LISTS) | {"last bottom layer"}
    return [name for name in header.given if name.lower() not in known]


def _layer(path: str, line: int, text: str, index: int, time_scale_ns: float) -> Layer:
    cols = text.split()
    if len(cols) != len(COLUMNS):
        raise InputError(f"{path}:{line}: a layer line has {len(cols)} columns where {len(COLUMNS)} are expected "
                         f"({', '.join(COLUMNS)})")
    _whole(path, line, cols[1], "the reserved column", allow_negative=True)

    def phase(first: int, what: str) -> Phase:
        time_ns = _time(path, line, cols[first], f"the {what} compute time") * time_scale_ns
        return Phase(time_ns, _comm(path, line, cols[first + 1], cols[first + 2], what))

    update_ns = _time(path, line, cols[11], "the update time") * time_scale_ns
    return Layer(index, cols[0], line, phase(2, "forward"), phase(5, "input-gradient"), phase(8, "weight-gradient"),
                 update_ns)


def _comm(path: str, line: int, word: str, size_text: str, what: str) -> Comm | None:
    size = _whole(path, line, size_text, f"the {what} communication size")
    if word == "NONE":
        return None
    base, group = word, ""
    for suffix in GROUP_SUFFIXES:
        if word.endswith(suffix) and word[: -len(suffix)] in COLLECTIVE_WORDS:
            base, group = word[: -len(suffix)], suffix[1:]
            break
    types = COLLECTIVE_WORDS.get(base)
    if types is None:
        raise InputError(f"{path}:{line}: unknown {what} collective {word!r}; valid: NONE, "
                         f"{', '.join(COLLECTIVE_WORDS)}, each optionally with _EP or _DP_EP")
    return Comm(word, types, group, size)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _whole(path: str, line: int, text: str, what: str, allow_negative: bool = False) -> int:
    """A whole number (``8192`` or ``8192.0``, as some generators write)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value) or (value < 0 and not allow_negative):
        raise InputError(f"{path}:{line}: {what} must be a whole number{'' if allow_negative else ' >= 0'} "
                         f"(got {text!r})")
    return int(value)


def _time(path: str, line: int, text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{path}:{line}: {what} must be a number of cycles >= 0 (got {text!r})")
    return value
