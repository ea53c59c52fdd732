"""Runs whose hardware flags disagree say so once, naming the flags (QA R6): FP8 work on a device without FP8 (an
A100) runs at its BF16 rate, and --device and --hw-profile can name different GPUs (compute timed on one,
collectives on the other)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cli import main

SMALL = ["--layers", "2", "--hidden", "256", "--heads", "8", "--ffn-hidden", "512", "--vocab", "1000", "--seq-len",
         "64", "--global-batch", "2", "--quiet"]


def _warnings(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(list(argv)) == 0
    return [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]


def _traces(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, *flags: str) -> str:
    assert main(["trace", "generate", "llm", *SMALL, *flags, "-o", str(tmp_path / name)]) == 0
    capsys.readouterr()
    return str(tmp_path / name / "custom")


def _network(tmp_path: Path, counts: str) -> str:
    path = tmp_path / "net.yml"
    dims = len(counts.split(","))
    path.write_text(f"topology: [{', '.join(['Switch'] * dims)}]\nnpus_count: [{counts}]\n"
                    f"bandwidth: [{', '.join(['50'] * dims)}]\nlatency: [{', '.join(['500'] * dims)}]\n")
    return str(path)


@pytest.mark.parametrize("model", ["roofline", "kernels"])
def test_fp8_on_a_device_without_fp8_warns_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                model: str) -> None:
    fp8 = _traces(tmp_path, capsys, "fp8", "--tp", "2", "--precision", "fp8")
    bf16 = _traces(tmp_path, capsys, "bf16", "--tp", "2")
    network = _network(tmp_path, "2")
    run = ["--network", network, "--compute-model", model, "--quiet"]
    said = _warnings(capsys, "--workload", fp8, "--device", "A100", *run)
    assert len(said) == 1 and "--device A100 has no FP8 math" in said[0] and "at its BF16 rate" in said[0], said
    assert "'mb0.fwd.layer0.qkv'" in said[0] and ("--compute-model kernels" in said[0]) == (model == "roofline")
    assert _warnings(capsys, "--workload", fp8, "--device", "H100", *run) == []
    assert _warnings(capsys, "--workload", bf16, "--device", "A100", *run) == []


def test_fp4_on_a_device_without_fp4_names_one_with_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fp4 = _traces(tmp_path, capsys, "fp4", "--tp", "2", "--precision", "fp4")
    run = ["--network", _network(tmp_path, "2"), "--compute-model", "kernels", "--quiet"]
    said = _warnings(capsys, "--workload", fp4, "--device", "H100", *run)
    assert len(said) == 1 and "--device H100 has no FP4 math" in said[0] and "e.g. --device B200" in said[0], said
    assert "'mb0.fwd.layer0.qkv'" in said[0]  # a GEMM, not the quantization kernel before it
    assert _warnings(capsys, "--workload", fp4, "--device", "B200", *run) == []
    argv = ["trace", "generate", "llm", *SMALL, "--precision", "fp4", "-o", str(tmp_path / "gen")]
    said = _warnings(capsys, *argv, "--device", "H100")
    assert len(said) == 1 and "--precision fp4 with --device H100, which has no FP4 math" in said[0], said


def test_generating_fp8_for_a_device_without_fp8_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["trace", "generate", "llm", *SMALL, "--precision", "fp8", "-o", str(tmp_path)]
    said = _warnings(capsys, *argv, "--device", "A100")
    assert len(said) == 1 and "--precision fp8 with --device A100, which has no FP8 math" in said[0], said
    assert _warnings(capsys, *argv, "--device", "H100") == []


def test_device_and_hardware_profile_of_different_gpus_warn(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    traces = _traces(tmp_path, capsys, "t", "--tp", "8", "--dp", "2")
    run = ["--workload", traces, "--network", _network(tmp_path, "8, 2"), "--collective-model", "nccl", "--quiet"]
    said = _warnings(capsys, *run, "--device", "A100", "--hw-profile", "hgx-h100")
    assert len(said) == 1, said
    assert "--device A100 and --hw-profile hgx-h100 name different GPUs (A100 and H100-SXM5-80GB)" in said[0]
    assert "--hw-profile aws-p4d-a100 or" in said[0] and said[0].endswith("or --device H100")
    for device, profile in (("H100", "hgx-h100"), ("A100", "aws-p4d-a100"), ("A100", "dgx-a100")):
        assert _warnings(capsys, *run, "--device", device, "--hw-profile", profile) == [], (device, profile)


def test_mxfp8_on_a_device_without_it_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """MXFP8 runs only where the device file lists it (Blackwell, CDNA 4): elsewhere the generator says its GEMMs
    are timed as a run the GPU cannot make, and what it would run instead."""
    argv = ["trace", "generate", "llm", *SMALL, "-o", str(tmp_path)]
    mxfp8 = ["--precision", "fp8", "--fp8-recipe", "mxfp8"]
    said = _warnings(capsys, *argv, *mxfp8, "--device", "H100")
    assert len(said) == 1 and "MXFP8 GEMMs with --device H100, which has no MXFP8 math" in said[0], said
    assert "--fp8-recipe tensorwise or delayed" in said[0] and "e.g. --device B200" in said[0]
    for gpu in ("B200", "GB300", "MI355X"):
        assert _warnings(capsys, *argv, *mxfp8, "--device", gpu) == [], gpu
    assert _warnings(capsys, *argv, "--precision", "fp8", "--fp8-recipe", "tensorwise", "--device", "H100") == []
    said = _warnings(capsys, *argv, "--precision", "fp4", "--mxfp8-gemms", "qkv", "--device", "B200")
    assert said == []
