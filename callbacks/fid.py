"""Logs FID (Heusel et al. 2017) of generated images to the validation images, with local Inception weights.

torchmetrics' ``FrechetInceptionDistance`` takes the 2048-d pool features of torch-fidelity's port of the
TensorFlow FID Inception-v3 (the network of the original FID code, so its numbers compare with papers' at
the same N). Its weights are the file torch-fidelity would download, ``pt_inception-2015-12-05-6726825d.pth``
(https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/weights-inception-2015-12-05-6726825d.pth):
this callback only ever reads it from the given path, and fails at construction when the file or
torch-fidelity (the zoo's ``fid`` extra) is missing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch import Callback
from torch import Tensor

from callbacks.frechet import due, log_frechet
from zoo.diffusion.samplers import SamplerClass
from zoo.errors import missing_extra


def to_uint8_rgb(images: Tensor) -> Tensor:
    """Images in [-1, 1] (B, C, H, W) -> the (B, 3, H, W) uint8 pixels FID's Inception reads (grey repeated)."""
    pixels = ((images.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels


class FrechetInceptionDistance(Callback):
    """Every ``every_n_epochs``-th validation, logs ``val/fid`` of ``num_samples`` generated images.

    The real side is the first ``num_samples`` validation images, featurised once and kept (the metric's
    ``reset_real_features=False``). Images of any size are resized to 299 px inside the metric. Every rank
    samples (the forward of a sharded net is collective); rank 0 computes and logs.
    """

    def __init__(
        self,
        weights: str,
        num_samples: int = 500,
        sampler: SamplerClass | None = None,
        guidance_scale: float | None = None,
        batch_size: int = 250,
        every_n_epochs: int = 1,
        seed: int = 0,
    ) -> None:
        """
        Args:
            weights: local path of torch-fidelity's Inception-v3 weights (pt_inception-2015-12-05-6726825d.pth).
            num_samples: generated (and real) images compared; FID is biased upwards at small N (papers use
                50k), so compare numbers only at the same N.
            sampler: the sampler class with its own settings (``zoo.diffusion.samplers``, e.g. ``DDIMSampler`` with
                steps); None: the module's own.
            guidance_scale: classifier-free guidance scale for a class-conditional net; None: the module's own.
            batch_size: images generated per call of ``sample``.
            every_n_epochs: compute after every n-th validation epoch.
            seed: sampling seed, the same every time.
        """
        if importlib.util.find_spec("torch_fidelity") is None:  # located, imported when the metric is built
            raise missing_extra("torch_fidelity", "callbacks.FrechetInceptionDistance (its Inception-v3)")
        if not Path(weights).is_file():
            raise FileNotFoundError(
                f"Inception weights {weights!r} do not exist: pass the local path of torch-fidelity's "
                "pt_inception-2015-12-05-6726825d.pth (this callback never downloads it), or use "
                "callbacks.FrechetDistance with a zoo classifier checkpoint instead"
            )
        self.weights, self.num_samples = weights, num_samples
        self.sampler, self.guidance_scale, self.batch_size = sampler, guidance_scale, batch_size
        self.every_n_epochs, self.seed = every_n_epochs, seed
        self.metric = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.metric is None and trainer.is_global_zero:
            self.metric = self.build_metric(self.weights)

    @staticmethod
    def build_metric(weights: str):
        """torchmetrics' FID on the Inception-v3 of ``weights``, checked to hold only tensors first."""
        from torchmetrics.image.fid import FrechetInceptionDistance as FID

        from zoo.io.weights import load_file

        # torch-fidelity reads the file with torch.load(weights_only=False); reading it weights-only first
        # refuses a file that would run pickled code.
        load_file(weights)
        # rank 0 alone holds the metric: syncing its states at compute would wait for the other ranks forever.
        return FID(
            feature=2048, reset_real_features=False, feature_extractor_weights_path=weights, sync_on_compute=False
        )

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs,
        batch,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if due(trainer, batch_idx, dataloader_idx, self.every_n_epochs):
            log_frechet(self, trainer, pl_module, "val/fid", to_uint8_rgb)
