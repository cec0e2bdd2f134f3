"""What a ``DiffusionModule`` trains its net on: an objective, one class with its own settings, chosen in YAML
(``model.init_args.objective``) like the net and the sampler.

Every objective answers the same four questions, so the module never asks which one it holds (SiT's ``Transport``
and DiT's ``GaussianDiffusion`` own the objective and what sampling is built on in the same way):

- ``sample_time``: the training times t of a batch (step indices, or continuous times);
- ``net_time``: how the net sees a time (one rule for training and sampling);
- ``loss``: the objective's terms on (x0, y), a dict with a "loss" key (``zoo.diffusion.losses``);
- ``sampler``: a sampler class built on what its samplers take; each sampler states the ``kind`` of schedule it
  draws from (``Sampler.kinds``), so one of the wrong kind is refused as it is built.

``GaussianDiffusion`` (here) is the noise schedule's objective: DDPM's forward process with eps, v or x0 prediction,
min-SNR weighting and, for a net that also outputs a variance, the hybrid loss of Nichol & Dhariwal 2021.
``zoo.diffusion.FlowMatching`` is the other.

Notation: B batch; x0 (B, C, H, W) clean data; t (B,) times; y (B,) labels or None.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from zoo.diffusion.losses import denoising_loss
from zoo.diffusion.samplers import Denoiser, Sampler, SamplerClass
from zoo.diffusion.schedule import NoiseSchedule, Prediction


class Objective:
    """The protocol every objective gives; a subclass is one class with its own settings (no parameters)."""

    def sample_time(self, n: int, generator: torch.Generator | None = None, device=None) -> Tensor:
        """(n,) training times, drawn on ``generator``."""
        raise NotImplementedError

    def net_time(self, t: Tensor) -> Tensor:
        """What the net is given for times ``t`` (B,), in training and sampling alike."""
        raise NotImplementedError

    def loss(
        self, model: Denoiser, x0: Tensor, y: Tensor | None, t: Tensor | None = None, noise: Tensor | None = None
    ) -> dict[str, Tensor]:
        """The objective's terms for ``model`` on (x0, y); "loss" is what is optimised. Giving ``t`` and ``noise``
        fixes the draw, as validation does."""
        raise NotImplementedError

    def sampler(self, cls: SamplerClass, clip_denoised: float | None) -> Sampler:
        """``cls`` built on what this objective's samplers take (a sampler of another kind refuses it)."""
        raise NotImplementedError

    def to(self, device) -> Objective:
        """Samplers move what they are built on to the noise's device; an objective of scalars has nothing to move."""
        return self

    _settings: dict[str, object] = {}  # the arguments it was built with, recorded by each ``__init__``

    def config(self) -> dict[str, object]:
        """``{class_path, init_args}`` that rebuild it: what a module built in Python records in its checkpoints."""
        return {"class_path": f"{type(self).__module__}.{type(self).__qualname__}", "init_args": dict(self._settings)}


class GaussianDiffusion(Objective):
    """The noise schedule's denoising objective (Ho et al. 2020): x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps at
    step indices t ~ U{0..T-1}, the net predicting eps, v or x0; sampled by DDPM, DDIM and DPM-Solver++."""

    def __init__(
        self,
        num_timesteps: int = 1000,
        beta_schedule: Literal["linear", "scaled_linear", "cosine"] = "linear",
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        prediction: Prediction = "eps",
        min_snr_gamma: float | None = None,
        vlb_weight: float = 0.001,
    ) -> None:
        """
        Args:
            num_timesteps: T, diffusion steps of training (1000 in DDPM and DiT).
            beta_schedule: "linear" (Ho et al. 2020), "scaled_linear" (latent diffusion: linear in sqrt(beta)) or
                "cosine" (Nichol & Dhariwal 2021).
            beta_start: first beta of the (scaled) linear schedule (at T = 1000: scaled by 1000 / T for another T).
            beta_end: last beta of the (scaled) linear schedule (at T = 1000).
            prediction: what the net outputs: "eps" (noise), "v" (Salimans & Ho 2022) or "x0" (clean image).
            min_snr_gamma: weight the loss by min(SNR, gamma) in x0 units (Hang et al. 2023; 5 there); None: unweighted.
            vlb_weight: lambda of the hybrid loss L_simple + lambda L_vlb that trains a learned variance (nets with
                2C outputs, e.g. ``learn_sigma``; 0.001 in Nichol & Dhariwal 2021 and DiT); unused otherwise.
        """
        if prediction not in ("eps", "v", "x0"):
            raise ValueError(f"prediction must be 'eps', 'v' or 'x0', got {prediction!r}")
        if min_snr_gamma is not None and min_snr_gamma <= 0:
            raise ValueError(f"min_snr_gamma must be > 0 (or None: unweighted), got {min_snr_gamma}")
        self.schedule = NoiseSchedule(num_timesteps, beta_schedule, beta_start, beta_end)
        self.prediction, self.min_snr_gamma, self.vlb_weight = prediction, min_snr_gamma, vlb_weight
        self._settings = {
            "num_timesteps": num_timesteps, "beta_schedule": beta_schedule, "beta_start": beta_start,
            "beta_end": beta_end, "prediction": prediction, "min_snr_gamma": min_snr_gamma, "vlb_weight": vlb_weight,
        }  # fmt: skip

    def sample_time(self, n: int, generator: torch.Generator | None = None, device=None) -> Tensor:
        """(n,) step indices U{0..T-1}, int64."""
        return torch.randint(0, self.schedule.num_timesteps, (n,), generator=generator, device=device)

    def net_time(self, t: Tensor) -> Tensor:
        return t  # the step index itself, as DDPM and DiT give it

    def loss(
        self, model: Denoiser, x0: Tensor, y: Tensor | None, t: Tensor | None = None, noise: Tensor | None = None
    ) -> dict[str, Tensor]:
        """``denoising_loss``: "loss", "mse", and "vlb" for a net with a learned variance."""
        schedule = self.schedule.to(x0.device)
        return denoising_loss(
            model, schedule, x0, y, self.prediction, self.min_snr_gamma, t=t, noise=noise, vlb_weight=self.vlb_weight
        )

    def sampler(self, cls: SamplerClass, clip_denoised: float | None) -> Sampler:
        return cls(self.schedule, self.prediction, clip_denoised)

    def to(self, device) -> GaussianDiffusion:
        self.schedule.to(device)
        return self

    def __repr__(self) -> str:
        return (
            f"GaussianDiffusion(num_timesteps={self.schedule.num_timesteps}, "
            f"beta_schedule={self.schedule.beta_schedule!r}, prediction={self.prediction!r})"
        )
