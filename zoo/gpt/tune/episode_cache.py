"""The KV caches of R episodes played together: one row each of the serving engine's slot caches
(``zoo.gpt.serve.engine.SlotCache``, in each attention's own layout: MHA/GQA keys and values, MLA's latent and RoPE
key), so one forward advances every episode still sampling its turn.

An episode's tokens sit in consecutive slots of its row, position p at slot pad + p, and the GPT's ``pad`` argument
gives each row its positions and hides the slots before its own (``generate``'s left padding: sliding windows and
mixtures of experts as they are alone). Two calls:

  feed:  at a turn's start every episode still running takes what it has not been fed (its last sampled token and
         the scaffolding; the first prompt) in one forward: its row is moved so that its sequence ends at one common
         slot s, and a block of the last P slots before s (P the most any row has to take) is fed for every row, a
         row that has less to take recomputing its last cached tokens (the same keys at the same positions) or
         padding where it is shorter than P.
  step:  each row still sampling its turn takes its newest token at slot s, in one forward of those rows alone.

Rows whose turn has ended, and finished episodes, are swapped out of rows 0..n-1, so a forward reads the n rows it
advances and no other; an episode's state (``pad``, ``fed``) follows it, not its row. Where s reaches the last slot,
the rows sampling move left by the smallest padding among them, as the engine's do.

Notation: R rows (episodes), N slots (the episode bound), n rows a forward advances, s the slot the next step writes,
P the block a feed writes, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.generate import cache_placement
from zoo.gpt.gpt import GPT
from zoo.gpt.serve.engine import SlotCache


class EpisodeCache:
    """R episodes' caches of N slots each (``bound`` tokens an episode at most)."""

    def __init__(self, net: GPT, episodes: int, bound: int) -> None:
        if hasattr(net.rope_scaling, "long_after") and bound > net.rope_scaling.long_after():
            raise InputError(
                f"episodes of a LongRoPE net (Phi-3's long contexts) are played together only within its original "
                f"context: give episodes.max_tokens at most {net.rope_scaling.long_after()} (got {bound})"
            )
        self.net, self.slots = net, bound
        self.device, dtype = cache_placement(net)
        self.layers = [SlotCache(episodes, bound, b.attn.cache_layout(), self.device, dtype) for b in net.blocks]
        self.who = list(range(episodes))  # who[i]: the episode in row i
        self.row = list(range(episodes))  # row[e]: episode e's row
        self.pad = [0] * episodes  # by episode: the slot of its position 0
        self.fed = [0] * episodes  # by episode: its tokens in the cache
        self.s = 0

    def swap(self, i: int, j: int) -> None:
        """Rows i and j trade places, their episodes with them."""
        if i == j:
            return
        end = max(self.pad[e] + self.fed[e] for e in (self.who[i], self.who[j]))
        for c in self.layers:
            for buf in c.buffers():
                held = buf[i, :, :end].clone()
                buf[i, :, :end] = buf[j, :, :end]
                buf[j, :, :end] = held
        self.who[i], self.who[j] = self.who[j], self.who[i]
        self.row[self.who[i]], self.row[self.who[j]] = i, j

    def gather(self, episodes: Sequence[int]) -> None:
        """``episodes`` into rows 0..n-1 (in any order), the others after them."""
        wanted, n = set(episodes), len(episodes)
        outside = [e for e in episodes if self.row[e] >= n]
        free = [i for i in range(n) if self.who[i] not in wanted]
        for e, i in zip(outside, free):
            self.swap(i, self.row[e])

    def feed(self, episodes: Sequence[int], sequences: Sequence[Sequence[int]]) -> Tensor:
        """``episodes`` (each with its whole sequence so far, longer than its cached part) brought to the end of their
        sequences in one forward: their last logits (n, V) in ``self.who[:n]``'s order; they end at slot s."""
        self.gather(episodes)
        n = len(episodes)
        seq = {e: sequences[k] for k, e in enumerate(episodes)}
        s = max(len(x) for x in seq.values())
        p = max(len(x) - self.fed[e] for e, x in seq.items())
        block = torch.zeros(n, p, dtype=torch.long)  # (n, P)
        for i in range(n):
            e = self.who[i]
            m = len(seq[e])
            keep, pad = max(0, m - p), s - m  # the cached positions before the block; the row's new padding
            if keep and pad != self.pad[e]:
                for c in self.layers:
                    for buf in c.buffers():
                        buf[i, :, pad : pad + keep] = buf[i, :, self.pad[e] : self.pad[e] + keep].clone()
            self.pad[e], self.fed[e] = pad, m
            tail = seq[e][max(0, m - p) :]
            block[i, p - len(tail) :] = torch.tensor(tail)
        self.s = s
        return self._forward(n, block.to(self.device), s - p)

    def step(self, tokens: Sequence[int]) -> Tensor:
        """Rows 0..n-1 (n = len(tokens)) take one token each at slot s: their next logits (n, V)."""
        n = len(tokens)
        if self.s == self.slots:  # no slot left: the rows move left by their smallest padding (some row has one)
            shift = min(self.pad[self.who[i]] for i in range(n))
            for c in self.layers:
                c.move(n, shift, self.s, -shift)
            for i in range(n):
                self.pad[self.who[i]] -= shift
            self.s -= shift
        for i in range(n):
            self.fed[self.who[i]] += 1
        x = torch.tensor(tokens, device=self.device)[:, None]  # (n, 1)
        self.s += 1
        return self._forward(n, x, self.s - 1)

    def _forward(self, n: int, x: Tensor, start: int) -> Tensor:
        pads = [self.pad[self.who[i]] for i in range(n)]
        pad = torch.tensor(pads, device=self.device) if any(pads) else None  # none: generate's own unmasked call
        return self.net(x, [c.view(0, n, 0) for c in self.layers], start, pad)[:, -1]  # (n, V)
