"""Make the ZMQ payloads of tests/data/engines/<engine>/<version>/frames.json with the engine's OWN encoder classes.

Not run by the tests (they read the committed frames). It loads ``kv_events.py`` as the released wheel ships it
(``pip download --no-deps vllm==0.33.0`` then unzip ``vllm/distributed/kv_events.py``; the same for SGLang's
``sglang/srt/disaggregation/kv_events.py``), with the few names it imports from the rest of its package stubbed
(loggers, config classes, network helpers: nothing the structs use), builds the scenario below from the module's
own ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` / ``KVEventBatch`` structs, and encodes each batch with
``msgspec.msgpack.Encoder`` as the engine's ``ZmqEventPublisher`` does. No engine code is copied here.

Run it in a throwaway venv with ``msgspec``, ``pyzmq`` and ``pydantic`` (what the modules import)::

    python tests/data/engines/make_stream_payloads.py vllm 0.33.0 /tmp/wheels/v033/vllm/distributed/kv_events.py
    python tests/data/engines/make_stream_payloads.py vllm 0.11.0 /tmp/wheels/v0110/vllm/distributed/kv_events.py
    python tests/data/engines/make_stream_payloads.py sglang 0.5.23 \
        /tmp/wheels/sg/sglang/srt/disaggregation/kv_events.py
    python tests/data/engines/make_stream_payloads.py dynamo 1.6.1

Dynamo's mocker encodes in Rust (``ai-dynamo-runtime``): its frames are built here with ``msgpack`` in the shape
a mocker run published (shared/engines-kv-events.md 7.2: topic empty, ``[ts, [events], 0]``, ``BlockStored``
``{block_hashes, parent_block_hash, token_ids, block_size, group_idx}`` and ``BlockRemoved{block_hashes,
group_idx}``, no ``medium``: its sink is the GPU tier only). Its scenario: A, B, C, D stored, E stored under D, A
and C removed (evicted: no lower tier), then a removal of a hash never announced (an unknown removal).

The scenario (the same for every engine; its media spelt as the engine spells them), one batch per engine step:

0. GPU stores 4 blocks (A, B, C, D; A is a u64 hash above 2^63, as vLLM's default int hashes can be)
1. the host tier stores copies of A and B (an offload)
2. the GPU removes A, B, C (A and B live on in the host tier: offloaded; C: evicted)
3. the GPU stores A again (loaded back from the host: an onboard)
4. the host removes B (evicted from the host)
5. AllBlocksCleared (the GPU held A and D, the host A: 2 + 1 blocks cleared)
6. the GPU stores E
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

A, B, C, D, E = 15760518052499183552, 222, 333, 444, 555  # A: kthena#1535's real vLLM 0.26.0 hash
TS0 = 1789095808.0
HOST_MEDIUM = {"vllm": "CPU", "sglang": "CPU_PINNED"}


def _stub(name: str, **attrs: Any) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        if parent not in sys.modules:
            _stub(parent)
        setattr(sys.modules[parent], child, mod)


def load(engine: str, path: str) -> Any:
    import logging

    @dataclass
    class _Config:  # stands for the engine's KVEventsConfig: only the publisher factory reads it
        publisher: str = "null"

    if engine == "vllm":
        _stub("vllm.config.kv_events", KVEventsConfig=_Config)
        _stub("vllm.logger", init_logger=logging.getLogger)
        _stub("vllm.utils.network_utils", get_ip=lambda: "127.0.0.1", get_tcp_uri=lambda h, p: f"tcp://{h}:{p}",
              is_valid_ipv6_address=lambda a: False, split_zmq_path=lambda p: ("tcp", p, ""))
        _stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    else:
        _stub("sglang.srt.runtime_context", get_parallel=lambda: None)
        _stub("sglang.srt.utils.network", NetworkAddress=object)
    spec = importlib.util.spec_from_file_location(f"{engine}_kv_events", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def scenario(engine: str, mod: Any) -> list[Any]:
    host = HOST_MEDIUM[engine]
    fields = {f for f in mod.BlockStored.__struct_fields__}

    def stored(hashes: list[int], medium: str, parent: int | None = None) -> Any:
        kw: dict[str, Any] = {"block_hashes": hashes, "parent_block_hash": parent,
                              "token_ids": list(range(100, 100 + 16 * len(hashes))), "block_size": 16,
                              "lora_id": None, "medium": medium}
        if "lora_name" in fields:
            kw["lora_name"] = None
        if "group_idx" in fields:  # vLLM 0.33: one KV cache group, full attention
            kw["group_idx"] = 0
            kw["kv_cache_spec_kind"] = "full_attention"
        return mod.BlockStored(**kw)

    def removed(hashes: list[int], medium: str) -> Any:
        kw: dict[str, Any] = {"block_hashes": hashes, "medium": medium}
        if "group_idx" in mod.BlockRemoved.__struct_fields__:
            kw["group_idx"] = 0
        return mod.BlockRemoved(**kw)

    steps = [
        [stored([A, B, C, D], "GPU")],
        [stored([A, B], host)],
        [removed([A, B, C], "GPU")],
        [stored([A], "GPU")],
        [removed([B], host)],
        [mod.AllBlocksCleared()],
        [stored([E], "GPU")],
    ]
    rank_field = "data_parallel_rank" if engine == "vllm" else "attn_dp_rank"
    return [mod.KVEventBatch(**{"ts": TS0 + i, "events": events, rank_field: 0}) for i, events in enumerate(steps)]


def dynamo_frames() -> list[dict[str, Any]]:
    import msgpack

    def stored(hashes: list[int], parent: int | None) -> dict[str, Any]:
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                "token_ids": list(range(100, 100 + 16 * len(hashes))), "block_size": 16, "group_idx": 0}

    def removed(hashes: list[int]) -> dict[str, Any]:
        return {"type": "BlockRemoved", "block_hashes": hashes, "group_idx": 0}

    steps = [[stored([A, B, C, D], None)], [stored([E], D)], [removed([A, C])], [removed([999])]]
    return [{"topic": "", "seq": seq, "payload_b64": base64.b64encode(msgpack.packb([TS0 + seq, events, 0])).decode()}
            for seq, events in enumerate(steps)]


def main(argv: list[str]) -> None:
    import msgspec

    if argv[0] == "dynamo":
        out = Path(__file__).parent / "dynamo" / argv[1] / "frames.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"made_by": "msgpack, in the shape Dynamo 1.6.1's mocker published (see the module "
                                              "doc)", "frames": dynamo_frames()}, indent=1) + "\n")
        print(out)
        return
    engine, version, path = argv
    mod = load(engine, path)
    enc = msgspec.msgpack.Encoder()  # the engines' ZmqEventPublisher encodes with a plain Encoder
    frames = [{"topic": "kv-events", "seq": seq, "payload_b64": base64.b64encode(enc.encode(batch)).decode()}
              for seq, batch in enumerate(scenario(engine, mod))]
    out = Path(__file__).parent / engine / version / "frames.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"made_by": f"{engine} {version} kv_events.py (its own structs and msgspec encoder), "
                                          "tests/data/engines/make_stream_payloads.py",
                               "msgspec": msgspec.__version__, "frames": frames}, indent=1) + "\n")
    print(f"{out}: {len(frames)} frames")


if __name__ == "__main__":
    main(sys.argv[1:])
