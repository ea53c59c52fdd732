"""Workloads without files: generator mappings (``generate: llm`` and microbenchmarks) built in memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.api import simulate
from simulator.sweep.spec import load_sweep
from tests.conftest import run_cli
from workload.errors import InputError
from workload.generated import generated_traces, workload_traces

TINY = {"generate": "llm", "preset": "gpt3-1.3b", "num_layers": 2, "tp": 2, "pp": 2, "dp": 2, "global_batch": 4}
NETWORK = {"topology": ["Switch", "Switch"], "npus_count": [4, 2], "bandwidth": [400.0, 50.0],
           "latency": [500.0, 1000.0]}


def write_yaml(path: Path, data: dict) -> str:
    path.write_text(json.dumps(data))  # JSON is YAML
    return str(path)


def network_file(tmp_path: Path) -> str:
    return write_yaml(tmp_path / "net.yml", NETWORK)


def test_generated_llm_equals_the_written_traces(tmp_path: Path) -> None:
    """The same iteration from a generator file and from `trace generate llm` files: the same result per rank."""
    workload = write_yaml(tmp_path / "llm.yaml", TINY)
    done = run_cli("trace", "generate", "llm", "--preset", "gpt3-1.3b", "--layers", "2", "--tp", "2", "--pp", "2",
                   "--dp", "2", "--global-batch", "4", "-o", str(tmp_path / "files"))
    assert done.returncode == 0, done.stderr
    prefix = done.stdout.splitlines()[0]
    net = network_file(tmp_path)
    generated = simulate(workload, net, device="H100")
    written = simulate(prefix, net, device="H100")
    assert generated.finish_ns > 0 and generated.ranks == written.ranks
    assert all(p.parent.name == "files" for p in tmp_path.glob("**/*.et"))  # nothing written for the generated one


def test_generated_workload_on_the_command_line(tmp_path: Path) -> None:
    workload = write_yaml(tmp_path / "ar.yml", {"generate": "collective", "type": "all_reduce", "size": "1MiB"})
    done = run_cli("--workload", workload, "--network", network_file(tmp_path), "--json", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["finish_ns"] > 0 and result["run"]["engine"] == "symmetric"
    assert "generated" in result["config"]["workload"]


@pytest.mark.parametrize(("change", "message"), [
    ({"tp": 4}, "the plan has 16 ranks"),
    ({"pipeline": 2}, "unknown key(s) pipeline"),
    ({"tp": "two"}, "'tp' must be a whole number"),
    ({"zero": 5}, "'zero' must be a whole number (one of 0, 1, 2, 3)"),
    ({"generate": "lm"}, "'generate' must be one of llm"),
])
def test_bad_generator_mappings_name_the_key(change: dict, message: str) -> None:
    with pytest.raises(InputError) as e:
        generated_traces({**TINY, **change}, 8, "w.yaml")
    assert message in str(e.value) and str(e.value).startswith("w.yaml: ")


def test_a_yaml_workload_must_be_a_generator(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="must be a generator mapping"):
        workload_traces(write_yaml(tmp_path / "x.yaml", {"preset": "gpt3-1.3b"}), 8)


def test_sweep_axes_over_the_layout(tmp_path: Path) -> None:
    """workload.tp / pp / dp are sweep axes of a generated llm workload; every point is its own layout."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(json.dumps({
        "base": {"workload": TINY, "network": NETWORK, "options": {"device": "H100"}},
        "axes": {"workload.tp": [2, 4], "workload.pp": [2, 1]},
        "zip": [["workload.tp", "workload.pp"]]}))
    spec = load_sweep(str(sweep))
    assert spec.count == 2
    done = run_cli("sweep", str(sweep), "--out", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 0, done.stderr
    done = run_cli("sweep", "export", str(tmp_path / "out"), "--csv", str(tmp_path / "x.csv"))
    rows = (tmp_path / "x.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",ok," in row for row in rows[1:])


def test_the_flags_own_spellings_are_keys_too(tmp_path: Path) -> None:
    """`layers`, `kv_heads`, `tensor_model_parallel_size`, ... (the flags of `trace generate llm --help`, _ for -)
    name the same settings as the destinations (num_layers, num_kv_heads, tp); both at once is refused."""
    net = network_file(tmp_path)
    by_dest = simulate(write_yaml(tmp_path / "a.yaml", TINY), net, device="H100")
    spelled = {k: v for k, v in TINY.items() if k not in ("num_layers", "tp")}
    by_flag = simulate(write_yaml(tmp_path / "b.yaml", {**spelled, "layers": 2, "tensor_model_parallel_size": 2}),
                       net, device="H100")
    assert by_flag.ranks == by_dest.ranks
    with pytest.raises(InputError, match="'num_layers' and 'layers' name the same setting; give one"):
        generated_traces({**TINY, "layers": 2}, 8, "w.yaml")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(json.dumps({"base": {"workload": TINY, "network": NETWORK, "options": {"device": "H100"}},
                                 "axes": {"workload.kv_heads": [8, 16]}}))
    assert load_sweep(str(sweep)).count == 2


def test_a_generated_collective_runs_without_a_one_file_warning_and_trace_tools_say_what_it_is(
        tmp_path: Path) -> None:
    """Every rank runs the same generated collective, but no file was given: the 'one trace file for all ranks'
    warning (meant for a single .et file) is not printed. The trace tools, which read files, say what the YAML
    is and how to get its traces, on one line, instead of 'not a Chakra ET file'."""
    workload = write_yaml(tmp_path / "ar.yml", {"generate": "collective", "type": "all_reduce", "size": "1MiB"})
    done = run_cli("--workload", workload, "--network", network_file(tmp_path), "--quiet")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    for tool in ("inspect", "analyze", "jsonize"):
        shown = run_cli("trace", tool, workload)
        assert shown.returncode == 1 and shown.stderr.count("\n") == 1, shown.stderr
        assert "a YAML file, not a Chakra trace" in shown.stderr and "trace generate KIND" in shown.stderr


def test_building_every_rank_shows_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building or reading every rank's trace is a step of its own: 32 ranks of a 40,000-node GPT-3 13B layout took
    a minute with no line at all before the run's first progress line (now one every 10 s, from 5 s)."""
    import workload.traceset as traceset

    monkeypatch.setattr(traceset, "PROGRESS_FIRST_S", 0.0)
    monkeypatch.setattr(traceset, "PROGRESS_EVERY_S", 0.0)
    traces = workload_traces(write_yaml(tmp_path / "w.yaml", TINY), 8)
    lines: list[str] = []
    graphs = traceset.TraceLoader().load_set(traces, 8, lines.append)
    assert len(graphs) == 8
    assert [line.split(",")[0] for line in lines] == [f"building traces: {n} of 8 ranks" for n in range(2, 9)]
