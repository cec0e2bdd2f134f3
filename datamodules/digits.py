"""DigitsDataModule: scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes).

It ships inside scikit-learn, so it needs no download and no disk: the smallest real image data
set for CPU smoke tests that still have to learn something.
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits

from datamodules.base import ImageDataModule, check_settings, split_indices
from datamodules.tensor_dataset import TensorImageDataset


class DigitsDataModule(ImageDataModule):
    """8x8 grey digits, split deterministically into train/val/test and standardised with train statistics."""

    def __init__(
        self,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        augment: bool = False,
        seed: int = 0,
        **loader,
    ) -> None:
        """
        Args:
            batch_size: images per batch.
            val_fraction: fraction of the non-test images held out for validation.
            test_fraction: fraction of all 1797 images held out for testing.
            augment: shift training digits by up to one pixel (never flipped: mirrored digits are other glyphs).
            seed: seed of the train/val/test split and of the shuffling order.
            **loader: DataLoader settings (num_workers, pin_memory, persistent_workers) of ``ImageDataModule``.
        """
        super().__init__(batch_size, seed, **loader)
        check_settings(fraction=True, val_fraction=val_fraction, test_fraction=test_fraction)
        self.save_hyperparameters()
        self.val_fraction, self.test_fraction, self.augment = val_fraction, test_fraction, augment
        self.num_classes = 10
        self.image_shape = (1, 8, 8)
        self.class_names = [str(d) for d in range(10)]
        self.collate_fn = TensorImageDataset.collate_batch

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        digits = load_digits()
        images = torch.from_numpy(digits.images).float().unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
        labels = torch.from_numpy(digits.target).long()
        rest, test = split_indices(len(labels), self.test_fraction, self.seed, "test_fraction")
        train, val = split_indices(len(rest), self.val_fraction, self.seed + 1)
        train, val = [rest[i] for i in train], [rest[i] for i in val]
        mean, std = images[train].mean(), images[train].std()
        self.normalization = ((float(mean),), (float(std),))
        images = (images - mean) / std
        fill = float(-mean / std)  # the blank-paper value after standardisation
        self.train_set = TensorImageDataset(images[train], labels[train], max_shift=int(self.augment), fill=fill)
        self.val_set = TensorImageDataset(images[val], labels[val])
        self.test_set = TensorImageDataset(images[test], labels[test])
