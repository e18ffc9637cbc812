"""One builder for a real TensorRT-LLM engine's ``meta`` record, whichever way kvtop reaches the engine.

Three paths watch a real engine: a driven run (``kvtop run --engine trtllm``, kvtop/runner.py), ``kvtop.watch(llm)``
on the user's own ``LLM`` (kvtop/watcher.py) and ``kvtop attach http://`` on a ``trtllm-serve``
(kvtop/sources/trtllm_serve.py). Each knows a different part of the engine: the driven run has kvtop's settings,
``watch`` has the LLM's ``args`` (``TorchLlmArgs``: ``model``, ``kv_cache_config``) and its resolved model directory
(``LLM._hf_model_dir``, tensorrt_llm/llmapi/llm.py), the server only its ``/v1/models`` id. All three hand what they
know to :func:`real_engine_meta`, which works out the one number every GiB figure needs: the bytes of one KV block
(2 x layers x KV heads x head_dim x KV dtype bytes x tokens per block, ``ModelShape.kv_bytes_per_block``).

When the tokens per block are not known yet (a server says them only in its stats' ``kvCacheStats.tokensPerBlock``),
the record carries ``kv_bytes_per_token`` and the TierModel multiplies once the stats arrive. Whatever could not be
worked out is named in ``meta_unknown`` (for the screen), never guessed.

The KV dtype: ``KvCacheConfig.dtype`` (tensorrt_llm/llmapi/llm_args.py: ``'auto'``, ``'fp8'``, ``'fp8_ds_mla'``,
``'nvfp4'`` or a torch dtype name). ``'auto'`` keeps the checkpoint's own KV quantization: FP8 where its
quantization config says so (``ModelShape.kv_bytes``, kvtop/engines/models.py), else the model's dtype; ``kv_dtype``
says "auto" so the screen can say the size assumes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtop.engines.models import ModelShape, dtype_bytes_of, resolve_model

__all__ = ["kv_dtype_bytes", "meta_from_llm", "real_engine_meta", "shape_for"]

# KvCacheConfig.dtype values that are not torch dtype names (llm_args.py, validate_dtype). nvfp4 is 4 bits per
# element plus one fp8 scale per 16 elements: 4.5 bits, which no whole number of bytes per element says; kvtop
# reports its size as unknown rather than a wrong figure.
_KV_DTYPE_BYTES: dict[str, float | None] = {"fp8": 1, "fp8_ds_mla": None, "nvfp4": None}


def kv_dtype_bytes(kv_dtype: str | None, shape: ModelShape | None) -> int | None:
    """Bytes per KV element for ``KvCacheConfig.dtype`` (None / "auto": the model's own dtype)."""
    if kv_dtype is None or str(kv_dtype).lower() == "auto":
        return shape.kv_bytes if shape is not None else None  # the checkpoint's KV quantization, else its dtype
    key = str(kv_dtype).lower()
    if key in _KV_DTYPE_BYTES:
        b = _KV_DTYPE_BYTES[key]
        return int(b) if b is not None else None
    try:
        return dtype_bytes_of(key)
    except ValueError:
        return None


def shape_for(*candidates: Any) -> tuple[ModelShape | None, str | None]:
    """The first candidate (a model name, a local model directory, a config.json) kvtop can read a shape from.

    A server's model id is often a path on the server (``/models/Qwen3-8B``): when that path is not here, its last
    part is tried as a name (the built-in table knows ``Qwen3-8B``). Returns (shape, None) or (None, why not).
    """
    why: str | None = None
    for cand in candidates:
        if cand is None or cand == "":
            continue
        text = str(cand)
        tries = [text]
        tail = Path(text.rstrip("/")).name
        if tail and tail != text:
            tries.append(tail)
        for t in tries:
            try:
                return resolve_model(t), None
            except ValueError as exc:
                why = why or str(exc).split(";")[0]
    return None, why or "no model name"


def real_engine_meta(*, model: Any = None, model_dirs: tuple[Any, ...] = (), kv_dtype: str | None = None,
                     tokens_per_block: int | None = None, primary_blocks: int | None = None,
                     host_cache_bytes: int | None = None, disk_cache_bytes: int | None = None,
                     engine_version: str | None = None, **extra: Any) -> dict[str, Any]:
    """The ``meta`` record's data for a real TensorRT-LLM engine.

    ``model``: what the user named (shown as the model); ``model_dirs``: further places to read its shape from
    (the LLM's resolved checkpoint directory). Pool sizes in bytes become blocks once the block size is known
    (``host_cache_size / bytes_per_block``, as TensorRT-LLM's ``resource_manager.py`` computes
    ``blocks_in_secondary_pool``; the disk pool the same way). ``extra`` keys are passed through.
    """
    meta: dict[str, Any] = {"engine": "trtllm", "engine_version": engine_version,
                            "model": None if model is None else str(model), "simulated": False}
    unknown: list[str] = []
    shape, why = shape_for(model, *model_dirs)
    if shape is None:
        unknown.append(f"block size: model shape unknown ({why})")
    dtype_b = kv_dtype_bytes(kv_dtype, shape)
    meta["kv_dtype"] = str(kv_dtype) if kv_dtype is not None else "auto"
    if shape is not None and dtype_b is None:
        unknown.append(f"block size: KV dtype {kv_dtype!r} has no whole bytes per element")
    per_token = None
    if shape is not None and dtype_b is not None:
        per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype_b
        meta["kv_bytes_per_token"] = per_token
    if isinstance(tokens_per_block, int) and tokens_per_block > 0:
        meta["tokens_per_block"] = tokens_per_block
        if per_token is not None:
            bpb = per_token * tokens_per_block
            meta["bytes_per_block"] = bpb
            for key, size in (("secondary_blocks", host_cache_bytes), ("disk_blocks", disk_cache_bytes)):
                if isinstance(size, int) and size >= 0:
                    meta[key] = size // bpb
    if isinstance(primary_blocks, int) and primary_blocks >= 0:
        meta["primary_blocks"] = primary_blocks
    if isinstance(host_cache_bytes, int):
        meta["host_cache_bytes"] = host_cache_bytes
    if isinstance(disk_cache_bytes, int) and disk_cache_bytes > 0:
        meta["disk_cache_bytes"] = disk_cache_bytes
    if unknown:
        meta["meta_unknown"] = unknown
    meta.update({k: v for k, v in extra.items() if v is not None})
    return meta


# What kvtop reads from a TensorRT-LLM ``LLM`` (names from tensorrt_llm/llmapi/llm.py and llm_args.py; the
# stand-in in tests/engines/test_engine_meta.py refuses any other): ``LLM.args`` and ``LLM._hf_model_dir`` (the
# checkpoint directory the model loader resolved, a hub id's local snapshot); ``args.model``, ``args.kv_cache_config``;
# ``KvCacheConfig.dtype``, ``tokens_per_block``, ``host_cache_size`` and, on 1.3+, ``disk_cache_size``.
LLM_ATTRS = ("args", "_hf_model_dir")
ARGS_ATTRS = ("model", "kv_cache_config")
KV_CACHE_CONFIG_ATTRS = ("dtype", "tokens_per_block", "host_cache_size", "disk_cache_size",
                         "kv_cache_event_hash_algo")


def meta_from_llm(llm: Any, *, model: Any = None, engine_version: str | None = None,
                  tokens_per_block: int | None = None, host_cache_bytes: int | None = None,
                  **extra: Any) -> dict[str, Any]:
    """:func:`real_engine_meta` for a live TensorRT-LLM ``LLM`` object. Read defensively: a field a release
    lacks is just unknown. The keyword arguments are what the caller knows otherwise (kvtop's own settings)."""
    args = getattr(llm, "args", None)
    kvc = getattr(args, "kv_cache_config", None)

    def int_attr(obj: Any, name: str) -> int | None:
        v = getattr(obj, name, None)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    args_model = getattr(args, "model", None)
    hf_dir = getattr(llm, "_hf_model_dir", None)
    dtype = getattr(kvc, "dtype", None)
    # 1.3+: how event block hashes are made (v2_sha256 sends hex strings; the fold takes their first 8 bytes)
    algo = getattr(kvc, "kv_cache_event_hash_algo", None)
    if isinstance(algo, str):
        extra.setdefault("kv_cache_event_hash_algo", algo)
    return real_engine_meta(
        model=model if model is not None else (str(args_model) if args_model is not None else None),
        model_dirs=tuple(str(d) for d in (args_model, hf_dir) if d is not None),
        kv_dtype=dtype if isinstance(dtype, str) else None,
        tokens_per_block=int_attr(kvc, "tokens_per_block") or tokens_per_block,
        host_cache_bytes=int_attr(kvc, "host_cache_size") if int_attr(kvc, "host_cache_size") is not None
        else host_cache_bytes,
        disk_cache_bytes=int_attr(kvc, "disk_cache_size"),
        engine_version=engine_version, **extra)
