"""Asynchronous GRPO rollouts, as IMPALA collects (Espeholt et al. 2018): actor processes sample completions with
a copy of the net a few updates old while the learner updates, through ``zoo.train.actor_pool``.

Design: the prompts reach the actors once, at start. The learner hands the pool its training prompts (a list
of 1-D id tensors; the answers stay with the learner, as do the rewards, which are the user's code); each
actor walks its own shuffled passes over them (actor r shuffles from ``actor_seed(seed, r)``), and each slot
holds one batch: B prompt *indices*, their G completions each sampled by ``sample_groups`` with the actor's
weights, the per-token log-probabilities of that sampling pass (the behaviour policy mu's), and the version of
the weights they came from. The learner's data batches then only pace its steps. Requests written by the
learner into each slot would follow the data loader's order, but leave the actors idle unless the learner
runs a batch behind; the prompt list keeps the pool IMPALA's (free slots refill on their own).

A slot's ids are left-padded to the longest prompt of the whole list so that every slot has one shape; the
extra padding is cut again in ``take`` (the GPT's ``pad`` masks padding and shifts positions, so it changes
nothing). The learner corrects the staleness per token (``zoo.train.policy_gradient.truncated_importance_weights``).

Notation: K slots, B prompts per slot, G completions per prompt, R = B * G rows, P longest prompt of the list,
T = max_new_tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from zoo.gpt.gpt import GPT
from zoo.gpt.tune.rollout import Rollout, sample_groups
from zoo.train import actor_pool


@dataclass(frozen=True)
class Sampling:
    """What an actor samples with, picklable: the prompts, B per slot, and ``sample_groups``' settings."""

    prompts: list[list[int]]
    prompts_per_slot: int
    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float | None
    stop_ids: tuple[int, ...]

    @property
    def longest(self) -> int:
        return max(map(len, self.prompts))

    def slot_spec(self) -> actor_pool.SlotSpec:
        b, r, t = self.prompts_per_slot, self.prompts_per_slot * self.group_size, self.max_new_tokens
        return {
            "prompt_index": ((b,), torch.int64),
            "ids": ((r, self.longest + t), torch.int64),
            "pad": ((r,), torch.int64),
            "completion_mask": ((r, t), torch.int64),
            "logps": ((r, t), torch.float32),
            "meta": ((3,), torch.int64),  # actor, that actor's slot count, version of the weights it sampled with
        }


class RolloutActor:
    """One actor's state in its process: a copy of the net (eval mode) and its place in the prompt order."""

    def __init__(self, rank: int, net: nn.Module, sampling: Sampling, slots: dict[str, Tensor]) -> None:
        self.rank, self.sampling, self.slots = rank, sampling, slots
        self.net = copy.deepcopy(net).eval()  # local memory: sampling never reads weights the learner is writing
        self.version, self.filled = -1, 0
        self.order: list[int] = []

    def draw(self) -> list[int]:
        """The next B prompt indices of this actor's shuffled passes over the list."""
        out = []
        while len(out) < self.sampling.prompts_per_slot:
            if not self.order:
                self.order = torch.randperm(len(self.sampling.prompts)).tolist()
            out.append(self.order.pop())
        return out

    @torch.no_grad()
    def fill(self, k: int) -> None:
        s, index = self.sampling, self.draw()
        prompts = [torch.tensor(s.prompts[i]) for i in index]
        r = sample_groups(self.net, prompts, s.group_size, s.max_new_tokens, s.temperature, s.top_p, s.stop_ids)
        extra = s.longest + s.max_new_tokens - r.ids.shape[1]  # left padding up to the list's longest prompt
        slot = self.slots
        slot["prompt_index"][k] = torch.tensor(index)
        slot["ids"][k, :, :extra] = 0
        slot["ids"][k, :, extra:] = r.ids
        slot["pad"][k] = r.pad + extra
        slot["completion_mask"][k] = r.completion_mask
        slot["logps"][k] = r.logps
        slot["meta"][k] = torch.tensor([self.rank, self.filled, self.version])
        self.filled += 1

    def close(self) -> None:
        pass


def make_actor(sampling: Sampling, slots: dict[str, Tensor], rank: int, shared: nn.Module) -> RolloutActor:
    return RolloutActor(rank, shared, sampling, slots)


@dataclass
class Behaviour:
    """One slot's rollout, copied out: the completions, their prompts and the weights' version that sampled them."""

    rollout: Rollout  # logps: the behaviour policy's, mu(y_t | x, y_<t)
    prompt_index: Tensor  # (B,)
    version: int


class AsyncRollouts(actor_pool.ActorPool):
    """``num_actors`` processes sampling GRPO rollouts into ``num_slots`` slots; the learner ``take``s one slot per
    step and ``publish``es its weights after each update."""

    def __init__(
        self, net: GPT, sampling: Sampling, num_actors: int, num_slots: int, seed: int, start_method="forkserver"
    ) -> None:
        self.slots = actor_pool.shared_slots(sampling.slot_spec(), num_slots)
        build = partial(make_actor, sampling, self.slots)
        super().__init__(build, net, num_actors, num_slots, seed, [__name__], "GRPO rollout actor", start_method)

    def take(self, device: torch.device | str = "cpu") -> Behaviour:
        """The next full slot, copied out to ``device`` with the padding all rows share cut (the prompts' left and
        the completions' right, ``Rollout.trimmed``); its slot goes back."""
        self.check()
        k = self.get()
        s = {name: field[k].clone() for name, field in self.slots.items()}
        self.release(k)
        cut = int(s["pad"].min())
        fields = (s["ids"][:, cut:], s["pad"] - cut, s["completion_mask"], s["logps"])
        rollout = Rollout(*(x.to(device) for x in fields)).trimmed()
        return Behaviour(rollout, s["prompt_index"], int(s["meta"][2]))
