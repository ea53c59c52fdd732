"""``--compute-model kernels`` in runs: generated LLM traces are timed by operator and shape, end to end through the
command line, the Python API and sweeps; nodes without shapes are estimated and said so once; bad names list the
valid ones; the default stays ASTRA-sim's roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from compute.devices import device
from compute.kernels import KernelModel
from compute.shapes import AttentionShape, OpShape
from simulator.api import simulate as api_simulate
from tests.conftest import run_cli, simulate
from workload.llm.build import build_programs
from workload.llm.model import ModelConfig
from workload.llm.plan import ParallelPlan
from workload.schema import NodeType
from workload.writer import make_node

MODEL = ModelConfig(name="tiny", num_layers=2, hidden_size=1024, num_heads=8, num_kv_heads=2, ffn_hidden_size=3584,
                    vocab_size=32000, seq_len=2048, gated_ffn=True)
RING2 = {"topology": ["Ring"], "npus_count": [2], "bandwidth": [50.0], "latency": [500.0]}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A 2-rank tensor-parallel Llama-style trace, written by the command line; and its network file."""
    out = tmp_path_factory.mktemp("llm")
    done = run_cli("trace", "generate", "llm", "--layers", "2", "--hidden", "1024", "--heads", "8", "--kv-heads", "2",
                   "--ffn-hidden", "3584", "--vocab", "32000", "--seq-len", "2048", "--gated-ffn", "--tp", "2",
                   "--dp", "1", "--pp", "1", "--npus", "2", "--global-batch", "2", "--micro-batch-size", "1",
                   "--name", "tiny", "--output", str(out))
    assert done.returncode == 0, done.stderr
    net = out / "net.yml"
    net.write_text("topology: [Switch]\nnpus_count: [2]\nbandwidth: [450]\nlatency: [500]\n")
    return str(out / "tiny"), str(net)


def test_cli_times_a_generated_llm_trace_by_its_kernels(traces: tuple[str, str], tmp_path: Path) -> None:
    prefix, net = traces
    runs = {}
    for model in ("roofline", "kernels"):
        out = tmp_path / f"{model}.json"
        done = run_cli("--workload", prefix, "--network", net, "--device", "H100", "--compute-model", model,
                       "--json", str(out), "--quiet")
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr  # every compute node of a generated trace carries its shape
        runs[model] = json.loads(out.read_text())
    kernels, roofline = runs["kernels"], runs["roofline"]
    assert kernels["config"]["compute"]["model"] == "kernels" and kernels["config"]["compute"]["device"] == "H100"
    assert kernels["config"]["compute"]["calibration"] == "fitted"
    ratio = kernels["ranks"][0]["compute_ns"] / roofline["ranks"][0]["compute_ns"]
    assert 1.15 < ratio < 2.5  # real kernels reach 40-85% of the roofline on these shapes
    text = run_cli("--workload", prefix, "--network", net, "--device", "H100", "--compute-model", "kernels",
                   "--quiet").stdout
    assert ("compute: kernel model (H100, 989.4 TFLOP/s BF16, 3350 GB/s memory, GB = 10^9 B; "
            "efficiencies fitted)") in text


def test_rank_compute_time_is_the_sum_of_its_kernels() -> None:
    """A rank's GPU compute time equals the kernel model over the generator's own kernels (the shapes the trace
    carries are the ones the generator built)."""
    plan = ParallelPlan(dp=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2)
    from workload.llm.emit import TraceEmitter
    from workload.llm.plan import RankMap

    programs = build_programs(MODEL, plan)
    model = KernelModel(device("A100"))
    expected = sum(model.time_ns(op.kernel.shape, op.kernel.flops, op.kernel.size_bytes)
                   for op in programs[0].ops if op.node_type == NodeType.COMP_NODE)
    emitter = TraceEmitter(programs, RankMap(plan, MODEL))
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        emitter.write(f"{folder}/t")
        net = Path(folder) / "n.yml"
        net.write_text("topology: [Ring]\nnpus_count: [2]\nbandwidth: [50]\nlatency: [500]\n")
        result = api_simulate(f"{folder}/t", str(net), device="A100", compute_model="kernels")
    assert result.ranks[0].compute_ns == expected and result.finish_ns > expected


def test_python_api_and_device_files(traces: tuple[str, str], tmp_path: Path) -> None:
    prefix, net = traces
    by_name = api_simulate(prefix, net, device="H200", compute_model="kernels")
    custom = tmp_path / "my_gpu.yml"
    text = Path(device("H200").path).read_text().replace("name: H200", "name: MyGPU")
    custom.write_text(text.replace("memory_bw_GBps: 4800.0", "memory_bw_GBps: 9600.0"))
    by_file = api_simulate(prefix, net, device=str(custom), compute_model="kernels")
    assert by_file.config["compute"]["device"] == "MyGPU"
    assert by_file.ranks[0].compute_ns < by_name.ranks[0].compute_ns  # twice the bandwidth: memory-bound work shrinks
    h100 = api_simulate(prefix, net, device="H100", compute_model="kernels")
    assert by_name.ranks[0].compute_ns < h100.ranks[0].compute_ns  # H200: H100's compute, faster memory


def test_nodes_without_shapes_are_estimated_and_said_once(tmp_path: Path) -> None:
    def node(i: int, **attrs: object) -> object:
        return make_node(i, f"k{i}", NodeType.COMP_NODE, attrs=attrs)

    nodes = [node(0, num_ops=10**12, tensor_size=10**8), node(1, num_ops=10**12, tensor_size=10**8),
             node(2, op_class="gemm", gemm_m=4096, gemm_n=4096, num_ops=10**12, tensor_size=10**8),
             node(3, op_class="gemm", gemm_m=4096, gemm_n=4096, gemm_k=4096, dtype="bf16"),
             make_node(4, "recorded", NodeType.COMP_NODE, duration_micros=7)]
    warnings: list[str] = []
    result = simulate(tmp_path, [nodes, nodes], RING2, warn=warnings.append, device="H100", compute_model="kernels")
    (message,) = [w for w in warnings if "--compute-model kernels" in w]
    assert "3 of 5 GPU compute nodes have no usable operator shape (no op_class attribute: 2; gemm without " \
           "positive gemm_k: 1)" in message
    assert "1 more carry neither an operator shape nor num_ops/tensor_size and replay their recorded durations" \
        in message and "trace generate llm" in message
    model = KernelModel(device("H100"))
    from compute.shapes import GemmShape, OpShape

    expected = (3 * model.time_ns(None, 10**12, 10**8) + model.time_ns(OpShape("gemm", gemm=GemmShape(4096, 4096,
                                                                                                   4096)), 0, 0)
                + 7000)
    assert result.ranks[0].compute_ns == expected
    with pytest.raises(Exception, match="refused under --strict"):
        simulate(tmp_path, [nodes, nodes], RING2, device="H100", compute_model="kernels", strict=True)


def test_a_trace_of_recorded_durations_only(tmp_path: Path) -> None:
    """Durations without FLOPs or shapes (ASTRA-sim's 2.0-era ResNet-50 set): the kernel model replays them and
    says how many of how many nodes; the roofline that --device turned on refuses them naming --device, not a
    system key the user never set."""
    nodes = [make_node(i, f"conv{i}", NodeType.COMP_NODE, duration_micros=5) for i in range(3)]
    warnings: list[str] = []
    result = simulate(tmp_path, [nodes, nodes], RING2, warn=warnings.append, device="H100", compute_model="kernels")
    assert result.ranks[0].compute_ns == 15_000
    (message,) = [w for w in warnings if "--compute-model kernels" in w]
    assert "3 of 3 GPU compute nodes carry neither an operator shape nor num_ops/tensor_size and replay their " \
           "recorded durations" in message
    with pytest.raises(Exception, match="--device turns the roofline model on: leave it out to replay the recorded "
                                        "durations, or add --compute-model kernels"):
        simulate(tmp_path, [nodes, nodes], RING2, device="H100")
    system = {"roofline-enabled": 1, "peak-perf": 900, "local-mem-bw": 3000}
    with pytest.raises(Exception, match=r"or set roofline-enabled to 0 in .* to replay durations"):
        simulate(tmp_path, [nodes, nodes], RING2, system)


def test_bad_names_list_the_valid_ones(traces: tuple[str, str]) -> None:
    prefix, net = traces
    done = run_cli("--workload", prefix, "--network", net, "--device", "H100", "--compute-model", "kernel")
    assert done.returncode == 1 and "unknown compute model 'kernel'; valid: roofline, kernels" in done.stderr
    done = run_cli("--workload", prefix, "--network", net, "--device", "X1", "--compute-model", "kernels")
    assert done.returncode == 1
    assert "unknown device 'X1'; valid: A100, H100, H200, H200NVL, B200, B300, GB200, GB300, MI300X" in done.stderr
    done = run_cli("--workload", prefix, "--network", net, "--compute-model", "kernels")
    assert done.returncode == 1 and "the kernels compute model needs a device: --device NAME" in done.stderr
    assert "Traceback" not in done.stderr


def test_sweep_axis_over_compute_models(tmp_path: Path) -> None:
    spec = {"name": "cm", "base": {"workload": {"generate": "llm", "preset": "llama3-8b", "num_layers": 1,
                                                "global_batch": 2, "tp": 2, "pp": 1, "dp": 1},
                                   "network": {"topology": ["Switch"], "npus_count": [2], "bandwidth": [450],
                                               "latency": [500]},
                                   "options": {"device": "H100"}},
            "axes": {"options.compute_model": ["roofline", "kernels"]}}
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_cli("sweep", str(path), "--out", str(tmp_path / "out"), "--jobs", "1")
    assert done.returncode == 0, done.stderr
    csv_path = tmp_path / "cm.csv"
    assert run_cli("sweep", "export", str(tmp_path / "out"), "--csv", str(csv_path)).returncode == 0
    text = csv_path.read_text()
    assert "kernels" in text and "roofline" in text


def test_uncalibrated_devices_say_so(traces: tuple[str, str]) -> None:
    prefix, net = traces
    warnings: list[str] = []
    api_simulate(prefix, net, device="TPUv4", compute_model="kernels", warn=warnings.append)
    assert any("device TPUv4: no kernel measurements calibrate its kernel parameters (they are H100's)" in w
               for w in warnings)


def test_ranks_read_as_variants_of_one_trace_run_under_the_kernel_model(tmp_path: Path) -> None:
    """Two context-parallel ranks: the second trace is read as a variant of the first, after the kernel model
    cached its times on the first (a key that is not a text); the folded run equals the message engine's."""
    spec = {"generate": "llm", "num_layers": 2, "hidden_size": 256, "num_heads": 8, "num_kv_heads": 8,
            "ffn_hidden_size": 512, "vocab_size": 1000, "seq_len": 64, "cp": 2, "global_batch": 1}
    (tmp_path / "w.yaml").write_text(json.dumps(spec))
    (tmp_path / "n.yml").write_text(json.dumps({"topology": ["Ring"], "npus_count": [2], "bandwidth": [400.0],
                                                "latency": [500.0]}))
    runs = [api_simulate(str(tmp_path / "w.yaml"), str(tmp_path / "n.yml"), device="H100", compute_model="kernels",
                         collective_model="nccl", hw_profile="hgx-h100", engine=engine)
            for engine in ("auto", "message")]
    assert runs[0].ranks == runs[1].ranks and runs[0].ranks[0].finish_ns > 0


def _kernel_spans_us(tmp_path: Path, generate: list[str], device_name: str) -> dict[str, float]:
    """Generate a 2-rank trace (``generate``: the generator's flags), run it under the kernel model on
    ``device_name`` and return each span's duration by node name (us)."""
    done = run_cli("trace", "generate", "llm", *generate, "--npus", "2", "--name", "t", "--output", str(tmp_path))
    assert done.returncode == 0, done.stderr
    net = tmp_path / "net.yml"
    net.write_text("topology: [Switch]\nnpus_count: [2]\nbandwidth: [450]\nlatency: [500]\n")
    timeline = tmp_path / "timeline.json"
    done = run_cli("--workload", str(tmp_path / "t"), "--network", str(net), "--device", device_name,
                   "--compute-model", "kernels", "--timeline", str(timeline), "--quiet")
    assert done.returncode == 0, done.stderr
    events = json.loads(timeline.read_text())
    return {e["name"]: e["dur"] for e in (events["traceEvents"] if isinstance(events, dict) else events)
            if e.get("ph") == "X"}


def test_a_sliding_window_layer_is_timed_by_its_window(tmp_path: Path) -> None:
    """Every attention node of a run is timed as the kernel model times its trace shape, the window included: a
    sliding-window layer (GPT-OSS alternates them with full ones) costs its window's key blocks and its edge's
    masking, well under a full layer's (at window 128 and 4k tokens cuDNN's measured forward on GB300 takes 55% of
    the model's full causal one; the window attribute once got lost on its way from the trace to the model)."""
    spans_us = _kernel_spans_us(tmp_path, ["--layers", "2", "--hidden", "1024", "--heads", "8", "--kv-heads", "2",
                                           "--ffn-hidden", "3584", "--vocab", "32000", "--seq-len", "4096",
                                           "--window-size", "128", "--window-attn-skip-freq", "2", "--tp", "1", "--dp",
                                           "2", "--pp", "1", "--global-batch", "2", "--micro-batch-size", "1"], "H100")
    model = KernelModel(device("H100"))
    for layer, window in ((0, 128), (1, 0)):  # layer 0 windowed, layer 1 full
        for phase, backward in (("fwd", False), ("bwd", True)):
            shape = OpShape("attention", "bf16", attention=AttentionShape(1, 8, 2, 128, 4096, 4096, causal=True,
                                                                          backward=backward, window=window))
            want_us = model.time_ns(shape, 0, 0) / 1e3
            assert spans_us[f"mb0.{phase}.layer{layer}.attention"] == pytest.approx(want_us, abs=1e-3)
    assert spans_us["mb0.fwd.layer0.attention"] < spans_us["mb0.fwd.layer1.attention"] * 0.7


def test_per_expert_quantization_is_timed_by_its_kernel_count(tmp_path: Path) -> None:
    """An MXFP8 MoE layer's expert-input quantization (one kernel per local expert, Transformer Engine's
    split_quantize) is timed from the trace with a launch per kernel: the kernel count reaches the model."""
    spans_us = _kernel_spans_us(tmp_path, ["--layers", "1", "--hidden", "1024", "--heads", "8", "--ffn-hidden", "512",
                                           "--vocab", "32000", "--seq-len", "1024", "--experts", "16", "--top-k", "2",
                                           "--ep", "2", "--dp", "2", "--global-batch", "2", "--precision", "fp8",
                                           "--fp8-recipe", "mxfp8"], "B200")
    span_us = spans_us["mb0.fwd.layer0.expert_in_input_quantize"]
    model = KernelModel(device("B200"))
    elements = 1024 * 2 * 1024  # tokens x top-k arriving on the rank, by the hidden size
    size = round(elements * (2 + 2 * (1 + 1 / 32)))
    want = model.time_ns(OpShape("quantize", "fp8", kernels=8), 2 * elements, size) / 1e3
    assert span_us == pytest.approx(want, abs=1e-3)
    assert span_us > model.time_ns(OpShape("quantize", "fp8"), 2 * elements, size) / 1e3
