"""The compact layout's key hints and the help screen."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from kvtop.ui import format as fmt


class KeyHints(Static):
    """The footer of the compact layout: Textual's footer cuts keys off at 40 columns; this names the few
    that matter and points to the help, which lists the rest."""

    def __init__(self, *, id: str | None = None):
        super().__init__(Content.assemble(("q", "bold $primary"), " quit  ", ("p", "bold $primary"), " pause  ",
                                          ("?", "bold $primary"), " help  ", ("^p", "bold $primary"), " commands"),
                         id=id)


# ------------------------------------------------------------------------------------------------ help

HELP_TEXT = """\
[b $primary]kvtop[/]: where the KV cache blocks of the engine live, and how they move

[b]Keys[/]
  [b]q[/] quit          [b]p[/] pause / resume the screen (the engine goes on)
  [b]r[/] reset window  [b]t[/] next theme (dark, light, high-contrast)
  [b]e[/] event log     [b]s[/] next source (when several are attached)
  [b]+ -[/] refresh more / less often (0.1 to 5 s)
  [b]?[/] this help     [b]ctrl+p[/] commands (screenshot: into the working dir)
  [b]R[/] requests view: recent and in-flight requests, one row each

[b]Tables[/]  the sources table (2+ sources) and the requests view (R)
  [b]o[/] sort by the next column (sources: hit rate first; requests: TTFT)
  [b]O[/] the other way     [b]click a header[/] sort by it (again: reverse)
  [b]/[/] filter as you type (a name, status, id, error): [b]Enter[/] keeps, [b]Esc[/] clears
  [b]j[/] [b]k[/] cursor down, up   [b]click[/] a row: cursor   [b]Enter[/] or [b]double click[/]: open
    it (a source: the big panels show it; a request: its whole row)
  Theme, event log, requests view and sorts are remembered in the settings
  file (its \\[ui] table; ~/.config/kvtop/kvtop.toml, --config, KVTOP_CONFIG).

[b]Replay[/]  (kvtop replay FILE) the header's REPLAY badge: place / length, speed
  [b]p[/] pause / play the replay itself   [b]+ -[/] speed x0.25 .. x64, max
  [b]← →[/] seek 5 s back / on   [b]home end[/] start / end of the recording
  [b]. ,[/] step 1 s on / back (pauses); back re-folds from the start

[b]Tiers[/]  one bar per tier: parts that never overlap and fill the pool. Each
  tier keeps its colour in every panel: [b $kv-gpu]GPU[/], [b $kv-host]host[/], [b $kv-disk]disk[/]
  [$kv-gpu]█[/][$kv-host]█[/] [b]in use[/]      held by running requests
{in_use}  [$kv-gpu-cached]▓[/][$kv-host-cached]▓[/] [b]cached idle[/] reusable KV no request holds: evicted or
                 offloaded first
  [$kv-gpu-empty]░[/][$kv-host-empty]░[/] [b]empty[/]       no request holds it, nothing reusable in it
{free}  hold: the "reuse tree" line.
  Headline: GPU % in use, host % cached.
  [$warning]≈[/] the split is an estimate (held blocks taken as cached first), or
{dropped}
[b]Hit rate[/]  reused prompt blocks / prompt blocks looked up, over the window
  and since start; GPU + host = total (a host hit: onboarded from host).
[b]Size[/]  "host×0 ½ 1 2 4: 38 38 39 42 42% opt 46": the hit rate with no host
  cache, half, this one (the run's own since start), 2x and 4x, estimated from
  the blocks it moved and dropped; opt: the best any policy could do here.
[b]Moves[/]  offload GPU→host {offload}, onboard host→GPU on reuse, evict:
  dropped from a tier. left: why blocks left each tier (evicted, offloaded,
  released, cleared), "(engine)" where its events say so, "(inferred)" where
  kvtop worked it out (vLLM's and SGLang's removals give no reason).
[b]Requests[/]  failed N: the last error is under the counts, in the event log
  and at the top of this help.
[b]Header[/]  PAUSED: the screen froze, the engine goes on. FINISHED: no more
  data will come (replay end, --duration). [$warning]no data 8s[/]: data should come.
[b]Sources[/]  (2+ attached) one row each, ▶ the one shown. [b]all[/]: sums of
  blocks and rates, hit = hits / lookups, TTFT p99 = max of the sources'.
"""
# The lines above that name an engine's fields: TensorRT-LLM's where the source is TensorRT-LLM or its simulator,
# the engine's own or neutral words for any other (vLLM, SGLang, Dynamo: kvtop/engine_words.py)
HELP_TRTLLM = {
    "in_use": "                 (TensorRT-LLM: capacity - freeNumBlocks)\n",
    "free": "  TensorRT-LLM's [b]free[/] (freeNumBlocks) = cached idle + empty: the ┐┘\n"
            "  bracket. Its [b]cached[/] (the reuse tree) also counts blocks requests\n",
    "dropped": "    TensorRT-LLM 1.2 dropped a cached block silently (an upper bound).\n",
    "offload": "on eviction",
}
HELP_ANY = {
    "in_use": "",
    "free": "  [b]free[/] = cached idle + empty: the ┐┘ bracket. The blocks the events\n"
            "  announced (the reuse tree) also count blocks requests\n",
    "dropped": "    the stream lost batches or began after the engine did (since attach).\n",
    "offload": "a copy",
}


def help_text(trtllm: bool = True) -> str:
    """The help's markup, in the words of the source's engine (``trtllm``: TensorRT-LLM or its simulator)."""
    return HELP_TEXT.format_map(HELP_TRTLLM if trtllm else HELP_ANY)


# On the help's border, so that it shows when the help is taller than the screen (at 120x40 since the replay's keys)
HELP_HINT = "↑↓ scroll · esc or ? closes this help"


class HelpScreen(ModalScreen[None]):
    """Keys and what every number means."""

    BINDINGS: ClassVar = [("escape", "dismiss", "Close"), ("question_mark", "dismiss", "Close"),
                          ("q", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 82; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    HelpScreen Static { width: 100%; height: auto; }
    """

    def __init__(self, last_error: str | None = None, failed: int = 0, trtllm: bool = True):
        super().__init__()
        self.last_error = last_error
        self.failed = failed
        self.trtllm = trtllm   # the source is TensorRT-LLM or its simulator: the help names its fields

    def compose(self) -> ComposeResult:
        text = Content.from_markup(help_text(self.trtllm))
        if self.last_error:
            # The last failed request's error, whole (the panel cuts it to its width), first: stripped of
            # control characters, and put in as plain text, never as markup.
            text = Content.assemble(("Last error", "bold $error"), f" ({self.failed} failed): ",
                                    fmt.clean(self.last_error, limit=600), "\n\n", text)
        # Scrollable: at 80x24 the help is taller than the screen.
        with VerticalScroll(id="help-scroll"):
            yield Static(text, id="help-text")

    def on_mount(self) -> None:
        scroll = self.query_one("#help-scroll")
        scroll.border_subtitle = HELP_HINT
        scroll.focus()

    def action_dismiss(self, result: None = None) -> Any:
        return self.dismiss(result)
