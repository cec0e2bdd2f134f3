"""Flow matching and the new samplers against closed forms and diffusers' schedulers.

1. The path x_t = (1 - t) x_0 + t eps, its velocity eps - x_0 (= dx_t/dt), the loss, and the training times'
   distributions (uniform, logit-normal, SD3's mode, the shift) against their formulas.
2. ``FlowEulerSampler`` / ``FlowHeunSampler`` against diffusers' ``FlowMatchEulerDiscreteScheduler`` /
   ``FlowMatchHeunDiscreteScheduler`` and ``DPMSolverPlusPlus2M`` against ``DPMSolverMultistepScheduler``
   (dpmsolver++, order 2, its defaults): the same model callable, every x it is called with and the result equal.
3. The exact velocity of Gaussian data, integrated by Euler, gives that data's mean and std.
4. The module: a flow model refuses noise-schedule samplers and vice versa; the net sees 1000 t; cli.py fits the
   flow DiT config, samples and reloads its checkpoint.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from conftest import CONFIGS, cli

from zoo.diffusion import (
    DDIMSampler,
    DiffusionModule,
    DPMSolverPlusPlus2M,
    FlowEulerSampler,
    FlowHeunSampler,
    FlowMatching,
    UNet,
)
from zoo.diffusion.flow import mode_time, shift_time
from zoo.diffusion.samplers import dpm_timesteps
from zoo.diffusion.schedule import NoiseSchedule
from zoo.errors import InputError


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- the path, the target, the loss ------------------------------------------------------------------------


def test_path_and_velocity_target_closed_forms():
    x0, eps = torch.randn(4, 3, 5, 5, generator=gen(0)), torch.randn(4, 3, 5, 5, generator=gen(1))
    t = torch.tensor([0.0, 0.25, 0.7, 1.0])
    x_t = FlowMatching.add_noise(x0, eps, t)
    torch.testing.assert_close(x_t[0], x0[0])  # t = 0: the data
    torch.testing.assert_close(x_t[3], eps[3])  # t = 1: the noise
    torch.testing.assert_close(x_t[1], 0.75 * x0[1] + 0.25 * eps[1])
    # The target is the path's time derivative, eps - x_0 (not x_0 - eps).
    tt = t.clone().requires_grad_(True)
    (FlowMatching.add_noise(x0, eps, tt) * torch.ones_like(x0)).sum().backward()
    torch.testing.assert_close(tt.grad, (eps - x0).flatten(1).sum(1))
    torch.testing.assert_close(FlowMatching.target(x0, eps), eps - x0)


def test_loss_is_the_mse_to_the_velocity_at_the_path_point():
    x0, eps = torch.randn(3, 2, 4, 4, generator=gen(2)), torch.randn(3, 2, 4, 4, generator=gen(3))
    t, seen = torch.tensor([0.1, 0.5, 0.9]), {}

    def model(x, tt, y):
        seen["x"], seen["t"] = x, tt
        return torch.sin(x)

    out = FlowMatching().loss(model, x0, None, t=t, noise=eps)
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    torch.testing.assert_close(seen["x"], x_t)
    assert seen["t"] is t  # the continuous time; the module scales it for the net
    expected = (torch.sin(x_t) - (eps - x0)).pow(2).mean()
    torch.testing.assert_close(out["loss"], expected)
    assert FlowMatching().loss(lambda x, tt, y: eps - x0, x0, None, t=t, noise=eps)["loss"] == 0


# -- the training times -------------------------------------------------------------------------------------

N = 200_000


def test_uniform_and_logit_normal_times():
    t = FlowMatching("uniform").sample_time(N, gen(0))
    assert abs(t.mean() - 0.5) < 0.005 and abs(t.std() - 12**-0.5) < 0.005
    m, s = 0.4, 1.3
    t = FlowMatching("logit_normal", logit_mean=m, logit_std=s).sample_time(N, gen(1))
    logit = torch.log(t / (1 - t))
    assert abs(logit.mean() - m) < 0.02 and abs(logit.std() - s) < 0.02, (logit.mean(), logit.std())


@pytest.mark.parametrize("scale", [1.29, 0.0, -0.5])
def test_mode_times_follow_sd3s_f_mode(scale):
    """P(t <= f_mode(u0)) = 1 - u0 (f_mode decreasing), and the density is 1 / |f_mode'| at f_mode's preimage."""
    t = FlowMatching("mode", mode_scale=scale).sample_time(N, gen(2))
    u0 = torch.linspace(0.05, 0.95, 19)
    edges = 1 - u0 - scale * (torch.cos(math.pi / 2 * u0) ** 2 - 1 + u0)  # the formula, written out again
    cdf = (t[None] <= edges[:, None]).float().mean(1)
    torch.testing.assert_close(cdf, 1 - u0, atol=0.005, rtol=0)
    # Density in a small bin around f_mode(u0): 1 / |f'(u0)|, f'(u) = -1 - s (1 - pi/2 sin(pi u)).
    width = 0.01
    hist = ((t[None] - edges[:, None]).abs() < width / 2).float().mean(1) / width
    density = 1 / (1 + scale * (1 - math.pi / 2 * torch.sin(math.pi * u0))).abs()
    torch.testing.assert_close(hist, density, rtol=0.1, atol=0.05)


def test_shift_formula_and_shifted_times():
    assert shift_time(0.5, 3.0) == pytest.approx(0.75) and shift_time(0.2, 1.0) == 0.2
    t = torch.linspace(0, 1, 11, dtype=torch.float64)
    torch.testing.assert_close(shift_time(t, 3.0), 3 * t / (1 + 2 * t))
    torch.testing.assert_close(shift_time(shift_time(t, 3.0), 1 / 3.0), t)  # shift s then 1/s is the identity
    base = FlowMatching("uniform").sample_time(1000, gen(4))
    shifted = FlowMatching("uniform", shift=3.0).sample_time(1000, gen(4))
    torch.testing.assert_close(shifted, 3 * base / (1 + 2 * base))
    assert mode_time(torch.tensor([0.0, 1.0]), 1.29).tolist() == pytest.approx([1.0, 0.0])


def test_bad_objective_settings_say_what_to_do():
    with pytest.raises(InputError, match="time_sampling"):
        FlowMatching("normal")
    with pytest.raises(InputError, match="mode_scale"):
        FlowMatching("mode", mode_scale=3.0)


# -- the samplers against diffusers ------------------------------------------------------------------------

diffusers = pytest.importorskip("diffusers")


class Recording:
    """A fixed nonlinear denoiser that remembers every x it is called with."""

    def __init__(self, time_scale: float = 1.0) -> None:
        self.xs, self.time_scale = [], time_scale

    def __call__(self, x, t, y=None):
        self.xs.append(x.clone())
        t = t.float().view(-1, *[1] * (x.ndim - 1)) / self.time_scale
        return torch.tanh(x) * (0.5 + t) - 0.3 * x + 0.2 * torch.cos(3 * t)


def their_loop(scheduler, timesteps, model, x, time_scale):
    for t in timesteps:
        x = scheduler.step(model(x, torch.full((x.shape[0],), float(t)) * time_scale), t, x).prev_sample
    return x


def assert_same_path(ours: Recording, theirs: Recording, x_ours, x_theirs, rtol: float = 1e-5):
    assert len(ours.xs) == len(theirs.xs)
    for i, (a, b) in enumerate(zip(ours.xs + [x_ours], theirs.xs + [x_theirs])):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=rtol, msg=f"x at call {i}")


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("steps", [1, 4, 16])
@pytest.mark.parametrize("heun", [False, True])
def test_flow_samplers_equal_diffusers_step_for_step(heun, steps, shift):
    cls = diffusers.FlowMatchHeunDiscreteScheduler if heun else diffusers.FlowMatchEulerDiscreteScheduler
    theirs = cls(num_train_timesteps=1000, shift=shift)
    theirs.set_timesteps(steps)
    # Their grid: shift(linspace(1, sigma_min, S)), sigma_min the shifted 1/1000 (a shift of 1 leaves it 1e-3).
    sampler = (FlowHeunSampler if heun else FlowEulerSampler)(
        FlowMatching(), steps=steps, shift=shift, last_time=theirs.sigma_min
    )
    assert theirs.sigma_min == pytest.approx(shift_time(1e-3, shift))
    torch.testing.assert_close(torch.tensor(sampler.timesteps()) * 1000, theirs.timesteps, atol=1e-3, rtol=1e-6)
    noise = torch.randn(3, 2, 4, 4, generator=gen(steps))
    a, b = Recording(), Recording(time_scale=1000)
    x_ours = sampler.sample(a, noise)
    x_theirs = their_loop(theirs, theirs.timesteps, b, noise, 1.0)
    assert_same_path(a, b, x_ours, x_theirs)
    assert sampler.num_calls() == (2 * steps - 1 if heun else steps) == len(a.xs)
    x_again = sampler.sample(Recording(), noise)  # no state left from the first run
    torch.testing.assert_close(x_again, x_ours, rtol=0, atol=0)


def test_euler_shifted_grid_equals_diffusers_given_the_unshifted_sigmas():
    """A grid of shift(linspace(1, last_time, S)) for any last_time: diffusers shifts the sigmas it is given."""
    theirs = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    theirs.set_timesteps(sigmas=torch.linspace(1, 1 / 8, 8).tolist())
    sampler = FlowEulerSampler(FlowMatching(), steps=8, shift=3.0, last_time=1 / 8)
    noise = torch.randn(2, 3, 4, 4, generator=gen(9))
    a, b = Recording(), Recording(time_scale=1000)
    assert_same_path(a, b, sampler.sample(a, noise), their_loop(theirs, theirs.timesteps, b, noise, 1.0))


THEIR_PREDICTION = {"eps": "epsilon", "v": "v_prediction", "x0": "sample"}


@pytest.mark.parametrize("beta_schedule", ["linear", "cosine"])
@pytest.mark.parametrize("spacing", ["linspace", "trailing"])
@pytest.mark.parametrize("steps", [1, 2, 10, 20])
@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
def test_dpm_solver_pp_2m_equals_diffusers_step_for_step(prediction, steps, spacing, beta_schedule):
    schedule = NoiseSchedule(1000, beta_schedule)
    theirs = diffusers.DPMSolverMultistepScheduler(
        num_train_timesteps=1000,
        trained_betas=schedule.betas.double().numpy(),
        algorithm_type="dpmsolver++",
        solver_order=2,
        prediction_type=THEIR_PREDICTION[prediction],
        timestep_spacing=spacing,  # linspace is their default; the others below are theirs too
        final_sigmas_type="zero",
        lower_order_final=True,
        euler_at_final=False,
        thresholding=False,
    )
    theirs.set_timesteps(steps)
    sampler = DPMSolverPlusPlus2M(schedule, prediction, steps=steps, spacing=spacing)
    assert sampler.timesteps() == theirs.timesteps.tolist()
    noise = torch.randn(3, 2, 4, 4, generator=gen(steps))
    a, b = Recording(1000), Recording(1000)
    x_ours = sampler.sample(a, noise)
    x_theirs = noise
    for t in theirs.timesteps:
        x_theirs = theirs.step(b(x_theirs, torch.full((3,), int(t))), t, x_theirs).prev_sample
    # An eps net on the cosine schedule: x0-hat at t = 999 divides by sqrt(abar) = 5e-5, and diffusers' abar (a
    # float32 cumprod of the same betas) is 1.3e-5 off there, so their x0-hat is ~1e-5 off relatively by itself.
    assert_same_path(a, b, x_ours, x_theirs, rtol=5e-4 if (prediction, beta_schedule) == ("eps", "cosine") else 1e-5)


def test_dpm_timesteps_default_spacing():
    assert dpm_timesteps(1000, 4, "linspace") == [999, 749, 500, 250]
    assert dpm_timesteps(1000, 4, "trailing") == [999, 749, 499, 249]


# -- the exact velocity of Gaussian data ----------------------------------------------------------------

MU, SIGMA = 0.7, 0.3


def optimal_velocity(x, t, y=None):
    """E[eps - x0 | x_t] for x0 ~ N(MU, SIGMA^2): x_t ~ N((1 - t) MU, (1 - t)^2 SIGMA^2 + t^2)."""
    t = t.double().view(-1, *[1] * (x.ndim - 1))
    r = x.double() - (1 - t) * MU
    var = (1 - t) ** 2 * SIGMA**2 + t**2
    return (t * r / var - (MU + (1 - t) * SIGMA**2 * r / var)).float()


@pytest.mark.parametrize("cls,steps", [(FlowEulerSampler, 200), (FlowHeunSampler, 20)])
def test_the_exact_velocity_carries_noise_to_the_data_distribution(cls, steps):
    x = cls(FlowMatching(), steps=steps).sample(optimal_velocity, torch.randn(4000, 1, generator=gen(0)))
    # Standard errors 0.005 (mean) and 0.0034 (std); Euler's discretisation error at 200 steps is below them.
    assert abs(x.mean().item() - MU) < 0.02 and abs(x.std().item() - SIGMA) < 0.015, (x.mean(), x.std())


def test_dpm_solver_pp_on_the_optimal_denoiser_gives_the_data_mean_and_std():
    schedule = NoiseSchedule(1000, "linear")

    def eps_model(x, t, y):
        abar = schedule.alphas_cumprod[t].view(-1, *[1] * (x.ndim - 1)).double()
        a, b = abar.sqrt(), (1 - abar).sqrt()
        return (b * (x.double() - a * MU) / (a**2 * SIGMA**2 + b**2)).float()

    sampler = DPMSolverPlusPlus2M(schedule, "eps", steps=25)
    x = sampler.sample(eps_model, torch.randn(4000, 1, generator=gen(1)))
    # The last step returns x0-hat = E[x0 | x_t] at the last visited t (40 here): if the ODE brought x_t to its
    # true marginal, that has the data's mean and std SIGMA sqrt(a^2 SIGMA^2 / (a^2 SIGMA^2 + b^2)) (0.27, not 0.3).
    abar = schedule.alphas_cumprod[sampler.timesteps()[-1]].item()
    std = SIGMA * (abar * SIGMA**2 / (abar * SIGMA**2 + 1 - abar)) ** 0.5
    assert abs(x.mean().item() - MU) < 0.02 and abs(x.std().item() - std) < 0.01, (x.mean(), x.std(), std)


# -- the module ----------------------------------------------------------------------------------------------


def _net():
    return UNet(
        in_channels=3, image_size=8, base_channels=16, channel_mults=(1, 2), num_res_blocks=1,
        attention_resolutions=(), num_classes=4, norm_groups=8,
    )  # fmt: skip


def test_a_flow_model_refuses_schedule_samplers_and_the_other_way_round():
    with pytest.raises(InputError, match="DDIMSampler samples a noise-schedule"):
        DiffusionModule(_net(), objective=FlowMatching())  # the default sampler is DDIM
    flow = DiffusionModule(_net(), objective=FlowMatching(), sampler=FlowEulerSampler)
    with pytest.raises(InputError, match="DPMSolverPlusPlus2M samples a noise-schedule"):
        flow.sample(2, DPMSolverPlusPlus2M)
    with pytest.raises(InputError, match="FlowHeunSampler samples a flow-matching model"):
        DiffusionModule(_net(), sampler=FlowHeunSampler)


def test_the_flow_module_gives_the_net_1000_t_in_training_and_sampling():
    m = DiffusionModule(_net(), objective=FlowMatching(), sampler=partial(FlowEulerSampler, steps=3))
    seen = []
    forward = m.net.forward
    m.net.forward = lambda x, t, y: seen.append(t.clone()) or forward(x, t, y)
    m._loss((torch.rand(2, 3, 8, 8) * 2 - 1, torch.tensor([0, 1])), t=torch.tensor([0.25, 0.5]))
    torch.testing.assert_close(seen[-1], torch.tensor([250.0, 500.0]))
    m.sample(2, guidance_scale=2.0, labels=[0, 1])  # guided: one batched call of 4 per step
    times = [t[0].item() for t in seen[1:]]
    assert times == pytest.approx([1000.0, 500.5, 1.0]) and all(len(t) == 4 for t in seen[1:])


def test_flow_dit_config_fits_samples_and_reloads(tmp_path):
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "diffusion" / "flow_dit_tiny_shapes16.yaml"),
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false",
        "--model.init_args.sampler.init_args.steps=2",
        "--data.init_args.images.init_args.batch_size=4",
        "--data.init_args.images.init_args.num_train=12",
        "--data.init_args.images.init_args.num_val=4",
        "--data.init_args.images.init_args.num_test=4",
    )
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])
    module = DiffusionModule.load_from_checkpoint(c.trainer.checkpoint_callback.last_model_path).eval()
    assert isinstance(module.objective, FlowMatching) and module.objective.time_sampling == "logit_normal"
    images = module.sample(2, seed=1)
    assert images.shape == (2, 3, 16, 16) and torch.isfinite(images).all()
    torch.testing.assert_close(module.sample(2, seed=1), images)
    assert images.std() > 0
    with pytest.raises(InputError, match="noise-schedule"):
        module.sample(2, DDIMSampler)


def test_a_sampler_of_the_wrong_kind_gets_the_same_line_however_it_is_met():
    """Built directly, checked by the module at construction, or handed to sample(): one check, one message."""
    flow, schedule = FlowMatching(), NoiseSchedule(10)
    messages = []
    for attempt in (
        lambda: DDIMSampler(flow),
        lambda: DiffusionModule(_net(), objective=flow, sampler=partial(DDIMSampler, steps=3)),
        lambda: DiffusionModule(_net(), objective=flow, sampler=FlowEulerSampler).sample(1, DDIMSampler),
        lambda: FlowEulerSampler(schedule),
        lambda: DiffusionModule(_net(), sampler=FlowEulerSampler),
    ):
        with pytest.raises(InputError) as err:
            attempt()
        messages.append(str(err.value))
    assert len(set(messages[:3])) == 1 and "DDIMSampler samples a noise-schedule" in messages[0]
    assert messages[3] == messages[4] and "FlowEulerSampler samples a flow-matching model" in messages[3]


def test_a_cli_built_sampler_of_the_wrong_kind_is_refused_when_the_model_is_built():
    """jsonargparse hands the module its own wrapper of the class, not the class: the module builds it once, so the
    check fires before any training or sampling, as one line naming the sampler."""
    from zoo.app.parser import parser_error_line

    with pytest.raises(ValueError) as err:
        cli(
            "fit",
            "--config",
            str(CONFIGS / "diffusion" / "tiny.yaml"),
            "--model.init_args.sampler=zoo.diffusion.FlowEulerSampler",
            "--trainer.max_steps=1",
        )
    line = parser_error_line(str(err.value))
    assert line == (
        "FlowEulerSampler samples a flow-matching model, not one trained on the noise schedule: use "
        "zoo.diffusion.DDIMSampler, DDPMSampler or DPMSolverPlusPlus2M"
    )
    with pytest.raises(ValueError) as err:  # and the other way round: a flow objective's config, a DDIM sampler
        cli(
            "fit",
            "--config",
            str(CONFIGS / "diffusion" / "flow_unet_shapes.yaml"),
            "--model.init_args.sampler=zoo.diffusion.DDIMSampler",
            "--trainer.max_steps=1",
        )
    assert parser_error_line(str(err.value)).startswith(
        "DDIMSampler samples a noise-schedule (eps, v, x0) model, not one trained with FlowMatching("
    )


def test_each_sampler_states_its_own_settings_as_built():
    schedule = NoiseSchedule(1000)
    assert DDIMSampler(schedule, steps=3, eta=0.5).settings() == {
        "steps": 3, "eta": 0.5, "spacing": "trailing", "steps_offset": 0, "previous": "next", "set_alpha_to_one": True,
        "clipped_eps": True,
    }  # fmt: skip
    assert DPMSolverPlusPlus2M(schedule, steps=4).settings() == {"steps": 4, "spacing": "linspace"}
    assert FlowEulerSampler(FlowMatching(), steps=2).settings() == {"steps": 2, "shift": 1.0, "last_time": 1e-3}
    module = DiffusionModule(_net(), sampler=partial(DDIMSampler, steps=7))  # the module's, built once
    assert module.default_sampler.settings()["steps"] == 7
