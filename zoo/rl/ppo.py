"""PPOModule: proximal policy optimisation (Schulman et al. 2017) on gymnasium vector envs.

One Lightning training step is one rollout plus every PPO epoch and minibatch on it, with manual
optimisation: Lightning's per-step overhead (~0.4 ms) would otherwise be paid per minibatch, about as long
as the minibatch update of a small MLP itself. The training loader only paces the steps (see
``datamodules.gym``); what A2C shares (the ``RolloutCollector`` over the DataModule's training envs, acting, GAE, the
step's end: ``zoo.rl.on_policy``) and every agent holds (a ``Lifecycle``, ``zoo.rl.lifecycle``: budget, RNG state,
collector, evaluation, checkpoint state, thread count) is mixed in; this file keeps PPO's settings and update.

Checkpoints carry everything needed to act and to resume: the net, the running observation and return
statistics (buffers), the environment-step counter (a buffer), the optimizer and the RNG states. A resumed
run restarts the episodes that were in flight, on envs seeded from (seed, env_steps).

Under manual optimisation ``trainer.global_step`` counts optimizer steps (minibatches), so Trainer's
``max_steps`` would too: the budget is ``total_env_steps``, and ``val_check_interval`` counts rollouts.

Implementation details follow CleanRL's ``ppo.py`` and SB3's ``PPO``, cited where they are chosen.
Notation: T steps per rollout, N envs, B minibatch rows, O observation features.
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import Tensor

from zoo.adapt import Adaptation
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.rl.collector import Rollout
from zoo.rl.common import linear_annealing, world_size
from zoo.rl.distributed import sum_over_ranks
from zoo.rl.losses import normalize, ppo_loss
from zoo.rl.nets import ActorCritic
from zoo.rl.on_policy import OnPolicy
from zoo.train.gradnorm import clip_grad_norm
from zoo.train.optim import AdamOrRMSprop


class PPOModule(OnPolicy, WeightsOnlyLoading, LightningModule):
    """PPO-clip with GAE, minibatch epochs, advantage normalisation, target-KL stop, LR annealing."""

    def __init__(
        self,
        net: ActorCritic,
        total_env_steps: int = 100_000,
        num_steps: int = 128,
        update_epochs: int = 4,
        num_minibatches: int = 4,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_coef: float = 0.2,
        clip_vloss: bool = False,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        target_kl: float | None = None,
        norm_adv: bool = True,
        optimizer: AdamOrRMSprop = AdamOrRMSprop(lr=2.5e-4, eps=1e-5),
        anneal_lr: bool = True,
        anneal_clip: bool = False,
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
            num_steps: T, steps per env per rollout; a rollout is T x N env steps.
            update_epochs: passes over each rollout.
            num_minibatches: minibatches per pass (the rollout's valid steps split evenly).
            gamma: discount factor.
            gae_lambda: GAE's lambda, trading the bias of bootstrapping for variance.
            clip_coef: PPO's epsilon, the clip range of the probability ratio.
            clip_vloss: also clip the value update to within ``clip_coef`` of the old value (Baselines' PPO2).
            ent_coef: weight of the entropy bonus.
            vf_coef: weight of the value loss 0.5 * mean((V - R)^2) (CleanRL's); SB3 and rl-zoo weigh the plain
                mean squared error, so their ``vf_coef`` is half of the same setting here.
            max_grad_norm: global gradient-norm clip.
            target_kl: stop this rollout's updates before a minibatch whose approximate KL to the collecting
                policy exceeds 1.5 x target_kl (SB3); None never stops early.
            norm_adv: normalise advantages per minibatch.
            optimizer: the net's optimizer (``zoo.train.optim.AdamOrRMSprop``): Adam, lr 2.5e-4 and eps 1e-5 as
                CleanRL's and Baselines' PPO2 (PyTorch's eps 1e-8 differs); ``weight_decay`` decays >=2-D weights (RL
                agents normally use none); ``muon: {}`` gives the net's hidden matrices to Muon (Jordan et al. 2024)
                and the observation-reading layers, heads, biases and log-std (``ActorCritic.io_layers``) to Adam.
            anneal_lr: decay the learning rate (Muon's too) linearly to 0 over ``total_env_steps``.
            anneal_clip: decay ``clip_coef`` linearly to 0 over ``total_env_steps`` too (rl-zoo's ``lin_0.2``).
            norm_obs: feed the net observations normalised by running statistics kept in this module.
            norm_reward: divide rewards by the running std of the discounted return, kept in this module.
            clip_obs: clip normalised observations to [-clip_obs, clip_obs].
            clip_reward: clip scaled rewards to [-clip_reward, clip_reward].
            num_threads: PyTorch CPU threads while this module runs (restored after); a small MLP runs
                fastest on one, as intra-op threads cost more to synchronise than they save. None: unchanged.
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
        # One training step holds many optimizer steps (minibatches): Lightning's per-step overhead would otherwise
        # cost as much as a small MLP's update.
        self.automatic_optimization = False
        self.hold(net, total_env_steps, num_threads, clip_obs, clip_reward)

    # -- fit: one rollout and its update per training step (the envs: OnPolicy's) -------------------------------------

    def training_step(self, batch: int, batch_idx: int) -> None:
        """One rollout of T x N env steps, its GAE advantages, then every PPO epoch and minibatch on it."""
        h = self.hparams
        rollout, advantages, returns = self.collect()  # (T, N) advantages and returns
        clip = h.clip_coef * (1.0 - self.lifecycle.progress(self)) if h.anneal_clip else h.clip_coef
        stats = self._update(rollout, advantages, returns, clip)
        self.end_rollout(rollout, returns, stats)

    def _update(self, rollout: Rollout, advantages: Tensor, returns: Tensor, clip: float) -> dict[str, Tensor]:
        """All epochs and minibatches on one rollout's valid steps; the last minibatch's terms and counts."""
        h = self.hparams
        keep = rollout.valid.flatten().nonzero().squeeze(-1)  # autoreset steps are not transitions
        obs, actions = rollout.obs.flatten(0, 1)[keep], rollout.actions.flatten(0, 1)[keep]
        old_logprobs, old_values = rollout.logprobs.flatten()[keep], rollout.values[:-1].flatten()[keep]
        advantages, returns = advantages.flatten()[keep], returns.flatten()[keep]
        opt = self.optimizers()
        updates, grads = 0, {}
        for _ in range(h.update_epochs):
            # Exactly num_minibatches on every rank whatever its count of valid steps: under DDP each backward
            # averages gradients over the ranks, so they must make the same number of them.
            for mb in torch.randperm(len(keep), device=self.device).tensor_split(h.num_minibatches):
                _, logprob, entropy, value = self.net.get_action_and_value(obs[mb], actions[mb])
                adv = normalize(advantages[mb]) if h.norm_adv else advantages[mb]
                out = ppo_loss(
                    logprob,
                    old_logprobs[mb],
                    adv,
                    value,
                    old_values[mb],
                    returns[mb],
                    entropy,
                    clip,
                    h.vf_coef,
                    h.ent_coef,
                    h.clip_vloss,
                )
                # SB3: stop before the overshoot, on every rank together (the KL averaged over them).
                if h.target_kl is not None and self._mean_over_ranks(out["approx_kl"]) > 1.5 * h.target_kl:
                    return {**out, **grads, "updates": torch.tensor(float(updates))}
                opt.zero_grad()
                self.manual_backward(out["loss"])
                grads = clip_grad_norm(self.net.parameters(), h.max_grad_norm)  # the norm before clipping
                opt.step()
                updates += 1
        return {**out, **grads, "updates": torch.tensor(float(updates))}

    def _mean_over_ranks(self, x: Tensor) -> Tensor:
        """``x`` averaged over the DDP ranks (a collective), so that all of them stop early together."""
        return sum_over_ranks(x.detach().clone()) / world_size(self)

    def configure_optimizers(self):
        h = self.hparams
        # Adam's fused kernel (CPU and CUDA) where it serves: one op per tensor instead of about ten, and PPO makes
        # thousands of small steps, each costing little more than its per-op overhead.
        opt = AdamOrRMSprop.of(h.optimizer).build(self.net)
        return linear_annealing(opt, lambda: self.lifecycle.progress(self), h.anneal_lr)

    # -- the end of fit, or of a failed one: the lifecycle's -----------------------------------------------------------
