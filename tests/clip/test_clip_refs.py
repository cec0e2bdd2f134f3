"""The contrastive losses against open_clip's (``open_clip.loss``), on one process and on two.

One process: ``ClipLoss`` and ``SigLipLoss`` on the same normalised features, scale and bias give the zoo's
InfoNCE and sigmoid losses, value and gradients. Two gloo processes (a subprocess script): open_clip's
``ClipLoss(local_loss=True, gather_with_grad=True)`` and ``SigLipLoss`` with each of its exchange schemes
(bidir, shift, reduce, gather) give, rank by rank, the zoo's local loss and the gradients of that rank's
features, logit scale and bias (which the zoo gets through its gathering all-gather's backward).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from zoo.clip.losses import infonce_loss, siglip_loss

open_clip_loss = pytest.importorskip("open_clip.loss")
ROOT = Path(__file__).resolve().parents[2]


def features(n: int = 5, dim: int = 8):
    g = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(n, dim, generator=g, dtype=torch.float64), dim=-1)
    texts = F.normalize(images + 0.8 * torch.randn(n, dim, generator=g, dtype=torch.float64), dim=-1)
    scale, bias = torch.tensor(4.0, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64)
    return [x.clone().requires_grad_() for x in (images, texts, scale, bias)]


def value_and_grads(fn):
    inputs = features()
    loss = fn(*inputs)
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return loss.detach(), [torch.zeros(()) if g is None else g for g in grads]


@pytest.mark.parametrize("kind", ["infonce", "siglip"])
def test_losses_equal_open_clips_on_one_process(kind):
    if kind == "infonce":
        ours = value_and_grads(lambda i, t, s, b: infonce_loss(i, t, s, gather=False)["loss"])
        theirs = value_and_grads(lambda i, t, s, b: open_clip_loss.ClipLoss()(i, t, s))
    else:
        ours = value_and_grads(lambda i, t, s, b: siglip_loss(i, t, s, b, gather=False)["loss"])
        theirs = value_and_grads(lambda i, t, s, b: open_clip_loss.SigLipLoss()(i, t, s, b))
    assert ours[0] > 0.1
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-12, atol=1e-12)
    for name, g, h in zip(("images", "texts", "scale", "bias"), ours[1], theirs[1]):
        torch.testing.assert_close(g, h, rtol=1e-10, atol=1e-12, msg=name)


def test_distributed_losses_equal_open_clips_rank_by_rank(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scripts" / "clip_openclip_ranks.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    losses = {}
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        pairs = [("zoo/infonce", "open_clip/infonce")]
        pairs += [("zoo/siglip", f"open_clip/siglip/{s}") for s in ("bidir", "shift", "reduce", "gather")]
        for ours, theirs in pairs:
            for key in ("loss", "images", "texts", "scale", "bias"):
                torch.testing.assert_close(
                    result[ours][key], result[theirs][key], rtol=1e-10, atol=1e-12, msg=f"rank {rank} {theirs} {key}"
                )
        losses[rank] = result["zoo/infonce"]["loss"]
        # Gradients from the other rank's loss reached this rank's features: the gather is differentiable.
        assert result["zoo/infonce"]["texts"].abs().min() > 0
    assert losses[0] != losses[1]  # each rank its own rows of the global matrix
