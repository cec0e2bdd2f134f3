"""New image files to predict on with a trained model: a folder, a file, or a list of them.

The files are read as the model's training data was: channels, side, mean and std come from the model's
``inputs`` (recorded at fit and carried by its checkpoint and MLflow model, ``zoo.io.new_inputs``)
unless given here, so ``predict --ckpt_path models:/<name>@<alias> --data.init_args.paths=<folder>`` needs
no training config. They are read in ``predict_dataloader``, which Lightning calls after restoring the
checkpoint. Batches are dicts: ``image`` (B, C, H, W) and ``path`` (B,) strings.

``ZeroShotDataModule`` adds what CLIP needs: class names (or a file of them, one a line) and prompt
templates for zero-shot classification, or texts to embed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset, default_collate

from datamodules.base import check_settings, not_found_message
from zoo.errors import InputError
from zoo.io.new_inputs import DEFAULT_TEMPLATES, image_transform

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def image_paths(paths: str | list[str]) -> list[Path]:
    """Every image named: files as given, folders searched recursively (sorted), in the order given."""
    out: list[Path] = []
    for p in [paths] if isinstance(paths, str) else paths:
        path = Path(p)
        if path.is_dir():
            out += sorted(f for f in path.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            out.append(path)
        else:
            raise FileNotFoundError(
                not_found_message(
                    "images", str(path), "pass data.init_args.paths=<a folder, an image file, or a list of them>"
                )
            )
    if not out:
        raise FileNotFoundError(
            not_found_message("image files", str(paths), f"expected files ending in {IMAGE_SUFFIXES}")
        )
    return out


OnUnreadable = Literal["skip", "error"]


def readable_images(paths: list[Path], on_unreadable: OnUnreadable = "skip") -> list[Path]:
    """``paths`` less the files PIL cannot identify as an image (it reads their header, not their pixels).

    Predicting on a folder, an unreadable file (a failed download, an HTML page saved as .jpg, an empty file) is
    skipped with one warning naming every such file, as batch-inference tools (img2dataset, ultralytics'
    ``predict``) do: one broken file among thousands should not cost the predictions of all the others, and the
    warning says which are missing. ``on_unreadable="error"`` fails naming the first one instead, as torchvision's
    ``ImageFolder`` does, for pipelines that must predict every file or none. A folder with no readable image
    fails either way.
    """
    from PIL import Image

    readable, unreadable = [], []
    for path in paths:
        try:
            with Image.open(path):
                readable.append(path)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
            if on_unreadable == "error":
                raise InputError(
                    f"{str(path)!r} is not an image PIL can read ({err}): remove it, or pass "
                    f"--data.init_args.on_unreadable=skip to predict the others"
                ) from err
            unreadable.append(str(path))
    if not readable:
        raise InputError(
            f"none of the {len(paths)} files given is an image PIL can read (first: {unreadable[0]!r}): "
            f"pass image files or a folder of them"
        )
    if unreadable:
        rank_zero_warn(
            f"skipped {len(unreadable)} file(s) that are not images PIL can read, predicting the other "
            f"{len(readable)}: {', '.join(unreadable)} (on_unreadable=error fails instead)"
        )
    return readable


def open_image(path: Path, mode: str, transform):
    """``transform`` of the image at ``path``; a file whose pixels do not decode (truncated) is named."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return transform(im.convert(mode))
    except (OSError, SyntaxError, ValueError) as err:
        raise InputError(f"{str(path)!r} does not decode as an image ({err}): remove it or save it again") from err


class ImageFiles(Dataset):
    """Images read from files with one transform; items are ``{"image", "path"}``."""

    def __init__(self, paths: list[Path], mode: str, transform) -> None:
        self.paths, self.mode, self.transform = paths, mode, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        return {"image": open_image(self.paths[i], self.mode, self.transform), "path": str(self.paths[i])}


class ImageFilesDataModule(LightningDataModule):
    """Predict-only: image files read the way the model's training data was."""

    def __init__(
        self,
        paths: str | list[str] | None = None,
        image_size: int | None = None,
        channels: Literal[1, 3] | None = None,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        on_unreadable: OnUnreadable = "skip",
    ) -> None:
        """
        Args:
            paths: a folder (searched recursively), an image file, or a list of them.
            image_size: side images are resized (shorter side) and centre-cropped to; None: the model's.
            channels: 1 (grey) or 3 (RGB); None: the model's.
            mean: per-channel mean subtracted from pixels in [0, 1]; None: the model's training data's.
            std: per-channel std they are divided by; None: the model's training data's.
            batch_size: images per batch.
            num_workers: DataLoader worker processes (decoding files is the bottleneck).
            on_unreadable: a file that is not an image PIL can read: skip it with a warning naming it, or error.
        """
        super().__init__()
        check_settings(at_least=1, batch_size=batch_size, image_size=image_size)
        check_settings(at_least=0, num_workers=num_workers)
        self.save_hyperparameters()

    def _model_inputs(self) -> dict:
        module = self.trainer.lightning_module if self.trainer is not None else None
        return dict(getattr(module, "inputs", None) or {})

    def transform(self):
        """Resize, centre-crop, to tensor, normalise: the settings given here, else the model's ``inputs``."""
        h = self.hparams
        mode, transform = image_transform(self._model_inputs(), h.image_size, h.get("channels"), h.mean, h.std)
        self.image_mode = mode
        return transform

    def _images(self) -> Dataset:
        if self.hparams.paths is None:
            raise FileNotFoundError(
                "predict on new images: pass --data.init_args.paths=<a folder, an image, or [a.png, b.jpg]>"
            )
        transform = self.transform()
        paths = readable_images(image_paths(self.hparams.paths), self.hparams.on_unreadable)
        return ImageFiles(paths, self.image_mode, transform)

    def _loader(self, dataset: Dataset, collate_fn=default_collate) -> DataLoader:
        return DataLoader(
            dataset, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers, collate_fn=collate_fn
        )

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self._images())


class _WithSettings:
    """Adds the predict settings (mode, class names, templates) to every batch; module-level for workers."""

    def __init__(self, extra: dict) -> None:
        self.extra = extra

    def __call__(self, items: list[dict]) -> dict:
        return {**default_collate(items), **self.extra}


class _Texts(Dataset):
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> dict:
        return {"caption": self.texts[i]}


def _lines(path: str, setting: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(not_found_message("a text file", path, "pass a file with one entry a line"))
    from datamodules.text_corpus import read_utf8

    return [line.strip() for line in read_utf8(file, setting).splitlines() if line.strip()]


class ZeroShotDataModule(ImageFilesDataModule):
    """CLIP on new inputs: zero-shot classes of image files, or image or text embeddings."""

    def __init__(
        self,
        paths: str | list[str] | None = None,
        predict: Literal["zeroshot", "image_embeddings", "text_embeddings"] = "zeroshot",
        class_names: list[str] | str | None = None,
        templates: list[str] | None = None,
        texts: list[str] | str | None = None,
        image_size: int | None = None,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        on_unreadable: OnUnreadable = "skip",
    ) -> None:
        """
        Args:
            paths: images: a folder (searched recursively), an image file, or a list of them.
            predict: zeroshot (a class per image), image_embeddings or text_embeddings.
            class_names: zeroshot: the classes, or a text file of them one a line; None: the model's training classes.
            templates: zeroshot: prompts with ``{}`` for the class name; None: the model's (its training data's, or
                for imported weights OpenAI's 80 ImageNet templates), else "a photo of a {}." and two more.
            texts: text_embeddings: the texts, or a text file of them one a line.
            image_size: side images are resized and centre-cropped to; None: the model's.
            mean: per-channel mean subtracted from pixels in [0, 1]; None: the model's training data's.
            std: per-channel std they are divided by; None: the model's training data's.
            batch_size: images or texts per batch.
            num_workers: DataLoader worker processes.
            on_unreadable: a file that is not an image PIL can read: skip it with a warning naming it, or error.
        """
        super().__init__(paths, image_size, 3, mean, std, batch_size, num_workers, on_unreadable)
        self.save_hyperparameters()

    def _zeroshot_settings(self) -> dict:
        h, spec = self.hparams, self._model_inputs()
        names = h.class_names or spec.get("class_names")
        names = _lines(h.class_names, "class_names") if isinstance(h.class_names, str) else names
        if not names:
            raise ValueError(
                "zero-shot prediction needs classes: pass --data.init_args.class_names='[cat, dog]' or a "
                "file of names, one a line"
            )
        templates = h.templates or spec.get("templates") or DEFAULT_TEMPLATES
        return {"class_names": list(names), "templates": list(templates)}

    def predict_dataloader(self) -> DataLoader:
        h = self.hparams
        if h.predict == "text_embeddings":
            if not h.texts:
                raise ValueError("text embeddings: pass --data.init_args.texts='[a red circle, a blue ring]' or a file")
            texts = _lines(h.texts, "texts") if isinstance(h.texts, str) else list(h.texts)
            return self._loader(_Texts(texts), _WithSettings({"mode": h.predict}))
        extra = {"mode": h.predict} | (self._zeroshot_settings() if h.predict == "zeroshot" else {})
        return self._loader(self._images(), _WithSettings(extra))
