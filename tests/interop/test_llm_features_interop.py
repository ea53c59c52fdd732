"""The LLM generator's newer features (context parallelism's ring sends, virtual stages sending from the last stage
to the first, TP overlap's ring exchange, FP8 kernels, host-side data-loader nodes, the iteration tail) written
as traces ASTRA-sim 2.x reads: Chakra's own reader decodes every node with the attributes ASTRA-sim needs, and the
--groups-file form carries no METADATA node and simulates like the METADATA form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.interop
et_def = pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="mlc-chakra is not installed")
from tests.interop.test_chakra_interop import _read_with_chakra  # noqa: E402 (after the skip)

FLAGS = ["trace", "generate", "llm", "--layers", "8", "--hidden", "256", "--heads", "8", "--kv-heads", "4",
         "--ffn-hidden", "512", "--vocab", "1000", "--seq-len", "256", "--tp", "2", "--pp", "2", "--cp", "2",
         "--vp", "2", "--global-batch", "2", "--sequence-parallel", "--tp-comm-overlap", "--precision", "fp8",
         "--recompute", "selective", "--iteration-tail", "--dataloader-wait-us", "3", "--device", "H100",
         "--name", "llm"]
REQUIRED = {4: {"num_ops", "tensor_size"}, 5: {"comm_src", "comm_dst", "comm_size", "comm_tag"},
            6: {"comm_src", "comm_dst", "comm_size", "comm_tag"}, 7: {"comm_type", "comm_size"}}


def test_featured_llm_traces_decode_with_chakra_and_run_without_metadata(tmp_path: Path) -> None:
    from simulator.api import simulate

    assert run_cli(*FLAGS, "-o", str(tmp_path / "meta")).returncode == 0
    done = run_cli(*FLAGS, "-o", str(tmp_path / "file"), "--groups-file")
    assert done.returncode == 0, done.stderr
    sends = {}
    for rank in range(8):
        _, nodes = _read_with_chakra(tmp_path / "file" / f"llm.{rank}.et")
        ids = {n.id for n in nodes}
        assert nodes and all(n.type != et_def.METADATA_NODE for n in nodes)
        for n in nodes:
            assert set(n.data_deps) | set(n.ctrl_deps) <= ids
            attrs = {a.name for a in n.attr}
            cpu = any(a.name == "is_cpu_op" and a.bool_val for a in n.attr)
            assert REQUIRED.get(n.type, set()) <= attrs or cpu, (n.name, attrs)
            if cpu:
                assert n.type == et_def.COMP_NODE and n.duration_micros == 3
            if n.type in (et_def.COMM_SEND_NODE, et_def.COMM_RECV_NODE):
                values = {a.name: a.int64_val or a.uint64_val or a.int32_val or a.uint32_val for a in n.attr}
                key = (values["comm_src"], values["comm_dst"], values["comm_tag"])
                sends[key] = sends.get(key, 0) + (1 if n.type == et_def.COMM_SEND_NODE else -1)
    assert sends and set(sends.values()) == {0}  # every send has its receive
    network = tmp_path / "n.yml"
    network.write_text(json.dumps({"topology": ["Switch", "Switch"], "npus_count": [2, 4], "bandwidth": [400, 50],
                                   "latency": [500, 1000]}))
    with_metadata = simulate(str(tmp_path / "meta" / "llm"), str(network), device="H100")
    with_file = simulate(str(tmp_path / "file" / "llm"), str(network),
                         comm_groups=tmp_path / "file" / "llm.comm_groups.json", device="H100")
    assert with_metadata.ranks == with_file.ranks and with_file.finish_ns > 0
