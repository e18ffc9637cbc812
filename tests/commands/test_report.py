"""kvtop report: charts and one self-contained page from simulated recordings, bad lines reported."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from sim_runs import record_sim_run  # noqa: E402

from kvtop.commands.report import main  # noqa: E402
from kvtop.records import read_jsonl  # noqa: E402
from kvtop.report.charts import plot_sweep  # noqa: E402
from kvtop.report.report import build_report  # noqa: E402
from kvtop.report.runs import load_run  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
BLOCK = 4718592  # one Qwen3-8B block of 32 tokens


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("runs")
    out = {}
    for name, host_blocks in (("host0", 0), ("host64", 64)):
        path = d / f"{name}.jsonl"
        record_sim_run(path, n_requests=80, host_cache_size=host_blocks * BLOCK, max_tokens=2048)
        out[name] = path
    return out


def test_recording_has_every_kind(recordings: dict[str, Path]) -> None:
    records = list(read_jsonl(recordings["host64"]))
    assert all(not isinstance(r, Exception) for r in records)
    kinds = {r.kind for r in records}
    assert kinds == {"meta", "stats", "kv_event", "request"}
    assert records[0].kind == "meta" and records[0].data["secondary_blocks"] == 64
    req = next(r for r in records if r.kind == "request")
    assert {"request_id", "ok", "ttft_s", "e2e_s", "prompt_tokens", "output_tokens", "reused_blocks"} <= set(req.data)
    times = [r.time for r in records]
    assert times == sorted(times)


def test_fold_numbers(recordings: dict[str, Path]) -> None:
    h0, h64 = load_run(recordings["host0"]), load_run(recordings["host64"])
    assert h0.summary["requests_completed"] == 80 == h64.summary["requests_completed"]
    assert h0.summary["host_hit_rate"] == 0 and h0.summary["onboarded_blocks"] == 0
    # 12 prefixes of 8 blocks compete for 64 GPU blocks: a 64-block host serves a real share of the hits
    assert h64.summary["host_hit_rate"] > 0.05
    assert h64.summary["hit_rate"] > h0.summary["hit_rate"]
    assert h64.summary["hit_rate"] == pytest.approx(h64.summary["gpu_hit_rate"] + h64.summary["host_hit_rate"])
    assert 0 < h64.summary["ttft_p50_s"] <= h64.summary["ttft_p99_s"]
    wi = h64.summary["what_if"]
    assert h64.summary["hit_rate"] <= wi["host_x2_hit_rate"] <= wi["host_x4_hit_rate"] <= 1


@pytest.mark.slow
def test_report_writes_charts_and_a_self_contained_page(recordings: dict[str, Path], tmp_path: Path) -> None:
    result = build_report([recordings["host0"], recordings["host64"]], tmp_path / "rep")
    for name in ("compare", "occupancy", "hit_rate", "moves", "ttft"):
        png = tmp_path / "rep" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG, name
    page = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 5
    assert not re.search(r"src=['\"](?!data:)", page)  # nothing fetched from elsewhere
    for needle in ("host0", "host64", "TTFT p50", "TTFT p99", "output tok/s", "what-if host x2"):
        assert needle in page
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert [r["name"] for r in summary["runs"]] == ["host0", "host64"]
    assert result["bad_lines"] == {}


@pytest.mark.slow
def test_bad_and_truncated_lines_are_reported_and_the_rest_charted(recordings: dict[str, Path], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lines = recordings["host64"].read_text().splitlines()
    good = len(lines)
    lines[4] = '{"v": 1, "kind": "stats", "time": "yesterday", "data": {}}'   # line 5: wrong type
    lines[9] = "not json at all"                                           # line 10
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n" + lines[-1][:40])            # truncated last line (a crash)
    assert main([str(broken), "-o", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert "3 bad line(s)" in err
    assert "line 5: time" in err and "line 10: json" in err and f"line {good + 1}: json" in err
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "line 5: time" in page and f"line {good + 1}" in page
    assert (tmp_path / "rep" / "occupancy.png").read_bytes()[:8] == PNG
    run = load_run(broken)
    assert run.records == good - 2 and run.summary["requests_completed"] == 80


def test_nothing_to_chart_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "garbage.jsonl"
    empty.write_text("nope\n{}\n")
    assert main([str(empty), "-o", str(tmp_path / "rep")]) == 3  # not a recording: as kvtop replay of it
    assert not (tmp_path / "rep").exists()
    assert main([str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "rep")]) == 2


def test_plot_sweep(tmp_path: Path) -> None:
    runs = [{"host_cache_bytes": b, "cache_hit_rate": r, "reused_blocks": int(r * 1000),
             "missed_blocks": 1000 - int(r * 1000), "onboarded_blocks": o}
            for b, r, o in ((0, 0.18, 0), (2e9, 0.24, 60), (8e9, 0.37, 190), (32e9, 0.52, 340))]
    path = tmp_path / "sweep.png"
    plot_sweep(runs, path)
    assert path.read_bytes()[:8] == PNG
    plot_sweep([{"host_cache_bytes": 0, "cache_hit_rate": 0.1}], tmp_path / "one.png")  # minimal keys
    assert (tmp_path / "one.png").is_file()


# ---------------------------------------------------------------------------------------------- the seed question

def test_deltas_are_numbers_and_percentages_against_the_first_run() -> None:
    from kvtop.report.report import deltas

    base = {"output_tokens_per_s": 1000.0, "ttft_p50_s": 0.020, "ttft_p99_s": 0.100, "hit_rate": 0.30,
            "host_hit_rate": 0.0, "e2e_p50_s": None}
    other = {"output_tokens_per_s": 880.0, "ttft_p50_s": 0.025, "ttft_p99_s": 0.090, "hit_rate": 0.45,
             "host_hit_rate": 0.12, "e2e_p50_s": 0.5}
    by = {d["key"]: d for d in deltas(base, other)}
    assert by["output_tokens_per_s"]["delta"] == pytest.approx(-120.0)
    assert by["output_tokens_per_s"]["delta_pct"] == pytest.approx(-12.0)
    assert by["ttft_p50_s"]["delta_pct"] == pytest.approx(25.0)
    assert by["ttft_p99_s"]["delta_pct"] == pytest.approx(-10.0)
    assert by["hit_rate"]["delta"] == pytest.approx(0.15)            # 15 percentage points
    assert by["hit_rate"]["delta_pct"] == pytest.approx(50.0)
    assert by["host_hit_rate"]["delta_pct"] is None                   # a change from 0 has no percentage
    assert by["e2e_p50_s"]["delta"] is None                           # unknown stays unknown


def test_prefix_source_from_the_request_records() -> None:
    from kvtop.tiers.requests import prefix_source

    assert prefix_source({"reused_blocks": 5, "host_hit_blocks": 0}) == "gpu_hit"
    assert prefix_source({"reused_blocks": 5, "host_hit_blocks": 2}) == "host_hit"
    assert prefix_source({"reused_blocks": 5, "onboarded_blocks": 1}) == "host_hit"   # fixtures' spelling
    assert prefix_source({"reused_blocks": 0, "missed_blocks": 9}) == "miss"
    assert prefix_source({"ttft_s": 0.1}) is None


@pytest.mark.slow
def test_the_report_of_two_runs_answers_the_seed_question(recordings: dict[str, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """host0 against host64: deltas as numbers and percentages, TTFT per prefix source, the runs' setup, GiB."""
    assert main([str(recordings["host0"]), str(recordings["host64"]), "-o", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    h0, h64 = summary["runs"]
    assert summary["baseline"] == "host0"
    ds = {d["key"]: d for d in summary["deltas"]["host64"]}
    for key in ("output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "hit_rate", "host_hit_rate"):
        assert ds[key]["base"] == h0[key] and ds[key]["value"] == h64[key]
    tp = ds["output_tokens_per_s"]
    assert tp["delta_pct"] == pytest.approx(100 * (h64["output_tokens_per_s"] / h0["output_tokens_per_s"] - 1))
    # The host tier serves hits the GPU alone could not keep: the hit rate goes up, by the host's share.
    assert ds["hit_rate"]["delta"] > 0.05 and h0["host_hit_rate"] == 0 and h64["host_hit_rate"] > 0.05
    assert f"{100 * ds['hit_rate']['delta']:+.1f} pt" in out
    assert f"{tp['delta_pct']:+.1f}%" in out
    # TTFT by where the prefix came from: no host hits without a host pool; each class's count adds up.
    b0, b64 = h0["ttft_by_source"], h64["ttft_by_source"]
    assert b0["host_hit"]["requests"] == 0 and b64["host_hit"]["requests"] > 0
    assert sum(b["requests"] for b in b64.values()) == h64["requests_completed"] == 80
    assert b64["miss"]["p50_s"] > b64["gpu_hit"]["p50_s"]        # a miss recomputes its prompt: slower
    page = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    first = page[: page.index("<h2>Runs</h2>")]                   # what the first screen shows
    assert "Each run against the first: host0 (no host cache)" in first
    assert "TTFT by where the prefix came from" in first
    assert f"{tp['delta_pct']:+.1f}%" in first and f"{100 * ds['hit_rate']['delta']:+.1f} pt" in first
    for needle in ("scenario", "concurrency", "GPU pool", "host pool", "engine", "zipf-prefix", " GiB"):
        assert needle in page, needle
    text = re.sub(r"data:image/png;base64,[^'\"]+", "", page)
    assert " GB<" not in text and "1e9" not in text
    assert f"{h64['host_pool_bytes'] / 2**30:.2f} GiB" in page and h64["host_pool_bytes"] == 64 * BLOCK


def test_report_colours_are_the_dashboards(tmp_path: Path) -> None:
    import colorsys

    from kvtop.palette import PALETTES
    from kvtop.report.charts import DISK_COLOR, GPU_COLOR, HOST_COLOR, RUN_COLORS

    # the colour code (kvtop/palette.py) as the light theme, the white page's, draws it
    light = PALETTES["light"]
    assert (GPU_COLOR, HOST_COLOR, DISK_COLOR) == (light["gpu"].in_use, light["host"].in_use, light["disk"].in_use)
    assert len({GPU_COLOR, HOST_COLOR, DISK_COLOR}) == 3

    def hls(c: str) -> tuple[float, float, float]:
        return colorsys.rgb_to_hls(*(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)))

    # no run is drawn in a tier's hue (a run's bar beside the GPU / host hit split): 30 degrees off each, or grey
    for run in RUN_COLORS:
        h, _, sat = hls(run)
        for tier in (GPU_COLOR, HOST_COLOR, DISK_COLOR):
            apart = abs(h - hls(tier)[0]) * 360
            assert sat < 0.2 or min(apart, 360 - apart) >= 30, (run, tier)


def test_a_two_tier_runs_occupancy_chart_draws_gpu_and_host_only(recordings: dict[str, Path]) -> None:
    """N tiers did not change a two-tier run's chart: the same five series (GPU's three, the host's two where it
    has a pool), in the same colours and order, nothing in the disk colour."""
    from kvtop.report.charts import DISK_COLOR, GPU_COLOR, HOST_COLOR, occupancy_series

    h0, h64 = load_run(recordings["host0"]), load_run(recordings["host64"])
    gpu = [("GPU capacity", GPU_COLOR, ":"), ("GPU cached", GPU_COLOR, "-"), ("GPU in use", GPU_COLOR, "--")]
    assert [s[:3] for s in occupancy_series(h0)] == gpu
    assert [s[:3] for s in occupancy_series(h64)] == gpu + [("host capacity", HOST_COLOR, ":"),
                                                           ("host cached", HOST_COLOR, "-")]
    assert all(list(s.tiers) == ["gpu", "host"] for s in h64.samples) and h64.samples
    series = {s[0]: s[4] for s in occupancy_series(h64)}
    assert series["host capacity"] == [64.0] * len(h64.samples)
    assert series["GPU capacity"] == [float(s.tiers["gpu"].capacity) for s in h64.samples]  # type: ignore[arg-type]
    assert DISK_COLOR not in {s[1] for s in occupancy_series(h64)}


@pytest.mark.slow
@pytest.mark.parametrize("names", [None, ("multi-turn-18573", "multi-turn-18618")])
def test_no_two_labels_of_any_chart_overlap(recordings: dict[str, Path], tmp_path: Path,
                                            names: tuple[str, str] | None) -> None:
    """Every text of every chart (titles, tick labels, values over bars, end labels), as drawn: no two boxes
    intersect, for two runs side by side: with the fixture's short names and with run ids as kvtop names them
    (16 characters: the TTFT panel once wrote them under every 0.4-wide bar, and they overlapped)."""
    from charts import CapturedPyplot, assert_no_texts_overlap

    from kvtop.report import charts as report_charts

    plt = report_charts.pyplot()
    capture = CapturedPyplot(plt)
    runs = [load_run(recordings["host0"]), load_run(recordings["host64"])]
    for run, long_name in zip(runs, names or ()):
        run.name = long_name
    for name, fn in (("compare", report_charts.plot_compare), ("ttft", report_charts.plot_ttft),
                     ("hit_rate", report_charts.plot_hit_rate), ("occupancy", report_charts.plot_occupancy),
                     ("moves", report_charts.plot_moves)):
        fn(capture, runs, tmp_path / f"{name}.png")
        fig = capture.closed[-1]
        assert_no_texts_overlap(fig, name)
        plt.close(fig)


def test_a_change_that_rounds_to_nothing_reads_plus_zero() -> None:
    from kvtop.report.report import delta_text, deltas

    d = {x["key"]: x for x in deltas({"ttft_p99_s": 0.5201, "hit_rate": 0.3}, {"ttft_p99_s": 0.52009,
                                                                              "hit_rate": 0.29999})}
    assert delta_text(d["ttft_p99_s"]).startswith("+0.0% ")
    assert delta_text(d["hit_rate"]).startswith("+0.0 pt ")


def test_the_overlap_check_catches_two_texts_drawn_on_each_other() -> None:
    """tests/charts.assert_no_texts_overlap, which the chart tests above rely on, can fail: two labels at one
    point overlap, the same two a figure apart do not."""
    pytest.importorskip("matplotlib")
    from charts import assert_no_texts_overlap

    from kvtop.report import charts as report_charts

    plt = report_charts.pyplot()
    fig = plt.figure(figsize=(4, 3))
    fig.text(0.5, 0.5, "GPU in use")
    fig.text(0.5, 0.5, "host capacity")
    with pytest.raises(AssertionError, match="'GPU in use' overlaps 'host capacity'"):
        assert_no_texts_overlap(fig, "overlap")
    plt.close(fig)
    fig = plt.figure(figsize=(4, 3))
    fig.text(0.1, 0.1, "GPU in use")
    fig.text(0.6, 0.8, "host capacity")
    assert_no_texts_overlap(fig)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- the answer, first

def _sentence_of(base: dict, run: dict) -> tuple[str, ...]:
    """The pieces the report's sentence must hold for ``run`` against ``base``, computed from their summaries."""
    by = {k: v["p50_s"] for k, v in run["ttft_by_source"].items()}
    gap = 1000 * (by["miss"] - by["host_hit"])
    return (f"with {run['host_size']} ({run['name']}) against no host cache ({base['name']})",
            f"TTFT p50 {100 * (run['ttft_p50_s'] / base['ttft_p50_s'] - 1):+.1f}%",
            f"output tok/s {100 * (run['output_tokens_per_s'] / base['output_tokens_per_s'] - 1):+.1f}%",
            f"hit rate {100 * (run['hit_rate'] - base['hit_rate']):+.1f} pt",
            f"saves {gap:,.1f} ms against a miss" if gap < 10 else f"saves {gap:,.0f} ms against a miss")

@pytest.mark.slow
def test_the_first_screen_and_the_first_line_say_the_answer_in_a_sentence(
        recordings: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One sentence per run pair, first on stdout and at the top of the page, with runs named by file and host
    size (not the run ids the records carry): "with 0.28 GiB host (host64) against no host cache (host0): TTFT p50
    -x%, output tok/s +y%, hit rate +z pt; a host hit ... saves N ms against a miss"."""
    assert main([str(recordings["host0"]), str(recordings["host64"]), "-o", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    h0, h64 = summary["runs"]
    assert h0["host_size"] == "no host cache" and h64["host_size"] == f"{64 * BLOCK / 2**30:.2f} GiB host"
    first_line = out.splitlines()[0]
    for piece in _sentence_of(h0, h64):
        assert piece in first_line, (piece, first_line)
    assert summary["sentences"] == [first_line]
    page = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    top = page[: page.index("<h2>")]
    assert f"<p>{first_line}</p>" in top.replace("&#x27;", "'")
    # the baseline's table names the pools, runs by file and host size
    table = page[page.index("<h2>Each run against"): page.index("<h2>TTFT by")]
    assert "<td>host pool</td>" in table and f"{64 * BLOCK / 2**30:.2f} GiB" in table
    assert "host0 (no host cache)" in table and f"host64 ({h64['host_size']})" in table


def _run_with(summary_changes: dict[str, float], recording: Path) -> object:
    run = load_run(recording)
    run.summary.update(summary_changes)
    return run


def test_a_falling_gpu_share_is_not_worse_when_the_total_rises(recordings: dict[str, Path]) -> None:
    """The host tier takes hits the GPU had (its share falls 49.6% -> 44.0%) while the total rises (49.6% ->
    68.2%): only the total is coloured, green; the shares are neutral. The GPU's fall was red."""
    from kvtop.report.report import _answer, deltas, direction

    base = _run_with({"hit_rate": 0.496, "gpu_hit_rate": 0.496, "host_hit_rate": 0.0}, recordings["host0"])
    other = _run_with({"hit_rate": 0.682, "gpu_hit_rate": 0.440, "host_hit_rate": 0.242}, recordings["host64"])
    ds = {d["key"]: d for d in deltas(base.summary, other.summary)}  # type: ignore[attr-defined]
    assert direction(ds["hit_rate"]) == "better"
    assert direction(ds["gpu_hit_rate"]) is None and direction(ds["host_hit_rate"]) is None
    worse_total = _run_with({"hit_rate": 0.40, "gpu_hit_rate": 0.40, "host_hit_rate": 0.0}, recordings["host64"])
    assert direction({d["key"]: d for d in deltas(base.summary, worse_total.summary)}["hit_rate"]) == "worse"
    page = "".join(_answer([base, other]))  # type: ignore[list-item]
    row = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td>([a-zA-Z /]+?) <small>.*?</tr>", page)}
    assert "<td>-5.6 pt</td>" in row["hit from GPU"] and "class=" not in row["hit from GPU"]
    assert "<td>+24.2 pt</td>" in row["hit from host"] and "class=" not in row["hit from host"]
    assert "<td class='good'>+18.6 pt</td>" in row["hit rate"]


@pytest.mark.slow
def test_a_recording_of_several_runs_is_split_into_its_runs(recordings: dict[str, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`--record --append` of two runs (two sources), and two runs under one run name (one source, a second
    `meta`): each run folded apart, equal to its own recording folded alone, labelled by file, number and host
    size. Folded as one, the two pools and their hits were summed into a run that never existed."""
    from kvtop.report.runs import load_runs

    both = tmp_path / "both.jsonl"
    both.write_bytes(recordings["host0"].read_bytes() + recordings["host64"].read_bytes())
    alone = [load_run(recordings["host0"]).summary, load_run(recordings["host64"]).summary]
    split = [r.summary for r in load_runs(both)]
    assert [r["name"] for r in split] == ["both #1", "both #2"]
    keys = ("records", "requests_completed", "hit_rate", "gpu_hit_rate", "host_hit_rate", "host_blocks",
            "gpu_blocks", "ttft_p50_s", "onboarded_blocks")
    assert [{k: r[k] for k in keys} for r in split] == [{k: r[k] for k in keys} for r in alone]
    assert split[1]["label"] == f"both #2 ({alone[1]['host_size']})" and split[0]["host_blocks"] == 0
    # one source, two sessions: the second meta starts the second run
    same = tmp_path / "same.jsonl"
    for i, host_blocks in enumerate((0, 64)):
        record_sim_run(tmp_path / f"s{i}.jsonl", n_requests=20, host_cache_size=host_blocks * BLOCK,
                       max_tokens=2048, run="demo")
    same.write_bytes((tmp_path / "s0.jsonl").read_bytes() + (tmp_path / "s1.jsonl").read_bytes())
    runs = load_runs(same)
    assert [r.summary["requests_completed"] for r in runs] == [20, 20]
    assert [r.summary["host_blocks"] for r in runs] == [0, 64]
    assert main([str(both), "-o", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"with {alone[1]['host_size']} (both #2) against no host cache (both #1)")


def test_without_matplotlib_the_comparison_still_prints(recordings: dict[str, Path], tmp_path: Path) -> None:
    """matplotlib unimportable (a sys.modules entry of None, in a subprocess): the sentence and the comparison on
    stdout, the page and summary.json written without charts, one line on stderr saying so, exit 0. It exited 2
    before anything was read."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from kvtop.commands.report import main\n"
            f"sys.exit(main([{str(recordings['host0'])!r}, {str(recordings['host64'])!r}, '-o', "
            f"{str(tmp_path / 'rep')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "pip install 'kvtop-monitor[report]'" in err[0]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("with ") and "host64 against host0:" in lines
    assert any(line.split()[:2] == ["TTFT", "p50"] and "ms ->" in line for line in lines)
    page = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    assert "data:image/png" not in page and lines[0] in page.replace("&#x27;", "'")
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["sentences"] == [lines[0]]
    assert not list((tmp_path / "rep").glob("*.png"))


def _chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="needs chromium (apt-get install chromium)")
def test_the_page_fits_1280_px_as_chromium_draws_it(recordings: dict[str, Path], tmp_path: Path) -> None:
    """The page drawn by headless chromium in a 1280 px window: nothing wider than the window (the runs' table of
    25 columns across was 1,9xx px wide and cut off). The page's own width is read back from the drawn DOM."""
    import subprocess

    build_report([recordings["host0"], recordings["host64"]], tmp_path / "rep")
    page = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    probe = ("<script>window.addEventListener('load', () => { const w = Math.max("
             "document.documentElement.scrollWidth, ...[...document.querySelectorAll('table')].map("
             "t => t.getBoundingClientRect().right)); document.title = 'WIDTH=' + Math.ceil(w); });</script>")
    (tmp_path / "probe.html").write_text(page.replace("</body>", probe + "</body>"), encoding="utf-8")
    done = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                           "--virtual-time-budget=3000", "--dump-dom", (tmp_path / "probe.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r"<title>WIDTH=(\d+)</title>", done.stdout)
    assert found, done.stderr[-500:]
    assert int(found.group(1)) <= 1280


def test_a_long_recording_keeps_a_bounded_number_of_samples_to_its_end(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # One Sample per stats record held every one of them: 803 MB for a 2 GB recording (replay: 34 MB). Now at
    # most 2 x MAX_SAMPLES are kept (every 2nd, 4th... record's), the last one always, the hit totals exact.
    import kvtop.report.charts as charts
    import kvtop.report.runs as runs
    from kvtop.records import SourceId, make
    from kvtop.sinks.recorder import Recorder

    monkeypatch.setattr(runs, "MAX_SAMPLES", 8)
    src = SourceId("h", 0, "long")
    path = tmp_path / "long.jsonl"
    with Recorder(path) as rec:
        rec.write(make("meta", {"engine": "sim", "primary_blocks": 100, "tokens_per_block": 32}, src, 1000.0))
        for i in range(1, 1001):
            rec.write(make("stats", {"iter": i, "kvCacheStats": {
                "maxNumBlocks": 100, "freeNumBlocks": 100 - i % 50, "usedNumBlocks": i % 50, "tokensPerBlock": 32,
                "allocTotalBlocks": 10 * i, "allocNewBlocks": 7 * i, "reusedBlocks": 3 * i, "missedBlocks": 7 * i,
                "cacheHitRate": 0.3}}, src, 1000.0 + i))
    run = load_run(path)
    assert 8 <= len(run.samples) <= 17
    ts = [s.t for s in run.samples]
    assert ts == sorted(ts) and ts[0] == 1.0 and ts[-1] == 1000.0
    assert run.samples[-1].hits == 3000 and run.samples[-1].lookups == 10000
    steps = {round(b - a) for a, b in zip(ts[:-2], ts[1:-1])}
    assert len(steps) == 1  # evenly spaced, the last one apart
    bins = charts._bins(run)
    assert bins[0][0] == 1.0 and bins[-1][1] == 1000.0
