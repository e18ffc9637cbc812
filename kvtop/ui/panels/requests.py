"""The requests panel: in flight, completed, rates and latencies."""

from __future__ import annotations

import textwrap

from kvtop.ui import format as fmt
from kvtop.ui.panel import (
    BLANK,
    S_DIM,
    S_ERR,
    S_FIG,
    Line,
    Panel,
    fit,
    fit_lines,
    line_of,
    padded,
)
from kvtop.values import frozen


@frozen
class RequestData:
    in_flight: int | None
    completed: int
    failed: int
    requests_per_s: float | None
    output_tokens_per_s: float | None
    prompt_tokens_per_s: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    latency_window: bool      # True: percentiles over the window; False: since start (window empty)
    last_error: str | None
    # TTFT by where the prefix came from: (label, p50 s, p99 s, requests), over the same span as the TTFT row
    by_source: tuple[tuple[str, float | None, float | None, int], ...] = ()
    # Why the counts are unknown, where the source has no requests to count (a KV event stream:
    # kvtop/engine_words.py requests_unknown_why): said instead of zeros
    unknown_why: str | None = None


class RequestPanel(Panel[RequestData]):
    """In flight, done, failed, request and token rates, TTFT and end-to-end percentiles."""

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Requests"

    def show(self, data: RequestData) -> bool:
        changed = super().show(data)
        if changed:
            self._set_state("warn" if data.failed else "ok")
        return changed

    def build(self) -> Line | list[Line]:
        d: RequestData | None = self.data
        width, height = self.inner
        if d is None:
            return BLANK
        if d.unknown_why:
            return fit_lines([line_of((t, S_DIM)) for t in textwrap.wrap(d.unknown_why, max(width, 1))], width, height)
        fail_style = S_ERR if d.failed else S_FIG
        if height == 1:
            return fit(line_of(("req ", "bold"), (fmt.count(d.in_flight), S_FIG), (" in flight ", S_DIM),
                                 (fmt.rate(d.requests_per_s), S_FIG), ("/s ", S_DIM), ("TTFT ", S_DIM),
                                 (fmt.seconds_ms(d.ttft_p50), S_FIG)), width)
        span = "win" if d.latency_window else "all"
        w1, w2 = (5, 6) if width >= 44 else (0, 0)
        lines = [
            line_of(("in flight ", S_DIM), (padded(fmt.count(d.in_flight), w1), S_FIG), ("  done ", S_DIM),
                     (padded(fmt.count(d.completed), w2), S_FIG), ("  failed ", S_DIM),
                     (fmt.count(d.failed), fail_style)),
            line_of(("req/s ", S_DIM), (padded(fmt.rate(d.requests_per_s), w1), S_FIG), ("  tok/s out ", S_DIM),
                     (fmt.rate(d.output_tokens_per_s), S_FIG), (" in ", S_DIM),
                     (fmt.rate(d.prompt_tokens_per_s), S_FIG)),
            line_of((f"TTFT {span} ", S_DIM), ("p50 ", S_DIM), (padded(fmt.seconds_ms(d.ttft_p50), 7), S_FIG),
                     (" p99 ", S_DIM), (padded(fmt.seconds_ms(d.ttft_p99), 7), S_FIG)),
            line_of((f"e2e  {span} ", S_DIM), ("p50 ", S_DIM), (padded(fmt.seconds_ms(d.e2e_p50), 7), S_FIG),
                     (" p99 ", S_DIM), (padded(fmt.seconds_ms(d.e2e_p99), 7), S_FIG)),
        ]
        if d.by_source and height >= 5:
            # TTFT by where the prefix came from, the verdict's evidence: a host hit against a miss, side by side,
            # each class's request count in its heading, then its p50/p99 in ms
            def ms(s: float | None) -> str:
                return "?" if s is None else f"{s * 1000:.1f}" if s < 0.0095 else f"{s * 1000:,.0f}"

            lines.append(line_of((f"TTFT {span} by ", S_DIM),
                                 *[(padded(f"{label} {fmt.count(n)}", 10), S_DIM) for label, _, _, n in d.by_source]))
            lines.append(line_of(("p50/p99 ms ", S_DIM),
                                 *[(padded(f"{ms(p50)}/{ms(p99)}", 10), S_FIG) for _, p50, p99, _ in d.by_source]))
        if d.failed and d.last_error:
            # Why they failed, not only how many: its own line where the panel has one to spare, else after the
            # count on the first line (cut to fit). The whole text is in the event log and the help (?).
            why = fmt.clean(d.last_error)
            if height >= 3:
                lines = [*lines[: height - 1], line_of(("last error ", S_DIM), (why, S_ERR))]
            else:
                lines[0] = line_of(lines[0], (" ✖ ", S_ERR), (why, S_ERR))
        return fit_lines(lines, width, height)
