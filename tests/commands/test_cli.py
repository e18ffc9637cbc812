"""The command line: settings layered defaults < TOML file < KVTOP_* environment < command line (each value knows
its origin); every bad value exits 2 with one line naming the option and no traceback; ``kvtop sim --trace``
replays a Mooncake trace and sweeps host cache sizes; ``--headless --json`` prints issue 4's summary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kvtop.commands.run import build_parser, cli_values
from kvtop.settings import Settings, SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]
QWEN3_8B_KV_BYTES_PER_TOKEN = 2 * 36 * 8 * 128 * 2  # 147,456 (Qwen3-8B config.json, bf16)


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The user's environment without KVTOP_* variables and with an empty config home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTOP_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "xdg")
    env.update(extra)
    return env


def start(args: Sequence[str], tmp: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "kvtop", *args], cwd=tmp, env=clean_env(tmp, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def kvtop(args: Sequence[str], tmp: Path, **env: str) -> tuple[int, str, str]:
    return finish(start(args, tmp, **env))


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvtop: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ---------------------------------------------------------------------------------------------- layering

def settings_from(argv: list[str], tmp: Path, environ: dict[str, str] | None = None,
                  config: Path | None = None) -> Settings:
    ns = build_parser().parse_args(argv)
    return load_settings(cli_values(ns), config_path=config or ns.config, environ=environ or {})


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def test_defaults_have_origin_default(tmp_path: Path) -> None:
    s = settings_from([], tmp_path)
    assert s.engine == "auto" and s.model == "Qwen/Qwen3-8B" and s.tokens_per_block == 32
    assert all(origin == "default" for _, _, origin in s.describe())


def test_layering_file_env_command_line(tmp_path: Path) -> None:
    cfg = tmp_path / "kvtop.toml"
    cfg.write_text('[kvtop]\ntokens_per_block = 16\nmax-batch-size = 8\nhost_cache = "2GB"\nseed = 5\n'
                   'scenario = "zipf"\n')
    env = {"KVTOP_MAX_BATCH_SIZE": "12", "KVTOP_SEED": "7", "KVTOP_UNRELATED_THING": "x", "OTHER": "1"}
    s = settings_from(["--seed", "9", "--config", str(cfg)], tmp_path, environ=env)
    assert (s.tokens_per_block, s.host_cache, s.scenario) == (16, 2 * 10**9, "zipf")
    assert s.max_batch_size == 12 and s.seed == 9
    assert s.model == "Qwen/Qwen3-8B"
    assert s.origin["tokens_per_block"] == f"file {cfg}"
    assert s.origin["host_cache"] == f"file {cfg}"
    assert s.origin["max_batch_size"] == "environment KVTOP_MAX_BATCH_SIZE"
    assert s.origin["seed"] == "command line"
    assert "model" not in s.origin
    described = {name: origin for name, _, origin in s.describe()}
    assert described["model"] == "default" and described["seed"] == "command line"


def test_kvtop_config_env_and_default_config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "elsewhere.toml"
    cfg.write_text("max_tokens = 99\n")  # top-level keys work too, without a [kvtop] table
    s = load_settings({}, environ={"KVTOP_CONFIG": str(cfg)})
    assert s.max_tokens == 99 and s.origin["max_tokens"] == f"file {cfg}"
    home = tmp_path / "xdg" / "kvtop"
    home.mkdir(parents=True)
    (home / "kvtop.toml").write_text("[kvtop]\ndecode_priority = 70\n")
    s = load_settings({}, environ={})
    assert s.decode_priority == 70 and s.origin["decode_priority"].startswith("file ")


def test_gpu_cache_tokens_or_fraction(tmp_path: Path) -> None:
    s = settings_from(["--gpu-cache", "65536"], tmp_path)
    assert s.gpu_cache_tokens == 65536 and s.origin["gpu_cache_tokens"] == "command line"
    s = settings_from(["--gpu-cache", "0.5"], tmp_path)
    assert s.gpu_cache_tokens is None and s.gpu_cache_fraction == 0.5
    assert s.origin["gpu_cache_fraction"] == "command line"


def test_sizes_and_types_convert(tmp_path: Path) -> None:
    s = settings_from(["--host-cache", "512MiB", "--rate", "2.5", "--headless", "--prompt-priority", "0",
                       "--max-num-tokens", "16_384"], tmp_path)
    assert s.host_cache == 512 * 2**20 and s.rate == 2.5 and s.headless is True and s.prompt_priority == 0
    assert s.max_num_tokens == 16384
    s = settings_from([], tmp_path, environ={"KVTOP_HEADLESS": "yes", "KVTOP_HOST_CACHE": "10GB",
                                             "KVTOP_CONCURRENCY": "none"})
    assert s.headless is True and s.host_cache == 10**10 and s.concurrency is None
    with pytest.raises(SettingsError) as info:
        settings_from([], tmp_path, environ={"KVTOP_HEADLESS": "perhaps"})
    assert info.value.option == "--headless"


def test_show_settings_subprocess_reports_origins(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[kvtop]\ntokens_per_block = 64\nmax_batch_size = 4\n")
    rc, out, err = kvtop(["--show-settings", "--config", str(cfg), "--max-batch-size", "6"], tmp_path,
                         KVTOP_TOKENS_PER_BLOCK="16", KVTOP_THEME="light")
    assert rc == 0, err
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(\S+)\s+(\S+)\s+(.+)$", line)
        assert m, line
        rows[m.group(1)] = (m.group(2), m.group(3))
    assert rows["tokens_per_block"] == ("16", "environment KVTOP_TOKENS_PER_BLOCK")
    assert rows["max_batch_size"] == ("6", "command line")
    assert rows["theme"] == ("light", "environment KVTOP_THEME")
    assert rows["model"] == ("Qwen/Qwen3-8B", "default")
    assert {f.name for f in Settings.option_fields()} == set(rows)


# ---------------------------------------------------------------------------------------------- bad values

# Each is a subprocess (a Python start-up of about 0.5 s of CPU here), so the list keeps the brief's cases and
# one of each layer; the other conversions are checked in-process through cli.main below.
BAD: list[tuple[str, list[str], dict[str, str], tuple[str, ...]]] = [
    ("host-cache-unit", ["--host-cache", "10XB"], {}, ("--host-cache", "10XB")),
    ("tokens-per-block-0", ["--tokens-per-block", "0"], {}, ("--tokens-per-block", "0")),
    ("prompt-priority-101", ["--prompt-priority", "101"], {}, ("--prompt-priority", "101")),
    ("gpu-cache-1.5", ["--gpu-cache", "1.5"], {}, ("--gpu-cache", "1.5")),
    ("scenario", ["--scenario", "nope"], {}, ("--scenario", "nope")),
    ("rate-negative", ["--rate", "-1"], {}, ("--rate",)),
    ("unknown-option", ["--nope"], {}, ("--nope",)),
    ("missing-value", ["--model"], {}, ("--model",)),
    ("env-bad-size", [], {"KVTOP_HOST_CACHE": "lots"}, ("--host-cache", "lots")),
    ("config-missing", ["--config", "/nonexistent/kvtop.toml"], {}, ("--config", "no such file")),
    ("config-malformed", ["--config", "{tmp}/bad.toml"], {}, ("--config", "not valid TOML")),
    ("config-bad-value", ["--config", "{tmp}/badvalue.toml"], {}, ("--tokens-per-block",)),
    ("config-unknown-key", ["--config", "{tmp}/unknown.toml"], {}, ("colour", "unknown setting")),
    # issue 26: each of these was a traceback, or a value taken that cannot be meant
    ("config-directory", ["--config", "{tmp}"], {}, ("--config", "is a directory")),
    ("config-5000-deep", ["--config", "{tmp}/deep.toml"], {}, ("--config", "too deeply")),
    ("config-kvtop-table-and-top-level", ["--config", "{tmp}/both.toml"], {}, ("--config", "[kvtop]", "theme")),
    ("config-other-table", ["--config", "{tmp}/table.toml"], {}, ("--config", "[display]", "top level")),
    ("config-record-number", ["--config", "{tmp}/record.toml"], {}, ("--record", "must be a string", "5")),
    ("config-theme-number", ["--config", "{tmp}/theme.toml"], {}, ("--theme", "must be a string")),
    ("config-refresh-below-floor", ["--config", "{tmp}/refresh.toml"], {}, ("--refresh", "at least 0.05 s")),
]

IN_PROCESS_BAD: list[tuple[list[str], tuple[str, ...]]] = [
    (["--host-cache", "10G"], ("--host-cache", "ambiguous")),
    (["--host-cache", "-1GB"], ("--host-cache",)),
    (["--decode-priority", "-1"], ("--decode-priority",)),
    (["--secondary-offload-min-priority", "200"], ("--secondary-offload-min-priority",)),
    (["--gpu-cache", "0"], ("--gpu-cache",)),
    (["--gpu-cache", "lots"], ("--gpu-cache", "lots")),
    (["--engine", "vllm"], ("--engine", "vllm")),
    (["--max-batch-size", "abc"], ("--max-batch-size", "abc")),
    (["--max-batch-size", "2.5"], ("--max-batch-size",)),
    (["--refresh", "0"], ("--refresh",)),
    (["--refresh", "0.01"], ("--refresh", "at least 0.05 s")),
    (["--theme", " "], ("--theme", "empty")),
    (["--duration", "nan"], ("--duration", "finite")),
    (["--trace-time-scale", "inf"], ("--trace-time-scale", "finite")),
    (["--speed", "-2"], ("--speed",)),
    (["--concurrency", "-3"], ("--concurrency",)),
    (["--prompt-priority-tokens", "-5"], ("--prompt-priority-tokens",)),
]


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    """Every bad invocation at once (each is a Python start-up; in parallel they cost about one)."""
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "bad.toml").write_text("[kvtop]\ntokens_per_block = \n")
    (tmp / "badvalue.toml").write_text("[kvtop]\ntokens_per_block = 0\n")
    (tmp / "unknown.toml").write_text("[kvtop]\ncolour = 'red'\n")
    (tmp / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp / "both.toml").write_text("theme = 'light'\n[kvtop]\nrefresh = 2\n")
    (tmp / "table.toml").write_text("[display]\nrefresh = 2\n")
    (tmp / "record.toml").write_text("record = 5\n")
    (tmp / "theme.toml").write_text("theme = 5\n")
    (tmp / "refresh.toml").write_text("refresh = 1e-9\n")
    procs = {name: start([a.replace("{tmp}", str(tmp)) for a in args] + ["--show-settings"], tmp, **env)
             for name, args, env, _ in BAD}
    return {name: finish(p) for name, p in procs.items()}


@pytest.mark.parametrize(("name", "needles"), [(b[0], b[3]) for b in BAD], ids=[b[0] for b in BAD])
def test_bad_value_exits_2_with_one_line(bad_runs: dict[str, tuple[int, str, str]], name: str,
                                         needles: tuple[str, ...]) -> None:
    rc, out, err = bad_runs[name]
    assert_one_line_error(rc, err, *needles)
    assert out == ""


@pytest.mark.parametrize(("argv", "needles"), IN_PROCESS_BAD, ids=[" ".join(a) for a, _ in IN_PROCESS_BAD])
def test_bad_value_in_process(argv: list[str], needles: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    from kvtop.cli import main

    rc = main([*argv, "--show-settings"])
    captured = capsys.readouterr()
    assert_one_line_error(rc, captured.err, *needles)
    assert captured.out == ""


def test_concurrency_zero_is_a_clear_error(tmp_path: Path) -> None:
    rc, _, err = kvtop(["--concurrency", "0", "--headless", "--duration", "0.3", "--speed", "0"], tmp_path)
    assert_one_line_error(rc, err, "--concurrency")


def test_rate_zero_is_rejected_or_runs(tmp_path: Path) -> None:
    rc, out, err = kvtop(["--rate", "0", "--headless", "--json", "--duration", "0.5", "--speed", "0",
                          "--engine", "sim"], tmp_path)
    if rc == 2:
        assert_one_line_error(rc, err, "--rate")
    else:
        assert json.loads(out)["requests"]["completed"] > 0


# ---------------------------------------------------------------------------------------------- headless

@pytest.mark.slow
def test_headless_json_summary_on_the_simulator(tmp_path: Path) -> None:
    rc, out, err = kvtop(["--headless", "--json", "--duration", "0.8", "--refresh", "0.1", "--speed", "0",
                          "--host-cache", "1GB",
                          "--gpu-cache", "4096", "--scenario", "ab", "--concurrency", "1", "--max-tokens", "4"],
                         tmp_path)
    assert rc == 0, err
    s = json.loads(out)
    # --engine auto (the default) on this machine, which has neither a GPU nor TensorRT-LLM
    assert s["engine"] == "sim" and s["simulated"] is True
    assert s["sim_reason"] and ("GPU" in s["sim_reason"] or "tensorrt_llm" in s["sim_reason"])
    assert s["model"] == "Qwen/Qwen3-8B"
    assert {"completed", "failed", "ttft_ms"} <= set(s["requests"])
    assert {"p50", "p99"} <= set(s["requests"]["ttft_ms"])
    assert s["requests"]["completed"] >= 2 and s["requests"]["failed"] == 0
    for tier in ("gpu", "host"):
        assert {"capacity_blocks", "in_use_blocks", "cached_blocks", "free_blocks"} <= set(s["tiers"][tier])
    assert s["tiers"]["gpu"]["capacity_blocks"] == 4096 // 32
    assert s["tiers"]["host"]["capacity_blocks"] == int(10**9 / QWEN3_8B_KV_BYTES_PER_TOKEN / 32)
    assert {"cumulative", "gpu", "host"} <= set(s["hit_rate"])
    assert {"offloaded_blocks", "onboarded_blocks", "evicted_gpu_blocks", "evicted_host_blocks"} <= set(s["moves"])
    # the ab scenario: each prompt is 60% of the GPU pool, so B pushes A to host and A comes back from there
    assert s["moves"]["offloaded_blocks"] > 0 and s["moves"]["onboarded_blocks"] > 0
    assert s["hit_rate"]["host"] > 0


# ---------------------------------------------------------------------------------------------- kvtop sim --trace

DOC_BLOCKS = 4       # 4 x 512 = 2,048 tokens per request: 64 blocks of 32 tokens
DOCS = 4             # 4 documents x 64 blocks = 256 blocks, twice the 128-block GPU pool
ROUNDS = 3


def write_trace(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cyclic_trace(path: Path) -> Path:
    """Documents visited round robin: with LRU and a pool that holds only two of them, the GPU alone never
    hits (each document is evicted before it returns); a host tier holding the rest turns returns into hits."""
    rows = []
    t = 0
    for _ in range(ROUNDS):
        for d in range(DOCS):
            rows.append({"timestamp": t, "input_length": DOC_BLOCKS * 512, "output_length": 4,
                         "hash_ids": [100 * d + k for k in range(DOC_BLOCKS)]})
            t += 100
    return write_trace(path, rows)


RUN_KEYS = {"host_cache_bytes", "primary_blocks", "secondary_blocks", "requests", "reused_blocks", "missed_blocks",
            "cache_hit_rate", "offloaded_blocks", "onboarded_blocks", "simulated_seconds", "wall_seconds"}


def test_sim_trace_sweep_json(tmp_path: Path) -> None:
    trace = cyclic_trace(tmp_path / "trace.jsonl")
    rc, out, err = kvtop(["sim", "--trace", str(trace), "--gpu-blocks", "128", "--host-cache", "0,1GB",
                          "--max-batch-size", "1", "--json"], tmp_path)
    assert rc == 0, err
    runs = json.loads(out)["runs"]
    assert len(runs) == 2
    for run in runs:
        assert RUN_KEYS <= set(run)
        assert run["primary_blocks"] == 128 and run["requests"] == DOCS * ROUNDS
        assert run["reused_blocks"] + run["missed_blocks"] == DOCS * ROUNDS * DOC_BLOCKS * 512 // 32
        r, m = run["reused_blocks"], run["missed_blocks"]
        assert run["cache_hit_rate"] == pytest.approx(r / (r + m) if r else 0.0)
        assert run["simulated_seconds"] > 0 and run["wall_seconds"] >= 0
    no_host, host = runs
    assert (no_host["host_cache_bytes"], host["host_cache_bytes"]) == (0, 10**9)
    assert no_host["secondary_blocks"] == 0
    assert host["secondary_blocks"] == int(10**9 / QWEN3_8B_KV_BYTES_PER_TOKEN / 32)
    assert no_host["cache_hit_rate"] == 0.0 and no_host["offloaded_blocks"] == no_host["onboarded_blocks"] == 0
    assert host["cache_hit_rate"] > no_host["cache_hit_rate"]
    assert host["offloaded_blocks"] > 0 and host["onboarded_blocks"] > 0
    assert host["onboarded_blocks"] <= host["reused_blocks"]


def test_sim_trace_prints_a_table(tmp_path: Path) -> None:
    trace = cyclic_trace(tmp_path / "trace.jsonl")
    rc, out, err = kvtop(["sim", "--trace", str(trace), "--gpu-blocks", "128", "--host-cache", "0,1GB",
                          "--max-batch-size", "1"], tmp_path)
    assert rc == 0, err
    rates = [float(x) for x in re.findall(r"hit rate\s+([0-9.]+)%", out)]
    assert len(rates) == 2, out
    assert rates[0] == 0.0 and rates[1] > 0.0
    blocks = [int(x) for x in re.findall(r"\(\s*(\d+) blocks\)", out)]
    assert blocks == [0, int(10**9 / QWEN3_8B_KV_BYTES_PER_TOKEN / 32)]


def test_sim_trace_gpu_blocks_and_host_blocks(tmp_path: Path) -> None:
    rows = [{"timestamp": 10 * i, "input_length": 1024, "output_length": 2, "hash_ids": [i % 5, 50 + i % 5]}
            for i in range(15)]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    rc, out, err = kvtop(["sim", "--trace", str(trace), "--gpu-blocks", "64", "--host-blocks", "0,128", "--json"],
                         tmp_path)
    assert rc == 0, err
    runs = json.loads(out)["runs"]
    assert [(r["primary_blocks"], r["secondary_blocks"]) for r in runs] == [(64, 0), (64, 128)]
    assert runs[1]["host_cache_bytes"] == 128 * 32 * QWEN3_8B_KV_BYTES_PER_TOKEN
    assert all(r["requests"] == 15 for r in runs)
    assert runs[1]["cache_hit_rate"] >= runs[0]["cache_hit_rate"]


def test_sim_trace_malformed_line_names_its_number(tmp_path: Path) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]})
    bad_type = tmp_path / "bad1.jsonl"
    bad_type.write_text(f"{good}\n{good}\n" + '{"timestamp": 5, "input_length": "long", "output_length": 2, '
                        '"hash_ids": [3]}\n' + f"{good}\n")
    bad_json = tmp_path / "bad2.jsonl"
    bad_json.write_text(f"{good}\n\n{good}\n{good}\n{{not json\n")
    procs = [start(["sim", "--trace", str(bad_type)], tmp_path), start(["sim", "--trace", str(bad_json)], tmp_path),
             start(["sim", "--trace", str(tmp_path / "missing.jsonl")], tmp_path),
             start(["sim", "--trace", str(bad_type), "--tokens-per-block", "48"], tmp_path),
             start(["sim", "--trace", str(bad_type), "--host-cache", "0,10XB"], tmp_path)]
    (rc1, _, err1), (rc2, _, err2), (rc3, _, err3), (rc4, _, err4), (rc5, _, err5) = [finish(p) for p in procs]
    assert_one_line_error(rc1, err1, "--trace", "line 3", "input_length")
    assert_one_line_error(rc2, err2, "--trace", "line 5", "JSON")
    assert_one_line_error(rc3, err3, "--trace", "missing.jsonl")
    assert_one_line_error(rc4, err4, "--tokens-per-block", "48")
    assert_one_line_error(rc5, err5, "--host-cache", "10XB")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from kvtop.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert re.match(r"^kvtop \d+\.\d+", capsys.readouterr().out)


def _ab_run(tmp_path: Path, host_cache: str, duration: str, speed: str
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """`kvtop --engine sim --scenario ab --host-cache X` as the README has it, no pool given: its JSON summary and
    its recording's TTFT by prefix source (kvtop report's classification)."""
    from kvtop.report.runs import load_run

    rec = tmp_path / f"ab-{host_cache}.jsonl"
    rc, out, err = kvtop(["--engine", "sim", "--scenario", "ab", "--headless", "--json", "--duration", duration,
                          "--speed", speed, "--host-cache", host_cache, "--record", str(rec)], tmp_path)
    assert rc == 0, err
    return json.loads(out), load_run(rec).summary["ttft_by_source"]


@pytest.mark.slow
def test_scenario_ab_reuses_nothing_without_a_host_tier_as_the_example(tmp_path: Path) -> None:
    """TensorRT-LLM's examples/llm-api/llm_kv_cache_offloading.py (and examples/kv_cache_offloading.py) print
    "reused blocks: 0" without offloading: one prompt and its answer fill the GPU pool, B evicts all of A. The demo
    sized A at 60% of the pool and B left a block of A: 18% reuse (23 of 125 blocks) without any host tier."""
    s, by_source = _ab_run(tmp_path, "0", "2", "0")
    assert s["tiers"]["gpu"]["capacity_blocks"] == 131  # ~4,100-token prompts + 64 answer tokens, 32 a block
    assert s["requests"]["failed"] == 0 and s["requests"]["completed"] >= 4
    assert s["hit_rate"]["lookups"] >= 4 * 128
    assert s["hit_rate"]["hits"] == 0 and s["hit_rate"]["cumulative"] == 0.0
    assert s["moves"]["offloaded_blocks"] == 0 and s["moves"]["evicted_gpu_blocks"] > 0
    assert by_source["miss"]["requests"] == s["requests"]["completed"]


@pytest.mark.slow
def test_scenario_ab_with_a_host_tier_hits_from_the_host_and_a_miss_costs_tens_of_ms(tmp_path: Path) -> None:
    """At the simulator's own pace (--speed 0 outruns the event buffer: the fold's split by tier goes approximate).
    With 10 GB of host cache every return of A or B onboards its 128 full blocks from the host (the partial last
    block is the one reused on the GPU), and a host hit's TTFT is tens of ms below a miss's on the simulated H200
    (measured 18 ms against 92 ms): a presenter can point at the gain. The 153-token prompts of before moved TTFT
    from 5.8 to 5.2 ms."""
    s, by_source = _ab_run(tmp_path, "10GB", "3", "1")
    hr = s["hit_rate"]
    assert s["requests"]["failed"] == 0 and s["requests"]["completed"] >= 4
    assert hr["host_hits"] >= 0.95 * hr["hits"] > 0
    assert hr["host"] > 0.5 and hr["gpu"] < 0.05  # all but the first A and B hit (8 requests in 3 s: 0.74)
    assert s["moves"]["onboarded_blocks"] >= 128 * (s["requests"]["completed"] - 2)
    host, miss = by_source["host_hit"], by_source["miss"]
    assert host["requests"] >= 2 and miss["requests"] == 2  # the first A and B
    assert miss["p50_s"] - host["p50_s"] > 0.040, by_source


@pytest.mark.slow
def test_scenario_ab_keeps_a_gpu_pool_the_user_set(tmp_path: Path) -> None:
    rc, out, err = kvtop(["--engine", "sim", "--scenario", "ab", "--headless", "--json", "--duration", "0.5",
                          "--speed", "0", "--gpu-cache", "4096", "--max-tokens", "4"], tmp_path)
    assert rc == 0, err
    assert json.loads(out)["tiers"]["gpu"]["capacity_blocks"] == 4096 // 32


# ---------------------------------------------------------------------------------------------- options, once

def _parsers() -> dict[str, Any]:
    from kvtop.commands import agent, attach, estimate, run, sim

    return {"kvtop": run.build_parser(), "sim": sim.parser(), "attach": attach.parser("attach"),
            "replay": attach.parser("replay"), "agent": agent.parser(), "estimate": estimate.parser()}


def test_every_subcommand_takes_its_settings_from_settings_never_by_hand() -> None:
    """An option that is a setting (its dest a Settings field) is declared by kvtop.options in every subcommand:
    same spelling, same doc, same validation. A hand-made --refresh in attach would have no kvtop_setting."""
    names = {f.name for f in Settings.option_fields()}
    by_hand: dict[str, list[str]] = {}
    shared: dict[str, set[str]] = {}
    for command, parser in _parsers().items():
        for action in parser._actions:
            if action.dest in names:
                shared.setdefault(action.dest, set()).add(command)
                if getattr(action, "kvtop_setting", None) != action.dest:
                    by_hand.setdefault(command, []).append(action.dest)
    assert by_hand == {}
    # and the ones that matter are shared for real (the same field reaches several subcommands)
    assert {"kvtop", "sim"} <= shared["model"] and {"kvtop", "attach", "replay"} <= shared["refresh"]
    assert {"kvtop", "attach", "agent"} <= shared["mqtt_password_file"]
    assert {"kvtop", "sim", "estimate"} <= shared["tensor_parallel_size"] & shared["kv_cache_dtype"]


@pytest.mark.parametrize("argv", [["--refresh", "0"], ["attach", "x.jsonl", "--refresh", "0"],
                                  ["replay", "x.jsonl", "--refresh", "0"]])
def test_a_setting_is_validated_the_same_in_every_subcommand(argv: list[str],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from kvtop.cli import main

    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "kvtop: --refresh: must be > 0, got '0'"


def test_sim_validates_its_settings_as_settings_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kvtop sim --gpu-cache-fraction 1.5 was taken as it was (type=float); now it is refused as --gpu-cache-fraction
    is everywhere, before the trace is read."""
    from kvtop.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 512, "output_length": 8, "hash_ids": [1]}\n')
    assert main(["sim", "--trace", str(trace), "--gpu-cache-fraction", "1.5"]) == 2
    assert "--gpu-cache-fraction: must be a fraction between 0 and 1" in capsys.readouterr().err
    assert main(["sim", "--trace", str(trace), "--max-batch-size", "0"]) == 2
    assert "--max-batch-size: must be a positive integer, got 0" in capsys.readouterr().err
    assert main(["sim", "--trace", str(trace), "--json", "--max-batch-size", "8", "--gpu-blocks", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "Qwen/Qwen3-8B" and out["tokens_per_block"] == 32 and out["runs"][0]["requests"] == 1


# ---------------------------------------------------------------------------------------------- one run a recording

@pytest.mark.slow
def test_a_second_record_onto_a_recording_exits_2_and_leaves_it_byte_for_byte(tmp_path: Path) -> None:
    """`--record FILE` appended to whatever FILE held: a second demo run became one recording of two runs, folded
    as one. Now it is refused (exit 2, one line, before an engine starts) and the file is left as it was; --append
    (or KVTOP_APPEND, or the settings file) adds the run to it; `kvtop replay` refuses it the same way."""
    rec = tmp_path / "run.jsonl"
    run = ["--engine", "sim", "--headless", "--json", "--duration", "0.5", "--speed", "0", "--record", str(rec)]
    rc, _, err = kvtop(run, tmp_path)
    assert rc == 0, err
    first = rec.read_bytes()
    assert len(first) > 1000
    rc, out, err = kvtop(run, tmp_path)
    assert_one_line_error(rc, err, "--record", str(rec), "already holds a recording", f"{len(first):,} bytes",
                          "--append")
    assert out == "" and rec.read_bytes() == first
    rc, _, err = kvtop(["replay", str(rec), "--headless", "--record", str(rec)], tmp_path)
    assert_one_line_error(rc, err, "--record", "already holds a recording")
    assert rec.read_bytes() == first
    rc, _, err = kvtop([*run, "--append"], tmp_path)
    assert rc == 0, err
    second = rec.read_bytes()
    assert second.startswith(first) and len(second) > len(first) + 1000
    rc, _, err = kvtop(run, tmp_path, KVTOP_APPEND="true")
    assert rc == 0, err
    assert rec.read_bytes().startswith(second) and len(rec.read_bytes()) > len(second) + 1000
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    rc, _, err = kvtop([*run[:-1], str(empty)], tmp_path)
    assert rc == 0 and empty.stat().st_size > 1000, err


def _finish_or_kill(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        return finish(proc, timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no end after 60 s (the dashboard started?): {len(out):,} bytes on stdout, {err[-300:]!r}")


@pytest.mark.slow
def test_json_with_no_terminal_runs_headless_and_ends_with_the_summary(tmp_path: Path) -> None:
    """`kvtop --duration 3 --json` with stdout a pipe (no --headless): the dashboard started, wrote its escape
    sequences into the pipe and no summary. Now the run is headless and its last line is the JSON summary."""
    proc = subprocess.Popen([sys.executable, "-m", "kvtop", "--duration", "3", "--json"], cwd=tmp_path,
                            env=clean_env(tmp_path, KVTOP_ENGINE="sim"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rc, out, err = _finish_or_kill(proc)
    assert rc == 0, err
    assert "\x1b" not in out
    lines = out.strip().splitlines()
    s = json.loads(lines[-1])
    assert len(lines) == 1 and s["engine"] == "sim" and s["requests"]["completed"] > 0
    assert "stdout is not a terminal" not in err  # --json asked for it: nothing to explain


@pytest.mark.slow
def test_any_run_with_no_terminal_is_headless_and_says_so(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kvtop", "--duration", "1", "--speed", "0"], cwd=tmp_path,
                            env=clean_env(tmp_path, KVTOP_ENGINE="sim"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rc, out, err = _finish_or_kill(proc)
    assert rc == 0, err
    assert "\x1b" not in out and "hit rate:" in out
    assert "kvtop: stdout is not a terminal: running headless" in err
