"""Logs the Fréchet distance of generated images to the validation images, in a zoo classifier's features.

The distance is torchmetrics' ``FrechetInceptionDistance`` with the classifier as its feature extractor.
``log_frechet`` (the two image streams into a metric, then the logged value) is shared with
``FrechetInceptionDistance`` (callbacks/fid.py), which measures the same in Inception-v3's features.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch import Callback
from torch import Tensor

from zoo.diffusion.samplers import SamplerClass


def due(trainer: pl.Trainer, batch_idx: int, dataloader_idx: int, every_n_epochs: int) -> bool:
    """After the first batch of every ``every_n_epochs``-th validation: inside validation, so on the weights it
    uses (the EMA weights when an EMA callback swaps them in), and never in the sanity check."""
    return not (batch_idx or dataloader_idx or trainer.sanity_checking or (trainer.current_epoch + 1) % every_n_epochs)


def real_images(trainer: pl.Trainer, num_samples: int, device: torch.device) -> Iterator[Tensor]:
    """The first ``num_samples`` validation images (fewer if the set is smaller), batch by batch, in [-1, 1]."""
    dm, n = trainer.datamodule, 0
    for x, y in dm.val_dataloader():
        x, _ = dm.on_after_batch_transfer((x.to(device), y), 0)  # to [-1, 1] as the model sees them
        x = x[: num_samples - n]
        n += len(x)
        yield x
        if n >= num_samples:
            return


def generated_images(
    pl_module: pl.LightningModule,
    num_samples: int,
    batch_size: int,
    sampler: SamplerClass | None,
    guidance_scale: float | None,
    seed: int,
) -> Iterator[Tensor]:
    """``num_samples`` images from ``pl_module.sample``, ``batch_size`` at a time; classes in turn across batches.

    Every rank must consume it (the forward of a sharded net is collective), even those that discard it.
    """
    k = getattr(pl_module, "num_classes", 0)
    for i in range(0, num_samples, batch_size):
        n = min(batch_size, num_samples - i)
        labels = torch.arange(i, i + n) % k if k else None
        yield pl_module.sample(n, sampler, guidance_scale, seed=seed + i, labels=labels)


def log_frechet(
    callback: Callback,
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    key: str,
    prepare: Callable[[Tensor], Tensor] = lambda images: images,
) -> None:
    """Logs ``key``: ``callback.metric`` (a torchmetrics FID kept on rank 0, real side featurised once) over
    the callback's ``num_samples`` validation and generated images, ``prepare``-d for its feature extractor.

    Every rank samples (the forward of a sharded net is collective); rank 0 measures and logs.
    """
    rank0, metric = trainer.is_global_zero, callback.metric
    if rank0:
        metric.to(pl_module.device)
        if int(metric.real_features_num_samples) == 0:  # kept across validations (reset_real_features=False)
            for images in real_images(trainer, callback.num_samples, pl_module.device):
                metric.update(prepare(images), real=True)
    for images in generated_images(
        pl_module, callback.num_samples, callback.batch_size, callback.sampler, callback.guidance_scale, callback.seed
    ):
        if rank0:
            metric.update(prepare(images), real=False)
    if rank0:
        value = metric.compute().item()
        metric.reset()  # the generated side only
        pl_module.log(key, value, on_step=False, on_epoch=True, rank_zero_only=True)


class FrechetDistance(Callback):
    """Every ``every_n_epochs``-th validation, logs ``val/fd_classifier`` over ``num_samples`` generated images.

    The reference statistics are those of the first ``num_samples`` validation images, computed once.
    Sampling happens after the first validation batch, so it uses the weights validation uses (EMA).
    Every rank samples (the forward of a sharded net is collective); rank 0 computes and logs the metric.
    """

    def __init__(
        self,
        classifier: str,
        num_samples: int = 500,
        sampler: SamplerClass | None = None,
        guidance_scale: float | None = None,
        batch_size: int = 250,
        every_n_epochs: int = 1,
        seed: int = 0,
        classifier_mean: tuple[float, ...] = (0.5,),
        classifier_std: tuple[float, ...] = (0.5,),
    ) -> None:
        """
        Args:
            classifier: a ``ClassifierModule`` checkpoint trained on the same data (e.g. by
            configs/cnn/convnet_shapes.yaml).
            num_samples: generated (and real) images compared; the metric is biased upwards at small N, so
                compare numbers only at the same N.
            sampler: the sampler class with its own settings (``zoo.diffusion.samplers``, e.g. ``DDIMSampler`` with
                steps); None: the module's own.
            guidance_scale: classifier-free guidance scale for a class-conditional net; None: the module's own.
            batch_size: images generated per call of ``sample``.
            every_n_epochs: compute after every n-th validation epoch.
            seed: sampling seed, the same every time.
            classifier_mean: per-channel mean the classifier's inputs were standardised with ((0.5,) with
                std (0.5,): images in [-1, 1], as ShapesDataModule gives them).
            classifier_std: per-channel std of that standardisation.
        """
        # Checked here, on every rank: found missing in setup, where rank 0 alone loads it, rank 0 would fail
        # while the other ranks wait for it in the next collective.
        if not classifier.startswith(("models:/", "runs:/")) and not Path(classifier).is_file():
            raise FileNotFoundError(
                f"FrechetDistance's classifier checkpoint {classifier!r} does not exist: pass "
                "--trainer.callbacks.classifier=<a ClassifierModule .ckpt trained on the same data>"
            )
        self.classifier, self.num_samples = classifier, num_samples
        self.sampler, self.guidance_scale, self.batch_size = sampler, guidance_scale, batch_size
        self.every_n_epochs, self.seed = every_n_epochs, seed
        self.classifier_mean, self.classifier_std = classifier_mean, classifier_std
        self.metric = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.metric is None and trainer.is_global_zero:
            from torchmetrics.image.fid import FrechetInceptionDistance as FID

            from zoo.diffusion.metrics import ClassifierFeatures

            net = classifier_net(self.classifier)
            features = ClassifierFeatures(net, self.classifier_mean, self.classifier_std)
            # rank 0 alone holds the metric: syncing its states at compute would wait for the other ranks forever.
            self.metric = FID(feature=features, reset_real_features=False, sync_on_compute=False)

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
            log_frechet(self, trainer, pl_module, "val/fd_classifier")


def classifier_net(path: str) -> torch.nn.Module:
    """The net of a ``ClassifierModule`` checkpoint (made through cli.py) or MLflow model, loaded weights-only."""
    from zoo.cnn import ClassifierModule
    from zoo.tracking import is_mlflow_uri, resolve_checkpoint

    local = resolve_checkpoint(path) if is_mlflow_uri(path) else path
    return ClassifierModule.load_from_checkpoint(local, map_location="cpu", weights_only=True).net
