"""Diffusion family: training step time of the two shapes configs' nets, and DDIM against DDPM sampling time.

The nets are built from the configs' own ``init_args`` (configs/diffusion/ddpm_unet_shapes.yaml: a 1.1M
UNet on 16x16 images; configs/diffusion/dit_s_shapes.yaml: DiT-S/2 on 32x32, 256 tokens, 33M), wrapped in
``DiffusionModule`` as the configs wrap them (no EMA here: it is a callback, outside the step).

  train   one optimizer step on a random batch: the module's denoising loss (random steps and noise),
          zero_grad(set_to_none=True), backward, AdamW step (fused on CUDA); under torch.autocast(bf16)
          with --dtype bf16. --warmup untimed steps, then --repeats rounds of --steps steps; the two nets
          alternate within each round (ABBA), so a drift in load hits both. ms/step and images/s are
          medians over rounds, "range" their min-max.
  sample  the UNet, ``DiffusionModule.sample`` of --sample-batch images: DDIM at 50 steps against DDPM at
          all T = 1000 steps, same seed, rounds alternating the two. The denoiser is called 20x fewer
          times by DDIM, so the time ratio should be close to 20 (the sampler's own arithmetic per step
          is a handful of elementwise ops). Target: ratio >= 15.

Figures, not tests: MET/MISSED is printed beside the target and the script always exits 0. On a shared
CPU the medians of paired rounds absorb a neighbour's bursts; ``--threads 1`` steadies them.

    python bench/diffusion.py                               # CPU: minutes (DiT-S/2 steps take seconds)
    python bench/diffusion.py --device cuda --dtype bf16
    python bench/diffusion.py --parts sample --sample-batch 4 --repeats 1
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import yaml

from bench._common import median, now, print_header, resolve_device, set_threads, spread, table
from zoo.diffusion import DDIMSampler, DDPMSampler, DiffusionModule, DiT, GaussianDiffusion, UNet

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "diffusion"
NETS = {"unet": ("ddpm_unet_shapes.yaml", UNet), "dit-s/2": ("dit_s_shapes.yaml", DiT)}
DEFAULTS = {"cpu": (1, 2, 3), "cuda": (10, 20, 5)}  # (warmup, steps per round, rounds)
SAMPLE_TARGET = 15.0


def build(name: str) -> DiffusionModule:
    """The config's net and module arguments (EMA off: a callback, not part of a step)."""
    config, cls = NETS[name]
    model = yaml.safe_load((CONFIGS / config).read_text())["model"]["init_args"]
    net = cls(**model.pop("net")["init_args"])
    objective = GaussianDiffusion(**model.pop("objective")["init_args"])
    del model["sampler"]  # the sampling runs give theirs
    model.update(ema_decay=None)
    return DiffusionModule(net, objective, **model)


def train_round(module, opt, batch, steps: int, device, autocast) -> float:
    t0 = now(device)
    for _ in range(steps):
        with autocast():
            loss = module._loss(batch)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (now(device) - t0) / steps


def bench_train(args, device, autocast) -> None:
    warmup, steps, repeats = args.warmup, args.steps, args.repeats
    setups = {}
    for name in NETS:
        torch.manual_seed(0)
        module = build(name).to(device)
        c, s = module.image_shape[0], module.image_shape[1]
        batch = (
            torch.rand(args.batch_size, c, s, s, device=device) * 2 - 1,
            torch.randint(0, max(module.num_classes, 1), (args.batch_size,), device=device),
        )
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=device.type == "cuda" or None)
        if warmup:
            train_round(module, opt, batch, warmup, device, autocast)
        setups[name] = (module, opt, batch)
    times: dict[str, list[float]] = {n: [] for n in NETS}
    for r in range(repeats):
        order = list(NETS) if r % 2 == 0 else list(reversed(NETS))
        for name in order:
            times[name].append(train_round(*setups[name], steps, device, autocast))
    rows = []
    for name, ts in times.items():
        module = setups[name][0]
        params = sum(p.numel() for p in module.parameters()) / 1e6
        shape = "x".join(map(str, module.image_shape))
        rows.append(
            [
                name,
                f"{params:.1f}M",
                shape,
                f"{median(ts) * 1e3:.1f}",
                spread([t * 1e3 for t in ts], 1),
                f"{args.batch_size / median(ts):.1f}",
            ]
        )
    print(f"\n-- train: batch {args.batch_size}, {steps} steps x {repeats} rounds after {warmup} warm-up")
    print(table(["net", "params", "image", "ms/step", "range", "images/s"], rows))


def bench_sample(args, device, autocast) -> None:
    torch.manual_seed(0)
    module = build("unet").to(device).eval()
    runs = {"ddim-50": partial(DDIMSampler, steps=50), "ddpm-1000": DDPMSampler}
    with autocast():
        module.sample(args.sample_batch, partial(DDIMSampler, steps=2))  # warm-up
    times: dict[str, list[float]] = {n: [] for n in runs}
    for r in range(args.repeats):
        for name in runs if r % 2 == 0 else reversed(runs):
            t0 = now(device)
            with autocast():
                module.sample(args.sample_batch, runs[name], seed=r)
            times[name].append(now(device) - t0)
    calls = {"ddim-50": 50, "ddpm-1000": module.objective.schedule.num_timesteps}
    rows = [
        [n, calls[n], f"{median(ts):.2f}", spread(ts, 2), f"{median(ts) / calls[n] * 1e3:.1f}"]
        for n, ts in times.items()
    ]
    ratios = [b / a for a, b in zip(times["ddim-50"], times["ddpm-1000"])]
    ratio = median(ratios)
    print(f"\n-- sample: UNet (ddpm_unet_shapes), {args.sample_batch} images, {args.repeats} rounds")
    print(table(["sampler", "net calls", "s", "range", "ms/call"], rows))
    verdict = "MET" if ratio >= SAMPLE_TARGET else "MISSED"
    print(
        f"DDPM-1000 / DDIM-50 time: {ratio:.1f}x for {calls['ddpm-1000'] / 50:.0f}x the calls "
        f"(target >= {SAMPLE_TARGET:.0f}x): {verdict}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="train,sample", help="comma-separated: train, sample")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: torch.autocast(bfloat16)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: PyTorch's)")
    parser.add_argument("--batch-size", type=int, default=None, help="training batch (default: cpu 16, cuda 128)")
    parser.add_argument("--sample-batch", type=int, default=None, help="images per sample() (default: cpu 8, cuda 64)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed training steps per round")
    parser.add_argument("--repeats", type=int, default=None, help="rounds")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    device = resolve_device(args.device)
    warmup, steps, repeats = DEFAULTS[device.type]
    args.warmup = warmup if args.warmup is None else args.warmup
    args.steps = steps if args.steps is None else args.steps
    args.repeats = repeats if args.repeats is None else args.repeats
    args.batch_size = args.batch_size or (128 if device.type == "cuda" else 16)
    args.sample_batch = args.sample_batch or (64 if device.type == "cuda" else 8)
    print_header("bench/diffusion.py", device)

    def autocast():
        if args.dtype == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    parts = args.parts.split(",")
    if "train" in parts:
        bench_train(args, device, autocast)
    if "sample" in parts:
        bench_sample(args, device, autocast)


if __name__ == "__main__":
    main()
