"""Contrastive losses on 2 gloo processes against one process on the full batch.

Usage: python clip_loss_ranks.py <out.pt>. Rank r takes rows [r b, (r + 1) b) of one seeded batch,
computes the local loss, back-propagates and averages gradients over ranks as DDP does; rank 0 saves
its loss (averaged over ranks) and gradients next to the single-process ones, per loss kind.
Run as a script, in a subprocess of the test: never fork pytest itself.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from zoo.clip import CLIP, TextTransformer, VisionTransformer
from zoo.clip.losses import infonce_loss, siglip_loss

WORLD, LOCAL_BATCH = 2, 4


def _model() -> CLIP:
    torch.manual_seed(0)
    image = VisionTransformer(image_size=16, patch_size=8, width=16, layers=1, heads=2, embed_dim=8)
    text = TextTransformer(vocab_size=32, context_length=6, width=16, layers=1, heads=2, embed_dim=8, eot_id=31)
    return CLIP(image, text, init_logit_bias=-2.0).double()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    n = WORLD * LOCAL_BATCH
    images = torch.randn(n, 3, 16, 16, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 31, (n, 6), generator=g)
    ids[:, -1] = 31
    return images, ids


def _loss(model: CLIP, kind: str, images, ids) -> torch.Tensor:
    out = model(images, ids)
    if kind == "infonce":
        return infonce_loss(out["image_features"], out["text_features"], out["logit_scale"])["loss"]
    return siglip_loss(out["image_features"], out["text_features"], out["logit_scale"], out["logit_bias"])["loss"]


def _run(kind: str, model: CLIP, images, ids) -> dict:
    model.zero_grad()
    loss = _loss(model, kind, images, ids)
    loss.backward()
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    return {"loss": loss.detach(), "grads": grads}


def _worker(rank: int, port: int, out: str) -> None:
    # The reference first: once the group exists, the losses gather across ranks.
    reference = {kind: _run(kind, _model(), *_batch()) for kind in ("infonce", "siglip")}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    model = _model()
    images, ids = _batch()
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    result = {}
    for kind in ("infonce", "siglip"):
        r = _run(kind, model, images[rows], ids[rows])
        for g in [r["loss"], *r["grads"].values()]:  # DDP: gradients (and the logged loss) averaged over ranks
            dist.all_reduce(g)
            g /= WORLD
        result[kind] = r
    if rank == 0:
        torch.save({"ranks": result, "single": reference}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # fork: the workers inherit the imports (Lightning, through zoo.clip, takes seconds per process);
    # nothing has run in this process yet that forking could leave in a bad state.
    mp.start_processes(_worker, args=(free, sys.argv[1]), nprocs=WORLD, join=True, start_method="fork")
