"""An in-memory image dataset that hands out whole batches, with batch-wise shift/flip augmentation.

Small datasets (MNIST, digits, generated shapes) fit in memory as one normalised tensor. Indexing
that tensor once per batch, instead of once per item followed by a collate, makes loading cost
next to nothing with ``num_workers=0``. The DataLoader calls ``__getitems__`` with a batch of
indices when it exists; ``collate_batch`` then passes the ready batch through.

Notation: N items, B batch, C channels, H/W height/width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset


def random_shift(images: Tensor, max_shift: int, fill: float) -> Tensor:
    """Translate each image of (B, C, H, W) by its own random offset in [-max_shift, max_shift]."""
    b, _, h, w = images.shape
    p = max_shift
    padded = F.pad(images, (p, p, p, p), value=fill)  # (B, C, H + 2p, W + 2p)
    dy = torch.randint(0, 2 * p + 1, (b, 1, 1))
    dx = torch.randint(0, 2 * p + 1, (b, 1, 1))
    rows = dy + torch.arange(h).view(1, h, 1)  # (B, H, 1)
    cols = dx + torch.arange(w).view(1, 1, w)  # (B, 1, W)
    crops = padded.permute(0, 2, 3, 1)[torch.arange(b).view(b, 1, 1), rows, cols]  # (B, H, W, C)
    return crops.permute(0, 3, 1, 2).contiguous()


def random_hflip(images: Tensor) -> Tensor:
    """Mirror a random half of the (B, C, H, W) batch left-right."""
    flip = torch.rand(images.shape[0]) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)


class TensorImageDataset(Dataset):
    """(image, label) pairs from an (N, C, H, W) float tensor already normalised, and (N,) int64 labels."""

    def __init__(
        self, images: Tensor, labels: Tensor, max_shift: int = 0, hflip: bool = False, fill: float = 0.0
    ) -> None:
        if images.ndim != 4 or len(images) != len(labels):
            raise ValueError(
                f"need (N, C, H, W) images and (N,) labels, got {tuple(images.shape)}, {tuple(labels.shape)}"
            )
        self.images = images.float()
        self.labels = labels.long()
        self.max_shift, self.hflip, self.fill = max_shift, hflip, fill

    def __len__(self) -> int:
        return len(self.labels)

    def augment(self, images: Tensor) -> Tensor:
        # Uses the global RNG, which the DataLoader seeds per worker, so workers draw different shifts.
        if self.max_shift > 0:
            images = random_shift(images, self.max_shift, self.fill)
        if self.hflip:
            images = random_hflip(images)
        return images

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.augment(self.images[idx]), self.labels[idx]  # (B, C, H, W), (B,)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        images, labels = self.__getitems__([i])
        return images[0], labels[0]

    @staticmethod
    def collate_batch(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """The batch is already stacked by ``__getitems__``; a module-level callable so workers can pickle it."""
        return batch
