"""Multi-turn episodes sampled by actor processes (``zoo.train.actor_pool``) while the learner updates, as
``zoo.gpt.tune.async_rollout`` samples single-turn completions: IMPALA's split, where an env step that waits (a
tool's latency) keeps an actor, not the learner, waiting.

The seeds and the env (its registered ``EnvSpec``, picklable, so an actor makes its own env without importing
anything a config names) reach the actors once, at start; each actor walks its own shuffled passes over the
seeds, and each slot holds B seeds' G episodes played with the actor's weights (``zoo.gpt.tune.episodes.play``):
their sequences, which tokens the policy sampled, the sampling log-probabilities (the behaviour policy mu's),
each turn's end and reward, tool calls, success, and the weights' version. The learner copies a slot out as
``Episode`` objects, the synchronous path's own, so one update serves both, and corrects the staleness per token
(``GRPOModule.importance_weights``).

Notation: K slots, B seeds per slot, G episodes per seed, R = B * G rows, L = the episode bound, M = max_turns.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from zoo.gpt.gpt import GPT
from zoo.gpt.tune.episodes import EnvRows, EnvSource, Episode, Episodes, play_groups, scaffold_for
from zoo.train import actor_pool


@dataclass(frozen=True)
class EpisodeSampling:
    """What an actor plays with, picklable: the seeds, B per slot, the env, and ``play``'s settings."""

    seeds: list[int]
    seeds_per_slot: int
    group_size: int
    env: EnvSource
    spec: Any  # gymnasium's EnvSpec of env.env_id, resolved by the learner
    tokenizer: Any
    episodes: Episodes
    bound: int  # L: tokens of an episode at most
    max_new_tokens: int
    temperature: float
    top_p: float | None

    def slot_spec(self) -> actor_pool.SlotSpec:
        r, length, m = self.seeds_per_slot * self.group_size, self.bound, self.episodes.max_turns
        return {
            "seed": ((r,), torch.int64),
            "ids": ((r, length), torch.int64),
            "policy": ((r, length), torch.bool),
            "logps": ((r, length), torch.float32),
            "length": ((r,), torch.int64),
            "turn_ends": ((r, m), torch.int64),
            "turn_rewards": ((r, m), torch.float32),
            "turns": ((r,), torch.int64),
            "tool_calls": ((r,), torch.int64),
            "success": ((r,), torch.bool),
            "meta": ((3,), torch.int64),  # actor, that actor's slot count, version of the weights it played with
        }


def write_row(slot: dict[str, Tensor], k: int, r: int, e: Episode) -> None:
    """Episode ``e`` into row ``r`` of slot ``k``."""
    n, t = len(e.ids), e.turns
    slot["seed"][k, r] = e.seed
    slot["ids"][k, r, :n] = torch.tensor(e.ids)
    slot["ids"][k, r, n:] = 0
    slot["policy"][k, r, :n] = torch.tensor(e.policy)
    slot["policy"][k, r, n:] = False
    slot["logps"][k, r, :n] = torch.tensor(e.logps)
    slot["logps"][k, r, n:] = 0.0
    slot["length"][k, r], slot["turns"][k, r] = n, t
    slot["turn_ends"][k, r, :t] = torch.tensor(e.turn_ends)
    slot["turn_rewards"][k, r, :t] = torch.tensor(e.turn_rewards)
    slot["tool_calls"][k, r], slot["success"][k, r] = e.tool_calls, e.success


def read_row(s: dict[str, Tensor], r: int) -> Episode:
    """Row ``r`` of a slot copied out (``s``: its fields) as an ``Episode`` (no messages: the text stays with the
    actor)."""
    n, t = int(s["length"][r]), int(s["turns"][r])
    return Episode(
        int(s["seed"][r]),
        s["ids"][r, :n].tolist(),
        s["policy"][r, :n].tolist(),
        s["logps"][r, :n].tolist(),
        s["turn_ends"][r, :t].tolist(),
        s["turn_rewards"][r, :t].tolist(),
        int(s["tool_calls"][r]),
        bool(s["success"][r]),
        "actor",
    )


class EpisodeActor:
    """One actor's state in its process: a copy of the net (eval mode), its env and its place in the seed order."""

    def __init__(self, rank: int, net: nn.Module, sampling: EpisodeSampling, slots: dict[str, Tensor]) -> None:
        self.rank, self.sampling, self.slots = rank, sampling, slots
        self.net = copy.deepcopy(net).eval()  # local memory: sampling never reads weights the learner is writing
        self.version, self.filled = -1, 0
        self.env = EnvRows(partial(sampling.env.make, sampling.spec))  # one env per episode played together
        self.scaffold = scaffold_for(sampling.tokenizer, self.env.first)
        self.order: list[int] = []

    def draw(self) -> list[int]:
        """The next B seeds of this actor's shuffled passes over the list."""
        out = []
        while len(out) < self.sampling.seeds_per_slot:
            if not self.order:
                self.order = torch.randperm(len(self.sampling.seeds)).tolist()
            out.append(self.sampling.seeds[self.order.pop()])
        return out

    @torch.no_grad()
    def fill(self, k: int) -> None:
        s = self.sampling
        args = (s.episodes, s.max_new_tokens, s.temperature, s.top_p, s.env.env_id)
        episodes = play_groups(self.net, self.env, self.draw(), s.group_size, self.scaffold, *args)
        for r, e in enumerate(episodes):
            write_row(self.slots, k, r, e)
        self.slots["meta"][k] = torch.tensor([self.rank, self.filled, self.version])
        self.filled += 1

    def close(self) -> None:
        self.env.close()


def make_actor(sampling: EpisodeSampling, slots: dict[str, Tensor], rank: int, shared: nn.Module) -> EpisodeActor:
    return EpisodeActor(rank, shared, sampling, slots)


class AsyncEpisodes(actor_pool.ActorPool):
    """``num_actors`` processes playing episodes into ``num_slots`` slots; the learner ``take``s one slot per step
    and ``publish``es its weights after each update."""

    def __init__(
        self, net: GPT, sampling: EpisodeSampling, num_actors: int, num_slots: int, seed: int, start_method="forkserver"
    ) -> None:
        self.slots = actor_pool.shared_slots(sampling.slot_spec(), num_slots)
        build = partial(make_actor, sampling, self.slots)
        super().__init__(build, net, num_actors, num_slots, seed, [__name__], "GRPO episode actor", start_method)

    def take(self) -> tuple[list[Episode], int]:
        """The next full slot's episodes, rows grouped by seed, and the version of the weights that played them;
        its slot goes back."""
        self.check()
        k = self.get()
        s = {name: field[k].clone() for name, field in self.slots.items()}
        self.release(k)
        return [read_row(s, r) for r in range(len(s["seed"]))], int(s["meta"][2])
