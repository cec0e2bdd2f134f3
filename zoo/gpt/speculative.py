"""Speculative decoding: a cheap draft proposes k tokens, the target scores all of them in one cached forward.

References:
  Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding" (algorithm 1).
  Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling" (algorithm 2).

One round, after the committed tokens x[:pos]:
  1. the draft proposes d_1..d_k, each sampled from its filtered distribution q_i (greedy: its argmax);
  2. the target reads x[pos-1], d_1..d_k in one forward, giving p_1..p_{k+1} (the same filter as q);
  3. d_i is accepted while u_i < p_i(d_i) / q_i(d_i), u_i ~ U[0, 1) (greedy: while d_i is p_i's argmax);
  4. after a accepted tokens one more is drawn: from normalise(max(0, p_{a+1} - q_{a+1})) on a rejection, from
     p_{k+1} when all k were accepted (greedy: p_{a+1}'s argmax either way);
  5. both caches roll back to the committed length (their slots are positions, so it is rewinding the write
     position; ``LayerCache.truncate`` also zeroes the dropped slots, so the rollback can be tested).
Every emitted token is then distributed as the target's filtered distribution (Leviathan et al., appendix A.1):
sampled output follows the target, greedy output is the target's greedy output, token for token.

Rows of a batch (left-padded, as in ``generate.py``) share one write position, so a round commits the same number
of tokens a + 1 in every row still running, a the least accepted. A row that accepted more emits its own accepted
d_{a+1} as its (a+1)-th token. This stays exact: given a row's tokens so far, d_{a+1} accepted is distributed as
p_{a+1} (that is what step 3 and 4 guarantee position by position), and where the round stops depends only on
other rows' independent draws, so whether the row's next token comes from this round or from the next (which
draws it from p_{a+1} afresh) does not change its distribution.

Past ``block_size`` the target slides its window as ``generate`` does (one plain step per token); near it, where
k + 1 more slots do not fit, a round proposes fewer tokens, down to none (a plain cached step).

Drafts are objects with ``start``/``room``/``propose``/``rollback`` (``Draft``); ``GPTDraft`` is a smaller zoo GPT
with its own cache. A draft that says ``needs_hidden`` is handed the target's last hidden states (after the final
norm) at the committed positions: ``MTPDraft``, the target's own multi-token-prediction module drafting
(self-speculation).

Notation: B prompts, N slots, k draft tokens per round, V vocabulary, D target width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.generate import (
    LayerCache,
    cache_placement,
    checked_request,
    evaluating,
    left_padded,
    make_cache,
    probabilities,
    window_pad,
)
from zoo.gpt.gpt import GPT


@dataclass(frozen=True)
class Verified:
    """What a round leaves for the draft: ``tokens[:, :length]`` are committed. ``hidden`` (B, length - 1 - start,
    D): the target's states after its final norm (what its head reads) at slots start..length-2 (the committed
    slots it read this round), given to a draft whose ``needs_hidden`` is true, else None."""

    tokens: Tensor
    length: int
    start: int = 0
    hidden: Tensor | None = None


class Draft(Protocol):
    """What ``speculative_generate`` asks of a draft."""

    needs_hidden: bool

    def start(self, tokens: Tensor, pad: Tensor) -> None:
        """A new request: ``tokens`` (B, N) will hold the prompts (left-padded by ``pad``) and what is committed."""

    def room(self, pos: int) -> int:
        """How many tokens it can propose after ``tokens[:, :pos]``."""

    def propose(self, tokens: Tensor, pos: int, k: int, pick: Picker) -> tuple[Tensor, Tensor | None]:
        """``k`` tokens (B, k) after ``tokens[:, :pos]``, chosen by ``pick``, and the distributions q (B, k, V)
        they were drawn from (None when greedy)."""

    def rollback(self, verified: Verified) -> None:
        """Forget what it proposed past the committed ``verified.length`` tokens."""


class Picker:
    """Greedy (temperature 0) or sampling from the filtered distribution: the same rule for draft and target."""

    def __init__(self, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None):
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def probs(self, logits: Tensor) -> Tensor:
        return probabilities(logits, self.temperature, self.top_k, self.top_p)  # (..., V)

    def __call__(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        """Ids (B,) from logits (B, V), and the distribution (B, V) they were drawn from (None when greedy)."""
        if self.greedy:
            return logits.argmax(dim=-1), None
        q = self.probs(logits)
        return torch.multinomial(q, 1, generator=self.generator).squeeze(-1), q

    def draw(self, probs: Tensor) -> Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)  # (B,)


def rollback(cache: list[LayerCache], length: int, end: int | None = None) -> None:
    """Every layer's cache back to its first ``length`` slots (the committed tokens'); slots up to ``end`` cleared."""
    for layer in cache:
        layer.truncate(length, end)


class GPTDraft:
    """A smaller zoo ``GPT`` with the target's vocabulary, decoding its proposals with its own cache."""

    needs_hidden = False

    def __init__(self, net: GPT) -> None:
        self.net = net
        self.filled = 0  # slots its cache holds for committed tokens

    def start(self, tokens: Tensor, pad: Tensor) -> None:
        self.pad, self.filled = pad, 0
        self.cache = make_cache(self.net, tokens.shape[0], min(tokens.shape[1], self.net.block_size))

    def room(self, pos: int) -> int:
        return self.net.block_size + 1 - pos  # it reads up to slot pos + k - 2

    def propose(self, tokens: Tensor, pos: int, k: int, pick: Picker) -> tuple[Tensor, Tensor | None]:
        ids, out, qs = tokens[:, self.filled : pos], [], []  # what it has not read yet: 1 token, 2 after a full accept
        for _ in range(k):
            logits = self.net(ids, self.cache, self.filled, window_pad(self.pad, 0))[:, -1]  # (B, V)
            self.filled += ids.shape[1]
            nxt, q = pick(logits)
            out.append(nxt)
            qs.append(q)
            ids = nxt[:, None]
        return torch.stack(out, 1), None if pick.greedy else torch.stack(qs, 1)  # (B, k), (B, k, V)

    def rollback(self, verified: Verified) -> None:
        # Its slots hold x[pos-1], d_1..d_{k-1}: those of committed tokens are kept, the last committed one (never a
        # draft token it read) is read again next round.
        kept = min(self.filled, verified.length - 1)
        rollback(self.cache, kept, self.filled)
        self.filled = kept


class MTPDraft:
    """The target's own multi-token-prediction module 1 (``GPT(mtp_depth >= 1)``, DeepSeek-V3 sec. 2.2) as the draft.

    Module 1 at slot s reads the target's h^0_s and the token at s+1 and predicts the token at s+2, so after the
    committed x[:pos] (the target has read x[:pos-1]) it proposes d_1 from slot pos-2. For d_2 it would need
    h^0_{pos-1}, which the target computes only when it verifies; module 1's own output state at pos-2 predicts the
    same token x[pos] and stands in for it, and so on for d_3..d_k: feature-level recursion (EAGLE, Li et al. 2024;
    vLLM reuses its MTP layers the same way past their depth). The module keeps its own cache: slots the target
    has verified hold entries from the true h^0, and the recursion's slots past them are overwritten next round.
    The first round has no h^0 yet, so it proposes nothing: the target's prefill is a plain step.
    """

    needs_hidden = True

    def __init__(self, net: GPT) -> None:
        if not len(net.mtp):
            raise InputError(
                "generation.draft=mtp needs a net with multi-token-prediction modules: set "
                "--model.init_args.net.init_args.mtp_depth (1 or more) when training, or pass a draft checkpoint"
            )
        self.net = net

    def start(self, tokens: Tensor, pad: Tensor) -> None:
        self.pad = window_pad(pad, 0)  # None when no row is padded (no mask)
        self.filled = 0  # module 1's cache holds true entries for slots [0, filled)
        self.hidden: Tensor | None = None  # the target's h^0 at slots [filled, filled + hidden.shape[1])
        size = (tokens.shape[0], min(tokens.shape[1], self.net.block_size))
        self.cache = LayerCache(*size, self.net.mtp[0].block.attn.cache_layout(), *cache_placement(self.net))

    def room(self, pos: int) -> int:
        if self.hidden is None or self.filled + self.hidden.shape[1] < pos - 1:
            return 0  # the target has not read x[:pos-1] yet: nothing to draft from
        return self.net.block_size + 1 - pos  # it writes up to slot pos + k - 3

    def propose(self, tokens: Tensor, pos: int, k: int, pick: Picker) -> tuple[Tensor, Tensor | None]:
        # The verified slots [filled, pos-1) with their true h^0 and the tokens one slot later: d_1 from the last.
        h, start = self.hidden, self.filled
        logits, h = self.net.mtp_forward(h, tokens[:, start + 1 : pos], 1, self.cache, start, self.pad)
        self.filled, self.hidden = pos - 1, None
        out, qs = [], []
        logits, h, slot = logits[:, -1], h[:, -1:], pos - 1
        for i in range(k):
            nxt, q = pick(logits)
            out.append(nxt)
            qs.append(q)
            if i + 1 < k:  # h stands in for the target's state at the next slot
                logits, h = self.net.mtp_forward(h, nxt[:, None], 1, self.cache, slot, self.pad)
                logits, slot = logits[:, -1], slot + 1
        return torch.stack(out, 1), None if pick.greedy else torch.stack(qs, 1)

    def rollback(self, verified: Verified) -> None:
        # Entries past the verified slots came from stand-in states: the next propose rewrites them from true ones.
        if verified.hidden is None or not verified.hidden.shape[1]:
            return
        if self.hidden is not None:  # states of a round that proposed nothing, not consumed yet
            self.hidden = torch.cat((self.hidden, verified.hidden), dim=1)
        else:
            self.filled, self.hidden = verified.start, verified.hidden
        rollback([self.cache], self.filled)


@dataclass
class SpeculationStats:
    """Counts over rounds: draft tokens proposed and accepted, target forwards, tokens each row advanced."""

    proposed: int = 0
    accepted: int = 0
    forwards: int = 0
    tokens: int = 0

    def add(self, other: SpeculationStats) -> None:
        for name in ("proposed", "accepted", "forwards", "tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def acceptance_rate(self) -> float:
        """Draft tokens kept over those proposed (a batch keeps its least-accepting running row's count)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens committed per target forward (plain decoding: 1; all k accepted: k + 1)."""
        return self.tokens / self.forwards if self.forwards else 0.0


def accepted_greedy(drafts: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
    """Accepted counts (B,) and the token after them (B,): drafts (B, k) kept while they are the target's argmax of
    logits (B, k + 1, V); the next token is the argmax after the last accepted (the bonus token when all are)."""
    best = logits.argmax(dim=-1)  # (B, k + 1)
    n = (drafts == best[:, :-1]).long().cumprod(dim=1).sum(dim=1)  # (B,)
    return n, best.gather(1, n[:, None]).squeeze(1)


def accepted_sampled(drafts: Tensor, p: Tensor, q: Tensor, pick: Picker) -> tuple[Tensor, Tensor]:
    """Accepted counts (B,) and the token after them (B,) for drafts (B, k) drawn from q (B, k, V), against the
    target's p (B, k + 1, V): d_i kept while u_i < p_i(d_i) / q_i(d_i); then a draw from max(0, p - q) normalised,
    or from p_{k+1} when all were kept (q taken as 0 there)."""
    b, k = drafts.shape
    p_d = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # (B, k)
    q_d = q.gather(-1, drafts[..., None]).squeeze(-1)  # (B, k), > 0: the draft drew these
    u = torch.rand(b, k, device=p.device, generator=pick.generator)
    n = (u * q_d < p_d).long().cumprod(dim=1).sum(dim=1)  # (B,)
    q_next = torch.cat((q, torch.zeros_like(p[:, :1])), dim=1)  # (B, k + 1, V)
    at = n[:, None, None].expand(b, 1, p.shape[-1])
    p_n, q_n = p.gather(1, at).squeeze(1), q_next.gather(1, at).squeeze(1)  # (B, V)
    residual = (p_n - q_n).clamp_min(0)
    # A rejection leaves the residual positive mass; rounding can zero an unused row's, which multinomial refuses.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    return n, pick.draw(residual)


class Speculation:
    """One request's state, a round at a time: ``tokens`` (B, N), the target's cache holding slots [0, filled)."""

    def __init__(
        self,
        net: GPT,
        draft: Draft,
        prompts: list[Tensor],
        max_new_tokens: int,
        k: int,
        pick: Picker,
        stop_ids: Sequence[int] = (),
        past_block_size: str = "slide",
    ) -> None:
        self.longest = checked_request(net, prompts, max_new_tokens, past_block_size)
        for m in (net, getattr(draft, "net", None)):
            if m is not None and m.rope_restarts(self.longest + max_new_tokens, since=self.longest):
                raise InputError(
                    f"A LongRoPE model switches to its long factors past {m.rope_scaling.long_after()} tokens, inside "
                    f"this request ({self.longest} prompt tokens + max_new_tokens={max_new_tokens}): a draft's rounds "
                    "do not re-read the context there; decode without a draft (generation.draft: null)"
                )
        self.net, self.draft, self.k, self.pick = net, draft, k, pick
        self.n = self.longest + max_new_tokens
        self.tokens, self.pad = left_padded(prompts, net.tok_emb.weight.device, self.n)  # (B, N), (B,)
        self.stop = torch.as_tensor(list(stop_ids), dtype=torch.long, device=self.tokens.device)
        b = len(prompts)
        self.done = torch.zeros(b, dtype=torch.bool, device=self.tokens.device)
        self.ended = torch.full((b,), self.n, device=self.tokens.device)  # where each row's continuation stops
        self.cache = make_cache(net, b, min(self.n, net.block_size))
        self.filled, self.pos = 0, self.longest  # committed: tokens[:, :pos]
        self.stats = SpeculationStats()
        draft.start(self.tokens, self.pad)

    @property
    def finished(self) -> bool:
        return self.pos >= self.n or bool(self.done.all())

    def step(self) -> None:
        """One round (or, past block_size, one sliding step): commits 1 to k + 1 tokens in every row."""
        pos, bs = self.pos, self.net.block_size
        if pos > bs:  # the window is full: the last block_size tokens re-read, as generate's slide
            first = pos - bs
            logits = self.net(self.tokens[:, first:pos], self.cache, 0, window_pad(self.pad, first))[:, -1]
            self.commit(self.pick(logits)[0][:, None], proposed=0, accepted=0)
            return
        k = max(0, min(self.k, bs - pos, self.n - 1 - pos, self.draft.room(pos)))
        drafts, q = self.draft.propose(self.tokens, pos, k, self.pick) if k else (self.tokens[:, :0], None)
        hidden: list[Tensor] = []
        hook = None
        if self.draft.needs_hidden:  # the final norm's output: the states the head reads (MTP's h^0)
            hook = self.net.norm_f.register_forward_hook(lambda m, args, out: hidden.append(out))
        try:
            ids = torch.cat((self.tokens[:, self.filled : pos], drafts), dim=1)
            logits = self.net(ids, self.cache, self.filled, window_pad(self.pad, 0))[:, -(k + 1) :]  # (B, k + 1, V)
        finally:
            if hook is not None:
                hook.remove()
        if self.pick.greedy:
            n, nxt = accepted_greedy(drafts, logits)
        elif k == 0:  # nothing proposed: a plain step
            n, nxt = torch.zeros_like(self.done, dtype=torch.long), self.pick(logits[:, -1])[0]
        else:
            n, nxt = accepted_sampled(drafts, self.pick.probs(logits), q, self.pick)
        a = int(n[~self.done].min())  # the least accepted among running rows
        # A row that accepted more emits its own accepted d_{a+1} (exact: see the module's docstring).
        last = torch.where(n > a, torch.cat((drafts, nxt[:, None]), dim=1)[:, a], nxt)
        new = torch.cat((drafts[:, :a], last[:, None]), dim=1)  # (B, a + 1)
        start, end = self.filled, pos + k
        self.filled = pos + a  # the target read x[pos-1], d_1..d_k: kept up to d_a
        rollback(self.cache, self.filled, end)
        self.commit(new, proposed=k, accepted=a)
        h = hidden[-1][:, : self.filled - start] if hidden else None
        self.draft.rollback(Verified(self.tokens, self.pos, start, h))

    def commit(self, new: Tensor, proposed: int, accepted: int) -> None:
        """Write ``new`` (B, m) at the position, stop rows at a stop id (EOS), count the round."""
        m = new.shape[1]
        self.tokens[:, self.pos : self.pos + m] = new
        hits = torch.isin(new, self.stop) & ~self.done[:, None]  # (B, m)
        hit = hits.any(dim=1)
        self.ended = torch.where(hit, self.pos + hits.long().argmax(dim=1), self.ended)
        self.done |= hit
        self.pos += m
        self.stats.add(SpeculationStats(proposed, accepted, 1, m))

    def outputs(self) -> list[Tensor]:
        return [self.tokens[i, self.longest : int(self.ended[i])].clone() for i in range(len(self.tokens))]


def draft_of(draft: GPT | Draft, target: GPT) -> Draft:
    """A draft object for ``draft``: a ``GPT`` of the target's vocabulary (else one error), or a ``Draft`` as it is."""
    if isinstance(draft, GPT):
        if draft.vocab_size != target.vocab_size:
            raise InputError(
                f"The draft's vocab_size {draft.vocab_size} differs from the target's {target.vocab_size}: a draft "
                f"must share the target's tokenizer; pass a draft trained on the same tokenizer"
            )
        return GPTDraft(draft)
    return draft


@torch.inference_mode()
def speculative_generate(
    net: GPT,
    draft: GPT | Draft,
    prompts: list[Tensor],
    max_new_tokens: int,
    num_draft_tokens: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
    past_block_size: Literal["slide", "error"] = "slide",
) -> tuple[list[Tensor], SpeculationStats]:
    """``generate``'s continuations (the same ones greedily; the same distribution sampled), with ``draft``
    proposing ``num_draft_tokens`` per target forward; and the round counts (acceptance, tokens per forward)."""
    if num_draft_tokens < 1:
        raise InputError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    draft = draft_of(draft, net)
    nets = [m for m in (net, getattr(draft, "net", None)) if m is not None]
    with evaluating(*nets):
        pick = Picker(temperature, top_k, top_p, generator)
        run = Speculation(net, draft, prompts, max_new_tokens, num_draft_tokens, pick, stop_ids, past_block_size)
        while not run.finished:
            run.step()
    return run.outputs(), run.stats
