"""Image-caption pairs for the CLIP family, with what zero-shot evaluation and prediction need.

Sources:
  * nothing (the default): the zoo's generated shapes (``ShapesDataset``), captioned with what each
    image shows ("a small red circle in the top left"); labelled by shape, so zero-shot
    classification against the shape names is meaningful. Needs no files.
  * a CSV or JSONL file with an image path and a caption per row (paths relative to the file), and
    optionally a label column for zero-shot accuracy;
  * a folder of images, each with a caption in a ``.txt`` file of the same name beside it.

Captions are tokenised once at setup into a (N, T) id tensor: the tokenizer's ids cut to T - 1, then
its end-of-text id, padded with it (the text tower reads the first one, and its causal mask keeps the
padding from reaching it). Batches are dicts: ``image`` (B, C, H, W), ``text`` (B, T), ``label`` (B,)
(-1 where unknown), ``image_id`` (B,), equal for the rows of one image file (COCO and Flickr30k give five
captions per image), and ``caption_id`` (B,), equal for equal captions: retrieval ranks each image once
and counts every caption of it, and any image of the same caption text, as a hit (``zoo.clip.metrics``).
A held-out split from ``val_fraction`` takes whole images, all their captions with them.

Predict batches carry what to do, set here on the command line, because LightningCLI replaces the
model's arguments with the checkpoint's at ``predict --ckpt_path`` (as ``TextDataModule`` does):
``zeroshot`` (classify images against ``class_names`` x ``templates``), ``image_embeddings`` or
``text_embeddings``, over ``predict_path`` (a folder of images, a CSV/JSONL, or one image) or the
held-out split.

Notation: N pairs, B batch, T context length, K classes, P templates.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, default_collate

from datamodules.base import (
    EpochShuffle,
    ResumesMidEpoch,
    check_settings,
    not_found_message,
    split_indices,
    training_loader,
)
from datamodules.image_files import OnUnreadable, open_image, readable_images
from datamodules.shapes import COLOURS, POSITIONS, SIZES, ShapesDataset
from datamodules.text_corpus import read_utf8
from zoo.errors import InputError
from zoo.io.new_inputs import image_inputs, image_transform, prompt
from zoo.io.tokenizers import BPETokenizer, ByteTokenizer, Tokenizer, tokenize

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's pixel statistics
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")
# Every caption the shapes grammar can produce, with the shape left open: averaging a class's text
# embeddings over all of them marginalises colour, size and position (CLIP's prompt ensembling, sec. 3.1.4).
SHAPES_TEMPLATES = [f"a {z} {c} {{}} {p}" for z in SIZES for c in COLOURS for p in POSITIONS]
GENERIC_TEMPLATES = ["a photo of a {}.", "a picture of a {}.", "{}"]
Predict = Literal["zeroshot", "image_embeddings", "text_embeddings"]


def read_pairs(path: Path, image_column: str, caption_column: str, label_column: str | None) -> dict[str, list]:
    """``{"images": [Path], "captions": [str], "labels": [str] | None}`` from a CSV, a JSONL or a folder."""
    if path.is_dir():
        return _folder_pairs(path)
    text = read_utf8(path)
    if path.suffix.lower() == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            try:
                rows += [json.loads(line)] if line.strip() else []
            except (json.JSONDecodeError, RecursionError) as e:  # a line [[[[...]]]] nested past the limit
                why = getattr(e, "msg", "nested deeper than Python parses")
                raise InputError(f"{path}:{n} is not a JSON line ({why}): fix the line") from None
    elif path.suffix.lower() in (".csv", ".tsv"):
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        rows = list(csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter))
    else:
        raise InputError(
            f"{str(path)!r}: expected a .csv, .tsv or .jsonl file, or a folder of images with .txt captions"
        )
    if not rows:
        raise InputError(f"{str(path)!r} holds no rows: pass a file with a header and at least one row")
    wanted = [("image_column", image_column), ("caption_column", caption_column)]
    wanted += [("label_column", label_column)] if label_column else []
    for setting, column in wanted:
        columns = sorted(rows[0]) if isinstance(rows[0], dict) else type(rows[0]).__name__
        if not isinstance(rows[0], dict) or column not in rows[0]:
            raise InputError(
                f"{str(path)!r} has no column {column!r} (it has {columns}): pass "
                f"--data.init_args.{setting}=<one of its columns>, or add the column"
            )
    root = path.parent
    return {
        "images": [root / str(r[image_column]) for r in rows],
        "captions": [str(r[caption_column]) for r in rows],
        "labels": [str(r[label_column]) for r in rows] if label_column else None,
    }


def _folder_pairs(folder: Path) -> dict[str, list]:
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    paired = [p for p in images if p.with_suffix(".txt").is_file()]
    if not paired:
        raise FileNotFoundError(
            not_found_message(
                "images with .txt captions beside them",
                str(folder),
                "put <name>.txt next to each <name>.png/.jpg, or pass a CSV/JSONL",
            )
        )
    if len(paired) < len(images):
        skipped = len(images) - len(paired)
        warnings.warn(f"{skipped} images in {str(folder)!r} have no .txt caption and are skipped", stacklevel=2)
    return {
        "images": paired,
        "captions": [p.with_suffix(".txt").read_text("utf-8").strip() for p in paired],
        "labels": None,
    }


def list_images(path: Path, image_column: str) -> list[Path]:
    """Images to predict on: one image file, every image under a folder, or a CSV/JSONL's image column."""
    if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if path.is_file():
        return read_pairs(path, image_column, image_column, None)["images"]
    raise FileNotFoundError(
        not_found_message(
            "images",
            str(path),
            "pass data.init_args.predict_path=<an image, a folder of images, or a CSV/JSONL with an image column>",
        )
    )


def caption_groups(captions: Sequence) -> Tensor:
    """(N,) ids equal exactly for equal captions (or any equal hashable values, such as image paths)."""
    first: dict = {}
    return torch.tensor([first.setdefault(c, len(first)) for c in captions], dtype=torch.long)


def split_by_image(images: Sequence, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) row indices holding out ``val_fraction`` of the unique images with every caption row of each.

    A row split would put some captions of an image in training and the rest in validation. With one row
    per image this is the row split of ``split_indices``.
    """
    ids = caption_groups(images)  # (N,) image of each row
    n = int(ids.max()) + 1 if len(ids) else 0
    train_images, val_images = split_indices(n, val_fraction, seed)
    place = torch.empty(n, dtype=torch.long)
    place[torch.tensor(train_images + val_images, dtype=torch.long)] = torch.arange(n)  # image -> place in the split
    rows = place[ids].argsort(stable=True)  # rows in their images' order, the captions of an image together
    n_train = int((place[ids] < len(train_images)).sum())
    return rows[:n_train].tolist(), rows[n_train:].tolist()


class CaptionPairs(Dataset):
    """Items are dicts of ``image``, ``text`` ids, ``label``, ``image_id``, ``caption_id`` and ``index`` (and ``path``
    for files).

    Images are either one normalised in-memory (N, C, H, W) tensor, fetched a batch at a time (each row its
    own image), or files opened and transformed per item (in DataLoader workers; rows of one file share
    an ``image_id``).
    """

    def __init__(
        self, images: Tensor | list[Path], text: Tensor, labels: Tensor, captions: list[str], transform=None
    ) -> None:
        self.images, self.text, self.labels, self.captions, self.transform = images, text, labels, captions, transform
        self.caption_ids = caption_groups(captions) if captions else torch.zeros(len(labels), dtype=torch.long)
        self.image_ids = torch.arange(len(labels)) if isinstance(images, Tensor) else caption_groups(images)

    def __len__(self) -> int:
        return len(self.labels)

    def _fields(self, idx: Tensor) -> dict:
        return {
            "text": self.text[idx],
            "label": self.labels[idx],
            "image_id": self.image_ids[idx],
            "caption_id": self.caption_ids[idx],
            "index": idx,
        }

    def __getitems__(self, indices: list[int]) -> dict | list[dict]:
        if not isinstance(self.images, Tensor):
            return [self[i] for i in indices]
        idx = torch.as_tensor(indices, dtype=torch.long)
        return {"image": self.images[idx], **self._fields(idx)}  # already a batch

    def __getitem__(self, i: int) -> dict:
        if isinstance(self.images, Tensor):
            return {"image": self.images[i], **self._fields(torch.tensor(i))}
        image = open_image(self.images[i], "RGB", self.transform)
        return {"image": image, **self._fields(torch.tensor(i)), "path": str(self.images[i])}


class TextsOnly(Dataset):
    """Texts to embed at predict time: their ids and the texts themselves."""

    def __init__(self, texts: list[str], ids: Tensor) -> None:
        self.texts, self.ids = texts, ids

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> dict:
        return {"text": self.ids[i], "caption": self.texts[i]}


def collate(batch: dict | list[dict]) -> dict:
    """In-memory datasets hand over ready batches; file datasets a list of items. Module-level for workers."""
    return batch if isinstance(batch, dict) else default_collate(batch)


class _PredictCollate:
    """Adds the predict settings (and the zero-shot class prompts) to every batch."""

    def __init__(self, extra: dict) -> None:
        self.extra = extra

    def __call__(self, batch: dict | list[dict]) -> dict:
        return {**collate(batch), **self.extra}


class CaptionDataModule(ResumesMidEpoch, LightningDataModule):
    """Image-caption pairs (shapes by default, or a CSV/JSONL/folder) with zero-shot prompts and a held-out split."""

    def __init__(
        self,
        path: str | None = None,
        val_path: str | None = None,
        val_fraction: float = 0.1,
        image_column: str = "image",
        caption_column: str = "caption",
        label_column: str | None = None,
        image_size: int = 224,
        augment: bool = False,
        mean: tuple[float, float, float] = CLIP_MEAN,
        std: tuple[float, float, float] = CLIP_STD,
        tokenizer: Literal["bytes", "bpe", "pretrained"] = "bytes",
        bpe_vocab_size: int = 1024,
        pretrained_tokenizer: str | None = None,
        context_length: int = 77,
        num_train: int = 10000,
        num_val: int = 2000,
        class_names: list[str] | None = None,
        templates: list[str] | None = None,
        predict: Predict = "zeroshot",
        predict_path: str | None = None,
        texts: list[str] | None = None,
        on_unreadable: OnUnreadable = "skip",
        batch_size: int = 128,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
    ) -> None:
        """
        Args:
            path: a .csv/.tsv/.jsonl of (image, caption) rows, or a folder of images with .txt captions;
                None: the generated shapes with their captions.
            val_path: held-out pairs in the same form; None: ``val_fraction`` of ``path`` is held out.
            val_fraction: share of ``path``'s images held out, each with all its captions, when there is no
            ``val_path``.
            image_column: the column (CSV) or field (JSONL) with the image path, relative to the file.
            caption_column: the column or field with the caption.
            label_column: optional column with a class name per row, for zero-shot accuracy at validation.
            image_size: side of the square images the net sees (files: the shorter side resized bicubic, as CLIP's
                preprocessing, then centre-cropped).
            augment: random resized crops of training images from files (the shapes captions name
                positions, so shapes are never cropped).
            mean: per-channel normalisation mean (OpenAI CLIP's by default).
            std: per-channel normalisation std.
            tokenizer: bytes (257 ids, EOS 256), bpe (byte-level BPE trained on the training captions), or
                pretrained (a Hugging Face ``tokenizer.json`` from ``pretrained_tokenizer``, e.g. CLIP's own).
            bpe_vocab_size: vocabulary size of the BPE (tokenizer=bpe).
            pretrained_tokenizer: a ``tokenizer.json`` or a folder holding one, such as a Hugging Face CLIP
                folder (tokenizer=pretrained); it must know ``<|endoftext|>``. Or a SigLIP folder (its
                ``spiece.model``, run as ``SiglipTokenizer`` runs it: ``zoo.io.siglip_tokenizer``).
            context_length: tokens per caption T, end-of-text included; longer captions are cut.
            num_train: shapes: training pairs to render.
            num_val: shapes: held-out pairs to render.
            class_names: zero-shot classes; None: the shape names, or the label column's values (sorted).
            templates: zero-shot prompts with ``{}`` for the class name; None: every shapes caption form,
                or a few generic ones for files.
            predict: predict: zeroshot (classify images), image_embeddings or text_embeddings.
            predict_path: predict: an image, a folder of images or a CSV/JSONL; None: the held-out split.
            texts: predict (text_embeddings): texts to embed; None: the held-out captions.
            on_unreadable: predict: a file under predict_path that is not an image PIL can read: skip it with a
                warning naming it, or error.
            batch_size: pairs per batch (per rank; every rank's pairs are negatives for all the others).
            num_workers: DataLoader worker processes (decoding image files is the bottleneck).
            pin_memory: pin batches in page-locked memory for faster host-to-GPU copies.
            seed: seed of the shapes rendering (train 3 x seed, held-out 3 x seed + 1), the split and the shuffling.
        """
        super().__init__()
        check_settings(
            at_least=1, image_size=image_size, batch_size=batch_size, num_train=num_train, bpe_vocab_size=bpe_vocab_size
        )
        check_settings(at_least=2, context_length=context_length)  # a token and the end-of-text
        check_settings(at_least=0, num_val=num_val, num_workers=num_workers)
        check_settings(fraction=True, val_fraction=val_fraction)
        self.save_hyperparameters()
        self.path = Path(path) if path is not None else None
        self.val_path = Path(val_path) if val_path is not None else None
        self.context_length, self.batch_size, self.seed = context_length, batch_size, seed
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.image_shape = (3, image_size, image_size)
        self.normalization = (tuple(mean), tuple(std))
        self.interpolation = "bicubic"  # CLIP's own preprocessing (Radford et al. 2021), which imported weights expect
        # Known now for shapes or when given; read from the label column at setup otherwise.
        self.class_names = (
            list(class_names) if class_names else (list(ShapesDataset.class_names) if path is None else [])
        )
        self.templates = list(templates) if templates else (SHAPES_TEMPLATES if path is None else GENERIC_TEMPLATES)
        self.tokenizer: Tokenizer | None = ByteTokenizer() if tokenizer == "bytes" else None
        self.train_set: CaptionPairs | None = None
        self.val_set: CaptionPairs | None = None

    # -- building the splits -----------------------------------------------------------------------------

    def _transforms(self, train: bool):
        from torchvision import transforms as T

        s, h = self.image_shape[-1], self.hparams
        if train and h.augment:
            crop = T.RandomResizedCrop(s, scale=(0.5, 1.0), interpolation=T.InterpolationMode.BICUBIC)
            return T.Compose([crop, T.ToTensor(), T.Normalize(h.mean, h.std)])
        return image_transform(image_inputs(self), s)[1]

    def _predict_transform(self):
        """New files are read as the model says (imported weights: their source's recipe), else as held-out files."""
        module = self.trainer.lightning_module if self.trainer is not None else None
        inputs = getattr(module, "inputs", None)
        return image_transform(inputs)[1] if inputs else self._transforms(False)

    def _normalise(self, images: Tensor) -> Tensor:
        mean, std = torch.tensor(self.hparams.mean).view(1, 3, 1, 1), torch.tensor(self.hparams.std).view(1, 3, 1, 1)
        return (images - mean) / std

    def _labels(self, names: list[str] | None, n: int, where: str) -> Tensor:
        if names is None:
            return torch.full((n,), -1, dtype=torch.long)
        if not self.class_names:
            self.class_names = sorted(set(names))
        index = {c: k for k, c in enumerate(self.class_names)}
        unknown = sorted(set(names) - index.keys())
        if unknown:
            raise ValueError(f"labels {unknown[:5]} in {where} are not among class_names {self.class_names}")
        return torch.tensor([index[c] for c in names], dtype=torch.long)

    def _fit_tokenizer(self, captions: list[str]) -> None:
        h = self.hparams
        if self.tokenizer is not None:
            return
        if h.tokenizer == "pretrained":
            path = Path(h.pretrained_tokenizer or "")
            if path.is_dir() and (path / "spiece.model").is_file() and not (path / "tokenizer.json").is_file():
                from zoo.io.siglip_tokenizer import SiglipTokenizer  # a SigLIP folder's: it has no tokenizer.json

                self.tokenizer = SiglipTokenizer.from_folder(path)
                return
            if h.pretrained_tokenizer is None or not (path / "tokenizer.json" if path.is_dir() else path).is_file():
                raise FileNotFoundError(
                    not_found_message(
                        "tokenizer.json",
                        str(h.pretrained_tokenizer),
                        "pass data.init_args.pretrained_tokenizer=<a tokenizer.json, a HF CLIP or SigLIP folder>",
                    )
                )
            self.tokenizer = BPETokenizer.load(path)  # any tokenizer.json: the BPE kind carries the whole file
        else:  # bpe: trained on the training captions only, deterministic for the same data
            self.tokenizer = BPETokenizer.train(captions, h.bpe_vocab_size)

    def _shapes_splits(self) -> None:
        h = self.hparams
        splits = {}
        for k, (name, n) in enumerate((("train", h.num_train), ("val", h.num_val))):
            d = ShapesDataset(n, self.image_shape[-1], seed=3 * self.seed + k)
            splits[name] = (self._normalise(d.images), d.captions, d.labels)
        self._fit_tokenizer(splits["train"][1])
        self.train_set, self.val_set = (
            CaptionPairs(images, self.encode(caps), labels, caps) for images, caps, labels in splits.values()
        )

    def _file_splits(self) -> None:
        for p in (self.path, self.val_path):
            if p is not None and not p.exists():
                hint = (
                    "pass data.init_args.path=<a .csv/.jsonl of image,caption rows "
                    "or a folder of images with .txt captions>"
                )
                raise FileNotFoundError(not_found_message("image-caption pairs", str(p), hint))
        h = self.hparams
        pairs = read_pairs(self.path, h.image_column, h.caption_column, h.label_column)
        if self.val_path is not None:
            train_rows, val_rows = list(range(len(pairs["captions"]))), None
            val_pairs = read_pairs(self.val_path, h.image_column, h.caption_column, h.label_column)
        else:
            train_rows, val_rows = split_by_image(pairs["images"], h.val_fraction, self.seed)
            val_pairs = {k: (None if v is None else [v[i] for i in val_rows]) for k, v in pairs.items()}
        train_pairs = {k: (None if v is None else [v[i] for i in train_rows]) for k, v in pairs.items()}
        self._fit_tokenizer(train_pairs["captions"])
        sets = []
        for p, train, where in (
            (train_pairs, True, str(self.path)),
            (val_pairs, False, str(self.val_path or self.path)),
        ):
            labels = self._labels(p["labels"], len(p["captions"]), where)
            sets.append(
                CaptionPairs(p["images"], self.encode(p["captions"]), labels, p["captions"], self._transforms(train))
            )
        self.train_set, self.val_set = sets

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self._shapes_splits() if self.path is None else self._file_splits()

    # -- text ----------------------------------------------------------------------------------------------

    def encode(self, texts: Sequence[str]) -> Tensor:
        """(N, T) ids of ``texts`` with this data's tokenizer and context length."""
        return tokenize(self.tokenizer, texts, self.context_length)

    def zeroshot_prompts(self) -> tuple[list[str], Tensor] | None:
        """The class names and their prompt ids (K x P, T), class-major; None without class names."""
        if not self.class_names:
            return None
        prompts = [prompt(t, c) for c in self.class_names for t in self.templates]
        return self.class_names, self.encode(prompts)

    # -- loaders -------------------------------------------------------------------------------------------

    def _loader(self, dataset: Dataset, shuffle: bool = False, collate_fn=collate) -> DataLoader:
        loader = {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "collate_fn": collate_fn,
            "persistent_workers": self.num_workers > 0,
        }
        if shuffle:
            # Training drops the last partial batch: a handful of pairs is a far easier contrastive task
            # than a full batch, and every rank must gather equal-sized feature blocks.
            return training_loader(
                dataset,
                self.trainer,
                self.batch_size,
                EpochShuffle(len(dataset), self.seed),
                drop_last=True,
                resume_at=self.train_position,
                **loader,
            )
        return DataLoader(dataset, batch_size=self.batch_size, **loader)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def predict_dataloader(self) -> DataLoader:
        h = self.hparams
        mode = {"mode": h.predict}
        if h.predict == "text_embeddings":
            texts = list(h.texts) if h.texts else list(self.val_set.captions)
            return self._loader(TextsOnly(texts, self.encode(texts)), collate_fn=_PredictCollate(mode))
        if h.predict == "zeroshot":
            prompts = self.zeroshot_prompts()
            if prompts is None:
                raise ValueError("zero-shot prediction needs classes: pass --data.init_args.class_names='[cat, dog]'")
            mode |= {"class_names": prompts[0], "class_text": prompts[1]}
        if h.predict_path is None:
            dataset = self.val_set
        else:
            images = list_images(Path(h.predict_path), h.image_column)
            if not images:
                raise FileNotFoundError(
                    not_found_message("images", h.predict_path, "pass an image, a folder or a CSV/JSONL")
                )
            images = readable_images(images, h.on_unreadable)
            dataset = CaptionPairs(
                images,
                torch.zeros(len(images), 1, dtype=torch.long),
                torch.full((len(images),), -1, dtype=torch.long),
                [],
                self._predict_transform(),
            )
        return self._loader(dataset, collate_fn=_PredictCollate(mode))
