"""What A2C and PPO share beyond the lifecycle (``OnPolicy``): an actor-critic acting on observations normalised by
running statistics, one rollout of T x N env steps per training step with its GAE advantages, and the step's end
(episodes, explained variance, budget, learning rate). Each agent's file keeps its settings and its update, as
CleanRL's ``ppo.py`` shows its own. Notation: T steps per rollout, N envs, B rows, O observation features.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.rl.collector import Rollout, RolloutCollector
from zoo.rl.common import Policy, require_datamodule
from zoo.rl.lifecycle import HeldLifecycle, Lifecycle
from zoo.rl.losses import explained_variance, gae
from zoo.rl.normalization import RunningMeanStd
from zoo.train.logging import lightning_writes


class OnPolicy(HeldLifecycle):
    """Mixed in before the module's base classes; the agent calls ``hold`` in its ``__init__`` and reads the settings
    ``num_steps``, ``gamma``, ``gae_lambda``, ``norm_obs`` and ``norm_reward`` from its hyperparameters."""

    def hold(
        self, net: nn.Module, total_env_steps: int, num_threads: int | None, clip_obs: float, clip_reward: float
    ) -> None:
        """The net, the running statistics and the env-step count a checkpoint carries, and the lifecycle."""
        self.net = net
        self.obs_rms = RunningMeanStd(net.obs_shape or (net.obs_dim,), clip=clip_obs)
        self.return_rms = RunningMeanStd((), clip=clip_reward)
        self.register_buffer("env_steps", torch.zeros((), dtype=torch.int64))  # spent of the budget, every rank's
        self.lifecycle = Lifecycle(total_env_steps, num_threads)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Actions for raw observations (B, O): the policy's mode, or a sample of it."""
        x = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        return self.net.act(self.obs_rms.normalize(x) if self.hparams.norm_obs else x, deterministic)

    def policy(self) -> Policy:
        """The deterministic policy on raw observations, normaliser included (what ``zoo.rl.export`` traces)."""
        return Policy(self.net, self.obs_rms if self.hparams.norm_obs else None)

    def on_train_start(self) -> None:
        h, dm = self.hparams, require_datamodule(self)
        if (seed := self.lifecycle.start(self, h.num_steps * dm.num_envs)) is not None:  # T x N env steps per rollout
            self.lifecycle.collector = RolloutCollector(
                dm.make_envs(),
                h.num_steps,
                self.device,
                self.obs_rms if h.norm_obs else None,
                self.return_rms if h.norm_reward else None,
                h.gamma,
                seed=seed,
            )

    def collect(self) -> tuple[Rollout, Tensor, Tensor]:
        """One rollout of T x N env steps (the running statistics take its observations and returns), with its GAE
        advantages and returns, (T, N) each."""
        h = self.hparams
        rollout = self.lifecycle.collector.collect(self.net)
        advantages, returns = gae(
            rollout.rewards, rollout.values, rollout.terminated, rollout.truncated, h.gamma, h.gae_lambda
        )
        return rollout, advantages, returns

    def end_rollout(self, rollout: Rollout, returns: Tensor, stats: dict[str, Tensor]) -> None:
        """After the update: the rollout's ended episodes and its figures logged when Lightning writes them, the env
        steps spent against the budget, the rate for the next rollout set (a function of the env steps spent)."""
        write = lightning_writes(self.trainer)
        self.lifecycle.episodes.add(rollout.episode_returns, rollout.episode_lengths)
        if write:
            keep = rollout.valid  # autoreset steps are not transitions
            stats["explained_variance"] = explained_variance(rollout.values[:-1][keep], returns[keep])
        self.lifecycle.end_step(self, rollout.env_steps, stats, write)
        self.lr_schedulers().step()
