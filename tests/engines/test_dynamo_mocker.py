"""A real third-party publisher: NVIDIA Dynamo's mocker (``python -m dynamo.mocker``, ai-dynamo 1.6.1), a GPU-free
vLLM-style scheduler and KV manager that publishes vLLM-format KV events on ``--zmq-kv-events-ports``, behind
Dynamo's own frontend (``python -m dynamo.frontend``), whose ``/metrics`` counts cached and input tokens.

Opt-in: ``KVTOP_DYNAMO_PYTHON`` names a Python that has ``ai-dynamo`` and ``ai-dynamo-runtime`` (``.ci/run`` makes
one in ``.venv-dynamo``: 75 MB runtime wheel, ~25 s to install here; ``aisimulate``, a stub wheel that downloads
from an index that cannot be reached, is skipped: the mocker runs without it). The tokenizer is trained here on the
spot (``tokenizers``, a dependency of ai-dynamo's transformers): no hub at run time.

Prompts A, B, A, B (237 tokens each, 14 full 16-token blocks) through a 32-block GPU pool: the second A and B are
served from the cache (the frontend says 224 cached tokens each), and kvtop, attached to the mocker's stream and the
frontend's metrics, shows it: 28 hit blocks of 59 looked up, and every block the stream announced.

Both Dynamo processes bind their own ports on every interface whatever their host flags say (run here,
shared/engines-kv-events.md 7.2), so this runs only where asked (CI's private machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

from kvtop.compose import build_attach_session

DYNAMO_PYTHON = os.environ.get("KVTOP_DYNAMO_PYTHON")
pytestmark = pytest.mark.skipif(not DYNAMO_PYTHON, reason="set KVTOP_DYNAMO_PYTHON to a Python with ai-dynamo "
                                                          "(.ci/run does)")

TOKENIZER = r'''
import json, sys, pathlib
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 4, "kv cache tiers gpu host disk"], trainer)
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
    "model_max_length": 4096, "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}))
(out / "config.json").write_text(json.dumps({
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": tok.get_vocab_size(),
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    "intermediate_size": 128, "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2}))
'''


def _prompt(word: str) -> str:
    return " ".join(f"{word}{i}" for i in range(62))  # 237 tokens with the tokenizer above


def _complete(port: int, prompt: str) -> dict:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["usage"]


def _wait_model(port: int, procs: list[subprocess.Popen], logs: list[Path], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p, log in zip(procs, logs):
            if p.poll() is not None:
                raise AssertionError(f"{log.name} exited {p.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as resp:
                if json.loads(resp.read()).get("data"):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("the Dynamo frontend never listed the mocker's model: " + logs[0].read_text()[-2000:])


@pytest.fixture
def mocker(tmp_path: Path):
    tok = tmp_path / "tok"
    subprocess.run([DYNAMO_PYTHON, "-c", TOKENIZER, str(tok)], check=True, timeout=120)
    ev, rp, http = free_port(), free_port(), free_port()
    env = {**os.environ, "DYN_FILE_KV": str(tmp_path / "discovery"), "DYN_HTTP_HOST": "127.0.0.1"}
    logs = [tmp_path / "mocker.log", tmp_path / "frontend.log"]
    cmds = [
        [DYNAMO_PYTHON, "-m", "dynamo.mocker", "--model-path", str(tok), "--model-name", "tiny",
         "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq", "--block-size", "16",
         "--num-gpu-blocks-override", "32", "--enable-prefix-caching", "--num-host-blocks", "128",
         "--kv-bytes-per-token", "1024", "--zmq-kv-events-ports", str(ev), "--zmq-replay-ports", str(rp),
         "--speedup-ratio", "50"],
        [DYNAMO_PYTHON, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(http),
         "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq", "--router-mode", "kv"],
    ]
    procs = [subprocess.Popen(c, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=tmp_path)
             for c, log in zip(cmds, logs)]
    try:
        _wait_model(http, procs, logs)
        yield ev, rp, http
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


async def test_prompts_a_b_a_b_show_reuse_in_kvtop(mocker):
    ev, rp, http = mocker
    url = f"zmq://127.0.0.1:{ev}?replay=tcp://127.0.0.1:{rp}&metrics=http://127.0.0.1:{http}/metrics"
    session = build_attach_session(url, command="attach", run="mocker")
    task = asyncio.ensure_future(session.run())
    await asyncio.sleep(1.5)  # subscribed, and the metrics baseline scraped
    usages = []
    for word in ("A", "B", "A", "B"):
        usages.append(await asyncio.to_thread(_complete, http, _prompt(word)))
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    prompt = sum(u["prompt_tokens"] for u in usages)
    assert cached[:2] == [0, 0] and min(cached[2:]) > 0, usages

    def model():
        return next(iter(session.models.values()), None)

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = model()
        if m is not None and m.hit_rate.hits == sum(cached) // 16 and m.hit_rate.lookups == prompt // 16:
            break
        await asyncio.sleep(0.2)
    session.stop()
    await asyncio.wait_for(task, 10)
    m = model()
    assert m is not None
    s = m.summary()
    # reuse, as kvtop shows it: hits from the frontend's counters, in blocks
    assert (m.hit_rate.hits, m.hit_rate.lookups) == (sum(cached) // 16, prompt // 16)   # (28, 59) here
    assert m.hit_rate.cumulative == pytest.approx((sum(cached) // 16) / (prompt // 16))
    # the stream: the mocker's batches from seq 0, no gap, GPU blocks only (its native sink carries no medium)
    st = s["stream"]
    assert st["since_attach"] is False and st["lost_batches"] == 0 and st["bad_events"] == 0
    assert st["batches"] >= 4 and st["stored_blocks"]["host"] == 0
    # A and B each stored their 14 full blocks once; the second A and B stored only what decoding added
    assert st["stored_blocks"]["gpu"] >= 28 and m.gpu.cached_blocks == st["stored_blocks"]["gpu"] - st[
        "removed_blocks"]["gpu"]
    assert m.gpu.capacity_blocks == 32 and m.gpu.tokens_per_block == 16
