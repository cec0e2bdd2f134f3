"""Image data from torchvision: its standard datasets from a root path, and image folders.

Both fail at ``prepare_data``/``setup`` with what to pass when the data is not there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

from torchvision import datasets
from torchvision import transforms as T

from datamodules.base import ImageDataModule, TransformSubset, check_settings, not_found_message, split_indices

# name: (class, channels, side, classes, mean, std, flip makes sense)
_DATASETS = {
    "MNIST": (datasets.MNIST, 1, 28, 10, (0.1307,), (0.3081,), False),
    "FashionMNIST": (datasets.FashionMNIST, 1, 28, 10, (0.2860,), (0.3530,), True),
    "CIFAR10": (datasets.CIFAR10, 3, 32, 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), True),
    "CIFAR100": (datasets.CIFAR100, 3, 32, 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), True),
}
# CIFAR keeps its names in a meta file read at load time; the protocol needs them before any data.
_CIFAR_CLASSES = {
    "CIFAR10": "airplane automobile bird cat deer dog frog horse ship truck".split(),
    "CIFAR100": """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin
elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man
maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain
plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake
spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip
turtle wardrobe whale willow_tree wolf woman worm""".split(),
}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class TorchvisionDataModule(ImageDataModule):
    """MNIST, FashionMNIST, CIFAR-10/100 through ``torchvision.datasets``; test = the official test set."""

    def __init__(
        self,
        name: Literal["MNIST", "FashionMNIST", "CIFAR10", "CIFAR100"] = "CIFAR10",
        root: str = "data",
        download: bool = False,
        batch_size: int = 128,
        val_fraction: float = 0.1,
        augment: bool = False,
        seed: int = 0,
        **loader,
    ) -> None:
        """
        Args:
            name: which torchvision dataset.
            root: folder holding it in torchvision's layout.
            download: fetch it into ``root`` when missing (needs internet).
            batch_size: images per batch.
            val_fraction: fraction of the training set held out for validation.
            augment: random crop with 4 pixels of padding, plus horizontal flips where they keep the class.
            seed: seed of the validation split and of the shuffling order.
            **loader: DataLoader settings (num_workers, pin_memory, persistent_workers) of ``ImageDataModule``.
        """
        super().__init__(batch_size, seed, **loader)
        check_settings(fraction=True, val_fraction=val_fraction)
        self.save_hyperparameters()
        self.name, self.root, self.download = name, root, download
        self.val_fraction, self.augment = val_fraction, augment
        cls, c, side, k, mean, std, flip = _DATASETS[name]
        self.num_classes = k
        self.image_shape = (c, side, side)
        self.class_names = list(_CIFAR_CLASSES.get(name) or cls.classes)
        self.normalization = (tuple(mean), tuple(std))
        normalise = [T.ToTensor(), T.Normalize(mean, std)]
        aug = [T.RandomCrop(side, padding=4)] + ([T.RandomHorizontalFlip()] if flip else [])
        self.train_transform = T.Compose((aug if augment else []) + normalise)
        self.eval_transform = T.Compose(normalise)

    def _dataset(self, train: bool, download: bool, root: str | None = None):
        cls = _DATASETS[self.name][0]
        try:
            return cls(root or self.root, train=train, download=download)
        except Exception as err:  # torchvision raises RuntimeError (missing) or URLError (no internet)
            hint = (
                "the download failed (no internet?): put the dataset there yourself"
                if download
                else "pass data.init_args.root=<dir> containing it, or data.init_args.download=true with internet"
            )
            raise FileNotFoundError(
                not_found_message(self.name, self.root, hint) + f" ({type(err).__name__}: {err})"
            ) from err

    def prepare_data(self) -> None:
        try:
            for train in (True, False):
                self._dataset(train, False)
        except FileNotFoundError:
            if not self.download:
                raise
            self._fetch()

    def _fetch(self) -> None:
        """The dataset downloaded into a fresh folder inside ``root`` that only this user can enter, then moved into
        place. torchvision writes its files by name into the folder it is given, before checking their MD5: in a
        shared ``root``, through a link another user planted at one of those names."""
        cls = _DATASETS[self.name][0]
        folder = getattr(cls, "base_folder", cls.__name__)  # CIFAR's cifar-10-batches-py, MNIST's MNIST/
        Path(self.root).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root, prefix=".download-") as private:
            for train in (True, False):
                self._dataset(train, True, private)
            try:
                os.rename(Path(private, folder), Path(self.root, folder))  # never over what is there
            except OSError as err:
                raise FileNotFoundError(
                    not_found_message(self.name, self.root, f"move or remove {folder} there, which is in the way")
                    + f" ({err})"
                ) from err

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        full = self._dataset(True, False)
        train, val = split_indices(len(full), self.val_fraction, self.seed)
        self.train_set = TransformSubset(full, train, self.train_transform)
        self.val_set = TransformSubset(full, val, self.eval_transform)
        test = self._dataset(False, False)
        self.test_set = TransformSubset(test, range(len(test)), self.eval_transform)


class ImageFolderDataModule(ImageDataModule):
    """``root/train/<class>/*.png`` (and optional ``val/``, ``test/``) via ``torchvision.datasets.ImageFolder``."""

    def __init__(
        self,
        root: str,
        image_size: int = 224,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        augment: bool = False,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        seed: int = 0,
        **loader,
    ) -> None:
        """
        Args:
            root: folder with ``train/`` and optionally ``val/`` and ``test/``, each one sub-folder per class.
            image_size: side images are resized (and cropped) to.
            batch_size: images per batch.
            val_fraction: held out from train/ when there is no val/ folder.
            augment: random resized crops and horizontal flips on training images.
            mean: per-channel normalisation mean (ImageNet's by default).
            std: per-channel normalisation std (ImageNet's by default).
            seed: seed of the validation split and of the shuffling order.
            **loader: DataLoader settings (num_workers, pin_memory, persistent_workers) of ``ImageDataModule``.
        """
        super().__init__(batch_size, seed, **loader)
        check_settings(fraction=True, val_fraction=val_fraction)
        self.save_hyperparameters()
        self.root, self.val_fraction = Path(root), val_fraction
        self.class_names = self._classes()
        self.num_classes = len(self.class_names)
        self.image_shape = (3, image_size, image_size)
        self.normalization = (tuple(mean), tuple(std))
        normalise = [T.ToTensor(), T.Normalize(mean, std)]
        resize = [T.Resize(image_size), T.CenterCrop(image_size)]
        aug = [T.RandomResizedCrop(image_size, scale=(0.35, 1.0)), T.RandomHorizontalFlip()]
        self.train_transform = T.Compose((aug if augment else resize) + normalise)
        self.eval_transform = T.Compose(resize + normalise)

    def _classes(self) -> list[str]:
        train = self.root / "train"
        classes = sorted(p.name for p in train.iterdir() if p.is_dir()) if train.is_dir() else []
        if not classes:
            raise FileNotFoundError(
                not_found_message(
                    "an image folder (train/<class>/<image>)",
                    str(self.root),
                    "pass data.init_args.root=<dir> with train/ (and optionally val/, test/) "
                    "holding one sub-folder of images per class",
                )
            )
        return classes

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        folder = lambda split: datasets.ImageFolder(str(self.root / split))  # noqa: E731
        full = folder("train")
        if (self.root / "val").is_dir():
            train, val_set = range(len(full)), folder("val")
            self.val_set = TransformSubset(val_set, range(len(val_set)), self.eval_transform)
        else:
            train, val = split_indices(len(full), self.val_fraction, self.seed)
            self.val_set = TransformSubset(full, val, self.eval_transform)
        self.train_set = TransformSubset(full, train, self.train_transform)
        if (self.root / "test").is_dir():
            test = folder("test")
            self.test_set = TransformSubset(test, range(len(test)), self.eval_transform)
        else:
            self.test_set = self.val_set
