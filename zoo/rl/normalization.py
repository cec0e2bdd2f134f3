"""Running mean and variance kept as module buffers, so a checkpoint carries them with the weights.

Observation normalisation and reward scaling as in OpenAI Baselines' ``VecNormalize`` (also SB3's and
gymnasium's ``NormalizeObservation``/``NormalizeReward``), but with the statistics in the agent's
``state_dict`` rather than in an environment wrapper: an agent loaded from its checkpoint sees its inputs
exactly as it did in training. Batches merge with Chan et al.'s parallel algorithm (1979).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.rl.distributed import sum_over_ranks


class RunningMeanStd(nn.Module):
    """Mean and variance of everything passed to ``update`` (float64 buffers), over leading dims."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4, clip: float = 10.0) -> None:
        """
        Args:
            shape: shape of one sample (``()`` for scalars such as returns).
            epsilon: initial pseudo-count (Baselines' value), so the first update does not divide by zero.
            clip: ``normalize`` and ``scale`` clip their output to [-clip, clip].
        """
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merge a batch (..., *shape) into the statistics. Under DDP the batch is every rank's rows together, so
        the ranks keep equal statistics: a collective, which every rank calls (``zoo.rl.distributed``)."""
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        # Count and sum first, then the squared deviations from that mean: exact, where summing squares is not.
        head = sum_over_ranks(torch.cat([x.new_tensor([x.shape[0]]), x.sum(0).flatten()]))
        n = head[0].item()
        if n == 0:
            return
        batch_mean = (head[1:] / n).view(self.mean.shape)
        batch_var = sum_over_ranks((x - batch_mean).square().sum(0)) / n
        delta = batch_mean - self.mean
        total = self.count + n
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: Tensor, eps: float = 1e-8) -> Tensor:
        """(x - mean) / std, clipped; in ``x``'s dtype."""
        y = (x - self.mean) / (self.var + eps).sqrt()
        return y.clamp(-self.clip, self.clip).to(x.dtype)

    def scale(self, x: Tensor, eps: float = 1e-8) -> Tensor:
        """x / std, clipped, without centring (rewards: their sign carries meaning)."""
        return (x / (self.var + eps).sqrt()).clamp(-self.clip, self.clip).to(x.dtype)
