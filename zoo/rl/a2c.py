"""A2CModule: synchronous advantage actor-critic (Mnih et al. 2016, "Asynchronous Methods for Deep RL", in
the synchronous form of OpenAI Baselines' ``a2c`` and SB3's ``A2C``) on gymnasium vector envs.

One Lightning training step is one short rollout (``num_steps`` x N env steps, 5 x 8 by default) and one
gradient step on all of it, with manual optimisation. The rollout collector, GAE (with ``gae_lambda`` 1 it
is the n-step return), the running statistics, evaluation and checkpoints are the same as PPO's
(``zoo.rl.agent``, ``zoo.rl.collector``); what differs is the objective (``zoo.rl.losses.a2c_loss``: no
ratio, no clipping, one pass over fresh data) and the optimizer (RMSprop, as Baselines and SB3).

Checkpoints carry the net, the running statistics, the env-step counter, the optimizer and the RNG states;
a resumed run continues. ``total_env_steps`` is the budget; ``val_check_interval`` counts rollouts.
Notation: T steps per rollout, N envs.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from zoo.layers.gradnorm import clip_grad_norm
from zoo.layers.hparams import save_hparams
from zoo.rl.agent import (
    AgentModule, collect_rollout, finish_rollout, open_rollout_collector, rmsprop_or_adam, rollout_env_steps,
)
from zoo.rl.collector import Rollout
from zoo.rl.losses import a2c_loss, normalize
from zoo.rl.nets import ActorCritic
from zoo.rl.normalization import RunningMeanStd


class A2CModule(AgentModule):
    """A2C: n-step (or GAE) advantages, one RMSprop step per rollout, entropy bonus, gradient clipping."""

    # The on-policy collector of zoo.rl.agent (PPO's and A2C's): T x N env steps per training step.
    start_collecting = open_rollout_collector
    batch_env_steps = property(rollout_env_steps)

    def __init__(
        self,
        net: ActorCritic,
        total_env_steps: int = 500_000,
        num_steps: int = 5,
        gamma: float = 0.99,
        gae_lambda: float = 1.0,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        norm_adv: bool = False,
        lr: float = 7e-4,
        anneal_lr: bool = False,
        optimizer: Literal["rmsprop", "adam"] = "rmsprop",
        rms_alpha: float = 0.99,
        optim_eps: float = 1e-5,
        norm_obs: bool = False,
        norm_reward: bool = False,
        clip_obs: float = 10.0,
        clip_reward: float = 10.0,
        num_threads: int | None = 1,
    ) -> None:
        """
        Args:
            net: the actor-critic (``zoo.rl.ActorCritic``), sized for the env's spaces.
            total_env_steps: fit stops before a rollout would exceed this many env steps (all envs together).
            num_steps: T, steps per env per rollout (the n of the n-step return); a rollout is T x N env steps.
            gamma: discount factor.
            gae_lambda: 1 gives the n-step return of A2C's paper; below 1, GAE (SB3 offers both).
            ent_coef: weight of the entropy bonus.
            vf_coef: weight of the value loss, a plain mean squared error here (Baselines, SB3).
            max_grad_norm: global gradient-norm clip.
            norm_adv: normalise the rollout's advantages (SB3's ``normalize_advantage``, off by default).
            lr: learning rate (at the start, when annealed).
            anneal_lr: decay the learning rate linearly to 0 over ``total_env_steps``.
            optimizer: "rmsprop" (A2C's and SB3's default) or "adam".
            rms_alpha: RMSprop's smoothing constant (0.99, SB3).
            optim_eps: the optimizer's epsilon (1e-5, SB3).
            norm_obs: feed the net observations normalised by running statistics kept in this module.
            norm_reward: divide rewards by the running std of the discounted return, kept in this module.
            clip_obs: clip normalised observations to [-clip_obs, clip_obs].
            clip_reward: clip scaled rewards to [-clip_reward, clip_reward].
            num_threads: PyTorch CPU threads while this module runs (restored after); None: unchanged.
        """
        super().__init__(num_threads)
        save_hparams(self, "net")
        self.net = net
        if not net.unsized:
            self.net_sized()
        self.return_rms = RunningMeanStd((), clip=clip_reward)
        self.ended_episodes: list[Tensor] = []  # returns and lengths of training episodes since the last log

    def net_sized(self) -> None:
        self.obs_rms = RunningMeanStd(self.net.obs_shape or (self.net.obs_dim,), clip=self.hparams.clip_obs)

    def learn(self, write: bool) -> dict[str, Tensor]:
        """One short rollout and one gradient step on all of it."""
        rollout, advantages, returns = collect_rollout(self)
        stats = self._update(rollout, advantages, returns)
        return finish_rollout(self, rollout, returns, stats, write)

    def _update(self, rollout: Rollout, advantages: Tensor, returns: Tensor) -> dict[str, Tensor]:
        """One gradient step on the rollout's valid steps (autoreset steps are not transitions)."""
        h = self.hparams
        keep = rollout.valid.flatten()
        obs, actions = rollout.obs.flatten(0, 1)[keep], rollout.actions.flatten(0, 1)[keep]
        advantages, returns = advantages.flatten()[keep], returns.flatten()[keep]
        if h.norm_adv:
            advantages = normalize(advantages)
        _, logprob, entropy, value = self.net.get_action_and_value(obs, actions)
        out = a2c_loss(logprob, advantages, value, returns, entropy, h.vf_coef, h.ent_coef)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(out["loss"])
        out |= clip_grad_norm(self.net.parameters(), h.max_grad_norm)  # grad/norm before clipping
        opt.step()
        return out

    def configure_optimizers(self):
        return rmsprop_or_adam(self)
