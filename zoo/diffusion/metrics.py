"""Image features for a Fréchet distance (Heusel et al. 2017) that needs no Inception weights.

FID takes the features from an ImageNet Inception-v3, which needs its weights file. Always available
offline instead: the features of a classifier the zoo trained on the same data (the input of its last
linear layer), through ``ClassifierFeatures``, which torchmetrics' ``FrechetInceptionDistance`` takes as its
feature extractor (``callbacks.FrechetDistance``, which loads the classifier: this family knows no other). Its
numbers are not FID's and compare only between runs
that use the same classifier checkpoint, but they fall as samples approach the data just the same.

Notation: B images, F feature width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ClassifierFeatures(nn.Module):
    """Images in [-1, 1] (B, C, H, W) -> the (B, F) input of a classifier's last linear layer."""

    def __init__(self, net: nn.Module, mean: tuple[float, ...] = (0.5,), std: tuple[float, ...] = (0.5,)) -> None:
        """
        Args:
            net: a trained classifier (any zoo image net); frozen and kept in eval mode.
            mean: per-channel mean the classifier's training data was standardised with.
            std: per-channel std; with ``mean`` (0.5,) these say the classifier saw images in [-1, 1].
        """
        super().__init__()
        self.net = net.eval().requires_grad_(False)
        linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise ValueError(f"{type(net).__name__} has no linear layer whose input could serve as features")
        self.num_features = linears[-1].in_features  # F, which torchmetrics' FID sizes its statistics by
        self._features: Tensor | None = None
        linears[-1].register_forward_pre_hook(self._grab)
        self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(-1, 1, 1), persistent=False)

    def _grab(self, module: nn.Module, args: tuple[Tensor, ...]) -> None:
        self._features = args[0]

    def train(self, mode: bool = True) -> ClassifierFeatures:
        return super().train(False)  # batch-norm statistics stay the classifier's

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        x = ((images + 1) / 2 - self.mean) / self.std  # [-1, 1] -> the classifier's standardisation
        self.net(x)
        return self._features.flatten(1).float()  # (B, F)
