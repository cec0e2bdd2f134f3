"""Shapes diffusion race: diffusers' ``train_unconditional.py`` recipe against the zoo's race preset, CPU time to a
classifier Fréchet distance.

The peer is a script, not a package, so its training loop is re-implemented here with the installed diffusers
(``UNet2DModel``, ``DDPMScheduler``, ``EMAModel``, ``get_scheduler``) from its published source
(huggingface/diffusers, ``examples/unconditional_image_generation/train_unconditional.py`` and its README's
commands); every setting, and where it comes from, is in ``PEER``:

    UNet2DModel   layers_per_block 2, block_out_channels (128, 128, 256, 256, 512, 512), down blocks
                  4 x DownBlock2D, AttnDownBlock2D, DownBlock2D; up blocks UpBlock2D, AttnUpBlock2D, 4 x UpBlock2D
                  (attention at the second-lowest resolution), in/out channels 3, the library's other defaults
                  (GroupNorm of 32 groups, no dropout); sample_size = --resolution (``model = UNet2DModel(...)``)
    noise         DDPMScheduler(num_train_timesteps=1000, beta_schedule "linear" (1e-4 to 0.02), prediction_type
                  "epsilon")                          (--ddpm_num_steps, --ddpm_beta_schedule, --prediction_type)
    loss          F.mse_loss(model(noisy, t).sample, noise), t ~ U{0..999}, noise ~ N(0, I) (the training loop)
    optimizer     AdamW lr 1e-4, betas (0.95, 0.999), weight decay 1e-6 on every parameter, eps 1e-8
                  (--learning_rate, --adam_beta1/2, --adam_weight_decay, --adam_epsilon)
    schedule      get_scheduler("cosine", num_warmup_steps=500, num_training_steps = the run's optimizer steps),
                  stepped per optimizer step       (--lr_scheduler, --lr_warmup_steps; len(loader) x num_epochs)
    clipping      the gradients' global norm to 1.0 (accelerator.clip_grad_norm_(model.parameters(), 1.0))
    EMA           EMAModel(decay=0.9999, use_ema_warmup=True, inv_gamma=1.0, power=3/4): decay at update k
                  1 - (1 + (k - 1))^-3/4, capped at 0.9999; stepped after every optimizer step; evaluation samples
                  the EMA weights (store, copy_to, restore)  (--use_ema, --ema_inv_gamma, --ema_power,
                  --ema_max_decay)
    batch         16                                  (--train_batch_size; README's commands)
    data          Resize and CenterCrop to --resolution (32 here: the shapes' own size, so both are identities),
                  RandomHorizontalFlip, ToTensor, Normalize([0.5], [0.5]): images in [-1, 1], shuffled each epoch
                  (--resolution, --center_crop, --random_flip as the README's commands pass them)

One departure, stated: the script's UNet (113.7M parameters, six levels of 128-512 channels) cannot reach a
Fréchet target on this 2-core CPU in any sane time: one of its training steps (batch 16, 32 px, one thread,
AdamW included) took 7.3 CPU s (455 CPU ms per image) on a loaded 2-core AMD EPYC. The race's peer is the same
recipe with the UNet's channels scaled by ``--peer-width`` (default 0.25: channels (32, 32, 64, 64, 128, 128),
7.1M parameters, 0.85 CPU s per step, 53 CPU ms per image, same machine); ``--peer-width 1`` is the script's own.
The zoo's arm, ``configs/diffusion/flow_dit_shapes_race.yaml`` (a flow-matching DiT in 4x4 patches: 8.0 CPU ms
per image on the same machine; its header says what it changes and why), is class-unconditional too: neither arm
sees the labels.

Protocol, both arms alike:
- data: the zoo's generated shapes (``datamodules.ShapesDataModule``) at 32 px, its training split of --num-train
  images rendered from seed 0 (the same images for every arm and seed); each arm reads them in its own order (the
  peer: a loader shuffled from the run's seed, as the script's; the zoo: its DataModule's epoch shuffle, from the
  data seed 0, so the same order at every run seed, whose seed moves its initial weights, times and noise).
- evaluation, one function (``Evaluation``) for both arms, on the EMA weights (the script samples its EMA model):
  N = --num-samples images from the same noise (seed 0 every time), drawn through ``DiffusionModule.sample``, the
  peer's EMA UNet wrapped as a zoo denoiser (``PeerDenoiser``) in a module whose noise schedule is built from the
  peer's ``DDPMScheduler`` config (the same betas; clip at its clip_sample_range 1.0). An eps model samples with
  the zoo's ``DDIMSampler`` (--eval-steps steps, eta 0, trailing spacing), which equals diffusers' DDIM step on the
  same schedule (tests/diffusion/test_diffusion_refs.py); a flow-matching model with ``FlowEulerSampler`` at the
  same number of net calls. The distance is ``bench.diffusion_quality.Frechet``: torchmetrics' FID over a 32 px
  shapes classifier's features (the input of its last linear layer), against the first N validation images
  (``bench.latent_quality.real_sets``).
- grid and stop: an evaluation at the first optimizer step at or past every --eval-every images (10,240: a
  multiple of batches 16 to 512, so each arm's points fall on it exactly); the first evaluation at or under the
  target is the hit, and the run stops there, or at --max-images. ``--target`` takes several distances: runs go on
  to the strictest, and a table is printed for each, read off the same curves. Each evaluation is printed as it
  happens (a peer run is an hour or more).
- time: CPU seconds of the run's process (``time.process_time``) from its first training step, evaluations taken
  out, wall seconds beside; one intra-op thread (``--threads``), each run in a fresh spawned process, runs
  alternating peer seed 0, zoo seed 0, peer seed 1, ... over --jobs workers.
- the fraction of the matmul peak: training FLOPs per image (``FlopCounterMode`` on one forward and backward of the
  arm's net on its batch: convolutions, matmuls and attention, not norms or element-wise ops) x images to the hit /
  CPU s to the hit, over a 2048^3 fp32 ``torch.mm`` on one thread, measured in the run.

Targets and budget, set by the first race (3 seeds, 2026-11-26): the peer's recipe reaches FD 90-108 after 40,960
images (1,932-2,163 CPU s; its cosine spans them, as the script's spans its epochs), so the race is run to two targets
from the same curves: 150, which every run of both arms reaches, and 40, which the zoo's preset reaches and the
peer's recipe does not within its budget. The zoo preset was raced as it was chosen (from the README's flow-vs-eps
figures and step costs), not tuned by races.

    python bench/race_diffusion.py --classifier <32 px convnet_shapes ckpt> --jobs 2
    python bench/race_diffusion.py --seeds 0 --arms zoo --zoo-args --model.init_args.optimizer.lr=2e-3
    python bench/race_diffusion.py --seeds 0 --num-train 256 --eval-every 64 --max-images 64 --num-samples 16 \
        --eval-steps 2 --classifier <ckpt>                                   # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ and the zoo's packages, run as a script or loaded by path
from bench._common import QUIET_FIT, Clock, matmul_peak, race_process, race_runs, race_summary  # noqa: E402
from bench.race_cnn import Grid  # noqa: E402

TARGET = 40.0  # where the zoo's preset gets; the peer's recipe does not within MAX_IMAGES
TARGETS = (TARGET, 150.0)  # 150: every run of both arms gets there (the first race, 3 seeds)
EVAL_EVERY = 10_240  # images: 640 peer steps of 16, 320 of 32, 160 of 64
MAX_IMAGES = 40_960  # 4 evaluations: ~2,150 CPU s of the peer's recipe, its cosine spanning them
NUM_TRAIN, IMAGE_SIZE = 10_000, 32  # ShapesDataModule's default training split, at 32 px
NUM_SAMPLES, EVAL_STEPS = 256, 50
PEER_WIDTH = 0.25
ZOO_CONFIG = "configs/diffusion/flow_dit_shapes_race.yaml"

PEER = {  # diffusers examples/unconditional_image_generation/train_unconditional.py
    "layers_per_block": 2,  # UNet2DModel(layers_per_block=2, ...)
    "block_out_channels": (128, 128, 256, 256, 512, 512),
    "down_block_types": ("DownBlock2D",) * 4 + ("AttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "AttnUpBlock2D") + ("UpBlock2D",) * 4,
    "ddpm_num_steps": 1000,  # --ddpm_num_steps
    "ddpm_beta_schedule": "linear",  # --ddpm_beta_schedule
    "prediction_type": "epsilon",  # --prediction_type
    "train_batch_size": 16,  # --train_batch_size
    "learning_rate": 1e-4,  # --learning_rate
    "lr_scheduler": "cosine",  # --lr_scheduler
    "lr_warmup_steps": 500,  # --lr_warmup_steps
    "adam_beta1": 0.95,  # --adam_beta1
    "adam_beta2": 0.999,  # --adam_beta2
    "adam_weight_decay": 1e-6,  # --adam_weight_decay
    "adam_epsilon": 1e-8,  # --adam_epsilon
    "max_grad_norm": 1.0,  # accelerator.clip_grad_norm_(model.parameters(), 1.0)
    "use_ema": True,  # --use_ema (README's commands)
    "ema_inv_gamma": 1.0,  # --ema_inv_gamma
    "ema_power": 3 / 4,  # --ema_power
    "ema_max_decay": 0.9999,  # --ema_max_decay
    "random_flip": True,  # --random_flip (README's commands; RandomHorizontalFlip in the older script)
    "normalize": ([0.5], [0.5]),  # transforms.Normalize([0.5], [0.5])
}


def peer_recipe(width: float) -> str:
    return f"UNet2DModel x{width:g} ({', '.join(map(str, peer_channels(width)))}), AdamW 1e-4, cosine, batch 16"


# -- the peer ------------------------------------------------------------------------------------------------


def peer_channels(width: float) -> tuple[int, ...]:
    channels = tuple(round(c * width) for c in PEER["block_out_channels"])
    if width <= 0 or any(c % 32 for c in channels):  # GroupNorm's 32 groups (the library's default) divide them
        raise SystemExit(
            f"error: --peer-width {width} gives channels {channels}, not all multiples of 32 (UNet2DModel's 32 norm "
            "groups): use 0.25, 0.5, 0.75 or 1 (the script's own)"
        )
    return channels


def peer_unet(width: float = PEER_WIDTH, image_size: int = IMAGE_SIZE):
    """The script's ``UNet2DModel``, its channels scaled by ``width``."""
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=image_size,
        in_channels=3,
        out_channels=3,
        layers_per_block=PEER["layers_per_block"],
        block_out_channels=peer_channels(width),
        down_block_types=PEER["down_block_types"],
        up_block_types=PEER["up_block_types"],
    )


class PeerDenoiser(nn.Module):
    """A ``UNet2DModel`` as the zoo's samplers call a denoiser: (x_t, t, y) -> eps, unconditional."""

    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.unet = unet
        self.in_channels, self.image_size, self.num_classes = unet.config.in_channels, unet.config.sample_size, 0

    def forward(self, x: Tensor, t: Tensor, y: Tensor | None = None) -> Tensor:
        return self.unet(x, t).sample


class Peer:
    """The script's model, noise scheduler, optimizer, LR schedule and EMA, and one step of its training loop."""

    def __init__(self, seed: int, width: float, total_steps: int, image_size: int = IMAGE_SIZE) -> None:
        from diffusers import DDPMScheduler
        from diffusers.optimization import get_scheduler
        from diffusers.training_utils import EMAModel

        torch.manual_seed(seed)
        self.model = peer_unet(width, image_size)
        self.noise_scheduler = DDPMScheduler(
            num_train_timesteps=PEER["ddpm_num_steps"],
            beta_schedule=PEER["ddpm_beta_schedule"],
            prediction_type=PEER["prediction_type"],
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=PEER["learning_rate"],
            betas=(PEER["adam_beta1"], PEER["adam_beta2"]),
            weight_decay=PEER["adam_weight_decay"],
            eps=PEER["adam_epsilon"],
        )
        self.lr_scheduler = get_scheduler(
            PEER["lr_scheduler"],
            optimizer=self.optimizer,
            num_warmup_steps=PEER["lr_warmup_steps"],
            num_training_steps=total_steps,
        )
        self.ema = EMAModel(
            self.model.parameters(),
            decay=PEER["ema_max_decay"],
            use_ema_warmup=True,
            inv_gamma=PEER["ema_inv_gamma"],
            power=PEER["ema_power"],
        )

    def step(self, clean_images: Tensor) -> float:
        """One iteration of the script's loop (gradient accumulation 1, no mixed precision)."""
        self.model.train()
        noise = torch.randn(clean_images.shape)
        bsz = clean_images.shape[0]
        timesteps = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (bsz,)).long()
        noisy_images = self.noise_scheduler.add_noise(clean_images, noise, timesteps)
        noise_pred = self.model(noisy_images, timesteps).sample
        loss = F.mse_loss(noise_pred.float(), noise.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), PEER["max_grad_norm"])
        self.optimizer.step()
        self.lr_scheduler.step()
        if PEER["use_ema"]:
            self.ema.step(self.model.parameters())
        self.optimizer.zero_grad()
        return loss.item()

    def module(self):
        """The model as a zoo ``DiffusionModule`` on the peer's own noise schedule, for ``Evaluation``."""
        from zoo.diffusion import DiffusionModule, GaussianDiffusion

        cfg = self.noise_scheduler.config
        return DiffusionModule(
            PeerDenoiser(self.model),
            GaussianDiffusion(
                num_timesteps=cfg.num_train_timesteps,
                beta_schedule=cfg.beta_schedule,
                beta_start=cfg.beta_start,
                beta_end=cfg.beta_end,
                prediction={"epsilon": "eps", "v_prediction": "v", "sample": "x0"}[cfg.prediction_type],
            ),
            clip_denoised=cfg.clip_sample_range if cfg.clip_sample else None,
            ema_decay=None,
        )

    def evaluate(self, evaluation: Evaluation) -> float:
        """The evaluation on the EMA weights, as the script samples them (store, copy_to, restore)."""
        params = list(self.model.parameters())
        self.ema.store(params)
        self.ema.copy_to(params)
        try:
            return evaluation(self.module())
        finally:
            self.ema.restore(params)


# -- what both arms share -----------------------------------------------------------------------------------


class Evaluation:
    """The one evaluation of both arms: the Fréchet distance of ``num_samples`` images that ``module.sample`` draws
    from the same noise (seed 0), with DDIM (eps) or Euler (flow) at ``steps`` net calls."""

    def __init__(self, frechet: Callable[[Tensor], float], num_samples: int, steps: int, batch: int = 128) -> None:
        self.frechet, self.num_samples, self.steps, self.batch = frechet, num_samples, steps, batch

    def sampler(self, module):
        from zoo.diffusion import DDIMSampler, FlowEulerSampler, FlowMatching

        flow = isinstance(module.objective, FlowMatching)
        return partial(FlowEulerSampler if flow else DDIMSampler, steps=self.steps)

    def images(self, module) -> Tensor:
        from callbacks.frechet import generated_images

        batches = generated_images(module, self.num_samples, self.batch, self.sampler(module), None, seed=0)
        return torch.cat(list(batches))

    def __call__(self, module) -> float:
        return self.frechet(self.images(module))


def frechet_to_shapes(classifier: str, num_samples: int) -> Callable[[Tensor], float]:
    """The classifier Fréchet distance to the first ``num_samples`` 32 px validation shapes."""
    from bench.diffusion_quality import Frechet
    from bench.latent_quality import real_sets

    return Frechet(classifier, real_sets(num_samples)[0])


class Race:
    """One run's bookkeeping: images seen, evaluations on the grid, the hit (the first FD at or under the target)."""

    def __init__(self, every: int, target: float, max_images: int, label: str = "") -> None:
        self.target, self.max_images, self.label = target, max_images, label
        self.grid, self.clock, self.seen = Grid(every), Clock(), 0
        self.evals: list[tuple[int, float, float, float]] = []  # (images, FD, CPU s and wall s of training so far)

    @property
    def hit(self) -> dict | None:
        return hit_at(self.evals, self.target)

    def step(self, batch_size: int, evaluate: Callable[[], float]) -> bool:
        """Count a finished optimizer step; evaluate when due; True once the run is over (hit or budget spent)."""
        self.seen += batch_size
        if self.grid.due(self.seen):
            self.clock.pause()
            fd = evaluate()
            cpu_s, wall_s = self.clock.now()
            self.evals.append((self.seen, fd, cpu_s, wall_s))
            if self.label:  # a peer run is an hour or more: its curve as it goes, not only at its end
                print(f"  ({self.label}: FD {fd:.1f} after {self.seen} images, {cpu_s:.0f} CPU s)", flush=True)
            self.clock.resume()
        return self.hit is not None or self.seen >= self.max_images

    def result(self, flops_per_image: float, what: str) -> dict:
        return {"hit": self.hit, "evals": self.evals, "flops": flops_per_image, "what": what}


def hit_at(evals: list[tuple[int, float, float, float]], target: float) -> dict | None:
    """The first evaluation at or under ``target``. A run goes on until its strictest target, so every looser one
    is read off the same curve."""
    for images, fd, cpu_s, wall_s in evals:
        if fd <= target:
            return {"images": images, "cpu_s": cpu_s, "wall_s": wall_s, "fd": fd}
    return None


def train_flops_per_image(loss: Callable[[], Tensor], n: int) -> float:
    """FLOPs of ``loss().backward()`` (one forward and backward of a copy of an arm's net on its batch), per image."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss().backward()
    return counter.get_total_flops() / n


def shapes(num_train: int):
    """The race's training images: the 32 px shapes' training split rendered from seed 0, in [-1, 1]."""
    from datamodules import ShapesDataModule

    dm = ShapesDataModule(image_size=IMAGE_SIZE, num_train=num_train, num_val=0, num_test=0, seed=0)
    dm.setup("fit")
    return dm.train_set


# -- the two arms -------------------------------------------------------------------------------------------


def peer_run(
    seed: int,
    evaluation: Evaluation,
    every: int = EVAL_EVERY,
    target: float = TARGET,
    max_images: int = MAX_IMAGES,
    num_train: int = NUM_TRAIN,
    width: float = PEER_WIDTH,
    label: str = "",
) -> dict:
    from datamodules.tensor_dataset import TensorImageDataset

    train = shapes(num_train)
    data = TensorImageDataset(train.images, train.labels, hflip=PEER["random_flip"])  # the flip: per image, p 0.5
    batch = PEER["train_batch_size"]
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=TensorImageDataset.collate_batch,
    )
    peer = Peer(seed, width, total_steps=math.ceil(max_images / batch))  # the schedule spans the run, as the script's
    x = next(iter(loader))[0]
    net, t, noise = copy.deepcopy(peer.model), torch.randint(0, 1000, (len(x),)), torch.randn_like(x)
    flops = train_flops_per_image(lambda: F.mse_loss(net(x, t).sample, noise), len(x))
    race = Race(every, target, max_images, label)
    race.clock.start()
    while True:
        for clean_images, _ in loader:  # labels unused: the script is class-unconditional
            peer.step(clean_images)
            if race.step(len(clean_images), lambda: peer.evaluate(evaluation)):
                return race.result(flops, peer_recipe(width))


def zoo_run(
    seed: int,
    evaluation: Evaluation,
    every: int = EVAL_EVERY,
    target: float = TARGET,
    max_images: int = MAX_IMAGES,
    num_train: int = NUM_TRAIN,
    config: str = ZOO_CONFIG,
    extra: tuple[str, ...] = (),
    label: str = "",
) -> dict:
    from lightning.pytorch import Callback

    from cli import main
    from zoo.diffusion.ema import EMA

    holder: dict = {}

    class Evaluations(Callback):
        def __init__(self, ema: EMA | None) -> None:
            self.ema = ema

        def on_train_start(self, trainer, pl_module) -> None:
            x = trainer.datamodule.images.train_set.__getitems__(list(range(trainer.datamodule.images.batch_size)))[0]
            net, t, noise = copy.deepcopy(pl_module.net), torch.rand(len(x)) * 1000, torch.randn_like(x)
            holder["flops"] = train_flops_per_image(lambda: F.mse_loss(net(x, t, None), noise), len(x))
            holder["race"] = Race(every, target, max_images, label)
            holder["race"].clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if holder["race"].step(len(batch[0]), lambda: self.evaluate(trainer, pl_module)):
                trainer.should_stop = True

        def evaluate(self, trainer, pl_module) -> float:
            if self.ema is None:
                return evaluation(pl_module)
            self.ema.on_validation_epoch_start(trainer, pl_module)  # the EMA weights in, as for validation
            try:
                return evaluation(pl_module)
            finally:
                self.ema.on_validation_epoch_end(trainer, pl_module)

    images = "--data.init_args.images.init_args"
    args = [
        "--config",
        str(ROOT / config),
        f"--seed_everything={seed}",
        f"{images}.image_size={IMAGE_SIZE}",
        f"{images}.num_train={num_train}",
        f"{images}.seed=0",  # the same images as the peer's (the seed renders them)
        *QUIET_FIT,
        *extra,
    ]
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI would read this script's own arguments too
    try:
        cli = main(args, run=False)
    finally:
        sys.argv = argv
    h = cli.model.hparams
    # The module's own EMA, added here ahead of the evaluations (the module would add it after them) so that each
    # evaluation sees the average of the step just taken; the module then adds none.
    ema = EMA(decay=h.ema_decay, start_step=h.ema_start_step) if h.ema_decay else None
    cli.trainer.callbacks.extend([c for c in (ema, Evaluations(ema)) if c is not None])
    cli.trainer.fit(cli.model, cli.datamodule)
    what = f"{Path(config).name}{' ' + ' '.join(extra) if extra else ''}"
    return holder["race"].result(holder["flops"], what)


# -- the race -----------------------------------------------------------------------------------------------


def _one(job: tuple) -> tuple[str, int, dict]:
    arm, seed, s = job
    race_process(s["threads"])
    sys.path.insert(0, str(ROOT))
    evaluation = Evaluation(frechet_to_shapes(s["classifier"], s["num_samples"]), s["num_samples"], s["eval_steps"])
    race = dict(every=s["every"], target=min(s["targets"]), max_images=s["max_images"], num_train=s["num_train"])
    race["label"] = f"{arm} seed {seed}"
    if arm == "peer":
        r = peer_run(seed, evaluation, width=s["peer_width"], **race)
    else:
        r = zoo_run(seed, evaluation, config=s["config"], extra=s["extra"], **race)
    r["threads"] = torch.get_num_threads()  # what training ran with, read after it
    return arm, seed, r


def classifier_checkpoint(given: str | None, out: Path) -> str:
    """``given``, or configs/cnn/convnet_shapes.yaml trained once (32 px, its 2 epochs) through cli.py."""
    if given:
        return given
    from bench.latent_quality import train

    path, seconds = train("classifier", 0, out)
    print(f"trained the 32 px shapes classifier in {seconds / 60:.1f} min: {path}", flush=True)
    return str(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=["peer", "zoo"], default=["peer", "zoo"])
    p.add_argument(
        "--target",
        type=float,
        nargs="+",
        default=list(TARGETS),
        help="classifier FD(s) to reach; runs go on to the least",
    )
    p.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="training images between evaluations")
    p.add_argument("--max-images", type=int, default=MAX_IMAGES, help="a run that has not hit stops here")
    p.add_argument("--num-train", type=int, default=NUM_TRAIN, help="training images rendered (seed 0)")
    p.add_argument("--num-samples", type=int, default=NUM_SAMPLES, help="N generated and real images per FD")
    p.add_argument("--eval-steps", type=int, default=EVAL_STEPS, help="net calls per sample (DDIM or Euler)")
    p.add_argument("--classifier", help="a ClassifierModule checkpoint on the 32 px shapes (else trained first)")
    p.add_argument("--peer-width", type=float, default=PEER_WIDTH, help="the peer UNet's channels x this (1: full)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every run (both arms)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, each in its own process")
    p.add_argument("--config", default=ZOO_CONFIG, help="the zoo arm's config")
    p.add_argument("--zoo-args", nargs=argparse.REMAINDER, default=[], help="more cli.py arguments (last)")
    args = p.parse_args(argv)
    peer_channels(args.peer_width)
    if not 2 <= args.num_samples <= 512:
        raise SystemExit(f"error: --num-samples {args.num_samples} must be in [2, 512] (the validation images)")
    if min(args.eval_every, args.max_images, args.num_train, args.eval_steps) < 1:
        raise SystemExit("error: --eval-every, --max-images, --num-train and --eval-steps must be >= 1")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from bench._common import cpu_model, print_header

    torch.set_num_threads(args.threads)
    targets = sorted(set(args.target))
    print_header(f"Shapes diffusion race: CPU time to classifier FD <= {min(targets):g}", torch.device("cpu"))
    peak = matmul_peak()
    cpu = cpu_model().split(";")[0]
    print(f"{cpu}; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s per CPU second ({args.threads} thread(s), 2048^3 mm)")
    with tempfile.TemporaryDirectory(prefix="race_diffusion_") as tmp:
        classifier = classifier_checkpoint(args.classifier, Path(tmp))
        print(
            f"peer: diffusers train_unconditional.py ({peer_recipe(args.peer_width)}); "
            f"zoo: {args.config} {' '.join(args.zoo_args)}\n"
            f"{args.num_train} training images of 32 px shapes; every {args.eval_every} images: FD of "
            f"{args.num_samples} EMA samples ({args.eval_steps} net calls, seed 0) to as many validation images in "
            f"{classifier}'s features; runs (arm, seed, ...) as they end:",
            flush=True,
        )
        settings = {
            "classifier": classifier,
            "num_samples": args.num_samples,
            "eval_steps": args.eval_steps,
            "every": args.eval_every,
            "targets": targets,
            "max_images": args.max_images,
            "num_train": args.num_train,
            "threads": args.threads,
            "peer_width": args.peer_width,
            "config": args.config,
            "extra": tuple(args.zoo_args),
        }
        jobs = [(arm, seed, settings) for seed in args.seeds for arm in args.arms]
        results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
        for arm, seed, r in race_runs(_one, jobs, args.jobs):
            results[arm].append(r)
            h = r["hit"]
            at = f"{h['images']:7d} {h['cpu_s']:7.1f} {h['wall_s']:7.1f}" if h else f"{'never':>7s} {'-':>7s} -"
            evals = ", ".join(f"{n / 1000:g}k {fd:.1f} ({s:.0f} s)" for n, fd, s, _ in r["evals"])
            print(
                f"  {arm:4s} seed {seed}: hit at {at} (images, CPU s, wall s); {r['flops'] / 1e6:.0f} MFLOP/image "
                f"trained; {r['threads']} thread(s); FD at images (CPU s) {evals}",
                flush=True,
            )
    for target in targets:  # each table from the same runs' curves
        at = {arm: [{**r, "hit": hit_at(r["evals"], target)} for r in rs] for arm, rs in results.items()}
        print("\n" + race_summary(at, "image", f"FD <= {target:g}", peak, ".0f"))
    print(f"median [min, max] over the seeds; {cpu}, {args.threads} thread(s)")


if __name__ == "__main__":
    main()
