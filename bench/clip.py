"""CLIP training throughput, and what gathering every rank's features costs with 2 processes against 1.

1. Training step of a config's net (default ``configs/clip/vit_shapes.yaml``): forward of both towers,
   the loss, backward, AdamW step on the zoo's parameter groups, logit-scale clamp. Inputs are random
   images and random byte captions of the config's shapes, already on the device: this measures compute,
   not data loading. Reported: ms/step and images/s (median over rounds, range min..max).
2. The cross-rank gather: the InfoNCE loss, forward and backward, on random normalised (b, E) features,
   first in one process (no gather: a b x b matrix), then in 2 gloo processes on this machine that each
   hold b pairs (all-gather with gradients: a b x 2b matrix per rank, and the backward's reduce-scatter).
   Also the bare all-gather of a (b, 2E) block (image and text features travel together), forward and
   backward. On one CPU the two processes share cores: the figure is the gather's latency, not a network's.

    python bench/clip.py                                    # about a minute on 2 CPU cores
    python bench/clip.py --config configs/clip/tiny.yaml --batch 64 --threads 1
    python bench/clip.py --device cuda --steps 50
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from bench._common import median, now, print_header, resolve_device, set_threads, spread, table
from zoo.clip.losses import gather_with_grad, infonce_loss
from zoo.train.optim import adamw_warmup_cosine

ROOT = Path(__file__).resolve().parents[1]


def build(config: str):
    """The config's ContrastiveModule and its data settings, through the CLI's parser (nothing is run)."""
    from cli import main

    sys.argv = sys.argv[:1]  # the benchmark's own flags are not the CLI's
    c = main(["--config", config, "--trainer.logger=false"], run=False)
    return c.model, c.datamodule


def time_steps(model, dm, batch: int, steps: int, repeats: int, warmup: int, device: torch.device) -> list[float]:
    net = model.net.to(device).train()
    opt = adamw_warmup_cosine(net, None, 1e-4, 0.1, (0.9, 0.98), 0, 1.0)["optimizer"]
    c, s, _ = dm.image_shape
    images = torch.randn(batch, c, s, s, device=device)
    text = torch.randint(0, 256, (batch, dm.context_length), device=device)
    text[:, -1] = model.net.text_encoder.eot_id if hasattr(model.net.text_encoder, "eot_id") else 256

    def step():
        out = net(images, text)
        loss = infonce_loss(out["image_features"], out["text_features"], out["logit_scale"])["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        net.clamp_logit_scale()

    for _ in range(warmup):
        step()
    rounds = []
    for _ in range(repeats):
        t = now(device)
        for _ in range(steps):
            step()
        rounds.append((now(device) - t) / steps)
    return rounds


def _loss_times(b: int, e: int, iters: int, gather: bool) -> tuple[list[float], list[float]]:
    """Per-iteration seconds of (loss forward+backward, bare all-gather forward+backward)."""
    g = torch.Generator().manual_seed(dist.get_rank() if gather else 0)
    img = F.normalize(torch.randn(b, e, generator=g), dim=-1).requires_grad_()
    txt = F.normalize(torch.randn(b, e, generator=g), dim=-1).requires_grad_()
    scale = torch.tensor(14.3)
    device = torch.device("cpu")
    loss_t, gather_t = [], []
    for i in range(iters + 3):  # 3 untimed
        if gather:
            dist.barrier()
        t = now(device)
        infonce_loss(img, txt, scale, gather=gather)["loss"].backward()
        t1 = now(device)
        if gather:
            both, _ = gather_with_grad(torch.cat([img, txt], dim=1))
            both.sum().backward()
        t2 = now(device)
        if i >= 3:
            loss_t.append(t1 - t)
            gather_t.append(t2 - t1)
    return loss_t, gather_t


def _rank(rank: int, port: int, b: int, e: int, iters: int, threads: int, out: dict) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    loss_t, gather_t = _loss_times(b, e, iters, gather=True)
    if rank == 0:
        out["loss"], out["gather"] = loss_t, gather_t
    dist.destroy_process_group()


def gather_cost(b: int, e: int, iters: int, threads: int) -> dict:
    one_loss, _ = _loss_times(b, e, iters, gather=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(port, b, e, iters, threads, out), nprocs=2, start_method="fork")
        two = dict(out)
    return {"one_loss": one_loss, "two_loss": two["loss"], "two_gather": two["gather"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "clip" / "vit_shapes.yaml"))
    p.add_argument("--batch", type=int, default=None, help="pairs per step (default: the config's batch_size)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--gather-iters", type=int, default=50)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="auto")
    a = p.parse_args()
    set_threads(a.threads)
    device = resolve_device(a.device)
    print_header("CLIP: training step and cross-rank gather", device)
    model, dm = build(a.config)
    batch = a.batch or dm.batch_size
    e = model.net.text_encoder.embed_dim
    n_params = sum(p.numel() for p in model.net.parameters())
    rounds = time_steps(model, dm, batch, a.steps, a.repeats, a.warmup, device)
    ms = median(rounds) * 1e3
    print(
        f"\n{Path(a.config).name}: {n_params / 1e3:.0f}K parameters, batch {batch}, images {dm.image_shape}, "
        f"{dm.context_length} tokens, E={e}"
    )
    print(
        table(
            ["", "ms/step", "range (ms)", "images/s"],
            [["train step", f"{ms:.1f}", spread([r * 1e3 for r in rounds], 1), f"{batch / median(rounds):.0f}"]],
        )
    )

    threads = max(1, torch.get_num_threads() // 2)
    cost = gather_cost(batch, e, a.gather_iters, threads)
    print(f"\nInfoNCE forward+backward, local batch b={batch}, E={e}; 2 processes on gloo, {threads} thread(s) each:")
    rows = [
        [
            "1 process (b x b, no gather)",
            f"{median(cost['one_loss']) * 1e3:.3f}",
            spread([t * 1e3 for t in cost["one_loss"]]),
        ],
        [
            "2 processes (b x 2b, gathered)",
            f"{median(cost['two_loss']) * 1e3:.3f}",
            spread([t * 1e3 for t in cost["two_loss"]]),
        ],
        [
            "  of which all-gather fwd+bwd",
            f"{median(cost['two_gather']) * 1e3:.3f}",
            spread([t * 1e3 for t in cost["two_gather"]]),
        ],
    ]
    print(table(["", "ms", "range (ms)"], rows))
    print(
        f"gather overhead per step: {(median(cost['two_loss']) - median(cost['one_loss'])) * 1e3:.3f} ms "
        f"= {(median(cost['two_loss']) - median(cost['one_loss'])) / median(rounds) * 100:.1f}% of a training step"
    )


if __name__ == "__main__":
    main()
