"""GRPO: a language model tuned by a policy gradient on its own sampled completions, scored by verifiable rewards.

Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, section 4.1) needs no value
net: each prompt's G completions are scored (``zoo.gpt.tune.rewards``) and each completion's advantage is its reward
against its group's mean (over the group's std unless ``loss.scale_std`` is false: Dr. GRPO, Liu et al. 2025). The
objective's settings are one value, ``loss`` (``zoo.gpt.tune.losses.GRPOLoss``), which computes the advantages and
the loss; the module samples, scores and steps the optimizer. One training step, as TRL's ``GRPOTrainer`` does it:

  1. sample G completions per prompt with the net's own KV-cache loop, in eval mode, no gradient, keeping each
     token's log-probability under the distribution sampled from: the "old" policy (``zoo.gpt.tune.rollout``);
  2. score them: the weighted sum of the rewards, against the prompt's answer; a step reward (``StepReward``)
     scores each step instead, and its group-normalised step scores add to each token's advantage (process
     supervision, DeepSeekMath section 4.1.3: ``loss.step_credit`` later or own);
  3. ``num_iterations`` passes over the rollouts in minibatches of whole groups: recompute the tokens'
     log-probabilities with gradients, the clipped surrogate against the old ones
     (``GRPOLoss.objective``, shared with PPO), one optimizer step each;
  4. with ``loss.beta`` > 0, a k3 KL term to the starting weights (off by default, as in TRL since 0.19): with LoRA
     adapters as all that trains, the net with its adapters off, else a frozen copy (``zoo.gpt.tune.reference``, DPO's).

With ``async_actors`` > 0 the rollouts of step 1 come from actor processes instead (``zoo.gpt.tune.async_rollout``), as
IMPALA's do: they sample with weights up to a few updates old while the learner updates, so the clipped
surrogate's "old" policy is the learner's weights at the start of the update (recomputed, no gradient) and each
token's loss is weighted by min(loss.rho_bar, pi_old / mu), mu the actor's sampling policy (V-trace's truncated
importance weight per token; TRL's ``vllm_importance_sampling_mode="token_truncate"``). A rollout sampled by
the learner's current weights weighs 1 exactly (its sampling pass is pi_old), as in the synchronous path.

With a text environment's seeds as the data (``datamodules.EpisodeDataModule``) a step plays G multi-turn episodes
of each seed instead (``zoo.gpt.tune.episodes``: the KV cache carried across turns, one sequence per episode, only
the policy's tokens trained), each episode's return against its seed's group, or each turn's reward as a step
(``episodes.turn_credit``); on the actor pool with ``async_actors`` > 0 (``zoo.gpt.tune.async_episodes``).

Answers are read by the data's answer rule (``answer_pattern`` in each batch, ``cli.py test``'s rule:
``zoo.gpt.tasks.correct``), by the rewards and by the accuracies alike. Validation scores the greedy reply of each
held-out prompt: ``val/accuracy`` (exact match of the final answer) and ``val/reward``; a few (prompt, completion,
answer, reward) rows are kept in ``completion_samples`` for a callback. The reward functions come from the user's
config only: never from a checkpoint (``zoo.gpt.tune.rewards``). Training logs reward, accuracy and sampled tokens per
second on the progress bar (``callbacks.ProgressBar``, a default callback).

Notation: B prompts, G completions per prompt, R = B * G rows, T = generation.max_new_tokens.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zoo.errors import InputError
from zoo.gpt.generate import Generation, evaluating, generate
from zoo.gpt.gpt import GPT
from zoo.gpt.module import CausalLMModule
from zoo.gpt.tasks import correct
from zoo.gpt.tune.async_episodes import AsyncEpisodes, EpisodeSampling
from zoo.gpt.tune.async_rollout import AsyncRollouts, Behaviour, Sampling
from zoo.gpt.tune.episodes import (
    EnvRows,
    EnvSource,
    Episode,
    Episodes,
    episode_metrics,
    play_groups,
    rollout_of,
    sample_row,
    scaffold_for,
    turn_steps,
)
from zoo.gpt.tune.losses import GRPOLoss
from zoo.gpt.tune.reference import Reference, refuse_adapter_start
from zoo.gpt.tune.rewards import OnError, Reward, StepReward, score, score_steps
from zoo.gpt.tune.rollout import Rollout, per_token_logps, place_steps, sample_groups
from zoo.train.logging import lightning_writes
from zoo.train.policy_gradient import masked_mean


@dataclass
class Scores:
    """A batch of completions scored: ``outcome`` (R,) the weighted sum of the plain rewards (the group advantages'),
    ``total`` (R,) that plus each step reward's weighted mean step score (what is logged as the reward), ``steps``
    each row's weighted (end, score) pairs from the step rewards, ``metrics`` and each row's answer ``per_row``."""

    outcome: Tensor
    total: Tensor
    steps: list[list[tuple[int, float]]]
    metrics: dict[str, float]
    per_row: list[str]


class GRPOModule(CausalLMModule):
    """Tunes a ``GPT`` by GRPO on prompts with answers (``datamodules.PromptDataModule``); generation, adapters,
    tokenizer and checkpoints are ``CausalLMModule``'s."""

    def __init__(
        self,
        net: GPT,
        rewards: list[Reward] | None = None,
        group_size: int = 8,
        temperature: float = 1.0,
        top_p: float | None = None,
        loss: GRPOLoss = GRPOLoss(),
        num_iterations: int = 1,
        minibatch_prompts: int | None = None,
        max_grad_norm: float | None = 1.0,
        reward_timeout: float | None = 5.0,
        reward_errors: OnError = "stop",
        val_samples: int = 4,
        async_actors: int = 0,
        async_slots: int | None = None,
        episodes: Episodes = Episodes(),  # noqa: B008 (frozen: a shared default never changes)
        **kwargs,
    ) -> None:
        """
        Args:
            net: the decoder (``zoo.gpt.GPT``), ids (B, T) -> logits (B, T, V).
            rewards: reward functions (``zoo.gpt.tune.rewards``: ExactMatch, FormatCheck, NumericTolerance, or a
                subclass of Reward of yours), summed with their weights; from your config only, never stored.
            group_size: G, completions sampled per prompt.
            temperature: the sampling temperature of the rollouts (and of the recomputed log-probabilities).
            top_p: nucleus sampling of the rollouts; None: the whole distribution.
            loss: the objective (``zoo.gpt.tune.losses.GRPOLoss``): loss_type, clip_low, clip_high, scale_std,
                beta (the KL to the starting weights), step_credit (process supervision), rho_bar (asynchronous
                rollouts' importance-weight bound).
            num_iterations: optimisation passes over each batch of rollouts (TRL's num_iterations, GRPO's mu).
            minibatch_prompts: prompts (each with its whole group) per optimizer step; None: the whole batch.
            max_grad_norm: clip the gradients' global norm to this; None: no clipping.
            reward_timeout: seconds a reward may take on one completion before the run stops; None: no limit.
            reward_errors: a reward that raises, hangs or returns a non-finite value: stop the run (one error line
                naming it and the completion), or "zero": score 0 from it, counted in train/reward_errors.
            val_samples: (prompt, completion, answer, reward) rows kept per validation for the sample table.
            async_actors: actor processes sampling the rollouts while the learner updates (CPU, a copy of the net
                each; the training prompts are handed to them at start, the data batches only pace the steps);
                0: the learner samples each step's rollouts itself (synchronous).
            async_slots: rollout batches the actors may run ahead; None: async_actors + 1.
            episodes: with a text environment's seeds as the data (``datamodules.EpisodeDataModule``), how long an
                episode runs (``zoo.gpt.tune.episodes.Episodes``: max_turns, max_tokens) and whether each turn is
                credited with its own and later rewards (turn_credit); max_new_tokens then bounds each turn.
            **kwargs: ``CausalLMModule``'s (optimizer, init_weights, adapt, compile, generation: its
                ``max_new_tokens`` is the completions' token budget T, of rollouts and greedy replies alike, and
                prompt + T must fit the net's block_size).
        """
        if group_size < 1 or num_iterations < 1 or async_actors < 0:
            raise InputError(
                "group_size and num_iterations are 1 or more, async_actors 0 or more: got "
                f"{group_size}, {num_iterations}, {async_actors}"
            )
        loss = GRPOLoss.of(loss)
        if loss.beta > 0:
            refuse_adapter_start(kwargs.get("adapter_weights"), "GRPO's KL")
        super().__init__(net, **kwargs)
        self.loss = loss
        for hparams in (self.hparams, getattr(self, "_hparams_initial", {})):  # code, not a setting: never stored
            hparams.pop("rewards", None)
        self.rewards = list(rewards or [])
        self.automatic_optimization = False  # several optimizer steps per batch of rollouts
        self._reference = Reference("grpo_reference")  # the start, used when beta > 0; a copy is no submodule
        self.completion_samples: list[dict] = []
        self.actors: AsyncRollouts | AsyncEpisodes | None = None  # the asynchronous rollouts' processes, in fit
        self._answers: list[str] = []
        self._env: tuple[EnvSource, EnvRows] | None = None  # the envs episodes are played in here, made once

    @property
    def max_new_tokens(self) -> int:
        """T, a completion's token budget: ``generation.max_new_tokens``, stated once for rollouts, validation's
        greedy replies and predict."""
        return Generation.of(self.hparams.generation).max_new_tokens

    def configure_model(self) -> None:
        if self.loss.beta > 0:
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
            rollout = sample_groups(self.net, prompts, h.group_size, self.max_new_tokens, h.temperature, h.top_p, stop)
            return rollout.trimmed()
        finally:
            self.net.train(training)

    def completion_rows(self, ids: Tensor, mask: Tensor | None = None) -> list[list[int]]:
        """The ids of each completion row (R, T), cut at its mask's end and without its stop token."""
        stop, out = set(self.tokenizer.stop_ids), []
        for r, row in enumerate(ids.tolist()):
            row = row[: int(mask[r].sum())] if mask is not None else row
            out.append(row[:-1] if row and row[-1] in stop else row)
        return out

    def completions(self, ids: Tensor, mask: Tensor | None = None) -> list[str]:
        """The text of each completion row (R, T), cut at its mask's end and without its stop token."""
        return [self.tokenizer.decode(row) for row in self.completion_rows(ids, mask)]

    def score_rows(self, texts: list[str], answers: list[str], pattern: str | None = None) -> Scores:
        """The scores of completions whose rows are grouped by prompt (row r answers prompt r // G): step rewards
        (``StepReward``) scored per step, the others per completion; answers read by the rule ``pattern`` (the
        data's ``answer_pattern``)."""
        if not self.rewards:
            raise InputError(
                "GRPO needs reward functions: give model.init_args.rewards in your config (for example "
                "[{class_path: zoo.gpt.tune.rewards.ExactMatch}]); a checkpoint never brings them"
            )
        h = self.hparams
        per_row = [a for a in answers for _ in range(len(texts) // len(answers))]
        stepwise = [r for r in self.rewards if isinstance(r, StepReward)]
        plain = [r for r in self.rewards if not isinstance(r, StepReward)]
        outcome, each, errors = score(plain, texts, per_row, h.reward_timeout, h.reward_errors, pattern)
        steps, step_means, step_errors = score_steps(
            stepwise, texts, per_row, h.reward_timeout, h.reward_errors, pattern
        )
        total = list(outcome)
        for reward in stepwise:
            total = [t + reward.weight * m for t, m in zip(total, step_means[reward.name])]
        metrics = {f"rewards/{name}/mean": sum(v) / len(v) for name, v in (each | step_means).items()}
        metrics["reward_errors"] = float(errors + step_errors)
        as_tensor = lambda x: torch.tensor(x, dtype=torch.float32, device=self.device)  # noqa: E731
        return Scores(as_tensor(outcome), as_tensor(total), steps, metrics, per_row)

    def step_scores(
        self, rollout: Rollout, scores: Scores, rows: list[list[int]] | None = None
    ) -> tuple[Tensor, Tensor] | None:
        """The step rewards' scores (R, T), each on the token that completes its step, and those tokens (R, T) bool:
        what process supervision's advantages are made of (``GRPOLoss.process``); None without a step reward.
        ``rows``: the completions' ids as scored (``completion_rows``), when the caller has them already."""
        if not any(isinstance(r, StepReward) for r in self.rewards):
            return None
        if rows is None:
            rows = self.completion_rows(rollout.completion_ids, rollout.completion_mask)
        values, mask = place_steps(rows, scores.steps, self.tokenizer.decode, rollout.completion_mask.shape[1])
        return values.to(self.device), mask.to(self.device)

    def update(
        self, rollout: Rollout, advantages: Tensor, group_size: int, is_weight: Tensor | None = None
    ) -> list[dict[str, Tensor]]:
        """``num_iterations`` passes of clipped-surrogate steps over minibatches of whole groups of ``group_size``
        rows, against ``rollout.logps`` as the old policy, with each row's (R,) or token's (R, T) ``advantages``,
        each token's loss weighted by ``is_weight`` (R, T) when given; each pass's mean metrics."""
        h, g = self.hparams, group_size
        opt, sch = self.optimizers(), self.lr_schedulers()
        ref = None
        if self.loss.beta > 0:
            with torch.no_grad(), self.reference() as net:
                ref = per_token_logps(net, rollout.ids, rollout.completion_mask, h.temperature, rollout.pad)
        rows_per_step = (h.minibatch_prompts or len(advantages) // g) * g
        passes = []
        for _ in range(h.num_iterations):
            sums = defaultdict(float)
            steps = list(range(0, len(advantages), rows_per_step))
            for start in steps:
                rows = slice(start, start + rows_per_step)
                weight = None if is_weight is None else is_weight[rows]
                out = self.policy_loss(rollout, advantages, rows, None if ref is None else ref[rows], weight)
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

    def policy_loss(
        self,
        rollout: Rollout,
        advantages: Tensor,
        rows: slice,
        ref_logp: Tensor | None,
        is_weight: Tensor | None = None,
    ) -> dict:
        """The GRPO objective (``GRPOLoss.objective``) on ``rows``, against the old policy's log-probabilities;
        ``advantages`` the whole rollout's, ``ref_logp`` and ``is_weight`` the rows' own."""
        h, mask = self.hparams, rollout.completion_mask[rows]
        logp, entropy = per_token_logps(self.net, rollout.ids[rows], mask, h.temperature, rollout.pad[rows], True)
        out = self.loss.objective(
            logp,
            rollout.logps[rows],
            advantages[rows],
            mask,
            ref_logp,
            is_weight,
            self.max_new_tokens,
        )
        return {**out, "entropy": masked_mean(entropy, mask)}

    def training_step(self, batch: dict, batch_idx: int) -> None:
        if "env_seeds" in batch:  # a text environment's seeds (datamodules.EpisodeDataModule): multi-turn episodes
            return self.episode_step(batch)
        start, pattern = time.perf_counter(), batch.get("answer_pattern")
        if self.hparams.async_actors:
            rollout, is_weight, answers, lag = self.behaviour_rollout(len(batch["prompt_ids"]))
        else:
            rollout, is_weight, answers, lag = self.rollout(batch["prompt_ids"]), None, batch["answers"], {}
        rows = self.completion_rows(rollout.completion_ids, rollout.completion_mask)  # cut once: texts and steps
        texts = [self.tokenizer.decode(row) for row in rows]
        scores = self.score_rows(texts, answers, pattern)
        rewards, per_row, g = scores.total, scores.per_row, self.hparams.group_size  # the loss side's one read of G
        advantages = self.loss.advantages(scores.outcome, g, self.step_scores(rollout, scores, rows))
        passes = self.update(rollout, advantages, g, is_weight)
        if self.actors is not None:
            self.actors.publish(self.net)
        if lightning_writes(self.trainer):
            grouped = rewards.view(-1, g)
            std = grouped.std(1).mean() if g > 1 else rewards.new_zeros(())
            sampled = rollout.completion_mask.sum()
            # the progress bar's line (callbacks.ProgressBar): reward, accuracy and sampled tokens per second
            self.log_dict(
                {
                    "train/reward": rewards.mean(),
                    "train/accuracy": sum(correct(t, a, pattern) for t, a in zip(texts, per_row)) / len(texts),
                    "train/tokens_per_s": sampled.float() / (time.perf_counter() - start),
                },
                prog_bar=True,
            )
            self.log_dict(
                {
                    "train/reward_std": std,
                    "train/completion_length": sampled.float() / len(texts),
                    **{f"train/{k}": v for k, v in scores.metrics.items()},
                    **{f"train/{k}": v for k, v in passes[-1].items()},
                    **{f"train/{k}": v for k, v in lag.items()},
                }
            )

    # -- asynchronous rollouts: actor processes, a truncated importance weight per token --------------------------

    def start_actors(self, prompts: list[Tensor], answers: list[str], prompts_per_slot: int, seed: int) -> None:
        """Starts ``async_actors`` processes sampling groups of ``prompts_per_slot`` of ``prompts`` (1-D ids);
        ``answers`` stay here, where the rewards score."""
        h = self.hparams
        stop = tuple(self.tokenizer.stop_ids) if self.tokenizer is not None else ()
        settings = (h.group_size, self.max_new_tokens, h.temperature, h.top_p, stop)
        sampling = Sampling([p.tolist() for p in prompts], prompts_per_slot, *settings)
        self.stop_actors()
        self._answers = list(answers)
        self.actors = AsyncRollouts(self.net, sampling, h.async_actors, h.async_slots or h.async_actors + 1, seed)

    def stop_actors(self) -> None:
        if self.actors is not None:
            self.actors.close()
            self.actors = None

    def behaviour_rollout(self, prompts_per_slot: int) -> tuple[Rollout, Tensor, list[str], dict[str, Tensor]]:
        """The actors' next rollout against the learner's current weights: the rollout with those weights'
        log-probabilities as its old policy, the per-token importance weights (R, T), the prompts' answers and the
        lag's metrics. The actors start at the first call, with the training loader's prompts."""
        if self.actors is None:
            if self.trainer.world_size > 1:  # every rank's actors would draw the same prompts
                raise InputError("async_actors > 0 runs on one process: train with one device, or async_actors=0")
            loader = self.trainer.train_dataloader  # the prompts as the loader's own collate gives them
            data = loader.collate_fn(list(loader.dataset))
            seed = int(torch.randint(2**31, ()))  # from the learner's seeded generator
            self.start_actors(data["prompt_ids"], data["answers"], prompts_per_slot, seed)
        behaviour = self.actors.take(self.device)
        rollout, is_weight, lag = self.importance_weights(behaviour, int(self.actors.version))
        answers = [self._answers[i] for i in behaviour.prompt_index.tolist()]
        return rollout, is_weight, answers, lag

    def importance_weights(self, behaviour: Behaviour, version: int) -> tuple[Rollout, Tensor, dict[str, Tensor]]:
        """``behaviour``'s rollout with the old policy pi_old = the learner's weights (``version``) and the truncated
        per-token weights min(loss.rho_bar, pi_old / mu); with no lag pi_old is the sampling pass (weights 1)."""
        r, staleness = behaviour.rollout, version - behaviour.version
        if staleness == 0:
            is_weight, truncated = torch.ones_like(r.logps), torch.zeros_like(r.logps, dtype=torch.bool)
        else:
            with torch.no_grad(), evaluating(self.net):  # as the sampling pass computes it: no dropout
                old = per_token_logps(self.net, r.ids, r.completion_mask, self.hparams.temperature, r.pad)
            is_weight, truncated = self.loss.importance_weights(old, r.logps, r.completion_mask)
            r = Rollout(r.ids, r.pad, r.completion_mask, old)
        lag = {
            "staleness": torch.tensor(float(staleness)),
            "importance_weight/mean": masked_mean(is_weight, r.completion_mask),
            "importance_weight/truncated": masked_mean(truncated.float(), r.completion_mask),
            "sampled_tokens": r.completion_mask.sum().float(),
        }
        return r, is_weight, lag

    def on_train_end(self) -> None:
        self.stop_actors()

    def teardown(self, stage: str) -> None:
        self.stop_actors()
        if self._env is not None:
            self._env[1].close()
            self._env = None
        super().teardown(stage)

    # -- validation: greedy replies to held-out prompts ----------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.completion_samples = []

    def scored_replies(self, batch: dict, prefix: str) -> None:
        prompts = batch["prompt_ids"]
        out = generate(self.net, prompts, self.max_new_tokens, 0.0, stop_ids=self.tokenizer.stop_ids)
        texts = [self.tokenizer.decode([t for t in o.tolist() if t not in self.tokenizer.stop_ids]) for o in out]
        pattern = batch.get("answer_pattern")
        hits = [correct(t, a, pattern) for t, a in zip(texts, batch["answers"])]
        logged = {f"{prefix}accuracy": torch.tensor(hits, dtype=torch.float32).mean()}
        rewards = None
        if self.rewards:
            rewards = self.score_rows(texts, batch["answers"], pattern).total
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
        if "env_seeds" in batch:
            return self.scored_episodes(batch, "val/")
        self.scored_replies(batch, "val/")

    def on_validation_epoch_end(self) -> None:
        for r in self.routers:
            r.reset_stats()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        if "task" in batch:  # task records (datamodules.TaskDataModule): CausalLMModule's metrics
            return super().test_step(batch, batch_idx)
        if "env_seeds" in batch:
            return self.scored_episodes(batch, "test/")
        self.scored_replies(batch, "test/")

    def on_test_epoch_end(self) -> None:
        tasks = self.tasks.compute("test/")
        if tasks:
            self.log_dict(tasks)

    # -- multi-turn episodes with a text environment (zoo.gpt.tune.episodes) -----------------------------------------

    def play_episodes(self, env: EnvSource, seeds: list[int], group_size: int, temperature: float) -> list[Episode]:
        """``group_size`` episodes of each seed, rows grouped by seed, the net in eval mode without gradients."""
        if self._env is None or self._env[0] != env:
            self._env = (env, EnvRows(env.make))  # one env per episode played together
        h = self.hparams
        settings = (Episodes.of(h.episodes), self.max_new_tokens, temperature, h.top_p, env.env_id)
        scaffold = scaffold_for(self.tokenizer, self._env[1].first)
        return play_groups(self.net, self._env[1], seeds, group_size, scaffold, *settings)

    def episode_step(self, batch: dict) -> None:
        """One GRPO step on episodes: each episode's return against its seed's group (or, with turn_credit, each
        turn's reward as a process-supervision step), the policy's tokens alone trained."""
        h, start = self.hparams, time.perf_counter()
        if h.async_actors:
            episodes, version = self.behaviour_episodes(batch)
            seeds = torch.tensor([e.seed for e in episodes[:: h.group_size]])
            behaviour = Behaviour(rollout_of(episodes, self.device), seeds, version)
            rollout, is_weight, lag = self.importance_weights(behaviour, int(self.actors.version))
        else:
            episodes = self.play_episodes(batch["env"], batch["env_seeds"], h.group_size, h.temperature)
            rollout, is_weight, lag = rollout_of(episodes, self.device), None, {}
        returns, g = torch.tensor([e.reward for e in episodes], device=self.device), h.group_size
        outcome, steps = returns, None
        if Episodes.of(h.episodes).turn_credit:
            values, mask = turn_steps(episodes, rollout.completion_mask.shape[1])
            steps = values.to(self.device), mask.to(self.device)
            outcome = torch.zeros_like(returns)  # every reward is a turn's: credited through the steps alone
        passes = self.update(rollout, self.loss.advantages(outcome, g, steps), g, is_weight)
        if self.actors is not None:
            self.actors.publish(self.net)
        if lightning_writes(self.trainer):
            m = episode_metrics(episodes)
            self.log_dict(
                {
                    "train/reward": m["reward"],
                    "train/success": m["success"],
                    "train/tokens_per_s": m["policy_tokens"] * len(episodes) / (time.perf_counter() - start),
                },
                prog_bar=True,
            )
            grouped = returns.view(-1, h.group_size)
            std = grouped.std(1).mean() if h.group_size > 1 else returns.new_zeros(())
            self.log_dict(
                {
                    "train/reward_std": std,
                    **{f"train/{k}": v for k, v in m.items() if k not in ("reward", "success")},
                    **{f"train/{k}": v for k, v in passes[-1].items()},
                    **{f"train/{k}": v for k, v in lag.items()},
                }
            )

    def behaviour_episodes(self, batch: dict) -> tuple[list[Episode], int]:
        """The actors' next episodes and the version of the weights that played them. The actors start at the
        first call, with the training loader's seeds and the batch's env."""
        if self.actors is None:
            if self.trainer.world_size > 1:  # every rank's actors would draw the same seeds
                raise InputError("async_actors > 0 runs on one process: train with one device, or async_actors=0")
            h, env = self.hparams, batch["env"]
            settings = Episodes.of(h.episodes)
            sampling = EpisodeSampling(
                list(self.trainer.train_dataloader.dataset),
                len(batch["env_seeds"]),
                h.group_size,
                env,
                env.spec(),
                self.tokenizer,
                settings,
                settings.bound(self.net),
                self.max_new_tokens,
                h.temperature,
                h.top_p,
            )
            seed = int(torch.randint(2**31, ()))  # from the learner's seeded generator
            slots = h.async_slots or h.async_actors + 1
            self.actors = AsyncEpisodes(self.net, sampling, h.async_actors, slots, seed)
        return self.actors.take()

    def scored_episodes(self, batch: dict, prefix: str) -> None:
        """One greedy episode of each held-out seed: success (also logged as ``accuracy``, GRPO's monitored
        metric), return, turns, tool calls and length; a few kept as rows of the sample table."""
        episodes = self.play_episodes(batch["env"], batch["env_seeds"], 1, 0.0)
        m = episode_metrics(episodes)
        logged = {f"{prefix}{k}": torch.tensor(m[k]) for k in ("success", "reward", "turns", "tool_calls")}
        logged[f"{prefix}accuracy"] = logged[f"{prefix}success"]
        logged[f"{prefix}episode_length"] = torch.tensor(m["episode_length"])
        self.log_dict(logged, batch_size=len(episodes), sync_dist=True)
        room = self.hparams.val_samples - len(self.completion_samples)
        self.completion_samples += [sample_row(e) for e in episodes[: max(0, room)]]

    # -- checkpoints -------------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        self._reference.save(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._reference.check(checkpoint, "GRPO")
