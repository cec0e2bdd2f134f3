"""PPOModule: proximal policy optimisation (Schulman et al. 2017) on gymnasium vector envs.

One Lightning training step is one rollout plus every PPO epoch and minibatch on it, with manual
optimisation: Lightning's per-step overhead (~0.4 ms) would otherwise be paid per minibatch, about as long
as the minibatch update of a small MLP itself. The training loader only paces the steps (see
``datamodules.gym``); the module owns a ``RolloutCollector`` over the DataModule's training envs and an
``Evaluator`` over separate envs for validation and predict.

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
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from zoo.layers.gradnorm import clip_grad_norm
from zoo.layers.hparams import save_hparams
from zoo.layers.optim import param_groups
from zoo.rl.agent import AgentModule, collect_rollout, finish_rollout, open_rollout_collector, rollout_env_steps
from zoo.rl.collector import Rollout
from zoo.rl.distributed import sum_over_ranks
from zoo.rl.losses import normalize, ppo_loss
from zoo.rl.nets import ActorCritic
from zoo.rl.normalization import RunningMeanStd


class PPOModule(AgentModule):
    """PPO-clip with GAE, minibatch epochs, advantage normalisation, target-KL stop, LR annealing."""

    # The on-policy collector of zoo.rl.agent (PPO's and A2C's): T x N env steps per training step.
    start_collecting = open_rollout_collector
    batch_env_steps = property(rollout_env_steps)

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
        lr: float = 2.5e-4,
        anneal_lr: bool = True,
        anneal_clip: bool = False,
        adam_eps: float = 1e-5,
        weight_decay: float = 0.0,
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
            num_steps: T, steps per env per rollout; a rollout is T x N env steps.
            update_epochs: passes over each rollout.
            num_minibatches: minibatches per pass (the rollout's valid steps split evenly).
            gamma: discount factor.
            gae_lambda: GAE's lambda, trading the bias of bootstrapping for variance.
            clip_coef: PPO's epsilon, the clip range of the probability ratio.
            clip_vloss: also clip the value update to within ``clip_coef`` of the old value (Baselines' PPO2).
            ent_coef: weight of the entropy bonus.
            vf_coef: weight of the value loss.
            max_grad_norm: global gradient-norm clip.
            target_kl: stop this rollout's updates before a minibatch whose approximate KL to the collecting
                policy exceeds 1.5 x target_kl (SB3); None never stops early.
            norm_adv: normalise advantages per minibatch.
            lr: Adam learning rate (at the start, when annealed).
            anneal_lr: decay the learning rate linearly to 0 over ``total_env_steps``.
            anneal_clip: decay ``clip_coef`` linearly to 0 over ``total_env_steps`` too (rl-zoo's ``lin_0.2``).
            adam_eps: Adam's epsilon; 1e-5 as Baselines' PPO2 (PyTorch's 1e-8 differs).
            weight_decay: AdamW decoupled weight decay on >=2-D weights; RL agents normally use none.
            norm_obs: feed the net observations normalised by running statistics kept in this module.
            norm_reward: divide rewards by the running std of the discounted return, kept in this module.
            clip_obs: clip normalised observations to [-clip_obs, clip_obs].
            clip_reward: clip scaled rewards to [-clip_reward, clip_reward].
            num_threads: PyTorch CPU threads while this module runs (restored after); a small MLP runs
                fastest on one, as intra-op threads cost more to synchronise than they save. None: unchanged.
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
        """One rollout, then every PPO epoch and minibatch on it."""
        h = self.hparams
        rollout, advantages, returns = collect_rollout(self)
        clip = h.clip_coef * (1.0 - self.progress()) if h.anneal_clip else h.clip_coef
        stats = self._update(rollout, advantages, returns, clip)
        return finish_rollout(self, rollout, returns, stats, write)

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
                out = ppo_loss(logprob, old_logprobs[mb], adv, value, old_values[mb], returns[mb], entropy,
                               clip, h.vf_coef, h.ent_coef, h.clip_vloss)
                if h.target_kl is not None and self._mean_over_ranks(out["approx_kl"]) > 1.5 * h.target_kl:
                    return {**out, **grads, "updates": torch.tensor(float(updates))}  # SB3: stop before the overshoot
                opt.zero_grad()
                self.manual_backward(out["loss"])
                grads = clip_grad_norm(self.net.parameters(), h.max_grad_norm)  # the norm before clipping
                opt.step()
                updates += 1
        return {**out, **grads, "updates": torch.tensor(float(updates))}

    def _mean_over_ranks(self, x: Tensor) -> Tensor:
        """``x`` averaged over the DDP ranks (a collective), so that all of them stop early together."""
        return sum_over_ranks(x.detach().clone()) / self.world_size

    def configure_optimizers(self):
        h = self.hparams
        # The fused kernel (CPU and CUDA) is one op per tensor instead of about ten: PPO makes thousands of
        # small steps, each costing little more than its per-op overhead.
        fused = all(p.device.type in ("cpu", "cuda") for p in self.net.parameters())
        opt = torch.optim.AdamW(param_groups(self.net, h.weight_decay), lr=h.lr, eps=h.adam_eps, fused=fused or None)
        # Stepped once per rollout by training_step; a function of the env steps spent, so resuming needs no
        # schedule state (CleanRL's `frac = 1 - (iteration - 1) / num_iterations`).
        factor = (lambda _: 1.0 - self.progress()) if h.anneal_lr else (lambda _: 1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": LambdaLR(opt, factor), "name": "lr"}}
