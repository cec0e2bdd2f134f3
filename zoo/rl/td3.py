"""TD3: twin delayed deep deterministic policy gradient (Fujimoto et al. 2018, "Addressing Function Approximation
Error in Actor-Critic Methods") on gymnasium vector envs.

DDPG's deterministic actor mu(s) and critic, with the paper's three fixes against the critic's overestimation:
twin critics whose minimum forms the target (clipped double Q), noise on the target action (target policy
smoothing) and an actor and targets that move once every ``policy_delay`` critic steps (delayed updates). The
nets follow CleanRL's ``td3_continuous_action.py`` and SB3's ``TD3`` (ReLU MLPs, PyTorch's default init, a tanh
actor rescaled to the Box); the nets are ``zoo.rl.q_nets``' (twin critics shared with SAC).

One update, in SB3's order (``TD3.train``), on a replay minibatch (s, a, r, s', terminated):
  1. a' = clip(mu_targ(s') + clip(eps, -c, c) * scale, low, high), eps ~ N(0, sigma): the smoothed target action;
  2. y = r + gamma (1 - terminated) min_k Q_targ_k(s', a');
  3. the critics step on sum_k mean((Q_k(s, a) - y)^2);
  4. every ``policy_delay``-th update only: the actor steps on -mean Q_1(s, mu(s)), then the target actor and
     critics move towards theirs by Polyak averaging, theta' <- (1 - tau) theta' + tau theta.
Exploration adds N(0, (action_noise * scale)^2) to mu(s) and clips to the Box (SB3's ``NormalActionNoise`` in its
[-1, 1] action units; CleanRL's ``exploration_noise``); before ``learning_starts`` env steps the actions are uniform.
Collection, replay, evaluation and checkpoints are SAC's (``zoo.rl.replay``, ``zoo.rl.lifecycle``).

Checkpoints carry the nets and both targets, the running observation statistics, the env-step and update counters
(buffers), the two optimizers, the RNG states and, with ``save_buffer``, the replay buffer.
Notation: B minibatch rows, N envs, O observation features, A action dims, K critics.
"""

from __future__ import annotations

import copy

import torch
from lightning.pytorch import LightningModule
from torch import Tensor

from zoo.adapt import Adaptation
from zoo.compat import foreach_lerp_
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.rl import off_policy
from zoo.rl.common import Policy, trained
from zoo.rl.lifecycle import HeldLifecycle, Lifecycle
from zoo.rl.normalization import RunningMeanStd
from zoo.rl.q_nets import DeterministicActorCritic
from zoo.train.optim import AdamOrRMSprop

# -- the objective, as SB3's TD3.train writes it -----------------------------------------------------------------


def smoothed_target_action(
    next_action: Tensor, noise: Tensor, noise_clip: float, action_scale: Tensor, low: Tensor, high: Tensor
) -> Tensor:
    """Target policy smoothing: clip(mu_targ(s') + clip(noise, -c, c) * scale, low, high); ``noise`` ~ N(0, sigma)
    in [-1, 1] action units (SB3's), rescaled to the Box (CleanRL's ``clipped_noise * action_scale``)."""
    return (next_action + noise.clamp(-noise_clip, noise_clip) * action_scale).clamp(low, high)  # (B, A)


def td3_target(rewards: Tensor, terminated: Tensor, next_q: Tensor, gamma: float) -> Tensor:
    """y = r + gamma (1 - terminated) min_k Q_targ_k(s', a') (B,); ``next_q`` (K, B). A truncation bootstraps."""
    return rewards + gamma * (1.0 - terminated) * next_q.min(0).values


def td3_critic_loss(q: Tensor, target: Tensor) -> dict[str, Tensor]:
    """sum_k mean((Q_k(s, a) - y)^2), SB3's and CleanRL's sum (SAC's halves it); ``q`` (K, B)."""
    per_critic = (q - target).square().mean(1)  # (K,)
    return {
        "loss": per_critic.sum(),
        "qf1_loss": per_critic[0].detach(),
        "qf2_loss": per_critic[-1].detach(),
        "q_value": q.detach().mean(),
    }


def td3_actor_loss(q1_pi: Tensor) -> dict[str, Tensor]:
    """-mean Q_1(s, mu(s)): the deterministic policy gradient through the first critic alone."""
    return {"loss": -q1_pi.mean()}


# -- the module -------------------------------------------------------------------------------------------------


class TD3Module(HeldLifecycle, WeightsOnlyLoading, LightningModule):
    """TD3 with twin critics, target policy smoothing, delayed actor and target updates, Gaussian exploration."""

    BOX = "TD3"  # a bounded Box action space: the actor squashes into it

    def __init__(
        self,
        net: DeterministicActorCritic,
        total_env_steps: int = 100_000,
        steps_per_batch: int = 100,
        buffer_size: int = 1_000_000,
        learning_starts: int = 25_000,
        batch_size: int = 256,
        gamma: float = 0.99,
        tau: float = 0.005,
        train_freq: int = 1,
        gradient_steps: int = 1,
        policy_delay: int = 2,
        target_policy_noise: float = 0.2,
        target_noise_clip: float = 0.5,
        action_noise: float = 0.1,
        actor_optimizer: AdamOrRMSprop = AdamOrRMSprop(lr=3e-4),
        critic_optimizer: AdamOrRMSprop = AdamOrRMSprop(lr=3e-4),
        norm_obs: bool = False,
        clip_obs: float = 10.0,
        save_buffer: bool = False,
        num_threads: int | None = 1,
        adapt: Adaptation | None = None,
        init_weights: str | None = None,
    ) -> None:
        """
        Args:
            net: actor and twin critics (``zoo.rl.DeterministicActorCritic``), sized and bounded for the env.
            total_env_steps: fit stops before a training step would exceed this many env steps (all envs together).
            steps_per_batch: vector-env steps per Lightning training step, each followed by its updates.
            buffer_size: replay capacity in transitions; the oldest are overwritten first.
            learning_starts: env steps of uniformly random actions, without updates, before learning starts
                (CleanRL's 25k; SB3's 100).
            batch_size: transitions per update, sampled uniformly from the buffer.
            gamma: discount factor.
            tau: Polyak coefficient of the target actor and critics.
            train_freq: vector-env steps between two rounds of updates (SB3's ``train_freq``).
            gradient_steps: updates per round (SB3's ``gradient_steps``).
            policy_delay: critic updates per actor update and Polyak step (the paper's d = 2).
            target_policy_noise: sigma of the target action's Gaussian noise, in [-1, 1] action units (0.2).
            target_noise_clip: c, the clip of that noise (0.5).
            action_noise: std of the exploration noise added to mu(s), in [-1, 1] action units (0.1).
            actor_optimizer: the actor's optimizer (``zoo.train.optim.AdamOrRMSprop``): Adam, lr 3e-4.
            critic_optimizer: the critics'.
            norm_obs: feed the nets observations normalised by running statistics kept in this module; the buffer
                stores raw observations, normalised when sampled.
            clip_obs: clip normalised observations to [-clip_obs, clip_obs].
            save_buffer: put the replay buffer in checkpoints, so that a resumed run continues with it.
            num_threads: PyTorch CPU threads while this module runs (restored after). None: unchanged.
            adapt: what a fine-tune trains (``zoo.adapt.Adaptation``): the parameters of the net named by
                ``trainable`` globs, some of the actor's and some of the critics' (each has its optimizer):
                ``["net.actor.mlp.4.*", "net.critic.*"]``; None: every weight. The target nets follow as in full
                training. LoRA (``adapt.lora``) is refused here: the target nets are Polyak copies
                over parameter lists, which adapters would misalign.
            init_weights: a Stable-Baselines3 zip of this algorithm (its ``model.save``) to start from: every tensor of
                its policy, read weights-only when the run sets up (never over a checkpoint's weights), the env checked
                against its spaces (``zoo.rl.sb3``), the VecNormalize statistics beside it into ``obs_rms``, which
                this module's settings must match; or a zoo agent's weights (its checkpoint, or a registered model:
                ``cli.py`` downloads ``models:/...``) into the whole module, exactly. ``cli.py`` builds the net as the
                zip or the zoo model states it, and sets the normalisation as the statistics state it.
        """
        for settings in (actor_optimizer, critic_optimizer):
            AdamOrRMSprop.of(settings)  # a checkpoint's hyperparameters (dicts): checked as the config's are
        super().__init__()
        save_hparams(self, "net")
        self.automatic_optimization = False  # two optimizers, the actor's stepped every policy_delay updates
        self.net = net
        self._build_beside_net()
        self.register_buffer("env_steps", torch.zeros((), dtype=torch.int64))  # spent of the budget, every rank's
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))
        # The replay buffer is its too; the target nets are left alone by adapt.
        self.lifecycle = Lifecycle(total_env_steps, num_threads, save_buffer, targets=("actor_target", "critic_target"))

    def _build_beside_net(self) -> None:
        """What the module sizes from the net: the target actor and critics (submodules that only Polyak averaging
        moves, so checkpoints carry them) and the observation statistics."""
        self.actor_target = copy.deepcopy(self.net.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.net.critic).requires_grad_(False)
        self.obs_rms = RunningMeanStd((self.net.obs_dim,), clip=self.hparams.clip_obs)

    def observe(self, x: Tensor) -> Tensor:
        """Raw observations (B, O) as the nets see them: normalised by the running statistics with ``norm_obs``."""
        return self.obs_rms.normalize(x) if self.hparams.norm_obs else x

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Actions (B, A) in the Box for raw observations (B, O): mu(s), or mu(s) plus Gaussian exploration noise."""
        action = self.net.act(self.observe(torch.as_tensor(obs, dtype=torch.float32, device=self.device)))
        if deterministic:
            return action
        actor = self.net.actor
        noise = torch.randn_like(action) * (self.hparams.action_noise * actor.action_scale)
        return (action + noise).clamp(actor.action_bias - actor.action_scale, actor.action_bias + actor.action_scale)

    def policy(self) -> Policy:
        """The deterministic policy on raw observations, normaliser included (what ``zoo.rl.export`` traces)."""
        return Policy(self.net, self.obs_rms if self.hparams.norm_obs else None)

    def _explore(self, obs: Tensor) -> Tensor:
        return self.act(obs, deterministic=False)

    # -- fit: the envs and the buffer, then steps_per_batch env steps and their updates per training step --------------

    def on_train_start(self) -> None:
        off_policy.start(self, "TD3")

    def training_step(self, batch: int, batch_idx: int) -> None:
        """``steps_per_batch`` vector-env steps, each followed by its updates (``zoo.rl.off_policy``, SB3's schedule,
        as SAC's)."""
        actor_opt, critic_opt = self.optimizers()
        off_policy.collect_and_update(
            self, self._explore, lambda n, measure: self._update(actor_opt, critic_opt, n, measure=measure)
        )

    def _update(self, actor_opt, critic_opt, update: int, measure: bool = False) -> dict[str, Tensor]:
        """Update number ``update`` (from 1): the critics' step on a replay minibatch; on every ``policy_delay``-th,
        the actor's step and the targets' Polyak step. Its terms, with gradient norms when ``measure``."""
        h, actor = self.hparams, self.net.actor
        grads: dict[str, Tensor] | None = {} if measure else None
        data = self.lifecycle.buffer.sample(h.batch_size)
        obs, next_obs = self.observe(data.obs), self.observe(data.next_obs)  # (B, O)
        # 1-2. The smoothed target action and the clipped double-Q target.
        with torch.no_grad():
            noise = torch.randn_like(data.actions) * h.target_policy_noise  # (B, A)
            next_action = smoothed_target_action(
                self.actor_target(next_obs),
                noise,
                h.target_noise_clip,
                actor.action_scale,
                actor.action_bias - actor.action_scale,
                actor.action_bias + actor.action_scale,
            )
            target = td3_target(data.rewards, data.terminated, self.critic_target(next_obs, next_action), h.gamma)
        # 3. The critics towards it.
        critic = td3_critic_loss(self.net.get_q_values(obs, data.actions), target)
        off_policy.optimizer_step(self, critic_opt, critic["loss"], self.net.critic.parameters(), "critic", grads)
        out = {"critic_loss": critic.pop("loss"), **critic}
        # 4. Delayed: the actor through the updated first critic, then both targets.
        if update % h.policy_delay == 0:
            actor_loss = td3_actor_loss(self.net.get_q1(obs, actor(obs)))["loss"]
            off_policy.optimizer_step(self, actor_opt, actor_loss, actor.parameters(), "actor", grads)
            with torch.no_grad():  # theta' <- theta' + tau (theta - theta'), one fused op over every target tensor
                foreach_lerp_(
                    [*self.actor_target.parameters(), *self.critic_target.parameters()],
                    [*actor.parameters(), *self.net.critic.parameters()],
                    h.tau,
                )
            out["actor_loss"] = actor_loss.detach()
        return {**out, **(grads or {})}

    def configure_optimizers(self):
        h = self.hparams  # one group each, as checkpoints hold them
        return [
            AdamOrRMSprop.of(h.actor_optimizer).build(trained(self.net.actor.parameters(), "net.actor")),
            AdamOrRMSprop.of(h.critic_optimizer).build(trained(self.net.critic.parameters(), "net.critic")),
        ]

    # -- the end of fit, or of a failed one: the lifecycle's -----------------------------------------------------------
