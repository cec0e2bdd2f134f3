"""Flow matching: an objective in place of the noise schedule's, and the ODE samplers of its velocity field.

The linear (rectified-flow) path between data and noise (Liu et al. 2023; Lipman et al. 2023; SD3, Esser et al.
2024, sec. 2), t in [0, 1], t = 0 the data and t = 1 the noise:

    x_t = (1 - t) x_0 + t eps,    v = dx_t / dt = eps - x_0

The net predicts v (the conditional flow matching loss E || v_theta(x_t, t, y) - (eps - x_0) ||^2), and sampling
integrates dx/dt = v_theta from t = 1 (pure noise) down to t = 0. Training times t are drawn ``uniform``,
``logit_normal`` (t = sigmoid(m + s n), n ~ N(0, 1)) or ``mode`` (t = 1 - u - s (cos^2(pi u / 2) - 1 + u),
u ~ U(0, 1)), SD3 sec. 3.1, then optionally shifted toward the noise, t' = a t / (1 + (a - 1) t) (SD3 sec. 5.3.2;
a = 3 there at 1024^2).

How the net sees t, one rule for training and sampling: samplers and the loss call the denoiser with the
continuous t (B,) in [0, 1]; ``DiffusionModule.denoise`` hands the net ``time_scale`` t (1000 t by default, the
``timestep`` diffusers' flow pipelines feed their transformers), so the sinusoidal step embedding sees the range
it has for the 1000-step schedule.

The loss is ``zoo.diffusion.losses.flow_matching_loss``. Samplers (built from class_path like the noise-schedule
ones, on the objective itself in place of the schedule):
``FlowEulerSampler`` and ``FlowHeunSampler``, equal to diffusers' ``FlowMatchEulerDiscreteScheduler`` and
``FlowMatchHeunDiscreteScheduler`` step for step (tests/diffusion/test_flow.py).

Notation: B batch; x (B, ...) any shape with the batch first; t (B,) float times in [0, 1].
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from zoo.diffusion.losses import flow_matching_loss, flow_path, flow_velocity
from zoo.diffusion.objective import Objective
from zoo.diffusion.samplers import Denoiser, Sampler, SamplerClass, check_sampler_kind, split_variance
from zoo.errors import InputError

TimeSampling = Literal["uniform", "logit_normal", "mode"]


def shift_time(t: Tensor | float, shift: float) -> Tensor | float:
    """t' = shift t / (1 + (shift - 1) t): the same [0, 1], more time near the noise for shift > 1 (SD3 eq. 23)."""
    return shift * t / (1 + (shift - 1) * t)


def mode_time(u: Tensor, scale: float) -> Tensor:
    """SD3's f_mode(u; s) = 1 - u - s (cos^2(pi u / 2) - 1 + u) (Esser et al. 2024, eq. 20): decreasing in u for
    s in [-1, 2 / (pi - 2)], so t = f_mode(u), u ~ U(0, 1), has P(t <= f_mode(u0)) = 1 - u0."""
    return 1 - u - scale * (torch.cos(math.pi / 2 * u) ** 2 - 1 + u)


class FlowMatching(Objective):
    """Conditional flow matching on the linear path x_t = (1 - t) x_0 + t eps with velocity target eps - x_0."""

    kind = "flow"  # what FlowEulerSampler and FlowHeunSampler draw from (``Sampler.kinds``)

    def __init__(
        self,
        time_sampling: TimeSampling = "logit_normal",
        logit_mean: float = 0.0,
        logit_std: float = 1.0,
        mode_scale: float = 1.29,
        shift: float = 1.0,
        time_scale: float = 1000.0,
    ) -> None:
        """
        Args:
            time_sampling: how training times t in [0, 1] are drawn: "uniform", "logit_normal" (sigmoid of
                N(logit_mean, logit_std^2); SD3's best, m = 0, s = 1) or "mode" (SD3's f_mode with ``mode_scale``).
            logit_mean: m of the logit-normal.
            logit_std: s of the logit-normal.
            mode_scale: s of the mode sampling, in [-1, 2 / (pi - 2)] (1.29 in SD3 and diffusers' scripts).
            shift: training times t are shifted to shift t / (1 + (shift - 1) t); 1: unshifted.
            time_scale: the net is given time_scale t (1000: the range of the 1000-step schedule's step indices).
        """
        if time_sampling not in ("uniform", "logit_normal", "mode"):
            raise InputError(f"time_sampling must be 'uniform', 'logit_normal' or 'mode', got {time_sampling!r}")
        if time_sampling == "mode" and not -1 <= mode_scale <= 2 / (math.pi - 2):
            raise InputError(f"mode_scale must be in [-1, {2 / (math.pi - 2):.3f}] (else f_mode is not monotone)")
        if shift <= 0 or logit_std <= 0:
            raise InputError(f"shift and logit_std must be > 0, got {shift} and {logit_std}")
        self.time_sampling, self.logit_mean, self.logit_std = time_sampling, logit_mean, logit_std
        self.mode_scale, self.shift, self.time_scale = mode_scale, shift, time_scale
        self._settings = {
            "time_sampling": time_sampling, "logit_mean": logit_mean, "logit_std": logit_std,
            "mode_scale": mode_scale, "shift": shift, "time_scale": time_scale,
        }  # fmt: skip

    def sample_time(self, n: int, generator: torch.Generator | None = None, device=None) -> Tensor:
        """(n,) training times in [0, 1], float32."""
        if self.time_sampling == "logit_normal":
            t = torch.sigmoid(self.logit_mean + self.logit_std * torch.randn(n, generator=generator, device=device))
        else:
            u = torch.rand(n, generator=generator, device=device)
            t = u if self.time_sampling == "uniform" else mode_time(u, self.mode_scale)
        return shift_time(t, self.shift) if self.shift != 1.0 else t

    add_noise = staticmethod(flow_path)  # x_t = (1 - t) x_0 + t eps
    target = staticmethod(flow_velocity)  # eps - x_0

    def net_time(self, t: Tensor) -> Tensor:
        return t * self.time_scale

    def loss(
        self, model: Denoiser, x0: Tensor, y: Tensor | None, t: Tensor | None = None, noise: Tensor | None = None
    ) -> dict[str, Tensor]:
        """``flow_matching_loss`` at times ``t`` (drawn by ``sample_time`` unless given) and ``noise``."""
        if t is None:
            t = self.sample_time(x0.shape[0], device=x0.device)
        if noise is None:
            noise = torch.randn_like(x0)
        return flow_matching_loss(model, x0, y, t, noise)

    def sampler(self, cls: SamplerClass, clip_denoised: float | None) -> Sampler:
        # Built on the objective itself: a flow sampler needs only its kind; the prediction slot is unused.
        return cls(self, "eps", clip_denoised)

    def __repr__(self) -> str:
        return f"FlowMatching(time_sampling={self.time_sampling!r}, shift={self.shift})"


def flow_times(steps: int, shift: float, last_time: float) -> list[float]:
    """The S times a flow sampler calls the net at, decreasing from 1: shift(linspace(1, last_time, S)).

    diffusers' flow schedulers use last_time = 1 / num_train_timesteps = 1e-3 (for shift 1: their default grid);
    last_time = 1 / S is the uniform grid 1, (S - 1) / S, ..., 1 / S. Each step goes to the next time, the last to 0.
    """
    if steps < 1:
        raise InputError(f"steps must be >= 1, got {steps}")
    if not 0 < last_time <= 1 or shift <= 0:
        raise InputError(f"last_time must be in (0, 1] and shift > 0, got {last_time} and {shift}")
    grid = torch.linspace(1.0, last_time, steps, dtype=torch.float64)
    return shift_time(grid, shift).tolist()


class FlowSampler(Sampler):
    """Integrates dx/dt = v_theta(x, t, y) from t = 1 to 0 over ``flow_times``; the denoiser returns v."""

    kinds = ("flow",)  # the ODE of a flow-matching objective's velocity field

    def __init__(
        self,
        schedule: Objective,
        prediction: str = "eps",
        clip_denoised: float | None = None,
        *,
        steps: int = 16,
        shift: float = 1.0,
        last_time: float = 1e-3,
    ) -> None:
        """
        Args:
            schedule: the flow-matching objective the model trains with (given by the module).
            prediction: the noise schedule's prediction type, unused: a flow net predicts the velocity (given by the
                module).
            clip_denoised: clamp x0-hat = x_t - t v to [-c, c] at every call and use the velocity that implies,
                v = (x_t - x0-hat) / t; None: never (given by the module).
            steps: S, steps from t = 1 to 0.
            shift: the time grid shifted to shift t / (1 + (shift - 1) t) (more steps near the noise for shift > 1;
                SD3 samples with 3).
            last_time: the smallest non-zero time of the grid (see ``flow_times``; 1e-3 as diffusers).
        """
        check_sampler_kind(self, schedule)
        self.schedule, self.prediction, self.clip_denoised = schedule, prediction, clip_denoised
        self._times = flow_times(steps, shift, last_time)
        self._settings = {"steps": steps, "shift": shift, "last_time": last_time}
        self._next = dict(zip(self._times, self._times[1:] + [0.0]))

    def _velocity(self, output: Tensor, t: float, x_t: Tensor) -> Tensor:
        v, _ = split_variance(output, x_t)
        if self.clip_denoised is None:
            return v
        x0 = (x_t - t * v).clamp(-self.clip_denoised, self.clip_denoised)
        return (x_t - x0) / t


class FlowEulerSampler(FlowSampler):
    """Euler steps x_{t'} = x_t + (t' - t) v_theta(x_t, t): S net calls (diffusers' FlowMatchEulerDiscreteScheduler)."""

    def timesteps(self) -> list[float]:
        return self._times

    def step(self, output: Tensor, t: float, x_t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return x_t + (self._next[t] - t) * self._velocity(output, t, x_t)


class FlowHeunSampler(FlowSampler):
    """Heun's method (the trapezoid rule with an Euler predictor; Karras et al. 2022, Algorithm 1): from t to t',
    x-bar = x_t + (t' - t) d_t, then x_{t'} = x_t + (t' - t) (d_t + d(x-bar, t')) / 2; the last step, to t' = 0,
    is Euler. 2S - 1 net calls (diffusers' FlowMatchHeunDiscreteScheduler, whose timesteps list them the same way).
    """

    _pending: tuple[Tensor, Tensor, float] | None = None  # (x_t, d_t, t) between the predictor and the corrector

    def timesteps(self) -> list[float]:
        # t_0, then each later time twice: the corrector's call at t_{i+1}, then the next predictor's there.
        return self._times[:1] + [t for t in self._times[1:] for _ in range(2)]

    def step(self, output: Tensor, t: float, x_t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        d = self._velocity(output, t, x_t)
        if self._pending is not None:  # the corrector: output is d(x-bar, t') at t = t'
            x_s, d_s, s = self._pending
            self._pending = None
            return x_s + (t - s) * (0.5 * (d_s + d))
        t_next = self._next[t]
        if t_next > 0:
            self._pending = (x_t, d, t)
        return x_t + (t_next - t) * d

    def sample(self, model, noise, y=None, generator=None):
        self._pending = None
        return super().sample(model, noise, y, generator)
