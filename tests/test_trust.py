"""Issue 10, "trust off the happy path": bounds at the record boundary, the problems registry, the sanitizer,
exit statuses, and failures that must be visible in every mode (stderr, JSON, exit status)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvtop.problems import EXIT_LOST_DATA, EXIT_NO_DATA, Problems
from kvtop.records import MAX_BLOCKS, RecordError, SourceId, decode, decode_payload, encode, make, read_jsonl
from kvtop.textsafe import clean, clean_lines
from kvtop.ui import format as fmt

ROOT = Path(__file__).resolve().parent.parent
BUSY = ROOT / "tests" / "data" / "busy.jsonl"
T0 = 1764430000.0


def kvtop_cli(*args: str, timeout: float = 60, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m kvtop ARGS`` in a subprocess, this tree first on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("KVTOP_MQTT_PASSWORD", None)
    return subprocess.run([sys.executable, "-m", "kvtop", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or ROOT)


def stats_line(free: Any = 10, t: Any = T0, **kv: Any) -> str:
    return json.dumps({"v": 1, "kind": "stats", "source": {"host": "h", "rank": 0, "run": "r"}, "time": t,
                       "data": {"iter": 1, "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": free, **kv}}})


# ---------------------------------------------------------------------------------------------- sanitizer

HOSTILE = [
    "\x1b]0;pwned\x07",                       # OSC 0: retitle the window
    "\x1b]52;c;Y3VybCBldmlsfHNo\x07",         # OSC 52: write the clipboard
    "\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\",       # ... with ST instead of BEL
    "\x1b[2J\x1b[H",                          # clear the screen, cursor home
    "\x9b2J",                                 # the same, as an 8-bit C1 CSI
    "\x9d0;pwned\x9c",                        # 8-bit OSC
    "\x1bP1$r\x1b\\",                         # DCS
    "\x1b[31mred\x1b[0m",
    "a\x00b\x07c\x08d\x7fe",
    "\u202eevil\u202c",                       # bidi override
    "\x1b]8;;http://x\x07link\x1b]8;;\x07",   # OSC 8 hyperlink
    "\x1b",                                   # a lone ESC
]


@pytest.mark.parametrize("text", HOSTILE)
def test_clean_removes_escape_sequences_and_controls(text: str) -> None:
    out = clean(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0x202A <= ord(c) <= 0x202E for c in out), repr(out)
    assert "52;" not in out and "0;pwned" not in out  # a sequence's parameters go with it


def test_clean_lines_cleans_each_line_and_keeps_the_lines() -> None:
    text = "model e\x1b]0;pwned\x07vil\x1b[2J on H200\n\nMemory\t140 GiB\x9b2J\n"
    assert clean_lines(text) == "model evil on H200\n\nMemory 140 GiB\n"
    plain = "a\nb" * 200  # no control character: the same string, not cut at 200 characters
    assert clean_lines(plain) is plain


def test_clean_keeps_printable_text_of_any_script() -> None:
    for text in ("Qwen/Qwen3-8B", "gpu-07/0/ab-host10g", "モデル-名前 🚀", "exp_$1_$2", "naïve [bold]x[/]"):
        assert clean(text) == text
    assert clean("a\tb\nc") == "a b c"
    assert clean("x" * 1000) == "x" * 197 + "..." and len(clean("x" * 1000, None)) == 1000
    assert clean("\x1b[31mred\x1b[0m text") == "red text"


@given(st.text())
def test_clean_never_leaves_a_control_character(text: str) -> None:
    out = clean(text, None)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0x202A <= ord(c) <= 0x202E
                   or 0x2066 <= ord(c) <= 0x2069 for c in out)
    if all(0x20 <= ord(c) < 0x7F for c in text):
        assert out == text  # plain ASCII passes untouched


def test_records_clean_the_envelope_and_kvtops_own_kinds_but_keep_engine_dicts() -> None:
    rec = decode(json.dumps({"v": 1, "kind": "meta", "source": {"host": "h\x1b]0;t\x07", "rank": 0,
                                                                 "run": "r\x1b[2J"}, "time": T0,
                             "data": {"engine": "trtllm\x1b]52;c;eA==\x07", "model": "m\x9b2J"}}))
    assert rec.source == SourceId("h", 0, "r")
    assert rec.data == {"engine": "trtllm", "model": "m"}
    stats = decode(json.dumps({"v": 1, "kind": "stats", "time": T0, "data": {"timestamp": "t\x1b"}}))
    assert stats.data["timestamp"] == "t\x1b"  # an engine's dict is verbatim (the recording is the bug report)
    local = make("request", {"request_id": 1, "ok": False, "error": "boom\x1b[2J"})
    assert local.data["error"] == "boom"


# ---------------------------------------------------------------------------------------------- bounds

@pytest.mark.parametrize("line, field", [
    (stats_line(free=1e308), "data.kvCacheStats.freeNumBlocks"),
    (stats_line(free=10 ** 400), "data.kvCacheStats.freeNumBlocks"),
    (stats_line(free=MAX_BLOCKS + 1), "data.kvCacheStats.freeNumBlocks"),
    (stats_line(usedNumBlocks=2 ** 41), "data.kvCacheStats.usedNumBlocks"),
    (stats_line().replace('"iter": 1', '"iter": 1e400'), "data.iter"),         # parses as inf
    (stats_line().replace('"iter": 1', '"iter": NaN'), "data.iter"),           # Python's json takes NaN
    (stats_line().replace('"iter": 1', '"iter": -Infinity'), "data.iter"),
    (stats_line().replace('"iter": 1', '"iter": ' + "9" * 5000), "json"),      # past Python's int digit limit
    (stats_line(t=T0 * 1000), "time"),                                         # milliseconds
    (stats_line(t=T0 * 1e6), "time"),                                          # microseconds
    (stats_line(t=-5.0), "time"),
    (stats_line(t=10 ** 400), "time"),
])
def test_absurd_values_are_a_record_error(line: str, field: str) -> None:
    with pytest.raises(RecordError) as info:
        decode(line)
    assert info.value.field == field, str(info.value)


def test_bounds_name_the_field_and_keep_real_values() -> None:
    with pytest.raises(RecordError, match="milliseconds"):
        decode(stats_line(t=T0 * 1000))
    created = {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [10, 2 ** 41]}}
    with pytest.raises(RecordError, match=r"num_blocks_per_cache_level.*2\^40"):
        make("kv_event", created)
    with pytest.raises(RecordError, match="primary_blocks"):
        make("meta", {"engine": "x", "primary_blocks": 2 ** 50})
    # What real engines send passes: 64-bit hashes, signed ones, a 2 TiB host, 2^40 blocks exactly.
    make("kv_event", {"event_id": 1, "data": {"type": "removed", "block_hashes": [2 ** 64 - 1, -(2 ** 63)]}})
    make("host", {"system_total_bytes": 2 * 2 ** 40})
    decode(stats_line(free=MAX_BLOCKS))
    for rec in read_jsonl(BUSY):
        assert not isinstance(rec, RecordError)


def test_a_bad_element_of_a_batch_payload_is_one_error() -> None:
    payload = "[" + stats_line() + "," + stats_line(free=1e308) + "]"
    with pytest.raises(RecordError, match=r"\[1\]\.data\.kvCacheStats\.freeNumBlocks"):
        decode_payload(payload)
    with pytest.raises(RecordError, match="limit"):
        decode_payload(b"[" + b" " * 2000 + b"]", max_bytes=1000)


def test_a_huge_line_costs_no_more_than_the_limit(tmp_path: Path) -> None:
    """A NUL-filled recording (a crashed filesystem, a hostile file): one bad line, memory bounded by the
    limit, not by the file (64 MiB of NULs and a 1 MiB limit: ~4 MiB at peak, the limit and a chunk twice)."""
    path = tmp_path / "nul.jsonl"
    with path.open("wb") as fh:
        fh.write(stats_line().encode() + b"\n")
        chunk = b"\0" * (1 << 20)
        for _ in range(64):
            fh.write(chunk)
        fh.write(b"\n" + stats_line().encode() + b"\n")
    tracemalloc.start()
    try:
        items = list(read_jsonl(path, max_line_bytes=1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [type(i).__name__ for i in items] == ["Record", "RecordError", "Record"]
    assert isinstance(items[1], RecordError) and items[1].line == 2 and "limit" in items[1].problem
    assert peak < 8 << 20, peak


# ---------------------------------------------------------------------------------------------- format

@pytest.mark.parametrize("value", [1e308, -1e308, 10 ** 400, float("inf"), float("nan"), 2 ** 64, -(10 ** 30)])
def test_format_never_raises_and_stays_short(value: Any) -> None:
    for f in (fmt.count, fmt.nbytes, fmt.gib, fmt.pct, fmt.rate, fmt.seconds_ms, fmt.duration):
        out = f(value)
        assert isinstance(out, str) and len(out) <= 9, (f.__name__, out)
    assert 0 <= fmt.cells(value, 100, 10) <= 10 and 0 <= fmt.cells(5, value, 10) <= 10
    assert len(fmt.sparkline([value, 1.0, None], 5)) == 5


# ---------------------------------------------------------------------------------------------- problems

def test_problems_rate_limit_lines_and_keep_counts() -> None:
    p = Problems(line_interval_s=5.0)
    p.report("mqtt.malformed", "bad 1", now=100.0, lost=True)
    for i in range(2, 1001):
        p.report("mqtt.malformed", f"bad {i}", now=100.0 + i / 1000)
    assert p.take_lines(now=101.0) == ["mqtt.malformed: bad 1"]  # one line at once, the rest folded
    assert p.take_lines(now=104.0) == []
    assert p.take_lines(now=105.0) == ["mqtt.malformed: bad 1000 (999 more in 5 s, 1,000 in all)"]
    got = p.get("mqtt.malformed")
    assert got is not None and (got.count, got.first, got.last, got.lost) == (1000, 100.0, 101.0, True)
    assert p.exit_status(records=5) == EXIT_LOST_DATA and p.exit_status(records=0) == EXIT_NO_DATA
    # A connection problem resolves, and says so when it comes back.
    p.report("mqtt.connection", "disconnected", now=110.0)
    p.resolve("mqtt.connection", "reconnected after 2.0 s", now=112.0)
    p.report("mqtt.connection", "disconnected again", now=120.0)
    assert p.take_lines(now=120.0) == ["mqtt.connection: disconnected", "mqtt.connection: reconnected after 2.0 s",
                                       "mqtt.connection: disconnected again"]
    assert [x["kind"] for x in p.to_json()] == ["mqtt.connection", "mqtt.malformed"]
    assert Problems().exit_status(records=1) == 0


def test_problems_are_bounded_and_clean() -> None:
    p = Problems(max_kinds=3)
    for i in range(100):
        p.report(f"kind{i}", "x\x1b]0;t\x07" + "y" * 10_000)
    assert len(p) == 4 and p.count("problems.overflow") == 97
    assert all("\x1b" not in x["message"] and len(x["message"]) <= 300 for x in p.to_json())


# ---------------------------------------------------------------------------------------------- every mode

def _json_out(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("url, where", [("mqtt://127.0.0.1:1/x", "127.0.0.1:1"),
                                        ("mqtt://no-such-broker.invalid/x", "no-such-broker.invalid")])
def test_attach_to_a_dead_broker_says_so_and_exits_3(url: str, where: str) -> None:
    """A port nobody listens on, and a host name that does not resolve (.invalid: RFC 2606)."""
    proc = kvtop_cli("attach", url, "--headless", "--duration", "1.5", "--json")
    assert proc.returncode == EXIT_NO_DATA, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert any("mqtt.connection" in ln and where in ln for ln in lines), proc.stderr
    assert any("run.no_data" in ln for ln in lines)
    assert len(lines) <= 4, proc.stderr  # rate-limited: not a line per retry
    s = _json_out(proc)
    kinds = {p["kind"]: p for p in s["problems"]}
    assert {"mqtt.connection", "run.no_data"} <= set(kinds) and s["records"] == 0
    assert s["links"]["mqtt"] == "disconnected"


def test_replay_of_files_that_are_not_recordings(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "binary.jsonl").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "dir.jsonl").mkdir()
    empty = kvtop_cli("replay", str(tmp_path / "empty.jsonl"), "--speed", "0", "--headless", "--json")
    assert empty.returncode == EXIT_NO_DATA and "replay.no_records" in empty.stderr and "empty" in empty.stderr
    binary = kvtop_cli("replay", str(tmp_path / "binary.jsonl"), "--speed", "0", "--headless", "--json")
    assert binary.returncode == EXIT_NO_DATA, binary.stderr
    assert "replay.bad_line" in binary.stderr and "not a kvtop recording" in binary.stderr
    assert "\x1b" not in binary.stderr and "\x9b" not in binary.stderr  # the bytes are not echoed raw
    d = kvtop_cli("replay", str(tmp_path / "dir.jsonl"), "--headless")
    assert d.returncode == 2 and d.stderr.count("\n") == 1 and "is a directory" in d.stderr


@pytest.mark.slow
def test_replay_caps_gaps_and_ms_records_do_not_stall(tmp_path: Path) -> None:
    """One record in milliseconds amid seconds: rejected (exit 4, named), and the replay is not stalled; a real
    gap of an hour lasts --max-gap seconds."""
    src = tmp_path / "gappy.jsonl"
    lines = BUSY.read_text().splitlines()[:200]
    out = []
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if i == 50:
            rec["time"] *= 1000
        if i >= 100:
            rec["time"] += 3600  # an hour of nothing
        out.append(json.dumps(rec))
    src.write_text("\n".join(out) + "\n")
    t0 = time.monotonic()
    proc = kvtop_cli("replay", str(src), "--speed", "1", "--max-gap", "0.5", "--headless", "--json", timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == EXIT_LOST_DATA, proc.stderr
    assert "line 51: time" in proc.stderr and "milliseconds" in proc.stderr
    assert took < 20, took  # ~1 s of recorded time + one capped gap, plus start-up
    assert _json_out(proc)["records"] == 199


def test_a_bad_record_is_counted_and_rendered_in_every_mode() -> None:
    """1e308 where a count belongs: the fold never sees it, the summary and stderr say so."""
    from kvtop.modes import run_headless_until
    from kvtop.session import Session

    session = Session(meta={})
    session.emit(decode(stats_line()))
    with pytest.raises(RecordError):
        session.emit(decode(stats_line(free=1e308)))
    # A record that passed the boundary but the fold refuses (a negative count) is a problem, lost data.
    session.emit(make("stats", {"kvCacheStats": {"freeNumBlocks": -1}}, SourceId("h", 0, "r"), T0 + 1))
    assert session.problems.count("record.bad") == 1
    assert session.problems.exit_status(session.records_in) == EXIT_LOST_DATA
    assert math.isfinite(T0) and run_headless_until is not None


# ---------------------------------------------------------------------------------------------- claims, report

def test_a_hostile_created_claim_costs_no_memory_up_front() -> None:
    """A `created` event claiming a 3e7-block host (and GPU) pool, then a little traffic: < 50 MB in all (the
    what-if sized its arrays from the claim: 4 x 9e7 tree slots and 9e7 histogram slots, ~5 GB)."""
    from kvtop.session import Session

    src = SourceId("h", 0, "r")
    tracemalloc.start()
    try:
        session = Session(meta={})
        session.emit(make("kv_event", {"event_id": 0, "data": {
            "type": "created", "num_blocks_per_cache_level": [30_000_000, 30_000_000]}}, src, T0))
        blocks = [{"type": "stored_block", "block_hash": i, "tokens": [], "cache_level": 0, "priority": 35}
                  for i in range(200)]
        session.emit(make("kv_event", {"event_id": 1, "data": {"type": "stored", "parent_hash": None,
                                                                "blocks": blocks}}, src, T0 + 1))
        session.emit(make("kv_event", {"event_id": 2, "data": {"type": "removed",
                                                                "block_hashes": list(range(200))}}, src, T0 + 2))
        session.emit(make("kv_event", {"event_id": 3, "data": {"type": "stored", "parent_hash": None,
                                                                "blocks": blocks[:50]}}, src, T0 + 3))
        session.emit(make("stats", {"iter": 1, "kvCacheStats": {"maxNumBlocks": 30_000_000, "reusedBlocks": 5,
                                                                "missedBlocks": 50}}, src, T0 + 4))
        wi = session.what_if()
        from kvtop import run_summary

        text = run_summary.format_summary(run_summary.summary(session))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert wi["host_capacity_blocks"] == 30_000_000 and wi["host_x2_hit_rate"] is not None
    assert "30,000,000" in text
    assert peak < 50e6, peak


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return kvtop_cli("report", *args, timeout=120)


@pytest.mark.slow
def test_report_survives_math_names_clock_jumps_and_a_file_as_output(tmp_path: Path) -> None:
    rec = tmp_path / "exp_$1_$2.jsonl"
    lines = BUSY.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        obj = json.loads(line)
        obj["source"]["run"] = "exp_$1_$2\x1b]0;pwned\x07"
        if i == 60 and obj["kind"] == "stats":
            obj["time"] = 4.0e9  # legal (before 2100) but 70 years ahead: bins widen, nothing walks there
        if i == 61:
            obj["time"] *= 1000  # milliseconds: a bad line
        out.append(json.dumps(obj))
    rec.write_text("\n".join(out) + "\n")
    t0 = time.monotonic()
    proc = _report(str(rec), "-o", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 60
    assert "Traceback" not in proc.stderr and "line 62: time" in proc.stderr
    assert "exp_$1_$2: " in proc.stdout and "\x1b" not in proc.stdout + proc.stderr and "pwned" not in proc.stdout
    assert (tmp_path / "rep" / "index.html").is_file()
    (tmp_path / "taken").write_text("x")
    taken = _report(str(BUSY), "-o", str(tmp_path / "taken"))
    assert taken.returncode == 2 and taken.stderr.count("\n") == 1 and "not a directory" in taken.stderr


# ---------------------------------------------------------------------------------------------- command line

@pytest.mark.parametrize("args, needle", [
    (["--host-cache", "1e99", "--headless"], "64 TiB"),
    (["--host-cache", "1e14", "--headless"], "64 TiB"),
    (["sim", "--trace", str(ROOT / "tests" / "data" / "mooncake_slice.jsonl"), "--host-cache", "0,1e14"],
     "64 TiB"),
    (["sim", "--trace", str(ROOT / "tests" / "data" / "mooncake_slice.jsonl"), "--host-cache", "0:1e99:3"],
     "64 TiB"),
    (["--prometheus-port", "99999", "--headless"], "0 to 65535"),
    (["attach", "mqtts://127.0.0.1/x?ca=/nonexistent/ca.pem", "--headless"], "no such file"),
    # each of these ran before: --limit 0 or -1 replayed one request, --time-scale 0 was a ZeroDivisionError
    # traceback, nan never let a request arrive (the replay spun), inf and -1 ran as if every request came at once
    *([["sim", "--trace", str(ROOT / "tests" / "data" / "mooncake_slice.jsonl"), "--limit", n], "request count >= 1"]
      for n in ("0", "-1")),
    *([["sim", "--trace", str(ROOT / "tests" / "data" / "mooncake_slice.jsonl"), "--time-scale", x],
       f"finite number > 0, got {x}"] for x in ("0.0", "nan", "inf", "-1.0")),
])
def test_bad_options_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    proc = kvtop_cli(*args, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_an_empty_trace_is_an_error_not_a_table_of_zeros(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    for mode in ([], ["--one-pass", "--belady"], ["--hit-rate-only"]):
        sim = kvtop_cli("sim", "--trace", str(empty), *mode)
        assert sim.returncode == 2 and sim.stdout == "", (mode, sim.stdout)
        assert sim.stderr == f"kvtop: --trace: {empty} holds no requests (empty, or only blank lines)\n"


def test_a_file_name_with_escape_sequences_reaches_no_terminal_raw(tmp_path: Path) -> None:
    evil = tmp_path / "e\x1b]0;pwned\x07vil\x1b[2J"
    evil.mkdir()
    (evil / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "torch_dtype": "bfloat16", "max_position_embeddings": 8192}))
    runs = {
        "sim, a missing trace": kvtop_cli("sim", "--trace", str(evil / "t.jsonl")),
        "estimate, a missing model": kvtop_cli("estimate", "--model", str(evil / "x"), "--gpu", "H200"),
        "estimate, a model directory": kvtop_cli("estimate", "--model", str(evil), "--gpu", "H200"),
        "calibrate --merge, a missing probe": kvtop_cli("calibrate", "--merge", str(evil / "p.json"), "--profile",
                                                        "H200", "--out", str(tmp_path / "o.json")),
    }
    for what, proc in runs.items():
        assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr, what
        assert "Traceback" not in proc.stderr, what
    assert runs["estimate, a model directory"].returncode == 0
    assert "Memory" in runs["estimate, a model directory"].stdout
    assert all(p.returncode == 2 for w, p in runs.items() if "missing" in w)


def test_a_binary_trace_is_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "x.trace"
    trace.write_bytes(b"\xff\xfe\x00\x9b2J" * 500)
    sim = kvtop_cli("sim", "--trace", str(trace))
    assert sim.returncode == 2 and sim.stderr.count("\n") == 1 and "not UTF-8" in sim.stderr, sim.stderr
    run = kvtop_cli("--scenario", "trace", "--trace", str(trace), "--headless", "--duration", "1")
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "no trace requests" in run.stderr, run.stderr
    huge = tmp_path / "huge.trace"
    huge.write_text(json.dumps({"timestamp": 0, "input_length": 1e99, "output_length": 1, "hash_ids": [1]}) + "\n")
    big = kvtop_cli("sim", "--trace", str(huge))
    assert big.returncode == 2 and "at most 16,777,216 tokens" in big.stderr, big.stderr


def test_output_into_a_closed_pipe_is_one_line() -> None:
    """`kvtop sim ... | head -c 1`: the reader leaves after the first line; the next ones meet a closed pipe."""
    trace = ROOT / "tests" / "data" / "mooncake_slice.jsonl"
    cmd = (f"set -o pipefail; {sys.executable} -m kvtop sim --trace {trace} --limit 50 "
           "--host-cache 0,1GB,2GB,4GB,8GB,16GB | head -c 1 >/dev/null")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 141, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines() == ["kvtop: output closed (broken pipe)"], proc.stderr


def test_show_settings_redacts_a_password_in_a_url(tmp_path: Path) -> None:
    conf = tmp_path / "kvtop.toml"
    conf.write_text('publish = "mqtt://kv:hunter2@broker.lab/x"\nrun_name = "r\\u001b]0;t\\u0007"\n')
    proc = kvtop_cli("--config", str(conf), "--show-settings")
    assert proc.returncode == 0, proc.stderr
    assert "hunter2" not in proc.stdout and "mqtt://kv:***@broker.lab/x" in proc.stdout
    assert "\x1b" not in proc.stdout


def test_a_prometheus_scrape_survives_an_unbounded_integer() -> None:
    from kvtop.sinks.prometheus import PrometheusExporter

    model = {"gpu": {"capacity_blocks": 10 ** 400, "in_use_blocks": 5}, "bad_records": 10 ** 400}
    exporter = PrometheusExporter(lambda: {"h/0/r": model}, port=0)
    text = exporter.render().decode()
    assert 'kvtop_kv_in_use_blocks{host="h",rank="0",run="r",tier="gpu"} 5.0' in text
    assert "kvtop_kv_capacity_blocks{" not in text  # left out, never a failed scrape


# ---------------------------------------------------------------------------------------------- sinks, sources

def _valid_line_by_line(path: Path) -> int:
    n = 0
    for item in read_jsonl(path):
        assert not isinstance(item, RecordError), item
        n += 1
    return n


@pytest.mark.slow
def test_record_onto_a_full_disk_is_visible_and_the_file_stays_valid(tmp_path: Path) -> None:
    """`ulimit -f 1024`: the file may not grow past 1 MiB (EFBIG, as a full disk's ENOSPC): the run says so on
    stderr and in the summary, exits 4, and what was written is whole lines. 1 MiB, not less: a batch line of KV
    events is up to 256 KiB (recorder.BATCH_BYTES), so a 64 KiB limit kept only the 2-3 lines before the first batch
    on a loaded machine, while a 4 s run at full speed writes several MiB."""
    rec = tmp_path / "run.jsonl"
    cmd = (f"ulimit -f 1024; exec {sys.executable} -m kvtop --headless --json --duration 4 --speed 0 "
           f"--record {rec}")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == EXIT_LOST_DATA, proc.stderr
    assert "recorder.write" in proc.stderr and "File too large" in proc.stderr
    assert "line(s) never written" in proc.stderr.strip().splitlines()[-1]
    s = _json_out(proc)
    problem = next(p for p in s["problems"] if p["kind"] == "recorder.write")
    assert problem["lost"] and problem["count"] >= 1
    assert 0 < rec.stat().st_size <= 1024 * 1024
    assert _valid_line_by_line(rec) >= 1  # how many fit in 64 KiB depends on how the first flush falls


@pytest.mark.slow
def test_publish_to_a_dead_broker_is_visible() -> None:
    proc = kvtop_cli("--headless", "--json", "--duration", "3", "--speed", "0", "--publish",
                     "mqtt://127.0.0.1:1/x", timeout=120)
    assert proc.returncode == EXIT_LOST_DATA, proc.stderr
    assert "mqtt-publish.connection" in proc.stderr and "mqtt-publish.dropped" in proc.stderr
    kinds = {p["kind"]: p for p in _json_out(proc)["problems"]}
    assert kinds["mqtt-publish.dropped"]["count"] > 0 and kinds["mqtt-publish.dropped"]["lost"]


@pytest.mark.slow
def test_prometheus_on_all_interfaces_warns() -> None:
    proc = kvtop_cli("--headless", "--duration", "1", "--speed", "0", "--prometheus-port", "0",
                     "--prometheus-addr", "0.0.0.0", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "prometheus.exposed" in proc.stderr and "0.0.0.0" in proc.stderr
    from kvtop.compose import is_loopback

    assert [is_loopback(a) for a in ("127.0.0.1", "127.9.9.9", "::1", "localhost", "0.0.0.0", "::", "10.0.0.1",
                                     "gpu-07")] == [True, True, True, True, False, False, False, False]


@pytest.mark.slow
def test_sigint_ends_a_headless_run_with_130_and_a_summary() -> None:
    import signal

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "kvtop", "--headless", "--json", "--duration", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    time.sleep(4.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and json.loads(out.strip().splitlines()[-1])["records"] > 0


def test_sigterm_ends_a_headless_run_with_143_and_a_summary(tmp_path: Path) -> None:
    """SIGTERM, as ``timeout`` and ``kill`` send it, ends the run as SIGINT does: the JSON summary of what was seen,
    then 143 (128 + 15). (Its default action ended the process with no summary at all.)"""
    import signal

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rec = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "kvtop", "--headless", "--json", "--duration", "120", "--speed",
                             "0", "--record", str(rec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    # the recorder writes its first lines a second into the run: the session (and its signal handler) is up
    while not (rec.exists() and rec.stat().st_size > 0) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (proc.returncode, err[-2000:])
    summary = json.loads(out.strip().splitlines()[-1])
    assert "Traceback" not in err and summary["records"] > 0 and summary["requests"]["completed"] > 0


class _Server:
    """A tiny HTTP server in a thread: ``body`` for every path (HTML: a web server that is not trtllm-serve)."""

    def __init__(self, body: bytes, content_type: str = "text/html"):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dead", "broken"])
def test_attach_to_a_dead_or_broken_trtllm_serve_says_so(case: str) -> None:
    server = _Server(b"<html><title>\x1b]0;pwned\x07 not kvtop</title></html>") if case == "broken" else None
    try:
        port = server.port if server else 1
        proc = kvtop_cli("attach", f"http://127.0.0.1:{port}", "--headless", "--json", "--duration", "2.5")
    finally:
        if server:
            server.close()
    assert proc.returncode == EXIT_NO_DATA, proc.stderr
    kind = "trtllm-serve.connection" if case == "dead" else "trtllm-serve.metrics"  # each endpoint its own kind
    assert kind in proc.stderr and "run.no_data" in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr and "pwned" not in proc.stderr
    assert {p["kind"] for p in _json_out(proc)["problems"]} >= {kind, "run.no_data"}


# ---------------------------------------------------------------------------------------------- fleet

def test_stale_clock_marks_silent_sources_and_learns_their_interval() -> None:
    from kvtop.fleet import StaleClock

    clock2 = StaleClock(intervals=5, min_s=1.0, enabled=True)
    for i in range(20):  # every 0.5 s: stale after 5 x 0.5 = 2.5 s of silence
        clock2.heard("a", "stats", now=100 + 0.5 * i)
    clock2.heard("z", "meta", now=109.5)  # a retained meta and nothing else: the floor (1 s)
    assert clock2.newly_stale(now=110.0) == []
    assert clock2.newly_stale(now=110.6) == ["z"]  # 1.1 s after the meta
    assert clock2.newly_stale(now=111.9) == []     # 2.4 s after a's last stats: not yet
    assert clock2.newly_stale(now=112.1) == ["a"]  # 2.6 s
    assert clock2.newly_stale(now=113.0) == []     # said once
    assert clock2.heard("a", "stats", now=113.5) is True and clock2.stale_keys() == {"z"}
    assert StaleClock().newly_stale(now=1e9) == []  # off unless enabled (a local engine may idle)


def test_stale_and_meta_only_sources_leave_the_fleet_totals() -> None:
    """Three sources; one goes silent (no last will), one is only an old retained meta: after the stale limit
    the totals are the live source's, not 'unknown', and the screen-side status says stale."""
    from kvtop.fleet import aggregate
    from kvtop.session import Session

    session = Session(meta={})
    session.stale.enabled, session.stale.min_s = True, 0.0
    a, b, z = SourceId("a", 0, "r"), SourceId("b", 0, "r"), SourceId("z", 0, "r")
    session.emit(make("meta", {"engine": "trtllm"}, z, T0))
    for src in (a, b):
        session.emit(make("meta", {"engine": "trtllm", "primary_blocks": 100, "secondary_blocks": 0}, src, T0))
    for i in range(10):
        for src in (a, b):
            session.emit(make("stats", {"iter": i, "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 60,
                                                                    "usedNumBlocks": 40}}, src, T0 + i))
    assert aggregate(session.models, session.status)["gpu_capacity"] is None  # z is unknown: so is the sum
    mono = time.monotonic()
    session.stale.heard("a/0/r", "stats", now=mono + 10.0)
    lines = session.tick(monotonic=mono + 10.0)
    assert sorted(session.stale_sources()) == ["b/0/r", "z/0/r"]
    assert any("source.stale" in ln for ln in lines)
    agg = aggregate(session.models, session.status)
    assert agg["sources"] == 1 and agg["gpu_capacity"] == 100 and agg["gpu_in_use"] == 40
    from kvtop import run_summary

    assert run_summary.summary(session)["sources"] == {"z/0/r": "stale", "a/0/r": "connected", "b/0/r": "stale"}
    session.emit(make("stats", {"iter": 11}, b, T0 + 11))  # b is back
    assert session.stale_sources() == ["z/0/r"]


def test_sources_are_capped_and_refused_ones_counted() -> None:
    from kvtop.session import Session

    session = Session(meta={}, max_sources=3)
    for i in range(10_000):
        session.emit(make("stats", {"iter": 1}, SourceId(f"fake-{i}", 0, "r"), T0))
    assert len(session.models) == 3 and session.refused_sources == 9_997
    p = session.problems.get("source.refused")
    assert p is not None and p.count == 9_997 and "9,997" in p.message
    assert len(session.tick()) == 1  # one line, not 9,997


@pytest.mark.mqtt
async def test_mqtt_records_are_bound_to_their_topic(mqtt_broker: Any) -> None:
    import asyncio

    import aiomqtt

    from kvtop.records import encode
    from kvtop.sources.mqtt import MqttSubscriber

    got: list[Any] = []
    problems = Problems()
    sub = MqttSubscriber(mqtt_broker.url("lab"), got.append, problems=problems)
    task = asyncio.ensure_future(sub.run())
    for _ in range(250):
        if sub.connected:
            break
        await asyncio.sleep(0.02)
    honest, victim = SourceId("node-a", 0, "r"), SourceId("node-b", 0, "r")
    async with aiomqtt.Client("127.0.0.1", mqtt_broker.port) as c:
        # node-a's topic, a record claiming node-b: dropped; node-a's own: kept; a meta on a stats topic: dropped.
        await c.publish("lab/kvtop/v1/r/node-a:0/stats", encode(make("stats", {"iter": 1}, victim, T0)), qos=1)
        await c.publish("lab/kvtop/v1/r/node-a:0/stats", encode(make("meta", {"engine": "x"}, honest, T0)), qos=1)
        await c.publish("lab/kvtop/v1/r/node-a:0/stats", encode(make("stats", {"iter": 2}, honest, T0)), qos=1)
    for _ in range(250):
        if got:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    sub.stop()
    await task
    assert [(r.source, r.data) for r in got] == [(honest, {"iter": 2})]
    assert sub.mismatched == 2 and problems.count("mqtt.source_mismatch") == 2


@pytest.mark.slow
@pytest.mark.mqtt
async def test_mqtt_queue_overflow_is_counted_not_logged_per_message(mqtt_broker: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import logging

    import aiomqtt

    from kvtop.records import encode
    from kvtop.sources.mqtt import MqttSubscriber

    caplog.set_level(logging.WARNING)
    src = SourceId("h", 0, "r")
    got: list[Any] = []

    def slow(rec: Any) -> None:
        got.append(rec)
        if len(got) == 1:
            time.sleep(1.0)  # the loop is held: what arrives meanwhile piles up in aiomqtt's queue

    problems = Problems()
    sub = MqttSubscriber(mqtt_broker.url("lab"), slow, max_queued_messages=5, problems=problems)
    task = asyncio.ensure_future(sub.run())
    for _ in range(250):
        if sub.connected:
            break
        await asyncio.sleep(0.02)
    async with aiomqtt.Client("127.0.0.1", mqtt_broker.port, max_inflight_messages=1000) as c:
        for i in range(200):
            await c.publish("lab/kvtop/v1/r/h:0/stats", encode(make("stats", {"iter": i}, src, T0)), qos=0)
    await asyncio.sleep(2.0)
    sub.stop()
    await task
    assert sub.overflowed > 0 and problems.count("mqtt.queue_overflow") == sub.overflowed
    assert len(got) + sub.overflowed <= 200
    assert not [r for r in caplog.records if "queue is full" in r.getMessage()]


# ---------------------------------------------------------------------------------------------- every mode, fuzzed

_BASE = [json.loads(line) for line in BUSY.read_text().splitlines()[:400]]
_HOSTILE: list[Any] = [1e308, -1e308, 10 ** 400, 2 ** 64, 2 ** 64 + 1, MAX_BLOCKS + 1, -1, 0, float("nan"),
                       float("inf"), "\x1b]52;c;cHduZWQ=\x07", "\x1b[2J\x9b2J\u202e", "", None, [], {}, True, 1.5,
                       10 ** 20, [1e308], {"x": 10 ** 400}]


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            out.extend(_paths(v, (*prefix, i)))
    return out


@st.composite
def _mutated_recording(draw: Any) -> list[str]:
    """The busy recording's first 400 lines with 1 to 6 of them mutated: one value anywhere (the envelope
    included: time, source, kind) replaced by a hostile one."""
    import copy

    objs = [copy.deepcopy(o) for o in _BASE]
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(objs) - 1))
        path = draw(st.sampled_from(_paths(objs[i])))
        target = objs[i]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = copy.deepcopy(draw(st.sampled_from(_HOSTILE)))
    return [json.dumps(o) for o in objs]


def _fold(lines: list[str]) -> tuple[Any, int]:
    from kvtop.session import Session

    session = Session(source=SourceId("sim", 0, "busy"), meta={})
    bad = 0
    for line in lines:
        try:
            rec = decode(line)
        except RecordError:
            bad += 1
            continue
        session.emit(rec)
    return session, bad


_CONTROL = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F))]


def _assert_clean(text: str, where: str) -> None:
    # (A bad value may be *quoted* in a message, JSON-escaped as "\\u001b]52;...": printable, harmless.)
    assert not [c for c in _CONTROL if c in text.replace("\n", "")], (where, text[:300])


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(_mutated_recording())
def test_mutated_records_fold_and_render_headless_json_prometheus_and_report(tmp_path_factory: Any,
                                                                              lines: list[str]) -> None:
    from kvtop import run_summary
    from kvtop.report.report import _page
    from kvtop.report.runs import load_run
    from kvtop.sinks.prometheus import PrometheusExporter

    session, bad = _fold(lines)
    summary = run_summary.summary(session)
    text = run_summary.format_summary(summary)
    _assert_clean(text, "headless")
    json.dumps(summary, allow_nan=False)  # every number in the summary is finite
    assert summary["records"] + bad + session.refused_sources == len(lines)
    exposition = PrometheusExporter(lambda: dict(session.models), port=0).render().decode()
    assert "kvtop_kv_" in exposition or not session.models
    for line in session.tick():
        _assert_clean(line, "stderr")
    path = tmp_path_factory.mktemp("fuzz") / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run = load_run(path)
    assert len(run.bad_lines) == bad
    _page([run], {})


_META_OF_NUMBERS = encode(make("meta", {"engine": "sim", "engine_version": 1.5, "model": -1, "gpu": [1],
                                       "sim_reason": {"a": 1}, "tokens_per_block": 32}, SourceId("h", 0, "r"), 1.0))


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(_mutated_recording())
@example([_META_OF_NUMBERS])   # a meta of numbers where names go: the header drew -1 as a model, an int (a crash)
def test_mutated_records_render_on_the_dashboard(lines: list[str]) -> None:
    from recordings import dashboard_screen

    session, _ = _fold(lines)
    _assert_clean(dashboard_screen(session), "dashboard")


async def test_hostile_names_never_reach_the_dashboard_and_ctrl_c_quits_with_130() -> None:
    from kvtop.session import Session
    from kvtop.settings import Settings
    from kvtop.ui.app import build_app

    session = Session(source=SourceId("sim", 0, "busy"), meta={})
    for line in BUSY.read_text().splitlines()[:300]:
        obj = json.loads(line)
        obj["source"]["host"] = "node\x1b]0;pwned\x07"
        if obj["kind"] == "meta":
            obj["data"]["model"] = "Qwen\x1b]52;c;cHduZWQ=\x07\x1b[2J"
            obj["data"]["engine_version"] = "1.2\u202egnp.exe"
        session.emit(decode(json.dumps(obj)))
    session.on_source_status("mqtt", "disconnected from \x1b]0;pwned\x07 broker")
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        app.refresh_view()
        await pilot.pause()
        shot = str(app.export_screenshot())
        assert "Qwen" in shot
        _assert_clean(shot, "dashboard")
        assert "pwned" not in shot
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 130


def test_a_clock_jump_is_flagged() -> None:
    from kvtop.session import Session

    session = Session(meta={})
    src = SourceId("h", 0, "r")
    session.emit(make("stats", {"iter": 1}, src, T0))
    session.emit(make("stats", {"iter": 2}, src, T0 + 3600))  # an hour: fine (a pause)
    assert session.problems.count("record.time_jump") == 0
    session.emit(make("stats", {"iter": 3}, src, T0 + 40 * 86400))
    p = session.problems.get("record.time_jump")
    assert p is not None and "40.0 days" in p.message and not p.lost


@pytest.mark.slow
async def test_a_server_answer_past_the_limit_or_not_http_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server posing as trtllm-serve that sends more than MAX_BODY_BYTES, a 5,000-digit number, or a garbled
    status line: each is an endpoint problem, the source keeps polling, memory stays bounded."""
    import socket
    import threading

    from kvtop.sources import trtllm_serve

    monkeypatch.setattr(trtllm_serve, "MAX_BODY_BYTES", 1 << 16)
    for body in (b"[" + b"1," * 50_000 + b"1]", b"[" + b"9" * 5000 + b"]"):
        server = _Server(body, "application/json")
        try:
            problems = Problems()
            src = trtllm_serve.TrtllmServeSource(f"http://127.0.0.1:{server.port}", sink=lambda r: None,
                                                 problems=problems, perf_metrics=False, timeout_s=5)
            await src.poll_once()
        finally:
            server.close()
        p = problems.get("trtllm-serve.metrics")
        assert p is not None and ("larger than" in p.message or "not JSON" in p.message), problems.to_json()

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def garble() -> None:
        for _ in range(4):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(4096)
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
            conn.close()

    threading.Thread(target=garble, daemon=True).start()
    try:
        problems = Problems()
        src = trtllm_serve.TrtllmServeSource(f"http://127.0.0.1:{listener.getsockname()[1]}", sink=lambda r: None,
                                             problems=problems, perf_metrics=False, timeout_s=5)
        await src.poll_once()  # never raises
    finally:
        listener.close()
    assert problems.get("trtllm-serve.metrics") is not None, problems.to_json()


async def test_an_engine_metrics_page_past_the_bounds_is_counted_and_never_folded() -> None:
    """issue 26: a vLLM /metrics whose ``cache_config_info{num_gpu_blocks="1e300"}`` became the GPU capacity (10^300
    in JSON and Prometheus, exit 0). Through the real scrape (a server on 127.0.0.1) into a session: the scrape is
    a bad record, a sample value past 2^64 is left out and counted, the exit status is 4 and the summary carries no
    number past 2^64."""
    from kvtop import run_summary
    from kvtop.session import Session
    from kvtop.sources.engine_metrics import MetricsPoller

    page = (b'# TYPE vllm:cache_config_info gauge\n'
            b'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1e300"} 1.0\n'
            b'# TYPE vllm:prefix_cache_queries counter\n'
            b'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1e30\n')
    server = _Server(page, "text/plain")
    session = Session(source=SourceId("vllm", 0, "r"), meta={})
    poller = MetricsPoller([], session.emit, lambda rank: SourceId("vllm", rank, "r"), problems=session.problems)
    try:
        assert await poller.poll_once(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.close()
    assert session.model.gpu.capacity_blocks is None and session.model.bad_records == 1
    bad = session.problems.get("record.bad")
    assert bad is not None and bad.lost and "num_gpu_blocks" in bad.message and "out of bounds" in bad.message
    dropped = session.problems.get("metrics.bad_value")
    assert dropped is not None and dropped.lost and "vllm:prefix_cache_queries_total = 1e+30" in dropped.message
    assert session.problems.exit_status(session.records_in) == EXIT_LOST_DATA
    summary = run_summary.summary(session)

    def numbers(v: Any) -> list[float]:
        if isinstance(v, dict):
            return [n for x in v.values() for n in numbers(x)]
        if isinstance(v, list):
            return [n for x in v for n in numbers(x)]
        return [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else []

    assert max(abs(n) for n in numbers(json.loads(json.dumps(summary)))) <= 2 ** 64


def test_replay_line_limit_is_an_option(tmp_path: Path) -> None:
    rec = tmp_path / "big.jsonl"
    lines = BUSY.read_text().splitlines()[:50]
    big = json.loads(lines[10])
    big["data"]["padding"] = "x" * 40_000  # the recording's longest line is ~18 KB
    lines[10] = json.dumps(big)
    rec.write_text("\n".join(lines) + "\n")
    ok = kvtop_cli("replay", str(rec), "--speed", "0", "--headless", "--json")
    assert ok.returncode == 0, ok.stderr
    cut = kvtop_cli("replay", str(rec), "--speed", "0", "--headless", "--json", "--max-line-bytes", "32768")
    assert cut.returncode == EXIT_LOST_DATA and "line 11: line" in cut.stderr and "32,768-byte limit" in cut.stderr
    assert _json_out(cut)["records"] == 49


@pytest.mark.slow
@pytest.mark.tmux
@pytest.mark.skipif(__import__("shutil").which("tmux") is None, reason="tmux is not installed")
def test_ctrl_c_in_a_real_terminal_quits_the_dashboard_with_130(tmp_path: Path) -> None:
    """`kvtop replay` in tmux: Ctrl-C (a key in the dashboard's raw mode, not a signal) quits like q, status 130."""
    import shlex
    import uuid

    from tmux_pane import Pane

    server = f"kvtop-trust-{uuid.uuid4().hex[:8]}"
    status = tmp_path / "status"
    cmd = (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m kvtop replay {shlex.quote(str(BUSY))} "
           f"--refresh 0.25; echo $? > {shlex.quote(str(status))}; sleep 60")
    env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(ROOT))
    subprocess.run(["tmux", "-L", server, "-f", "/dev/null", "new-session", "-d", "-s", "kvtop", "-x", "120",
                    "-y", "40", cmd], check=True, env=env, timeout=10)
    p = Pane(server, "kvtop")
    try:
        p.wait_for(lambda t: "256 blocks" in t, timeout=30)
        p.keys("C-c")
        deadline = time.monotonic() + 15
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status.exists(), f"kvtop did not exit; last screen:\n{p.text()}"
        assert status.read_text().strip() == "130"
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=10)


def test_records_built_in_process_are_bounded_too() -> None:
    """make() checks an explicit time as decode does; a Record built by hand with an absurd time is one bad
    record for the fold, never an exception (10**400 raised OverflowError in TierModel._tick)."""
    from kvtop.records import Record
    from kvtop.session import Session

    with pytest.raises(RecordError, match="time"):
        make("stats", {"iter": 1}, time=T0 * 1000)
    session = Session(meta={})
    session.emit(Record("stats", {"iter": 1}, SourceId("h", 0, "r"), T0))
    for t in ("noon", 10 ** 400, float("nan")):
        session.emit(Record("stats", {"iter": 2}, SourceId("h", 0, "r"), t))  # type: ignore[arg-type]
    assert session.problems.count("record.bad") == 3


@pytest.mark.slow
async def test_an_engine_stream_that_fails_is_a_problem_of_the_driven_run() -> None:
    from kvtop import runner
    from kvtop.settings import Settings

    class Broken:
        """An engine whose stats stream raises and whose events are malformed."""

        def get_stats(self, timeout: float = 0) -> list[Any]:
            raise RuntimeError("stats \x1b]0;pwned\x07 exploded")

        def get_kv_cache_events(self, timeout: float = 0) -> list[Any]:
            return [{"event_id": "x"}]

        def shutdown(self) -> None:
            pass

    s = Settings()
    s.duration = 1.0
    session = runner.build_session(s, engine=Broken(), sample_gpu=False)
    await session.run(duration_s=1.0)
    kinds = {p.kind: p for p in session.problems.snapshot()}
    assert any(k.startswith("engine.") for k in kinds), list(kinds)
    assert all("\x1b" not in p.message and "pwned" not in p.message for p in kinds.values())


def test_a_flood_of_made_up_removals_stops_at_the_ghost_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if's ghosts are capped (MAX_GHOSTS, 4M by default: ~600 MB at most), whatever the host claims."""
    from kvtop.tiers import whatif

    monkeypatch.setattr(whatif, "MAX_GHOSTS", 1000)
    w = whatif.WhatIf()
    w.apply_kv_event({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [10, 30_000_000]}})
    for i in range(20):
        w.apply_kv_event({"event_id": 1 + i, "data": {"type": "removed",
                                                       "block_hashes": list(range(i * 500, i * 500 + 500))},
                          "cache_level": 1})
    assert w.estimate()["ghost_blocks"] == 1000  # 10,000 made-up removals: the newest 1,000 kept


def test_a_recorder_on_a_full_disk_says_how_many_lines_were_never_written() -> None:
    """/dev/full refuses every write (ENOSPC). The last word was "10 line(s) held back, 0 dropped so far" although
    the run had ended and all 10 were gone: now the count of lines never written is the final message."""
    from kvtop.problems import Problems
    from kvtop.sinks.recorder import Recorder

    problems = Problems()
    rec = Recorder("/dev/full", problems=problems)
    for i in range(10):
        rec.write(make("stats", {"iter": i}, SourceId("h", 0, "full"), 1.0 + i))
    rec.close()
    assert rec.dropped_lines == 10 and rec.bytes == 0
    problem = next(p for p in problems.to_json() if p["kind"] == "recorder.write")
    assert problem["lost"] and "10 line(s) never written" in problem["message"], problem
