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
    ours = DDPMSampler(schedule, prediction, variance=variance)
    theirs = diffusers.DDPMScheduler(
        num_train_timesteps=T,
        trained_betas=schedule.betas.double().numpy(),
        clip_sample=False,
        prediction_type=THEIR_PREDICTION[prediction],
        variance_type={"beta_tilde": "fixed_small", "beta": "fixed_large"}[variance],
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
    ours = DDIMSampler(schedule, prediction, steps=steps, eta=eta, spacing=spacing)
    theirs = diffusers.DDIMScheduler(
        num_train_timesteps=T,
        trained_betas=schedule.betas.double().numpy(),
        clip_sample=False,
        set_alpha_to_one=True,
        steps_offset=0,
        timestep_spacing=spacing,
        prediction_type=THEIR_PREDICTION[prediction],
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


# -- the UNet against diffusers' UNet2DModel with copied weights ------------------------------------------


def tiny_unet2d(num_classes: int, out_channels: int, flip_sin_to_cos: bool = True):
    """A UNet2DModel shaped like ``tiny_unet``; every weight perturbed (diffusers zero-inits nothing, the zoo's
    zero-init of the last convs would hide a missing branch)."""
    torch.manual_seed(0)
    ref = diffusers.UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=out_channels,
        block_out_channels=(16, 32),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=16,
        norm_num_groups=8,
        num_class_embeds=num_classes + 1,
        flip_sin_to_cos=flip_sin_to_cos,
    ).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return ref


def tiny_unet(num_classes: int, learn_sigma: bool):
    from zoo.diffusion import UNet

    return UNet(
        in_channels=3,
        image_size=8,
        base_channels=16,
        channel_mults=(1, 2),
        num_res_blocks=2,
        attention_resolutions=(4,),
        num_heads=2,
        dropout=0.0,
        num_classes=num_classes,
        norm_groups=8,
        learn_sigma=learn_sigma,
    ).eval()


@pytest.mark.parametrize("flip_sin_to_cos", [True, False])
@pytest.mark.parametrize("learn_sigma", [False, True])
def test_unet_equals_diffusers_unet2d_with_copied_weights(tmp_path, learn_sigma, flip_sin_to_cos):
    """The whole net: time embedding, residual blocks (step bias, skip conv), attention (2 heads), the skips'
    order, down/upsampling, the mid block and the class embedding (null class included) must all agree."""
    from zoo.diffusion.convert import load_pretrained

    num_classes = 4
    ref = tiny_unet2d(num_classes, 6 if learn_sigma else 3, flip_sin_to_cos)
    ref.save_pretrained(tmp_path)  # the weights file and its config.json beside it
    net = load_pretrained(tiny_unet(num_classes, learn_sigma), tmp_path / "diffusion_pytorch_model.safetensors")
    torch.manual_seed(1)
    x, t, y = torch.randn(3, 3, 8, 8), torch.tensor([0, 37, 999]), torch.tensor([0, 3, num_classes])
    with torch.no_grad():
        want = ref(x, t, class_labels=y).sample
        got = net(x, t, y)
    assert got.shape == want.shape == (3, 6 if learn_sigma else 3, 8, 8)
    assert want.abs().mean() > 0.1  # a real signal, not the zero-init output
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # and the step and the label reach the output on both sides
        assert not torch.allclose(net(x, t.flip(0), y), got, atol=1e-3)
        assert not torch.allclose(net(x, t, y.flip(0)), got, atol=1e-3)


# -- min-SNR-gamma weighting (Hang et al. 2023) by its closed form -----------------------------------------


@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
def test_min_snr_loss_equals_its_closed_form(prediction):
    """loss = mean_b w_b ||out_b - target_b||^2 / D, with SNR_t = abar_t / (1 - abar_t) and
    w = min(SNR, gamma) / SNR (eps), min(SNR, gamma) / (SNR + 1) (v), min(SNR, gamma) (x0): the weights of
    Hang et al. 2023, sec. 3.4, as diffusers' training scripts write them; built here from the betas alone."""
    from zoo.diffusion.losses import denoising_loss

    gamma, T_ = 5.0, 1000
    schedule = NoiseSchedule(T_, "linear")
    betas = torch.linspace(1e-4, 0.02, T_, dtype=torch.float64)  # DDPM's linear schedule, independently
    abar = torch.cumprod(1 - betas, 0)
    t = torch.tensor([0, 30, 150, 400, 999])  # SNR from ~1e4 down to ~4e-5: both sides of gamma
    snr = abar[t] / (1 - abar[t])
    assert (snr > gamma).any() and (snr < gamma).any()
    g = gen(0)
    x0, noise, out = (torch.randn(5, 2, 4, 4, generator=g, dtype=torch.float64) for _ in range(3))
    a, s = abar[t].sqrt().view(-1, 1, 1, 1), (1 - abar[t]).sqrt().view(-1, 1, 1, 1)
    target = {"eps": noise, "x0": x0, "v": a * noise - s * x0}[prediction]
    mse = (out - target).pow(2).flatten(1).mean(1)
    w = {"eps": snr.clamp(max=gamma) / snr, "v": snr.clamp(max=gamma) / (snr + 1), "x0": snr.clamp(max=gamma)}[
        prediction
    ]
    model = lambda x_t, t_, y: out.float()  # noqa: E731 -- a fixed output: the loss is then a closed form
    got = denoising_loss(model, schedule, x0.float(), None, prediction, gamma, t=t, noise=noise.float())
    torch.testing.assert_close(got["mse"].double(), mse.mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["loss"].double(), (w * mse).mean(), rtol=1e-4, atol=1e-6)
    plain = denoising_loss(model, schedule, x0.float(), None, prediction, None, t=t, noise=noise.float())
    torch.testing.assert_close(plain["loss"], plain["mse"])  # gamma None: unweighted
