"""Environments beyond flat vectors: wrappers with arguments from YAML, pixels through the NatureCNN, Dict
observations flattened by gymnasium's wrapper, MultiDiscrete actions; all through cli.py, a few steps each."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CONFIGS, cli
from gymnasium import spaces

from zoo.rl import ActorCritic
from zoo.rl.export import export_policy
from zoo.rl.nets import multi_categorical

PIXELS = str(CONFIGS / "rl" / "ppo_cartpole_pixels.yaml")
TINY = str(CONFIGS / "rl" / "ppo_tiny.yaml")
QUIET = ("--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false")


class DictGoal(gym.Env):
    """Observes {"position": (2,), "goal": Discrete(3)}; acts with MultiDiscrete([3, 2]); reward 1 when the first
    component names the goal. Ten steps an episode (the registered time limit)."""

    observation_space = spaces.Dict({"position": spaces.Box(-1, 1, (2,), np.float32), "goal": spaces.Discrete(3)})
    action_space = spaces.MultiDiscrete([3, 2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def _observe(self) -> dict:
        self.goal = int(self.np_random.integers(3))
        return {"position": self.np_random.uniform(-1, 1, 2).astype(np.float32), "goal": self.goal}

    def step(self, action):
        reward = float(action[0] == self.goal)
        return self._observe(), reward, False, False, {}


gym.register("DictGoal-v0", entry_point=DictGoal, max_episode_steps=10)


def test_multi_categorical_is_independent_categoricals():
    torch.manual_seed(0)
    nvec = [3, 1, 4]
    logits = torch.randn(6, sum(nvec))
    valid = torch.arange(4) < torch.tensor(nvec)[:, None]
    action, logp, entropy = multi_categorical(logits, valid, None, deterministic=False)
    dists = [torch.distributions.Categorical(logits=part) for part in logits.split(nvec, -1)]
    torch.testing.assert_close(logp, sum(d.log_prob(action[:, k]) for k, d in enumerate(dists)))
    torch.testing.assert_close(entropy, sum(d.entropy() for d in dists))
    assert (action < torch.tensor(nvec)).all()
    mode = multi_categorical(logits, valid, None, deterministic=True)[0]
    assert torch.equal(mode, torch.stack([part.argmax(-1) for part in logits.split(nvec, -1)], -1))


def test_pixel_cartpole_trains_through_the_cli_and_exports(tmp_path):
    # The config's pipeline at 36 x 36 (the NatureCNN's smallest input), 2 envs x 16 steps, 32 CNN features.
    c = cli(
        "fit",
        "--config",
        PIXELS,
        *QUIET,
        "--model.init_args.total_env_steps=64",
        "--model.init_args.num_steps=16",
        "--trainer.val_check_interval=2",
        "--data.init_args.num_envs=2",
        "--data.init_args.eval_episodes=2",
        "--data.init_args.eval_envs=2",
        "--data.init_args.env_kwargs={render_mode: rgb_array, width: 36, height: 36}",
        "--model.init_args.net.init_args.obs_shape=[4,36,36]",
        "--model.init_args.net.init_args.cnn_features=32",
    )
    model = c.model
    assert int(model.env_steps) == 2 * 2 * 16 and c.trainer.global_step == 2 * 4 * 4
    env = c.datamodule.make_env()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 36, 36) and obs.dtype == np.uint8 and obs.max() == 255 and obs.min() < 255
    assert torch.isfinite(c.trainer.callback_metrics["val/return"])
    # The exported program carries the CNN: the same actions on pixel observations.
    policy = torch.export.load(str(export_policy(model.cpu(), tmp_path / "pixels.pt2"))).module()
    batch = torch.as_tensor(np.stack([obs, env.step(1)[0], env.step(0)[0]]), dtype=torch.float32)
    torch.testing.assert_close(policy(batch), model.act(batch), rtol=0, atol=0)


def test_a_net_that_does_not_fit_the_image_layout_is_named():
    with pytest.raises(ValueError, match=r"obs_shape=\[4,84,84\]"):
        cli(
            "fit",
            "--config",
            PIXELS,
            *QUIET,
            "--trainer.fast_dev_run=1",
            "--model.init_args.net.init_args.obs_shape=[4,36,36]",
        )


DICT_GOAL = (
    "--data.init_args.env_id=DictGoal-v0",
    "--data.init_args.max_episode_steps=null",
    "--model.init_args.net.init_args.obs_dim=5",
    "--model.init_args.net.init_args.action_dim=5",
    "--model.init_args.net.init_args.action_nvec=[3,2]",
    "--model.init_args.norm_obs=false",
)


def test_dict_observations_flattened_from_yaml_and_multidiscrete_actions_train():
    c = cli(
        "fit",
        "--config",
        TINY,
        *QUIET,
        *DICT_GOAL,
        "--model.init_args.total_env_steps=256",
        "--data.init_args.wrappers=[{class_path: gymnasium.wrappers.FlattenObservation}]",
    )
    assert int(c.model.env_steps) == 2 * 4 * 32
    assert c.trainer.callback_metrics["val/episode_length"].item() == 10
    obs = torch.rand(8, 5)
    action = c.model.act(obs)
    assert action.shape == (8, 2) and action.dtype == torch.int64


def test_dict_observations_without_the_flattening_wrapper_name_it():
    with pytest.raises(ValueError, match="FlattenObservation"):
        cli("fit", "--config", TINY, *QUIET, *DICT_GOAL, "--trainer.fast_dev_run=1")


def test_multidiscrete_env_fills_an_unset_nvec_and_refuses_a_wrong_one():
    # Sizes come from the env when the config leaves them unset (zoo.app.sizes), and a given one must agree.
    args = ("fit", "--config", TINY, *QUIET, *DICT_GOAL[:-2], "--trainer.fast_dev_run=1")
    flat = "--data.init_args.wrappers=[gymnasium.wrappers.FlattenObservation]"
    c = cli(*args, flat)
    assert list(c.model.net.action_nvec) == [3, 2]
    with pytest.raises(ValueError, match=r"\[3, ?2\]"):
        cli(*args, flat, "--model.init_args.net.init_args.action_nvec=[2,3]")


def test_actor_critic_rejects_an_nvec_that_does_not_sum_to_action_dim():
    with pytest.raises(ValueError, match="action_dim=5"):
        ActorCritic(5, 4, action_nvec=[3, 2])


# The presets whose simulators come with the `rl` extra (pip install -c constraints.txt -e ".[rl]"); CI installs
# only `test`, so there they skip and name the extra.
PRESETS = [("ppo_lunarlander.yaml", "Box2D", 8, 4, 16), ("ppo_hopper.yaml", "mujoco", 11, 3, 1)]


@pytest.mark.parametrize(("config", "module", "obs_dim", "action_dim", "num_envs"), PRESETS)
def test_rl_extra_presets_run_a_rollout_through_the_cli(config, module, obs_dim, action_dim, num_envs):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} comes with the rl extra: pip install -c constraints.txt -e '.[rl]'")
    # The preset as written, one shortened rollout (32 steps per env) and 2 evaluation episodes.
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "rl" / config),
        *QUIET,
        "--trainer.fast_dev_run=1",
        "--model.init_args.num_steps=32",
        "--data.init_args.eval_episodes=2",
        "--data.init_args.eval_envs=2",
    )
    net = c.model.net
    assert (net.obs_dim, net.action_dim, net.continuous) == (obs_dim, action_dim, module == "mujoco")
    assert int(c.model.env_steps) == 32 * num_envs
    assert torch.isfinite(c.trainer.callback_metrics["val/return"])
