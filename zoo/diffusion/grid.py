"""Image batches in [-1, 1] as one grid image, for the MLflow artifacts of validation samples."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def image_grid(images: Tensor, nrow: int | None = None, padding: int = 2):
    """(B, C, H, W) in [-1, 1] -> a PIL image of the batch tiled nrow per row (default: a square)."""
    from PIL import Image
    from torchvision.utils import make_grid

    nrow = nrow or math.ceil(math.sqrt(len(images)))
    grid = make_grid(images.detach().float().cpu().clamp(-1, 1) * 0.5 + 0.5, nrow=nrow, padding=padding)  # (3, H', W')
    array = (grid * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
