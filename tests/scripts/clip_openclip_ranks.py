"""The zoo's contrastive losses and open_clip's on 2 gloo processes, rank by rank.

Usage: python clip_openclip_ranks.py <out_dir>. Each rank takes its rows of one seeded batch of normalised
features and computes, for each loss, the zoo's (gathering with gradient, local rows) and open_clip's
(``ClipLoss(local_loss=True, gather_with_grad=True)``; ``SigLipLoss`` with each of its exchange schemes),
back-propagates, and saves its loss and the gradients of its own features, logit scale and bias to
``<out_dir>/rank<r>.pt``. Run in a subprocess of the test: never fork pytest itself.
"""

import faulthandler
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from open_clip.loss import ClipLoss, SigLipLoss

from zoo.clip.losses import infonce_loss, siglip_loss

WORLD, LOCAL_BATCH, DIM = 2, 3, 8
SIGLIP_SCHEMES = ("bidir", "shift", "reduce", "gather")


def _inputs(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = WORLD * LOCAL_BATCH
    images = F.normalize(torch.randn(n, DIM, generator=g, dtype=torch.float64), dim=-1)
    texts = F.normalize(images + 0.8 * torch.randn(n, DIM, generator=g, dtype=torch.float64), dim=-1)
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    scale, bias = torch.tensor(4.0, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64)
    return [x.clone().requires_grad_() for x in (images[rows], texts[rows], scale, bias)]


def _run(fn) -> dict[str, torch.Tensor]:
    images, texts, scale, bias = inputs = _inputs(dist.get_rank())
    loss = fn(images, texts, scale, bias)
    loss.backward()
    names = ("images", "texts", "scale", "bias")
    return {
        "loss": loss.detach(),
        **{n: x.grad.clone() if x.grad is not None else torch.zeros_like(x) for n, x in zip(names, inputs)},
    }


def _worker(rank: int, port: int, out: str) -> None:
    faulthandler.dump_traceback_later(120, exit=True)  # a deadlock fails with every rank's stack
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    clip = ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=WORLD)
    result = {
        "zoo/infonce": _run(lambda i, t, s, b: infonce_loss(i, t, s)["loss"]),
        "open_clip/infonce": _run(lambda i, t, s, b: clip(i, t, s)),
        "zoo/siglip": _run(lambda i, t, s, b: siglip_loss(i, t, s, b)["loss"]),
    }
    for scheme in SIGLIP_SCHEMES:
        sig = SigLipLoss(rank=rank, world_size=WORLD, dist_impl=scheme)
        result[f"open_clip/siglip/{scheme}"] = _run(lambda i, t, s, b, sig=sig: sig(i, t, s, b))
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_worker, args=(free, sys.argv[1]), nprocs=WORLD, join=True, start_method="fork")
