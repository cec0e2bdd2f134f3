"""Shapes: a generated image data set with labels and captions, rendered from a seed, needing no files.

Each image holds one coloured shape (circle, square, triangle, cross, diamond, ring) of a random
size and position on a noisy tinted background; the label is the shape, and a caption says what is
drawn ("a small red circle in the top left"). Small shapes at low resolution under noise make the
classes learnable yet not trivial, and the captions give the diffusion and CLIP families paired
image-text data that runs anywhere. Rendering is vectorised: per chunk of images, a signed distance
to each shape is evaluated on a coordinate grid, so the only Python loop is over the six shapes.

Notation: N images, B chunk, C channels (RGB), S image side; u/v are pixel offsets from the shape's
centre in units of its radius r.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.data import Dataset

from datamodules.base import ImageDataModule, check_settings
from datamodules.tensor_dataset import TensorImageDataset


def _circle(u: Tensor, v: Tensor) -> Tensor:
    return (u**2 + v**2).sqrt() - 1.0


def _square(u: Tensor, v: Tensor) -> Tensor:
    return torch.maximum(u.abs(), v.abs()) - 0.8


def _triangle(u: Tensor, v: Tensor) -> Tensor:
    # Equilateral, apex up (image v grows downwards): the largest of the three edge distances.
    c, s, inradius = math.cos(math.pi / 6), 0.5, 0.55
    return torch.stack([v, c * u - s * v, -c * u - s * v]).amax(0) - inradius


def _cross(u: Tensor, v: Tensor) -> Tensor:
    au, av, half_width = u.abs(), v.abs(), 0.3
    return torch.minimum(torch.maximum(au - half_width, av - 1.0), torch.maximum(av - half_width, au - 1.0))


def _diamond(u: Tensor, v: Tensor) -> Tensor:
    return (u.abs() + v.abs() - 1.1) / math.sqrt(2.0)


def _ring(u: Tensor, v: Tensor) -> Tensor:
    return ((u**2 + v**2).sqrt() - 0.7).abs() - 0.3


# Signed distance (negative inside) in units of the radius, one per class, in class-index order.
SHAPES = {
    "circle": _circle,
    "square": _square,
    "triangle": _triangle,
    "cross": _cross,
    "diamond": _diamond,
    "ring": _ring,
}
COLOURS = {
    "red": (0.90, 0.10, 0.10),
    "green": (0.10, 0.75, 0.20),
    "blue": (0.15, 0.30, 0.95),
    "yellow": (0.95, 0.90, 0.10),
    "magenta": (0.90, 0.15, 0.85),
    "cyan": (0.10, 0.85, 0.90),
    "orange": (1.00, 0.55, 0.05),
    "white": (0.97, 0.97, 0.97),
}
SIZES = ("small", "medium", "large")
# 3x3 grid of the image, row-major from the top left.
POSITIONS = (
    "in the top left", "at the top", "in the top right",
    "on the left", "in the center", "on the right",
    "in the bottom left", "at the bottom", "in the bottom right",
)  # fmt: skip
RADIUS_RANGE = (0.12, 0.32)  # shape radius as a fraction of the image side


def _render(shape: Tensor, rgb: Tensor, center: Tensor, radius: Tensor, background: Tensor, noise: Tensor) -> Tensor:
    """Draw one shape per image onto its background: (B,) ids, (B, 3) colours, (B, 2) xy, (B,) radii -> (B, 3, S, S)."""
    s = background.shape[-1]
    grid = torch.arange(s, dtype=torch.float32) + 0.5  # pixel centres
    u = (grid.view(1, 1, s) - center[:, 0].view(-1, 1, 1)) / radius.view(-1, 1, 1)  # (B, 1, S)
    v = (grid.view(1, s, 1) - center[:, 1].view(-1, 1, 1)) / radius.view(-1, 1, 1)  # (B, S, 1)
    u, v = torch.broadcast_tensors(u, v)  # (B, S, S)
    distance = torch.empty_like(u)
    for k, sdf in enumerate(SHAPES.values()):
        sel = shape == k
        distance[sel] = sdf(u[sel], v[sel]) * radius[sel].view(-1, 1, 1)  # in pixels
    alpha = (0.5 - distance).clamp(0.0, 1.0).unsqueeze(1)  # (B, 1, S, S): one-pixel anti-aliased edge
    image = background * (1 - alpha) + rgb.view(-1, 3, 1, 1) * alpha
    return (image + noise).clamp(0.0, 1.0)


class ShapesDataset(Dataset):
    """``num_images`` rendered shapes; item i is (image (3, S, S) in [0, 1], label), with ``caption(i)``.

    The same ``seed`` gives identical tensors and captions on any machine (CPU generator only).
    """

    class_names = list(SHAPES)
    colour_names = list(COLOURS)

    def __init__(self, num_images: int, image_size: int = 32, seed: int = 0, chunk_size: int = 4096) -> None:
        """
        Args:
            num_images: how many images to render.
            image_size: side S of the square RGB images.
            seed: seed of every random choice (shape, colour, size, position, background, noise).
            chunk_size: images rendered per vectorised step (bounds peak memory, not the result).
        """
        g = torch.Generator().manual_seed(seed)
        n, s = num_images, image_size
        self.labels = torch.randint(len(SHAPES), (n,), generator=g)
        self.colours = torch.randint(len(COLOURS), (n,), generator=g)
        lo, hi = RADIUS_RANGE
        size_u = torch.rand(n, generator=g)
        self.radii = (lo + (hi - lo) * size_u) * s
        self.sizes = (size_u * len(SIZES)).long().clamp(max=len(SIZES) - 1)
        self.centers = self.radii.unsqueeze(1) + torch.rand(n, 2, generator=g) * (s - 2 * self.radii).unsqueeze(
            1
        )  # (N, 2) xy
        cell = (self.centers / s * 3).long().clamp(0, 2)
        self.positions = cell[:, 1] * 3 + cell[:, 0]
        palette = torch.tensor(list(COLOURS.values()))
        rgb = (palette[self.colours] + 0.08 * (torch.rand(n, 3, generator=g) - 0.5)).clamp(0, 1)  # (N, 3) jittered
        tint = 0.5 * torch.rand(n, 3, 1, 1, generator=g)  # dim backgrounds so bright shapes stay visible
        self.images = torch.empty(n, 3, s, s)
        for a in range(0, n, chunk_size):
            b = min(a + chunk_size, n)
            noise = 0.06 * torch.randn(b - a, 3, s, s, generator=g)
            background = tint[a:b].expand(-1, -1, s, s)
            self.images[a:b] = _render(
                self.labels[a:b], rgb[a:b], self.centers[a:b], self.radii[a:b], background, noise
            )
        self.captions = [
            f"a {SIZES[z]} {self.colour_names[c]} {self.class_names[k]} {POSITIONS[p]}"
            for k, c, z, p in zip(
                self.labels.tolist(), self.colours.tolist(), self.sizes.tolist(), self.positions.tolist()
            )
        ]

    def caption(self, i: int) -> str:
        """What image i shows, e.g. "a small red circle in the top left"."""
        return self.captions[i]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.images[i], self.labels[i]


class ShapesDataModule(ImageDataModule):
    """Generated shapes classified by shape; images scaled to [-1, 1]; three splits from three derived seeds."""

    def __init__(
        self,
        batch_size: int = 64,
        image_size: int = 32,
        num_train: int = 10000,
        num_val: int = 2000,
        num_test: int = 2000,
        augment: bool = False,
        seed: int = 0,
        **loader,
    ) -> None:
        """
        Args:
            batch_size: images per batch.
            image_size: side of the square RGB images.
            num_train: training images to render.
            num_val: validation images to render.
            num_test: test (and predict) images to render.
            augment: random shifts of up to image_size/8 pixels and horizontal flips of training images.
            seed: seed of the rendering (split k uses 3*seed+k, so splits never share images) and of shuffling.
            **loader: DataLoader settings (num_workers, pin_memory, persistent_workers) of ``ImageDataModule``.
        """
        super().__init__(batch_size, seed, **loader)
        check_settings(at_least=1, image_size=image_size, num_train=num_train)
        check_settings(at_least=0, num_val=num_val, num_test=num_test)
        self.save_hyperparameters()
        self.image_size, self.augment = image_size, augment
        self.split_sizes = {"train": num_train, "val": num_val, "test": num_test}
        self.num_classes = len(SHAPES)
        self.image_shape = (3, image_size, image_size)
        self.class_names = list(SHAPES)
        self.normalization = ((0.5,) * 3, (0.5,) * 3)  # [0, 1] -> [-1, 1]
        self.collate_fn = TensorImageDataset.collate_batch
        self.shapes: dict[str, ShapesDataset] = {}  # the raw splits, for captions and attributes

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        for k, (split, n) in enumerate(self.split_sizes.items()):
            self.shapes[split] = ShapesDataset(n, self.image_size, seed=3 * self.seed + k)
        # [0, 1] -> [-1, 1]: zero-centred like the other modules, and the range diffusion models expect.
        scaled = {split: (d.images - 0.5) / 0.5 for split, d in self.shapes.items()}
        shift = self.image_size // 8 if self.augment else 0
        self.train_set = TensorImageDataset(
            scaled["train"], self.shapes["train"].labels, max_shift=shift, hflip=self.augment
        )
        self.val_set = TensorImageDataset(scaled["val"], self.shapes["val"].labels)
        self.test_set = TensorImageDataset(scaled["test"], self.shapes["test"].labels)
