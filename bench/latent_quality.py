"""Latent diffusion on the 32 px shapes: how close the latent flow DiT's decoded samples come to the data, beside
what its autoencoder alone can reach.

One command trains (or takes as checkpoints) the three stages with their configs as they are, through cli.py's
parser, and measures classifier Fréchet distances at N = --num-samples against the first N validation images:
  classifier   configs/cnn/convnet_shapes.yaml (32 px; the last layer's input gives the features, as
               ``callbacks.FrechetDistance`` uses it)
  autoencoder  configs/diffusion/autoencoder_shapes.yaml (AutoencoderKL, f = 4: 32x32x3 -> 8x8x4)
  latent       configs/diffusion/latent_flow_dit_shapes.yaml on that autoencoder's weights (flow-matching DiT on
               the scaled latents, encoded on the fly; samples decoded)
Rows: the floor (validation against test images: two real sets of N), the autoencoder's reconstructions of the N
validation images (posterior mean, decoded: no latent model can beat its decoder by much), the trained latent DiT
and its pixel-space twin (``PIXEL``: the same config and DiT body on the 32x32 images in 4x4 patches, no
autoencoder), each sampled with Euler at --steps, classes in turn (the Fréchet callback's draw), the first row at
every sampling seed.

    python bench/latent_quality.py                                # trains all three: ~30 CPU-min on 1 thread
    python bench/latent_quality.py --classifier c.ckpt --autoencoder a.ckpt --latent l.ckpt
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cli.py, callbacks/, datamodules/ live at the root

import torch

from bench._common import cpu_model, table
from bench.diffusion_quality import Frechet, fit
from zoo.diffusion import DiffusionModule, FlowEulerSampler

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "classifier": "configs/cnn/convnet_shapes.yaml",
    "autoencoder": "configs/diffusion/autoencoder_shapes.yaml",
    "latent": "configs/diffusion/latent_flow_dit_shapes.yaml",
    "pixel": "configs/diffusion/latent_flow_dit_shapes.yaml",  # with PIXEL: the same DiT on the images themselves
}
# The latent config's DiT body, objective, optimizer, EMA and steps on the 32x32 pixels: 4x4 patches (64 tokens
# against the latents' 16), 3 channels, no autoencoder, the pixel models' clip of the predicted image.
PIXEL = [
    "--model.init_args.autoencoder=null",
    "--model.init_args.latent_scale=config",
    "--model.init_args.clip_denoised=1.0",
    "--model.init_args.net.init_args.image_size=32",
    "--model.init_args.net.init_args.in_channels=3",
    "--model.init_args.net.init_args.patch_size=4",
]
IMAGE_SIZE, NUM_VAL = 32, 512


def train(name: str, seed: int, out: Path, extra: list[str] = ()) -> tuple[Path, float]:
    """Fits ``name``'s config as it is (its own length) through cli.py's parser; returns the checkpoint (EMA weights
    for the latent model) and the seconds of fit."""
    return fit(["--config", str(ROOT / CONFIGS[name]), f"--seed_everything={seed}", *extra], out / f"{name}.ckpt")


def real_sets(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n validation and test images of the configs' 32 px shapes, in [-1, 1]."""
    from datamodules import ShapesDataModule

    dm = ShapesDataModule(image_size=IMAGE_SIZE, num_train=1, num_val=NUM_VAL, num_test=NUM_VAL, seed=seed)
    dm.setup()
    return tuple(dm.shapes[split].images[:n] * 2 - 1 for split in ("val", "test"))


@torch.no_grad()
def reconstructions(module: DiffusionModule, images: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """The autoencoder's decoded posterior means of ``images``: its own ceiling, without any diffusion."""
    ae = module.autoencoder
    out = [ae.decode(ae.encode(x).latent_dist.mean).sample.clamp(-1, 1) for x in images.split(batch)]
    return torch.cat(out)


def sample(module: DiffusionModule, n: int, batch: int, steps: int, seed: int) -> tuple[torch.Tensor, float]:
    """n images as the Fréchet callback draws them (batch i: seed + i, classes in turn); (images, seconds)."""
    from callbacks.frechet import generated_images

    t0 = time.perf_counter()
    sampler = partial(FlowEulerSampler, steps=steps)
    images = torch.cat(list(generated_images(module, n, batch, sampler, None, seed)))
    return images, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classifier", help="a ClassifierModule checkpoint on the 32 px shapes (else trained)")
    ap.add_argument("--autoencoder", help="an AutoencoderModule checkpoint of autoencoder_shapes (else trained)")
    ap.add_argument("--latent", help="a DiffusionModule checkpoint of latent_flow_dit_shapes (else trained)")
    ap.add_argument("--pixel", help="a DiffusionModule checkpoint of the pixel-space twin (else trained)")
    ap.add_argument("--no-pixel", action="store_true", help="leave out the pixel-space twin")
    ap.add_argument("--out", help="folder of the trained checkpoints (default: a temporary folder)")
    ap.add_argument("--seed", type=int, default=0, help="training seed of every stage")
    ap.add_argument("--steps", default="16,8,32", help="Euler steps per row; the first is sampled at every seed")
    ap.add_argument("--num-samples", type=int, default=256)
    ap.add_argument("--sample-batch", type=int, default=128)
    ap.add_argument("--sample-seeds", default="0,1")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.num_samples > NUM_VAL:
        raise SystemExit(f"error: --num-samples {args.num_samples} exceeds the {NUM_VAL} validation images rendered")
    torch.set_num_threads(args.threads)
    steps = [int(s) for s in args.steps.split(",")]
    seeds = [int(s) for s in args.sample_seeds.split(",")]
    print(f"== latent diffusion quality: {cpu_model()}, {args.threads} thread(s), torch {torch.__version__}")

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        paths = {}
        stages = ("classifier", "autoencoder", "latent") + (() if args.no_pixel else ("pixel",))
        for name in stages:
            given = getattr(args, name)
            if given:
                paths[name] = Path(given)
                continue
            extra = {"latent": [f"--model.init_args.autoencoder_weights={paths['autoencoder']}"], "pixel": PIXEL}
            paths[name], seconds = train(name, args.seed, out, extra.get(name, []))
            print(f"trained {name}: {seconds / 60:.1f} min -> {paths[name]}", flush=True)

        real, other = real_sets(args.num_samples)
        frechet = Frechet(str(paths["classifier"]), real)
        load = partial(DiffusionModule.load_from_checkpoint, map_location="cpu", weights_only=True)
        latent = load(paths["latent"]).eval()
        rows = [["real: validation vs test images (floor)", "", f"{frechet(other):.1f}", ""]]
        recon = frechet(reconstructions(latent, real))
        rows.append(["autoencoder: reconstructed validation images", "", f"{recon:.1f}", ""])
        models = {"latent DiT": latent} | ({} if args.no_pixel else {"pixel DiT": load(paths["pixel"]).eval()})
        for what, module in models.items():
            for k, n in enumerate(steps):
                fds, seconds = [], []
                for seed in seeds if k == 0 else seeds[:1]:
                    images, s = sample(module, args.num_samples, args.sample_batch, n, seed)
                    fds.append(f"{frechet(images):.1f}")
                    seconds.append(s)
                    print(f"  {what}, Euler-{n}, seed {seed}: FD {fds[-1]} ({s:.0f} s)", flush=True)
                rows.append([f"{what}, Euler-{n}", n, " / ".join(fds), f"{seconds[0]:.0f}"])  # the first seed's
    print(table(["row", "NFE", f"FD (N = {args.num_samples}; sample seeds {args.sample_seeds})", "sampling s"], rows))


if __name__ == "__main__":
    main()
