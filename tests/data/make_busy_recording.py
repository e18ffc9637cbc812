"""Write a deterministic recording of a busy simulated TensorRT-LLM engine (the UI's test and bench fixture).

    python tests/data/make_busy_recording.py       # tests/data/busy.jsonl: 8 simulated s, quarter scale
    python tests/data/make_busy_recording.py --seconds 75 --scale 1 --out /tmp/busy75.jsonl   # the bench's run

Why it drives the simulator's engine core directly instead of ``SimLLM.generate_async``: SimLLM's engine thread
picks requests up as they arrive on the wall clock, so which requests share an iteration (and therefore every
block id and event) would depend on thread timing. Here arrivals are stamped in simulated time and the core is
stepped by hand, so the same arguments always write the same bytes (tests/ui/test_ui_recording.py checks it).

The workload is built to show every tier movement within seconds: at scale 1, a GPU pool of 1,024 blocks (32K
tokens) that fills after ~15 requests, a host pool of ~900 blocks that catches what the GPU evicts, four long
system prompts kept at retention priority 80 (zipf-popular), chat sessions whose next turn comes back after the
first turn was offloaded (host hits and onboards), and a low-priority batch class (20, under TensorRT-LLM's
secondary_offload_min_priority of 30) that is dropped instead of offloaded (GPU evictions).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvtop.engines.sim import KvCacheConfig, KvCacheRetentionConfig, SimLLM  # noqa: E402
from kvtop.engines.sim.core import SimRequest  # noqa: E402
from kvtop.records import SourceId, make  # noqa: E402

T0 = 1764430000.0  # 2025-11-29 15:26:40 UTC: a fixed epoch so record times never depend on when this ran
SOURCE = SourceId(host="sim", rank=0, run="busy")
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "busy.jsonl"


def _tokens(rng: random.Random, n: int) -> list[int]:
    # Ids below 151,000 (Qwen3's vocabulary); generated ids live at 2^30 and above, so no collision.
    return [rng.randrange(10, 151_000) for _ in range(n)]


class Workload:
    """Poisson arrivals of three request classes, in simulated seconds."""

    def __init__(self, seed: int, rate: float, scale: float):
        self.rng = random.Random(seed)
        self.rate = rate
        self.scale = scale
        self.system_prompts = [_tokens(self.rng, self.n(n)) for n in (2048, 1536, 1024, 1024)]
        self.zipf = [1.0 / (i + 1) ** 1.1 for i in range(len(self.system_prompts))]
        self.followups: list[tuple[float, int, list[int], int]] = []  # heap of (due_s, seq, prompt, priority)
        self.seq = 0

    def n(self, tokens: int) -> int:
        return max(1, int(tokens * self.scale))

    def next_gap(self) -> float:
        return self.rng.expovariate(self.rate)

    def new_request(self) -> tuple[list[int], int, str, int]:
        """(prompt, prompt priority, label, max_tokens)."""
        r = self.rng.random()
        if r < 0.55:
            i = self.rng.choices(range(len(self.system_prompts)), weights=self.zipf)[0]
            prompt = self.system_prompts[i] + _tokens(self.rng, self.n(self.rng.randrange(128, 768)))
            return prompt, 80, f"system-{i}", self.rng.randrange(32, 96)
        if r < 0.8:
            return _tokens(self.rng, self.n(self.rng.randrange(512, 2048))), 35, "chat", self.rng.randrange(32, 128)
        return _tokens(self.rng, self.n(self.rng.randrange(1024, 3072))), 20, "batch", self.rng.randrange(16, 48)

    def on_finished(self, req: SimRequest, label: str, priority: int, now: float) -> None:
        # Half the chat turns come back 2-6 s later with the whole conversation so far: by then the first turn
        # has usually been offloaded, so the next turn's prefix is a host hit (an onboard).
        short = len(req.prompt_ids) < 6000 * self.scale
        if label == "chat" and req.error is None and self.rng.random() < 0.5 and short:
            turn = _tokens(self.rng, self.n(self.rng.randrange(64, 256)))
            prompt = list(req.prompt_ids) + list(req.output_ids) + turn
            self.seq += 1
            heapq.heappush(self.followups, (now + self.rng.uniform(2.0, 6.0), self.seq, prompt, priority))


def _retention(priority: int, prompt_len: int) -> KvCacheRetentionConfig | None:
    if priority == 35:
        return None  # TensorRT-LLM's default priority: no config, as a real client would send
    return KvCacheRetentionConfig([KvCacheRetentionConfig.TokenRangeRetentionConfig(0, prompt_len, priority)], 35)


def record_run(seconds: float, seed: int = 7, rate: float = 14.0, scale: float = 1.0) -> list[dict[str, Any]]:
    """``scale`` shrinks prompts and both pools together: the committed fixture uses 0.25 so that it stays under
    5 MB (a `stored` event carries its blocks' token ids verbatim, 36 KB each at scale 1: 80% of the bytes)."""
    kvc = KvCacheConfig(max_tokens=int(32768 * scale), tokens_per_block=32, host_cache_size=int((4 << 30) * scale),
                        event_buffer_max_size=65536)
    llm = SimLLM("Qwen/Qwen3-8B", kv_cache_config=kvc, enable_iter_perf_stats=True, speed=0, max_batch_size=64)
    llm.shutdown()  # only its sizing, block manager and core are used, stepped here (see the module docstring)
    core, bm = llm._core, llm.block_manager
    core.epoch_s = T0
    meta = llm.describe()
    meta.update(sim_reason="recording: tests/data/make_busy_recording.py", source="replay")
    out: list[dict[str, Any]] = []

    def emit(kind: str, data: dict[str, Any]) -> None:
        out.append(make(kind, data, SOURCE, time=round(T0 + core.now_s, 6)).to_json())

    emit("meta", meta)
    for ev in bm.take_events():
        emit("kv_event", ev)
    wl = Workload(seed, rate, scale)
    labels: dict[int, tuple[str, int, float]] = {}
    next_arrival = wl.next_gap()
    next_sample = 0.0
    rid = 0
    rss = 3_200_000_000

    def submit(prompt: list[int], priority: int, label: str, max_tokens: int, at: float) -> None:
        nonlocal rid
        rid += 1
        req = SimRequest(rid, prompt, max_tokens, arrival_s=at, retention=_retention(priority, len(prompt)))
        labels[rid] = (label, priority, at)
        core.submit(req)
        if req.error is not None:
            finish(req)

    def finish(req: SimRequest) -> None:
        label, priority, arrival = labels.pop(req.request_id)
        data: dict[str, Any] = {"request_id": req.request_id, "ok": req.error is None,
                                "prompt_tokens": req.prompt_len, "priority": priority, "label": label,
                                "scenario": "busy"}
        if req.error is None:
            data.update(output_tokens=len(req.output_ids),
                        ttft_s=round((req.first_token_s or arrival) - arrival, 6),
                        e2e_s=round((req.last_token_s or arrival) - arrival, 6),
                        reused_blocks=req.reused_blocks, missed_blocks=req.missed_blocks,
                        host_hit_blocks=req.onboarded_blocks, reused_tokens=req.reused_tokens)
        else:
            data.update(error=req.error, e2e_s=0.0)
        emit("request", data)
        wl.on_finished(req, label, priority, core.now_s)

    while core.now_s < seconds:
        # Admit everything that has arrived by now (new requests and due follow-up turns), in arrival order.
        while True:
            due_followup = wl.followups[0][0] if wl.followups else float("inf")
            t = min(next_arrival, due_followup)
            if t > core.now_s:
                break
            if due_followup <= next_arrival:
                _, _, prompt, priority = heapq.heappop(wl.followups)
                submit(prompt, priority, "chat", wl.rng.randrange(32, 128), due_followup)
            else:
                prompt, priority, label, max_tokens = wl.new_request()
                submit(prompt, priority, label, max_tokens, next_arrival)
                next_arrival += wl.next_gap()
        if not core.has_runnable():
            core.now_s = min(next_arrival, wl.followups[0][0] if wl.followups else next_arrival)
            continue
        finished = core.step()
        for st in core.take_stats():
            emit("stats", st)
        for ev in bm.take_events():
            emit("kv_event", ev)
        for req in finished:
            finish(req)
        while next_sample <= core.now_s:
            # One NVML-shaped and one host-shaped sample per simulated second, as the live sources send them.
            emit("gpu", {"index": 0, "name": "NVIDIA H200 (simulated)", "uuid": "GPU-sim-0",
                         "memory_total_bytes": llm.gpu.memory_bytes, "memory_used_bytes": core.gpu_mem_usage_bytes,
                         "memory_free_bytes": llm.gpu.memory_bytes - core.gpu_mem_usage_bytes,
                         "memory_reserved_bytes": 0, "memory_info_version": "v2",
                         "utilization_gpu_pct": min(100, 40 + 2 * len(core.running)), "utilization_memory_pct": None,
                         "pcie_tx_bytes_per_s": None, "pcie_rx_bytes_per_s": None, "process_used_bytes": None,
                         "compute_processes": 1, "temperature_c": 58, "power_w": 412.0})
            rss += 1_048_576  # a slow, deterministic drift so the host panel has something to move
            emit("host", {"pid": 4242, "process_rss_bytes": rss + (4 << 30), "process_uss_bytes": rss,
                          "process_shared_bytes": 4 << 30, "system_total_bytes": 2_016_000_000_000,
                          "system_available_bytes": 1_850_000_000_000 - rss, "pinned_pool_bytes": 4 << 30,
                          "pinned_pool_origin": "engine"})
            next_sample += 1.0
    return out


def write(records: list[dict[str, Any]], path: Path) -> str:
    text = "".join(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n" for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="simulated seconds to record (default 8)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rate", type=float, default=14.0, help="new requests per simulated second (default 14)")
    ap.add_argument("--scale", type=float, default=0.25,
                    help="prompt and pool sizes relative to the bench's busy run (default 0.25: the fixture)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    records = record_run(args.seconds, args.seed, args.rate, args.scale)
    digest = write(records, args.out)
    kinds: dict[str, int] = {}
    for r in records:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(f"{args.out}: {len(records)} records {kinds} sha256 {digest[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
