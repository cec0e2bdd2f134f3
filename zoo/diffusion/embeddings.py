"""Conditioning embeddings both denoisers share: the diffusion step and the class label.

Notation: B batch, D embedding width, K classes (label K is the null class of classifier-free guidance).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10000.0, freq_shift: float = 0.0) -> Tensor:
    """Sinusoidal features of the step (Vaswani et al. 2017, as used by Ho et al. 2020): (B,) -> (B, dim).

    Half the features are cos, half sin, of t at the frequencies max_period^(-i / (half - freq_shift)),
    i < half (the cos-first order of the DiT and ADM code, so their weights load unchanged). DiT and ADM
    use freq_shift 0; diffusers' DiTTransformer2DModel uses 1 (``downscale_freq_shift=1``).
    """
    half = dim // 2
    i = torch.arange(half, dtype=torch.float32, device=t.device)
    freqs = torch.exp(-math.log(max_period) * i / (half - freq_shift))
    args = t.float()[:, None] * freqs[None]  # (B, half)
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class TimestepEmbedder(nn.Module):
    """Step t -> sinusoidal features -> MLP(Linear, SiLU, Linear): (B,) -> (B, D)."""

    def __init__(self, dim: int, frequency_dim: int = 256, freq_shift: float = 0.0) -> None:
        super().__init__()
        self.frequency_dim, self.freq_shift = frequency_dim, freq_shift
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t, self.frequency_dim, freq_shift=self.freq_shift))


class LabelEmbedder(nn.Module):
    """Class label -> learned vector, with one extra row (index ``num_classes``) for "no label".

    Training replaces a fraction of the labels by the null one (the module's ``label_dropout``), so
    the same net is also the unconditional model that classifier-free guidance subtracts.
    """

    def __init__(self, num_classes: int, dim: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, y: Tensor) -> Tensor:
        return self.embedding_table(y)  # (B, D)
