"""The diffusion samplers against outside references: diffusers' schedulers step by step, and Gaussian data.

1. ``DDPMScheduler`` / ``DDIMScheduler`` from diffusers, built on the zoo's betas, given the same x_t, model
   output and noise (a generator seeded alike per step), for every prediction type, variance, spacing and eta.
2. Data x0 ~ N(mu, s^2) per dimension, where the optimal denoiser is known in closed form:
   x_t = a x0 + b eps (a^2 = abar_t, b^2 = 1 - abar_t) is Gaussian, so
   E[x0 | x_t] = mu + a s^2 (x_t - a mu) / (a^2 s^2 + b^2),  E[eps | x_t] = b (x_t - a mu) / (a^2 s^2 + b^2).
   Sampling with that denoiser must return samples of mean mu and standard deviation s.
"""

from __future__ import annotations

import pytest
import torch

from zoo.diffusion.samplers import DDIMSampler, DDPMSampler, ddim_timesteps
from zoo.diffusion.schedule import NoiseSchedule

diffusers = pytest.importorskip("diffusers")

THEIR_PREDICTION = {"eps": "epsilon", "v": "v_prediction", "x0": "sample"}
T = 60


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def inputs(t: int):
    torch.manual_seed(t)
    return torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)  # x_t, model output


@pytest.mark.parametrize("beta_schedule", ["linear", "cosine"])
@pytest.mark.parametrize("variance", ["beta_tilde", "beta"])
@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
def test_ddpm_step_equals_diffusers(prediction, variance, beta_schedule):
    schedule = NoiseSchedule(T, beta_schedule)
    ours = DDPMSampler(schedule, prediction, variance)
    theirs = diffusers.DDPMScheduler(
        num_train_timesteps=T, trained_betas=schedule.betas.double().numpy(), clip_sample=False,
        prediction_type=THEIR_PREDICTION[prediction], variance_type={"beta_tilde": "fixed_small", "beta": "fixed_large"}[variance],
    )
    for t in (T - 1, T // 2, 7, 1, 0):
        x_t, out = inputs(t)
        expected = theirs.step(out, t, x_t, generator=gen(t)).prev_sample
        torch.testing.assert_close(ours.step(out, t, x_t, gen(t)), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("spacing", ["leading", "trailing"])
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
def test_ddim_step_equals_diffusers(prediction, eta, spacing):
    """T divisible by S: diffusers steps from t to t - T/S, which is then the next visited step (see below)."""
    schedule, steps = NoiseSchedule(T, "linear"), 6
    ours = DDIMSampler(schedule, prediction, steps, eta, spacing)
    theirs = diffusers.DDIMScheduler(
        num_train_timesteps=T, trained_betas=schedule.betas.double().numpy(), clip_sample=False,
        set_alpha_to_one=True, steps_offset=0, timestep_spacing=spacing, prediction_type=THEIR_PREDICTION[prediction],
    )
    theirs.set_timesteps(steps)
    assert ours.timesteps() == theirs.timesteps.tolist()
    for t in ours.timesteps():
        x_t, out = inputs(t)
        expected = theirs.step(out, t, x_t, eta=eta, generator=gen(t)).prev_sample
        torch.testing.assert_close(ours.step(out, t, x_t, gen(t)), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("spacing", ["leading", "trailing", "linspace"])
@pytest.mark.parametrize("steps", [1, 7, 13, 50])
def test_ddim_timesteps_equal_diffusers_spacing(spacing, steps):
    # Only the visited steps: for T/S not an integer diffusers' DDIM steps to t - T//S, which is not always the
    # next visited step (trailing, linspace); the zoo steps to the next visited one, the chain it sampled on.
    theirs = diffusers.DDIMScheduler(num_train_timesteps=T, steps_offset=0, timestep_spacing=spacing)
    theirs.set_timesteps(steps)
    assert ddim_timesteps(T, steps, spacing) == sorted(set(theirs.timesteps.tolist()), reverse=True)


MU, SIGMA = 0.7, 0.3


def optimal_denoiser(schedule: NoiseSchedule, prediction: str):
    """The exact E[output | x_t] for x0 ~ N(MU, SIGMA^2), as a denoiser callable."""

    def model(x, t, y):
        abar = schedule.alphas_cumprod[t].view(-1, *[1] * (x.ndim - 1)).double()
        a, b = abar.sqrt(), (1 - abar).sqrt()
        var = a**2 * SIGMA**2 + b**2
        x0 = MU + a * SIGMA**2 * (x.double() - a * MU) / var
        eps = b * (x.double() - a * MU) / var
        return {"eps": eps, "x0": x0, "v": a * eps - b * x0}[prediction].float()

    return model


@pytest.mark.parametrize("prediction,sampler", [("eps", "ddpm"), ("v", "ddim-eta0"), ("x0", "ddim-eta1")])
def test_samples_of_the_optimal_denoiser_have_the_data_mean_and_std(sampler, prediction):
    # T = 1000 and all T steps: coarser chains leave the std short by discretisation alone (T = 100: 10%;
    # DDIM at S = 100 of 1000: 4% at eta 0, 10% at eta 1), which would hide the bugs this is here to catch.
    schedule = NoiseSchedule(1000, "linear")
    if sampler == "ddpm":
        s = DDPMSampler(schedule, prediction)
    else:
        s = DDIMSampler(schedule, prediction, steps=1000, eta=float(sampler[-1]), spacing="trailing")
    n = 4000
    x = s.sample(optimal_denoiser(schedule, prediction), torch.randn(n, 1, generator=gen(0)), generator=gen(1))
    # Standard errors: SIGMA / sqrt(n) = 0.005 for the mean, SIGMA / sqrt(2n) = 0.0034 for the std.
    assert abs(x.mean().item() - MU) < 0.02, x.mean()
    assert abs(x.std().item() - SIGMA) < 0.015, x.std()
