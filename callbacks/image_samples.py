"""Logs a grid of generated images to MLflow every few validations, so a run shows what the model draws."""

from __future__ import annotations

import math

import lightning.pytorch as pl
from lightning.pytorch import Callback

from zoo.diffusion.samplers import SamplerClass
from zoo.tracking import mlflow_loggers


class LogImageSamples(Callback):
    """Every ``every_n_epochs``-th validation, ``pl_module.sample(...)`` a fixed-seed batch and log it as a PNG.

    Sampling happens after the first validation batch, inside the validation epoch, so it sees the
    weights validation sees (the EMA weights when an EMA callback swaps them in, whatever the callback
    order). The grid goes to each MLflow run as ``samples/step_<global step>.png`` and as the image ``samples``
    at that step, which the MLflow UI shows with a step slider; small images are enlarged (``readable``).
    A fit from step 0 also logs the untrained model's grid at step 0: the UI's card opens on step 0, and showed
    "No image logged at this step" there until the slider was moved.
    """

    def __init__(
        self,
        num_samples: int = 16,
        sampler: SamplerClass | None = None,
        guidance_scale: float | None = None,
        every_n_epochs: int = 1,
        seed: int = 0,
    ) -> None:
        """
        Args:
            num_samples: images per grid (a class-conditional model cycles through the classes).
            sampler: the sampler class with its own settings (``zoo.diffusion.samplers``, e.g. ``DDIMSampler`` with
                steps); None: the module's own.
            guidance_scale: classifier-free guidance scale for a class-conditional net; None: the module's own.
            every_n_epochs: log after every n-th validation epoch.
            seed: sampling seed, the same at every validation so grids compare across the run.
        """
        self.num_samples, self.sampler, self.guidance_scale = num_samples, sampler, guidance_scale
        self.every_n_epochs, self.seed = every_n_epochs, seed

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs,
        batch,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if batch_idx or dataloader_idx or trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        self.log_grid(trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step == 0:  # not on a resume: its run's step 0 is the first run's
            self.log_grid(trainer, pl_module)

    def log_grid(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Sample the grid and log it at the trainer's global step to every MLflow run."""
        if not mlflow_loggers(trainer):  # the same on every rank: each builds the configured loggers
            return
        from zoo.diffusion.grid import image_grid

        # Every rank samples (a sharded net's forward is collective); rank 0 logs.
        images = pl_module.sample(self.num_samples, self.sampler, self.guidance_scale, seed=self.seed)
        if not trainer.is_global_zero:
            return
        grid = readable(image_grid(images))
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_image(lg.run_id, grid, artifact_file=f"samples/step_{trainer.global_step:07d}.png")
            lg.experiment.log_image(lg.run_id, grid, key="samples", step=trainer.global_step)


def readable(image, min_side: int = 512):
    """``image`` enlarged by a whole factor (nearest neighbour: pixels stay sharp) to at least ``min_side`` pixels
    across: a grid of 16-pixel samples is otherwise a thumbnail of a few dozen pixels in the MLflow UI."""
    from PIL import Image

    factor = math.ceil(min_side / max(image.size))
    return image if factor <= 1 else image.resize((image.width * factor, image.height * factor), Image.NEAREST)
