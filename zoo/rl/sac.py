"""SACModule: soft actor-critic with a learned temperature (Haarnoja et al. 2018) on gymnasium vector envs.

One Lightning training step is ``steps_per_batch`` env steps, each followed by its gradient updates, with
manual optimisation (actor, critics and temperature have an optimizer each). An update costs a few
milliseconds on a CPU and Lightning's per-step overhead ~0.4-1 ms, so a Lightning step per env step would
cost SAC a tenth of its speed; here that overhead is paid once per ``steps_per_batch`` env steps. The
training loader only paces the steps (``datamodules.gym``); the module opens a ``TransitionCollector`` over the
DataModule's training envs into a ``ReplayBuffer``, and holds a ``Lifecycle`` (``zoo.rl.lifecycle``: budget, RNG
state, collector and buffer, evaluation, checkpoint state, thread count), called from its hooks.

One update, in SB3's order (``SAC.train``; CleanRL's ``sac_continuous_action.py`` differs only in where the
temperature step falls):
  1. a ~ pi(.|s) reparameterised on a replay minibatch; the temperature steps on its log-probabilities;
  2. the critics step towards y = r + gamma (1 - terminated) (min_k Q_targ_k(s', a') - alpha log pi(a'|s'));
  3. the actor steps on mean(alpha log pi(a|s) - min_k Q_k(s, a)), through the just-updated critics;
  4. the target critics move towards the critics by Polyak averaging, theta' <- (1 - tau) theta' + tau theta.
Before ``learning_starts`` env steps the actions are uniformly random (SB3, CleanRL) and nothing is updated.

Checkpoints carry what acting and resuming need: the nets and the target critics, log alpha, the running
observation statistics, the env-step and update counters (buffers), the three optimizers, the RNG states and,
with ``save_buffer``, the replay buffer. A resumed run restarts the episodes that were in flight, on envs seeded
from (seed, env_steps); without the buffer it acts with its policy and updates again once it has refilled
``batch_size`` transitions.

Under manual optimisation ``trainer.global_step`` counts optimizer steps (up to three per update), so the
budget is ``total_env_steps`` and ``val_check_interval`` counts training steps (of ``steps_per_batch`` each).
Notation: B minibatch rows, N envs, O observation features, A action dims, K critics.
"""

from __future__ import annotations

import copy
import math

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from zoo.adapt import Adaptation
from zoo.compat import foreach_lerp_
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.rl import off_policy
from zoo.rl.common import Policy, trained
from zoo.rl.lifecycle import HeldLifecycle, Lifecycle
from zoo.rl.losses import sac_actor_loss, sac_critic_loss, sac_temperature_loss, soft_q_target
from zoo.rl.normalization import RunningMeanStd
from zoo.rl.q_nets import SoftActorCritic
from zoo.train.optim import AdamOrRMSprop


class SACModule(HeldLifecycle, WeightsOnlyLoading, LightningModule):
    """SAC with twin critics, Polyak-averaged targets, automatic entropy temperature and random warm-up."""

    BOX = "SAC"  # a bounded Box action space: the actor squashes into it

    def __init__(
        self,
        net: SoftActorCritic,
        total_env_steps: int = 100_000,
        steps_per_batch: int = 100,
        buffer_size: int = 1_000_000,
        learning_starts: int = 5_000,
        batch_size: int = 256,
        gamma: float = 0.99,
        tau: float = 0.005,
        train_freq: int = 1,
        gradient_steps: int = 1,
        target_update_interval: int = 1,
        actor_optimizer: AdamOrRMSprop = AdamOrRMSprop(lr=3e-4),
        critic_optimizer: AdamOrRMSprop = AdamOrRMSprop(lr=3e-4),
        alpha_optimizer: AdamOrRMSprop = AdamOrRMSprop(lr=3e-4),
        init_alpha: float = 1.0,
        autotune: bool = True,
        target_entropy: float | None = None,
        norm_obs: bool = False,
        clip_obs: float = 10.0,
        save_buffer: bool = False,
        num_threads: int | None = 1,
        adapt: Adaptation | None = None,
        init_weights: str | None = None,
    ) -> None:
        """
        Args:
            net: actor and twin critics (``zoo.rl.SoftActorCritic``), sized and bounded for the env.
            total_env_steps: fit stops before a training step would exceed this many env steps (all envs together).
            steps_per_batch: vector-env steps per Lightning training step, each followed by its updates.
            buffer_size: replay capacity in transitions; the oldest are overwritten first.
            learning_starts: env steps of uniformly random actions, without updates, before learning starts.
            batch_size: transitions per update, sampled uniformly from the buffer.
            gamma: discount factor.
            tau: Polyak coefficient of the target critics (SAC's 0.005).
            train_freq: vector-env steps between two rounds of updates (SB3's ``train_freq``).
            gradient_steps: updates per round (SB3's ``gradient_steps``); 1 with train_freq 1 is one per step.
            target_update_interval: updates between two Polyak steps of the target critics.
            actor_optimizer: the actor's optimizer (``zoo.train.optim.AdamOrRMSprop``): Adam, lr 3e-4.
            critic_optimizer: the critics' (CleanRL: lr 1e-3 for critics and alpha, 3e-4 for the actor).
            alpha_optimizer: log alpha's.
            init_alpha: the temperature alpha at the start (SB3's "auto" and CleanRL start at 1).
            autotune: learn alpha to hold the policy's entropy at ``target_entropy``; False keeps ``init_alpha``.
            target_entropy: the entropy alpha aims for; None takes -A, the heuristic of Haarnoja et al. 2018.
            norm_obs: feed the nets observations normalised by running statistics kept in this module; the
                buffer stores raw observations, normalised when sampled (as SB3's VecNormalize with replay).
            clip_obs: clip normalised observations to [-clip_obs, clip_obs].
            save_buffer: put the replay buffer in checkpoints, so that a resumed run continues with it.
            num_threads: PyTorch CPU threads while this module runs (restored after); on a shared CPU one thread
                runs these 256-wide MLPs fastest, as threads that wait on each other cost more than they share.
                None: unchanged.
            adapt: what a fine-tune trains (``zoo.adapt.Adaptation``): the parameters of the net named by
                ``trainable`` globs, some of the actor's and some of the critics' (each has its optimizer):
                ``["net.actor.head.*", "net.critic.*"]``; None: every weight. The target critics and the temperature
                (``autotune``) follow as in full training. LoRA (``adapt.lora``) is refused here: the
                target nets are Polyak copies over parameter lists, which adapters would misalign.
            init_weights: a Stable-Baselines3 zip of this algorithm (its ``model.save``) to start from: every tensor of
                its policy, read weights-only when the run sets up (never over a checkpoint's weights), the env checked
                against its spaces (``zoo.rl.sb3``), the VecNormalize statistics beside it into ``obs_rms``, which
                this module's settings must match; or a zoo agent's weights (its checkpoint, or a registered model:
                ``cli.py`` downloads ``models:/...``) into the whole module, exactly. ``cli.py`` builds the net as the
                zip or the zoo model states it, and sets the normalisation as the statistics state it.
        """
        for settings in (actor_optimizer, critic_optimizer, alpha_optimizer):
            AdamOrRMSprop.of(settings)  # a checkpoint's hyperparameters (dicts): checked as the config's are
        super().__init__()
        save_hparams(self, "net")
        self.automatic_optimization = False  # three optimizers, stepped in SB3's order within each update
        self.net = net
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha)))
        self._build_beside_net()
        self.register_buffer("env_steps", torch.zeros((), dtype=torch.int64))  # spent of the budget, every rank's
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))
        # The replay buffer is its too; the target critics are left alone by adapt.
        self.lifecycle = Lifecycle(total_env_steps, num_threads, save_buffer, targets=("critic_target",))

    def _build_beside_net(self) -> None:
        """What the module sizes from the net: the target critics, the entropy target, the observation statistics."""
        h = self.hparams
        # The targets are a copy that only Polyak averaging moves; a submodule, so checkpoints carry them.
        self.critic_target = copy.deepcopy(self.net.critic).requires_grad_(False)
        self.target_entropy = float(-self.net.action_dim if h.target_entropy is None else h.target_entropy)
        self.obs_rms = RunningMeanStd((self.net.obs_dim,), clip=h.clip_obs)

    def observe(self, x: Tensor) -> Tensor:
        """Raw observations (B, O) as the nets see them: normalised by the running statistics with ``norm_obs``."""
        return self.obs_rms.normalize(x) if self.hparams.norm_obs else x

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Actions (B, A) in the Box for raw observations (B, O): the squashed mean, or a sample."""
        return self.net.act(self.observe(torch.as_tensor(obs, dtype=torch.float32, device=self.device)), deterministic)

    def policy(self) -> Policy:
        """The deterministic policy on raw observations, normaliser included (what ``zoo.rl.export`` traces)."""
        return Policy(self.net, self.obs_rms if self.hparams.norm_obs else None)

    def _explore(self, obs: Tensor) -> Tensor:
        return self.act(obs, deterministic=False)

    # -- fit: the envs and the buffer, then steps_per_batch env steps and their updates per training step --------------

    def on_train_start(self) -> None:
        off_policy.start(self, "SAC")

    def training_step(self, batch: int, batch_idx: int) -> None:
        """``steps_per_batch`` vector-env steps, each followed by its updates (``zoo.rl.off_policy``, SB3's schedule):
        the targets' Polyak step every ``target_update_interval`` updates."""
        h, optimizers = self.hparams, self.optimizers()
        off_policy.collect_and_update(
            self,
            self._explore,
            lambda n, measure: self._update(*optimizers, polyak=n % h.target_update_interval == 0, measure=measure),
        )

    def _update(
        self, actor_opt, critic_opt, alpha_opt, polyak: bool = True, measure: bool = False
    ) -> dict[str, Tensor]:
        """One gradient update of temperature, critics and actor on a replay minibatch, then the targets'
        Polyak step when ``polyak``; the update's terms, with each network's gradient norm when ``measure``."""
        h = self.hparams
        grads: dict[str, Tensor] | None = {} if measure else None
        data = self.lifecycle.buffer.sample(h.batch_size)
        obs, next_obs = self.observe(data.obs), self.observe(data.next_obs)  # (B, O)
        # 1. The actions the actor loss will score, and the temperature step on their log-probabilities.
        pi, logprob = self.net.get_action(obs)  # (B, A), (B,)
        alpha = self.log_alpha.detach().exp()  # this update's alpha, as SB3's ent_coef (taken before its step)
        temperature = sac_temperature_loss(self.log_alpha, logprob, self.target_entropy)
        if h.autotune:
            off_policy.optimizer_step(self, alpha_opt, temperature["loss"], [self.log_alpha], "temperature", grads)
        # 2. Critics towards the soft target, from fresh next actions and the target critics.
        with torch.no_grad():
            next_action, next_logprob = self.net.get_action(next_obs)
            next_q = self.critic_target(next_obs, next_action)  # (K, B)
            target = soft_q_target(data.rewards, data.terminated, next_q, next_logprob, alpha, h.gamma)
        critic = sac_critic_loss(self.net.get_q_values(obs, data.actions), target)
        off_policy.optimizer_step(self, critic_opt, critic["loss"], self.net.critic.parameters(), "critic", grads)
        # 3. Actor through the updated critics, whose own weights take no gradient from this loss.
        actor = sac_actor_loss(logprob, self.net.get_q_values(obs, pi, detach_params=True), alpha)
        off_policy.optimizer_step(self, actor_opt, actor["loss"], self.net.actor.parameters(), "actor", grads)
        # 4. theta' <- theta' + tau (theta - theta'): one fused op over all target tensors, no loop per tensor.
        if polyak:
            with torch.no_grad():
                foreach_lerp_(list(self.critic_target.parameters()), list(self.net.critic.parameters()), h.tau)
        return {
            "critic_loss": critic.pop("loss"),
            "actor_loss": actor.pop("loss"),
            "alpha_loss": temperature.pop("loss"),
            **critic,
            **actor,
            **temperature,
            **(grads or {}),
        }

    def configure_optimizers(self):
        h = self.hparams
        # Adam's fused kernel where it serves (CPU and CUDA): one op per tensor instead of about ten per parameter, and
        # SAC makes one small step per env step and per optimizer. One group each, as checkpoints hold them.
        return [
            AdamOrRMSprop.of(h.actor_optimizer).build(trained(self.net.actor.parameters(), "net.actor")),
            AdamOrRMSprop.of(h.critic_optimizer).build(trained(self.net.critic.parameters(), "net.critic")),
            AdamOrRMSprop.of(h.alpha_optimizer).build([self.log_alpha]),
        ]

    # -- the end of fit, or of a failed one: the lifecycle's -----------------------------------------------------------
