"""A2CModule: synchronous advantage actor-critic (Mnih et al. 2016, "Asynchronous Methods for Deep RL", in
the synchronous form of OpenAI Baselines' ``a2c`` and SB3's ``A2C``) on gymnasium vector envs.

One Lightning training step is one short rollout (``num_steps`` x N env steps, 5 x 8 by default) and one
gradient step on all of it, with manual optimisation. The rollout collector, GAE (with ``gae_lambda`` 1 it
is the n-step return), the running statistics, evaluation and checkpoints are the same as PPO's
(``zoo.rl.on_policy``, ``zoo.rl.lifecycle``); what differs is the objective (``zoo.rl.losses.a2c_loss``: no
ratio, no clipping, one pass over fresh data) and the optimizer (RMSprop, as Baselines and SB3).

Checkpoints carry the net, the running statistics, the env-step counter, the optimizer and the RNG states;
a resumed run continues. ``total_env_steps`` is the budget; ``val_check_interval`` counts rollouts.
Notation: T steps per rollout, N envs.
"""

from __future__ import annotations

from lightning.pytorch import LightningModule

from zoo.adapt import Adaptation
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.rl.common import linear_annealing, trained
from zoo.rl.losses import a2c_loss, normalize
from zoo.rl.nets import ActorCritic
from zoo.rl.on_policy import OnPolicy
from zoo.train.gradnorm import clip_grad_norm
from zoo.train.optim import AdamOrRMSprop


class A2CModule(OnPolicy, WeightsOnlyLoading, LightningModule):
    """A2C: n-step (or GAE) advantages, one RMSprop step per rollout, entropy bonus, gradient clipping."""

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
        anneal_lr: bool = False,
        optimizer: AdamOrRMSprop = AdamOrRMSprop("rmsprop", lr=7e-4, eps=1e-5),
        norm_obs: bool = False,
        norm_reward: bool = False,
        clip_obs: float = 10.0,
        clip_reward: float = 10.0,
        num_threads: int | None = 1,
        adapt: Adaptation | None = None,
        init_weights: str | None = None,
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
            anneal_lr: decay the learning rate linearly to 0 over ``total_env_steps``.
            optimizer: the net's optimizer (``zoo.train.optim.AdamOrRMSprop``): RMSprop, A2C's and SB3's, with SB3's lr
                7e-4, alpha 0.99 and eps 1e-5; ``algorithm: adam`` for Adam.
            norm_obs: feed the net observations normalised by running statistics kept in this module.
            norm_reward: divide rewards by the running std of the discounted return, kept in this module.
            clip_obs: clip normalised observations to [-clip_obs, clip_obs].
            clip_reward: clip scaled rewards to [-clip_reward, clip_reward].
            num_threads: PyTorch CPU threads while this module runs (restored after); None: unchanged.
            adapt: what a fine-tune trains (``zoo.adapt.Adaptation``): LoRA adapters on some layers of the net
                (``lora: {r: 8, alpha: 16}``: the hidden layers, not those ``ActorCritic.io_layers`` names: the
                observation's readers and the heads) and the parameters named by ``trainable`` globs
                (``["net.critic.*"]``); None: every weight. The weights to adapt come from ``zoo.rl.from_pretrained``
                (an SB3 zip).
            init_weights: a Stable-Baselines3 zip of this algorithm (its ``model.save``) to start from: every tensor of
                its policy, read weights-only when the run sets up (never over a checkpoint's weights), the env checked
                against its spaces (``zoo.rl.sb3``), the VecNormalize statistics beside it into ``obs_rms``, which
                this module's settings must match; or a zoo agent's weights (its checkpoint, or a registered model:
                ``cli.py`` downloads ``models:/...``) into the whole module, exactly. ``cli.py`` builds the net as the
                zip or the zoo model states it, and sets the normalisation as the statistics state it.
        """
        AdamOrRMSprop.of(optimizer)  # a checkpoint's hyperparameters (a dict): checked as the config's are
        super().__init__()
        save_hparams(self, "net")
        self.automatic_optimization = False  # an optimizer step per rollout, after the collector's forwards
        self.hold(net, total_env_steps, num_threads, clip_obs, clip_reward)

    # -- fit: one short rollout and one gradient step per training step (the envs: OnPolicy's) ------------------------

    def training_step(self, batch: int, batch_idx: int) -> None:
        """One short rollout of T x N env steps, its n-step (GAE) advantages, one gradient step on all of it."""
        h = self.hparams
        rollout, advantages, returns = self.collect()  # (T, N) advantages and returns
        keep = rollout.valid.flatten()  # autoreset steps are not transitions
        obs, actions = rollout.obs.flatten(0, 1)[keep], rollout.actions.flatten(0, 1)[keep]
        adv, ret = advantages.flatten()[keep], returns.flatten()[keep]
        if h.norm_adv:
            adv = normalize(adv)
        _, logprob, entropy, value = self.net.get_action_and_value(obs, actions)
        stats = a2c_loss(logprob, adv, value, ret, entropy, h.vf_coef, h.ent_coef)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(stats["loss"])
        stats |= clip_grad_norm(self.net.parameters(), h.max_grad_norm)  # grad/norm before clipping
        opt.step()
        self.end_rollout(rollout, returns, stats)

    def configure_optimizers(self):
        h = self.hparams
        # One group, as checkpoints hold it: the parameters that train (all of them unless adapt freezes some).
        opt = AdamOrRMSprop.of(h.optimizer).build(trained(self.net.parameters(), "net"))
        return linear_annealing(opt, lambda: self.lifecycle.progress(self), h.anneal_lr)

    # -- the end of fit, or of a failed one: the lifecycle's -----------------------------------------------------------
