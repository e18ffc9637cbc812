"""Command-line options, declared once: every option that is a setting comes from its ``Settings`` field.

``kvtop``, ``kvtop attach`` / ``replay``, ``kvtop sim``, ``kvtop agent`` and ``kvtop estimate`` each take the
settings that mean something to them (``ATTACH_SETTINGS``, ``SIM_SETTINGS``...), declared here from the field's
name, doc, kind and default, so that an option is spelled, documented and validated the same way in every subcommand
(tests/commands/test_cli.py checks that no subcommand declares a setting by hand).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from kvtop.settings import Settings, SettingsError
from kvtop.suggest import close_names

# What each subcommand takes of the settings (the driven run takes them all).
ATTACH_SETTINGS = ("headless", "json", "duration", "theme", "refresh", "record", "append", "prometheus_port",
                   "prometheus_addr", "warmup_requests")
ATTACH_ONLY_SETTINGS = ("mqtt_password_file",)  # kvtop attach mqtt://, not kvtop replay
SIM_SETTINGS = ("trace", "model", "gpu", "tokens_per_block", "gpu_cache_fraction", "max_batch_size",
                "max_num_tokens", "capacity_scheduler_policy", "kv_cache_dtype", "tensor_parallel_size", "json")
AGENT_SETTINGS = ("mqtt_password_file", "duration", "json")
ESTIMATE_SETTINGS = ("model", "gpu", "tokens_per_block", "kv_cache_dtype", "tensor_parallel_size",
                     "gpu_cache_fraction", "json")


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser that knows its option strings, so that an unknown option's error names the nearest known
    one ("unrecognized arguments: --hots-cache 10GB; did you mean --host-cache?")."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        # -h/--help is added by ArgumentParser.__init__, before this class's own attributes could be set
        self.__dict__.setdefault("known_options", []).extend(action.option_strings)
        return action

    def with_hint(self, message: str) -> str:
        """``message`` with a "did you mean" for each unrecognized option that is close to a known one."""
        head = "unrecognized arguments: "
        if not message.startswith(head):
            return message
        known = [o for o in self.__dict__.get("known_options", []) if o.startswith("--")]
        hints = []
        for word in message[len(head):].split():
            if word.startswith("--"):
                option = word.split("=", 1)[0]
                near = close_names(option, known)
                if near:
                    hints.append((option, " or ".join(near)))
        if len(hints) == 1:
            return f"{message} (did you mean {hints[0][1]}?)"
        if hints:
            return f"{message} (did you mean " + ", ".join(f"{near} for {option}" for option, near in hints) + "?)"
        return message


class OptionParser(SuggestingParser):
    """An ArgumentParser whose errors are one line naming the command (``kvtop attach: ...``), never a usage dump."""

    def error(self, message: str) -> Any:
        raise SettingsError(self.prog, self.with_hint(message))


class UsageError(Exception):
    """A command line that is not kvtop's: kvtop.cli prints it as one line, ``kvtop: ...``, and exits 2."""


class UsageParser(SuggestingParser):
    """The parser of ``kvtop [options]`` and ``kvtop sim``: an error is a UsageError, ``kvtop: ...`` (the other
    commands' OptionParser names the command in it)."""

    def error(self, message: str) -> Any:  # one clear line, not argparse's usage dump + exit
        raise UsageError(self.with_hint(message))


def _field(name: str) -> Any:
    for f in Settings.option_fields():
        if f.name == name:
            return f
    raise KeyError(f"no setting named {name!r}")


def option_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings(p: argparse.ArgumentParser, names: Iterable[str] | None = None, *,
                 defaults: Mapping[str, Any] | None = None, help: Mapping[str, str] | None = None,
                 required: Iterable[str] = ()) -> None:
    """Declare the named settings (all of them by default) as ``--field-name`` options.

    Values stay ``None`` unless given, so that the file and environment layers (``load_settings``) show through;
    ``defaults`` only changes what ``--help`` says (and what :func:`converted` falls back to), for a subcommand
    whose default differs (``kvtop sim`` sizes batches for trace replays). ``help`` replaces a field's doc where a
    subcommand means something narrower by it.
    """
    fields = Settings.option_fields() if names is None else [_field(n) for n in names]
    defaults = defaults or {}
    help = help or {}
    must = set(required)
    for f in fields:
        kind = f.metadata.get("kind")
        default = defaults.get(f.name, f.default)
        text = help.get(f.name, f.metadata.get("doc", ""))
        if default is not None and kind != "bool":
            text += f" (default: {shown(default, kind)})"
        if kind == "bool":
            action = p.add_argument(option_name(f.name), dest=f.name, action="store_const", const=True,
                                    default=None, help=text)
        else:
            action = p.add_argument(option_name(f.name), dest=f.name, default=None, required=f.name in must,
                                    metavar="SIZE" if kind == "size" else f.name.upper().replace("_", "-"),
                                    help=text)
        action.kvtop_setting = f.name  # type: ignore[attr-defined]  # how tests tell it from a hand-made one


def shown(value: Any, kind: str | None) -> str:
    """A setting's value as ``--help`` and ``--show-settings`` say it: a size as a size ("32 GB", which
    --host-cache takes back, not 32000000000), a value not set as "not set" (never Python's None)."""
    if value is None:
        return "not set"
    if kind == "size" and isinstance(value, int):
        from kvtop.engines.sizing import size_text  # the GPU and model tables: only where a size is declared

        return size_text(value)
    return str(value)


def add_config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="TOML settings file (default ~/.config/kvtop/kvtop.toml)")


def given(ns: argparse.Namespace, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The settings given on the command line, as typed (``load_settings`` converts them, naming the option)."""
    fields = Settings.option_fields() if names is None else [_field(n) for n in names]
    return {f.name: getattr(ns, f.name) for f in fields if getattr(ns, f.name, None) is not None}


def converted(ns: argparse.Namespace, names: Iterable[str], defaults: Mapping[str, Any] | None = None
              ) -> dict[str, Any]:
    """The named settings from the command line alone (no file, no environment), converted and validated as
    ``Settings`` does; a setting not given is its default (``defaults`` first, else the field's)."""
    s = Settings()
    names = list(names)
    for name, value in (defaults or {}).items():
        setattr(s, name, value)
    for name, value in given(ns, names).items():
        s.set(name, value, "command line")
    return {name: getattr(s, name) for name in names}


def nonneg_float(option: str, text: str) -> float:
    """An option's number >= 0 (``--interval 0.5``); a SettingsError naming the option otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(option, f"expected a number, got {text!r}") from None
    if value < 0 or value != value:
        raise SettingsError(option, f"must be >= 0, got {text!r}")
    return value


def whole_number(option: str, text: str, minimum: int) -> int:
    """An option's whole number >= ``minimum`` (``--max-sources 64``, ``1e3`` taken as 1000)."""
    try:
        value = int(float(text))
    except (ValueError, OverflowError):
        raise SettingsError(option, f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise SettingsError(option, f"must be >= {minimum}, got {text!r}")
    return value


__all__ = ["AGENT_SETTINGS", "ATTACH_ONLY_SETTINGS", "ATTACH_SETTINGS", "ESTIMATE_SETTINGS", "OptionParser",
           "SIM_SETTINGS", "SuggestingParser", "UsageError", "UsageParser",
           "add_config_option", "add_settings", "converted", "given", "nonneg_float", "option_name", "shown",
           "whole_number"]
