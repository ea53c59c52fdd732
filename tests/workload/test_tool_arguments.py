"""The trace tools from the command line: inspection tools show any decodable trace, writers check their
arguments and estimate their output before writing, untimed compute is never silent, and user text reaching a
terminal is escaped."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from simulator.cli import main
from tests.conftest import run_cli, write_trace_file
from tests.workload.test_hostile_traces import CHAKRA_FAMILIES, chakra_generated
from workload.errors import printable
from workload.schema import CollectiveType, NodeType
from workload.tools import generate as gen
from workload.writer import make_node

TEXT = Path(__file__).parent / "fixtures" / "text"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``astrasim-py ARGV`` in this process (the CLI's own code, without a subprocess's start-up time)."""
    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    status, _, err = run(capsys, *argv)
    assert status == 1 and err.count("\n") == 1 and err.startswith("astrasim-py: error: "), err
    return err


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A prefix per trace family of the official Chakra generator."""
    folder = chakra_generated(tmp_path_factory.mktemp("chakra"))
    names = sorted({p.name.split(".")[0] for p in folder.glob("*.et")})
    assert len(names) == CHAKRA_FAMILIES, names
    return [folder / name for name in names]


def test_every_official_generator_family_is_shown_by_every_inspection_tool(
        families: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for prefix in families:
        status, out, err = run(capsys, "trace", "jsonize", str(prefix))
        assert status == 0, err
        doc = json.loads(out)
        assert [r["rank"] for r in doc["ranks"]] == [0, 1] and all(r["nodes"] for r in doc["ranks"])
        for argv in (["inspect", "--json"], ["inspect", "--per-rank"], ["analyze"], ["analyze", "--json"],
                     ["visualize", "-o", str(tmp_path / f"{prefix.name}.graphml")],
                     ["visualize", "-o", str(tmp_path / f"{prefix.name}.dot"), "--rank", "1"]):
            status, out, err = run(capsys, "trace", argv[0], str(prefix), *argv[1:])
            assert status == 0 and "error" not in err, (prefix.name, argv, err)


def test_the_official_metadata_node_reads_as_chakra_wrote_it(families: list[Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    prefix = next(p for p in families if p.name == "one_metadata_node_all_types")
    status, out, _ = run(capsys, "trace", "jsonize", str(prefix), "--rank", "0")
    assert status == 0
    attrs = {a["name"]: a for a in json.loads(out)["ranks"][0]["nodes"][0]["attr"]}
    assert len(attrs) == 30
    assert attrs["sint64"] == {"name": "sint64", "sint64_val": -9876543210}
    assert attrs["sfixed32_list"]["sfixed32_list"] == [12345, -23456]
    assert attrs["bool_list"]["bool_list"] == [i % 2 == 0 for i in range(10)]
    assert attrs["bytes_list"]["bytes_list"][0] == "MTIzNDU="  # base64 of b"12345"
    assert attrs["float"]["float_val"] == pytest.approx(1.2345, rel=1e-6)


def test_inspect_says_what_would_stop_a_simulation(families: list[Path]) -> None:
    send = next(p for p in families if p.name == "one_comm_send_node")
    done = run_cli("trace", "inspect", str(send))
    assert done.returncode == 0, done.stderr
    assert "nodes by type: COMM_SEND_NODE 2" in done.stdout  # over both ranks
    assert "would not simulate as is:" in done.stdout and "without its 'comm_dst' attribute" in done.stdout


def test_inspect_shows_cycles_unknown_types_and_mistyped_attributes(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [make_node(1, "a", 4, data_deps=[3]), make_node(2, "b", 4, data_deps=[1]), make_node(3, "c", 4,
             data_deps=[2]), make_node(4, "odd", 42), make_node(5, "coll", NodeType.COMM_COLL_NODE,
             attrs=[("comm_type", 77), ("comm_size", "string_val", "1MB"), ("pg_name", "int64_val", 5)])]
    write_trace_file(tmp_path / "t.0.et", nodes)
    status, out, err = run(capsys, "trace", "inspect", str(tmp_path / "t"), "--json")
    assert status == 0, err
    rank = json.loads(out)["ranks"][0]
    assert rank["nodes_by_type"] == {"COMP_NODE": 3, "COMM_COLL_NODE": 1, "42": 1}
    assert rank["collectives"] == {"77": {"0": 1}} and "unknown node type 42" in rank["problem"]
    status, out, err = run(capsys, "trace", "analyze", str(tmp_path / "t"), "--by-group", "--json")
    assert status == 0 and json.loads(out)["ranks"][0]["collective_bytes"] == {"5/77": 0}, err


# ---- visualize -------------------------------------------------------------------------------------------------

NASTY = ['plain', 'quote " and backslash \\ and brace }', "line\nbreak\ttab\x00nul\x1b[31mred\x07",
         "bidi \u202e and \ufffe noncharacter"]


@pytest.fixture
def nasty_trace(tmp_path: Path) -> Path:
    nodes = [make_node(i + 1, name, 4, data_deps=[i] if i else []) for i, name in enumerate(NASTY)]
    write_trace_file(tmp_path / "t.0.et", nodes)
    return tmp_path / "t"


def test_visualize_picks_the_format_from_the_extension_or_refuses(nasty_trace: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, "trace", "visualize", str(nasty_trace), "-o", str(tmp_path / "graph.png"))
    assert ".graphml, .dot, .gv" in err and not (tmp_path / "graph.png").exists()
    assert run(capsys, "trace", "visualize", str(nasty_trace), "-o", str(tmp_path / "g.GV"))[0] == 0
    assert (tmp_path / "g.GV").read_text().startswith("digraph ")
    assert run(capsys, "trace", "visualize", str(nasty_trace), "-o", str(tmp_path / "g.png"), "--format",
               "graphml")[0] == 0
    ET.parse(tmp_path / "g.png")  # GraphML, as asked


def test_graphml_with_control_characters_in_names_is_valid_xml(nasty_trace: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.graphml"
    assert run(capsys, "trace", "visualize", str(nasty_trace), "-o", str(out))[0] == 0
    root = ET.parse(out).getroot()  # raises on characters XML 1.0 forbids
    texts = {d.text for d in root.iter() if d.tag.endswith("data")}
    assert {printable(name) for name in NASTY} <= texts


DOT_TOKEN = re.compile(r'\s+|"(?:[^"\\\n]|\\.)*"|->|[\[\]{}=,;]|[A-Za-z_][A-Za-z0-9_.]*|-?[0-9]+')


def test_dot_names_are_quoted_safely(nasty_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.dot"
    assert run(capsys, "trace", "visualize", str(nasty_trace), "-o", str(out))[0] == 0
    text = out.read_text()
    tokens, pos = [], 0
    while pos < len(text):  # the whole file is DOT tokens: no string breaks out of its quotes
        m = DOT_TOKEN.match(text, pos)
        assert m is not None, text[pos : pos + 40]
        tokens.append(m.group())
        pos = m.end()
    labels = [t[1:-1] for t in tokens if t.startswith('"')][1:]  # the first is the graph's title
    unquoted = [re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], lb) for lb in labels]
    assert unquoted == [f"{i + 1}: {printable(name)}\nCOMP_NODE" for i, name in enumerate(NASTY)]
    assert all(ch.isprintable() or ch == "\n" for ch in text)


# ---- writers check their arguments ----------------------------------------------------------------------------

BAD_GENERATE = [
    (["compute", "--npus", "2", "--count", "-1"], "--count must be at least 1"),
    (["compute", "--npus", "2", "--count", "0"], "--count must be at least 1"),
    (["compute", "--npus", "0"], "NPU counts must be positive"),
    (["compute", "--npus", "2", "--duration-us", "-5"], "--duration-us must be at least 0"),
    (["compute", "--npus", "2", "--duration-us", str(2**63)], "--duration-us must be at most"),
    (["compute", "--npus", "2", "--num-ops", "-1"], "--num-ops must be at least 0"),
    (["compute", "--npus", "2", "--tensor-size", "-1"], "not a size"),
    (["compute", "--npus", "2", "--name", "../x"], "would write outside"),
    (["compute", "--npus", "2", "--name", "/tmp/abs"], "must be a relative name"),
    (["sendrecv", "--npus", "2", "--size", "1MiB", "--iterations", "0"], "--iterations must be at least 1"),
    (["sendrecv", "--npus", "1", "--size", "1MiB"], "needs at least 2 NPUs"),
    (["memory", "--npus", "2", "--tensor-size", "1KiB", "--count", "0"], "--count must be at least 1"),
    (["collective", "--type", "all_reduce", "--size", "1MiB", "--npus", "2", "--repeat", "0"],
     "--repeat must be at least 1"),
    (["collective", "--type", "all_reduce", "--size", "99999999999TiB", "--npus", "2"], "larger than 2^63-1"),
    (["collective", "--type", "all_reduce", "--size", "1.5", "--npus", "2"], "not a whole number of bytes"),
    (["collective", "--type", "all_reduce", "--size", "1MiB", "--npus", "2,-1"], "NPU counts must be positive"),
    (["collective", "--type", "all_reduce", "--size", "1MiB", "--npus", "100000"],
     "would write 100,000 files"),
    (["collective", "--type", "all_reduce", "--size", "1MiB", "--npus", "2", "--max-files", "1"],
     "the limit is 1 files"),
    (["compute", "--npus", "100", "--count", "10000000"], "the limit is 16.0 GiB"),
    (["compute", "--npus", "4", "--count", "100", "--max-bytes", "1KiB"], "raise it with --max-bytes"),
    (["llm", "--preset", "gpt3-1.3b", "--layers", "2", "--name", "../x"], "would write outside"),
    (["llm", "--preset", "gpt3-1.3b", "--dp", "1000000000"], "would write 1,000,000,000 files"),
    (["llm", "--preset", "gpt3-1.3b", "--micro-batches", "1000000000"], "TiB in 1 file(s)"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_GENERATE, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_generate_refuses_bad_arguments_before_writing(argv: list[str], message: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    err = one_line_error(capsys, "trace", "generate", *argv, "-o", str(out))
    assert message in err, err
    assert not out.exists() and not (tmp_path / "x.0.et").exists()


def test_raised_limits_let_the_same_request_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "trace", "generate", "collective", "--type", "all_reduce", "--size", "1KiB",
                           "--npus", "2", "--max-files", "2", "-o", str(tmp_path))
    assert status == 0 and out.split() == [str(tmp_path / "all_reduce" / "2npus_1KiB" / "all_reduce")], err


def test_the_output_estimate_is_close_to_what_is_written(tmp_path: Path) -> None:
    for name, traces in (("c", gen.collective(3, CollectiveType.ALL_REDUCE, 1 << 20, repeat=50, pg_name="7")),
                         ("s", gen.sendrecv_ring(3, 4096, iterations=40)),
                         ("m", gen.compute(3, 200, duration_micros=5, num_ops=10**12, tensor_size=1 << 30))):
        written = sum(Path(p).stat().st_size for p in gen.write_rank_traces(str(tmp_path / name), traces))
        assert 0.9 * written <= traces.estimated_bytes() <= 1.2 * written, (name, written)


@pytest.fixture
def two_ranks(tmp_path: Path) -> Path:
    gen.write_rank_traces(str(tmp_path / "in" / "t"), gen.collective(2, CollectiveType.ALL_REDUCE, 1 << 20))
    return tmp_path / "in" / "t"


def test_rescale_synthesize_and_convert_check_their_arguments(two_ranks: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out" / "t")
    cases = [
        (["rescale", str(two_ranks), "--npus", "0", "-o", out], "--npus must be at least 1"),
        (["rescale", str(two_ranks), "--npus", "100000000", "-o", out], "would write 100,000,000 files"),
        (["rescale", str(two_ranks), "--npus", "4", "--max-bytes", "100", "-o", out], "the limit is 100 B"),
        (["synthesize", str(two_ranks), "--seed", "-1", "-o", out], "--seed must be at least 0"),
        (["synthesize", str(two_ranks), "--npus", "100000000", "-o", out], "would write 100,000,000 files"),
        (["synthesize", str(two_ranks), "--device", "H100", "-o", out], "only used with --compare"),
        (["convert", "text", str(TEXT / "data.txt"), "--num-npus", "0", "-o", out], "--num-npus must be at least 1"),
        (["convert", "text", str(TEXT / "data.txt"), "--num-npus", "2", "--num-passes", "-3", "-o", out],
         "--num-passes must be at least 1"),
        (["convert", "text", str(TEXT / "data.txt"), "--num-npus", "70000", "-o", out], "would write 70,000 files"),
        (["convert", "text", str(TEXT / "data.txt"), "--num-npus", "8", "--num-passes", "1000000000", "-o", out],
         "the limit is 16.0 GiB"),
    ]
    for argv, message in cases:
        err = one_line_error(capsys, "trace", *argv)
        assert message in err, (argv, err)
        assert not (tmp_path / "out").exists(), argv
    status, _, err = run(capsys, "trace", "rescale", str(two_ranks), "--npus", "4", "-o", out)
    assert status == 0 and (tmp_path / "out" / "t.3.et").exists(), err


# ---- untimed compute ------------------------------------------------------------------------------------------

def _llm(folder: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[Path, str]:
    status, _, err = run(capsys, "trace", "generate", "llm", "--preset", "gpt3-1.3b", "--layers", "2", "--dp", "2",
                         "--name", "m", "-o", str(folder), *extra)
    assert status == 0, err
    return folder / "m", err


def test_generate_llm_without_a_device_says_how_to_time_the_compute(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, err = _llm(tmp_path / "a", capsys)
    assert "no duration" in err and "--device NAME (e.g. --device H100)" in err
    _, err = _llm(tmp_path / "b", capsys, "--device", "H100")
    assert "--device" not in err


def test_synthesize_compare_never_calls_untimed_compute_within_tolerance(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    prefix, _ = _llm(tmp_path / "llm", capsys)
    net = tmp_path / "ring2.yml"
    net.write_text("topology: [ Ring ]\nnpus_count: [ 2 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    base = ["trace", "synthesize", str(prefix), "--compare", "--network", str(net), "--seed", "1"]
    status, out, err = run(capsys, *base, "-o", str(tmp_path / "s1" / "t"))
    assert status == 0, err
    assert "iteration time (communication only)" in out and "within tolerance" not in out
    assert "overall: not judged" in out and "--device NAME" in out
    status, out, err = run(capsys, *base, "-o", str(tmp_path / "s2" / "t"), "--json")
    fidelity = json.loads(out)["fidelity"]
    assert status == 0 and fidelity["ok"] is False and fidelity["compute_timed"] is False
    assert fidelity["untimed_compute_nodes"] > 0
    status, out, err = run(capsys, *base, "-o", str(tmp_path / "s3" / "t"), "--json", "--device", "H100")
    fidelity = json.loads(out)["fidelity"]
    assert status == 0 and fidelity["compute_timed"] is True and fidelity["untimed_compute_nodes"] == 0, err
    assert any(m["name"] == "iteration time" and m["ok"] is not None for m in fidelity["metrics"])


# ---- terminal output ------------------------------------------------------------------------------------------

def test_control_characters_reach_no_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "dir\x1b[2J"
    folder.mkdir()
    nodes: list[Any] = [make_node(1, "n\x1b]0;title\x07", NodeType.COMM_COLL_NODE,
                                  attrs={"comm_type": 0, "comm_size": 8, "pg_name": "g\x1b[31m"})]
    write_trace_file(folder / "t.0.et", nodes)
    write_trace_file(folder / "t.1.et", [])
    for argv in (["inspect", "--per-rank"], ["analyze", "--by-group"], ["visualize", "-o", str(folder / "g.dot")]):
        status, out, err = run(capsys, "trace", argv[0], str(folder / "t"), *argv[1:])
        assert status == 0, err
        assert "\x1b" not in out + err and "\\x1b" in out, (argv, out)
    status, out, err = run(capsys, "trace", "generate", "compute", "--npus", "1", "--name", "c\x1bx", "-o",
                           str(folder))
    assert status == 0 and out == printable(str(folder / "c\x1bx")) + "\n", err


def test_generated_ranks_can_be_changed_like_lists_before_writing(tmp_path: Path) -> None:
    from workload.reader import read_trace

    traces = gen.collective(3, CollectiveType.ALL_REDUCE, 1024, repeat=2)
    traces[1] = traces[1][:1]
    traces[2].append(make_node(2, "extra", NodeType.COMP_NODE, data_deps=[1], duration_micros=4))
    gen.write_rank_traces(str(tmp_path / "t"), traces)
    assert [read_trace(tmp_path / f"t.{r}.et").num_nodes for r in range(3)] == [2, 1, 3]
    assert traces == [traces[0], traces[1], traces[2]] and len(traces[0:2]) == 2
