"""Which engine a source is, in words: what the screen, the headless text and the problems call it.

A ``meta`` record's ``engine`` is kvtop's key for it: ``trtllm`` (a real TensorRT-LLM: driven, ``watch``,
trtllm-serve), ``sim`` (kvtop's simulator of TensorRT-LLM), ``vllm`` / ``sglang`` (``vllm://``, ``sglang://``), and
``vllm-format`` for ``zmq://`` (the common KV event wire, which vLLM, SGLang, Dynamo's mocker and TensorRT-LLM's
streaming path all send: the stream alone does not say which). Words that name TensorRT-LLM's fields or settings
(``freeNumBlocks``, ``host_cache_size``, ``event_buffer_max_size``, offload-on-evict) are said only where the
source is TensorRT-LLM or its simulator; for any other source the words are the engine's or neutral.

Where a figure is unknown because the source lacks the data, the words say why and what gives it
(:func:`hit_rate_unknown_why`: a KV event stream has no lookups; the engine's ``/metrics`` has them;
:func:`requests_unknown_why`: neither has requests, so the requests panel's counts are unknown, not 0).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SIM_LABEL", "STREAM_LABEL", "engine_label", "engine_name", "hit_rate_unknown_why", "is_trtllm",
           "requests_unknown_why", "size_curve_unknown_why"]

_NAMES = {"trtllm": "TensorRT-LLM", "sim": "TensorRT-LLM", "vllm": "vLLM", "sglang": "SGLang", "dynamo": "Dynamo",
          "kvbm": "Dynamo", "lmcache": "LMCache"}


def engine_name(engine: Any) -> str | None:
    """The engine's own name ("TensorRT-LLM", "vLLM", "SGLang", "Dynamo") for a meta ``engine`` value, None where
    it is not known (``vllm-format``: the wire alone; nothing heard yet)."""
    if not isinstance(engine, str):
        return None
    key = engine.strip().lower()
    if key.startswith(("tensorrt", "trtllm")):
        return "TensorRT-LLM"
    return _NAMES.get(key)


# What a bare ``zmq://`` stream is called where its engine is not named: the wire says only its format
STREAM_LABEL = "KV event stream (engine not named)"
SIM_LABEL = "kvtop's TensorRT-LLM simulator"


def engine_label(engine: Any) -> str | None:
    """What the header and the headless text call a source's engine: its own name ("vLLM", "SGLang"), the bare
    wire's :data:`STREAM_LABEL` for ``vllm-format`` (kvtop's key, never a user's word), else the key as given; None
    where there is none."""
    key = engine.strip().lower() if isinstance(engine, str) else None
    if key == "sim":    # TensorRT-LLM's words apply (engine_name), but the screen must not say it is the real one
        return SIM_LABEL
    if key == "vllm-format":
        return STREAM_LABEL
    name = engine_name(engine)
    if name is not None:
        return name
    return engine if isinstance(engine, str) and engine else None


def is_trtllm(engine: Any) -> bool:
    """Whether TensorRT-LLM's words apply: the source is TensorRT-LLM or kvtop's simulator of it, or no engine has
    said what it is (a recording without a meta record: kvtop's own recordings are TensorRT-LLM's unless a meta
    says otherwise; every stream source names itself, ``vllm-format`` at least)."""
    return engine is None or engine_name(engine) == "TensorRT-LLM"


# The port each engine serves its /metrics on by default (vllm serve, sglang.launch_server); docs/engines.md
_METRICS_PORTS = {"vLLM": 8000, "SGLang": 30000}


def hit_rate_unknown_why(meta: Any, stream: Any) -> str | None:
    """Why a KV event stream's hit rate is unknown, and what gives it, or None where a stream does not explain it
    (no stream: TensorRT-LLM's stats carry the lookups; a fleet agent's summaries). ``meta``: the source's meta
    (``engine``, ``endpoint``); ``stream``: the stream fold's summary (``StreamFold.to_json``). A stream says what
    was cached and removed, never what a prompt looked up: the lookups and hits are in the engine's /metrics
    (``vllm:prefix_cache_queries_total``, ``sglang:prompt_tokens_total``, Dynamo's frontend), which ``kvtop attach``
    reads with ``vllm://HOST:8000``, ``sglang://HOST:30000`` or ``zmq://...?metrics=http://HOST:PORT/metrics``."""
    if not isinstance(stream, dict) or stream.get("summaries"):
        return None
    if stream.get("metrics_scrapes"):
        return "hit rate unknown: no prompt lookups in the engine's /metrics yet"
    meta = meta if isinstance(meta, dict) else dict(meta or {})
    name = engine_name(meta.get("engine"))
    endpoint = meta.get("endpoint")
    hostport = endpoint.split("://", 1)[-1] if isinstance(endpoint, str) and endpoint else "HOST:5557"
    host = hostport.rsplit(":", 1)[0] or "HOST"
    port = _METRICS_PORTS.get(name or "", "PORT") if name else "8000"
    scheme = {"vLLM": "vllm", "SGLang": "sglang"}.get(name or "vLLM")
    also = f" (or {scheme}://{host}:{port})" if scheme else ""
    return (f"hit rate unknown: KV events carry no lookups; add the engine's /metrics: "
            f"zmq://{hostport}?metrics=http://{host}:{port}/metrics{also}")


def requests_unknown_why(stream: Any, completed: int, failed: int) -> str | None:
    """Why a KV event stream's requests (done, failed, rates, TTFT) are unknown, or None where they are known or a
    stream does not explain it. The stream says blocks, never requests, and kvtop reads no request metric from an
    engine's /metrics: "done 0" read as if the engine had served nothing."""
    if not isinstance(stream, dict) or stream.get("summaries") or completed or failed:
        return None
    return "requests unknown: KV events and the engine's /metrics as kvtop reads them count blocks, not requests"


def size_curve_unknown_why(stream: Any) -> str | None:
    """Why a KV event stream gets no hit-rate curve over host sizes (the size advice, the what-if line), or None
    where a stream does not explain it. The curve replays each block's lookups against other pool sizes; a stream
    says what was stored and removed, never what a prompt looked up, so its curve never comes ("no curve yet")."""
    if not isinstance(stream, dict) or stream.get("summaries"):
        return None
    return "no curve: KV events carry no lookups"
