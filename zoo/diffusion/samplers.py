"""Samplers: objects without parameters that turn noise into data with any denoiser callable.

A denoiser is ``model(x_t, t, y) -> output``: x_t (B, ...), t (B,) int64 step indices, y (B,) labels or
None; its output is eps, v or x0 as ``prediction`` says, converted through the ``NoiseSchedule``.
So a sampler never knows the net, and classifier-free guidance is a wrapper around the callable.

- ``DDPMSampler``: ancestral sampling over all T steps (Ho et al. 2020, Algorithm 2), with the
  posterior variance beta-tilde_t or beta_t (the two bounds of sec. 3.2).
- ``DDIMSampler``: any number of steps S <= T, stochasticity eta in [0, 1] (Song et al. 2021,
  "Denoising Diffusion Implicit Models", eq. 12 and 16); eta = 1 over all T steps is DDPM with
  beta-tilde, eta = 0 is deterministic (and ignores a learned variance).
- ``ClassifierFreeGuidance``: eps-hat = eps(x, null) + s (eps(x, y) - eps(x, null)) (Ho & Salimans
  2021, eq. 6 with w = s - 1; DiT's ``cfg_scale`` = s), both in one batched call.

Each sampler is one class built from its own ``class_path`` and scalars, as ``DiffusionModule(sampler=...)``,
the sampling callbacks and ``predict`` take it from YAML:

    sampler:
      class_path: zoo.diffusion.DDIMSampler
      init_args: {steps: 50, eta: 0.0}

and is called with what belongs to the model, ``(schedule, prediction, clip_denoised)``, like diffusers'
schedulers, whose ``set_timesteps`` and ``step`` are ``timesteps()`` and ``step()`` here: the model's objective
builds it (``Objective.sampler``; ``zoo.diffusion.objective``), and the sampler states the kinds of schedule it
samples (``Sampler.kinds``), checked as it is built. Guidance is not a sampler's option: it wraps the denoiser
(``ClassifierFreeGuidance``). A new sampler is one ``Sampler`` subclass, whose first three parameters are those
(tests/diffusion/test_diffusion.py's ``OneStepSampler`` is one).

A denoiser with learned variance returns 2C channels: the prediction, then v in [-1, 1] per pixel
(Nichol & Dhariwal 2021, "Improved DDPM", eq. 15). Both samplers then draw their noise with the
learned Sigma_theta instead of a fixed variance; DDIM's S-step version uses the betas of its own
S-step sub-chain (beta'_t = 1 - abar_t / abar_t', as Nichol & Dhariwal respace the schedule, sec. 4).

Randomness comes only from the ``generator`` given to ``sample``; noise is drawn only at steps whose
variance is non-zero, so DDPM and DDIM(eta=1, S=T) draw the same numbers in the same order.

Notation: B batch, T training steps, S sampling steps; t index i is the paper's t = i + 1 (abar of
index -1, before the first step, is 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from zoo.diffusion.schedule import NoiseSchedule, Prediction, interpolate_log_variance
from zoo.errors import InputError

Denoiser = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]
Spacing = Literal["leading", "trailing", "linspace"]


def split_variance(output: Tensor, x_t: Tensor) -> tuple[Tensor, Tensor | None]:
    """(prediction, v) of a learned-variance net's (B, 2C, ...) output; (output, None) when it has x_t's C channels."""
    c = x_t.shape[1]
    if output.shape[1] == 2 * c:
        return output[:, :c], output[:, c:]
    if output.shape[1] != c:
        raise ValueError(f"the denoiser returned {output.shape[1]} channels for {c}-channel inputs, not {c} or {2 * c}")
    return output, None


class ClassifierFreeGuidance:
    """Wraps a conditional denoiser: one batched call on [cond; uncond], mixed with ``guidance_scale``.

    ``guidance_scale`` 1 is the conditional model alone (one call, no uncond half); 0 is the
    unconditional one; above 1 trades diversity for fidelity (Ho & Salimans 2021). The mix is linear,
    so it may act on any ``prediction`` type: every conversion to eps is affine with weights summing to 1.
    A learned variance, if the net returns one, is taken from the conditional half unmixed.
    """

    def __init__(self, model: Denoiser, guidance_scale: float, null_label: int) -> None:
        self.model, self.guidance_scale, self.null_label = model, guidance_scale, null_label

    def __call__(self, x: Tensor, t: Tensor, y: Tensor | None) -> Tensor:
        if y is None or self.guidance_scale == 1.0:
            return self.model(x, t, y)
        out = self.model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y, self.null_label)]))
        cond, uncond = out.chunk(2)  # (B, C or 2C, ...) each
        c = x.shape[1]
        guided = uncond[:, :c] + self.guidance_scale * (cond[:, :c] - uncond[:, :c])
        # A learned variance (channels C..2C) is the conditional model's, not extrapolated (DiT's forward_with_cfg).
        return torch.cat([guided, cond[:, c:]], dim=1)


# What each kind of schedule a sampler draws from is, and the samplers of that kind (for the one error line).
KINDS = {
    "noise_schedule": (
        "a noise-schedule (eps, v, x0) model",
        "zoo.diffusion.DDIMSampler, DDPMSampler or DPMSolverPlusPlus2M",
    ),
    "flow": ("a flow-matching model", "zoo.diffusion.FlowEulerSampler or FlowHeunSampler"),
}


def check_sampler_kind(sampler: Sampler, schedule: object) -> None:
    """A sampler built on a schedule of a kind it states it samples (``Sampler.kinds``; the schedule states its own
    ``kind``: the ``NoiseSchedule``, or the flow-matching objective), else one error line naming both. Every sampler
    calls it first thing in ``__init__``, so building one on a model's objective is the check."""
    cls, kind = type(sampler), getattr(schedule, "kind", None)
    if kind in cls.kinds:
        return
    trained = "on the noise schedule" if kind == "noise_schedule" else f"with {schedule!r}"
    use = KINDS[kind][1] if kind in KINDS else "a sampler of its kind"
    raise InputError(f"{cls.__name__} samples {KINDS[cls.kinds[0]][0]}, not one trained {trained}: use {use}")


def _noise_like(x: Tensor, generator: torch.Generator | None) -> Tensor:
    return torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)


class Sampler:
    """The loop every sampler shares; subclasses give ``__init__(schedule, prediction, clip_denoised, *, own
    scalars)``, ``timesteps`` and ``step``. Not an ``nn.Module``: no parameters, nothing in a state dict."""

    kinds: tuple[str, ...] = ("noise_schedule",)  # the kinds of schedule (``KINDS``) it samples: DDPM's chain here
    schedule: NoiseSchedule
    prediction: Prediction
    clip_denoised: float | None
    # Per-step scalars as Python floats on the host: no device sync and no kernel launch per step.
    _abar: list[float]
    _settings: dict[str, object] = {}  # the keyword-only settings it was built with (``settings``)

    def timesteps(self) -> list[int]:
        raise NotImplementedError

    def settings(self) -> dict[str, object]:
        """The sampler's own settings (its keyword-only parameters) with their values, as it was built: what a served
        model offers to change per request. Each sampler records them in ``__init__`` (none: a sampler without)."""
        return dict(self._settings)

    def step(self, output: Tensor, t: int, x_t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def _x0_eps(self, output: Tensor, t: int, x_t: Tensor, clipped_eps: bool = True) -> tuple[Tensor, Tensor]:
        x0, eps = self.schedule.to_x0_eps(output, x_t, t, self.prediction)
        if self.clip_denoised is not None:  # data known to lie in [-c, c]; eps re-derived to match (or kept)
            x0 = x0.clamp(-self.clip_denoised, self.clip_denoised)
            eps = self.schedule.to_x0_eps(x0, x_t, t, "x0")[1] if clipped_eps else eps
        return x0, eps

    @torch.no_grad()
    def sample(
        self, model: Denoiser, noise: Tensor, y: Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        """Denoise ``noise`` (x_T, (B, ...)) into samples (B, ...), conditioned on labels ``y`` (B,) or None."""
        self.schedule.to(noise.device)
        x = noise
        for t in self.timesteps():  # step indices (int) on a noise schedule, times in [0, 1] (float) on a flow
            dtype = torch.long if isinstance(t, int) else torch.float32
            tt = torch.full((x.shape[0],), t, device=x.device, dtype=dtype)
            x = self.step(model(x, tt, y), t, x, generator)
        return x

    def num_calls(self) -> int:
        """Denoiser evaluations per sample (before any guidance doubling)."""
        return len(self.timesteps())


class DDPMSampler(Sampler):
    """Ancestral sampling through every one of the schedule's T steps (Ho et al. 2020, Algorithm 2)."""

    def __init__(
        self,
        schedule: NoiseSchedule,
        prediction: Prediction = "eps",
        clip_denoised: float | None = None,
        *,
        variance: Literal["beta_tilde", "beta"] = "beta_tilde",
    ) -> None:
        """
        Args:
            schedule: the training schedule (given by the module).
            prediction: what the denoiser outputs, eps, v or x0 (given by the module).
            clip_denoised: clamp x0-hat to [-c, c] at every step, c = 1 for images in [-1, 1]; None: never (given
                by the module).
            variance: sigma_t^2 = beta-tilde_t (optimal for a point mass x_0) or beta_t (optimal for x_0 ~ N(0, I));
                unused when the denoiser returns its own (learned) variance.
        """
        check_sampler_kind(self, schedule)
        self.schedule, self.prediction, self.variance, self.clip_denoised = (
            schedule,
            prediction,
            variance,
            clip_denoised,
        )
        self._abar, self._beta = schedule.host["abar"], schedule.host["beta"]
        self._log_beta, self._log_beta_tilde = schedule.host["log_beta"], schedule.host["log_beta_tilde"]
        self._settings = {"variance": variance}

    def timesteps(self) -> list[int]:
        return list(range(self.schedule.num_timesteps - 1, -1, -1))

    def step(self, output: Tensor, t: int, x_t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        # 1. x0-hat (and eps-hat) from the net's output: x0 = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t)
        output, v = split_variance(output, x_t)
        x0, _ = self._x0_eps(output, t, x_t)
        # 2. posterior mean mu-tilde_t(x_t, x0) (eq. 7):
        #    sqrt(abar_{t-1}) beta_t / (1 - abar_t) x0 + sqrt(alpha_t) (1 - abar_{t-1}) / (1 - abar_t) x_t
        beta, abar, abar_prev = self._beta[t], self._abar[t], (self._abar[t - 1] if t > 0 else 1.0)
        mean = (abar_prev**0.5 * beta / (1 - abar)) * x0 + ((1 - beta) ** 0.5 * (1 - abar_prev) / (1 - abar)) * x_t
        if t == 0:  # 3. the last step returns the mean: x_0 = mu-tilde_1 (Algorithm 2, z = 0 when t = 1)
            return mean
        # 4. x_{t-1} = mu-tilde_t + sigma_t z, z ~ N(0, I), sigma_t^2 = beta-tilde_t or beta_t, or the net's
        #    Sigma_theta = exp(f log beta_t + (1 - f) log beta-tilde_t), f = (v + 1) / 2 (Nichol & Dhariwal eq. 15)
        if v is not None:
            std = (0.5 * interpolate_log_variance(v, self._log_beta[t], self._log_beta_tilde[t])).exp().to(x_t.dtype)
        else:
            std = (beta * (1 - abar_prev) / (1 - abar) if self.variance == "beta_tilde" else beta) ** 0.5
        return mean + std * _noise_like(x_t, generator)


def ddim_timesteps(num_timesteps: int, steps: int, spacing: Spacing) -> list[int]:
    """S step indices in decreasing order, as diffusers spaces them (Lin et al. 2024, table 2).

    leading: 0, T/S, 2T/S, ... (DDIM's own, never visits the noisiest step); trailing: T-1, T-1-T/S, ...
    (always starts from the noisiest step, better at few steps); linspace: rounded linspace(0, T-1, S).
    """
    if not 1 <= steps <= num_timesteps:
        raise ValueError(f"steps must be in [1, {num_timesteps}], got {steps}")
    if spacing == "leading":
        ts = torch.arange(steps) * (num_timesteps // steps)
    elif spacing == "trailing":
        ts = torch.arange(num_timesteps, 0, -num_timesteps / steps).round().long() - 1
    elif spacing == "linspace":
        ts = torch.linspace(0, num_timesteps - 1, steps).round().long()
    else:
        raise ValueError(f"spacing must be 'leading', 'trailing' or 'linspace', got {spacing!r}")
    return sorted({int(t) for t in ts}, reverse=True)


class DDIMSampler(Sampler):
    """DDIM over S of the T steps (Song et al. 2021, eq. 12), eta = 0 deterministic, eta = 1 DDPM-like."""

    def __init__(
        self,
        schedule: NoiseSchedule,
        prediction: Prediction = "eps",
        clip_denoised: float | None = None,
        *,
        steps: int = 50,
        eta: float = 0.0,
        spacing: Spacing = "trailing",
        steps_offset: int = 0,
        previous: Literal["next", "stride"] = "next",
        set_alpha_to_one: bool = True,
        clipped_eps: bool = True,
    ) -> None:
        """
        Args:
            schedule: the training schedule (given by the module).
            prediction: what the denoiser outputs, eps, v or x0 (given by the module).
            clip_denoised: clamp x0-hat to [-c, c] at every step; None: never (given by the module).
            steps: S, denoiser calls per sample.
            eta: 0 deterministic (DDIM), 1 the DDPM posterior variance; in between interpolates (eq. 16).
            spacing: which S of the T steps to visit (see ``ddim_timesteps``; trailing starts at the noisiest, better
                at few steps).
            steps_offset: added to every leading step (Stable Diffusion's 1: the chain ends at step 1, not 0);
                ignored by the other spacings, as in diffusers.
            previous: the step each one goes to: "next", the next visited step (the chain sampled on); "stride",
                t - T // S as diffusers' DDIMScheduler steps (another step where S does not divide T, for trailing
                and linspace spacing).
            set_alpha_to_one: the step after the last goes to abar = 1 (clean data); False: to abar of step 0
                (diffusers' ``set_alpha_to_one``).
            clipped_eps: with clip_denoised, eps-hat re-derived from the clipped x0-hat (Glide's); False: the net's
                own eps-hat, as diffusers' DDIMPipeline steps (its ``use_clipped_model_output`` unset).
        """
        check_sampler_kind(self, schedule)
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"eta must be in [0, 1], got {eta}")
        self.schedule, self.prediction, self.eta, self.clip_denoised = schedule, prediction, eta, clip_denoised
        self.clipped_eps, num = clipped_eps, schedule.num_timesteps
        self._abar = schedule.host["abar"]
        self._final = 1.0 if set_alpha_to_one else self._abar[0]
        self._timesteps = ddim_timesteps(num, steps, spacing)
        if spacing == "leading" and steps_offset:
            self._timesteps = [t + steps_offset for t in self._timesteps]
        if steps_offset < 0 or self._timesteps[0] >= num:
            raise ValueError(f"steps_offset {steps_offset} puts a step outside 0..{num - 1} at {steps} steps")
        self._settings = {
            "steps": steps, "eta": eta, "spacing": spacing, "steps_offset": steps_offset, "previous": previous,
            "set_alpha_to_one": set_alpha_to_one, "clipped_eps": clipped_eps,
        }  # fmt: skip
        # The step after each one: the next visited index, and -1 (abar = final: clean data) after the last.
        if previous == "next":
            self._prev = dict(zip(self._timesteps, self._timesteps[1:] + [-1]))
        elif previous == "stride":
            self._prev = {t: t - num // steps for t in self._timesteps}
        else:
            raise ValueError(f"previous must be 'next' or 'stride', got {previous!r}")

    def timesteps(self) -> list[int]:
        return self._timesteps

    def step(self, output: Tensor, t: int, x_t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        t_prev = self._prev[t]
        abar, abar_prev = self._abar[t], (self._abar[t_prev] if t_prev >= 0 else self._final)
        # 1. x0-hat and eps-hat from the net's output ("predicted x_0" of eq. 12)
        output, v = split_variance(output, x_t)
        x0, eps = self._x0_eps(output, t, x_t, self.clipped_eps)
        # 2. sigma_t(eta) = eta sqrt((1 - abar_{t-1}) / (1 - abar_t)) sqrt(1 - abar_t / abar_{t-1})  (eq. 16)
        sigma = self.eta * ((1 - abar_prev) / (1 - abar) * (1 - abar / abar_prev)) ** 0.5
        # 3. "direction pointing to x_t": sqrt(1 - abar_{t-1} - sigma_t^2) eps-hat
        direction = max(1 - abar_prev - sigma**2, 0.0) ** 0.5 * eps
        # 4. x_{t-1} = sqrt(abar_{t-1}) x0-hat + direction + sigma_t z, z ~ N(0, I)
        x_prev = abar_prev**0.5 * x0 + direction
        if sigma > 0:
            x_prev = x_prev + self._noise_std(sigma, v, abar, abar_prev) * _noise_like(x_t, generator)
        return x_prev

    def _noise_std(self, sigma: float, v: Tensor | None, abar: float, abar_prev: float) -> Tensor | float:
        """sigma_t, or with a learned variance eta sqrt(Sigma_theta) over this sub-chain's step t -> t'.

        Sigma_theta interpolates the sub-chain's beta'_t = 1 - abar_t / abar_t' and beta-tilde'_t (Nichol &
        Dhariwal sec. 4). Only the noise changes, not the mean (whose sigma stays eta^2 beta-tilde'_t), so
        v = -1 is DDIM itself and eta = 1 over all T steps is DDPM with the learned variance.
        """
        if v is None:
            return sigma
        beta = 1 - abar / abar_prev
        log_var = interpolate_log_variance(v, math.log(beta), math.log(beta * (1 - abar_prev) / (1 - abar)))
        return self.eta * (0.5 * log_var).exp().to(v.dtype)


def dpm_timesteps(num_timesteps: int, steps: int, spacing: Literal["linspace", "trailing"]) -> list[int]:
    """S step indices in decreasing order, as diffusers' DPMSolverMultistepScheduler spaces them.

    linspace (its default): round(linspace(0, T-1, S+1)) without its 0, so the last step (to the data) starts
    at about T/S; trailing: T-1, T-1-T/S, ... (``ddim_timesteps``'s).
    """
    if not 1 <= steps < num_timesteps:
        raise ValueError(f"steps must be in [1, {num_timesteps - 1}], got {steps}")
    if spacing == "linspace":
        ts = torch.linspace(0, num_timesteps - 1, steps + 1, dtype=torch.float64).round().long()[1:]
        return sorted({int(t) for t in ts}, reverse=True)
    if spacing == "trailing":
        return ddim_timesteps(num_timesteps, steps, "trailing")
    raise ValueError(f"spacing must be 'linspace' or 'trailing', got {spacing!r}")


class DPMSolverPlusPlus2M(Sampler):
    """DPM-Solver++(2M) (Lu et al. 2022, "DPM-Solver++", Algorithm 2): the diffusion ODE solved in the data
    prediction x0-hat, exact in its linear part, second order by reusing the previous step's x0-hat.

    With lambda = log(alpha / sigma) (alpha = sqrt(abar), sigma = sqrt(1 - abar)), h = lambda_{t'} - lambda_t,
    from t to the next t':
        x_{t'} = (sigma_{t'} / sigma_t) x_t - alpha_{t'} (e^{-h} - 1) D,
        D = x0-hat_t + (x0-hat_t - x0-hat_prev) / (2 r),  r = (lambda_t - lambda_prev) / h,
    with D = x0-hat_t at the first step (first order: DDIM) and at the last step, to the data (sigma = 0,
    x_0 = x0-hat_t), as diffusers' ``DPMSolverMultistepScheduler`` with its defaults (solver_order 2, midpoint,
    final_sigmas_type "zero", lower_order_final). Deterministic; a learned variance is not used.
    """

    # (t, x0-hat_t) of the previous step, the multistep memory; used only by the step right after it.
    _last: tuple[int, Tensor] | None = None

    def __init__(
        self,
        schedule: NoiseSchedule,
        prediction: Prediction = "eps",
        clip_denoised: float | None = None,
        *,
        steps: int = 20,
        spacing: Literal["linspace", "trailing"] = "linspace",
    ) -> None:
        """
        Args:
            schedule: the training schedule (given by the module).
            prediction: what the denoiser outputs, eps, v or x0 (given by the module).
            clip_denoised: clamp x0-hat to [-c, c] at every step (the solver's data prediction); None: never (given
                by the module).
            steps: S, denoiser calls per sample (10-20 suffice: Lu et al. 2022).
            spacing: which S of the T steps to visit (``dpm_timesteps``; linspace is diffusers' default).
        """
        check_sampler_kind(self, schedule)
        self.schedule, self.prediction, self.clip_denoised = schedule, prediction, clip_denoised
        self._abar = schedule.host["abar"]
        self._timesteps = dpm_timesteps(schedule.num_timesteps, steps, spacing)
        self._settings = {"steps": steps, "spacing": spacing}
        self._prev = dict(zip(self._timesteps, self._timesteps[1:] + [-1]))
        self._alpha = {t: self._abar[t] ** 0.5 for t in self._timesteps}
        self._sigma = {t: (1 - self._abar[t]) ** 0.5 for t in self._timesteps}
        self._lambda = {t: math.log(self._alpha[t] / self._sigma[t]) for t in self._timesteps}

    def timesteps(self) -> list[int]:
        return self._timesteps

    def step(self, output: Tensor, t: int, x_t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        x0, _ = self._x0_eps(split_variance(output, x_t)[0], t, x_t)
        last, self._last = self._last, (t, x0)
        s = self._prev[t]
        if s < 0:  # to sigma = 0: the data prediction itself (the first-order step's limit)
            return x0
        h = self._lambda[s] - self._lambda[t]
        d = x0
        if last is not None and self._prev[last[0]] == t:  # second order from the previous step's x0-hat
            r = (self._lambda[t] - self._lambda[last[0]]) / h
            d = x0 + (x0 - last[1]) / (2 * r)
        return (self._sigma[s] / self._sigma[t]) * x_t - (self._alpha[s] * math.expm1(-h)) * d

    def sample(self, model, noise, y=None, generator=None):
        self._last = None
        try:
            return super().sample(model, noise, y, generator)
        finally:
            self._last = None  # no tensor kept past the loop


# What DiffusionModule(sampler=...) and the sampling callbacks take: a sampler class (or partial) the objective calls
# as cls(schedule, prediction, clip_denoised); in YAML a class_path with the sampler's own init_args (steps, eta, ...).
SamplerClass = Callable[[NoiseSchedule, Prediction, "float | None"], Sampler]
