"""Diffusion nets against their peers, in one process, arms alternating: diffusers and DiT's reference.

Rows (zoo time / peer time; below 1 the zoo is faster; issue 16's targets beside them):
  UNet train   one optimizer step (eps MSE at random steps, AdamW: the zoo's fused AdamWCosine, the peer's
               torch.optim.AdamW defaults) of DDPM's 32 px UNet scaled to 32 base channels (mults 1,2,2,2,
               2 res blocks, attention at 16 px, 1 head, GroupNorm 8) against diffusers' UNet2DModel of the
               same layout: identical parameter counts (2,245,763, asserted). fp32 and bf16 autocast.
  DDIM-50      sampling --sample-batch images with 50 DDIM steps: ``DiffusionModule.sample`` against
               diffusers' DDIMScheduler loop over UNet2DModel (fp32).
  DiT-S/2      one optimizer step of DiT-S/2 (32x32x4 latents, 1000 classes, learned sigma) against
               bench/dit_ref.py, an equivalent of facebookresearch/DiT's models.py kept here because DiT is
               not a package (built on timm's blocks, as the original): identical parameter counts (asserted).
Peers missing are named and their rows skipped: `pip install -e ".[bench]"`.

    python bench/diffusion_peers.py               # ~5 min on a 2-core CPU, 1 thread
    python bench/diffusion_peers.py --rows unet,ddim --rounds 5
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from bench._common import RATIO_HEADERS, add_clock_arg, alternate, missing, peer_header, ratio_row, table
from zoo.diffusion import DDIMSampler, DiffusionModule, DiT, UNet
from zoo.train.optim import AdamWCosine

try:
    import diffusers
except ImportError:
    diffusers = None
try:
    from bench import dit_ref  # needs timm
except ImportError:
    dit_ref = None

UNET = dict(
    in_channels=3,
    image_size=32,
    base_channels=32,
    channel_mults=(1, 2, 2, 2),
    num_res_blocks=2,
    attention_resolutions=(16,),
    num_heads=1,
    dropout=0.0,
    norm_groups=8,
)


def diffusers_unet():
    return diffusers.UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64, 64, 64),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=None,
        flip_sin_to_cos=False,
        freq_shift=1,
    )


def n_params(net) -> int:
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


def step_fn(call, net, opt, batch, bf16: bool):
    x, t, y, noise = batch

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            out = call(net, x, t, y)
        loss = F.mse_loss(out.float()[:, : noise.shape[1]], noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def pair_rows(label, zoo, peer, zoo_call, peer_call, shape, classes, batch, rounds, target) -> list:
    assert n_params(zoo) == n_params(peer), (n_params(zoo), n_params(peer))
    rows = []
    for bf16 in (False, True):
        g = torch.Generator().manual_seed(0)
        data = (
            torch.randn(batch, *shape, generator=g),
            torch.randint(0, 1000, (batch,), generator=g),
            torch.randint(0, max(classes, 1), (batch,), generator=g),
            torch.randn(batch, *shape, generator=g),
        )
        arms = {
            "zoo": step_fn(zoo_call, zoo, AdamWCosine(lr=1e-4).configure(zoo, None)["optimizer"], data, bf16),
            "peer": step_fn(peer_call, peer, torch.optim.AdamW(peer.parameters(), lr=1e-4), data, bf16),
        }
        tag = f"{label} train B{batch} {'bf16 autocast' if bf16 else 'fp32'}"
        rows.append(ratio_row(tag, alternate(arms, rounds), "zoo", "peer", target))
    return rows


def ddim_row(args) -> list:
    torch.manual_seed(0)
    zoo = DiffusionModule(UNet(**UNET), num_timesteps=1000, ema_decay=None).eval()
    peer = diffusers_unet().eval()
    sched = diffusers.DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=True)
    n = args.sample_batch

    @torch.inference_mode()
    def theirs():
        x = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        sched.set_timesteps(50)
        for t in sched.timesteps:
            x = sched.step(peer(x, t).sample, t, x).prev_sample

    @torch.inference_mode()
    def ours():
        zoo.sample(n, partial(DDIMSampler, steps=50))

    times = alternate({"zoo": ours, "peer": theirs}, max(2, args.rounds // 2))
    return [ratio_row(f"UNet DDIM-50 sampling, batch {n}, fp32", times, "zoo", "peer", 0.9)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    add_clock_arg(ap)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", default="unet,ddim,dit")
    ap.add_argument("--unet-batch", type=int, default=8)
    ap.add_argument("--dit-batch", type=int, default=2)
    ap.add_argument("--sample-batch", type=int, default=8)
    args = ap.parse_args()
    peer_header("Diffusion: zoo vs diffusers and DiT's reference (bench/dit_ref.py)", args.threads, args.clock)
    rows = []
    if diffusers is None:
        missing("diffusers", 'pip install -e ".[bench]"')
    elif "unet" in args.rows:
        torch.manual_seed(0)
        rows += pair_rows(
            "UNet 32px/32ch vs diffusers UNet2DModel",
            UNet(**UNET),
            diffusers_unet(),
            lambda m, x, t, y: m(x, t),
            lambda m, x, t, y: m(x, t).sample,
            (3, 32, 32),
            0,
            args.unet_batch,
            args.rounds,
            0.9,
        )
    if diffusers is not None and "ddim" in args.rows:
        rows += ddim_row(args)
    if dit_ref is None:
        missing("timm (DiT's reference is built on it)", 'pip install -e ".[bench]"')
    elif "dit" in args.rows:
        torch.manual_seed(0)
        zoo = DiT(size="S", patch_size=2, image_size=32, in_channels=4, num_classes=1000, learn_sigma=True)
        rows += pair_rows(
            "DiT-S/2 vs DiT reference",
            zoo,
            dit_ref.DiT(),
            lambda m, x, t, y: m(x, t, y),
            lambda m, x, t, y: m(x, t, y),
            (4, 32, 32),
            1000,
            args.dit_batch,
            args.rounds,
            0.95,
        )
    print(table(RATIO_HEADERS, rows))


if __name__ == "__main__":
    main()
