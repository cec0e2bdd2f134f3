"""The objectives' one protocol (GaussianDiffusion, FlowMatching), and checkpoints of the shape before it: a module
whose hyperparameters held the noise schedule's settings loads with them as its ``GaussianDiffusion``."""

from __future__ import annotations

from functools import partial

import lightning
import pytest
import torch

from zoo.diffusion import (
    DDIMSampler,
    DiffusionModule,
    FlowEulerSampler,
    FlowMatching,
    GaussianDiffusion,
    UNet,
    denoising_loss,
    flow_matching_loss,
)
from zoo.io import build, trust
from zoo.io.checkpoint import stored_model
from zoo.io.trust import UntrustedConfigError

UNET = dict(
    in_channels=3, image_size=8, base_channels=16, channel_mults=[1, 2], num_res_blocks=1,
    attention_resolutions=[], num_classes=4, norm_groups=8,
)  # fmt: skip
OBJECTIVES = {
    "gaussian": (lambda: GaussianDiffusion(50, "cosine", prediction="v", min_snr_gamma=5.0), DDIMSampler),
    "flow": (lambda: FlowMatching("uniform", shift=3.0), FlowEulerSampler),
}


def _denoiser(x, t, y):  # any fixed function of all three, so the loss depends on each
    return torch.tanh(x * 0.7 + t.float().view(-1, 1, 1, 1) / 1000 + y.view(-1, 1, 1, 1))


@pytest.mark.parametrize("name", OBJECTIVES)
def test_every_objective_gives_times_a_loss_dict_and_its_samplers(name):
    make, sampler = OBJECTIVES[name]
    objective = make()
    g = torch.Generator().manual_seed(0)
    t = objective.sample_time(5, g)
    assert t.shape == (5,) and objective.net_time(t).shape == (5,)
    x0, y, noise = torch.rand(5, 3, 4, 4) * 2 - 1, torch.arange(5) % 2, torch.randn(5, 3, 4, 4)
    out = objective.loss(_denoiser, x0, y, t=t, noise=noise)
    assert "loss" in out and out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    torch.testing.assert_close(objective.loss(_denoiser, x0, y, t=t, noise=noise)["loss"], out["loss"])
    assert objective.sampler(sampler, 1.0).num_calls() > 0


def test_each_objective_s_loss_is_its_pure_function_with_its_own_settings():
    x0, y, noise = torch.rand(4, 3, 4, 4) * 2 - 1, torch.arange(4), torch.randn(4, 3, 4, 4)
    gd, t = GaussianDiffusion(50, "cosine", prediction="v", min_snr_gamma=5.0), torch.tensor([0, 7, 30, 49])
    want = denoising_loss(_denoiser, gd.schedule, x0, y, "v", 5.0, t=t, noise=noise)
    torch.testing.assert_close(gd.loss(_denoiser, x0, y, t=t, noise=noise), want)
    plain = denoising_loss(_denoiser, gd.schedule, x0, y, "v", None, t=t, noise=noise)
    assert not torch.equal(want["loss"], plain["loss"])  # the weighting is used, not only stored
    flow, tf = FlowMatching(), torch.tensor([0.1, 0.4, 0.6, 0.9])
    want = flow_matching_loss(_denoiser, x0, y, tf, noise)
    torch.testing.assert_close(flow.loss(_denoiser, x0, y, t=tf, noise=noise), want)


def test_the_noise_schedule_draws_every_step_and_its_samplers_read_its_prediction():
    gd = GaussianDiffusion(10, prediction="x0")
    steps = gd.sample_time(2000, torch.Generator().manual_seed(0))
    assert steps.dtype == torch.int64 and set(steps.tolist()) == set(range(10))
    sampler = gd.sampler(partial(DDIMSampler, steps=2), None)
    output, x_t = torch.randn(3, 3, 4, 4), torch.randn(3, 3, 4, 4)
    x0, _ = sampler._x0_eps(output, 5, x_t)
    torch.testing.assert_close(x0, output)  # an x0 net's output is x0-hat itself


def test_the_hybrid_loss_weighs_the_bound_by_the_objective_s_vlb_weight():
    def learned_variance(x, t, y):  # the prediction, then v: 2C channels
        return torch.cat([_denoiser(x, t, y), torch.tanh(x)], dim=1)

    x0, y, noise = torch.rand(4, 3, 4, 4) * 2 - 1, torch.arange(4), torch.randn(4, 3, 4, 4)
    gd, t = GaussianDiffusion(50, vlb_weight=0.5), torch.tensor([0, 7, 30, 49])
    got = gd.loss(learned_variance, x0, y, t=t, noise=noise)
    torch.testing.assert_close(got["loss"], got["mse"] + 0.5 * got["vlb"])


def test_a_module_built_in_python_records_its_objective_and_reloads_it(tmp_path):
    module = DiffusionModule(UNet(**UNET), GaussianDiffusion(50, "cosine", prediction="x0"), ema_decay=None)
    path, version = tmp_path / "python.ckpt", lightning.__version__
    state = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    torch.save({**state, "pytorch-lightning_version": version}, path)
    loaded = DiffusionModule.load_from_checkpoint(path, net=UNet(**UNET)).objective  # the net: an object, passed again
    assert loaded.prediction == "x0" and loaded.schedule.beta_schedule == "cosine"
    assert loaded.schedule.num_timesteps == 50
    flow = DiffusionModule(UNet(**UNET), FlowMatching("mode", shift=2.0), sampler=FlowEulerSampler)
    config = flow.hparams["objective"]
    assert config["class_path"] == "zoo.diffusion.flow.FlowMatching"
    assert config["init_args"] == {**FlowMatching()._settings, "time_sampling": "mode", "shift": 2.0}


def test_modules_built_without_an_objective_do_not_share_the_default():
    a, b = DiffusionModule(UNet(**UNET)), DiffusionModule(UNet(**UNET))
    assert isinstance(a.objective, GaussianDiffusion) and a.objective is not b.objective
    assert a.objective.schedule.betas is not b.objective.schedule.betas


# -- checkpoints of the shape before the objective ---------------------------------------------------------------

OLD = {  # what cli.py stored for configs/diffusion/ddpm_unet_mnist.yaml's settings, before the objective
    "_instantiator": trust.LIGHTNING_INSTANTIATOR,
    "_class_path": "zoo.diffusion.DiffusionModule",
    "net": {"class_path": "zoo.diffusion.UNet", "init_args": UNET},
    "num_timesteps": 50,
    "beta_schedule": "cosine",
    "beta_start": 1e-4,
    "beta_end": 0.02,
    "prediction": "v",
    "min_snr_gamma": 5.0,
    "label_dropout": 0.1,
    "clip_denoised": 1.0,
    "ema_decay": None,
    "ema_start_step": 0,
    "optimizer": {"lr": 1e-4, "weight_decay": 0.0, "warmup_steps": 0},
    "compile": False,
    "vlb_weight": 0.002,
    "init_weights": None,
    "sampler": {"class_path": "zoo.diffusion.DDIMSampler", "init_args": {"steps": 4}},
    "guidance_scale": 2.0,
    "objective": None,
    "autoencoder": None,
    "autoencoder_weights": None,
    "latent_scale": "config",
}
NEW = {k: v for k, v in OLD.items() if k not in ("num_timesteps", "beta_schedule", "beta_start", "beta_end",
    "prediction", "min_snr_gamma", "vlb_weight", "objective")}  # fmt: skip
OLD_SCHEDULE = {
    "num_timesteps": 50, "beta_schedule": "cosine", "beta_start": 1e-4, "beta_end": 0.02, "prediction": "v",
    "min_snr_gamma": 5.0, "vlb_weight": 0.002,
}  # fmt: skip


def test_a_checkpoint_of_the_shape_before_the_objective_is_refused_naming_the_version(tmp_path):
    """No migration before a release: the old shape is one line that says which zoo wrote it and what to do, by
    every way in (``load_from_checkpoint``, and ``stored_model``: what ``--ckpt_path`` and MLflow models read)."""
    module = DiffusionModule(UNet(**UNET), GaussianDiffusion(**OLD_SCHEDULE), ema_decay=None)
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": OLD, "pytorch-lightning_version": "2.4.0"}, path)
    for load in (DiffusionModule.load_from_checkpoint, stored_model):
        with pytest.raises(UntrustedConfigError, match=r"written by a zoo from before .* retrain") as err:
            load(path)
        assert "num_timesteps" in str(err.value) and "\n" not in str(err.value)
    torch.save({"state_dict": {}, "hyper_parameters": {**OLD, "_zoo_version": "0.0.9"}}, path)
    with pytest.raises(UntrustedConfigError, match=r"written by zoo 0\.0\.9 and this is zoo 0\.1\.0"):
        stored_model(path)


def test_a_checkpoint_records_the_zoo_version_and_reads_back(tmp_path):
    import zoo

    module = DiffusionModule(UNet(**UNET), ema_decay=None)
    checkpoint = {"hyper_parameters": {"_class_path": "zoo.diffusion.DiffusionModule", **NEW}}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["hyper_parameters"]["_zoo_version"] == zoo.__version__
    part = build.resolve_model(checkpoint["hyper_parameters"], "x.ckpt", trust.zoo_allowlist())
    assert "_zoo_version" not in part.args


@pytest.mark.parametrize("path", ["zoo.diffusion.GaussianDiffusion", "zoo.diffusion.objective.GaussianDiffusion"])
def test_a_stored_config_may_name_the_objective_and_nothing_else_there(path):
    new = {**NEW, "objective": {"class_path": path, "init_args": OLD_SCHEDULE}}
    part = build.resolve_model(new, "x.ckpt", trust.zoo_allowlist())
    module = build.build(part, record=True)
    assert isinstance(module.objective, GaussianDiffusion) and module.objective.prediction == "v"
    with pytest.raises(UntrustedConfigError, match=r"objective\.class_path"):
        build.resolve_model({**new, "objective": {"class_path": "zoo.diffusion.UNet"}}, "x.ckpt", trust.zoo_allowlist())
