"""kvtop's text output in words, not internals (issue 24, item 5): no Python ``None`` in any line, counts with
thousands separators (not in JSON), ``kvtop report`` of a file that is not a recording exits 3 with one line,
``--help`` says sizes as sizes, a typo gets a "did you mean", and the examples write their recordings outside the
directory they run from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kv_publisher import SRC, Publisher, batch, removed, stored

from kvtop import run_summary
from kvtop.agent import summary_data
from kvtop.cli import main
from kvtop.records import Record, SourceId
from kvtop.session import Session
from kvtop.tiers import TierModel

ROOT = Path(__file__).resolve().parents[2]
NOT_JSON = "json: not valid JSON (Expecting value: line 1 column 1 (char 0))"


def _run(args: list[str], cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVTOP_")}
    environ.update(XDG_CONFIG_HOME=str(cwd / "xdg"), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "kvtop", *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------- no None

def test_headless_text_of_a_stream_without_meta_says_unknown_never_none() -> None:
    """An attached KV event stream names no model and no version (its meta as kvtop/sources/kv_events_zmq.py
    makes it): the header says so in words; the size advice without a curve lists no empty points."""
    session = Session(source=SourceId("zmq://127.0.0.1:5557", 0, ""), meta={"attached_to": "zmq://127.0.0.1:5557"})
    session.emit(Record("meta", {"engine": "vllm-format", "attach": "zmq", "endpoint": "tcp://127.0.0.1:5557",
                                 "tokens_per_block": 16}, SRC, 1.0))
    session.emit(batch(0, [stored([1, 2])], t=1.0))
    session.emit(batch(1, [removed([1])], t=2.0))
    text = run_summary.format_summary(run_summary.summary(session))
    assert "None" not in text, text
    lines = text.splitlines()
    assert lines[0] == "kvtop: KV event stream (engine not named), model unknown"
    assert "stream: 2 batches (seq 0..1), 0 lost, 0 replayed, 0 bad events" in lines
    assert not any(line.strip() == "hit rate by host size:" for line in lines), text
    # nothing heard at all: neither engine nor model is known
    empty = Session(source=SourceId("127.0.0.1:5558", 0, ""))
    said = run_summary.format_summary(run_summary.summary(empty))
    assert said.splitlines()[0] == "kvtop: engine unknown, model unknown"


def test_headless_text_of_an_agents_summaries_says_summaries_not_seq_none() -> None:
    """A fleet source folded from an agent's summaries has no batch sequence of its own ("seq None..None")."""
    local = TierModel()
    local.apply(batch(0, [stored([1, 2, 3])], t=1.0))
    remote = TierModel()
    src = SourceId("node-7:5557", 0, "r")
    remote.apply(Record("summary", summary_data(local, 0, 0.5, "agent-x"), src, 1.0))
    remote.apply(Record("summary", summary_data(local, 3, 0.5, "agent-x"), src, 2.0))
    text = run_summary.format_summary(remote.summary())
    assert "None" not in text, text
    assert "stream: 2 summaries from an agent, 2 lost" in text.splitlines()


@pytest.mark.slow
def test_no_none_from_attach_replay_and_report_of_a_stream_without_model_or_gpu(tmp_path: Path) -> None:
    """End to end, real processes: kvtop attached to a real ZMQ publisher (no model, no GPU, no version in its
    meta), recording; the recording replayed headless (no GPU record in it) and reported; a file that is not a
    recording replayed. No line of stdout, stderr or the report's page says None."""
    pub = Publisher(replay=False)
    rec = tmp_path / "stream.jsonl"
    try:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KVTOP_")}
        environ.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "kvtop", "attach", pub.url, "--headless", "--duration", "4",
                                 "--record", str(rec)], cwd=tmp_path, env=environ, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        pub.wait_subscribed()
        for i in range(5):
            pub.send([stored([10 * i + 1, 10 * i + 2])])
        pub.send([removed([1])])
        out, err = proc.communicate(timeout=120)
    finally:
        pub.close()
    assert proc.returncode == 0, err
    said = {"attach": out + err}
    assert out.splitlines()[0] == "kvtop: KV event stream (engine not named), model unknown"
    assert "stream: 6 batches (seq 0..5), 0 lost, 0 replayed, 0 bad events" in out.splitlines()
    replay = _run(["replay", str(rec), "--headless", "--speed", "0"], tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.splitlines()[0] == "kvtop: KV event stream (engine not named), model unknown"
    said["replay"] = replay.stdout + replay.stderr
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\nworld\n")
    not_recording = _run(["replay", str(junk), "--headless", "--speed", "0"], tmp_path)
    assert not_recording.returncode == 3, not_recording.stderr
    said["replay of a text file"] = not_recording.stdout + not_recording.stderr
    report = _run(["report", str(rec), "-o", str(tmp_path / "rep")], tmp_path)
    assert report.returncode == 0, report.stderr
    said["report"] = report.stdout + report.stderr
    said["report page"] = (tmp_path / "rep" / "index.html").read_text()
    for what, text in said.items():
        assert "None" not in text, (what, text)


# ---------------------------------------------------------------------------------------------- separators

def test_headless_text_counts_have_thousands_separators_json_none() -> None:
    s: dict[str, Any] = {"engine": "sim", "engine_version": "1.2", "model": "Qwen/Qwen3-8B",
                         "requests": {"completed": 1234567, "failed": 1001, "ttft_ms": {}},
                         "tiers": {"gpu": {"capacity_blocks": 101256, "in_use_blocks": 2048, "cached_blocks": 99999,
                                           "free_blocks": 99208}},
                         "moves": {"offloaded_blocks": 1234567, "onboarded_blocks": 2000, "evicted_gpu_blocks": 16016,
                                   "evicted_host_blocks": 0},
                         "stream": {"batches": 12345, "first_seq": 4711, "last_seq": 17055, "lost_batches": 1000,
                                    "replayed_batches": 2500, "bad_events": 1234},
                         "sources": {**{f"node-{i}:5557/0/r": "connected" for i in range(1000)},
                                     **{f"gone-{i}:5557/0/r": "offline" for i in range(1012)}}}
    lines = run_summary.format_summary(s).splitlines()
    assert lines[0] == "kvtop: kvtop's TensorRT-LLM simulator (1.2), model Qwen/Qwen3-8B"
    assert "requests: 1,234,567 completed, 1,001 failed; TTFT p50 n/a, p99 n/a" in lines
    assert " gpu: capacity 101,256 blocks, in use 2,048, cached 99,999, free 99,208" in lines
    assert "moves: offloaded 1,234,567, onboarded 2,000, evicted GPU 16,016, evicted host 0" in lines
    # a sequence number is a name, not a count: as the engine numbers it
    assert "stream: 12,345 batches (seq 4711..17055), 1,000 lost, 2,500 replayed, 1,234 bad events" in lines
    sources = next(line for line in lines if line.startswith("sources: "))
    assert sources.startswith("sources: 2,012, gone-0:5557/0/r offline, ")
    assert sources.endswith(", gone-9:5557/0/r offline (+1,002 more not connected)")
    assert '"completed": 1234567' in json.dumps(s)  # JSON keeps numbers as numbers


def test_sim_table_counts_have_thousands_separators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 10 * i, "input_length": 1024, "output_length": 2,
                                         "hash_ids": [i % 5, 50 + i % 5]}) + "\n" for i in range(15)))
    # 8 GB of Qwen3-8B's 32-token blocks (147,456 bytes a token): int(8e9 / 147456 / 32) = 1,695 blocks
    assert main(["sim", "--trace", str(trace), "--gpu-blocks", "128", "--host-cache", "8GB", "--hit-rate-only"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("host"))
    assert "(  1,695 blocks): hit rate" in row, row


# ---------------------------------------------------------------------------------------------- report: exit 3

def test_report_of_a_file_that_is_not_a_recording_exits_3_with_one_line(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n" * 1200)
    out_dir = tmp_path / "rep"
    assert main(["report", str(junk), "-o", str(out_dir)]) == 3
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"kvtop report: not a kvtop recording: {junk} (1,200 lines, none a kvtop "
                                         f"record; line 1: {NOT_JSON})"]
    assert captured.out == ""
    assert not out_dir.exists()  # nothing written
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", str(empty), str(junk), "-o", str(out_dir)]) == 3
    assert capsys.readouterr().err.splitlines() == [
        f"kvtop report: not kvtop recordings: {empty} (empty), {junk} (1,200 lines, none a kvtop record; line 1: "
        f"{NOT_JSON})"]


# ---------------------------------------------------------------------------------------------- --help

def test_help_says_every_size_default_as_a_size_that_reads_back(capsys: pytest.CaptureFixture[str]) -> None:
    from kvtop.engines.sizing import parse_size
    from kvtop.options import shown
    from kvtop.settings import Settings

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert ("--host-cache SIZE host (pinned DRAM) KV cache size, e.g. 10GB, 512MiB, 0 to disable (default: 32 GB)"
            in text)
    assert "32000000000" not in text
    sizes = [f for f in Settings.option_fields() if f.metadata.get("kind") == "size"]
    assert {f.name for f in sizes} == {"host_cache", "disk_cache"}
    for f in sizes:
        said = shown(f.default, "size")
        assert f"(default: {said})" in text
        assert parse_size(said) == f.default


def test_sim_help_names_the_host_cache_sweep_as_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--host-cache SIZES host cache size, or a comma list for a sweep" in text
    assert "HOST_CACHE_SWEEP" not in text  # the option's internal name


@pytest.mark.parametrize(("size", "said"), [(32 * 10**9, "32 GB"), (8 * 2**30, "8 GiB"), (1536 * 2**20, "1536 MiB"),
                                            (10**12, "1 TB"), (2**40, "1 TiB"), (1234567, "1234567 B"), (0, "0")])
def test_a_size_is_said_exactly_and_reads_back(size: int, said: str) -> None:
    from kvtop.engines.sizing import parse_size, size_text

    assert size_text(size) == said
    assert parse_size(said) == size


def test_show_settings_says_sizes_and_not_set(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for key in [k for k in os.environ if k.startswith("KVTOP_")]:
        monkeypatch.delenv(key)
    assert main(["--show-settings", "--disk-cache", "1.5GiB"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert rows["host_cache"].split() == ["host_cache", "32", "GB", "default"]
    assert rows["disk_cache"].split() == ["disk_cache", "1536", "MiB", "command", "line"]
    assert rows["record"].split() == ["record", "not", "set", "default"]
    assert "None" not in out


# ---------------------------------------------------------------------------------------------- did you mean

TYPOS = [
    (["--hots-cache", "10GB"], "kvtop: unrecognized arguments: --hots-cache 10GB (did you mean --host-cache?)"),
    (["run.jsonl"], "kvtop: unknown command 'run.jsonl' (a recording? kvtop replay run.jsonl); commands: sim, "
                    "attach, replay, agent, estimate, calibrate, report, run (kvtop --help)"),
    (["xyzzy"], "kvtop: unknown command 'xyzzy'; commands: sim, attach, replay, agent, estimate, calibrate, report, "
                "run (kvtop --help)"),  # nothing close: no guess
    (["repaly", "run.jsonl"], "kvtop: unknown command 'repaly' (did you mean 'replay'?); commands: sim, attach, "
                              "replay, agent, estimate, calibrate, report, run (kvtop --help)"),
    (["attach", "run.jsonl", "--hedless", "--jsn"],
     "kvtop attach: unrecognized arguments: --hedless --jsn (did you mean --headless for --hedless, --json for "
     "--jsn?)"),
    (["report", "run.jsonl", "--ot", "x"], "kvtop report: unrecognized arguments: --ot x (did you mean --out?)"),
    (["--engine", "trtlm", "--show-settings"],
     "kvtop: --engine: must be one of auto, trtllm, sim, got 'trtlm' (did you mean 'trtllm'?)"),
    (["estimate", "--model", "Qwen3-8", "--gpu", "H200"],
     "kvtop estimate: unknown model 'Qwen3-8' (did you mean Qwen/Qwen3-8B?); known models: "),
    (["estimate", "--model", "Qwen/Qwen3-8B", "--gpu", "H20"],
     "kvtop estimate: unknown GPU 'H20' (did you mean H200?); known GPUs: H200, H100, GH200, or a profile .json "
     "file from `kvtop calibrate`"),
    (["sim", "--trace", "nothing.jsonl", "--model", "llama-3-8b"],
     "kvtop: --model: unknown model 'llama-3-8b' (did you mean meta-llama/Llama-3.1-8B?); known models: "),
]


@pytest.mark.parametrize(("argv", "line"), TYPOS, ids=[" ".join(a) for a, _ in TYPOS])
def test_a_typo_gets_did_you_mean_and_exit_2(argv: list[str], line: str, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    if line.endswith("known models: "):  # the list of every known model follows
        assert err[0].startswith(line), err[0]
    else:
        assert err[0] == line


def test_a_sink_error_of_attach_names_its_option_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Error lines in words: "--record: --record: cannot write" and "sink: --prometheus-port: ..." were the
    option said twice, or an internal name where the option goes."""
    import socket

    rec = tmp_path / "run.jsonl"
    rec.write_text(json.dumps({"v": 1, "kind": "meta", "source": {"host": "h", "rank": 0, "run": ""}, "time": 1.0,
                               "data": {"engine": "vllm-format"}}) + "\n")
    missing = tmp_path / "no" / "such" / "dir" / "out.jsonl"
    assert main(["replay", str(rec), "--headless", "--record", str(missing)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"kvtop: --record: cannot write {missing}: No such file or "
                                                    "directory"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["replay", str(rec), "--headless", "--prometheus-port", str(port)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"kvtop: --prometheus-port: cannot listen on 127.0.0.1:{port}: "
                                                    "Address already in use"]


# ---------------------------------------------------------------------------------------------- examples

@pytest.mark.slow
def test_watch_example_records_outside_the_directory_it_runs_from(tmp_path: Path) -> None:
    """Run from a checkout (here an empty directory standing for one), the example leaves nothing in it: the
    recording goes to a new temporary directory, named on stdout."""
    here = tmp_path / "checkout"
    temp = tmp_path / "tmp"
    here.mkdir()
    temp.mkdir()
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(temp)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "watch_my_script.py")], cwd=here, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(here.iterdir()) == [], "the example wrote into the directory it ran from"
    made = list(temp.glob("kvtop-example-*/watch_my_script.jsonl"))
    assert len(made) == 1 and made[0].stat().st_size > 0, list(temp.rglob("*"))
    assert f"recorded to {made[0]}; replay it with: kvtop replay {made[0]}" in done.stdout


# ---------------------------------------------------------------------------------------------- the engine's words

TRTLLM_WORDS = ("TensorRT", "trtllm", "freeNumBlocks", "host_cache_size", "event_buffer_max_size", "freeChildren",
                "offload-on-evict", "reusedBlocks")


@pytest.mark.slow
def test_a_vllm_streams_text_replay_and_report_name_no_tensorrt_llm_field_and_say_what_gives_the_hit_rate(
        tmp_path: Path) -> None:
    """Real processes: kvtop attached to a real ZMQ publisher (vLLM's wire, no /metrics), recording; the recording
    replayed headless and reported. None of it names TensorRT-LLM's fields (the report's page said hit rates were
    "TensorRT-LLM's reusedBlocks / (reused + missed)"), and each says why the hit rate is unknown and what gives it;
    a TensorRT-LLM recording's page still names its fields."""
    pub = Publisher(replay=False)
    rec = tmp_path / "stream.jsonl"
    try:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KVTOP_")}
        environ.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "kvtop", "attach", pub.url, "--headless", "--duration", "4",
                                 "--record", str(rec)], cwd=tmp_path, env=environ, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        pub.wait_subscribed()
        for i in range(5):
            pub.send([stored([10 * i + 1, 10 * i + 2]), stored([10 * i + 1], medium="CPU")])
        pub.send([removed([1])])
        out, err = proc.communicate(timeout=120)
    finally:
        pub.close()
    assert proc.returncode == 0, err
    why = (f"KV events carry no lookups; add the engine's /metrics: zmq://127.0.0.1:{pub.port}?metrics="
           "http://127.0.0.1:8000/metrics (or vllm://127.0.0.1:8000)")
    said = {"attach": out + err}
    assert f"hit rate: unknown (GPU unknown, host unknown); {why}" in out.splitlines(), out
    replay = _run(["replay", str(rec), "--headless", "--speed", "0"], tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert f"hit rate: unknown (GPU unknown, host unknown); {why}" in replay.stdout.splitlines(), replay.stdout
    said["replay"] = replay.stdout + replay.stderr
    report = _run(["report", str(rec), "-o", str(tmp_path / "rep")], tmp_path)
    assert report.returncode == 0, report.stderr
    assert why in report.stdout, report.stdout
    said["report"] = report.stdout + report.stderr
    page = said["report page"] = (tmp_path / "rep" / "index.html").read_text()
    assert "Hit rates are block-based (reused blocks / blocks looked up, as the engine counts them)" in page
    assert why.replace("'", "&#x27;") in page
    for what, text in said.items():
        assert not [w for w in TRTLLM_WORDS if w in text], (what, text)
    trt = _run(["report", str(ROOT / "tests" / "data" / "busy.jsonl"), "-o", str(tmp_path / "busy")], tmp_path)
    assert trt.returncode == 0, trt.stderr
    assert "(TensorRT-LLM's reusedBlocks / (reused + missed))" in (tmp_path / "busy" / "index.html").read_text()
    assert "carry no lookups" not in trt.stdout


def test_kvtops_help_says_which_engines_it_drives_and_which_it_watches(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvtop --help` said "LLM inference engines (TensorRT-LLM)": a vLLM or SGLang user read that kvtop was not
    for them. Its options drive TensorRT-LLM or the simulator; attach watches the others, sglang:// included."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(TensorRT-LLM) " not in text
    assert ("These options drive TensorRT-LLM (or kvtop's simulator of it); kvtop attach watches vLLM, SGLang, "
            "Dynamo and trtllm-serve." in text)
    assert "kvtop attach URL watch a run elsewhere: vllm://, sglang://, zmq://, http:// (trtllm-serve)" in text


def test_a_verdict_not_priced_says_so_once() -> None:
    """A stream without a model (no cost model): the header read "verdict host: 386 loads, not priced (not priced)"
    and the headless text "...; not priced: no cost model for model ? (...) (not priced: no cost model for model ?
    (...))"."""
    from kvtop.tiers.verdict import decide
    from kvtop.ui.panels.header import VerdictLine, verdict_line

    v = decide("host", -1, 178, 866, None, 0, None, 0, None, None, 16)
    assert v.says == "unknown" and v.basis.startswith("not priced")
    line = VerdictLine(v.says, v.text(), v.basis.split(":", 1)[0], v.short_text(), "host")
    for width in (200, 120, 80):
        shown = "".join(t for t, _ in verdict_line((line,), width))
        assert shown.count("not priced") == 1, (width, shown)
    text = run_summary.format_summary({"verdict": {"host": v.to_json()}})
    said = next(ln for ln in text.splitlines() if ln.startswith("verdict: "))
    assert said.count("not priced") == 1, said
