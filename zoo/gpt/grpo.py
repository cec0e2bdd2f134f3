"""GRPO: a language model tuned by a policy gradient on its own sampled completions, scored by verifiable rewards.

Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, section 4.1) needs no value
net: each prompt's G completions are scored (``zoo.gpt.rewards``) and each completion's advantage is its reward
against its group's mean (over the group's std unless ``scale_rewards`` is false: Dr. GRPO, Liu et al. 2025). One
training step, as TRL's ``GRPOTrainer`` does it:

  1. sample G completions per prompt with the net's own KV-cache loop, in eval mode, no gradient, keeping each
     token's log-probability under the distribution sampled from: the "old" policy (``zoo.gpt.rollout``);
  2. score them: the weighted sum of the rewards, against the prompt's answer;
  3. ``num_iterations`` passes over the rollouts in minibatches of whole groups: recompute the tokens'
     log-probabilities with gradients, the clipped surrogate against the old ones (``zoo.gpt.losses.grpo_objective``,
     shared with PPO), one optimizer step each;
  4. with ``beta`` > 0, a k3 KL term to the starting weights (off by default, as in TRL since 0.19): with LoRA
     adapters as all that trains, the net with its adapters off, else a frozen copy (``zoo.gpt.reference``, DPO's).

Validation scores the greedy reply of each held-out prompt: ``val/accuracy`` (exact match of the final answer) and
``val/reward``; a few (prompt, completion, answer, reward) rows are kept in ``completion_samples`` for a callback.
The reward functions come from the user's config only: never from a checkpoint (``zoo.gpt.rewards``).

Notation: B prompts, G completions per prompt, R = B * G rows, T = max_new_tokens.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from torch import Tensor, nn

from zoo.errors import InputError
from zoo.gpt.generate import generate
from zoo.gpt.gpt import GPT
from zoo.gpt.losses import grpo_objective
from zoo.gpt.module import CausalLMModule
from zoo.gpt.reference import Reference, refuse_adapter_start
from zoo.gpt.rewards import OnError, Reward, correct, score
from zoo.gpt.rollout import Rollout, per_token_logps, sample_groups
from zoo.train.logging import lightning_writes
from zoo.train.policy_gradient import LossType, masked_mean


class GRPOModule(CausalLMModule):
    """Tunes a ``GPT`` by GRPO on prompts with answers (``datamodules.PromptDataModule``); generation, adapters,
    tokenizer and checkpoints are ``CausalLMModule``'s."""

    def __init__(
        self,
        net: GPT,
        rewards: list[Reward] | None = None,
        group_size: int = 8,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float | None = None,
        loss_type: LossType = "grpo",
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        scale_rewards: bool = True,
        beta: float = 0.0,
        num_iterations: int = 1,
        minibatch_prompts: int | None = None,
        max_grad_norm: float | None = 1.0,
        reward_timeout: float | None = 5.0,
        reward_errors: OnError = "stop",
        val_samples: int = 4,
        **kwargs,
    ) -> None:
        """
        Args:
            net: the decoder (``zoo.gpt.GPT``), ids (B, T) -> logits (B, T, V).
            rewards: reward functions (``zoo.gpt.rewards``: ExactMatch, FormatCheck, NumericTolerance, or a
                subclass of Reward of yours), summed with their weights; from your config only, never stored.
            group_size: G, completions sampled per prompt.
            max_new_tokens: the token budget of a completion (prompt + budget must fit the net's block_size).
            temperature: the sampling temperature of the rollouts (and of the recomputed log-probabilities).
            top_p: nucleus sampling of the rollouts; None: the whole distribution.
            loss_type: how token losses are averaged (TRL's): grpo, dr_grpo or dapo.
            epsilon_low: the ratio's clip below 1 (TRL's epsilon).
            epsilon_high: the ratio's clip above 1; above epsilon_low: DAPO's clip-higher.
            scale_rewards: divide the group-centred rewards by the group's std (false: Dr. GRPO).
            beta: the weight of the KL to the starting weights; 0 builds no reference. With LoRA adapters alone
                training, the reference is the net with its adapters off (no copy), so not with adapter_weights.
            num_iterations: optimisation passes over each batch of rollouts (TRL's num_iterations, GRPO's mu).
            minibatch_prompts: prompts (each with its whole group) per optimizer step; None: the whole batch.
            max_grad_norm: clip the gradients' global norm to this; None: no clipping.
            reward_timeout: seconds a reward may take on one completion before the run stops; None: no limit.
            reward_errors: a reward that raises, hangs or returns a non-finite value: stop the run (one error line
                naming it and the completion), or "zero": score 0 from it, counted in train/reward_errors.
            val_samples: (prompt, completion, answer, reward) rows kept per validation for the sample table.
            **kwargs: ``CausalLMModule``'s (optimizer, init_weights, adapt, generation, compile).
        """
        if group_size < 1 or num_iterations < 1 or max_new_tokens < 1:
            raise InputError(
                f"group_size, num_iterations and max_new_tokens are 1 or more: got {group_size}, {num_iterations}, "
                f"{max_new_tokens}"
            )
        if beta > 0:
            refuse_adapter_start(kwargs.get("adapter_weights"), "GRPO's KL")
        super().__init__(net, **kwargs)
        for hparams in (self.hparams, getattr(self, "_hparams_initial", {})):  # code, not a setting: never stored
            hparams.pop("rewards", None)
        self.rewards = list(rewards or [])
        self.automatic_optimization = False  # several optimizer steps per batch of rollouts
        self._reference = Reference("grpo_reference")  # the start, used when beta > 0; a copy is no submodule
        self.completion_samples: list[dict] = []

    def configure_model(self) -> None:
        if self.hparams.beta > 0:
            self._reference.build(self)  # the weights as setup left them, before adapters are added
        super().configure_model()

    def reference(self) -> contextlib.AbstractContextManager[nn.Module]:
        """pi_ref, in eval mode, for a forward under no_grad: the frozen copy, or this net with its adapters off."""
        return self._reference.forward_net(self)

    # -- one step: sample, score, update -------------------------------------------------------------------------

    def rollout(self, prompts: list[Tensor]) -> Rollout:
        """G completions of each prompt, sampled in eval mode without gradients."""
        h, training = self.hparams, self.net.training
        self.net.eval()
        try:
            stop = self.tokenizer.stop_ids if self.tokenizer is not None else ()
            return sample_groups(self.net, prompts, h.group_size, h.max_new_tokens, h.temperature, h.top_p, stop)
        finally:
            self.net.train(training)

    def completions(self, ids: Tensor, mask: Tensor | None = None) -> list[str]:
        """The text of each completion row (R, T), cut at its mask's end and without its stop token."""
        stop = set(self.tokenizer.stop_ids)
        out = []
        for r, row in enumerate(ids.tolist()):
            row = row[: int(mask[r].sum())] if mask is not None else row
            out.append(self.tokenizer.decode(row[:-1] if row and row[-1] in stop else row))
        return out

    def score_rows(self, texts: list[str], answers: list[str]) -> tuple[Tensor, dict[str, float], list[str]]:
        """Rewards (R,) of completions whose rows are grouped by prompt (row r answers prompt r // G), the metrics
        and each row's answer."""
        if not self.rewards:
            raise InputError(
                "GRPO needs reward functions: give model.init_args.rewards in your config (for example "
                "[{class_path: zoo.gpt.rewards.ExactMatch}]); a checkpoint never brings them"
            )
        h = self.hparams
        per_row = [a for a in answers for _ in range(len(texts) // len(answers))]
        total, each, errors = score(self.rewards, texts, per_row, h.reward_timeout, h.reward_errors)
        metrics = {f"rewards/{name}/mean": sum(v) / len(v) for name, v in each.items()}
        metrics["reward_errors"] = float(errors)
        return torch.tensor(total, dtype=torch.float32, device=self.device), metrics, per_row

    def update(self, rollout: Rollout, rewards: Tensor) -> list[dict[str, Tensor]]:
        """``num_iterations`` passes of clipped-surrogate steps over minibatches of whole groups; each pass's mean
        metrics."""
        h, g = self.hparams, self.hparams.group_size
        opt, sch = self.optimizers(), self.lr_schedulers()
        ref = None
        if h.beta > 0:
            with torch.no_grad(), self.reference() as net:
                ref = per_token_logps(net, rollout.ids, rollout.completion_mask, h.temperature, rollout.pad)
        rows_per_step = (h.minibatch_prompts or len(rewards) // g) * g
        passes = []
        for _ in range(h.num_iterations):
            sums = defaultdict(float)
            steps = list(range(0, len(rewards), rows_per_step))
            for start in steps:
                rows = slice(start, start + rows_per_step)
                out = self.policy_loss(rollout, rewards, rows, None if ref is None else ref[rows])
                opt.zero_grad()
                self.manual_backward(out["loss"])
                if h.max_grad_norm is not None:
                    self.clip_gradients(opt, gradient_clip_val=h.max_grad_norm, gradient_clip_algorithm="norm")
                opt.step()
                if sch is not None:
                    sch.step()
                for k, v in out.items():
                    sums[k] += float(v.detach().mean()) / len(steps)
            passes.append({k: torch.tensor(v) for k, v in sums.items()})
        return passes

    def policy_loss(self, rollout: Rollout, rewards: Tensor, rows: slice, ref_logp: Tensor | None) -> dict:
        """The GRPO objective on ``rows`` (whole groups), against the sampling pass's log-probabilities."""
        h, mask = self.hparams, rollout.completion_mask[rows]
        logp, entropy = per_token_logps(self.net, rollout.ids[rows], mask, h.temperature, rollout.pad[rows], True)
        out = grpo_objective(
            logp,
            rollout.logps[rows],
            rewards[rows],
            mask,
            h.group_size,
            h.loss_type,
            h.epsilon_low,
            h.epsilon_high,
            h.scale_rewards,
            ref_logp=ref_logp,
            beta=h.beta,
            max_completion_length=h.max_new_tokens,
        )
        out.pop("advantages")
        return {**out, "entropy": masked_mean(entropy, mask)}

    def training_step(self, batch: dict, batch_idx: int) -> None:
        rollout = self.rollout(batch["prompt_ids"])
        texts = self.completions(rollout.completion_ids, rollout.completion_mask)
        rewards, metrics, per_row = self.score_rows(texts, batch["answers"])
        passes = self.update(rollout, rewards)
        if lightning_writes(self.trainer):
            grouped = rewards.view(-1, self.hparams.group_size)
            std = grouped.std(1).mean() if self.hparams.group_size > 1 else rewards.new_zeros(())
            self.log("train/reward", rewards.mean(), prog_bar=True)
            self.log_dict(
                {
                    "train/reward_std": std,
                    "train/accuracy": sum(map(correct, texts, per_row)) / len(texts),
                    "train/completion_length": rollout.completion_mask.sum(1).float().mean(),
                    **{f"train/{k}": v for k, v in metrics.items()},
                    **{f"train/{k}": v for k, v in passes[-1].items()},
                }
            )

    # -- validation: greedy replies to held-out prompts ----------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.completion_samples = []

    def scored_replies(self, batch: dict, prefix: str) -> None:
        prompts = batch["prompt_ids"]
        out = generate(self.net, prompts, self.hparams.max_new_tokens, 0.0, stop_ids=self.tokenizer.stop_ids)
        texts = [self.tokenizer.decode([t for t in o.tolist() if t not in self.tokenizer.stop_ids]) for o in out]
        hits = torch.tensor([correct(t, a) for t, a in zip(texts, batch["answers"])], dtype=torch.float32)
        logged = {f"{prefix}accuracy": hits.mean()}
        rewards = None
        if self.rewards:
            rewards = self.score_rows(texts, batch["answers"])[0]
            logged[f"{prefix}reward"] = rewards.mean()
        self.log_dict(logged, batch_size=len(prompts), sync_dist=True, prog_bar=True)
        room = self.hparams.val_samples - len(self.completion_samples)
        for i in range(max(0, min(room, len(texts)))):
            self.completion_samples.append(
                {
                    "prompt": self.tokenizer.decode(prompts[i].tolist()),
                    "completion": texts[i],
                    "answer": batch["answers"][i],
                    "reward": None if rewards is None else float(rewards[i]),
                }
            )

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.scored_replies(batch, "val/")

    def on_validation_epoch_end(self) -> None:
        for r in self.routers:
            r.reset_stats()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        if "task" in batch:  # task records (datamodules.TaskDataModule): CausalLMModule's metrics
            return super().test_step(batch, batch_idx)
        self.scored_replies(batch, "test/")

    def on_test_epoch_end(self) -> None:
        tasks = self.tasks.compute("test/")
        if tasks:
            self.log_dict(tasks)

    # -- checkpoints -------------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        self._reference.save(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._reference.check(checkpoint, "GRPO")
