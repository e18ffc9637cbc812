"""kvtop calibrate without a GPU: a clear message and a non-zero exit, never a half-written profile."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from kvtop import calibrate as cal
from kvtop.commands.calibrate import main as calibrate_main
from kvtop.engines.gpus import load_profile


def test_no_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    out = tmp_path / "p.json"
    assert calibrate_main(["--out", str(out)]) == cal.EXIT_NO_TORCH
    assert "PyTorch is not installed" in capsys.readouterr().err
    assert not out.exists()


def _fake_torch(cuda_version: str | None, available: bool) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "2.13.0+cpu" if cuda_version is None else f"2.13.0+cu{cuda_version.replace('.', '')}"
    torch.version = types.SimpleNamespace(cuda=cuda_version)
    torch.cuda = types.SimpleNamespace(is_available=lambda: available, device_count=lambda: 1 if available else 0)
    return torch


@pytest.mark.parametrize(("cuda", "words"), [(None, "CPU-only build"), ("13.0", "CUDA 13.0 build")])
def test_torch_without_a_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             cuda: str | None, words: str) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(cuda, available=False))
    out = tmp_path / "p.json"
    assert calibrate_main(["--model", "Qwen/Qwen3-8B", "--out", str(out), "--quick"]) == cal.EXIT_NO_GPU
    err = capsys.readouterr().err
    assert "NVIDIA GPU is needed" in err and words in err and "sees no CUDA device" in err
    assert not out.exists()


def test_real_torch_here_if_installed(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the no-GPU path cannot be exercised")
    with pytest.raises(cal.CalibrationUnavailable) as info:
        cal.calibrate("Qwen/Qwen3-8B", quick=True)
    assert info.value.exit_code == cal.EXIT_NO_GPU


def test_unknown_model_is_refused_before_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert calibrate_main(["--model", "no-such-model", "--out", str(tmp_path / "p.json")]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_a_calibrated_profile_drives_estimate_and_the_simulator(tmp_path: Path) -> None:
    # What calibrate writes: raw measurements, from which load_profile derives the cost model's rates. A GPU whose
    # GEMMs and attention ran at half the H200's rates recomputes twice as slowly, in estimate and in the simulator
    # (which ignored a calibrated profile's prefill figures before).
    import dataclasses
    import json

    from kvtop.engines.gpus import BUILTIN_GPUS
    from kvtop.engines.sim.llm import SamplingParams, SimLLM
    from kvtop.estimate import estimate

    measured = json.loads((Path(__file__).parents[2] / "profiles" / "h200-calibrated-2026-12-01.json")
                          .read_text())["measured"]
    slow_measured = dict(measured)
    for key in ("gemm_layer_s_bf16", "gemm_layer_s_fp8", "gemm_layer_s_fp8fast"):
        slow_measured[key] = [[m, 2 * t] for m, t in measured[key]]
    slow_measured["attention_prefill_tokens_s_tflops"] = [[n, 2 * t, f / 2]
                                                          for n, t, f in measured["attention_prefill_tokens_s_tflops"]]
    h200 = BUILTIN_GPUS["H200"]
    paths = {}
    for label, m in (("fast", measured), ("slow", slow_measured)):
        prof = dataclasses.replace(h200, measured=m, gemm_correction={}, attention_prefill_tflops=[], fp8_tflops=None)
        paths[label] = tmp_path / f"{label}.json"
        data = {k: v for k, v in prof.to_dict().items()
                if k not in ("gemm_correction", "attention_prefill_tflops", "fp8_tflops")}
        paths[label].write_text(json.dumps(data))
    fast, slow = load_profile(paths["fast"]), load_profile(paths["slow"])
    assert fast.fp8_tflops == pytest.approx(1430.5, rel=1e-3) and fast.bf16_tflops == pytest.approx(678.8, rel=1e-3)
    assert slow.fp8_tflops == pytest.approx(1430.5 / 2, rel=1e-3)
    e_fast = estimate("Qwen/Qwen3-8B", str(paths["fast"]))
    e_slow = estimate("Qwen/Qwen3-8B", str(paths["slow"]))
    assert e_slow["recompute_s"] / e_fast["recompute_s"] == pytest.approx(2.0, rel=0.1)
    assert e_slow["reload_s"] == pytest.approx(e_fast["reload_s"])
    ttft = {}
    for label in ("fast", "slow"):
        with SimLLM("Qwen/Qwen3-8B", gpu=str(paths[label]), speed=0) as llm:
            out = llm.generate([list(range(4096))], SamplingParams(max_tokens=1))[0]
            ttft[label] = llm.sim_time_s
            assert len(out.outputs[0].token_ids) == 1
    assert ttft["slow"] / ttft["fast"] == pytest.approx(2.0, rel=0.15)
