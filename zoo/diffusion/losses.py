"""The objectives' terms as pure functions returning dict[str, Tensor] with a "loss" key; the objective classes
(``zoo.diffusion.objective``) hold the settings and call them.

The denoising objective (Ho et al. 2020, eq. 14 "L_simple"), for eps, v or x0 nets, optionally min-SNR
weighted; for nets that also output a variance, the hybrid L_simple + lambda L_vlb of Nichol & Dhariwal 2021
("Improved DDPM", sec. 3.1), with the variational bound's terms as pure functions:

    L_vlb = L_0 + sum_{t>1} L_{t-1} (+ L_T, constant, left out)      (Ho et al. eq. 5)
    L_{t-1} = KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t))         ``normal_kl``
    L_0 = -log p(x_0 | x_1), a Gaussian integrated over 8-bit bins  ``discretized_gaussian_log_likelihood``

Nats are turned into bits per dimension (divided by log 2 and averaged over pixels), as the papers report.

Conditional flow matching on the linear path (Liu et al. 2023; Lipman et al. 2023; SD3, Esser et al. 2024, sec. 2),
t in [0, 1], t = 0 the data: x_t = (1 - t) x_0 + t eps, velocity v = eps - x_0, E || v_theta(x_t, t, y) - v ||^2.

Notation: B batch, C channels, T training steps; x0 (B, C, H, W) clean data in [-1, 1]; t (B,) step indices
(the denoising objective) or times in [0, 1] (flow matching).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from zoo.diffusion.samplers import Denoiser, split_variance
from zoo.diffusion.schedule import NoiseSchedule, Prediction
from zoo.errors import InputError


def normal_kl(mean1: Tensor, logvar1: Tensor, mean2: Tensor, logvar2: Tensor) -> Tensor:
    """KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)) per element, in nats; arguments broadcast."""
    return 0.5 * (logvar2 - logvar1 - 1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2).pow(2) * torch.exp(-logvar2))


def discretized_gaussian_log_likelihood(x: Tensor, mean: Tensor, log_scale: Tensor) -> Tensor:
    """log P(x) per element of 8-bit data x in [-1, 1] under N(mean, e^(2 log_scale)) integrated over x's bin.

    The 256 bins are 2/255 wide around the levels -1, ..., 1; the two end bins reach out to -inf and +inf,
    so the probabilities of the 256 levels sum to 1 (Ho et al. 2020, eq. 13). The reference code
    (improved-diffusion, DiT) uses a tanh approximation of the normal CDF; this uses the exact one.
    """
    inv_std = torch.exp(-log_scale)
    upper, lower = inv_std * (x - mean + 1 / 255), inv_std * (x - mean - 1 / 255)  # bin edges, standardised
    # Difference of CDFs from the nearer tail: two CDFs close to 1 would cancel to 0 in float32.
    mass = torch.where(
        lower > 0,
        torch.special.ndtr(-lower) - torch.special.ndtr(-upper),
        torch.special.ndtr(upper) - torch.special.ndtr(lower),
    )
    log_mid = mass.clamp(min=1e-12).log()
    return torch.where(
        x < -0.999,
        torch.special.log_ndtr(upper),  # P(X < upper): the lowest bin extends to -inf
        torch.where(x > 0.999, torch.special.log_ndtr(-lower), log_mid),  # P(X > lower): the highest, to +inf
    )


def vlb_terms(
    schedule: NoiseSchedule, x0: Tensor, x_t: Tensor, t: Tensor, prediction: Tensor, v: Tensor, kind: Prediction
) -> Tensor:
    """(B,) L_{t-1} in bits/dim: the KL of the true and the model's reverse steps, the decoder NLL at t = 0.

    The model's reverse step p(x_{t-1} | x_t) = N(mu-tilde_t(x_t, x0-hat), Sigma_theta): the posterior mean
    at the net's x0-hat (from ``prediction`` of type ``kind``) and the learned variance of its ``v``.
    """
    true_mean, _, true_log_var = schedule.q_posterior(x0, x_t, t)
    x0_hat, _ = schedule.to_x0_eps(prediction, x_t, t, kind)
    model_mean, _, _ = schedule.q_posterior(x0_hat, x_t, t)
    model_log_var = schedule.model_log_variance(v, t)
    kl = normal_kl(true_mean, true_log_var, model_mean, model_log_var).flatten(1).mean(1)
    nll = -discretized_gaussian_log_likelihood(x0, model_mean, 0.5 * model_log_var).flatten(1).mean(1)
    return torch.where(t == 0, nll, kl) / math.log(2)


def denoising_loss(
    model: Denoiser,
    schedule: NoiseSchedule,
    x0: Tensor,
    y: Tensor | None,
    prediction: Prediction = "eps",
    min_snr_gamma: float | None = None,
    t: Tensor | None = None,
    noise: Tensor | None = None,
    vlb_weight: float = 0.001,
) -> dict[str, Tensor]:
    """E_{t, eps} w(t) || net(x_t, t, y) - target ||^2, t ~ U{0..T-1}, eps ~ N(0, I) unless given.

    Returns "loss" (weighted, what is optimised) and "mse" (unweighted, comparable across weightings).
    Giving ``t`` and ``noise`` fixes the draw, as validation does so its loss compares across epochs.

    A net that returns 2C channels (prediction, then variance v) also gets "vlb": the bound L_vlb in
    bits/dim estimated as T L_{t-1} at each example's t (the prior term L_T, ~0, left out), and "loss" adds
    ``vlb_weight`` times it (lambda = 0.001 in Nichol & Dhariwal). The prediction enters L_vlb detached, so
    L_vlb trains only the variance and L_simple alone the mean (their sec. 3.1).
    """
    b = x0.shape[0]
    if t is None:
        t = torch.randint(0, schedule.num_timesteps, (b,), device=x0.device)
    if noise is None:
        noise = torch.randn_like(x0)
    x_t = schedule.add_noise(x0, noise, t)
    target = schedule.target(x0, noise, t, prediction)
    output, v = split_variance(model(x_t, t, y).float(), x_t)
    per_example = (output - target.float()).pow(2).flatten(1).mean(1)  # (B,)
    out = {"mse": per_example.mean()}
    if min_snr_gamma is not None:
        per_example = per_example * schedule.min_snr_weight(t, prediction, min_snr_gamma)
    out["loss"] = per_example.mean()
    if v is not None:
        terms = vlb_terms(schedule, x0.float(), x_t.float(), t, output.detach(), v, prediction)
        out["vlb"] = schedule.num_timesteps * terms.mean()
        out["loss"] = out["loss"] + vlb_weight * out["vlb"]
    return out


def flow_path(x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
    """x_t = (1 - t) x_0 + t eps, t (B,) broadcast over x0's other dimensions."""
    t = t.view(-1, *([1] * (x0.ndim - 1))).to(x0.dtype)
    return (1 - t) * x0 + t * noise


def flow_velocity(x0: Tensor, noise: Tensor) -> Tensor:
    """The velocity dx_t / dt = eps - x_0 a flow net learns to predict."""
    return noise - x0


def flow_matching_loss(model: Denoiser, x0: Tensor, y: Tensor | None, t: Tensor, noise: Tensor) -> dict[str, Tensor]:
    """E_{t, eps} || model(x_t, t, y) - (eps - x_0) ||^2 at the given times and noise; "loss" and "mse" (the same:
    unweighted)."""
    output = model(flow_path(x0, noise, t), t, y).float()
    if output.shape[1] != x0.shape[1]:
        raise InputError(
            f"the net returns {output.shape[1]} channels for {x0.shape[1]}-channel images: a flow-matching net "
            "predicts the velocity alone (set learn_sigma: false)"
        )
    mse = (output - flow_velocity(x0, noise).float()).pow(2).mean()
    return {"loss": mse, "mse": mse}
