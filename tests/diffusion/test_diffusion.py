"""Diffusion family: the schedule against the papers, samplers against Gaussian data in closed form, nets.

For data x0 ~ N(mu, s^2) every quantity is Gaussian: x_t ~ N(sqrt(abar) mu, abar s^2 + 1 - abar) and the
optimal noise predictor is E[eps | x_t] = sqrt(1 - abar) (x_t - sqrt(abar) mu) / (abar s^2 + 1 - abar).
Plugged into a sampler, each step is affine in x_t plus Gaussian noise, so the exact mean and variance of
the samples follow from a scalar recursion written here from the papers' formulas (not from the sampler
code). The samplers must land on those moments within 4 standard errors of N samples: mean s / sqrt(N),
variance s^2 sqrt(2 / (N - 1)). The recursion itself shows the discretisation error, which is
O(1 / steps): at T = 1000 it is within 4% of the data's variance for these distributions.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from torch import nn

from zoo.diffusion import (
    ClassifierFreeGuidance,
    DDIMSampler,
    DDPMSampler,
    DiffusionModule,
    DiT,
    GaussianDiffusion,
    NoiseSchedule,
    UNet,
)
from zoo.diffusion.dit import SIZES
from zoo.diffusion.samplers import Sampler, ddim_timesteps, split_variance
from zoo.train.optim import param_groups

MU, S = torch.tensor([0.5, -0.3]), torch.tensor([0.5, 0.2])  # two independent 1-D Gaussians
N = 20_000


pytestmark = pytest.mark.usefixtures("one_thread")


# -- schedule ------------------------------------------------------------------------------------------


def test_linear_alphas_cumprod_match_ho_et_al():
    s = NoiseSchedule(1000, "linear", 1e-4, 0.02)
    beta = lambda t: 1e-4 + (t - 1) * (0.02 - 1e-4) / 999  # noqa: E731  paper's t = 1..T
    for t in (1, 2, 10, 500, 1000):
        want = math.prod(1 - beta(u) for u in range(1, t + 1))
        assert s.alphas_cumprod[t - 1].item() == pytest.approx(want, rel=1e-5), t
    assert s.alphas_cumprod[-1].item() == pytest.approx(4.036e-5, rel=1e-3)  # x_T is noise: sqrt(abar_T) ~ 0.0064


def test_linear_schedule_keeps_its_endpoints_for_any_T():
    # Nichol & Dhariwal scale the betas by 1000 / T, so abar_T stays about that of T = 1000.
    s250, s1000 = NoiseSchedule(250, "linear"), NoiseSchedule(1000, "linear")
    assert s250.betas[0].item() == pytest.approx(4e-4) and s250.betas[-1].item() == pytest.approx(0.08)
    assert math.log(s250.alphas_cumprod[-1]) == pytest.approx(math.log(s1000.alphas_cumprod[-1]), rel=0.03)


@pytest.mark.parametrize("T", [1000, 4000])
def test_cosine_alphas_cumprod_match_nichol_dhariwal(T):
    s = NoiseSchedule(T, "cosine")
    f = lambda t: math.cos((t / T + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731  eq. 17
    for t in (1, T // 4, T // 2, 3 * T // 4, T - 10):
        assert s.alphas_cumprod[t - 1].item() == pytest.approx(f(t) / f(0), rel=1e-5), t
    assert s.betas.max().item() == pytest.approx(0.999)  # the clip at t = T
    assert s.alphas_cumprod[T // 2 - 1].item() == pytest.approx(0.4936, abs=1e-3)  # about half the signal mid-way


def _fixture_batch(shape=(4, 3, 8, 8), T=1000):
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    t = torch.tensor([0, 1, T // 2, T - 1])
    return x0, eps, t


@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_prediction_types_convert_back_to_x0_and_eps(prediction, kind):
    s = NoiseSchedule(1000, kind)
    x0, eps, t = _fixture_batch()
    x_t = s.add_noise(x0, eps, t)
    out = s.target(x0, eps, t, prediction)
    x0_hat, eps_hat = s.to_x0_eps(out, x_t, t, prediction)
    # eps from x0 divides by sqrt(1 - abar) (~1e-2 at t=0), x0 from eps by sqrt(abar_T) (~6e-3): float32 errors grow
    # there
    torch.testing.assert_close(x0_hat, x0, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(eps_hat, eps, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(s.from_x0_eps(x0_hat, eps_hat, t, prediction), out, atol=1e-4, rtol=1e-4)


def test_v_is_the_velocity_of_salimans_and_ho():
    # v = d x_t / d phi for x_t = cos(phi) x0 + sin(phi) eps (Salimans & Ho 2022, sec. 4)
    s = NoiseSchedule(1000, "cosine")
    x0, eps, t = _fixture_batch()
    phi = torch.atan2((1 - s.alphas_cumprod[t]).sqrt(), s.alphas_cumprod[t].sqrt()).view(-1, 1, 1, 1)
    torch.testing.assert_close(s.target(x0, eps, t, "v"), -torch.sin(phi) * x0 + torch.cos(phi) * eps)


def test_min_snr_weights_give_one_loss_whatever_the_prediction_type():
    # The same wrong (x0-hat, eps-hat) costs min(SNR, gamma) * ||x0 - x0-hat||^2 in every parametrisation.
    s = NoiseSchedule(1000, "linear")
    x0, eps, t = _fixture_batch()
    x_t = s.add_noise(x0, eps, t)
    x0_hat = x0 + 0.1 * torch.randn_like(x0)
    eps_hat = s.to_x0_eps(x0_hat, x_t, t, "x0")[1]
    want = s.snr(t).clamp(max=5.0) * (x0 - x0_hat).pow(2).flatten(1).mean(1)
    for p in ("eps", "v", "x0"):
        pred, target = s.from_x0_eps(x0_hat, eps_hat, t, p), s.target(x0, eps, t, p)
        got = s.min_snr_weight(t, p, 5.0) * (pred - target).pow(2).flatten(1).mean(1)
        torch.testing.assert_close(got, want, rtol=2e-3, atol=1e-6, msg=p)


def test_schedule_has_no_parameters_and_moves_with_to():
    s = NoiseSchedule(10)
    assert not isinstance(s, nn.Module)
    assert s.to("cpu") is s and s.device.type == "cpu"
    assert s.alphas_cumprod.dtype == torch.float32


# -- samplers on Gaussian data -------------------------------------------------------------------------


def optimal_eps(schedule: NoiseSchedule):
    def model(x, t, y):
        abar = schedule.alphas_cumprod[t].view(-1, 1)
        return (1 - abar).sqrt() * (x - abar.sqrt() * MU) / (abar * S**2 + 1 - abar)

    return model


def exact_moments(schedule, timesteps, eta=None, ddpm_variance=None):
    """Mean and variance of samples, from x_T ~ N(0, 1) through the samplers' updates with the optimal predictor.

    Each step is x' = sqrt(abar') x0-hat + sqrt(1 - abar' - sigma^2) eps-hat + sigma_noise z (DDIM eq. 12;
    sigma^2 = eta^2 beta-tilde, eq. 16). With sigma^2 = beta-tilde the mean is DDPM's posterior mean (Song
    et al. 2021, sec. 4.1), so DDPM is the case ``ddpm_variance``: its noise is beta-tilde_t or beta_t.
    With E[x0 | x_t] = mu + k (x_t - sqrt(abar) mu), every step is x' = A x + B + sigma_noise z.
    """
    abar, beta = schedule.alphas_cumprod.double().tolist(), schedule.betas.double().tolist()
    mean, var = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    mu, s2 = MU.double(), S.double() ** 2
    for t, tp in zip(timesteps, timesteps[1:] + [-1]):
        a, ap = abar[t], (abar[tp] if tp >= 0 else 1.0)
        beta_tilde = (1 - ap) / (1 - a) * (1 - a / ap)  # = beta-tilde_t when ap = abar_{t-1}
        sigma2 = beta_tilde if ddpm_variance else eta**2 * beta_tilde
        noise = {"beta_tilde": beta_tilde, "beta": beta[t], None: sigma2}[ddpm_variance] if tp >= 0 else 0.0
        k = math.sqrt(a) * s2 / (a * s2 + 1 - a)
        c_eps = math.sqrt(max(1 - ap - sigma2, 0.0)) / math.sqrt(
            1 - a
        )  # eps-hat = (x_t - sqrt(a) x0-hat) / sqrt(1 - a)
        A = math.sqrt(ap) * k + c_eps * (1 - math.sqrt(a) * k)
        B = (math.sqrt(ap) - c_eps * math.sqrt(a)) * (mu - k * math.sqrt(a) * mu)
        mean, var = A * mean + B, A**2 * var + noise
    return mean.float(), var.float()


def _sample(sampler, seed=0):
    g = torch.Generator().manual_seed(seed)
    return sampler.sample(optimal_eps(sampler.schedule), torch.randn(N, 2, generator=g), None, g)


def _assert_moments(x, mean, var):
    se_mean, se_var = S / math.sqrt(N), S**2 * math.sqrt(2 / (N - 1))
    assert ((x.mean(0) - mean).abs() < 4 * se_mean).all(), (x.mean(0), mean)
    assert ((x.var(0) - var).abs() < 4 * se_var).all(), (x.var(0), var)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
@pytest.mark.parametrize("variance", ["beta_tilde", "beta"])
def test_ddpm_with_the_optimal_denoiser_reproduces_gaussian_data(kind, variance):
    schedule = NoiseSchedule(1000, kind)
    sampler = DDPMSampler(schedule, variance=variance)
    mean, var = exact_moments(schedule, sampler.timesteps(), ddpm_variance=variance)
    # The discretisation error at T = 1000: beta-tilde ignores Var[x0 | x_t] (a few % for narrow data).
    torch.testing.assert_close(mean, MU, atol=1e-3, rtol=0)
    assert ((var / S**2 - 1).abs() < 0.04).all(), var / S**2
    _assert_moments(_sample(sampler), mean, var)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_ddim_over_all_steps_reproduces_gaussian_data(kind):
    schedule = NoiseSchedule(1000, kind)
    sampler = DDIMSampler(schedule, steps=1000, eta=0.0)
    mean, var = exact_moments(schedule, sampler.timesteps(), eta=0.0)
    assert ((mean - MU).abs() < 0.01 * S).all(), mean  # the ODE's Euler error, O(1 / steps)
    assert ((var / S**2 - 1).abs() < 0.02).all(), var / S**2
    _assert_moments(_sample(sampler), mean, var)


@pytest.mark.parametrize(
    ("steps", "eta", "spacing"), [(50, 0.0, "trailing"), (50, 1.0, "leading"), (20, 0.5, "linspace")]
)
def test_ddim_with_few_steps_lands_on_its_exact_moments(steps, eta, spacing):
    # Few steps under-disperse narrow data (the Euler error of the DDIM ODE: variance -25% for s = 0.2 at
    # 50 steps); the sampler must still match the moments of its own discretisation.
    schedule = NoiseSchedule(1000, "linear")
    sampler = DDIMSampler(schedule, steps=steps, eta=eta, spacing=spacing)
    mean, var = exact_moments(schedule, sampler.timesteps(), eta=eta)
    _assert_moments(_sample(sampler), mean, var)


def test_ddim_eta0_maps_the_same_noise_to_the_same_sample():
    schedule = NoiseSchedule(1000, "linear")
    sampler = DDIMSampler(schedule, steps=20, eta=0.0)
    noise = torch.randn(8, 2)
    a = sampler.sample(optimal_eps(schedule), noise, None, torch.Generator().manual_seed(1))
    b = sampler.sample(optimal_eps(schedule), noise.clone(), None, torch.Generator().manual_seed(2))
    assert torch.equal(a, b)
    c = sampler.sample(optimal_eps(schedule), noise + 0.1, None)
    assert not torch.allclose(a, c)


def test_ddim_eta1_over_all_steps_is_ddpm():
    schedule = NoiseSchedule(200, "cosine")
    noise = torch.randn(16, 2)
    a = DDPMSampler(schedule).sample(optimal_eps(schedule), noise, None, torch.Generator().manual_seed(3))
    ddim = DDIMSampler(schedule, steps=200, eta=1.0)
    b = ddim.sample(optimal_eps(schedule), noise, None, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prediction", ["v", "x0"])
def test_samplers_convert_other_prediction_types(prediction):
    # The same optimal denoiser, re-expressed as v or x0, gives the same samples.
    schedule = NoiseSchedule(100, "linear")
    eps_model = optimal_eps(schedule)

    def model(x, t, y):
        x0, eps = schedule.to_x0_eps(eps_model(x, t, y), x, t, "eps")
        return schedule.from_x0_eps(x0, eps, t, prediction)

    noise = torch.randn(64, 2)
    for make in (lambda p: DDPMSampler(schedule, p), lambda p: DDIMSampler(schedule, p, steps=10, eta=0.5)):
        ref = make("eps").sample(eps_model, noise, None, torch.Generator().manual_seed(0))
        got = make(prediction).sample(model, noise, None, torch.Generator().manual_seed(0))
        torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-3)


def test_ddim_timestep_spacings():
    assert ddim_timesteps(1000, 5, "leading") == [800, 600, 400, 200, 0]
    assert ddim_timesteps(1000, 5, "trailing") == [999, 799, 599, 399, 199]
    assert ddim_timesteps(1000, 5, "linspace") == [999, 749, 500, 250, 0]
    assert ddim_timesteps(10, 10, "leading") == list(range(9, -1, -1))
    with pytest.raises(ValueError, match="steps"):
        ddim_timesteps(10, 11, "leading")


# -- classifier-free guidance --------------------------------------------------------------------------


class CountingModel:
    """A label-dependent toy denoiser that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x, t, y):
        self.calls += 1
        return x * (y.float() + 1).view(-1, 1) + t.float().view(-1, 1)


def test_guidance_scale_one_is_the_conditional_model_and_zero_the_unconditional():
    x, t, y = torch.randn(4, 2), torch.tensor([5, 5, 7, 7]), torch.tensor([0, 1, 2, 1])
    null = torch.full_like(y, 3)
    model = CountingModel()
    torch.testing.assert_close(ClassifierFreeGuidance(model, 1.0, 3)(x, t, y), model(x, t, y))
    torch.testing.assert_close(ClassifierFreeGuidance(model, 0.0, 3)(x, t, y), model(x, t, null))
    model.calls = 0
    got = ClassifierFreeGuidance(model, 4.0, 3)(x, t, y)
    assert model.calls == 1  # cond and uncond in one batched call
    torch.testing.assert_close(got, model(x, t, null) + 4.0 * (model(x, t, y) - model(x, t, null)))


def test_guidance_through_a_net_at_scale_one_equals_the_conditional_net():
    torch.manual_seed(0)
    net = UNet(
        3,
        8,
        base_channels=8,
        channel_mults=(1, 2),
        num_res_blocks=1,
        attention_resolutions=(4,),
        num_classes=5,
        norm_groups=4,
    ).eval()
    for p in net.parameters():  # leave the zero init, so the output depends on the label
        nn.init.normal_(p, std=0.05)
    x, t, y = torch.randn(3, 3, 8, 8), torch.tensor([1, 50, 99]), torch.tensor([0, 4, 2])
    cfg = ClassifierFreeGuidance(net, 1.0, null_label=5)
    torch.testing.assert_close(cfg(x, t, y), net(x, t, y))
    batched = ClassifierFreeGuidance(net, 1.0 + 1e-6, null_label=5)(x, t, y)  # the two-half path
    torch.testing.assert_close(batched, net(x, t, y), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(net(x, t, y), net(x, t, torch.full_like(y, 5)))


# -- denoisers -----------------------------------------------------------------------------------------

NETS = {
    "unet": lambda: UNet(
        3, 16, base_channels=16, channel_mults=(1, 2), num_res_blocks=1, attention_resolutions=(8,), norm_groups=8
    ),
    "unet-cond": lambda: UNet(
        1,
        8,
        base_channels=8,
        channel_mults=(1, 2),
        num_res_blocks=2,
        attention_resolutions=(4,),
        num_classes=10,
        norm_groups=4,
        num_heads=2,
    ),
    "dit": lambda: DiT("S", 4, image_size=16, in_channels=3, num_classes=0, depth=2, hidden_size=32, num_heads=2),
    "dit-cond": lambda: DiT.preset(
        "S/2", image_size=8, in_channels=3, num_classes=6, depth=2, hidden_size=32, num_heads=4
    ),
    "dit-learn-sigma": lambda: DiT(
        "B", 2, image_size=8, in_channels=4, num_classes=3, depth=1, hidden_size=16, num_heads=2, learn_sigma=True
    ),
    "unet-learn-sigma": lambda: UNet(
        3,
        8,
        base_channels=8,
        channel_mults=(1, 2),
        num_res_blocks=1,
        attention_resolutions=(4,),
        num_classes=2,
        norm_groups=4,
        learn_sigma=True,
    ),
}


@pytest.mark.parametrize("name", NETS)
def test_every_net_forward_backward_finite(name):
    torch.manual_seed(0)
    net = NETS[name]()
    b, c, s = 3, net.in_channels, net.image_size
    x, t = torch.randn(b, c, s, s), torch.tensor([0, 10, 999])
    y = torch.tensor([0, 1, net.num_classes]) if net.num_classes else None  # the null class too
    out = net(x, t, y)
    assert out.shape == (b, c * (2 if name.endswith("sigma") else 1), s, s)
    (out.pow(2).mean() + sum(p.pow(2).sum() for p in net.parameters()) * 1e-6).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters()), name


@pytest.mark.parametrize("name", NETS)
def test_param_groups_partition_every_denoiser_parameter(name):
    net = NETS[name]()
    decay, no_decay = param_groups(net, 0.1)
    ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert len(ids) == len(set(ids)) == sum(1 for _ in net.parameters())
    names = {id(p): n for n, p in net.named_parameters()}
    assert all(p.ndim >= 2 and "embedding_table" not in names[id(p)] for p in decay["params"])


@pytest.mark.parametrize("name", NETS)
def test_denoisers_start_as_the_zero_predictor(name):
    net = NETS[name]()
    x = torch.randn(2, net.in_channels, net.image_size, net.image_size)
    assert net(x, torch.tensor([3, 500])).abs().max() == 0


def test_dit_blocks_start_as_the_identity():
    torch.manual_seed(0)
    net = DiT.preset("S/2", image_size=8, in_channels=3, num_classes=6, depth=3, hidden_size=48, num_heads=4)
    tokens = net.x_embedder(torch.randn(2, 3, 8, 8)) + net.pos_embed  # (B, N, D)
    c = net.condition(torch.tensor([1, 900]), torch.tensor([2, 6]))  # 6 = the null class
    assert tokens.shape == (2, 16, 48) and c.shape == (2, 48)
    for i, block in enumerate(net.blocks):
        assert torch.equal(block(tokens, c), tokens), i
    nn.init.normal_(net.blocks[0].adaLN_modulation[-1].weight, std=0.02)  # the gates open with training
    assert not torch.allclose(net.blocks[0](tokens, c), tokens)


def test_dit_presets_are_the_papers_table():
    assert SIZES == {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
    net = DiT.preset("S/8", image_size=32, in_channels=4, num_classes=1000)
    assert len(net.blocks) == 12 and net.pos_embed.shape == (1, 16, 384) and net.patch_size == 8
    # DiT-S/2 on 256px (32x32x4 latents): 33M parameters in the paper (table 1).
    assert sum(p.numel() for p in DiT.preset("S/2").parameters()) == pytest.approx(33e6, rel=0.02)
    assert sum(p.numel() for p in UNet().parameters()) == pytest.approx(35.7e6, rel=0.01)  # DDPM CIFAR-10


def test_dit_sincos_position_embedding_is_mae_s():
    from zoo.diffusion.dit import sincos_2d

    pe = sincos_2d(8, 3)  # (9, 8): [sin w, cos w] over 2 frequencies, then [sin h, cos h]
    row, col = 1, 2
    w, h = float(col), float(row)
    want = [
        math.sin(w),
        math.sin(w / 100),
        math.cos(w),
        math.cos(w / 100),
        math.sin(h),
        math.sin(h / 100),
        math.cos(h),
        math.cos(h / 100),
    ]
    torch.testing.assert_close(pe[row * 3 + col], torch.tensor(want))


# -- module --------------------------------------------------------------------------------------------


def _module(**kwargs) -> DiffusionModule:
    torch.manual_seed(0)
    return DiffusionModule(NETS["dit-cond"](), GaussianDiffusion(50), **kwargs)


def test_sample_is_seeded_and_in_range():
    m = _module()
    for p in m.net.parameters():
        nn.init.normal_(p, std=0.02)
    a = m.sample(4, partial(DDIMSampler, steps=5), guidance_scale=3.0, seed=7)
    b = m.sample(4, partial(DDIMSampler, steps=5), guidance_scale=3.0, seed=7)
    c = m.sample(4, DDPMSampler, seed=7, labels=[5, 5, 5, 5])
    assert a.shape == (4, 3, 8, 8) and torch.equal(a, b) and not torch.equal(a, c)
    assert a.abs().max() <= 1 and m.training  # back in the mode it was in


@pytest.mark.parametrize(("prediction", "min_snr_gamma"), [("eps", None), ("v", 5.0), ("x0", None), ("eps", 5.0)])
def test_training_steps_lower_the_loss(prediction, min_snr_gamma):
    torch.manual_seed(0)
    net = UNet(
        3,
        8,
        base_channels=16,
        channel_mults=(1, 2),
        num_res_blocks=1,
        attention_resolutions=(4,),
        num_classes=6,
        norm_groups=8,
    )
    m = DiffusionModule(net, GaussianDiffusion(50, prediction=prediction, min_snr_gamma=min_snr_gamma))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    y = torch.arange(16) % 6
    x0 = (torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(1)).round() * 2 - 1)[y]  # an image per class
    fixed = dict(t=torch.arange(16) * 3, noise=torch.randn(x0.shape, generator=torch.Generator().manual_seed(0)))
    before = m._loss((x0, y), **fixed)["loss"].item()
    for _ in range(40):
        loss = m._loss((x0, y))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert m._loss((x0, y), **fixed)["loss"].item() < 0.9 * before


# -- Fréchet distance ----------------------------------------------------------------------------------


def test_frechet_distance_matches_the_closed_forms():
    from scipy import linalg

    # The formula behind callbacks.FrechetDistance and FrechetInceptionDistance: torchmetrics' FID.
    from torchmetrics.image.fid import _compute_fid

    frechet_distance = lambda *args: float(_compute_fid(*args))  # noqa: E731
    # 1-D: (m1 - m2)^2 + (s1 - s2)^2
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    assert frechet_distance(t(1.0), t([4.0]), t(-1.0), t([1.0])) == pytest.approx(5.0)
    g = torch.Generator().manual_seed(0)
    a, b, mu1 = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((6, 6), (6, 6), (6,)))
    c1, c2, mu2 = a @ a.T, b @ b.T + 0.1 * torch.eye(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    # the FID code's formula, with scipy's non-symmetric matrix square root
    cross = linalg.sqrtm(c1.numpy() @ c2.numpy()).real.trace()
    want = float((mu1 - mu2).pow(2).sum() + c1.trace() + c2.trace() - 2 * cross)
    assert frechet_distance(mu1, c1, mu2, c2) == pytest.approx(want, rel=1e-6)
    assert frechet_distance(mu1, c1, mu1, c1) == pytest.approx(0.0, abs=1e-6)


def test_classifier_features_are_the_input_of_the_last_linear_layer():
    from zoo.cnn import ConvNet
    from zoo.diffusion.metrics import ClassifierFeatures

    net = ConvNet(num_classes=6, in_channels=3, width=4, depth=2).eval()
    feats = ClassifierFeatures(net, mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2))
    x = torch.rand(5, 3, 8, 8) * 2 - 1
    standardised = ((x + 1) / 2 - torch.tensor([0.5, 0.4, 0.3]).view(-1, 1, 1)) / 0.2
    torch.testing.assert_close(feats(x), net.features(standardised).mean(dim=(2, 3)))
    assert feats.num_features == feats(x).shape[1]
    feats.train()
    assert not net.training and not any(p.requires_grad for p in net.parameters())


# -- DiT weights from diffusers ------------------------------------------------------------------------


def test_dit_converted_from_diffusers_matches_its_outputs(tmp_path):
    diffusers = pytest.importorskip("diffusers")

    from zoo.diffusion.convert import load_dit_weights

    num_classes = 10
    torch.manual_seed(0)
    ref = diffusers.DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=8,
        num_layers=3,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=num_classes,
        norm_eps=1e-6,  # DiT's LayerNorm eps (diffusers' default 1e-5)
    ).eval()
    with torch.no_grad():
        for p in ref.parameters():  # diffusers zero-inits the adaLN and output layers: make every path count
            p.add_(0.02 * torch.randn_like(p))
        # A published checkpoint converted by diffusers has one step and label embedder copied into every block.
        first = ref.transformer_blocks[0].norm1.emb
        for block in ref.transformer_blocks[1:]:
            block.norm1.emb.load_state_dict(first.state_dict())
    ref.save_pretrained(tmp_path)  # diffusers' weights with their config.json, without which they are refused

    net = DiT(
        "S",
        2,
        image_size=8,
        in_channels=4,
        num_classes=num_classes,
        depth=3,
        hidden_size=32,
        num_heads=2,
        learn_sigma=True,
        time_freq_shift=1,
    ).eval()
    load_dit_weights(net, tmp_path / "diffusion_pytorch_model.safetensors")
    x, t = torch.randn(3, 4, 8, 8), torch.tensor([0, 250, 999])
    y = torch.tensor([1, 7, num_classes])  # the null class too
    with torch.no_grad():
        want = ref(x, timestep=t, class_labels=y).sample
        got = net(x, t, y)
    assert got.shape == want.shape == (3, 8, 8, 8)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    net.t_embedder.freq_shift = 0.0  # the reference DiT's step features: not what diffusers computes
    with torch.no_grad():
        assert not torch.allclose(net(x, t, y), want, atol=1e-3)
    net.t_embedder.freq_shift = 1.0
    # Published DiT weights (the reference key layout) load the same numbers unchanged.
    torch.save({**net.state_dict(), "pos_embed": net.pos_embed}, tmp_path / "DiT-tiny.pt")
    again = DiT(
        "S",
        2,
        image_size=8,
        in_channels=4,
        num_classes=num_classes,
        depth=3,
        hidden_size=32,
        num_heads=2,
        learn_sigma=True,
        time_freq_shift=1,
    ).eval()
    load_dit_weights(again, tmp_path / "DiT-tiny.pt")
    with torch.no_grad():
        torch.testing.assert_close(again(x, t, y), got, atol=0, rtol=0)


# -- learned variance (Nichol & Dhariwal 2021) ---------------------------------------------------------


def test_normal_kl_matches_torch_distributions():
    from torch.distributions import Normal, kl_divergence

    from zoo.diffusion.losses import normal_kl

    g = torch.Generator().manual_seed(0)
    m1, m2, lv1, lv2 = (torch.randn(100, generator=g, dtype=torch.float64) * 2 for _ in range(4))
    want = kl_divergence(Normal(m1, (0.5 * lv1).exp()), Normal(m2, (0.5 * lv2).exp()))
    torch.testing.assert_close(normal_kl(m1, lv1, m2, lv2), want)
    assert normal_kl(m1, lv1, m1, lv1).abs().max() < 1e-12


@pytest.mark.parametrize(("mean", "scale"), [(0.0, 0.1), (0.3, 0.01), (-0.99, 0.5), (0.9, 3e-3), (2.5, 0.05)])
def test_discretized_gaussian_is_a_distribution_over_the_256_levels(mean, scale):
    from zoo.diffusion.losses import discretized_gaussian_log_likelihood

    levels = torch.arange(256, dtype=torch.float64) / 255 * 2 - 1  # 8-bit pixels in [-1, 1]
    f64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    log_p = discretized_gaussian_log_likelihood(levels, f64(mean), f64(math.log(scale)))
    assert log_p.exp().sum().item() == pytest.approx(1.0, abs=1e-6)
    # An inner bin's mass is the density integrated over [x - 1/255, x + 1/255] (Simpson's rule here).
    k = int((min(max(mean, -0.9), 0.9) + 1) * 127.5)
    edges = torch.linspace(levels[k] - 1 / 255, levels[k] + 1 / 255, 2001, dtype=torch.float64)
    density = torch.exp(-0.5 * ((edges - mean) / scale) ** 2) / (scale * math.sqrt(2 * math.pi))
    w = torch.ones(2001, dtype=torch.float64)
    w[1:-1:2], w[2:-1:2] = 4, 2
    mass = float((w * density).sum() * (edges[1] - edges[0]) / 3)
    assert log_p[k].exp().item() == pytest.approx(mass, rel=1e-6, abs=2e-12)  # masses floor at 1e-12


def test_discretized_gaussian_agrees_with_the_reference_tanh_approximation():
    # improved-diffusion / DiT approximate the normal CDF with tanh; the exact CDF differs by < 3e-4 in mass.
    from zoo.diffusion.losses import discretized_gaussian_log_likelihood

    def approx_cdf(x):
        return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))

    levels = torch.arange(256, dtype=torch.float64) / 255 * 2 - 1
    mean, scale = torch.tensor(0.1, dtype=torch.float64), 0.05
    upper, lower = (levels - mean + 1 / 255) / scale, (levels - mean - 1 / 255) / scale
    ref = torch.where(
        levels < -0.999,
        approx_cdf(upper),
        torch.where(levels > 0.999, 1 - approx_cdf(lower), approx_cdf(upper) - approx_cdf(lower)),
    )
    got = discretized_gaussian_log_likelihood(levels, mean, torch.tensor(math.log(scale), dtype=torch.float64)).exp()
    assert (got - ref).abs().max() < 3e-4


def test_q_posterior_is_the_bayes_posterior():
    # q(x_{t-1} | x_t, x_0) is proportional to
    # N(x_t; sqrt(alpha_t) x_{t-1}, beta_t) N(x_{t-1}; sqrt(abar_{t-1}) x_0, 1 - abar_{t-1}): precisions add, and so do
    # the precision-weighted means.
    s = NoiseSchedule(1000, "linear")
    x0, x_t = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    t = torch.tensor([1, 400, 999])
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)  # Ho et al.'s, in float64 (1 - abar ~ 1e-4 early)
    beta, abar_prev = betas[t].view(-1, 1), torch.cumprod(1 - betas, 0)[t - 1].view(-1, 1)
    precision = (1 - beta) / beta + 1 / (1 - abar_prev)
    want_mean = ((1 - beta).sqrt() / beta * x_t + abar_prev.sqrt() / (1 - abar_prev) * x0) / precision
    mean, var, log_var = s.q_posterior(x0, x_t, t)
    torch.testing.assert_close(mean, want_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(var.expand_as(mean), (1 / precision).expand_as(mean), rtol=1e-5, atol=0)
    torch.testing.assert_close(log_var.exp(), var, rtol=1e-5, atol=0)  # clipped only at the first step


def test_vlb_vanishes_when_the_model_step_is_the_true_posterior():
    from zoo.diffusion.losses import vlb_terms

    s = NoiseSchedule(100, "linear")
    x0, eps = torch.rand(4, 3, 4, 4, dtype=torch.float64) * 2 - 1, torch.randn(4, 3, 4, 4, dtype=torch.float64)
    t = torch.tensor([1, 10, 50, 99])
    x_t = s.add_noise(x0, eps, t)
    v = -torch.ones_like(x0)  # Sigma_theta = beta-tilde_t, the true posterior's variance
    assert vlb_terms(s, x0, x_t, t, x0, v, "x0").abs().max() < 1e-12
    assert (vlb_terms(s, x0, x_t, t, x0 + 0.1, v, "x0") > 0).all()  # a wrong mean costs (little at large t)
    assert (vlb_terms(s, x0, x_t, t, x0, v + 1, "x0") > 0).all()  # and so does a wrong variance


def _with_variance(model, v):
    """A 2C-output denoiser: ``model``'s prediction, then the variance interpolation ``v`` (a number or a function)."""

    def out(x, t, y):
        var = v(x) if callable(v) else torch.full_like(x, v)
        return torch.cat([model(x, t, y), var], dim=1)

    return out


@pytest.mark.parametrize(("v", "variance"), [(1.0, "beta"), (-1.0, "beta_tilde")])
def test_learned_variance_at_its_bounds_is_ddpm_with_beta_or_beta_tilde(v, variance):
    schedule = NoiseSchedule(200, "linear")
    noise = torch.randn(64, 2)
    want = DDPMSampler(schedule, variance=variance).sample(
        optimal_eps(schedule), noise, None, torch.Generator().manual_seed(4)
    )
    got = DDPMSampler(schedule, variance="beta_tilde" if v > 0 else "beta").sample(
        _with_variance(optimal_eps(schedule), v), noise, None, torch.Generator().manual_seed(4)
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    other = DDPMSampler(schedule, variance="beta_tilde" if v > 0 else "beta").sample(
        optimal_eps(schedule), noise, None, torch.Generator().manual_seed(4)
    )
    assert not torch.allclose(other, want, atol=1e-3)


def test_ddim_eta1_over_all_steps_with_learned_variance_is_ddpm():
    # Nichol & Dhariwal's sampling with a learned variance is DDIM's eta = 1 mean plus the learned noise.
    schedule = NoiseSchedule(200, "cosine")
    model = _with_variance(optimal_eps(schedule), lambda x: torch.tanh(x))  # v varies per element
    noise = torch.randn(16, 2)
    a = DDPMSampler(schedule).sample(model, noise, None, torch.Generator().manual_seed(3))
    b = DDIMSampler(schedule, steps=200, eta=1.0).sample(model, noise, None, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # v = -1 is plain DDIM at any step count; eta = 0 ignores the variance.
    for eta in (0.0, 0.5):
        plain = DDIMSampler(schedule, steps=20, eta=eta).sample(
            optimal_eps(schedule), noise, None, torch.Generator().manual_seed(1)
        )
        got = DDIMSampler(schedule, steps=20, eta=eta).sample(
            _with_variance(optimal_eps(schedule), -1.0), noise, None, torch.Generator().manual_seed(1)
        )
        torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)


def test_guidance_mixes_the_prediction_and_keeps_the_conditional_variance():
    def model(x, t, y):  # prediction depends on the label; variance channels = the label
        lab = y.float().view(-1, 1).expand_as(x)
        return torch.cat([x * (lab + 1), lab], dim=1)

    x, t, y = torch.randn(3, 2), torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2])
    out = ClassifierFreeGuidance(model, 3.0, null_label=5)(x, t, y)
    uncond = x * 6
    torch.testing.assert_close(out[:, :2], uncond + 3.0 * (model(x, t, y)[:, :2] - uncond))
    torch.testing.assert_close(out[:, 2:], y.float().view(-1, 1).expand(3, 2))


def test_the_vlb_term_trains_only_the_variance():
    from zoo.diffusion.losses import denoising_loss

    s = NoiseSchedule(100)
    x0 = torch.rand(4, 3, 4, 4) * 2 - 1
    output = (0.3 * torch.randn(4, 6, 4, 4)).requires_grad_()
    out = denoising_loss(lambda x, t, y: output, s, x0, None, t=torch.tensor([0, 5, 50, 99]), vlb_weight=0.001)
    (grad_vlb,) = torch.autograd.grad(out["vlb"], output, retain_graph=True)
    assert grad_vlb[:, :3].abs().max() == 0 and grad_vlb[:, 3:].abs().min() > 0
    (grad_mse,) = torch.autograd.grad(out["mse"], output, retain_graph=True)
    (grad_loss,) = torch.autograd.grad(out["loss"], output)
    torch.testing.assert_close(grad_loss[:, :3], grad_mse[:, :3])  # the mean sees L_simple alone
    torch.testing.assert_close(grad_loss[:, 3:], 0.001 * grad_vlb[:, 3:])


def test_a_short_fit_with_learned_variance_lowers_the_vlb():
    from zoo.diffusion.losses import vlb_terms

    torch.manual_seed(0)
    m = DiffusionModule(NETS["unet-learn-sigma"](), GaussianDiffusion(100, vlb_weight=0.001))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    y = torch.arange(16) % 2
    x0 = (torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)).round() * 2 - 1)[y]  # an image per class
    fixed = dict(t=torch.arange(16) * 6, noise=torch.randn(x0.shape, generator=torch.Generator().manual_seed(0)))
    before = m._loss((x0, y), **fixed)
    for _ in range(40):
        loss = m._loss((x0, y))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = m._loss((x0, y), **fixed)
    # The same trained mean with the variance at its initial v = 0 (the zero-init output): the learned one is better,
    # if only by a little: beta_t and beta-tilde_t differ much only at the first steps (Nichol & Dhariwal fig. 1).
    x_t = m.objective.schedule.add_noise(x0, fixed["noise"], fixed["t"])
    with torch.no_grad():
        pred = m.denoise(x_t, fixed["t"], y)[:, :3]
        terms = vlb_terms(m.objective.schedule, x0, x_t, fixed["t"], pred, torch.zeros_like(pred), "eps")
        untrained_v = 100 * terms.mean()
    print(f"vlb {before['vlb'].item():.2f} -> {after['vlb'].item():.2f} bits/dim ({untrained_v.item():.2f} at v = 0)")
    assert after["vlb"] < 0.85 * before["vlb"]  # measured: 19.0 -> 14.4
    assert after["vlb"] < 0.985 * untrained_v  # measured: 14.4 against 14.8
    assert torch.isfinite(m.sample(2, partial(DDIMSampler, steps=5, eta=1.0))).all()


def test_load_pretrained_takes_the_zoo_s_own_keys(tmp_path):
    from safetensors.torch import save_file

    from zoo.diffusion.convert import load_pretrained

    for name in ("unet-learn-sigma", "dit-cond"):
        torch.manual_seed(0)
        src = NETS[name]()
        for p in src.parameters():
            nn.init.normal_(p, std=0.05)
        save_file({k: v.contiguous() for k, v in src.state_dict().items()}, tmp_path / f"{name}.safetensors")
        torch.save({"state_dict": {f"net.{k}": v for k, v in src.state_dict().items()}}, tmp_path / f"{name}.ckpt")
        for path in (tmp_path / f"{name}.safetensors", tmp_path / f"{name}.ckpt"):
            dst = load_pretrained(NETS[name](), path)
            for k, v in src.state_dict().items():
                assert torch.equal(dst.state_dict()[k], v), (path, k)
    with pytest.raises(ValueError, match="mismatched keys"):
        load_pretrained(NETS["unet"](), tmp_path / "unet-learn-sigma.safetensors")


def test_init_weights_never_overwrite_a_checkpoint(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    init = NETS["dit-cond"]()
    for p in init.parameters():
        nn.init.normal_(p, std=0.05)
    save_file({k: v.contiguous() for k, v in init.state_dict().items()}, tmp_path / "init.safetensors")
    m = DiffusionModule(NETS["dit-cond"](), init_weights=str(tmp_path / "init.safetensors"))
    m.configure_model()  # no trainer: loads the weights, as fit's first hook does
    torch.testing.assert_close(m.net.final_layer.linear.weight, init.final_layer.linear.weight, rtol=0, atol=0)
    trained = {f"net.{k}": torch.zeros_like(v) for k, v in m.net.state_dict().items()}
    again = DiffusionModule(NETS["dit-cond"](), init_weights=str(tmp_path / "init.safetensors"))
    again.on_load_checkpoint({"state_dict": trained})  # what load_from_checkpoint does before loading the weights
    again.load_state_dict(trained)
    again.configure_model()  # a Trainer given the loaded module calls this hook again
    assert again.net.final_layer.linear.weight.abs().max() == 0


def _conv_attention_layout(state: dict) -> dict:
    """A UNet state dict as checkpoints wrote it before the shared attention layer: 1x1-conv qkv/proj per block."""
    out = {}
    for k, v in state.items():
        name = k.replace(".attn.qkv.", ".qkv.").replace(".attn.proj.", ".proj.")
        out[name] = v[:, :, None, None] if name != k and v.ndim == 2 else v
    return out


def test_unet_checkpoints_with_the_old_conv_attention_are_refused_naming_the_keys(tmp_path):
    """The layout from before the shared attention layer (pre-0.1) is no longer migrated: a clear refusal."""
    from zoo.diffusion.convert import load_pretrained

    old = _conv_attention_layout(NETS["unet-cond"]().state_dict())
    assert "mid_attn.qkv.weight" in old and old["mid_attn.qkv.weight"].ndim == 4
    m = DiffusionModule(NETS["unet-cond"]())
    with pytest.raises(ValueError, match="mid_attn.qkv.weight"):
        m.on_load_checkpoint({"state_dict": {f"net.{k}": v for k, v in old.items()}})
    torch.save({"state_dict": {f"net.{k}": v for k, v in old.items()}}, tmp_path / "old.ckpt")
    with pytest.raises(ValueError, match="mid_attn.qkv.weight"):
        load_pretrained(NETS["unet-cond"](), tmp_path / "old.ckpt")


# -- a new sampler is one class ---------------------------------------------------------------------------


class OneStepSampler(Sampler):
    """A toy sampler written as a new one is, one class: x0-hat from one denoiser call at the noisiest step."""

    calls = 0

    def __init__(self, schedule, prediction, clip_denoised) -> None:
        self.schedule, self.prediction, self.clip_denoised = schedule, prediction, clip_denoised

    def timesteps(self) -> list[int]:
        return [self.schedule.num_timesteps - 1]

    def step(self, output, t, x_t, generator=None):
        OneStepSampler.calls += 1
        return self._x0_eps(split_variance(output, x_t)[0], t, x_t)[0]


def test_a_new_sampler_class_samples_through_the_module():
    OneStepSampler.calls = 0
    m = _module().eval()
    for p in m.net.parameters():
        nn.init.normal_(p, std=0.02)
    got = m.sample(3, OneStepSampler, guidance_scale=2.0, seed=4, labels=[0, 1, 2])
    assert OneStepSampler.calls == 1
    # By hand: the same noise, one guided call at T - 1, x0 from eps, clamped as the module clamps.
    noise = torch.randn((3, 3, 8, 8), generator=torch.Generator().manual_seed(4))
    schedule = m.objective.schedule
    t, y = torch.full((3,), schedule.num_timesteps - 1), torch.tensor([0, 1, 2])
    eps = ClassifierFreeGuidance(m.denoise, 2.0, null_label=m.num_classes)(noise, t, y)
    x0, _ = schedule.to_x0_eps(eps, noise, schedule.num_timesteps - 1, "eps")
    torch.testing.assert_close(got, x0.clamp(-1, 1))


def test_the_module_samples_with_its_own_sampler_and_guidance_unless_given_others():
    m = _module(sampler=partial(DDIMSampler, steps=3), guidance_scale=2.0).eval()
    for p in m.net.parameters():  # DiT starts as the zero function (adaLN-Zero), which guidance leaves unchanged
        nn.init.normal_(p, std=0.02)
    torch.testing.assert_close(m.sample(2, seed=1), m.sample(2, partial(DDIMSampler, steps=3), 2.0, seed=1))
    assert not torch.allclose(m.sample(2, seed=1), m.sample(2, partial(DDIMSampler, steps=3), 1.0, seed=1))
    assert not torch.allclose(m.sample(2, seed=1), m.sample(2, partial(DDIMSampler, steps=4), 2.0, seed=1))
    with pytest.raises(TypeError):  # a sampler's own settings are keywords: never taken for the module's arguments
        DDIMSampler(NoiseSchedule(10), "eps", None, 5)
