"""The noise schedule of a discrete-time diffusion: no learnable parameters, only tensors of scalars.

Forward process (Ho et al. 2020, "Denoising Diffusion Probabilistic Models", eq. 4):
    q(x_t | x_0) = N(sqrt(abar_t) x_0, (1 - abar_t) I),   abar_t = prod_{s<=t} (1 - beta_s)
Schedules: ``linear`` betas (Ho et al. 2020), ``scaled_linear`` betas (linear in sqrt(beta): latent diffusion's,
Rombach et al. 2022) and ``cosine`` abar (Nichol & Dhariwal 2021, "Improved DDPM", eq. 17; diffusers'
``squaredcos_cap_v2``). What the net predicts is a choice of parametrisation, all linear in (x_t, x_0, eps):
eps (Ho et al.), x0, or v = sqrt(abar) eps - sqrt(1 - abar) x_0 (Salimans & Ho 2022, "Progressive
Distillation", sec. 4); ``to_x0_eps`` converts any of them back. ``min_snr_weight`` is the loss
weighting of Hang et al. 2023 ("Efficient Diffusion Training via Min-SNR Weighting").

Posterior q(x_{t-1} | x_t, x_0) = N(mu-tilde_t, beta-tilde_t I) (Ho et al. eq. 6-7) is ``q_posterior``; a net with
learned variance outputs v in [-1, 1] per pixel, read as log Sigma = f log beta_t + (1 - f) log beta-tilde_t,
f = (v + 1) / 2 (Nichol & Dhariwal 2021, eq. 15): ``model_log_variance``.

Indexing: the T steps are 0..T-1 here; index i is the paper's t = i + 1, so ``alphas_cumprod[i]`` is
the paper's abar_{i+1}. Tensors are computed in float64 and kept in float32, on the device given to
``to()`` (they are not an ``nn.Module``'s buffers, so no EMA or checkpoint ever sees them).

Notation: B batch; t (B,) int64 step indices (or one int for the whole batch); x (B, ...) any shape with the batch
first.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

Prediction = Literal["eps", "v", "x0"]


def linear_betas(num_timesteps: int, beta_start: float = 1e-4, beta_end: float = 0.02) -> Tensor:
    """Ho et al. 2020: betas evenly spaced in [beta_start, beta_end] at T = 1000.

    For another T the end points are scaled by 1000 / T (Nichol & Dhariwal's ``get_named_beta_schedule``),
    so abar_T, and thus how close x_T is to pure noise, stays about the same for any T.
    """
    scale = 1000 / num_timesteps
    return torch.linspace(beta_start * scale, beta_end * scale, num_timesteps, dtype=torch.float64)


def scaled_linear_betas(num_timesteps: int, beta_start: float = 0.00085, beta_end: float = 0.012) -> Tensor:
    """Latent diffusion's betas: sqrt(beta) evenly spaced in [sqrt(beta_start), sqrt(beta_end)] at T = 1000, the
    end points scaled by 1000 / T as ``linear_betas``'s (diffusers' ``scaled_linear`` states them at its own T)."""
    scale = 1000 / num_timesteps
    ends = (beta_start * scale) ** 0.5, (beta_end * scale) ** 0.5
    return torch.linspace(*ends, num_timesteps, dtype=torch.float64) ** 2


def cosine_alphas_cumprod(num_timesteps: int, s: float = 0.008) -> Tensor:
    """Nichol & Dhariwal 2021 eq. 17: abar_t = f(t) / f(0), f(t) = cos((t/T + s) / (1 + s) * pi/2)^2, t = 0..T."""
    t = torch.arange(num_timesteps + 1, dtype=torch.float64)
    f = torch.cos((t / num_timesteps + s) / (1 + s) * math.pi / 2) ** 2
    return f / f[0]


def cosine_betas(num_timesteps: int, s: float = 0.008, max_beta: float = 0.999) -> Tensor:
    """beta_t = 1 - abar_t / abar_{t-1}, clipped at ``max_beta`` to avoid the singularity at t = T (eq. 17)."""
    abar = cosine_alphas_cumprod(num_timesteps, s)
    return (1 - abar[1:] / abar[:-1]).clamp(max=max_beta)


def _at(a: Tensor, t: Tensor | int, x: Tensor) -> Tensor:
    """a[t] shaped (B, 1, ..., 1) to broadcast against x (B, ...); a 0-d tensor for one int step."""
    if isinstance(t, int):
        return a[t].to(x.dtype)
    return a[t].view(-1, *([1] * (x.ndim - 1))).to(x.dtype)


def interpolate_log_variance(v: Tensor, log_beta: Tensor | float, log_beta_tilde: Tensor | float) -> Tensor:
    """log Sigma = f log beta_t + (1 - f) log beta-tilde_t, f = (v + 1) / 2: v = 1 is beta_t, v = -1 beta-tilde_t.

    Nichol & Dhariwal 2021 eq. 15: the two bounds of Ho et al. differ little in value but a lot in log
    space at small t, so the net picks a point between them rather than the variance itself.
    """
    frac = (v.float() + 1) / 2
    return frac * log_beta + (1 - frac) * log_beta_tilde


class NoiseSchedule:
    """betas and the products derived from them; ``add_noise`` for training, the same tensors for samplers."""

    kind = "noise_schedule"  # what DDPM, DDIM and DPM-Solver++ draw from (``Sampler.kinds``)

    def __init__(
        self,
        num_timesteps: int = 1000,
        beta_schedule: Literal["linear", "scaled_linear", "cosine"] = "linear",
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        cosine_s: float = 0.008,
    ) -> None:
        """
        Args:
            num_timesteps: T, the number of diffusion steps of training.
            beta_schedule: "linear" (Ho et al. 2020), "scaled_linear" (latent diffusion) or "cosine" (Nichol &
                Dhariwal 2021).
            beta_start: beta_1 of the (scaled) linear schedule at T = 1000.
            beta_end: beta_T of the (scaled) linear schedule at T = 1000.
            cosine_s: offset s of the cosine schedule, so beta_1 is not vanishingly small.
        """
        if num_timesteps < 1:
            raise ValueError(f"num_timesteps must be >= 1, got {num_timesteps}")
        self.num_timesteps, self.beta_schedule = num_timesteps, beta_schedule
        if beta_schedule == "linear":
            betas = linear_betas(num_timesteps, beta_start, beta_end)
        elif beta_schedule == "scaled_linear":
            betas = scaled_linear_betas(num_timesteps, beta_start, beta_end)
        elif beta_schedule == "cosine":
            betas = cosine_betas(num_timesteps, cosine_s)
        else:
            raise ValueError(f"beta_schedule must be 'linear', 'scaled_linear' or 'cosine', got {beta_schedule!r}")
        abar = torch.cumprod(1 - betas, 0)
        abar_prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
        self.betas = betas.float()  # beta_t
        self.alphas_cumprod = abar.float()  # abar_t
        self.alphas_cumprod_prev = abar_prev.float()  # abar_{t-1}, with abar_0 = 1
        # beta-tilde_t, the variance of q(x_{t-1} | x_t, x_0) (Ho et al. eq. 7); 0 at the first step.
        posterior_variance = betas * (1 - abar_prev) / (1 - abar)
        self.posterior_variance = posterior_variance.float()
        # log beta-tilde_t with the first step's 0 replaced by the second step's value (improved-diffusion's
        # "clipped" log variance), so the learned interpolation stays finite at the decoder step t = 1.
        clipped = posterior_variance.clone()
        clipped[0] = posterior_variance[1] if num_timesteps > 1 else betas[0]
        self.posterior_log_variance_clipped = clipped.log().float()
        self.log_betas = betas.log().float()
        # mu-tilde_t = coef1 x_0 + coef2 x_t (Ho et al. eq. 7)
        self.posterior_mean_coef1 = (abar_prev.sqrt() * betas / (1 - abar)).float()
        self.posterior_mean_coef2 = ((1 - betas).sqrt() * (1 - abar_prev) / (1 - abar)).float()
        # The per-step scalars samplers compute with on the host, kept in float64: in float32, 1 - abar_t near the
        # clean end holds only ~3e-4 of its value at beta 1e-4, and the last step divides by it.
        self.host = {
            "abar": abar.tolist(), "beta": betas.tolist(), "log_beta": betas.log().tolist(),
            "log_beta_tilde": clipped.log().tolist(),
        }  # fmt: skip

    def to(self, device: torch.device | str) -> NoiseSchedule:
        """Move every tensor to ``device`` (in place; returns self). A no-op when already there."""
        device = torch.device(device)
        if self.betas.device != device:
            for name, value in vars(self).items():
                if isinstance(value, Tensor):
                    setattr(self, name, value.to(device))
        return self

    @property
    def device(self) -> torch.device:
        return self.betas.device

    # -- training --------------------------------------------------------------------------------------

    def add_noise(self, x0: Tensor, noise: Tensor, t: Tensor | int) -> Tensor:
        """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps: a draw of q(x_t | x_0) (Ho et al. eq. 4)."""
        abar = _at(self.alphas_cumprod, t, x0)
        return abar.sqrt() * x0 + (1 - abar).sqrt() * noise

    def target(self, x0: Tensor, noise: Tensor, t: Tensor | int, prediction: Prediction) -> Tensor:
        """What a net of this ``prediction`` type should output for x_t = add_noise(x0, noise, t)."""
        if prediction == "eps":
            return noise
        if prediction == "x0":
            return x0
        if prediction == "v":
            abar = _at(self.alphas_cumprod, t, x0)
            return abar.sqrt() * noise - (1 - abar).sqrt() * x0
        raise ValueError(f"prediction must be 'eps', 'v' or 'x0', got {prediction!r}")

    def snr(self, t: Tensor) -> Tensor:
        """Signal-to-noise ratio abar_t / (1 - abar_t), (B,)."""
        abar = self.alphas_cumprod[t]
        return abar / (1 - abar)

    def min_snr_weight(self, t: Tensor, prediction: Prediction, gamma: float) -> Tensor:
        """(B,) loss weights of min-SNR-gamma (Hang et al. 2023): min(SNR, gamma) in x0 units.

        The MSE of an eps-net is SNR times the x0 error, and that of a v-net is (SNR + 1) times it,
        so the same weight min(SNR, gamma) on the x0 error reads differently per ``prediction``.
        """
        snr = self.snr(t)
        clipped = snr.clamp(max=gamma)
        return {"eps": clipped / snr, "x0": clipped, "v": clipped / (snr + 1)}[prediction]

    # -- the reverse step's Gaussians ------------------------------------------------------------------

    def q_posterior(self, x0: Tensor, x_t: Tensor, t: Tensor | int) -> tuple[Tensor, Tensor, Tensor]:
        """Mean, variance and clipped log variance of q(x_{t-1} | x_t, x_0) (Ho et al. eq. 6-7), broadcast like x_t."""
        mean = _at(self.posterior_mean_coef1, t, x_t) * x0 + _at(self.posterior_mean_coef2, t, x_t) * x_t
        return mean, _at(self.posterior_variance, t, x_t), _at(self.posterior_log_variance_clipped, t, x_t)

    def model_log_variance(self, v: Tensor, t: Tensor | int) -> Tensor:
        """log Sigma_theta(x_t, t) of a learned-variance net's output v (Nichol & Dhariwal eq. 15), shaped like v."""
        return interpolate_log_variance(v, _at(self.log_betas, t, v), _at(self.posterior_log_variance_clipped, t, v))

    # -- conversions -----------------------------------------------------------------------------------

    def to_x0_eps(self, output: Tensor, x_t: Tensor, t: Tensor | int, prediction: Prediction) -> tuple[Tensor, Tensor]:
        """(x0-hat, eps-hat) implied by a net's ``output`` at x_t, for any ``prediction`` type."""
        abar = _at(self.alphas_cumprod, t, x_t)
        a, s = abar.sqrt(), (1 - abar).sqrt()  # x_t = a x0 + s eps, a^2 + s^2 = 1
        if prediction == "eps":
            return (x_t - s * output) / a, output
        if prediction == "x0":
            return output, (x_t - a * output) / s
        if prediction == "v":  # v = a eps - s x0  =>  x0 = a x_t - s v,  eps = s x_t + a v
            return a * x_t - s * output, s * x_t + a * output
        raise ValueError(f"prediction must be 'eps', 'v' or 'x0', got {prediction!r}")

    def from_x0_eps(self, x0: Tensor, eps: Tensor, t: Tensor | int, prediction: Prediction) -> Tensor:
        """The output a net of type ``prediction`` gives for (x0, eps); the inverse of ``to_x0_eps``."""
        return self.target(x0, eps, t, prediction)

    def __repr__(self) -> str:
        return f"NoiseSchedule(num_timesteps={self.num_timesteps}, beta_schedule={self.beta_schedule!r})"
