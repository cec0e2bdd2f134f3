"""The denoising objective (Ho et al. 2020, eq. 14 "L_simple"), for eps, v or x0 nets, optionally min-SNR weighted.

Notation: B batch, T training steps; x0 (B, C, H, W) clean data in [-1, 1].
"""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.diffusion.samplers import Denoiser
from zoo.diffusion.schedule import NoiseSchedule, Prediction


def denoising_loss(
    model: Denoiser,
    schedule: NoiseSchedule,
    x0: Tensor,
    y: Tensor | None,
    prediction: Prediction = "eps",
    min_snr_gamma: float | None = None,
    t: Tensor | None = None,
    noise: Tensor | None = None,
) -> dict[str, Tensor]:
    """E_{t, eps} w(t) || net(x_t, t, y) - target ||^2, t ~ U{0..T-1}, eps ~ N(0, I) unless given.

    Returns "loss" (weighted, what is optimised) and "mse" (unweighted, comparable across weightings).
    Giving ``t`` and ``noise`` fixes the draw, as validation does so its loss compares across epochs.
    """
    b = x0.shape[0]
    if t is None:
        t = torch.randint(0, schedule.num_timesteps, (b,), device=x0.device)
    if noise is None:
        noise = torch.randn_like(x0)
    x_t = schedule.add_noise(x0, noise, t)
    target = schedule.target(x0, noise, t, prediction)
    per_example = (model(x_t, t, y).float() - target.float()).pow(2).flatten(1).mean(1)  # (B,)
    out = {"mse": per_example.mean()}
    if min_snr_gamma is not None:
        per_example = per_example * schedule.min_snr_weight(t, prediction, min_snr_gamma)
    out["loss"] = per_example.mean()
    return out
