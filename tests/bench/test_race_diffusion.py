"""bench/race_diffusion.py's cheap parts: the peer's settings against train_unconditional.py's, its LR schedule and
EMA against their closed forms and diffusers' own, the one evaluation of both arms, and both arms wired end to end
for one step at 32 px."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
import torch
from conftest import CONFIGS, ROOT

from zoo.diffusion import DDIMSampler, DiffusionModule, FlowEulerSampler, FlowMatching, GaussianDiffusion, UNet

spec = importlib.util.spec_from_file_location("race_diffusion", ROOT / "bench" / "race_diffusion.py")
rd = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rd)

# diffusers examples/unconditional_image_generation/train_unconditional.py, as published (its argparse defaults,
# its UNet2DModel(...) call and training loop, the README's commands), typed here independently of PEER.
SCRIPT = {
    "layers_per_block": 2,
    "block_out_channels": (128, 128, 256, 256, 512, 512),
    "down_block_types": ("DownBlock2D", "DownBlock2D", "DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D", "UpBlock2D", "UpBlock2D"),
    "ddpm_num_steps": 1000,
    "ddpm_beta_schedule": "linear",
    "prediction_type": "epsilon",
    "train_batch_size": 16,
    "learning_rate": 1e-4,
    "lr_scheduler": "cosine",
    "lr_warmup_steps": 500,
    "adam_beta1": 0.95,
    "adam_beta2": 0.999,
    "adam_weight_decay": 1e-6,
    "adam_epsilon": 1e-8,
    "max_grad_norm": 1.0,
    "use_ema": True,
    "ema_inv_gamma": 1.0,
    "ema_power": 0.75,
    "ema_max_decay": 0.9999,
    "random_flip": True,
    "normalize": ([0.5], [0.5]),
}


def test_peer_settings_are_the_scripts():
    assert rd.PEER == SCRIPT


def test_peer_builds_the_scripts_parts_at_its_width():
    peer = rd.Peer(seed=0, width=0.25, total_steps=2000)
    cfg = peer.model.config
    assert tuple(cfg.block_out_channels) == (32, 32, 64, 64, 128, 128) and cfg.layers_per_block == 2
    assert tuple(cfg.down_block_types) == SCRIPT["down_block_types"] and cfg.sample_size == 32
    assert tuple(cfg.up_block_types) == SCRIPT["up_block_types"] and cfg.norm_num_groups == 32
    assert rd.peer_channels(1) == SCRIPT["block_out_channels"]  # --peer-width 1 is the script's own UNet
    (group,) = peer.optimizer.param_groups  # every parameter decays, as model.parameters() in the script
    assert group["initial_lr"] == 1e-4 and group["betas"] == (0.95, 0.999)
    assert group["weight_decay"] == 1e-6 and group["eps"] == 1e-8
    assert sum(p.numel() for p in group["params"]) == sum(p.numel() for p in peer.model.parameters())
    s = peer.noise_scheduler.config
    assert (s.num_train_timesteps, s.beta_schedule, s.prediction_type) == (1000, "linear", "epsilon")


@pytest.mark.parametrize("width", [0.1, 0.3, 0.0])
def test_a_width_that_breaks_the_32_norm_groups_is_refused_in_one_line(width):
    with pytest.raises(SystemExit, match="multiples of 32") as e:
        rd.peer_channels(width)
    assert str(e.value).startswith("error:") and "\n" not in str(e.value)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_peer_lr_is_linear_warmup_then_cosine_over_the_runs_steps():
    from diffusers.optimization import get_cosine_schedule_with_warmup

    total = 1500
    peer = rd.Peer(seed=0, width=0.25, total_steps=total)
    theirs = get_cosine_schedule_with_warmup(torch.optim.SGD([torch.zeros(1)], lr=1e-4), 500, total)

    def closed_form(k: int) -> float:  # diffusers' cosine with warmup (num_cycles 0.5)
        if k < 500:
            return 1e-4 * k / 500
        return 1e-4 * 0.5 * (1 + math.cos(math.pi * (k - 500) / (total - 500)))

    for k in range(total + 1):
        if k in (0, 1, 250, 499, 500, 501, 1000, 1499, 1500):
            lr = peer.optimizer.param_groups[0]["lr"]
            assert lr == pytest.approx(closed_form(k), abs=1e-12) and lr == pytest.approx(theirs.get_last_lr()[0])
        peer.lr_scheduler.step()
        theirs.step()


def test_peer_steps_the_optimizer_schedule_and_ema_in_the_scripts_order(one_thread):
    torch.manual_seed(0)
    peer = rd.Peer(seed=0, width=0.25, total_steps=1000)
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    weights = []
    for _ in range(3):
        peer.step(x)
        weights.append([p.detach().clone() for p in peer.model.parameters()])
    assert peer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 * 3 / 500)  # 3 scheduler steps
    # EMA decay at update k: 0 (a copy), then 1 - (1 + (k - 1))^-3/4 (use_ema_warmup, inv_gamma 1, power 3/4)
    d2, d3 = 1 - 2**-0.75, 1 - 3**-0.75
    assert peer.ema.cur_decay_value == pytest.approx(d3)
    expected = [d3 * (d2 * w1 + (1 - d2) * w2) + (1 - d3) * w3 for w1, w2, w3 in zip(*weights)]
    for avg, want in zip(peer.ema.shadow_params, expected):
        torch.testing.assert_close(avg, want, rtol=1e-5, atol=1e-7)


def test_peer_module_samples_on_the_peers_own_noise_schedule():
    peer = rd.Peer(seed=0, width=0.25, total_steps=10)
    module = peer.module()
    torch.testing.assert_close(
        module.objective.schedule.alphas_cumprod.float(), peer.noise_scheduler.alphas_cumprod, rtol=1e-6, atol=1e-7
    )
    assert module.objective.prediction == "eps" and module.hparams.clip_denoised == 1.0  # diffusers' clip_sample


def test_evaluation_samples_eps_with_ddim_and_flow_with_euler_at_the_same_net_calls():
    ev = rd.Evaluation(lambda images: 0.0, num_samples=2, steps=7)
    unet = dict(image_size=8, base_channels=8, channel_mults=(1,), attention_resolutions=(), norm_groups=8)
    for objective, kind in ((GaussianDiffusion(), DDIMSampler), (FlowMatching(), FlowEulerSampler)):
        module = DiffusionModule(UNet(**unet), objective=objective, sampler=kind, ema_decay=None)
        sampler = ev.sampler(module)
        assert sampler.func is kind and module.objective.sampler(sampler, 1.0).num_calls() == 7


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> str:
    """A 32 px shapes classifier after one step: any fixed features will do to compare two image sets."""
    from cli import main

    out = tmp_path_factory.mktemp("classifier")
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI would read pytest's arguments too
    try:
        c = main(
            [
                "fit",
                "--config",
                str(CONFIGS / "cnn" / "convnet_shapes.yaml"),
                "--data.init_args.num_train=64",
                "--data.init_args.num_val=0",
                "--data.init_args.num_test=0",
                "--trainer.max_steps=1",
                "--trainer.limit_val_batches=0",
                "--trainer.logger=false",
                "--test_after_fit=false",
                "--trainer.enable_progress_bar=false",
                f"--trainer.default_root_dir={out}",
            ]
        )
    finally:
        sys.argv = argv
    return c.trainer.checkpoint_callback.last_model_path or c.trainer.checkpoint_callback.best_model_path


def test_one_evaluation_gives_the_same_distance_whichever_arm_drew_the_images(classifier, one_thread):
    peer = rd.Peer(seed=0, width=0.25, total_steps=1000)
    for _ in range(2):  # the EMA (decay 0.41 at the second update) now differs from the weights
        peer.step(torch.rand(2, 3, 32, 32) * 2 - 1)
    weights = [p.detach().clone() for p in peer.model.parameters()]
    evaluation = rd.Evaluation(rd.frechet_to_shapes(classifier, 8), num_samples=8, steps=3, batch=4)
    fd_peer = peer.evaluate(evaluation)
    for p, w in zip(peer.model.parameters(), weights):  # the training weights are back after sampling the EMA's
        torch.testing.assert_close(p, w, rtol=0, atol=0)
    # The zoo's way: the EMA weights in a DiffusionModule of the zoo's own defaults (linear 1e-4..0.02, T 1000).
    ema_unet = rd.peer_unet(0.25)
    peer.ema.copy_to(ema_unet.parameters())
    zoo = DiffusionModule(rd.PeerDenoiser(ema_unet), ema_decay=None)
    fd_zoo = evaluation(zoo)
    assert math.isfinite(fd_peer) and fd_peer > 0 and fd_zoo == pytest.approx(fd_peer, rel=1e-5)
    peer.step(torch.rand(2, 3, 32, 32) * 2 - 1)
    assert peer.evaluate(evaluation) != pytest.approx(fd_peer, rel=1e-5)  # other weights, another distance


def test_race_hits_at_or_under_the_target_on_the_grid_and_stops_at_the_budget():
    fds = iter([50.0, 40.0, 30.0])
    race = rd.Race(every=100, target=40.0, max_images=1000)
    race.clock.start()
    assert not race.step(64, lambda: next(fds)) and race.evals == []  # 64 seen: not on the grid yet
    assert not race.step(64, lambda: next(fds)) and [e[:2] for e in race.evals] == [(128, 50.0)]
    assert race.step(128, lambda: next(fds)) and race.hit["images"] == 256 and race.hit["fd"] == 40.0
    assert (
        race.evals[-1] == (256, 40.0, race.hit["cpu_s"], race.hit["wall_s"])
        # process_time counts every thread: another thread of this test process (an MLflow logger left by an earlier
        # test) running while an evaluation is taken out can make a later reading a few microseconds lower
        and race.evals[0][2] <= race.hit["cpu_s"] + 0.01
    )
    assert rd.hit_at(race.evals, 50.0)["images"] == 128 and rd.hit_at(race.evals, 39.0) is None  # looser, stricter
    spent = rd.Race(every=100, target=0.0, max_images=200)
    assert not spent.step(100, lambda: 1.0) and spent.step(100, lambda: 1.0) and spent.hit is None


def _stopped_at_the_first_evaluation(r: dict, batch: int) -> None:
    assert (
        r["evals"] == [(batch, r["hit"]["fd"], r["hit"]["cpu_s"], r["hit"]["wall_s"])] and r["hit"]["images"] == batch
    )
    assert r["hit"]["cpu_s"] > 0
    assert r["flops"] > 0


def test_peer_arm_trains_one_step_and_stops_at_the_target(one_thread):
    seen = []
    evaluation = rd.Evaluation(lambda images: seen.append(images) or 1.0, num_samples=4, steps=2, batch=4)
    r = rd.peer_run(0, evaluation, every=16, target=1.0, max_images=1000, num_train=32)
    _stopped_at_the_first_evaluation(r, 16)
    assert seen[0].shape == (4, 3, 32, 32) and r["what"].startswith("UNet2DModel x0.25 (32, 32, 64, 64, 128, 128)")


def test_zoo_arm_runs_the_race_preset_through_cli_and_stops_at_the_budget(one_thread):
    seen = []
    evaluation = rd.Evaluation(lambda images: seen.append(images) or 99.0, num_samples=4, steps=2, batch=4)
    r = rd.zoo_run(0, evaluation, every=32, target=1.0, max_images=32, num_train=64)
    assert r["hit"] is None and [e[:2] for e in r["evals"]] == [(32, 99.0)] and r["flops"] > 0
    assert r["what"] == "flow_dit_shapes_race.yaml" and seen[0].shape == (4, 3, 32, 32)


def test_zoo_arm_evaluates_the_ema_weights_of_the_step_just_taken(one_thread):
    class Spy(rd.Evaluation):  # records what it would sample: the module's weights at the evaluation
        def __call__(self, module) -> float:
            self.module, self.seen = module, [p.detach().clone() for p in module.net.parameters()]
            return 99.0

    spy = Spy(lambda images: 99.0, num_samples=2, steps=1)
    extra = ("--model.init_args.ema_start_step=0",)  # an average from the first step on
    rd.zoo_run(0, spy, every=64, target=1.0, max_images=64, num_train=64, extra=extra)  # 2 steps, one evaluation
    # Fit ends holding the average of both steps: the evaluation saw it, not the training weights (which differ by
    # 0.995 (w2 - w1)) nor the average before the second step's update.
    final = [p.detach() for p in spy.module.net.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(final, spy.seen))
