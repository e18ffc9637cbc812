"""The header: what is watched, its state, the verdict line."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from kvtop.sources.replay import ReplayPlayer, speed_text
from kvtop.ui import format as fmt
from kvtop.ui.panel import (
    S_DIM,
    S_FIG,
    Line,
    Panel,
    cells,
    fit,
    fit_lines,
    line_of,
)
from kvtop.ui.themes import tier_style
from kvtop.values import frozen


@frozen
class ReplayBadge:
    """A replay's place, as the header's REPLAY badge shows it: whole seconds, so that it is drawn again once a
    second, not at every refresh."""

    position_s: int
    length_s: int | None
    speed: float
    paused: bool = False
    seeking: bool = False

    def text(self) -> str:
        """REPLAY 0:12 / 0:30 x4 (seeking: while a seek folds its way there)."""
        length = "?" if self.length_s is None else replay_clock(self.length_s)
        return (f"REPLAY {replay_clock(self.position_s)} / {length} {speed_text(self.speed)}"
                + (" seeking" if self.seeking else ""))


def replay_clock(s: float) -> str:
    """0:12, 12:05, 1:02:03: a position in a recording."""
    n = max(0, int(s))
    h, rest = divmod(n, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def replay_badge(player: ReplayPlayer) -> ReplayBadge:
    """The badge of a ReplayPlayer (kvtop/sources/replay.py) now."""
    length = player.length_s
    return ReplayBadge(int(player.position_s), None if length is None else round(length),
                       player.speed, player.paused, player.seeking)


@frozen
class HeaderData:
    engine: str | None
    engine_version: str | None
    model: str | None
    gpu: str | None
    simulated: bool
    sim_reason: str | None
    tokens_per_block: int | None
    bytes_per_block: int | None
    uptime_s: float | None
    data_time: float | None
    paused: bool
    stale_s: float | None          # seconds since the last record, once it is past STALE_AFTER_S
    flags: tuple[str, ...]         # data-quality notes, short ("≈ counts", "events dropped 12")
    sources: tuple[tuple[str, str], ...]  # (name, status) for the ones that are not "ok"/"done"
    source_label: str | None       # "2/3 host/0/run" when several sources are attached
    finished: str | None = None    # why no more data comes ("replay finished", "--duration 30 s reached")
    paused_at: float | None = None  # paused: the data time of the frozen figures
    stats_schema: str | None = None  # which TensorRT-LLM's stats the numbers come from: 1.0-1.2, 1.3, 1.3+ V2
    # the verdict per tier below the GPU (kvtop/tiers/verdict.py): its own line under the header
    verdict: tuple[VerdictLine, ...] = ()
    replay: ReplayBadge | None = None   # a replay's place and speed (its own clock), None live
    refresh_s: float | None = None      # the refresh interval, where + / - moved it off the default


@frozen
class VerdictLine:
    says: str        # pays | costs | idle | none | unknown
    text: str        # "host tier: pays, -38 ms TTFT p50 on 31% of requests, 4.1 s of prefill saved per minute"
    basis: str       # "measured", "measured prefill", "estimated", "not priced": what the figures rest on
    short: str       # "host: pays, -38 ms TTFT p50 on 31%, +4.1 s/min": where the line is narrow
    tier: str = ""   # the tier it is about ("host", "disk"): its name in the text is drawn in the tier's colour


# Between the header's parts (model │ GPU │ engine): a rule, not spaces, so that "Qwen3-8B  up" never reads as one.
SEP = (" │ ", S_DIM)

_VERDICT_STYLE = {"pays": "bold $success", "costs": "bold $error", "idle": "bold $warning"}


def verdict_line(verdicts: tuple[VerdictLine, ...], width: int) -> Line:
    """The answer in one line: each tier's verdict in words, coloured by what it says, with what it rests on
    (a presenter points at it; "estimated" says the figures are the cost model's, not the engine's). The longest
    form that fits: the sentence, else the short form with its basis, else the short form alone (cut to fit)."""
    def build(text: Callable[[VerdictLine], str], basis: bool, head: str) -> Line:
        parts: list[Any] = [(head, "bold $primary")] if head else []
        for i, v in enumerate(verdicts):
            if i:
                parts.append(("  ·  ", S_DIM))
            said, style = text(v), _VERDICT_STYLE.get(v.says, S_DIM)
            name, colon, rest = said.partition(":")
            if v.tier and colon and name.split()[0].lower() == v.tier.lower():
                # "host tier: pays, ...": the tier's name in its colour, what it says in the verdict's
                parts += [(name, tier_style(v.tier, bold=True)), (colon + rest, style)]
            else:
                parts.append((said, style))
            if basis and v.says != "none" and v.basis not in said:   # "not priced" said once, not twice
                parts.append((f" ({v.basis})", S_DIM))
        return line_of(*parts)

    ln = build(lambda v: v.text, True, "verdict ")
    for text, basis, head in ((lambda v: v.short, True, "verdict "), (lambda v: v.short, True, ""),
                              (lambda v: v.short, False, "")):
        if cells(ln) <= width:
            break
        ln = build(text, basis, head)
    return fit(ln, width)


# The header's fields other than its two clocks: equal in two HeaderData, and both clocks on the same second, the
# header draws the same two lines (build shows the uptime in whole seconds, the data time to the second).
_HEADER_STEADY = tuple(f.name for f in fields(HeaderData) if f.name not in ("uptime_s", "data_time"))


def _shown_second(t: float | None) -> Any:
    """The second a clock reads on screen: fmt.duration shows int(s) (0 under one), time.localtime the floor."""
    if t is None:
        return None
    if not math.isfinite(t):
        return t   # no second; NaN never equals itself, so such data is drawn afresh
    return math.floor(t)


def same_header(a: HeaderData, b: HeaderData) -> bool:
    """Whether ``a`` and ``b`` draw the same header: the busy refresh's data differ by their clocks alone 3
    refreshes in 4 (both move a quarter of a second), and the header was built and compared whole for them."""
    if a.paused_at is not None or b.paused_at is not None:
        return a == b   # paused, the header shows how far the engine went on, rounded: every change is drawn
    if _shown_second(a.data_time) != _shown_second(b.data_time):
        return False
    ua, ub = a.uptime_s, b.uptime_s
    if (ua is None) != (ub is None) or (ua is not None and fmt.duration(ua) != fmt.duration(ub)):
        return False
    return all(getattr(a, name) == getattr(b, name) for name in _HEADER_STEADY)


class HeaderBar(Panel[HeaderData]):
    """Engine, version, model, SIM badge, block size, uptime; data freshness and quality badges."""

    def show(self, data: HeaderData) -> bool:
        old = self.data
        if isinstance(old, HeaderData) and isinstance(data, HeaderData) and self._lines and same_header(old, data):
            self.data = data   # the newest figures, for readers; the lines on screen are what they would build
            return False
        return super().show(data)

    def build(self) -> Line | list[Line]:
        d: HeaderData | None = self.data
        width, height = self.inner
        if d is None:
            return line_of(("kvtop", "bold"), "  waiting for the engine...")
        engine = d.engine_version or d.engine or "engine ?"
        model = d.model or "model ?"
        badge: list[Any] = []
        if d.simulated:
            badge = [(" SIM ", "bold reverse $kv-sim-badge"), " "]
        # Three states, three looks: paused (the screen froze, the engine goes on), finished (no more data will
        # come, the figures are final) and stale (data should come and has not: the only alarm of the three).
        paused = [(" PAUSED ", "bold reverse $primary"), " "] if d.paused else []
        if d.finished:
            paused = [*paused, (" FINISHED ", "bold reverse $success"), " "]
        if d.replay is not None:   # where the replay is, by its own clock, and how fast it goes
            paused = [(f" {d.replay.text()} ", "bold reverse $accent"), " ", *paused]
        up = fmt.duration(d.uptime_s)
        clock = time.strftime("%H:%M:%S", time.localtime(d.data_time)) if d.data_time is not None else "--:--:--"
        block = []
        if d.tokens_per_block is not None:
            block.append(f"{d.tokens_per_block} tok/blk")
        if d.bytes_per_block is not None:
            block.append(f"{fmt.nbytes(d.bytes_per_block)}/blk")
        if d.stats_schema not in (None, "1.0-1.2"):  # 1.0-1.2 is what every count assumes unless said
            block.append(f"stats {d.stats_schema}")
        status: list[Any] = []
        state_long: list[Any] = []
        state_short: list[Any] = []
        if d.finished:
            state_short = [(d.finished, "$success"), " "]
            state_long = [(d.finished, "$success"), (" · final figures · q quits ", S_DIM)]
        elif d.replay is not None and d.replay.paused:
            state_short = [("p plays ", S_DIM)]
            state_long = [("replay paused · p plays · ←→ seek 5 s · . steps 1 s · +- speed ", S_DIM)]
        elif d.paused:
            frozen = time.strftime("%H:%M:%S", time.localtime(d.paused_at)) if d.paused_at is not None else "?"
            ahead = (d.data_time - d.paused_at if d.data_time is not None and d.paused_at is not None else None)
            state_short = [("frozen ", S_DIM), (frozen, "bold"), " "]
            state_long = [(f"frozen at {frozen}", S_DIM),
                          (f" · engine goes on, +{ahead:.0f} s" if ahead else " · engine goes on", S_DIM),
                          (" · p resumes ", S_DIM)]
        if d.stale_s is not None:
            status += [(f" no data {d.stale_s:.0f}s ", "bold reverse $warning"), " "]
        for name, st in d.sources:
            status += [(f" {name} {st} ", "bold reverse $error" if st in ("failed", "error", "disconnected")
                        else "reverse $warning"), " "]
        for flag in d.flags:
            status += [(f" {flag} ", "reverse $warning"), " "]
        # The verdict's line, where the header has a row for it (kvtop.tcss gives one in every layout).
        verdict = verdict_line(d.verdict, width) if d.verdict and height >= 2 else None
        if verdict is not None:
            height -= 1
        if height <= 1 or width < 60:
            # One line: pieces in order of importance, each added only while it fits whole, each after a separator.
            short_model = model.split("/")[-1]
            pieces: list[Line] = [line_of(("kvtop ", "bold $primary"), *paused, *badge, (short_model, S_FIG)),
                                     line_of(SEP, ("up ", S_DIM), (up, S_FIG))]
            if status or state_short:
                pieces.append(line_of(SEP, *state_short, *status))
            pieces += [line_of(SEP, ("data ", S_DIM), (clock, "bold")),
                       line_of(SEP, (d.gpu or "GPU ?", tier_style("gpu", bold=True)))]
            if block:
                pieces.append(line_of(SEP, (" · ".join(block), S_DIM)))
            out = pieces[0]
            for piece in pieces[1:]:
                if cells(out) + cells(piece) <= width:
                    out = line_of(out, piece)
            return [fit(out, width), verdict] if verdict is not None else fit(out, width)
        # Model, GPU, engine and source, each after a separator (the GPU in its tier's colour).
        line1 = line_of(("kvtop ", "bold $primary"), *paused, *badge, (model, S_FIG), SEP,
                         (d.gpu or "GPU ?", tier_style("gpu", bold=True)), SEP, engine,
                         *([SEP, (d.source_label, "bold")] if d.source_label else []))
        right = line_of(("data ", S_DIM), (clock, "bold"), SEP, ("up ", S_DIM), (up, S_FIG),
                        *([SEP, ("refresh ", S_DIM), (f"{d.refresh_s:g} s", S_FIG)]
                          if d.refresh_s is not None else []))
        # The state and the alarms first: where the line is cut, it is the simulator's reason that goes.
        line2_left: list[Any] = [*state_long, *status]
        line2_left += [(" · ".join(block) or "block size ?", "bold")]
        if d.simulated:
            line2_left += [SEP, ("simulated: ", S_DIM), (d.sim_reason or "built-in simulator", "$kv-sim-badge")]
        line2_left.append("  ")
        line2 = line_of(*line2_left)
        gap = width - cells(line2) - cells(right)
        if gap >= 1:
            line2 = line_of(line2, " " * gap, right)
        else:
            line1_gap = width - cells(line1) - cells(right)
            if line1_gap >= 1:
                line1 = line_of(line1, " " * line1_gap, right)
        if verdict is not None:
            return fit_lines([line1, line2], width, height) + [verdict]
        return fit_lines([line1, line2], width, height)
