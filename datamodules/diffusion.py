"""Images for a diffusion model: any image DataModule's batches mapped to [-1, 1], plus what to sample at predict.

Training and validation batches come from the wrapped ``images`` DataModule, whose standardised pixels
((p - mean) / std, p in [0, 1]) are mapped back to 2p - 1, the range diffusion models are trained in.
Predict batches are sampling requests: which class each image is of and its seed. How to sample (the
sampler, its steps, guidance) is the model's: ``DiffusionModule(sampler=..., guidance_scale=...)``, which
``predict --ckpt_path`` takes from the command line over the checkpoint's.

Notation: B batch, C channels.
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from datamodules.base import ImageDataModule, check_settings
from zoo.io.files import check_output_name
from zoo.io.hparams import save_hparams


class _CollateRequests:
    """Sampling requests stay (index, label) tensors; the seed and output folder of the run (plain values) are added."""

    def __init__(self, settings: dict) -> None:
        self.settings = settings

    def __call__(self, items: list[tuple[int, int]]) -> dict:
        index, labels = zip(*items)
        return {"index": torch.tensor(index), "labels": torch.tensor(labels), **self.settings}


class DiffusionDataModule(LightningDataModule):
    """Wraps an image DataModule (fit, validate, test) and serves sampling requests (predict)."""

    def __init__(
        self,
        images: ImageDataModule,
        data_mean: tuple[float, ...] = (0.5,),
        data_std: tuple[float, ...] = (0.5,),
        num_samples: int = 64,
        batch_size: int = 64,
        labels: list[int] | None = None,
        seed: int = 0,
        output_dir: str | None = None,
    ) -> None:
        """
        Args:
            images: the image DataModule trained on (``datamodules.ShapesDataModule``, ``MNISTHubDataModule``, ...).
            data_mean: per-channel mean (or one for all) the images were standardised with; (0.5,) with
                ``data_std`` (0.5,) means they are in [-1, 1] already (ShapesDataModule).
            data_std: per-channel standard deviation the images were standardised with.
            num_samples: predict: images to generate.
            batch_size: predict: images per batch, i.e. per PNG grid.
            labels: predict: class of each image, repeated in turn (class-conditional models); None: 0, 1, ..., K-1,
            0, ...
            seed: predict: seed of batch 0; batch i uses seed + i, so a run repeats exactly.
            output_dir: predict: folder of the PNGs and their grid, a name inside the run's folder (never outside it;
                a checkpoint's stored value is not used); None: ``images/`` beside the predictions file.
        """
        super().__init__()
        check_settings(at_least=1, num_samples=num_samples, batch_size=batch_size)
        # Recorded in checkpoints (the image data as its config, never the object), so that
        # `predict --ckpt_path <model>` without a config samples with the same normalisation and classes.
        save_hparams(self, "images")
        self.images = images
        mean, std = torch.tensor(data_mean, dtype=torch.float32), torch.tensor(data_std, dtype=torch.float32)
        # 2 (x std + mean) - 1 = scale x + shift, per channel
        self._scale, self._shift = (2 * std).view(-1, 1, 1), (2 * mean - 1).view(-1, 1, 1)
        self._identity = bool((self._scale == 1).all() and (self._shift == 0).all())
        self.num_samples, self.batch_size, self.labels = num_samples, batch_size, labels
        self.request = {"seed": seed, "images_dir": check_output_name("data.init_args.output_dir", output_dir)}
        # The image protocol, so nets can be sized from the data config alone.
        self.num_classes, self.image_shape = images.num_classes, images.image_shape
        self.class_names = images.class_names

    def _predicting(self) -> bool:
        return self.trainer is not None and self.trainer.state.fn == "predict"

    def prepare_data(self) -> None:
        if not self._predicting():  # sampling needs no training data (nor its download)
            self.images.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if stage != "predict":
            self.images.setup(stage)

    def state_dict(self) -> dict:
        self.images.trainer = self.trainer  # the images' loader and position read the trainer's progress
        return self.images.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.images.load_state_dict(state_dict)

    def train_dataloader(self) -> DataLoader:
        self.images.trainer = self.trainer
        return self.images.train_dataloader()

    def val_dataloader(self) -> DataLoader:
        return self.images.val_dataloader()

    def test_dataloader(self) -> DataLoader:
        return self.images.test_dataloader()

    def predict_dataloader(self) -> DataLoader:
        k = max(self.num_classes, 1)
        classes = self.labels or list(range(k))
        items = [(i, classes[i % len(classes)]) for i in range(self.num_samples)]
        return DataLoader(items, batch_size=self.batch_size, shuffle=False, collate_fn=_CollateRequests(self.request))

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if self._identity or isinstance(batch, dict):
            return batch
        x, y = batch
        return x * self._scale.to(x.device) + self._shift.to(x.device), y
