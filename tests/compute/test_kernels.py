"""The kernel compute model: monotone in every dimension and in the device's peaks, efficiencies in (0, 1], FP8
faster than BF16, the device files' figures reproduced from the published kernel data they were fitted on."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compute.devices import DEVICES, Device, device
from compute.kernel_data import GENERATION_CLASSES, GENERATIONS_TABLE, generation_class, generation_pairs, read_tables
from compute.kernels import KernelModel
from compute.shapes import DTYPES, AttentionShape, GemmShape, OpShape
from workload.errors import ConfigError, InputError

NAMES = sorted(DEVICES)
dims = st.integers(1, 1 << 15)
dtypes = st.sampled_from(["bf16", "fp16", "fp8", "tf32", "fp32"])


def gemm(m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16") -> OpShape:
    return OpShape("gemm", dtype, gemm=GemmShape(m, n, k, batch))


def attention(batch: int, heads: int, head_dim: int, seq: int, causal: bool, backward: bool, dtype: str = "bf16",
              seq_kv: int | None = None) -> OpShape:
    return OpShape("attention", dtype, attention=AttentionShape(batch, heads, max(1, heads // 4), head_dim, seq,
                                                                seq_kv or seq, causal, backward))


def scaled(d: Device, peak: float, bandwidth: float) -> Device:
    return replace(d, peaks_tflops={k: v * peak for k, v in d.peaks_tflops.items()},
                   memory_bw_GBps=d.memory_bw_GBps * bandwidth)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(NAMES), dims, dims, dims, st.integers(1, 64), dtypes, st.integers(0, 3), st.integers(1, 5000))
def test_gemm_time_never_falls_as_a_dimension_grows(name: str, m: int, n: int, k: int, batch: int, dtype: str,
                                                    which: int, more: int) -> None:
    model = KernelModel(device(name))
    shape = [m, n, k, batch]
    base = model.seconds(gemm(*shape, dtype=dtype), 0, 0)
    shape[which] += more
    grown = model.seconds(gemm(*shape, dtype=dtype), 0, 0)
    assert 0 < base <= grown < math.inf


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMES), st.integers(1, 16), st.sampled_from([4, 8, 16, 32, 64]), st.sampled_from([64, 80, 128]),
       st.integers(1, 1 << 15), st.booleans(), st.booleans(), st.integers(1, 4096), st.integers(0, 3))
def test_attention_time_never_falls_with_more_tokens_or_heads(name: str, batch: int, heads: int, head_dim: int,
                                                              seq: int, causal: bool, backward: bool, more: int,
                                                              which: int) -> None:
    model = KernelModel(device(name))
    args = [batch, heads, head_dim, seq]
    base = model.seconds(attention(*args, causal, backward), 0, 0)
    args[which] += more if which in (0, 3) else (more % 4 + 1) * (heads if which == 1 else 16)
    assert 0 < base <= model.seconds(attention(*args, causal, backward), 0, 0) < math.inf


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMES), st.sampled_from(["gemm", "attention", "norm", "elementwise", "optimizer", "loss", None]),
       dims, dims, st.floats(1.0, 8.0), st.floats(1.0, 8.0))
def test_faster_devices_are_never_slower_and_efficiency_is_a_fraction(name: str, kind: str | None, a: int, b: int,
                                                                      peak: float, bandwidth: float) -> None:
    shape = {"gemm": gemm(a, b, 4096), "attention": attention(1, 8, 128, a, True, bool(b % 2))}.get(
        kind or "", OpShape(kind) if kind else None)
    num_ops, size = a * b * 8, a * b * 2
    base = KernelModel(device(name))
    faster = KernelModel(scaled(device(name), peak, bandwidth))
    assert faster.seconds(shape, num_ops, size) <= base.seconds(shape, num_ops, size) * (1 + 1e-12)
    for model in (base, faster):
        assert 0 < model.efficiency(shape, num_ops, size) <= 1


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([n for n in NAMES if device(n).has("fp8")]), dims, dims, dims)
def test_fp8_is_faster_than_bf16_where_the_device_has_it(name: str, m: int, n: int, k: int) -> None:
    model = KernelModel(device(name))
    assert model.seconds(gemm(m, n, k, dtype="fp8"), 0, 0) <= model.seconds(gemm(m, n, k, dtype="bf16"), 0, 0)
    big = gemm(8192, 8192, 8192)
    assert model.seconds(replace(big, dtype="fp8"), 0, 0) < 0.7 * model.seconds(big, 0, 0)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMES), dims, dims, dims, st.integers(1, 64), dtypes, st.sampled_from([2, 4]))
def test_adding_into_a_main_gradient_never_speeds_a_gemm_up(name: str, m: int, n: int, k: int, batch: int,
                                                            dtype: str, width: int) -> None:
    """A result added into a wider matrix (read and written) costs at least what writing it once does, and more
    the wider that matrix is."""
    model = KernelModel(device(name))
    once = model.seconds(gemm(m, n, k, batch, dtype), 0, 0)
    added = model.seconds(OpShape("gemm", dtype, gemm=GemmShape(m, n, k, batch, accumulate_bytes=width)), 0, 0)
    wider = model.seconds(OpShape("gemm", dtype, gemm=GemmShape(m, n, k, batch, accumulate_bytes=2 * width)), 0, 0)
    assert once <= added <= wider
    assert 0 < model.efficiency(OpShape("gemm", dtype, gemm=GemmShape(m, n, k, batch, accumulate_bytes=width)),
                                0, 0) <= 1


def test_a_weight_gradient_over_few_tokens_is_bound_by_its_main_gradient() -> None:
    """DeepSeek-V3's first expert GEMM at eight-way expert parallelism (32 local experts of 1,024 tokens) on B200:
    adding each gradient into a 16-bit main gradient moves 4 bytes per weight, against the 1 of an FP8 result
    written once; with 8,192 tokens per expert the product hides the traffic."""
    model = KernelModel(device("B200"))

    def wgrad(tokens: int, width: int) -> float:
        return model.seconds(OpShape("gemm", "fp8", gemm=GemmShape(7168, 4096, tokens, 32, accumulate_bytes=width)),
                             0, 0)
    assert wgrad(1024, 2) > 1.1 * wgrad(1024, 0)
    assert wgrad(8192, 2) < 1.03 * wgrad(8192, 0)


def test_fp8_on_a100_runs_at_the_bf16_rate() -> None:
    model = KernelModel(device("A100"))
    assert not device("A100").has("fp8")
    big = gemm(8192, 8192, 8192)
    assert model.seconds(replace(big, dtype="fp8"), 0, 0) == pytest.approx(model.seconds(big, 0, 0), rel=0.01)


def test_shapes_the_brief_names() -> None:
    """Large square GEMMs run at 70-86% of peak; tensor-parallel-split and small ones far lower; a skinny GEMM is
    memory bound; attention between its fitted ends; no work takes no time."""
    h100 = KernelModel(device("H100"))
    assert 0.70 <= h100.efficiency(gemm(8192, 8192, 8192), 0, 0) <= 0.86
    assert 0.70 <= KernelModel(device("A100")).efficiency(gemm(8192, 8192, 8192), 0, 0) <= 0.86
    assert 0.22 <= h100.efficiency(gemm(256, 1024, 8192), 0, 0) <= 0.5  # decode-size tokens, an 8-way TP split
    skinny = gemm(1, 28672, 8192)
    assert h100.seconds(skinny, 0, 0) == pytest.approx(28672 * 8192 * 2 / 3.35e12, rel=0.25)
    assert 0.45 <= h100.efficiency(attention(1, 32, 128, 8192, True, False), 0, 0) <= 0.75
    assert h100.time_ns(None, 0, 0) == 0 and h100.time_ns(OpShape("norm"), 0, 0) == 0


def test_knobs_scale_launch_and_efficiency() -> None:
    d = device("H100")
    slow = KernelModel(d.with_knobs(launch_overhead_us=5.0, efficiency_scale={"gemm": 0.5}))
    fast = KernelModel(d)
    big, small = gemm(8192, 8192, 8192), OpShape("norm")
    assert slow.seconds(big, 0, 0) > 1.9 * fast.seconds(big, 0, 0)
    assert slow.seconds(small, 0, 1000) == pytest.approx(fast.seconds(small, 0, 1000) + 5e-6)
    assert KernelModel(d.with_knobs(efficiency_scale={"gemm": 100})).efficiency(big, 0, 0) <= 1  # capped
    with pytest.raises(InputError, match="families gemm, attention, memory, fp8_gemm"):
        d.with_knobs(efficiency_scale={"conv": 2})


def test_fp8_gemm_scale_touches_fp8_gemms_only() -> None:
    d = device("H100")
    slow = KernelModel(d.with_knobs(efficiency_scale={"fp8_gemm": 0.5}))
    fast = KernelModel(d)
    fp8, bf16 = gemm(8192, 8192, 8192, dtype="fp8"), gemm(8192, 8192, 8192)
    assert slow.seconds(fp8, 0, 0) > 1.9 * fast.seconds(fp8, 0, 0)
    assert slow.seconds(bf16, 0, 0) == fast.seconds(bf16, 0, 0)
    both = KernelModel(d.with_knobs(efficiency_scale={"fp8_gemm": 0.5, "gemm": 0.5}))
    assert both.seconds(fp8, 0, 0) > 1.9 * slow.seconds(fp8, 0, 0)  # the two multiply


# --- golden figures: the device files reproduce the data they were fitted on --------------------------------------
ROWS = read_tables()


@pytest.mark.parametrize(("name", "family", "limit"), [
    ("A100", "gemm", 0.06), ("H100", "gemm", 0.075), ("A100", "attention", 0.03), ("H100", "attention", 0.10),
    ("A100", "memory", 0.22), ("H100", "memory", 0.27)])
def test_fitted_devices_hold_their_error_on_the_kernel_data(name: str, family: str, limit: float) -> None:
    d = device(name).kernel_fit()
    kernel_eff = d.calibration["fitted"]["attention"]["kernel_efficiency"]
    errs = []
    for m in ROWS:
        if device(m.device).name != name or m.family != family or m.table in ("mamf.tsv", GENERATIONS_TABLE):
            continue
        attention = replace(d.kernels.attention, efficiency=kernel_eff.get(m.kernel, 1.0))
        dd = replace(d, kernels=replace(d.kernels, attention=attention)) if m.kernel else d
        errs.append(m.predicted_us(KernelModel(dd)) / m.time_us - 1)
    assert len(errs) > 20
    assert sum(abs(e) for e in errs) / len(errs) <= limit
    # small bias (a log-time fit leaves the mean relative error slightly positive where the scatter is wide)
    assert abs(sum(errs) / len(errs)) <= (0.02 if family != "memory" else 0.1)


def test_golden_rows() -> None:
    """A few rows by hand: Llama-2-70B's MLP up-projection at 4,096 tokens on H100 (5.67 ms measured), a
    tensor-parallel-8 down-projection on A100, FlashAttention-2 on A100."""
    h100, a100 = KernelModel(device("H100")), KernelModel(device("A100"))
    assert h100.seconds(gemm(4096, 57344, 8192, dtype="fp16"), 0, 0) * 1e6 == pytest.approx(5668, rel=0.1)
    row = next(m for m in ROWS if m.device == "A100" and m.note.endswith("Llama-2-70b-hf tp8 mlp_down_proj")
               and m.shapes[0].gemm.m == 4096)
    assert row.predicted_us(a100) == pytest.approx(row.time_us, rel=0.1)
    fa2 = next(m for m in ROWS if m.device == "A100" and m.kernel == "fa2" and m.shapes[0].attention.seq_q == 8192
               and m.shapes[0].attention.head_dim == 128 and m.shapes[0].attention.causal)
    assert fa2.predicted_us(a100) == pytest.approx(fa2.time_us, rel=0.05)


@pytest.mark.parametrize(("name", "table", "kernel", "limit"), [
    ("B300", "te_gemm_profiling.tsv", "bf16", 0.05), ("B300", "te_gemm_profiling.tsv", "fp8_current", 0.05),
    ("B300", "te_gemm_profiling.tsv", "nvfp4", 0.05), ("B300", "te_gemm_profiling.tsv", "mxfp8", 0.05),
    ("GB200", "cudnn_sdpa.tsv", "cudnn", 0.06),
    ("GB300", "cudnn_sdpa.tsv", "cudnn", 0.06), ("B200", "cudnn_sdpa.tsv", "cudnn", 0.10),
    ("GB200", "cudnn_norm.tsv", "", 0.22), ("GB300", "cudnn_norm.tsv", "", 0.22)])
def test_blackwell_devices_hold_their_error_on_their_rows(name: str, table: str, kernel: str, limit: float) -> None:
    """The Blackwell files reproduce the NVIDIA rows they were fitted on (attention: the BF16 rows, what training
    runs; GEMMs: the recipes fitted, operands quantized beforehand), without a training-step calibration."""
    d = device(name).kernel_fit()
    model = KernelModel(d)
    rows = [m for m in ROWS if device(m.device).name == name and m.table == table and m.kernel == kernel
            and m.shapes[0].dtype in (("bf16",) if m.family == "attention" else DTYPES)]
    errs = [m.predicted_us(model) / m.time_us - 1 for m in rows]
    assert len(errs) >= 3
    assert sum(abs(e) for e in errs) / len(errs) <= limit
    assert abs(sum(errs) / len(errs)) <= 0.05


def test_blackwell_over_hopper_gemms_as_one_benchmark_times_them() -> None:
    """XLA's matmul table times the same 375 BF16 GEMMs on a B200-class and an H100-class GPU: the kernel fits'
    ratio of the two (what the Blackwell shape terms are fitted on) within 3% in every shape class, by the GEMM's
    smallest side."""
    pairs = generation_pairs(ROWS, "B200", "H100")
    assert len(pairs) == 375
    new, old = KernelModel(device("B200").kernel_fit()), KernelModel(device("H100").kernel_fit())
    ratios: dict[str, list[float]] = {}
    for a, b in pairs:
        ratios.setdefault(generation_class(a), []).append(math.log(a.predicted_us(new) / a.time_us)
                                                          - math.log(b.predicted_us(old) / b.time_us))
    assert sorted(ratios) == sorted(name for name, _ in GENERATION_CLASSES)
    for key, logs in ratios.items():
        assert abs(math.exp(sum(logs) / len(logs)) - 1) <= 0.03, key


def test_a_gemm_set_row_is_the_sum_of_its_gemms() -> None:
    row = next(m for m in ROWS if m.table == "te_gemm_profiling.tsv" and len(m.shapes) == 4)
    model = KernelModel(device(row.device))
    assert row.predicted_us(model) == pytest.approx(sum(model.seconds(s, 0, 0) for s in row.shapes) * 1e6)
    assert row.flops == sum(s.gemm.flops for s in row.shapes)


def test_blackwell_ultra_speeds_up_the_attention_forward_more_than_the_backward() -> None:
    """cuDNN on GB300 over GB200 (same peaks): forward 1.17-1.25x, backward 1.05-1.08x (BF16, causal, 8k); the
    kernel fits, before any training-step calibration."""
    gb200, gb300 = KernelModel(device("GB200").kernel_fit()), KernelModel(device("GB300").kernel_fit())
    fwd, bwd = (gb200.seconds(attention(2, 64, 128, 8192, True, b), 0, 0)
                / gb300.seconds(attention(2, 64, 128, 8192, True, b), 0, 0) for b in (False, True))
    assert 1.12 <= fwd <= 1.3 and 1.0 <= bwd <= 1.12 and bwd < fwd
    assert device("B300").kernels.attention == replace(device("GB300").kernels.attention,
                                                       launch_us=device("B300").kernels.attention.launch_us)


def test_blackwell_streams_at_the_bandwidth_fraction_measured() -> None:
    """Element-wise and optimizer kernels at 75-85% of 8 TB/s on Blackwell (H100's fit stays at its own)."""
    for name in ("B200", "B300", "GB200", "GB300"):
        eff = device(name).kernels.memory.efficiency
        assert 0.75 <= eff["elementwise"] == eff["optimizer"] <= 0.85, name
    assert device("GB200").compute_units == device("GB300").compute_units == 152


def test_device_files_are_what_the_fit_writes() -> None:
    """Refitting gives the shipped files' parameters and residuals (deterministic, and nobody hand-edited them); a
    device-level efficiency scale is neutral unless the file's training calibration records it."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fit_kernel_model.py"
    spec = importlib.util.spec_from_file_location("fit_kernel_model", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    for name, (fitted, calibration) in module.fit_all(ROWS).items():
        shipped = device(name)
        assert fitted.kernels == shipped.kernel_fit().kernels, name
        assert calibration["residuals"] == shipped.calibration["residuals"], name
        scales = {shipped.kernels.scale(f) for f in ("gemm", "attention", "memory")}
        assert scales == {shipped.training_calibration.get("efficiency_scale", 1.0)}, name
        assert shipped.kernels.launch_overhead_us == 0.0 and shipped.kernels.scale("fp8_gemm") == 1.0, name
        assert not module.write(fitted, calibration, check=True), f"{name}: not in the form the fit writes"


# --- device files -------------------------------------------------------------------------------------------------
def test_devices_by_name_alias_and_file(tmp_path: Path) -> None:
    assert device("h800").name == "H100" and device("GH200").name == "H200" and device("mi-300x").name == "MI300X"
    assert device(device("B200").path).kernels == device("B200").kernels
    with pytest.raises(InputError, match=r"unknown device 'H900'; valid: A100, H100, H200, H200NVL, B200, B300, GB200, "
                                         r"GB300, MI300X, MI325X, MI355X, TPUv4, TPUv5p or a device file"):
        device("H900")
    with pytest.raises(InputError, match="no such device file"):
        device(str(tmp_path / "nope.yml"))


def test_mxfp8_gemms_run_at_the_fp8_peak_at_their_own_efficiency() -> None:
    """Blackwell: MXFP8 at its fitted share of per-tensor FP8's speed (the block scales' handling), never faster;
    a device without MXFP8 runs the GEMM as FP8 (Hopper), a device with it but no efficiency of its own at FP8's."""
    big = gemm(8192, 8192, 8192, dtype="fp8")
    for name in ("B200", "B300", "GB200", "GB300"):
        d = device(name)
        eff = d.kernels.gemm.dtype_efficiency
        assert d.has("mxfp8") and d.math_dtype("mxfp8") == "mxfp8" and d.peak_flops("mxfp8") == d.peak_flops("fp8")
        model = KernelModel(d)
        ratio = model.seconds(replace(big, dtype="mxfp8"), 0, 0) / model.seconds(big, 0, 0)
        assert ratio == pytest.approx(eff["fp8"] / eff["mxfp8"], rel=0.02) and 1.03 < ratio < 1.08, name
    h100 = device("H100")
    assert not h100.has("mxfp8") and h100.math_dtype("mxfp8") == "fp8"
    assert KernelModel(h100).seconds(replace(big, dtype="mxfp8"), 0, 0) == KernelModel(h100).seconds(big, 0, 0)
    mi355x = device("MI355X")
    assert mi355x.has("mxfp8") and "mxfp8" not in mi355x.kernels.gemm.dtype_efficiency
    assert KernelModel(mi355x).seconds(replace(big, dtype="mxfp8"), 0, 0) == KernelModel(mi355x).seconds(big, 0, 0)
    assert device("A100").math_dtype("mxfp8") == "bf16"


def test_b200_grouped_mxfp8_gemms_against_torchaos_measured_ones() -> None:
    """The check rows (not fitted): DeepSeek-V3's expert GEMMs on B200 as torchao's scaled grouped GEMMs run them;
    the shipped file (with its training factor) within 6% on the forward and input gradient; the weight gradient
    (a kernel its source calls unoptimised) measured slower than the model has it."""
    model = KernelModel(device("B200"))
    rows = [m for m in ROWS if m.table == "torchao_grouped_gemm.tsv"]
    assert len(rows) == 3 and all(m.shapes[0].dtype == "mxfp8" and m.shapes[0].gemm.batch == 8 for m in rows)
    errs = [m.predicted_us(model) / m.time_us - 1 for m in rows]
    assert all(abs(e) <= 0.06 for e in errs[:2]) and errs[2] < min(errs[:2])


def test_block_scaled_formats_are_the_hardwares() -> None:
    """MXFP8 and NVFP4 on Blackwell, MXFP8 and MXFP4 on CDNA 4, none before them."""
    for name in ("B200", "B300", "GB200", "GB300"):
        assert device(name).block_scaled == ("mxfp8", "mxfp4", "nvfp4"), name
    assert device("MI355X").block_scaled == ("mxfp8", "mxfp4")
    for name in ("A100", "H100", "H200", "MI300X", "MI325X", "TPUv5p"):
        assert device(name).block_scaled == (), name


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("memory_bw_GBps: 3350.0", "memory_bw_GBps: -1"), "'memory_bw_GBps' must be above 0"),
    (lambda t: t.replace("efficiency: 0.", "efficiency: 1.", 1), "'kernels.gemm.efficiency' must be above 0 and at "
                                                                  "most 1"),
    (lambda t: t.replace("fp8: 1978.9", "int4: 1978.9"), "unknown precision"),
    (lambda t: t.replace("compute_units: 132", "compute_units: many"), "'compute_units' must be a whole number"),
    (lambda t: t + "colour: blue\n", "unknown key"),
    (lambda t: t + "block_scaled: [mxfp9]\n", "unknown format"),
])
def test_bad_device_files_say_file_and_key(tmp_path: Path, edit: object, message: str) -> None:
    text = Path(device("H100").path).read_text()
    bad = tmp_path / "bad.yml"
    bad.write_text(edit(text))  # type: ignore[operator]
    with pytest.raises(ConfigError, match=f"bad.yml: .*{message}"):
        device(str(bad))


def windowed(batch: int, heads: int, head_dim: int, seq: int, window: int, backward: bool) -> OpShape:
    return OpShape("attention", "bf16", attention=AttentionShape(batch, heads, heads, head_dim, seq, seq, True,
                                                                 backward, window=window))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMES), st.integers(1, 8), st.sampled_from([8, 64, 128]), st.sampled_from([64, 128]),
       st.integers(1, 1 << 15), st.integers(1, 8192), st.booleans(), st.integers(1, 4096))
def test_a_sliding_window_costs_no_more_than_causal_and_grows_with_the_sequence(
        name: str, batch: int, heads: int, head_dim: int, seq: int, window: int, backward: bool, more: int) -> None:
    model = KernelModel(device(name))
    time = model.seconds(windowed(batch, heads, head_dim, seq, window, backward), 0, 0)
    assert 0 < time <= model.seconds(windowed(batch, heads, head_dim, seq, 0, backward), 0, 0) * (1 + 1e-12)
    assert time <= model.seconds(windowed(batch, heads, head_dim, seq + more, window, backward), 0, 0) * (1 + 1e-12)


@pytest.mark.parametrize(("name", "window", "limit"),
                         [("GB200", 128, 0.12), ("GB300", 128, 0.12), ("H200", 1024, 0.15)])
def test_sliding_window_rows(name: str, window: int, limit: float) -> None:
    """cuDNN's GPT-OSS sliding-window rows (the window cost's fit: window 128 on Blackwell, 1024 on H200 for H100)
    within 12-15% from 2k to 16k tokens, both passes; the window's edge costs a forward and a backward tile the same
    time; B200 and B300 take their SM's cost, H100 H200's."""
    d = device(name).kernel_fit()
    model = KernelModel(d)
    rows = [m for m in ROWS if m.device == name and m.table == "cudnn_sdpa_models.tsv" and m.shapes[0].attention.window]
    assert len(rows) == 10 and all(m.shapes[0].attention.window == window for m in rows)
    for m in rows:
        if m.shapes[0].attention.seq_q <= 16384:
            assert m.predicted_us(model) == pytest.approx(m.time_us, rel=limit), m.note
    p = d.kernels.attention
    assert p.window_tile_cost > 0
    without = KernelModel(replace(d, kernels=replace(d.kernels, attention=replace(p, window_tile_cost=0.0))))
    extra = [model.seconds(shape, 0, 0) - without.seconds(shape, 0, 0)
             for shape in (windowed(2, 64, 64, 4096, 128, b) for b in (False, True))]
    assert extra[0] > 0 and extra[0] == pytest.approx(extra[1], rel=0.25)  # the backward's waves may round apart
    sibling = {"GB200": "B200", "GB300": "B300", "H200": "H100"}[name]
    assert device(sibling).kernels.attention.window_tile_cost == p.window_tile_cost
    # a wider window amortises the edge: at 1,024 keys at most an eighth of the extra at 128 (fewer tiles reach it)
    wide = [model.seconds(windowed(2, 64, 64, 8192, w, False), 0, 0)
            - without.seconds(windowed(2, 64, 64, 8192, w, False), 0, 0) for w in (128, 1024)]
    assert 0 < wide[1] <= wide[0] / 8


@pytest.mark.parametrize("name", ["GB200", "GB300"])
def test_wide_heads_backward_on_blackwell(name: str) -> None:
    """cuDNN's latent-attention rows (DeepSeek-V3, Kimi: query/key head dim 192, value 128, timed as their mean 160)
    within 10% on average, forward (unfitted) and backward (its head-dim exponent's fit); head dims up to 128 keep
    the backward they had; Hopper has no wider-head rows and keeps its backward."""
    d = device(name).kernel_fit()
    model = KernelModel(d)
    rows = [m for m in ROWS if m.device == name and m.kernel == "cudnn_mla"]
    assert len(rows) == 40 and all(m.shapes[0].attention.head_dim == 160 for m in rows)
    errs = [m.predicted_us(model) / m.time_us - 1 for m in rows]
    assert sum(abs(e) for e in errs) / len(errs) <= 0.10 and abs(sum(errs) / len(errs)) <= 0.05
    p = d.kernels.attention
    assert p.backward_head_dim_exponent > 0
    flat = KernelModel(replace(d, kernels=replace(d.kernels, attention=replace(p, backward_head_dim_exponent=0.0))))
    for head_dim, slower in ((128, False), (160, True)):
        for backward in (False, True):
            shape = attention(2, 64, head_dim, 4096, True, backward)
            assert (model.seconds(shape, 0, 0) > flat.seconds(shape, 0, 0)) == (slower and backward)
    sibling = {"GB200": "B200", "GB300": "B300"}[name]
    assert device(sibling).kernels.attention.backward_head_dim_exponent == p.backward_head_dim_exponent
    assert device("H100").kernels.attention.backward_head_dim_exponent == 0
