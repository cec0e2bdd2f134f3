"""Several processes, one agent: what the ranks of a DDP run share, and how each collects its own data.

Under DDP every rank runs the whole agent: its own envs, its own collector, the same nets (DDP averages the
gradients of every backward). For N processes to collect N times the data rather than N copies of it:
  - rank r's training envs reset with seeds offset by r x E (E: the envs of one rank), the seeds one process
    with N x E envs would give, and its action-sampling RNG is forked from rank 0's (``fork_rng``);
  - env-step counters, the budget and the running statistics are global: each rank adds what it collected, the
    sums go through a collective (``sum_over_ranks``), so every rank holds the same numbers and takes the same
    decisions (stop, learn or not, how many minibatches);
  - evaluation episodes are split over the ranks (``evaluation_share``) exactly as one process would spread
    them over its envs, and gathered back (``gather_over_ranks``).

Every function that communicates is a collective once a process group of more than one process exists: every
rank must call it, in the same order, or the ranks wait on each other forever. On one process they cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor


def rank_and_world() -> tuple[int, int]:
    """(this process's global rank, number of processes); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def sum_over_ranks(x: Tensor) -> Tensor:
    """``x`` summed over the ranks, in place (a collective); ``x`` itself on one process."""
    if rank_and_world()[1] > 1:
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def gather_over_ranks(x: Tensor, counts: list[int]) -> Tensor:
    """The ranks' 1-D ``x`` concatenated in rank order (a collective); rank r holds ``counts[r]`` items."""
    world = rank_and_world()[1]
    if world == 1:
        return x
    padded = x.new_zeros(max(counts))
    padded[: len(x)] = x
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)  # gloo and NCCL gather equal shapes only: pad, then cut
    return torch.cat([p[:c] for p, c in zip(parts, counts)])


def fork_rng(rank: int) -> None:
    """Rank r > 0 continues torch's and NumPy's global RNGs from a seed drawn from (their state, r); rank 0
    keeps its state, so one process runs exactly as before. Ranks start from one seed (``seed_everything``),
    and without this they would sample the same action noise and the same warm-up actions."""
    if rank == 0:
        return
    draw = int(torch.randint(2**62, (1,)))
    torch.manual_seed(int(np.random.SeedSequence([draw, rank]).generate_state(1)[0]))
    np.random.seed(np.random.SeedSequence([draw, rank, 1]).generate_state(1)[0])


@dataclass(frozen=True)
class Share:
    """One rank's part of an evaluation: envs [first_env, first_env + num_envs), ``num_episodes`` episodes."""

    first_env: int
    num_envs: int
    num_episodes: int


def evaluation_share(episodes: int, envs: int, world: int) -> list[Share]:
    """Every rank's share of ``episodes`` spread over ``envs`` evaluation envs, rank order.

    One process gives env i the quota (episodes + i) // envs (``Evaluator``); the ranks take contiguous blocks of
    those envs and their quotas, so together they play the episodes one process would, from the same start
    states, in the same order (env, then episode). A rank beyond the number of envs plays none.
    """
    envs = min(envs, episodes)
    shares, first = [], 0
    for r in range(world):
        n = envs // world + (r < envs % world)
        quota = sum((episodes + i) // envs for i in range(first, first + n))
        shares.append(Share(first, n, quota))
        first += n
    return shares
