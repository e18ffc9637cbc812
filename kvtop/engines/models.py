"""Model shapes: what the KV cache manager and the cost model need to know about a model.

A `ModelShape` carries the handful of Hugging Face `config.json` values that decide KV cache size
(layers, KV heads, head dim, dtype) and compute cost (hidden size, heads, MLP width, vocabulary, parameter
count). `resolve_model()` turns a built-in name ("Qwen/Qwen3-8B", "qwen3-8b") or a local HF model
directory / `config.json` path into one.

The built-in values are copied from each model's `config.json` on the Hugging Face Hub; `num_params` is
computed from them with `estimate_num_params()` and agrees with each model card (Qwen3-8B 8.19B,
Llama-3.1-70B 70.55B, ...). A test checks the estimator against every table entry.

Dense decoder-only transformers with SwiGLU MLPs only (Llama, Qwen2/3, Mistral and kin). MoE and MLA
(DeepSeek) shapes need a different KV and FLOP formula and are refused rather than mis-sized.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtop.suggest import did_you_mean

__all__ = [
    "BUILTIN_MODELS",
    "ModelShape",
    "dtype_bytes_of",
    "estimate_num_params",
    "known_model_names",
    "model_from_config",
    "quantization_of",
    "resolve_model",
]


@dataclass(frozen=True)
class ModelShape:
    """The shape of a dense decoder-only transformer, as far as KV cache size and compute cost go."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    num_params: int
    """Total parameter count, embeddings (and an untied LM head) included."""
    dtype_bytes: int = 2
    """Bytes of the model's own dtype (config.json's torch_dtype): activations, embeddings, the LM head, and every
    weight of an unquantized checkpoint. 2 for bf16/fp16."""
    tie_word_embeddings: bool = False
    """True when the LM head shares the embedding matrix (Qwen3-0.6B), so it is counted once in num_params."""
    weight_quant: str | None = None
    """"fp8" for a checkpoint whose linear layers (QKV, O, MLP) hold FP8 weights and run FP8 GEMMs (ModelOpt,
    compressed-tensors, HF fine-grained FP8); embeddings, the LM head, norms and activations stay in the model's
    dtype. None: every weight in the model's dtype."""
    kv_dtype_bytes: int | None = None
    """Bytes per KV cache element; None: the model's dtype. 1 for an FP8 KV cache (the checkpoint's
    kv_cache_quant_algo, or KvCacheConfig(dtype="fp8"))."""

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "num_kv_heads", "head_dim", "hidden_size", "num_attention_heads",
                           "intermediate_size", "vocab_size", "num_params", "dtype_bytes"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelShape {self.name!r}: {field_name} must be a positive int, "
                                 f"got {value!r}")
        if self.weight_quant not in (None, "fp8"):
            raise ValueError(f"ModelShape {self.name!r}: weight_quant must be None or 'fp8', got {self.weight_quant!r}")
        if self.kv_dtype_bytes not in (None, 1, 2, 4):
            raise ValueError(f"ModelShape {self.name!r}: kv_dtype_bytes must be 1, 2 or 4, got {self.kv_dtype_bytes!r}")

    @property
    def kv_bytes(self) -> int:
        """Bytes of one KV element: the KV dtype's, else the model's."""
        return self.kv_dtype_bytes if self.kv_dtype_bytes is not None else self.dtype_bytes

    @property
    def linear_weight_bytes(self) -> int:
        """Bytes per weight of the linear layers: 1 for FP8 checkpoints, else the model's dtype."""
        return 1 if self.weight_quant == "fp8" else self.dtype_bytes

    def with_kv_cache_dtype(self, dtype: str | None) -> ModelShape:
        """This model with TensorRT-LLM's ``KvCacheConfig.dtype``: "auto" (or None) keeps the checkpoint's KV
        dtype (FP8 where its quantization config says so, else the model's dtype); "fp8" makes it FP8;
        "bfloat16"/"float16"/"float32" set it explicitly."""
        text = "auto" if dtype is None else str(dtype).strip().lower()
        if text == "auto":
            return self
        return dataclasses.replace(self, kv_dtype_bytes=dtype_bytes_of(text))

    def with_weight_quant(self, quant: str | None) -> ModelShape:
        """This model with FP8 linear weights ("fp8") or none (None)."""
        return dataclasses.replace(self, weight_quant=quant)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token occupies across all layers.

        2 (K and V) x layers x KV heads x head_dim x dtype bytes, the same product as TensorRT-LLM's
        `KVCacheManager.get_cache_bytes_per_token` (kv_factor 2 x sum of KV heads over layers x head_dim,
        in bytes of the KV dtype). Qwen3-8B bf16: 2 x 36 x 8 x 128 x 2 = 147,456
        (anchors/h200-2026-11-29.json, `qwen3_8b_kv_bytes_per_token_bf16`).
        """
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes

    def kv_bytes_per_block(self, tokens_per_block: int) -> int:
        """Bytes of one KV cache block: Qwen3-8B, 32 tokens: 4,718,592 (4.5 MiB, the anchors' block size)."""
        if tokens_per_block <= 0:
            raise ValueError(f"tokens_per_block must be positive, got {tokens_per_block}")
        return self.kv_bytes_per_token * tokens_per_block

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights as loaded on the GPU: the linear layers in their (possibly FP8) dtype, the
        embedding table and an untied LM head in the model's dtype. Llama-3.1-8B: 16.06 GB bf16, 9.08 GB FP8
        (7.0 GB of FP8 linear weights + 2.1 GB of bf16 embedding and LM head). FP8 scales (one float per tensor)
        are left out."""
        untied_head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.matmul_params * self.linear_weight_bytes + (self.embedding_params + untied_head) * self.dtype_bytes

    @property
    def embedding_params(self) -> int:
        """Parameters of the input embedding table (vocab x hidden)."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters the LM head multiplies by, tied or not (vocab x hidden)."""
        return self.vocab_size * self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters every token is multiplied by: all but the embedding table and the LM head.

        Norm weights (a few per layer, < 0.001% of the total) stay in; they cost an elementwise op, not a
        matmul, and dropping them would change no figure in the cost model's first three digits.
        """
        untied_head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.num_params - self.embedding_params - untied_head

    @property
    def weight_read_bytes(self) -> int:
        """Weight bytes one forward pass streams from HBM: every matrix except the embedding table, of which
        only the rows of the batch's tokens are read (the LM head is read in full, tied or not)."""
        return self.matmul_params * self.linear_weight_bytes + self.lm_head_params * self.dtype_bytes

    @property
    def attention_flops_per_context_token(self) -> int:
        """FLOPs one query token spends per context position it attends to, over all layers.

        QK^T and P.V are each heads x head_dim multiply-adds per position per layer (2 FLOPs a MAC):
        4 x layers x heads x head_dim. Uses heads x head_dim, not hidden_size: they differ on Qwen3-0.6B
        (16 x 128 = 2048 vs hidden 1024).
        """
        return 4 * self.num_layers * self.num_attention_heads * self.head_dim

    def prefill_flops_per_token(self, context_len: int) -> int:
        """FLOPs to run one prompt token through the model when it attends to `context_len` positions.

        Formula: 2 x matmul_params + 4 x layers x heads x head_dim x context_len, where
        - 2 x matmul_params: one multiply-add per weight in the QKV/O projections and the MLP;
        - 4 x layers x heads x head_dim x context_len: QK^T and P.V against every position the token sees
          (causal: token i of a fresh prompt sees i positions, itself included), so a prompt's attention
          work grows with the square of its length.
        The LM head (2 x vocab x hidden) is left out: TensorRT-LLM computes logits only for the last prompt
        token unless context logits are requested; the cost model adds it once per request.
        Qwen3-8B: 13.9 GFLOP per token at context 1, +0.59 MFLOP per extra context position.
        """
        if context_len < 0:
            raise ValueError(f"context_len must be >= 0, got {context_len}")
        return 2 * self.matmul_params + self.attention_flops_per_context_token * context_len


def estimate_num_params(*, num_layers: int, hidden_size: int, num_attention_heads: int, num_kv_heads: int,
                        head_dim: int, intermediate_size: int, vocab_size: int,
                        tie_word_embeddings: bool = False, qk_norm: bool = False,
                        attention_bias: bool = False) -> int:
    """Parameter count of a dense SwiGLU decoder from its config values.

    Per layer: Q and O projections (hidden x heads*head_dim each), K and V (hidden x kv_heads*head_dim
    each), gate/up/down MLP (3 x hidden x intermediate), two RMSNorm weights (2 x hidden), plus Qwen3's
    per-head q/k norms (2 x head_dim) and Qwen2-style QKV biases when present. Then the final norm, the
    embedding table and, unless tied, the LM head. Exact for every built-in model (see the module docstring).
    """
    q_out = num_attention_heads * head_dim
    kv_out = num_kv_heads * head_dim
    attention = hidden_size * q_out * 2 + hidden_size * kv_out * 2
    if attention_bias:
        attention += q_out + 2 * kv_out
    mlp = 3 * hidden_size * intermediate_size
    norms = 2 * hidden_size + (2 * head_dim if qk_norm else 0)
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    return num_layers * (attention + mlp + norms) + hidden_size + embeddings


def _qwen3(name: str, *, layers: int, hidden: int, heads: int, inter: int, tied: bool = False) -> ModelShape:
    # All Qwen3 dense models: 8 KV heads, head_dim 128, vocab 151,936, bf16, q/k norms (config.json).
    params = estimate_num_params(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                 num_kv_heads=8, head_dim=128, intermediate_size=inter, vocab_size=151936,
                                 tie_word_embeddings=tied, qk_norm=True)
    return ModelShape(name=name, num_layers=layers, num_kv_heads=8, head_dim=128, hidden_size=hidden,
                      num_attention_heads=heads, intermediate_size=inter, vocab_size=151936,
                      num_params=params, dtype_bytes=2, tie_word_embeddings=tied)


def _llama31(name: str, *, layers: int, hidden: int, heads: int, inter: int) -> ModelShape:
    # Llama 3.1: 8 KV heads, head_dim = hidden / heads = 128, vocab 128,256, untied, bf16 (config.json).
    params = estimate_num_params(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                 num_kv_heads=8, head_dim=128, intermediate_size=inter, vocab_size=128256)
    return ModelShape(name=name, num_layers=layers, num_kv_heads=8, head_dim=128, hidden_size=hidden,
                      num_attention_heads=heads, intermediate_size=inter, vocab_size=128256,
                      num_params=params, dtype_bytes=2)


def _fp8(base: ModelShape, name: str) -> ModelShape:
    # NVIDIA's ModelOpt FP8 checkpoints (nvidia/Llama-3.1-8B-Instruct-FP8, nvidia/Llama-3.3-70B-Instruct-FP8):
    # FP8 weights and activations in the transformer blocks' linear layers only (model cards: "Only the weights and
    # activations of the linear operators within transformers blocks are quantized"); FP8 KV cache, as TensorRT-LLM
    # runs them: trtllm-bench maps an FP8 quant_algo to an FP8 KV cache (tensorrt_llm/bench/benchmark/utils/
    # general.py, _KV_CACHE_MAP) and the LLM API takes the checkpoint's kv_cache_quant_algo.
    return dataclasses.replace(base, name=name, weight_quant="fp8", kv_dtype_bytes=1)


def _tinyllama() -> ModelShape:
    # TinyLlama-1.1B-Chat-v1.0 config.json: 22 layers, hidden 2048, 32 heads, 4 KV heads (head_dim 64),
    # intermediate 5632, vocab 32,000, untied, bf16. 2 x 22 x 4 x 64 x 2 = 22,528 KV bytes per token.
    params = estimate_num_params(num_layers=22, hidden_size=2048, num_attention_heads=32, num_kv_heads=4,
                                 head_dim=64, intermediate_size=5632, vocab_size=32000)
    return ModelShape(name="TinyLlama/TinyLlama-1.1B-Chat-v1.0", num_layers=22, num_kv_heads=4, head_dim=64,
                      hidden_size=2048, num_attention_heads=32, intermediate_size=5632, vocab_size=32000,
                      num_params=params, dtype_bytes=2)


# HF config.json values. Parameter counts (from estimate_num_params) in the comments match the model cards.
BUILTIN_MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        _qwen3("Qwen/Qwen3-0.6B", layers=28, hidden=1024, heads=16, inter=3072, tied=True),  # 596,049,920
        _qwen3("Qwen/Qwen3-8B", layers=36, hidden=4096, heads=32, inter=12288),  # 8,190,735,360
        _qwen3("Qwen/Qwen3-14B", layers=40, hidden=5120, heads=40, inter=17408),  # 14,768,307,200
        _qwen3("Qwen/Qwen3-32B", layers=64, hidden=5120, heads=64, inter=25600),  # 32,762,123,264
        # 8,030,261,248 and 70,553,706,496:
        _llama31("meta-llama/Llama-3.1-8B-Instruct", layers=32, hidden=4096, heads=32, inter=14336),
        _llama31("meta-llama/Llama-3.1-70B-Instruct", layers=80, hidden=8192, heads=64, inter=28672),
        _tinyllama(),  # 1,100,048,384: the model of TensorRT-LLM's own KV cache offloading example
    )
}

BUILTIN_MODELS["nvidia/Llama-3.1-8B-Instruct-FP8"] = _fp8(BUILTIN_MODELS["meta-llama/Llama-3.1-8B-Instruct"],
                                                       "nvidia/Llama-3.1-8B-Instruct-FP8")
# Llama 3.3 70B has Llama 3.1 70B's config.json shape (80 layers, hidden 8192, 64 heads, 8 KV heads, 28,672, 128,256).
BUILTIN_MODELS["nvidia/Llama-3.3-70B-Instruct-FP8"] = _fp8(BUILTIN_MODELS["meta-llama/Llama-3.1-70B-Instruct"],
                                                        "nvidia/Llama-3.3-70B-Instruct-FP8")

# The base models have the same shapes as their -Instruct versions (same config.json apart from ids).
_ALIASES: dict[str, str] = {
    "meta-llama/Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Meta-Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "meta-llama/Llama-3.1-70B-Instruct",
    "meta-llama/Meta-Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/Llama-3.1-70B-Instruct",
    "nvidia/Llama-3.1-8B-FP8": "nvidia/Llama-3.1-8B-Instruct-FP8",
}


def _key(name: str) -> str:
    # "Qwen/Qwen3-8B", "qwen3-8b", "QWEN3_8B" all become "qwen38b"; dots go too, so "llama3.1-8b" and
    # "llama-3.1-8b" meet. No two built-in names collide under this folding (a test checks).
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _build_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for full in list(BUILTIN_MODELS) + list(_ALIASES):
        target = _ALIASES.get(full, full)
        index[_key(full)] = target
        index[_key(full.split("/", 1)[-1])] = target  # the short form, without the org
    return index


_INDEX = _build_index()


def known_model_names() -> list[str]:
    """Every built-in name `resolve_model` accepts (full Hugging Face ids; short forms work too)."""
    return sorted(set(BUILTIN_MODELS) | set(_ALIASES))


_DTYPE_BYTES = {
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float32": 4, "fp32": 4, "float": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1,
}


def dtype_bytes_of(dtype: str | None) -> int:
    """Bytes per element of a config.json dtype string ("bfloat16", "torch.float16"); None means bf16."""
    if dtype is None:
        return 2
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[key]


# The largest value of each config.json shape field that a real model could have, about ten times the largest in
# a published checkpoint (Llama 3.1 405B: 126 layers, hidden 16,384, 128 heads, intermediate 53,248; Gemma 3: a
# 262,144-token vocabulary; head_dim 256). Past these a field is a typo or an attack, and the figures made from
# it (1e18 layers: "342741714121 PiB" of KV per request) would be nonsense printed as an estimate.
SHAPE_FIELD_MAX = {
    "num_hidden_layers": 2_048,
    "hidden_size": 262_144,
    "num_attention_heads": 4_096,
    "num_key_value_heads": 4_096,
    "head_dim": 8_192,
    "intermediate_size": 1_048_576,
    "vocab_size": 16_777_216,
    "num_params": 10**14,
}
_ABSENT = object()


def _int_field(cfg: dict[str, Any], key: str, source: str, default: Any = _ABSENT) -> Any:
    """``cfg[key]`` as a positive integer within SHAPE_FIELD_MAX; ``default`` when the key is absent or null (0 is
    never "absent": it is an error naming the field)."""
    value = cfg.get(key)
    if value is None and default is not _ABSENT:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{source}: {key!r} must be a positive integer, got {_short(value)}")
    limit = SHAPE_FIELD_MAX.get(key)
    if limit is not None and value > limit:
        raise ValueError(f"{source}: {key!r} is {_short(value)}, more than any real model has (at most {limit:,})")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def model_from_config(cfg: dict[str, Any], name: str, source: str = "config.json") -> ModelShape:
    """Build a ModelShape from a parsed HF config.json dict. `source` names the file in error messages."""
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        # Multimodal wrappers (Qwen2-VL, Llava...) keep the language model's values under text_config;
        # the KV cache belongs to that language model.
        outer_dtype = cfg.get("torch_dtype", cfg.get("dtype"))
        cfg = dict(cfg["text_config"])
        cfg.setdefault("torch_dtype", outer_dtype)
    if "kv_lora_rank" in cfg:
        raise ValueError(f"{source}: MLA models (kv_lora_rank, e.g. DeepSeek) are not supported: their KV "
                         "cache is one latent per token, not K and V per head")
    if cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts"):
        raise ValueError(f"{source}: mixture-of-experts models are not supported by this cost model")
    layers = _int_field(cfg, "num_hidden_layers", source)
    hidden = _int_field(cfg, "hidden_size", source)
    heads = _int_field(cfg, "num_attention_heads", source)
    kv_heads = _int_field(cfg, "num_key_value_heads", source, heads)  # absent pre-GQA: one KV head per head
    # Absent: the same fallback as TensorRT-LLM's KvCacheCreator, hidden_size // num_attention_heads.
    head_dim = _int_field(cfg, "head_dim", source, None)
    if head_dim is None:
        head_dim = hidden // heads
        if head_dim <= 0:
            raise ValueError(f"{source}: 'hidden_size' {hidden} is smaller than 'num_attention_heads' {heads}, "
                             "so a head has no dimension")
    inter = _int_field(cfg, "intermediate_size", source)
    vocab = _int_field(cfg, "vocab_size", source)
    # transformers >= 4.56 writes "dtype"; older files say "torch_dtype".
    dtype_bytes = dtype_bytes_of(cfg.get("torch_dtype", cfg.get("dtype")))
    tied = bool(cfg.get("tie_word_embeddings", False))
    model_type = str(cfg.get("model_type", "")).lower()
    num_params = cfg.get("num_params") or cfg.get("num_parameters")
    if num_params is not None and not isinstance(num_params, bool) and isinstance(num_params, int) \
            and num_params > SHAPE_FIELD_MAX["num_params"]:
        raise ValueError(f"{source}: the parameter count {_short(num_params)} is more than any real model has "
                         f"(at most {SHAPE_FIELD_MAX['num_params']:,})")
    if not isinstance(num_params, int) or num_params <= 0:
        num_params = estimate_num_params(
            num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
            head_dim=head_dim, intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied,
            qk_norm=model_type.startswith("qwen3"),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        )
    weight_quant, kv_quant = quantization_of(cfg.get("quantization_config"), source)
    return ModelShape(name=name, num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                      hidden_size=hidden, num_attention_heads=heads, intermediate_size=inter,
                      vocab_size=vocab, num_params=num_params, dtype_bytes=dtype_bytes,
                      tie_word_embeddings=tied, weight_quant=weight_quant,
                      kv_dtype_bytes=1 if kv_quant == "fp8" else None)


_FP8_METHODS = ("fp8", "fbgemm_fp8")


def quantization_of(qcfg: Any, source: str = "config.json") -> tuple[str | None, str | None]:
    """(weight quantization, KV cache quantization) of a checkpoint's ``quantization_config`` (config.json) or
    ModelOpt ``hf_quant_config.json`` "quantization" section: ("fp8" or None, "fp8" or None).

    Understood: HF fine-grained FP8 and FBGEMM FP8 (``quant_method`` "fp8" / "fbgemm_fp8"), ModelOpt
    (``quant_algo`` "FP8", ``kv_cache_quant_algo`` "FP8"), compressed-tensors (``config_groups`` whose weights are
    8-bit floats; ``kv_cache_scheme`` of 8-bit floats). Other schemes (INT4 AWQ/GPTQ, NVFP4, ...) would size
    weights wrongly, so they raise ValueError naming the method.
    """
    if qcfg is None:
        return None, None
    if not isinstance(qcfg, dict):
        raise ValueError(f"{source}: quantization_config must be an object, got {type(qcfg).__name__}")
    method = str(qcfg.get("quant_method") or "").lower()
    algo = str(qcfg.get("quant_algo") or "").upper()
    kv_algo = str(qcfg.get("kv_cache_quant_algo") or "").upper()
    kv: str | None = "fp8" if kv_algo == "FP8" else None
    scheme = qcfg.get("kv_cache_scheme")
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and str(scheme.get("type", "")).lower() == "float":
        kv = "fp8"
    if method in _FP8_METHODS or algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_BLOCK_SCALES"):
        return "fp8", kv
    if method == "compressed-tensors":
        groups = qcfg.get("config_groups") or {}
        weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)] if isinstance(groups, dict) else []
        if weights and all(isinstance(w, dict) and w.get("num_bits") == 8 and str(w.get("type", "")).lower() == "float"
                           for w in weights):
            return "fp8", kv
        raise ValueError(f"{source}: compressed-tensors quantization other than 8-bit float weights is not "
                         "supported by this cost model")
    if method in ("", "modelopt") and not algo:
        return None, kv  # a KV-only quantization (or an empty section)
    raise ValueError(f"{source}: quantization {method or algo!r} is not supported (FP8 checkpoints are); its "
                     "weights would be sized wrongly")


def read_json_object(path: Path, label: str) -> dict[str, Any]:
    """A JSON file that must hold one object (a model's config.json, a GPU profile); ValueError naming ``label``
    for a file that cannot be read, is not JSON, or holds something else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {label}: {exc}") from exc
    except RecursionError:
        raise ValueError(f"{label} is not a JSON file kvtop reads: it nests arrays or objects too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{label} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{label}: expected a JSON object, got {type(data).__name__}")
    return data


def _load_config_file(path: Path) -> ModelShape:
    cfg = read_json_object(path, str(path))
    name = cfg.get("_name_or_path") or path.parent.name or str(path)
    quant_file = path.parent / "hf_quant_config.json"  # ModelOpt checkpoints keep their quantization here
    if "quantization_config" not in cfg and quant_file.is_file():
        quant = read_json_object(quant_file, str(quant_file)).get("quantization")
        if quant is not None:
            cfg = {**cfg, "quantization_config": quant}
    return model_from_config(cfg, str(name), source=str(path))


def resolve_model(name_or_path: str | Path) -> ModelShape:
    """A ModelShape from a built-in name, a local HF model directory, or a path to its config.json.

    Built-in names are case-insensitive and may drop the org or the punctuation: "Qwen/Qwen3-8B",
    "qwen3-8b", "llama-3.1-70b". A name that is neither built in nor an existing path raises ValueError
    listing the known names.
    """
    text = str(name_or_path).strip()
    path = Path(text).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ValueError(f"{path} is a directory without a config.json")
        return _load_config_file(config)
    if path.is_file():
        return _load_config_file(path)
    target = _INDEX.get(_key(text))
    if target is not None:
        return BUILTIN_MODELS[target]
    hint = ""
    if text.endswith(".json") or text.startswith((".", "/", "~")):
        hint = f" (no such file or directory: {path})"
    else:
        # compared as the index folds names, each name's short form too ("llama-3-8b" is near "Llama-3.1-8B")
        spellings = {name: name for name in known_model_names()}
        spellings.update({name.split("/", 1)[-1]: name for name in known_model_names()})
        hint = did_you_mean(text, spellings, fold=_key)
    raise ValueError(f"unknown model {text!r}{hint}; known models: {', '.join(known_model_names())}, "
                     "or a local Hugging Face model directory / config.json")
