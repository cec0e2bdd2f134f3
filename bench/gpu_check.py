"""GPU checks: each family's tiny config trained for a few steps the way a GPU run trains it, with figures.

Per family: ``cli.py fit`` of its tiny config with ``bf16-mixed``, ``torch.compile`` (``--model.init_args.compile``)
and, with several GPUs, FSDP2 (``configs/trainer/fsdp.yaml``); then the median step time after warm-up, the
peak memory, which scaled-dot-product-attention kernel ran (flash, memory-efficient, cuDNN or the math
fallback, read from a profiled step), and for the GPT the model FLOPs utilisation against the device's bf16
dense peak:

    MFU = (6 N + 12 L d T) tokens_per_step / step_time / peak        (PaLM, Chowdhery et al. 2022, app. B;
                                                                     nanoGPT's estimate_mfu)

N parameters (embeddings included, as nanoGPT), L layers, d width, T context. Tiny configs are overhead-bound,
so their MFU is low by construction: the figure checks the path (bf16, compile, flash kernel), not the speed.

    python bench/gpu_check.py                       # every family, on the GPU(s) if any
    python bench/gpu_check.py --families gpt --steps 30
    python bench/gpu_check.py --device cpu --no-compile --steps 3      # the CPU-safe path (tests run this)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

ROOT = Path(__file__).resolve().parents[1]

FAMILIES = {  # family: tiny config (what the tests train in seconds)
    "gpt": "configs/gpt/gpt_tiny.yaml",
    "diffusion": "configs/diffusion/tiny.yaml",
    "clip": "configs/clip/tiny.yaml",
    "cnn": "configs/cnn/convnet_digits.yaml",
    "gpt-124m": "configs/gpt/gpt_tiny.yaml",
}

# The tiny GPT is overhead-bound; this row gives it GPT-2 small's body (12 x 768, T = 1024, batch 16) on the same
# offline byte-level data, so its MFU says what the path does on a model that keeps a GPU busy.
OVERRIDES = {
    "gpt-124m": [
        "--model.init_args.net.init_args.n_layer=12",
        "--model.init_args.net.init_args.n_embd=768",
        "--model.init_args.net.init_args.n_head=12",
        "--model.init_args.net.init_args.block_size=1024",
        "--data.init_args.batch_size=16",
        "--data.init_args.samples_per_epoch=4096",
    ],
}

PEAK_BF16 = [  # (substring of torch.cuda.get_device_name, dense bf16 FLOP/s from the vendor's data sheet)
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
]

SDPA_KERNELS = {  # the aten op each SDPA backend dispatches to
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_scaled_dot_product_attention_math": "math",
}


def peak_flops(device_name: str) -> float | None:
    """The bf16 dense peak of a GPU named like ``torch.cuda.get_device_name()``; None if not in the table."""
    for key, flops in PEAK_BF16:
        if key in device_name:
            return flops
    return None


def gpt_flops_per_token(n_params: int, n_layer: int, n_embd: int, block_size: int) -> float:
    """Training FLOPs per token: 6 N for the weights' forward and backward, 12 L d T for attention's scores."""
    return 6 * n_params + 12 * n_layer * n_embd * block_size


def sdpa_kernels(op_names: list[str]) -> list[str]:
    """The SDPA backends among profiled op names (``aten::`` prefix optional), in a stable order."""
    found = {SDPA_KERNELS[n.removeprefix("aten::")] for n in op_names if n.removeprefix("aten::") in SDPA_KERNELS}
    return sorted(found)


class Probe(Callback):
    """Times training steps after ``warmup`` (the device synchronised at both ends), profiles one more step for
    its SDPA kernels, and reads the peak memory."""

    def __init__(self, warmup: int = 3) -> None:
        self.warmup, self.times, self.kernels, self.peak_mib = warmup, [], [], float("nan")
        self._t0, self._prof = 0.0, None

    @staticmethod
    def _sync(pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync(pl_module)
        if trainer.global_step == self.warmup:  # the first step after warm-up is profiled, not timed
            from torch.profiler import ProfilerActivity, profile

            cuda = [ProfilerActivity.CUDA] if pl_module.device.type == "cuda" else []
            self._prof = profile(activities=[ProfilerActivity.CPU, *cuda])
            self._prof.__enter__()
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(pl_module)
        elapsed = time.perf_counter() - self._t0
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            self.kernels = sdpa_kernels([e.key for e in self._prof.key_averages()])
            self._prof = None
        elif trainer.global_step > self.warmup + 1:
            self.times.append(elapsed)
        if pl_module.device.type == "cuda":
            self.peak_mib = torch.cuda.max_memory_allocated(pl_module.device) / 2**20

    def step_ms(self) -> float:
        return 1e3 * statistics.median(self.times) if self.times else float("nan")


def fit_args(family: str, device: str, steps: int, compile: bool, gpus: int, root: str) -> list[str]:
    """The ``cli.py fit`` arguments of one check: the tiny config, bf16, compile, FSDP2 past one GPU, no logger;
    the run's checkpoint goes under ``root``."""
    args = ["fit", "--config", str(ROOT / FAMILIES[family])]
    if gpus > 1:
        args += ["--config", str(ROOT / "configs" / "trainer" / "fsdp.yaml")]
    args += [
        f"--trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}",
        f"--trainer.devices={gpus if device == 'cuda' else 1}",
        "--trainer.precision=bf16-mixed",
        f"--trainer.max_steps={steps}",
        "--trainer.max_epochs=-1",
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=gpu_check.Probe",
        f"--model.init_args.compile={str(compile).lower()}",
        *OVERRIDES.get(family, []),
    ]
    return args


def mfu(module, probe: Probe, world_size: int, device_name: str) -> float | None:
    """The GPT's model FLOPs utilisation over all its devices, or None without a peak for the device."""
    peak = peak_flops(device_name)
    if peak is None or not probe.times:
        return None
    net, h = module.net, module.trainer.datamodule
    n_params = sum(p.numel() for p in net.parameters())
    cfg = (len(net.blocks), net.tok_emb.weight.shape[1], h.block_size)
    tokens = h.batch_size * h.block_size * world_size
    return gpt_flops_per_token(n_params, *cfg) * tokens / (probe.step_ms() / 1e3) / (peak * world_size)


def check(family: str, device: str, steps: int, compile: bool, gpus: int, root: str) -> dict:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).parent))  # "gpu_check.Probe" for the CLI
    from cli import main

    c = main(fit_args(family, device, steps, compile, gpus, root))
    probe = next(cb for cb in c.trainer.callbacks if type(cb).__name__ == "Probe")
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    row = {
        "family": family,
        "step_ms": probe.step_ms(),
        "peak_mib": probe.peak_mib,
        "sdpa": probe.kernels,
        "precision": c.trainer.precision,
        "strategy": type(c.trainer.strategy).__name__,
        "mfu": None,
    }
    if family.startswith("gpt"):
        row["mfu"] = mfu(c.model, probe, c.trainer.world_size, name)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), help="default: all (on a CPU: not gpt-124m)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--steps", type=int, default=20, help="training steps per family (3 of warm-up, 1 profiled)")
    parser.add_argument("--no-compile", action="store_true", help="eager (torch.compile on a CPU needs a C compiler)")
    args = parser.parse_args()
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    families = args.families or [f for f in FAMILIES if gpus or f != "gpt-124m"]
    where = f"{torch.cuda.get_device_name()} x {gpus}" if gpus else "CPU"
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as root:
        rows = [check(f, device, args.steps, not args.no_compile, gpus, root) for f in families]
    if int(__import__("os").environ.get("RANK", "0")) != 0:
        return
    print(f"== gpu_check on {where}, torch {torch.__version__}, compile={not args.no_compile}")
    print("family      precision   strategy               ms/step  peak MiB  SDPA kernel          MFU")
    for r in rows:
        kernel = ", ".join(r["sdpa"]) or "-"
        m = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(
            f"{r['family']:<11} {r['precision']:<11} {r['strategy']:<22} {r['step_ms']:7.1f}  {r['peak_mib']:8.0f}  "
            f"{kernel:<20} {m}"
        )


if __name__ == "__main__":
    main()
