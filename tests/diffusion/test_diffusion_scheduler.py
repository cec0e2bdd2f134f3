"""A diffusers pipeline folder samples in the zoo as diffusers samples it: its scheduler config read whole.

A tiny random ``UNet2DModel`` and a ``DDPMScheduler`` / ``DDIMScheduler`` written by diffusers into a pipeline folder;
diffusers' own loop (DDPMPipeline's / DDIMPipeline's: x_T drawn on the generator, then ``scheduler.step`` with the same
generator) against the module ``from_pretrained`` builds, from the same generator seed: sample for sample.
"""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

from zoo.diffusion import from_pretrained
from zoo.diffusion.scheduler_config import scheduler_settings
from zoo.errors import InputError, one_line

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_thread")  # a few hundred forwards of a tiny net

T = 40  # not 1000: the schedule's end points are stated at diffusers' T and the zoo's at 1000


def tiny_unet(out_channels: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=out_channels, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4, attention_head_dim=8,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in unet.parameters():  # diffusers zero-inits output layers: moved, so the net's output matters
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return unet.eval()


def pipeline(tmp_path, scheduler_cls: str, out_channels: int = 3, **config):
    unet = tiny_unet(out_channels)
    scheduler = getattr(diffusers, scheduler_cls)(num_train_timesteps=T, **config)
    pipe_cls = diffusers.DDPMPipeline if scheduler_cls == "DDPMScheduler" else diffusers.DDIMPipeline
    pipe_cls(unet=unet, scheduler=scheduler).save_pretrained(tmp_path / "pipe")
    return unet, scheduler


def theirs(unet, scheduler, steps: int, seed: int, **step_args) -> torch.Tensor:
    """DDPMPipeline.__call__ / DDIMPipeline.__call__ before their clamp to [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 8, 8, generator=g)
    scheduler.set_timesteps(steps)
    with torch.no_grad():
        for t in scheduler.timesteps:
            x = scheduler.step(unet(x, t).sample, t, x, generator=g, **step_args).prev_sample
    return x


def ours(module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(2, 3, 8, 8, generator=g)
    return module.default_sampler.sample(module.net, noise, None, generator=g)


DDPM_CASES = {
    "cosine-v-clipped": dict(beta_schedule="squaredcos_cap_v2", prediction_type="v_prediction", clip_sample_range=1.5),
    "linear-eps-large": dict(beta_schedule="linear", prediction_type="epsilon", variance_type="fixed_large"),
    "scaled-x0-unclipped": dict(
        beta_schedule="scaled_linear", beta_start=0.001, beta_end=0.05, prediction_type="sample", clip_sample=False
    ),
}


@pytest.mark.parametrize("case", DDPM_CASES)
def test_a_ddpm_pipeline_samples_as_diffusers_samples_it(tmp_path, case):
    unet, scheduler = pipeline(tmp_path, "DDPMScheduler", **DDPM_CASES[case])
    module = from_pretrained(tmp_path / "pipe", ema_decay=None)
    torch.testing.assert_close(ours(module, 7), theirs(unet, scheduler, T, 7), atol=3e-5, rtol=1e-5)


def test_a_learned_variance_ddpm_pipeline_samples_as_diffusers_samples_it(tmp_path):
    unet, scheduler = pipeline(tmp_path, "DDPMScheduler", out_channels=6, variance_type="learned_range")
    module = from_pretrained(tmp_path / "pipe", ema_decay=None)
    torch.testing.assert_close(ours(module, 3), theirs(unet, scheduler, T, 3), atol=3e-5, rtol=1e-5)


DDIM_CASES = {  # (config, steps): S = 8 divides T = 40, 6 does not (diffusers steps to t - T // S)
    "cosine-v-trailing": (dict(beta_schedule="squaredcos_cap_v2", prediction_type="v_prediction"), 6),
    "linear-eps-leading-offset": (dict(timestep_spacing="leading", steps_offset=1, set_alpha_to_one=False), 8),
    "linear-eps-linspace": (dict(timestep_spacing="linspace", clip_sample_range=0.5), 6),
    "scaled-x0-trailing": (dict(beta_schedule="scaled_linear", prediction_type="sample", clip_sample=False), 8),
}


@pytest.mark.parametrize("case", DDIM_CASES)
def test_a_ddim_pipeline_samples_as_diffusers_samples_it(tmp_path, case):
    config, steps = DDIM_CASES[case]
    config = {"timestep_spacing": "trailing"} | config
    unet, scheduler = pipeline(tmp_path, "DDIMScheduler", **config)
    stated = scheduler_settings(tmp_path / "pipe" / "scheduler" / "scheduler_config.json", False)["sampler"]
    assert stated["init_args"]["spacing"] == config["timestep_spacing"]
    sampler = {**stated, "init_args": stated["init_args"] | {"steps": steps}}  # a caller's steps over the pipeline's
    module = from_pretrained(tmp_path / "pipe", ema_decay=None, sampler=sampler)
    torch.testing.assert_close(ours(module, 5), theirs(unet, scheduler, steps, 5, eta=0.0), atol=3e-5, rtol=1e-5)


def test_the_schedule_sets_training_too(tmp_path):
    """v-prediction on the cosine schedule: the training target is diffusers' ``get_velocity``."""
    cosine_v = dict(beta_schedule="squaredcos_cap_v2", prediction_type="v_prediction")
    _, scheduler = pipeline(tmp_path, "DDPMScheduler", **cosine_v)
    schedule = from_pretrained(tmp_path / "pipe", ema_decay=None).objective.schedule
    x0, noise, t = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8), torch.tensor([0, 9, 25, T - 1])
    torch.testing.assert_close(schedule.alphas_cumprod, scheduler.alphas_cumprod, atol=1e-6, rtol=1e-5)
    expected = scheduler.get_velocity(x0, noise, t)
    torch.testing.assert_close(schedule.target(x0, noise, t, "v"), expected, atol=1e-5, rtol=1e-5)


REFUSED = {
    "thresholding": dict(thresholding=True),
    "beta_schedule": dict(beta_schedule="sigmoid"),
    "trained_betas": dict(trained_betas=[0.1] * T),
    "rescale_betas_zero_snr": dict(rescale_betas_zero_snr=True),
    "variance_type": dict(variance_type="learned_range"),  # the net outputs no variance
    "prediction_type": dict(prediction_type="flow"),
    "num_train_timesteps": dict(num_train_timesteps=10**9),
    "karras_sigmas": dict(karras_sigmas=True),  # a field DDPMScheduler does not have
    "PNDMScheduler": dict(_class_name="PNDMScheduler"),
}


@pytest.mark.parametrize("field", REFUSED)
def test_a_scheduler_field_the_zoo_does_not_implement_is_refused_by_name(tmp_path, field):
    pipeline(tmp_path, "DDPMScheduler")
    path = tmp_path / "pipe" / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | REFUSED[field]))
    with pytest.raises(InputError) as err:
        from_pretrained(tmp_path / "pipe")
    assert field in str(err.value) and one_line(err.value)


def test_init_weights_from_a_pipeline_refuses_an_objective_other_than_its_scheduler_s(tmp_path):
    """The CLI's path: the config's objective must be the one the pipeline's net was trained on."""
    from zoo.diffusion import DDIMSampler, DiffusionModule, GaussianDiffusion, UNet

    pipeline(tmp_path, "DDPMScheduler", beta_schedule="squaredcos_cap_v2", prediction_type="v_prediction")
    net = from_pretrained(tmp_path / "pipe").hparams["net"]["init_args"]
    module = DiffusionModule(UNet(**net), init_weights=str(tmp_path / "pipe"))
    with pytest.raises(InputError, match="num_timesteps, beta_schedule, prediction") as err:
        module.configure_model()  # no trainer: loads the weights, as fit's first hook does
    assert one_line(err.value) and "prediction=v" in str(err.value)
    stated = GaussianDiffusion(num_timesteps=T, beta_schedule="cosine", prediction="v")
    sampler = partial(DDIMSampler, steps=10)
    DiffusionModule(
        UNet(**net), objective=stated, sampler=sampler, init_weights=str(tmp_path / "pipe")
    ).configure_model()


@pytest.mark.parametrize("spacing", ["leading", "linspace"])
def test_a_ddpm_pipeline_run_with_fewer_steps_is_ddim_with_eta_one_on_the_next_visited_steps(tmp_path, spacing):
    """What the manual says to use for DDPMPipeline(num_inference_steps=S < T)."""
    cosine_v = dict(beta_schedule="squaredcos_cap_v2", prediction_type="v_prediction", timestep_spacing=spacing)
    unet, scheduler = pipeline(tmp_path, "DDPMScheduler", **cosine_v)
    init = {"steps": 8, "eta": 1.0, "spacing": spacing, "previous": "next"}
    module = from_pretrained(tmp_path / "pipe", sampler={"class_path": "zoo.diffusion.DDIMSampler", "init_args": init})
    torch.testing.assert_close(ours(module, 7), theirs(unet, scheduler, 8, 7), atol=3e-5, rtol=1e-5)
