"""A trained agent on new episodes through cli.py: play N episodes with their returns and a video, and the nets
sized from the environment."""

from __future__ import annotations

import csv

import pytest
import torch
from conftest import CONFIGS, cli, fit_in_folder, output
from mlflow.tracking import MlflowClient
from PIL import Image

from zoo.rl import PPOModule, SACModule

PPO_TINY = str(CONFIGS / "rl" / "ppo_tiny.yaml")
SAC_TINY = str(CONFIGS / "rl" / "sac_tiny.yaml")
QUIET = ("--trainer.enable_progress_bar=false",)
NUMPY_CARTPOLE = "datamodules.gym_envs:NumpyCartPole-v1"


@pytest.fixture(scope="module")
def numpy_cartpole_fit(tmp_path_factory):
    """The tiny PPO config's first 128 env steps on the NumPy-drawn CartPole, fitted once for the file in a folder of
    its own: the tests below only read its last checkpoint (each fitted its own before)."""
    return fit_in_folder(
        tmp_path_factory.mktemp("ppo_numpy_cartpole"),
        "--config",
        PPO_TINY,
        *QUIET,
        "--model.init_args.total_env_steps=128",
        f"--data.init_args.env_id={NUMPY_CARTPOLE}",
    )


@pytest.mark.slow  # a video written (the README test command's 10 minutes)
def test_play_writes_every_episode_and_a_video_of_one():
    last = cli("fit", "--config", PPO_TINY, *QUIET).trainer.checkpoint_callback.last_model_path
    # CartPole drawn with NumPy: renders without pygame
    p = cli(
        "predict",
        "--config",
        PPO_TINY,
        "--ckpt_path",
        last,
        "--data.init_args.predict_episodes=5",
        "--data.init_args.env_id=datamodules.gym_envs:NumpyCartPole-v1",
        "--data.init_args.env_kwargs={width: 40, height: 30}",
        "--data.init_args.record_video=true",
        "--data.init_args.video_fps=20",
    )  # 50 ms a frame: GIF durations are whole centiseconds
    rows = list(csv.DictReader(output("predictions.csv").read_text().splitlines()))
    assert [int(r["episode"]) for r in rows] == [0, 1, 2, 3, 4]
    assert all(float(r["return"]) == int(r["length"]) >= 1 for r in rows)  # CartPole pays 1 per step
    gif = Image.open(output("NumpyCartPole-v1_episode.gif"))  # beside predictions.csv, in the run folder
    assert gif.size == (40, 30)
    # the recorded episode is episode 0, from the same start state: its first frame and one per step, at 20 fps
    # (Pillow merges repeated frames into one longer one, so count time rather than frames)
    shown = 0
    for i in range(gif.n_frames):
        gif.seek(i)
        shown += gif.info["duration"]
    assert shown == (int(rows[0]["length"]) + 1) * 50
    logger = p.trainer.logger
    listed = MlflowClient(logger._tracking_uri).list_artifacts(logger.run_id, "videos")
    assert [a.path for a in listed] == ["videos/NumpyCartPole-v1_episode.gif"]


def test_an_mp4_without_moviepy_says_what_to_install(numpy_cartpole_fit):
    try:
        import moviepy  # noqa: F401

        pytest.skip("moviepy is installed")
    except ImportError:
        pass
    last = str(numpy_cartpole_fit.last)
    with pytest.raises(ImportError, match="moviepy"):
        cli(
            "predict",
            "--config",
            PPO_TINY,
            "--ckpt_path",
            last,
            "--data.init_args.predict_episodes=1",
            "--data.init_args.env_id=datamodules.gym_envs:NumpyCartPole-v1",
            "--data.init_args.record_video=true",
            "--data.init_args.video_format=mp4",
        )


# Slow (the README test command's 10 minutes): two fits. The default suite reloads both agents from their
# checkpoints alone (test_rl_cli.py's test_tiny_fits_predicts_and_reloads_with_its_statistics, test_sac.py's
# test_tiny_fits_predicts_and_reloads) and plays a checkpoint alone in its env (below).
@pytest.mark.slow
def test_net_sizes_come_from_the_env_and_travel_with_the_checkpoint():
    c = cli("fit", "--config", PPO_TINY, *QUIET, "--model.init_args.total_env_steps=128")
    net = c.model.net
    assert (net.obs_dim, net.action_dim, net.continuous) == (4, 2, False)
    last = c.trainer.checkpoint_callback.last_model_path
    given = torch.load(last, weights_only=True)["hyper_parameters"]["net"]["init_args"]
    assert (given["obs_dim"], given["action_dim"], given["continuous"]) == (4, 2, False)
    loaded = PPOModule.load_from_checkpoint(last)  # sized from the file alone, statistics included
    assert loaded.obs_rms.mean.shape == (4,)
    obs = torch.randn(8, 4)
    torch.testing.assert_close(loaded.act(obs), c.model.act(obs))

    s = cli(
        "fit",
        "--config",
        SAC_TINY,
        *QUIET,
        "--model.init_args.total_env_steps=160",
        "--model.init_args.learning_starts=80",
    )
    actor = s.model.net.actor
    assert (s.model.net.obs_dim, s.model.net.action_dim, s.model.target_entropy) == (3, 1, -1.0)
    torch.testing.assert_close(actor.action_scale, torch.tensor([2.0]))  # Pendulum's torque in [-2, 2]
    sac = SACModule.load_from_checkpoint(s.trainer.checkpoint_callback.last_model_path)
    assert sac.critic_target.qs[0][0].weight.shape == (16, 4)  # obs 3 + action 1


def test_a_size_that_disagrees_with_the_env_names_both():
    with pytest.raises(ValueError, match=r"needs a net with .*'action_dim': 2.*this one has .*'action_dim': 3"):
        cli("fit", "--config", PPO_TINY, *QUIET, "--model.init_args.net.init_args.action_dim=3")
    with pytest.raises(ValueError, match=r"needs a net with .*'obs_dim': 3.*this one has .*'obs_dim': 5"):
        cli("fit", "--config", SAC_TINY, *QUIET, "--model.init_args.net.init_args.obs_dim=5")


def test_a_checkpoint_alone_plays_in_the_env_it_was_trained_in(numpy_cartpole_fit):
    """predict without --config: the checkpoint records the GymDataModule's arguments (env id, wrappers, ...)."""
    fit = numpy_cartpole_fit.cli
    cli(
        "predict",
        "--ckpt_path",
        str(numpy_cartpole_fit.last),
        *QUIET,
        "--data.init_args.predict_episodes=2",
    )
    rows = list(csv.DictReader(output("predictions.csv").read_text().splitlines()))
    assert [int(r["episode"]) for r in rows] == [0, 1]
    assert fit.datamodule.hparams.env_id == "datamodules.gym_envs:NumpyCartPole-v1"
