"""Settings: typed fields with docs, layered defaults < TOML file < KVTOP_* environment < command line.

Every value remembers where it came from (``Settings.origin``), so ``kvtop --show-settings`` and bug reports can
say why a value is what it is. A bad value raises :class:`SettingsError` naming the option and what is wrong;
the CLI prints that one line and exits 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import sys
import tempfile
from dataclasses import field, fields
from pathlib import Path
from typing import Any

from kvtop.values import mutable

# A size setting past 64 TiB is a typo (1e14 for 1e11) or a test of kvtop: no machine holds that much host memory
# or local disk for a KV cache, and a simulator sized from it would allocate until the machine stops.
MAX_SIZE_BYTES = 64 << 40
# A refresh faster than 20 a second shows nothing a person can read and polls an engine or a server flat out:
# refresh = 1e-9 kept a core at 100%.
MIN_REFRESH_S = 0.05

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = None


class SettingsError(ValueError):
    def __init__(self, option: str, problem: str):
        self.option = option
        self.problem = problem
        super().__init__(f"{option}: {problem}")


def _opt(default: Any, doc: str, **meta: Any) -> Any:
    return field(default=default, metadata={"doc": doc, **meta})


@mutable
class Settings:
    engine: str = _opt("auto", "auto (TensorRT-LLM when it imports and a GPU is visible, else the simulator), trtllm, "
                               "or sim", choices=("auto", "trtllm", "sim"))
    model: str = _opt("Qwen/Qwen3-8B", "model name (built-in shapes) or a local directory with config.json")
    gpu: str = _opt("H200", "GPU profile for the simulator and estimates: H200, H100, GH200, or a profile .json")
    host_cache: int = _opt(32 * 10**9, "host (pinned DRAM) KV cache size, e.g. 10GB, 512MiB, 0 to disable",
                           kind="size")
    disk_cache: int = _opt(0, "real engine, TensorRT-LLM 1.3+: disk KV cache size (KvCacheConfig.disk_cache_size, "
                              "the V2 manager's third tier), e.g. 200GB; 0 for none", kind="size")
    disk_cache_path: str | None = _opt(None, "directory for the disk KV cache (KvCacheConfig.disk_cache_path)")
    gpu_cache_tokens: int | None = _opt(131072, "GPU KV cache size in tokens (max_tokens); the demo default keeps "
                                               "the pool small enough to fill in seconds", kind="int_or_none")
    gpu_cache_fraction: float = _opt(0.9, "free_gpu_memory_fraction when --gpu-cache-tokens is not given",
                                     kind="fraction")
    tokens_per_block: int = _opt(32, "tokens per KV cache block", kind="pos_int")
    kv_cache_dtype: str = _opt("auto", "KV cache dtype (KvCacheConfig.dtype): auto (the checkpoint's: FP8 where its "
                                       "quantization config says so, else the model's dtype), fp8, bfloat16, float16",
                               choices=("auto", "fp8", "bfloat16", "float16"))
    tensor_parallel_size: int = _opt(1, "GPUs the model is split across (LLM(tensor_parallel_size=...)): each holds "
                                        "1/N of the weights and of every token's KV", kind="pos_int")
    max_batch_size: int = _opt(64, "max requests in flight in the engine", kind="pos_int")
    max_num_tokens: int = _opt(8192, "max tokens per engine iteration", kind="pos_int")
    capacity_scheduler_policy: str = _opt(
        "GUARANTEED_NO_EVICT", "TensorRT-LLM's SchedulerConfig(capacity_scheduler_policy=...): GUARANTEED_NO_EVICT "
        "reserves every block a request needs to finish; MAX_UTILIZATION runs more at once and pauses requests when "
        "blocks run out", choices=("GUARANTEED_NO_EVICT", "MAX_UTILIZATION"))
    secondary_offload_min_priority: int = _opt(30, "blocks with a retention priority below this are dropped, "
                                                   "not offloaded (TensorRT-LLM default 30)", kind="priority")
    scenario: str = _opt("multi-turn", "workload: ab, system-prompt, multi-turn, zipf, or trace",
                         choices=("ab", "system-prompt", "multi-turn", "zipf", "trace"))
    trace: str | None = _opt(None, "Mooncake-format trace file for --scenario trace")
    trace_time_scale: float = _opt(1.0, "divide trace timestamps by this (2 = twice as fast)", kind="pos_float")
    concurrency: int | None = _opt(8, "closed loop: requests kept in flight (a trace keeps its own arrival times)",
                                  kind="pos_int_or_none")
    rate: float | None = _opt(None, "open loop: Poisson arrivals per second (overrides --concurrency)",
                              kind="pos_float_or_none")
    duration: float | None = _opt(None, "stop after this many seconds (headless default: 30; a --scenario trace "
                                        "run ends when its trace has been answered)", kind="float_or_none")
    max_tokens: int = _opt(64, "tokens generated per request", kind="pos_int")
    prompt_priority: int | None = _opt(None, "retention priority for prompt blocks (0-100)", kind="priority_or_none")
    prompt_priority_tokens: int | None = _opt(None, "apply --prompt-priority to the first N prompt tokens only",
                                              kind="int_or_none")
    prompt_priority_duration_ms: int | None = _opt(None, "the prompt priority lapses to 35 after this long",
                                                   kind="int_or_none")
    offload_transfer_mode: str = _opt("DRAM", "where offloaded blocks go (TensorRT-LLM's KvCacheRetentionConfig "
                                              "transfer_mode): DRAM (the pinned host pool), or GDS / "
                                              "POSIX_DEBUG_FALLBACK (files in --offload-directory)",
                                      choices=("DRAM", "GDS", "POSIX_DEBUG_FALLBACK"))
    offload_directory: str | None = _opt(None, "directory for offloaded blocks with --offload-transfer-mode GDS or "
                                               "POSIX_DEBUG_FALLBACK")
    decode_priority: int = _opt(35, "retention priority for generated blocks (0-100)", kind="priority")
    seed: int = _opt(0, "workload random seed", kind="int")
    speed: float = _opt(1.0, "simulator pacing: 1 = real time, 0 = as fast as possible", kind="nonneg_float")
    trtllm_version: str = _opt("1.2", "simulator: which TensorRT-LLM's iteration stats to emit: 1.2 (kvCacheStats "
                                      "only) or 1.3 (adds the per-window kvCacheIterationStats)",
                               choices=("1.2", "1.3"))
    refresh: float = _opt(0.25, "screen and poll refresh interval in seconds (at least 0.05)", kind="pos_float",
                          minimum=MIN_REFRESH_S)
    theme: str = _opt("dark", "dashboard theme: dark, light, high-contrast, or a theme file", nonempty=True)
    headless: bool = _opt(False, "run without the screen and print a summary", kind="bool")
    json: bool = _opt(False, "with --headless, print the summary as one JSON object", kind="bool")
    warmup_requests: int = _opt(0, "exclude the first N requests from hit rates", kind="int")
    record: str | None = _opt(None, "write every record to this JSONL file (a new or empty one: a recording holds one "
                                    "run; --append adds to an existing one)")
    append: bool = _opt(False, "with --record, add this run to an existing recording (kvtop report splits it into "
                               "its runs) instead of refusing a file that is not empty", kind="bool")
    publish: str | None = _opt(None, "publish records to an MQTT broker: mqtt://[user@]host[:port]/prefix")
    mqtt_password_file: str | None = _opt(None, "file holding the MQTT password (or set KVTOP_MQTT_PASSWORD); "
                                                "never put it on the command line")
    prometheus_port: int | None = _opt(None, "serve Prometheus metrics on this port (0: any free port)",
                                       kind="port_or_none")
    prometheus_addr: str = _opt("127.0.0.1", "address for the Prometheus server")
    run_name: str | None = _opt(None, "run name used in records and MQTT topics")
    origin: dict[str, str] = field(default_factory=dict, repr=False, metadata={"internal": True})
    # The settings file read, or where one would be (the dashboard remembers its theme and layout there)
    config_file: str | None = field(default=None, repr=False, metadata={"internal": True})

    @classmethod
    def option_fields(cls) -> list[Any]:
        return [f for f in fields(cls) if not f.metadata.get("internal")]

    def set(self, name: str, raw: Any, origin: str) -> None:
        f = next((f for f in self.option_fields() if f.name == name), None)
        if f is None:
            raise SettingsError(name, f"unknown setting (from {origin})")
        setattr(self, name, _convert(f, raw))
        self.origin[name] = origin

    def describe(self) -> list[tuple[str, Any, str]]:
        return [(f.name, getattr(self, f.name), self.origin.get(f.name, "default")) for f in self.option_fields()]


def _option_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _convert(f: Any, raw: Any) -> Any:
    opt = _option_name(f.name)
    kind = f.metadata.get("kind", "str")
    choices = f.metadata.get("choices")
    try:
        if raw is None:
            if kind.endswith("_or_none") or f.default is None:
                return None
            raise SettingsError(opt, "a value is required")
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise SettingsError(opt, f"expected true or false, got {raw!r}")
        if kind == "size":
            # Imported here: the sizing module brings the GPU and model tables (~0.03 s of CPU under -X importtime,
            # dev box), which `kvtop replay` and `kvtop attach` never use unless a size is given.
            from kvtop.engines.sizing import parse_size

            size = parse_size(raw if isinstance(raw, int) else str(raw))
            if size > MAX_SIZE_BYTES:
                raise SettingsError(opt, f"{str(raw)[:40]} is more than 64 TiB, which no machine holds; "
                                         "sizes are bytes or a unit: 32GB, 512GiB")
            return size
        if kind == "port_or_none":
            if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("none", "")):
                return None
            port = int(str(raw).strip()) if not isinstance(raw, int) else raw
            if not 0 <= port <= 65535:
                raise SettingsError(opt, f"must be a port from 0 to 65535, got {str(raw)[:40]}")
            return port
        if kind in ("int", "pos_int", "int_or_none", "pos_int_or_none", "priority", "priority_or_none"):
            if isinstance(raw, str) and raw.strip().lower() in ("none", ""):
                if kind.endswith("_or_none"):
                    return None
            value = int(str(raw).replace("_", "")) if not isinstance(raw, int) else raw
            if kind in ("pos_int", "pos_int_or_none") and value <= 0:
                raise SettingsError(opt, f"must be a positive integer, got {value}")
            if kind.startswith("priority") and not 0 <= value <= 100:
                raise SettingsError(opt, f"must be a retention priority between 0 and 100, got {value}")
            if kind == "int_or_none" and value < 0:
                raise SettingsError(opt, f"must be >= 0, got {value}")
            return value
        if kind in ("pos_float", "nonneg_float", "fraction", "float_or_none", "pos_float_or_none"):
            if isinstance(raw, str) and raw.strip().lower() in ("none", "") and kind.endswith("_or_none"):
                return None
            number = float(raw)
            if number != number or number in (float("inf"), float("-inf")):
                raise SettingsError(opt, f"must be a finite number, got {raw!r}")
            if kind in ("pos_float", "pos_float_or_none") and number <= 0:
                raise SettingsError(opt, f"must be > 0, got {raw!r}")
            if kind in ("nonneg_float", "float_or_none") and number < 0:
                raise SettingsError(opt, f"must be >= 0, got {raw!r}")
            if kind == "fraction" and not 0 < number < 1:
                raise SettingsError(opt, f"must be a fraction between 0 and 1 (exclusive), got {raw!r}")
            minimum = f.metadata.get("minimum")
            if minimum is not None and number < minimum:
                raise SettingsError(opt, f"must be at least {minimum} s, got {raw!r}")
            return number
        if choices and isinstance(raw, (int, float)) and not isinstance(raw, bool):
            raw = str(raw)  # trtllm_version = 1.3: a number that can only mean the choice it spells
        if not isinstance(raw, str):
            # The command line and the environment give strings; a settings file may give `record = 5`, which
            # would record to a file named "5": a path, a name or a choice is written as a TOML string.
            raise SettingsError(opt, f"must be a string (in quotes in a settings file), got "
                                     f"{type(raw).__name__} {str(raw)[:40]}")
        text = raw
        if f.metadata.get("nonempty") and not text.strip():
            raise SettingsError(opt, "must not be empty")
        if choices and text not in choices:
            from kvtop.suggest import did_you_mean

            hint = did_you_mean(text, choices, fold=str.lower, quote=True)
            raise SettingsError(opt, f"must be one of {', '.join(choices)}, got {text!r}{hint}")
        return text
    except SettingsError:
        raise
    except (TypeError, ValueError) as exc:
        raise SettingsError(opt, f"{exc}" if "must" in str(exc) or "size" in str(exc)
                            else f"not a valid value: {raw!r}") from None


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kvtop" / "kvtop.toml"


def load_settings(cli: dict[str, Any] | None = None, config_path: str | Path | None = None,
                  environ: dict[str, str] | None = None) -> Settings:
    """Defaults, then the TOML file, then KVTOP_* variables, then the command line (which wins)."""
    s = Settings()
    env = os.environ if environ is None else environ
    path = Path(config_path) if config_path else Path(env["KVTOP_CONFIG"]) if env.get("KVTOP_CONFIG") else None
    if path is None and default_config_path().exists():
        path = default_config_path()
    s.config_file = str(path if path is not None else default_config_path())
    if path is not None:
        if tomllib is None:
            raise SettingsError("--config", "reading TOML needs Python 3.11+")
        for key, value in _file_settings(path).items():
            s.set(key.replace("-", "_"), value, f"file {path}")
    names = {f.name for f in Settings.option_fields()}
    for key, value in env.items():
        if key.startswith("KVTOP_") and key not in ("KVTOP_CONFIG", "KVTOP_MQTT_PASSWORD"):
            name = key[len("KVTOP_"):].lower()
            if name in names:
                s.set(name, value, f"environment {key}")
    for key, value in (cli or {}).items():
        s.set(key, value, "command line")
    return s


def _file_settings(path: Path) -> dict[str, Any]:
    """The settings a TOML file gives: its top-level keys, or those of a ``[kvtop]`` table (not both, and no other
    table: a key in a table kvtop does not read would be ignored without a word)."""
    assert tomllib is not None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError("--config", f"no such file: {path}") from None
    except IsADirectoryError:
        raise SettingsError("--config", f"{path} is a directory, not a TOML settings file") from None
    except OSError as exc:
        raise SettingsError("--config", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SettingsError("--config", f"{path} is not a text file (not UTF-8)") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError("--config", f"{path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise SettingsError("--config", f"{path} is not a settings file: it nests arrays or tables too "
                                        "deeply") from None
    data = {k: v for k, v in data.items() if k != UI_TABLE}   # the dashboard's own choices (ui_choices)
    section = data.get("kvtop")
    if isinstance(section, dict):
        others = [key for key in data if key != "kvtop"]
        if others:
            raise SettingsError("--config", f"{path}: settings go at the top level or in its [kvtop] table, not "
                                            f"both (also at the top level: {', '.join(others)[:80]})")
        data = section
    for key, value in data.items():
        if isinstance(value, dict):
            raise SettingsError("--config", f"{path}: a [{key[:40]}] table, which kvtop does not read: settings "
                                            "go at the top level (refresh = 0.5)")
    return data


# ------------------------------------------------------------------------------------------------ remembered choices
# The dashboard remembers what was chosen in it (the theme, the event log, the requests view, the tables' sorts) in
# the settings file: the theme as the ``theme`` setting (where the file keeps its settings: the top level or its
# [kvtop] table), the layout in a ``[ui]`` table of its own, which load_settings leaves to the dashboard. The file
# is rewritten line by line (every other line, comment and key as it was), checked by reading it back (every key
# the user had, unchanged), and replaced in one step (a temporary file beside it, then a rename), so a crash or a
# full disk leaves the old file whole.

UI_TABLE = "ui"
_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def ui_choices(path: str | Path | None) -> dict[str, Any]:
    """The ``[ui]`` table of the settings file at ``path`` ({} where there is no file or no table); a file that
    cannot be read raises SettingsError naming it."""
    if path is None or not Path(path).exists() or tomllib is None:
        return {}
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError("--config", f"cannot read {path}: {exc}") from None
    table = data.get(UI_TABLE)
    return dict(table) if isinstance(table, dict) else {}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # a JSON string is a TOML basic string (\" \\ \n \uXXXX); non-ASCII kept as it is
    return json.dumps(str(value), ensure_ascii=False)


def _sections(lines: list[str]) -> dict[str | None, tuple[int, int]]:
    """Each table's lines (start, end), the top level's under None (before the first header)."""
    out: dict[str | None, tuple[int, int]] = {}
    name: str | None = None
    start = 0
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if m:
            out.setdefault(name, (start, i))
            name, start = m.group(1).strip().strip('"'), i + 1
    out.setdefault(name, (start, len(lines)))
    return out


def _set_keys(lines: list[str], table: str | None, values: dict[str, Any]) -> list[str]:
    for key, value in values.items():
        spans = _sections(lines)
        new = f"{key} = {_toml_value(value)}"
        if table not in spans:
            lines = [*lines, *([""] if lines and lines[-1].strip() else []), f"[{table}]", new]
            continue
        start, end = spans[table]
        pattern = re.compile(rf"^\s*(\"?){re.escape(key)}\1\s*=")
        at = next((i for i in range(start, end) if pattern.match(lines[i])), None)
        if at is not None:
            lines[at] = new
            continue
        last = end
        while last > start and not lines[last - 1].strip():
            last -= 1
        lines.insert(last, new)
    return lines


def remember_choices(path: str | Path, settings: dict[str, Any], ui: dict[str, Any]) -> Path:
    """Write ``settings`` (Settings fields, e.g. the theme) and ``ui`` (the ``[ui]`` table) into the settings file
    at ``path``, keeping everything else in it; returns the file written. A file or folder that cannot be written,
    or a file this cannot rewrite without changing another key, raises SettingsError saying so (nothing changed)."""
    target = Path(path).expanduser()
    try:
        target = target.resolve()   # a symlinked dotfile: its target is rewritten, the link stays a link
        text = target.read_text(encoding="utf-8") if target.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError("settings file", f"cannot read {target}: {getattr(exc, 'strerror', None) or exc}") from None
    if tomllib is None:
        raise SettingsError("settings file", "remembering the dashboard's choices needs Python 3.11+ (tomllib)")
    try:
        before: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError("settings file", f"{target} is not valid TOML ({exc}): left as it is") from None
    where = "kvtop" if isinstance(before.get("kvtop"), dict) else None
    lines = text.splitlines()
    lines = _set_keys(lines, where, settings)
    lines = _set_keys(lines, UI_TABLE, ui)
    new_text = "\n".join(lines) + "\n"
    expected = copy.deepcopy(before)
    (expected.setdefault("kvtop", {}) if where else expected).update(settings)
    existing = expected.get(UI_TABLE)
    expected[UI_TABLE] = {**(existing if isinstance(existing, dict) else {}), **ui}
    if tomllib.loads(new_text) != expected:
        raise SettingsError("settings file", f"{target}: cannot remember the dashboard's choices without changing "
                                             "other settings (a key spread over several lines?): left as it is")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(new_text)
                f.flush()
                os.fsync(f.fileno())
            if target.exists():
                os.chmod(tmp, target.stat().st_mode & 0o7777)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise SettingsError("settings file", f"cannot save to {target}: {exc.strerror or exc}") from None
    return target
