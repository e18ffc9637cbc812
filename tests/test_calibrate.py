"""kvtop calibrate without a GPU: a clear message and a non-zero exit, never a half-written profile."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from kvtop.engines.gpus import GpuProfile, load_profile, save_profile
from kvtop.report import calibrate as cal


def test_no_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    out = tmp_path / "p.json"
    assert cal.main(["--out", str(out)]) == cal.EXIT_NO_TORCH
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
    assert cal.main(["--model", "Qwen/Qwen3-8B", "--out", str(out), "--quick"]) == cal.EXIT_NO_GPU
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
    assert cal.main(["--model", "no-such-model", "--out", str(tmp_path / "p.json")]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_profile_with_a_measured_prefill_efficiency_drives_estimate(tmp_path: Path) -> None:
    # The shape of what calibrate writes; estimate takes the measured efficiency over the built-in 0.88.
    from kvtop.report.estimate import estimate

    prof = GpuProfile(name="H200", memory_bytes=143771 << 20, hbm_GBps=4250.0, bf16_tflops=791.3, h2d_GBps=55.28,
                      d2h_GBps=55.22, link_name="pcie5", source="measured: test", copy_latency_us=3.57,
                      measured={"prefill_efficiency": 0.44})
    path = tmp_path / "h200.json"
    save_profile(prof, path)
    assert load_profile(path).measured["prefill_efficiency"] == 0.44
    base = estimate("Qwen/Qwen3-8B", "H200")
    slow = estimate("Qwen/Qwen3-8B", str(path))
    assert slow["recompute_s"] == pytest.approx(2 * base["recompute_s"], rel=1e-3)  # 0.44 is half of 0.88
    assert slow["reload_s"] == pytest.approx(base["reload_s"])
