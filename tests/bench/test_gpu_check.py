"""bench/gpu_check.py's CPU-safe parts: the peak table, the FLOPs formula, reading which SDPA kernel ran from a
profile, and one family's check run end to end on the CPU (the GPU figures need a GPU)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_peak_table_tells_h100_pcie_from_sxm_and_knows_no_cpu():
    assert gpu_check.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_check.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_check.peak_flops("NVIDIA H200") == 989e12
    assert gpu_check.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpu_check.peak_flops("CPU") is None


def test_gpt_flops_per_token_is_nanogpts_estimate():
    # nanoGPT's estimate_mfu: 6N + 12 L H Q T, with H Q = d; GPT-2 124M at T = 1024: ~0.87 GFLOP per token.
    n, layers, d, t = 124_337_664, 12, 768, 1024
    assert gpu_check.gpt_flops_per_token(n, layers, d, t) == 6 * n + 12 * layers * 12 * 64 * t
    assert gpu_check.gpt_flops_per_token(n, layers, d, t) == pytest.approx(0.859e9, rel=0.01)


@pytest.mark.parametrize(("backend", "kernel"), [(None, "flash (CPU)"), (SDPBackend.MATH, "math")])
def test_sdpa_kernel_is_read_from_a_profile(backend, kernel):
    q = torch.randn(2, 2, 16, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if backend is None:
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        else:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert gpu_check.sdpa_kernels([e.key for e in prof.key_averages()]) == [kernel]


def test_gpt_check_runs_on_cpu_with_bf16_and_reports_its_figures(tmp_path):
    row = gpu_check.check("gpt", "cpu", steps=7, compile=False, gpus=0, root=str(tmp_path))
    assert row["precision"] == "bf16-mixed" and row["strategy"] == "SingleDeviceStrategy"
    assert math.isfinite(row["step_ms"]) and row["step_ms"] > 0
    assert row["sdpa"] == ["flash (CPU)"]  # the GPT's attention went through the fused kernel
    assert row["mfu"] is None  # no peak for a CPU
    assert gpu_check.fit_args("gpt", "cuda", 5, True, 2, "r")[4].endswith("fsdp.yaml")  # FSDP2 past one GPU
    big = gpu_check.fit_args("gpt-124m", "cuda", 5, True, 1, "r")  # GPT-2 small's body on the tiny GPT's data
    assert "--model.init_args.net.init_args.n_embd=768" in big
    assert "--model.init_args.net.init_args.block_size=1024" in big
    assert not any("data.init_args.block_size" in a for a in big)  # the windows are the net's context (zoo.app.sizes)


def test_mfu_is_model_flops_per_second_over_the_peak_of_every_device():
    from types import SimpleNamespace

    from zoo.gpt import GPT

    net = GPT(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)
    module = SimpleNamespace(net=net, trainer=SimpleNamespace(datamodule=SimpleNamespace(batch_size=4, block_size=16)))
    probe = gpu_check.Probe()
    probe.times = [0.010, 0.020, 0.030]  # median 20 ms
    n = sum(p.numel() for p in net.parameters())
    want = (6 * n + 12 * 2 * 32 * 16) * (4 * 16 * 2) / 0.020 / (989e12 * 2)
    assert gpu_check.mfu(module, probe, 2, "NVIDIA H100 80GB HBM3") == pytest.approx(want)
    assert gpu_check.mfu(module, probe, 2, "CPU") is None
