"""``kvtop [options]``: drive a workload through an engine (TensorRT-LLM, or its simulator) and watch its KV cache
tiers, on the dashboard or headless; every Settings field is an option (kvtop/options.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import kvtop.commands
from kvtop import DISTRIBUTION, __version__, options
from kvtop.settings import Settings, SettingsError, load_settings

# The command list of `kvtop --help` (kvtop/commands/__init__.py's docstring, its second paragraph).
COMMANDS = (kvtop.commands.__doc__ or "").split("\n\n")[1].rstrip()


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """Every Settings field becomes --field-name (defaults stay None so that file and environment layers show)."""
    options.add_settings(p)
    p.add_argument("--gpu-cache", dest="gpu_cache", default=None, metavar="TOKENS|FRACTION",
                   help="GPU KV cache: a token count (131072) or a fraction of free GPU memory (0.9)")
    options.add_config_option(p)
    p.add_argument("--show-settings", action="store_true", help="print every setting and where it came from")


def cli_values(ns: argparse.Namespace) -> dict[str, Any]:
    values = options.given(ns)
    gpu_cache = getattr(ns, "gpu_cache", None)
    if gpu_cache is not None:
        text = str(gpu_cache).strip()
        try:
            number = float(text)
        except ValueError:
            raise SettingsError("--gpu-cache", f"expected a token count or a fraction, got {text!r}") from None
        if 0 < number < 1:
            values["gpu_cache_fraction"] = number
            values["gpu_cache_tokens"] = "none"
        elif number >= 1 and number == int(number):
            values["gpu_cache_tokens"] = int(number)
        else:
            raise SettingsError("--gpu-cache", f"expected a token count >= 1 or a fraction in (0, 1), got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    # The options below drive TensorRT-LLM or its simulator; a vLLM, SGLang or Dynamo user reads that kvtop is for
    # them too (kvtop attach), not that it is TensorRT-LLM's alone
    p = options.UsageParser(prog="kvtop", description="top for the KV cache tiers of LLM inference engines.\nThese "
                            "options drive TensorRT-LLM (or kvtop's simulator of it);\nkvtop attach watches vLLM, "
                            "SGLang, Dynamo and trtllm-serve.", formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="other commands (each with --help):\n" + COMMANDS)
    p.add_argument("--version", action="version", version=f"kvtop {__version__} ({DISTRIBUTION})")
    _add_run_options(p)
    return p


def main(argv: Sequence[str]) -> int:
    """``kvtop [options]``: the driven run, on the dashboard or headless (``--show-settings``: the settings and
    where each came from)."""
    ns = build_parser().parse_args(list(argv))  # first: --help and --version need nothing else
    settings = load_settings(cli_values(ns), config_path=ns.config)
    if ns.show_settings:
        from kvtop.mqtt_wire import redact_url
        from kvtop.textsafe import clean

        kinds = {f.name: f.metadata.get("kind") for f in Settings.option_fields()}
        for name, value, origin in settings.describe():
            # A URL may carry a password (kvtop refuses one in --publish, but a config file may hold any URL).
            said = redact_url(value) if isinstance(value, str) and "://" in value else options.shown(value, kinds[name])
            print(clean(f"{name:32} {said:24} {origin}", None))
        return 0
    from kvtop import runner

    try:
        session = runner.build_session(settings)
    except runner.RunError as exc:
        print(f"kvtop: {exc}", file=sys.stderr)
        return 2
    from kvtop.modes import headless_wanted

    if headless_wanted(settings):
        from kvtop.modes import run_headless, run_headless_until

        if settings.scenario == "trace":
            # A trace ends when it has been answered (every request's record folded, the engine drained once
            # more), or at --duration when given first; the other scenarios run for --duration (30 s)
            return run_headless_until(session, settings.duration, settings.json, ("workload",))
        return run_headless(session, settings.duration if settings.duration is not None else 30.0, settings.json)
    from kvtop.modes import run_dashboard

    return run_dashboard(session, settings)


__all__ = ["build_parser", "cli_values", "main"]
