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
  flow train   one optimizer step of flow matching on the DiT of configs/diffusion/flow_dit_tiny_shapes16.yaml
               (16 px, depth 4, width 128, 6 classes, velocity out; batch 32 as the config): the zoo's
               ``DiffusionModule`` with ``FlowMatching`` (logit-normal t, x_t = (1 - t) x_0 + t eps, target
               eps - x_0, 10% of labels dropped as its training_step does) against the same step written as
               diffusers' train_dreambooth_sd3.py writes it, around ``DiTTransformer2DModel`` holding the same
               weights: ``compute_density_for_timestep_sampling`` (logit-normal), the
               ``FlowMatchEulerDiscreteScheduler``'s timesteps and sigmas (get_sigmas), x_t, the velocity target
               and ``compute_loss_weighting_for_sd3``; its label embedders drop 10% themselves in train mode.
               diffusers' DiT keeps a copy of the step and label embedders in every block (+150k parameters at
               depth 4, updated too): that is its layout, not a handicap added here.
  Euler-16     sampling --sample-batch images with 16 Euler steps, classifier-free guidance 2 (one batched call
               per step): ``DiffusionModule.sample`` with ``FlowEulerSampler`` against diffusers'
               ``FlowMatchEulerDiscreteScheduler`` loop (DiTPipeline's guidance) over the same-weight
               ``DiTTransformer2DModel``; the two arms' images are checked equal before timing.
Peers missing are named and their rows skipped: `pip install -e ".[bench]"`.

    python bench/diffusion_peers.py               # ~5 min on a 2-core CPU, 1 thread
    python bench/diffusion_peers.py --rows unet,ddim --rounds 5
    python bench/diffusion_peers.py --rows flow,euler --rounds 10 --clock cpu
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
from zoo.diffusion import DDIMSampler, DiffusionModule, DiT, FlowEulerSampler, FlowMatching, GaussianDiffusion, UNet
from zoo.diffusion.convert import from_diffusers
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
    zoo = DiffusionModule(UNet(**UNET), GaussianDiffusion(1000), ema_decay=None).eval()
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


# The DiT of configs/diffusion/flow_dit_tiny_shapes16.yaml (time_freq_shift 1: diffusers' step features).
FLOW_DIT = dict(
    size="S", patch_size=2, image_size=16, in_channels=3, num_classes=6, depth=4, hidden_size=128, num_heads=4
)
GUIDANCE, NULL = 2.0, FLOW_DIT["num_classes"]


def flow_pair():
    """(zoo DiffusionModule with FlowMatching, diffusers DiTTransformer2DModel) computing the same function."""
    torch.manual_seed(0)
    c = FLOW_DIT
    peer = diffusers.DiTTransformer2DModel(
        num_attention_heads=c["num_heads"],
        attention_head_dim=c["hidden_size"] // c["num_heads"],
        in_channels=c["in_channels"],
        out_channels=c["in_channels"],
        num_layers=c["depth"],
        sample_size=c["image_size"],
        patch_size=c["patch_size"],
        num_embeds_ada_norm=c["num_classes"],
        norm_eps=1e-6,  # DiT's
    )
    with torch.no_grad():  # diffusers zero-inits the adaLN and output layers: make every path compute something
        for p in peer.parameters():
            p.add_(0.02 * torch.randn_like(p))
        first = peer.transformer_blocks[0].norm1.emb  # one embedder in every block, as a converted DiT has
        for block in peer.transformer_blocks[1:]:
            block.norm1.emb.load_state_dict(first.state_dict())
    net = DiT(**c, learn_sigma=False, time_freq_shift=1)
    net.load_state_dict(from_diffusers(peer.state_dict()))
    zoo = DiffusionModule(
        net,
        objective=FlowMatching("logit_normal"),
        sampler=partial(FlowEulerSampler, steps=16),
        ema_decay=None,
        clip_denoised=None,
        guidance_scale=GUIDANCE,
    )
    return zoo, peer


def flow_train_row(args) -> list:
    from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3

    zoo, peer = flow_pair()
    zoo.train(), peer.train()
    b = args.flow_batch
    g = torch.Generator().manual_seed(0)
    x0, y = torch.rand(b, 3, 16, 16, generator=g) * 2 - 1, torch.randint(0, NULL, (b,), generator=g)
    zoo_opt = AdamWCosine(lr=1e-4).configure(zoo.net, None)["optimizer"]
    peer_opt = torch.optim.AdamW(peer.parameters(), lr=1e-4)
    sched = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)

    def get_sigmas(timesteps, n_dim=4):  # train_dreambooth_sd3.py's
        step_indices = [(sched.timesteps == t).nonzero().item() for t in timesteps]
        sigma = sched.sigmas[step_indices].flatten()
        while len(sigma.shape) < n_dim:
            sigma = sigma.unsqueeze(-1)
        return sigma

    def ours():
        drop = torch.rand(b) < zoo.hparams.label_dropout  # the module's training_step, without its logging
        loss = zoo._loss((x0, torch.where(drop, NULL, y)))["loss"]
        zoo_opt.zero_grad(set_to_none=True)
        loss.backward()
        zoo_opt.step()

    def theirs():  # train_dreambooth_sd3.py's step, weighting_scheme logit_normal (its default), no preconditioning
        noise = torch.randn_like(x0)
        u = compute_density_for_timestep_sampling("logit_normal", b, logit_mean=0.0, logit_std=1.0, mode_scale=1.29)
        indices = (u * sched.config.num_train_timesteps).long()
        timesteps = sched.timesteps[indices]
        sigmas = get_sigmas(timesteps, n_dim=x0.ndim)
        noisy = (1.0 - sigmas) * x0 + sigmas * noise
        pred = peer(noisy, timestep=timesteps, class_labels=y).sample
        weighting = compute_loss_weighting_for_sd3("logit_normal", sigmas)
        target = noise - x0
        loss = torch.mean((weighting.float() * (pred.float() - target.float()) ** 2).reshape(b, -1), 1).mean()
        peer_opt.zero_grad(set_to_none=True)
        loss.backward()
        peer_opt.step()

    times = alternate({"zoo": ours, "peer": theirs}, args.rounds)
    return [ratio_row(f"DiT flow train step (16 px, 4x128), B{b}, fp32", times, "zoo", "peer", 0.9)]


def euler_row(args) -> list:
    zoo, peer = flow_pair()
    zoo.eval(), peer.eval()
    sched = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)
    n = args.sample_batch

    @torch.inference_mode()
    def theirs():  # DiTPipeline's guidance around the flow scheduler's loop
        x = torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        y = torch.arange(n) % NULL
        y_in = torch.cat([y, torch.full_like(y, NULL)])
        sched.set_timesteps(16)
        for t in sched.timesteps:
            out = peer(torch.cat([x, x]), timestep=t.expand(2 * n), class_labels=y_in).sample
            cond, uncond = out.chunk(2)
            x = sched.step(uncond + GUIDANCE * (cond - uncond), t, x).prev_sample
        return x

    @torch.inference_mode()
    def ours():
        return zoo.sample(n)  # its sampler: FlowEulerSampler, 16 steps

    torch.testing.assert_close(ours(), theirs().clamp(-1, 1), atol=1e-4, rtol=1e-4)  # the same work on both sides
    times = alternate({"zoo": ours, "peer": theirs}, max(2, args.rounds // 2))
    return [ratio_row(f"DiT flow Euler-16 sampling, batch {n}, guidance {GUIDANCE}, fp32", times, "zoo", "peer", 0.9)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    add_clock_arg(ap)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", default="unet,ddim,dit,flow,euler")
    ap.add_argument("--unet-batch", type=int, default=8)
    ap.add_argument("--dit-batch", type=int, default=2)
    ap.add_argument("--sample-batch", type=int, default=8)
    ap.add_argument("--flow-batch", type=int, default=32)
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
    if diffusers is not None and "flow" in args.rows:
        rows += flow_train_row(args)
    if diffusers is not None and "euler" in args.rows:
        rows += euler_row(args)
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
