"""The RL family through cli.py: fit, predict, reload, resume, and a CartPole run that learns."""

from __future__ import annotations

import csv
import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CONFIGS, cli, output
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from lightning.pytorch import Callback
from mlflow.tracking import MlflowClient
from PIL import Image
from rl_baselines import BaselineReturns

from zoo.errors import InputError
from zoo.rl import A2CModule, PPOModule
from zoo.train.optim import MuonAdamW, MuonSettings

TINY = str(CONFIGS / "rl" / "ppo_tiny.yaml")
CARTPOLE = str(CONFIGS / "rl" / "ppo_cartpole.yaml")
A2C_TINY = str(CONFIGS / "rl" / "a2c_tiny.yaml")


class RenderedCartPole(CartPoleEnv):
    """CartPole with an RGB renderer that needs no pygame: the cart is a bright column of a small frame."""

    def render(self) -> np.ndarray:
        frame = np.zeros((24, 48, 3), dtype=np.uint8)
        frame[:, int(np.clip((self.state[0] + 2.4) / 4.8 * 47, 0, 47))] = 255
        return frame


gym.register("RenderedCartPole-v1", entry_point=RenderedCartPole, max_episode_steps=500)


class RecordFirstBatch(Callback):
    """What a resumed run starts from: env steps, statistics and RNG state as the first rollout begins."""

    seen: dict = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not RecordFirstBatch.seen:
            RecordFirstBatch.seen = {
                "env_steps": int(pl_module.env_steps),
                "obs_count": float(pl_module.obs_rms.count),
                "rng": torch.get_rng_state(),
                "global_step": trainer.global_step,
                "momentum": [
                    s["momentum_buffer"].clone() for s in trainer.optimizers[0].state.values() if "momentum_buffer" in s
                ],
            }


def test_tiny_fits_predicts_and_reloads_with_its_statistics():
    c = cli("fit", "--config", TINY)
    model, trainer = c.model, c.trainer
    assert int(model.env_steps) == 1024  # the whole budget: 8 rollouts of 4 envs x 32 steps
    assert trainer.global_step == 8 * 2 * 2  # optimizer steps: rollouts x epochs x minibatches
    assert torch.isfinite(trainer.callback_metrics["val/return"])
    run = MlflowClient(trainer.logger._tracking_uri).get_run(trainer.logger.run_id)
    assert run.data.tags["zoo.family"] == "rl"
    for key in (
        "val/return",
        "val/return_std",
        "train/pg_loss",
        "train/v_loss",
        "train/entropy",
        "train/approx_kl",
        "train/episode_return",
        "grad/norm",
        "grad/nonfinite",
        "lr/pg1",
    ):
        assert key in run.data.metrics, key
    assert run.data.metrics["grad/norm"] > 0 and run.data.metrics["grad/nonfinite"] == 0
    last = trainer.checkpoint_callback.last_model_path

    # CartPole draws with pygame, which only the rl extra installs (CI installs test): without it the video is
    # skipped and predict goes on; with it the episode is recorded.
    if importlib.util.find_spec("pygame") is None:
        with pytest.warns(UserWarning, match="No video: CartPole-v1 cannot render here"):
            cli("predict", "--config", TINY, "--ckpt_path", last, "--data.init_args.record_video=true")
    else:
        cli("predict", "--config", TINY, "--ckpt_path", last, "--data.init_args.record_video=true")
        assert output("videos/CartPole-v1_episode.gif").exists()
    rows = list(csv.DictReader(output("predictions.csv").read_text().splitlines()))
    assert [int(r["episode"]) for r in rows] == [0, 1, 2] and all(float(r["return"]) >= 1 for r in rows)

    # With a renderer, one episode becomes a GIF in the run's MLflow artifacts.
    p = cli(
        "predict",
        "--config",
        TINY,
        "--ckpt_path",
        last,
        "--data.init_args.record_video=true",
        "--data.init_args.env_id=RenderedCartPole-v1",
    )
    gif = output("RenderedCartPole-v1_episode.gif")  # in the run folder, beside predictions.csv
    frames = Image.open(gif)
    assert frames.n_frames >= 2 and frames.size == (48, 24)
    logger = p.trainer.logger
    listed = MlflowClient(logger._tracking_uri).list_artifacts(logger.run_id, "videos")
    assert [a.path for a in listed] == ["videos/RenderedCartPole-v1_episode.gif"]

    # The checkpoint alone rebuilds the agent, statistics included, and it acts identically.
    loaded = PPOModule.load_from_checkpoint(last)
    assert float(loaded.obs_rms.count) == float(model.obs_rms.count) > 1000
    for name in ("mean", "var"):
        torch.testing.assert_close(getattr(loaded.obs_rms, name), getattr(model.obs_rms, name))
        torch.testing.assert_close(getattr(loaded.return_rms, name), getattr(model.return_rms, name))
    obs = torch.randn(64, 4) * torch.tensor([1.0, 0.5, 0.1, 0.5])
    torch.testing.assert_close(loaded.act(obs), model.act(obs))
    torch.manual_seed(0)
    sampled = loaded.act(obs, deterministic=False)
    torch.manual_seed(0)
    torch.testing.assert_close(sampled, model.act(obs, deterministic=False))


class StopAfterFourRollouts(Callback):
    """Stands in for an interruption halfway through the tiny run's budget."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 >= 4:
            trainer.should_stop = True


@pytest.mark.slow  # RL resume stays in the default suite through A2C, SAC and IMPALA below (the 10 minutes)
def test_resume_continues_env_steps_statistics_rng_and_muon_momentum():
    # (Resuming through cli.py takes the module's hyperparameters from the checkpoint, over the config and
    # the command line, so a budget cannot be extended this way: the first run is interrupted instead.)
    # With Muon on the hidden matrices: its momentum is optimizer state that Adam's path would not show.
    muon = "--model.init_args.optimizer.muon.lr=0.01"
    first = cli("fit", "--config", TINY, muon, "--trainer.callbacks+=test_rl_cli.StopAfterFourRollouts")
    (opt,) = first.trainer.optimizers
    assert isinstance(opt, MuonAdamW) and opt.param_groups[0]["muon"] and opt.param_groups[0]["initial_lr"] == 0.01
    last = first.trainer.checkpoint_callback.last_model_path
    saved = torch.load(last, weights_only=True)
    assert int(saved["state_dict"]["env_steps"]) == 512
    momentum = [s["momentum_buffer"] for s in saved["optimizer_states"][0]["state"].values() if "momentum_buffer" in s]
    assert len(momentum) == 2 and all(m.abs().sum() > 0 for m in momentum)  # actor.2 and critic.2
    RecordFirstBatch.seen = {}
    second = cli(
        "fit", "--config", TINY, muon, "--ckpt_path", last, "--trainer.callbacks+=test_rl_cli.RecordFirstBatch"
    )
    seen = RecordFirstBatch.seen
    assert seen["env_steps"] == 512 and seen["global_step"] == 16
    assert seen["obs_count"] == float(saved["state_dict"]["obs_rms.count"])
    assert torch.equal(seen["rng"], saved["rng"]["torch"])
    assert all(torch.equal(a, b) for a, b in zip(seen["momentum"], momentum, strict=True))
    assert int(second.model.env_steps) == 1024 and second.trainer.global_step == 32
    assert PPOModule.load_from_checkpoint(last).hparams.optimizer["muon"] == vars(MuonSettings(lr=0.01))
    with pytest.raises(
        InputError, match=r"groups the parameters as \[\[2, 4, 6\]\], this run's optimizer as \[\[6, 6\]\]"
    ):
        cli("fit", "--config", TINY, "--ckpt_path", last)  # Muon left out: Adam's two groups, not torch's traceback


def test_net_that_does_not_fit_the_env_is_named():
    with pytest.raises(ValueError, match=r"action_dim=2"):
        cli("fit", "--config", TINY, "--model.init_args.net.init_args.action_dim=3")


def test_cartpole_config_runs_a_rollout():
    c = cli("fit", "--config", CARTPOLE, "--trainer.fast_dev_run=1")
    assert int(c.model.env_steps) == 256


def test_cartpole_learns_far_above_random():
    # 16k env steps of the 50k budget (about 10 s on two CPU cores). Measured with this command: the best of
    # the 8 evaluations reached 500 / 500 / 365 / 311 / 494 on seeds 0-4; with the policy-gradient sign flipped
    # 9 / 10 / 9; with lr=0 (no learning) 9 / 33 / 429 (seed 2's untrained net balances by luck).
    c = cli(
        "fit",
        "--config",
        CARTPOLE,
        "--model.init_args.total_env_steps=16384",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=rl_baselines.BaselineReturns",
    )
    assert int(c.model.env_steps) == 16384
    # The run starts far below the threshold (untrained 9 at seed 0; random actions ~22 on these start
    # states), so reaching it is learning, not a lucky initialisation.
    assert BaselineReturns.untrained < 50 and BaselineReturns.random < 50
    # The best of its 8 evaluations: PPO's CartPole return dips now and then before it settles.
    assert c.trainer.checkpoint_callback.best_model_score.item() >= 200


def test_continuous_actions_train_and_evaluate():
    c = cli(
        "fit",
        "--config",
        TINY,
        "--data.init_args.env_id=Pendulum-v1",
        "--model.init_args.net.init_args.obs_dim=3",
        "--model.init_args.net.init_args.action_dim=1",
        "--model.init_args.net.init_args.continuous=true",
        "--trainer.fast_dev_run=1",
        "--trainer.logger=false",
    )
    assert int(c.model.env_steps) == 128
    assert c.trainer.callback_metrics["val/return"].item() < 0  # Pendulum's rewards are all negative


def test_continuous_ppo_config_runs_a_rollout():
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "rl" / "ppo_pendulum.yaml"),
        "--trainer.fast_dev_run=1",
        "--trainer.logger=false",
    )
    assert int(c.model.env_steps) == 4096
    assert c.model.net.continuous


# -- A2C -------------------------------------------------------------------------------------------------


def test_a2c_tiny_fits_predicts_reloads_and_resumes():
    c = cli("fit", "--config", A2C_TINY, "--trainer.callbacks+=test_rl_cli.StopAfterFourRollouts")
    assert int(c.model.env_steps) == 4 * 32 and c.trainer.global_step == 4  # one RMSprop step per rollout
    last = c.trainer.checkpoint_callback.last_model_path
    assert isinstance(c.model.optimizers().optimizer, torch.optim.RMSprop)

    RecordFirstBatch.seen = {}
    resumed = cli("fit", "--config", A2C_TINY, "--ckpt_path", last, "--trainer.callbacks+=test_rl_cli.RecordFirstBatch")
    saved = torch.load(last, weights_only=True)
    assert RecordFirstBatch.seen["env_steps"] == 128 and torch.equal(
        RecordFirstBatch.seen["rng"], saved["rng"]["torch"]
    )
    assert int(resumed.model.env_steps) == 512 and resumed.trainer.global_step == 16
    run = MlflowClient(resumed.trainer.logger._tracking_uri).get_run(resumed.trainer.logger.run_id)
    for key in ("val/return", "train/pg_loss", "train/v_loss", "train/entropy", "grad/norm", "grad/nonfinite"):
        assert key in run.data.metrics, key
    assert run.data.metrics["grad/norm"] > 0 and run.data.metrics["grad/nonfinite"] == 0

    final = resumed.trainer.checkpoint_callback.last_model_path
    cli("predict", "--config", A2C_TINY, "--ckpt_path", final)
    rows = list(csv.DictReader(output("predictions.csv").read_text().splitlines()))
    assert len(rows) == 3 and all(float(r["return"]) >= 1 for r in rows)
    loaded = A2CModule.load_from_checkpoint(final)
    obs = torch.randn(16, 4) * 0.3
    torch.testing.assert_close(loaded.act(obs), resumed.model.act(obs))
    torch.testing.assert_close(loaded.obs_rms.mean, resumed.model.obs_rms.mean)

    # Resumed with its budget spent: the agent stops before the first training step (zoo.rl.lifecycle.Budget).
    RecordFirstBatch.seen = {}
    spent = cli(
        "fit",
        "--config",
        A2C_TINY,
        "--ckpt_path",
        final,
        "--trainer.logger=false",
        "--trainer.callbacks+=test_rl_cli.RecordFirstBatch",
    )
    assert not RecordFirstBatch.seen and int(spent.model.env_steps) == 512 and spent.trainer.global_step == 16


@pytest.mark.slow
def test_a2c_cartpole_learns_far_above_random():
    # A random policy averages ~22; rl-zoo's A2C reaches 475 by 10-20k env steps here (bench/rl.py). 30k steps take
    # about 10 s; the best evaluation reached 434 / 283 / 489 / 500 / 494 on seeds 0-4.
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "rl" / "a2c_cartpole.yaml"),
        "--model.init_args.total_env_steps=30000",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.val_check_interval=500",
        "--trainer.callbacks+=rl_baselines.BaselineReturns",
    )
    assert int(c.model.env_steps) == 30000
    assert BaselineReturns.untrained < 50 and BaselineReturns.random < 50  # far below: reaching 150 is learning
    assert c.trainer.checkpoint_callback.best_model_score.item() >= 150
