"""The packet backend's parameters (``--packet-config`` or a network file's ``packet:`` section), checked.

    mtu_bytes: 4096          payload bytes per packet          header_bytes: 0    added on the wire per packet
    buffer_bytes: 1048576    per output queue (per virtual channel of it)
    flow_control: credit     credit (lossless) or none (unlimited buffers)
    virtual_channels: hops   hops (a channel per hop: deadlock-free) or none (one FIFO per port)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from network.values import choice, key_names, whole
from workload.errors import ConfigError

FLOW_CONTROLS = ("credit", "none")
VIRTUAL_CHANNELS = ("hops", "none")
PACKET_KEYS = ("mtu_bytes", "header_bytes", "buffer_bytes", "flow_control", "virtual_channels")


@dataclass(frozen=True, slots=True)
class PacketConfig:
    mtu_bytes: int = 4096
    header_bytes: int = 0
    buffer_bytes: int = 1 << 20  # per output queue (per virtual channel of it)
    flow_control: str = "credit"
    virtual_channels: str = "hops"  # hops: a channel per hop of the route (deadlock-free); none: one FIFO


def packet_config_from_dict(data: Any, where: str) -> PacketConfig:
    """The packet parameters a mapping gives (absent keys keep their defaults); mistakes name the key."""
    from workload.limits import parse_size

    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the packet section must be a mapping with keys {', '.join(PACKET_KEYS)}")
    unknown = key_names(set(data) - set(PACKET_KEYS))
    if unknown:
        raise ConfigError(f"{where}: packet: unknown key(s) {unknown}; valid: {', '.join(PACKET_KEYS)}")
    kw: dict[str, Any] = {}
    limits = (("mtu_bytes", 1, 1 << 30), ("header_bytes", 0, 1 << 20), ("buffer_bytes", 1, 1 << 40))
    for key, minimum, maximum in limits:
        if key in data:
            value = data[key]
            if isinstance(value, str):  # a size with a unit: 64KiB
                with contextlib.suppress(ValueError):
                    value = parse_size(value)
            kw[key] = whole(value, f"packet: {key}", where, low=minimum, high=maximum)
    for key, options in (("flow_control", FLOW_CONTROLS), ("virtual_channels", VIRTUAL_CHANNELS)):
        if key in data:
            kw[key] = choice(data[key], f"packet: {key}", where, options)
    config = PacketConfig(**kw)
    if config.flow_control == "credit" and config.buffer_bytes < config.mtu_bytes + config.header_bytes:
        raise ConfigError(f"{where}: packet: 'buffer_bytes' ({config.buffer_bytes}) must hold at least one packet "
                          f"({config.mtu_bytes + config.header_bytes} bytes)")
    return config
