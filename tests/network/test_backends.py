"""The analytical backends: ASTRA-sim's delay formulas and per-link FIFO service."""

from __future__ import annotations

from network.backends import CongestionAware, CongestionUnaware
from network.config import network_from_dict
from simulator.engine import Engine


def net(topology: list[str], counts: list[int], bw: float = 50.0, lat: float = 500.0):  # type: ignore[no-untyped-def]
    return network_from_dict({"topology": topology, "npus_count": counts, "bandwidth": [bw] * len(counts),
                              "latency": [lat] * len(counts)})


def test_unaware_charges_the_lowest_differing_dimension_only() -> None:
    cfg = net(["Ring", "Switch"], [8, 4])
    unaware = CongestionUnaware(cfg, Engine())
    bpns = 50 * (1 << 30) / 1e9
    assert unaware.hops(0, 3) == (0, 3) and unaware.hops(0, 6) == (0, 2)  # shorter way round
    assert unaware.hops(0, 8) == (1, 2) and unaware.hops(1, 10) == (0, 1)
    assert unaware.delay_ns(0, 6, 1 << 20) == int(2 * 500 + (1 << 20) / bpns)


def test_aware_link_is_a_fifo_server() -> None:
    engine = Engine()
    aware = CongestionAware(net(["Switch"], [4]), engine)
    arrivals: list[tuple[str, int]] = []
    for name, src in (("a", 0), ("b", 1)):  # both go to NPU 2: they share the switch -> 2 link
        aware.transmit(src, 2, 1 << 20, lambda n: arrivals.append((n, engine.now)), name)
    engine.run()
    ser = int((1 << 20) / (50 * (1 << 30) / 1e9))
    one_hop = int(500 + (1 << 20) / (50 * (1 << 30) / 1e9))
    assert arrivals == [("a", 2 * one_hop), ("b", one_hop + ser + one_hop)]
    down = aware.links[(4, 2)]
    assert down.messages == 2 and down.bytes == 2 << 20 and down.max_queue == 1


def test_aware_routes_dimension_by_dimension() -> None:
    aware = CongestionAware(net(["Ring", "FullyConnected", "Switch"], [4, 3, 2]), Engine())
    route = aware.route(0, 3 + 2 * 4 + 1 * 12)  # (0,0,0) -> (3,2,1)
    hops = [(link.src, link.dst) for link in route]
    assert hops[0] == (0, 3)  # ring dimension: one hop the short way (anticlockwise)
    assert hops[1] == (3, 11)  # fully connected: a direct link
    assert hops[2][0] == 11 and hops[3][1] == 23 and hops[2][1] == hops[3][0] >= 24  # through a switch
