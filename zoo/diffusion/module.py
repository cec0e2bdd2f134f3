"""DiffusionModule: trains any denoiser (UNet, DiT) on the objective it holds (``zoo.diffusion.objective``: the noise
schedule's ``GaussianDiffusion`` or ``FlowMatching``); samples with the sampler it holds, built on that objective.

EMA of the weights is ``zoo.diffusion.ema.EMA`` (sharded like the weights under FSDP2), which this module adds unless
the trainer has a weight-averaging callback already: it swaps the EMA weights in for validation
(so ``val/loss`` and the logged samples are the EMA model's), writes them as the checkpoint's
``state_dict`` and the training weights under ``current_model_state``, and restores both on resume.
So ``load_from_checkpoint`` and ``predict --ckpt_path`` sample from the EMA weights.

A net with twice the input channels of output (``learn_sigma``) also learns the variance of each reverse
step, with the hybrid loss of Nichol & Dhariwal 2021 (``GaussianDiffusion``), and the samplers use it.

With an ``autoencoder`` (``diffusers.AutoencoderKL`` by class path; ``zoo.diffusion.latent``) the net is trained on
the autoencoder's scaled latents, encoded on the fly under no_grad, as DiT and latent diffusion train, and ``sample``
decodes what the sampler draws: images in [-1, 1] wherever samples go (predict, the logged grids, Frechet distances,
the registered model). The autoencoder is frozen (eval mode, no gradient, not in the optimizer nor the EMA) and its
weights, read once from ``autoencoder_weights``, travel in every checkpoint and MLflow model with the latents' scale.

Notation: B batch, C channels, H/W height/width, K classes (label K is the null class), T steps.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from zoo.adapt import Adaptation
from zoo.adapt import adapt as adapt_module
from zoo.adapt.base import drop_base, restore_base
from zoo.adapt.lora import ADAPTER_PREFIX
from zoo.compat import trainer_of
from zoo.diffusion.ema import EMA
from zoo.diffusion.latent import (
    autoencoder_sizes,
    build_autoencoder,
    configured_scale,
    decode_latents,
    load_autoencoder,
    sample_latents,
    shift_of,
    std_scale,
)
from zoo.diffusion.objective import GaussianDiffusion, Objective
from zoo.diffusion.samplers import ClassifierFreeGuidance, DDIMSampler, SamplerClass
from zoo.errors import InputError
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.io.weights import check_compatible, extract_state_dict, readable
from zoo.train.logging import lightning_writes
from zoo.train.optim import AdamWCosine
from zoo.train.parallel import shard

# Both are expected here: the EMA callback is attached at every stage so a checkpoint's callback state
# always finds its owner, and outside fit the EMA weights are already the checkpoint's state_dict.
warnings.filterwarnings("ignore", message=r".*WeightAveraging callback, but loading a checkpoint outside the 'fit'")
# A trainer's own WeightAveraging (e.g. SWA) calls configure_model early; it only shards (refused below for
# such a callback) and compiles lazily, so that is harmless.
warnings.filterwarnings("ignore", message=r".*WeightAveraging callback with a model that overrides the configure_model")


class DiffusionModule(WeightsOnlyLoading, LightningModule):
    """Trains ``net(x_t, t, y) -> eps | v | x0`` on (images in [-1, 1], labels) batches; ``sample`` draws images."""

    def __init__(
        self,
        net: nn.Module,
        objective: Objective = GaussianDiffusion(),  # noqa: B008 (each module holds its own copy: see below)
        label_dropout: float = 0.1,
        clip_denoised: float | None = 1.0,
        ema_decay: float | None = 0.9999,
        ema_start_step: int = 0,
        optimizer: AdamWCosine = AdamWCosine(lr=1e-4),
        compile: bool = False,
        init_weights: str | None = None,
        sampler: SamplerClass = DDIMSampler,
        guidance_scale: float = 1.0,
        autoencoder: dict[str, Any] | None = None,
        autoencoder_weights: str | None = None,
        latent_scale: float | Literal["config", "estimate"] = "config",
        adapt: Adaptation | None = None,
    ) -> None:
        """
        Args:
            net: the denoiser (``zoo.diffusion.UNet`` or ``DiT``) with ``in_channels``, ``image_size``, ``num_classes``.
            objective: what the net is trained on, a class with its own settings: ``zoo.diffusion.GaussianDiffusion``
                (the noise schedule: num_timesteps, beta_schedule, beta_start, beta_end, prediction eps/v/x0,
                min_snr_gamma, vlb_weight; sampled by DDIMSampler, DDPMSampler, DPMSolverPlusPlus2M) or
                ``zoo.diffusion.FlowMatching`` (the net predicts the velocity of the linear path from data to noise;
                sampled by FlowEulerSampler, FlowHeunSampler).
            label_dropout: fraction of training labels replaced by the null class, for classifier-free guidance.
            clip_denoised: clamp the predicted x0 to [-c, c] at every sampling step (1 for images in [-1, 1]); None:
            never.
            ema_decay: decay of the weights' exponential moving average (0.9999 in DiT); None: no EMA.
            ema_start_step: 0-based optimizer step of the first EMA update (the average starts as a copy of the weights
                then; before it, validation and checkpoints use the weights themselves).
            optimizer: AdamW with warmup and cosine decay (``zoo.train.optim.AdamWCosine``): lr 1e-4 in DiT, 2e-4
                in DDPM on CIFAR-10 after 5000 warmup steps; no weight decay and a constant rate in both.
            compile: run the net through ``torch.compile`` for training (weights and checkpoint keys unchanged).
            init_weights: weights to start from: a published DiT ``.pt`` (facebookresearch/DiT), a diffusers
                ``DiTTransformer2DModel`` folder (``save_pretrained``), a safetensors file of this net's keys or a zoo
                MLflow model (models:/name/version, models:/name@alias, runs:/id/model);
                loaded weights-only, before any checkpoint given by --ckpt_path is restored over them.
            sampler: how ``sample`` and predict draw images: a sampler class with its own settings
                (``zoo.diffusion.samplers``: ``DDIMSampler`` with steps, eta, spacing; ``DDPMSampler`` with variance),
                of a kind that samples the objective, built on it with clip_denoised. Not a weight:
                ``predict --ckpt_path`` takes it from the command line
                (``--model.init_args.sampler.init_args.steps=20``) over the checkpoint's.
            guidance_scale: classifier-free guidance scale s of ``sample`` and predict for class-conditional nets
                (1: the conditional net alone; Ho & Salimans 2021); an unconditional net ignores it.
            autoencoder: train on latents (latent diffusion): a frozen ``{class_path: diffusers.AutoencoderKL,
                init_args: {...}}`` (``zoo.diffusion.latent``; the extra ``latent``), or from Python the
                module itself; the net's in_channels are its latent_channels and its image_size
                the images' side / 2^(len(block_out_channels) - 1). Needs clip_denoised: null (latents are not in
                [-1, 1]). None: the net sees pixels.
            autoencoder_weights: the autoencoder's weights: a diffusers folder (``save_pretrained``, or a pipeline
                such as Stable Diffusion's, whose ``vae/`` is read), a .safetensors/.pt file of its keys, or a zoo
                checkpoint holding one; read weights-only when the run sets up, never again from a checkpoint (which
                holds them). None: the autoencoder's initial (random) weights.
            latent_scale: s of the latents z = s (E(x) - b): "config" (the autoencoder's scaling_factor, 0.18215 for
                Stable Diffusion's VAE, and its shift_factor b), a number, or "estimate" (1 / std of the first
                batch's latents, as latent diffusion does for a new autoencoder); stored in checkpoints.
            adapt: what a fine-tune of ``init_weights`` trains (``zoo.adapt.Adaptation``): LoRA adapters on some layers
                of the net (``lora: {r: 8, alpha: 16}``: every linear and conv layer but the image's way in and out,
                which ``io_layers()`` name) and the parameters named by ``trainable`` globs (``["net.blocks.*"]``);
                None: every weight. The EMA averages what trains (the adapters) and sampling uses the adapted net; the
                autoencoder stays frozen and is never adapted.
        """
        super().__init__()
        save_hparams(self, "net", "sampler", "objective", "autoencoder")
        self.net = net
        if isinstance(autoencoder, Mapping):  # a config: built here (see zoo.diffusion.latent for why)
            autoencoder = build_autoencoder(autoencoder)
        self.autoencoder = self._frozen_autoencoder(autoencoder, latent_scale, clip_denoised)
        self.num_classes = getattr(net, "num_classes", 0) or 0
        # A copy: the default instance is shared by every module built without one, and a noise schedule's tensors
        # follow the device of the data they meet.
        self.objective = objective = copy.deepcopy(objective)  # recorded by its config() (zoo.io.hparams)
        self.sampler, self.guidance_scale = sampler, guidance_scale
        # Built once here, however it was given (a class, a partial, the CLI's): a sampler of the wrong kind or with
        # settings the schedule refuses says so now, not at the first sample; its settings are what serving offers.
        self.default_sampler = objective.sampler(sampler, clip_denoised)
        self._compiled = None  # built at the first training step; kept off the module tree (no "_orig_mod." keys)
        self._init_loaded = self._autoencoder_loaded = False

    def _frozen_autoencoder(
        self, autoencoder: nn.Module | None, latent_scale: float | str, clip_denoised: float | None
    ) -> nn.Module | None:
        """The autoencoder frozen, its sizes checked against the net's, and the latents' scale as a buffer (NaN until
        estimated), so that checkpoints carry it."""
        if autoencoder is None:
            if latent_scale != "config":
                raise InputError(
                    f"latent_scale={latent_scale!r} scales an autoencoder's latents: give model.init_args.autoencoder"
                )
            return None
        _, z, f = autoencoder_sizes(autoencoder)
        if self.net.in_channels != z:
            raise InputError(
                f"the net takes {self.net.in_channels} input channels but the autoencoder's latents have {z}: set "
                f"net.init_args.in_channels={z} (image_size: the images' side / {f})"
            )
        if clip_denoised is not None:
            raise InputError(
                f"clip_denoised={clip_denoised} clamps the predicted x0 to the pixels' range, and latents are not in "
                "it: set model.init_args.clip_denoised=null for a model with an autoencoder"
            )
        if latent_scale == "config":
            latent_scale = configured_scale(autoencoder)
        elif latent_scale == "estimate":
            latent_scale = float("nan")
        self.register_buffer("latent_scale", torch.tensor(float(latent_scale)))
        # Frozen in eval mode on purpose (train() keeps it there): Lightning's warning about eval-mode modules at the
        # start of fit would fire on every latent run. Filtered once a latent model exists, not on import.
        warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
        # Whether the scale is known, kept on the host: reading the buffer each step would wait for the device.
        # Loaded weights bring their own scale (an untrained "estimate" checkpoint brings NaN), so a load re-reads it.
        self._scale_known = not math.isnan(float(latent_scale))
        self.register_load_state_dict_post_hook(DiffusionModule._reread_scale)
        return autoencoder.eval().requires_grad_(False)

    @staticmethod
    def _reread_scale(module: DiffusionModule, incompatible_keys) -> None:
        module._scale_known = not torch.isnan(module.latent_scale).item()

    # -- setup -------------------------------------------------------------------------------------------

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of what the net denoises: the images, or the autoencoder's latents."""
        return (self.net.in_channels, self.net.image_size, self.net.image_size)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the images ``sample`` returns."""
        if self.autoencoder is None:
            return self.latent_shape
        c, _, f = autoencoder_sizes(self.autoencoder)
        return (c, self.net.image_size * f, self.net.image_size * f)

    def train(self, mode: bool = True) -> DiffusionModule:
        super().train(mode)
        if self.autoencoder is not None:  # frozen: Lightning's train() at fit start must not switch it
            self.autoencoder.eval()
        return self

    def configure_model(self) -> None:
        self._load_init_weights()  # before sharding (and before the EMA copies the weights at its first update)
        self._adapt()  # on the loaded weights; before sharding, compiling and the EMA's first copy
        if self.device_mesh is not None and (
            averaging := [  # the zoo's EMA stays sharded; others keep a whole copy
                c for c in self.trainer.callbacks if isinstance(c, WeightAveraging) and not isinstance(c, EMA)
            ]
        ):
            raise ValueError(
                f"{type(averaging[0]).__name__} keeps an unsharded copy of the model and cannot follow FSDP sharding: "
                "use the module's own EMA (model.init_args.ema_decay) or no weight averaging to shard"
            )
        shard(self.net, self.device_mesh, blocks=self.net.blocks)  # FSDP2 units: residual/attention/DiT blocks

    def _load_init_weights(self) -> None:
        # Not in __init__: load_from_checkpoint never needs the original file, and a checkpoint given by
        # --ckpt_path is restored after this hook. Once, so a later test() keeps the trained weights.
        if self.hparams.init_weights and not self._init_loaded:
            self._load_base()
        self._load_autoencoder()

    def _load_base(self) -> None:
        from zoo.diffusion.convert import load_pretrained
        from zoo.diffusion.scheduler_config import check_objective

        load_pretrained(self.net, readable(self.hparams.init_weights))
        learned = getattr(self.net, "out_channels", 0) == 2 * self.net.in_channels
        check_objective(self.hparams.init_weights, self.objective, learned)
        self._init_loaded = True

    def _adapt(self) -> None:
        adapt_module(self, self.hparams.adapt)  # once (zoo.adapt); what trains is what the EMA averages
        if self.autoencoder is not None:
            named = [n for n, p in self.autoencoder.named_parameters() if p.requires_grad or ADAPTER_PREFIX in n]
            if named:
                raise InputError(
                    f"adapt names the frozen autoencoder's {named[0]}: it is never adapted nor trained; name the "
                    "net's layers and parameters (net.*)"
                )

    def _load_autoencoder(self) -> None:
        # Once, at set-up or at the first encode or decode from Python; never after a checkpoint (which holds them).
        if self.autoencoder is not None and self.hparams.autoencoder_weights and not self._autoencoder_loaded:
            load_autoencoder(self.autoencoder, self.hparams.autoencoder_weights)
        self._autoencoder_loaded = True

    def skip_init_weights(self) -> None:
        super().skip_init_weights()
        self._autoencoder_loaded = True

    def configure_callbacks(self):
        # EMA weights, unless the trainer has a weight averaging (EMA, SWA) of its own, which replaces ours.
        if not self.hparams.ema_decay or any(isinstance(c, WeightAveraging) for c in self.trainer.callbacks):
            return []
        return [EMA(decay=self.hparams.ema_decay, start_step=self.hparams.ema_start_step)]

    # -- the denoiser ------------------------------------------------------------------------------------

    def denoise(self, x: Tensor, t: Tensor, y: Tensor | None) -> Tensor:
        """The net as the samplers' callable: (x_t, t, y) -> a prediction shaped like x_t (then v if learnt)."""
        net = self.net
        if self.hparams.compile and self.training:
            if self._compiled is None:
                object.__setattr__(self, "_compiled", torch.compile(self.net))
            net = self._compiled
        return net(x, self.objective.net_time(t), y if self.num_classes else None)

    def _loss(self, batch: tuple[Tensor, Tensor], **fixed: Tensor) -> dict[str, Tensor]:
        """The objective on (x0, y): x0 what the net denoises (images, or latents already encoded)."""
        x0, y = batch
        return self.objective.loss(self.denoise, x0, y, **fixed)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, y = batch
        # Steps, noise and label drops (and the latents' posterior samples) are keyed by (seed, epoch, batch, rank),
        # not drawn from the global RNG, which a resumed run does not restore: so a resumed run draws what an unbroken
        # one would.
        key = hash((torch.initial_seed(), self.current_epoch, batch_idx, self.global_rank)) % 2**63
        g = torch.Generator(images.device).manual_seed(key)
        x0 = self.encode(images, g)
        t = self.objective.sample_time(x0.shape[0], g, x0.device)
        noise = torch.randn(x0.shape, generator=g, device=x0.device, dtype=x0.dtype)
        if self.num_classes and self.hparams.label_dropout > 0:  # the unconditional model, for guidance
            drop = torch.rand(y.shape, generator=g, device=y.device) < self.hparams.label_dropout
            y = torch.where(drop, self.num_classes, y)
        out = self._loss((x0, y), t=t, noise=noise)
        if lightning_writes(self.trainer):  # values logged at other steps are dropped anyway
            self.log_dict({f"train/{k}": v for k, v in out.items()}, prog_bar=True)
        return out["loss"]

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        # The same steps and noise for batch i at every validation (and on any device: drawn on the CPU),
        # so val/loss changes only with the weights.
        g = torch.Generator().manual_seed(batch_idx)
        x0 = self.encode(batch[0], g)
        t = self.objective.sample_time(x0.shape[0], g, torch.device("cpu")).to(x0.device)
        noise = torch.randn(x0.shape, generator=g).to(x0.device, x0.dtype)
        out = self._loss((x0, batch[1]), t=t, noise=noise)
        self.log_dict({f"val/{k}": v for k, v in out.items()}, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return AdamWCosine.of(self.hparams.optimizer).configure(self.net, self.trainer)  # the net's: never the AE's

    # -- the latent space --------------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """What the net denoises: ``images`` (B, C, H, W) in [-1, 1] themselves, or their scaled latents
        s (E(x) - b) (B, Z, H / f, W / f), a posterior sample drawn on ``generator``."""
        if self.autoencoder is None:
            return images
        self._load_autoencoder()
        c, _, f = autoencoder_sizes(self.autoencoder)
        if images.shape[1] != c or images.shape[-1] != self.net.image_size * f:
            raise InputError(
                f"the data's images are {tuple(images.shape[1:])}; this autoencoder and net take "
                f"{self.image_shape}: set net.init_args.image_size to the images' side / {f} "
                f"({images.shape[-1] // f}), or data of {self.image_shape[-1]}-pixel {c}-channel images"
            )
        latents = sample_latents(self.autoencoder, images, generator) - shift_of(self.autoencoder)
        if not self._scale_known:
            self._estimate_scale(latents)
        return latents * self.latent_scale

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Images (B, C, H, W), about [-1, 1], of what the net denoises (latents decoded; images returned as they
        are)."""
        if self.autoencoder is None:
            return latents
        self._load_autoencoder()
        if not self._scale_known:
            raise InputError(
                "latent_scale 'estimate' is estimated on the first batch of fit, and this model was not trained: fit "
                "it first, or give model.init_args.latent_scale a number"
            )
        return decode_latents(self.autoencoder, latents, self.latent_scale, shift_of(self.autoencoder))

    def _estimate_scale(self, latents: Tensor) -> None:
        trainer = trainer_of(self)  # None outside a Trainer (a test's own loop)
        if trainer is None or trainer.state.fn != "fit":
            raise InputError(
                "latent_scale 'estimate' is estimated on the first batch of fit: fit the model, or give "
                "model.init_args.latent_scale a number"
            )
        reduce = None if trainer.world_size == 1 else lambda m: trainer.strategy.reduce(m, reduce_op="sum")
        self.latent_scale.copy_(std_scale(latents, reduce))
        self._scale_known = True
        rank_zero_info(f"latent_scale: 1 / std of the first batch's latents = {self.latent_scale.item():.5f}")

    # -- sampling ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self,
        n: int,
        sampler: SamplerClass | None = None,
        guidance_scale: float | None = None,
        seed: int = 0,
        labels: Tensor | list[int] | None = None,
    ) -> Tensor:
        """``n`` images (n, C, H, W) in [-1, 1] drawn with ``sampler`` (default: the module's own); the same seed
        and settings give the same images.

        ``labels`` (n,) condition a class-conditional net (default: classes 0, 1, ..., K-1, 0, ... in turn) and
        ``guidance_scale`` s > 1 (default: the module's) applies classifier-free guidance; both are ignored by
        an unconditional net.
        """
        sampler = self.objective.sampler(sampler or self.sampler, self.hparams.clip_denoised)
        gen = torch.Generator(self.device).manual_seed(seed)
        noise = torch.randn((n, *self.latent_shape), generator=gen, device=self.device)  # x_T (or z_T)
        y, model = None, self.denoise
        if self.num_classes:
            y = torch.arange(n) % self.num_classes if labels is None else torch.as_tensor(labels)
            y = y.to(self.device, torch.long)
            scale = self.guidance_scale if guidance_scale is None else guidance_scale
            model = ClassifierFreeGuidance(self.denoise, scale, null_label=self.num_classes)
        was_training = self.training
        self.eval()  # dropout off
        try:
            x = self.decode(sampler.sample(model, noise, y, gen))
        finally:
            self.train(was_training)
        return x.clamp(-1, 1)

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """Sample the datamodule's requests (labels, seed) with the batch's sampler and guidance (a served request's)
        else this module's; the rows and images go to WritePredictions."""
        seed, labels = batch["seed"] + batch_idx, batch["labels"]
        images = self.sample(len(labels), batch.get("sampler"), batch.get("guidance_scale"), seed, labels)
        label = labels if self.num_classes else torch.full_like(labels, -1)
        # "images" in [0, 1]: WritePredictions writes each as a PNG (enlarged when tiny) and all of them as one grid,
        # in the run's folder ("images_dir" a name inside it), and adds each row's PNG path; zoo/ writes no file.
        return {
            "index": batch["index"],
            "label": label,
            "seed": [seed] * len(labels),
            "images": images * 0.5 + 0.5,
            "images_dir": batch.get("images_dir"),
        }

    # -- checkpoints -------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)  # the zoo version that wrote it (WeightsOnlyLoading)
        drop_base(self, checkpoint)  # a LoRA fine-tune keeps its adapters; the base is init_weights'

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # The checkpoint's adapter keys meet adapted layers; a base left out is read again from init_weights.
        restore_base(self, checkpoint, self._load_base, self._adapt)
        if "state_dict" in checkpoint:  # absent in a sharded (FSDP2) resume: the shards load into the net directly
            check_compatible(self.net, extract_state_dict(checkpoint, "net."), "checkpoint")
            weights = checkpoint["state_dict"]
            if (self.autoencoder is None) != ("latent_scale" not in weights):
                has = "has" if "latent_scale" in weights else "has no"
                raise InputError(
                    f"the checkpoint {has} an autoencoder (latent diffusion) and this model's config "
                    f"{'has' if self.autoencoder is not None else 'has no'}: use the config it was trained with"
                )
            if self.autoencoder is not None:
                check_compatible(self.autoencoder, extract_state_dict(checkpoint, "autoencoder."), "checkpoint")
        # The checkpoint's weights are trained ones: a later configure_model (a module from load_from_checkpoint
        # handed to a Trainer) must not overwrite them with init_weights.
        self._init_loaded = True
