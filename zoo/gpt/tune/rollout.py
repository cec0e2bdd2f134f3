"""Rollouts for a policy gradient on the GPT: G sampled completions per prompt, their masks and log-probabilities.

GRPO (Shao et al. 2024) samples a group of G completions per prompt and scores each against its group
(``zoo.train.policy_gradient.group_advantages``). The prompts are repeated G times, consecutively, and decoded in
one batch with ``generate``'s KV-cache loop, which also keeps each sampled token's log-probability under the
distribution drawn from (after temperature and top-p): the "old" policy of the importance ratio, as TRL's
``old_per_token_logps`` (TRL computes those at the temperature too). ``per_token_logps`` recomputes them with one
forward pass, with gradients, for the update.

Notation: B prompts, G completions per prompt, R = B * G rows, P longest prompt, T = max_new_tokens, V vocabulary.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.generate import decode
from zoo.gpt.gpt import GPT


@dataclass
class Rollout:
    """G completions of each prompt, rows grouped by prompt (row r is prompt r // G).

    ``ids`` (R, P + T): the left-padded prompt then the completion, 0 after its end; ``pad`` (R,) each row's
    padding; ``completion_mask`` (R, T): 1 on the completion's tokens up to and including its stop token;
    ``logps`` (R, T): each completion token's log-probability when it was sampled, 0 on padding.
    """

    ids: Tensor
    pad: Tensor
    completion_mask: Tensor
    logps: Tensor

    @property
    def completion_ids(self) -> Tensor:
        """The completions (R, T), 0 after each one's end."""
        return self.ids[:, -self.completion_mask.shape[1] :]

    def trimmed(self) -> Rollout:
        """The same rollout without the completion columns past the longest completion: padding in every row, which
        the update's forward and backward passes would run over (TRL's completions end at the batch's longest too).
        """
        width = max(int(self.completion_mask.sum(1).max()), 1)  # each mask is one run from column 0
        cut = self.completion_mask.shape[1] - width
        if cut == 0:
            return self
        return Rollout(self.ids[:, :-cut], self.pad, self.completion_mask[:, :width], self.logps[:, :width])


@torch.no_grad()
def sample_groups(
    net: GPT,
    prompt_ids: list[Tensor],
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float | None = None,
    stop_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
) -> Rollout:
    """``group_size`` completions of up to ``max_new_tokens`` for each 1-D prompt, sampled in one batch.

    A completion ends at its first stop id (kept: the policy learns to stop) or at the token budget. The prompt
    and budget must fit the net's block_size, since the update's forward pass cannot slide the context.
    """
    if temperature <= 0 or group_size < 1:
        raise InputError(
            f"rollouts sample (temperature > 0) groups of one or more: got temperature={temperature}, "
            f"group_size={group_size}"
        )
    rows = [p for p in prompt_ids for _ in range(group_size)]  # (R,) each prompt G times, consecutively
    out = decode(net, rows, max_new_tokens, temperature, None, top_p, stop_ids, True, generator, "error", logps=True)
    slot = torch.arange(max_new_tokens, device=out.tokens.device)  # (T,)
    mask = slot <= (out.ended - out.longest)[:, None]  # (R, T) through the stop token
    ids = out.tokens.clone()  # out of inference mode, so that the update's forward may read it
    ids[:, out.longest :].masked_fill_(~mask, 0)
    return Rollout(ids, out.pad.clone(), mask.long(), out.logps.clone().masked_fill_(~mask, 0.0))


def per_token_logps(
    net: GPT,
    ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    pad: Tensor | None = None,
    entropy: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probabilities (R, T) of the completions, the last T columns of ``ids`` (R, P + T), at ``temperature``,
    0 on padding: one forward pass (with gradients where enabled). ``pad`` (R,) is the prompts' left padding.
    ``entropy``: also each position's entropy (R, T) of that distribution, without gradient (TRL's logged one).

    Top-p is not applied, as in TRL: a token outside the nucleus would have log-probability -inf.
    """
    t = completion_mask.shape[1]
    logits = net(ids[:, :-1], None, 0, pad)[:, -t:]  # (R, T, V): position i predicts token i + 1
    all_logps = (logits.float() / temperature).log_softmax(-1)  # (R, T, V)
    logps = all_logps.gather(-1, ids[:, -t:, None]).squeeze(-1) * completion_mask  # (R, T)
    if not entropy:
        return logps
    with torch.no_grad():
        return logps, -(all_logps.exp() * all_logps).sum(-1) * completion_mask  # (R, T)


def place_steps(
    rows: list[list[int]], steps: list[list[tuple[int, float]]], decode_ids, length: int
) -> tuple[Tensor, Tensor]:
    """Step scores (R, T) at the token that completes each step, and a mask (R, T) of those tokens.

    ``rows`` are the completions' ids as scored (without the stop token), ``steps`` each one's (end, score) pairs,
    ``end`` a character offset of ``decode_ids(row)``. A step's token is the first whose prefix decodes to ``end``
    characters or more (a binary search on prefix lengths, so a BPE token spanning a step's end completes it).
    """
    scores, mask = torch.zeros(len(rows), length), torch.zeros(len(rows), length, dtype=torch.bool)
    for r, (ids, mine) in enumerate(zip(rows, steps)):
        chars = functools.cache(lambda k, ids=ids: len(decode_ids(ids[: k + 1])))  # characters of k + 1 tokens
        for end, value in mine:
            k = min(bisect.bisect_left(range(len(ids)), end, key=chars), len(ids) - 1)
            scores[r, k] += value
            mask[r, k] = True
    return scores, mask
