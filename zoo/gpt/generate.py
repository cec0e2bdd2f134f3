"""Autoregressive decoding for ``GPT``: per-layer caches, sampling filters and the decoding loop.

Caches are preallocated once per call (no concatenation per token), in the layout each attention class
states (``cache_layout``): for MHA/GQA its keys and values, 2 * G * d numbers per token; for MLA only the
compressed latent c_kv and the shared RoPE key side by side, r + p numbers per token (DeepSeek-V2,
section 2.1.3), which ``MLA`` reads with its up-projections absorbed.

Prompts of different lengths decode together left-padded, as Hugging Face's ``generate`` does: every
prompt ends at the same slot, so one forward pass prefills each prompt to its own length and every
decoding step writes the same cache slot for all rows. The GPT's ``pad`` argument masks each row's padding
and shifts its positions, so a row computes what it would alone (tested: greedy output is identical).

Past the net's ``block_size`` the context slides (``past_block_size="slide"``): each new token is predicted
from the last ``block_size`` tokens, as nanoGPT's ``generate`` crops its input. Once the window is full every
step re-prefills it, as ``use_cache=False`` does; a RoPE model could instead roll its cache, but keys
rotated for their old positions then differ from a re-prefilled window's by rounding, and learned
positions cannot roll at all, so one rule serves every net and cached and uncached decoding stay equal.

Notation: B prompts, P longest prompt, N slots (P + max_new_tokens), W window (at most block_size), V vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from zoo.errors import InputError
from zoo.gpt.gpt import GPT


class LayerCache:
    """Preallocated per-layer cache for a ``(heads, da, db)`` layout: ``a`` (B, heads, N, da) and, when db > 0,
    ``b`` (B, heads, N, db)."""

    def __init__(self, batch: int, max_len: int, layout: tuple[int, int, int], device, dtype) -> None:
        heads, da, db = layout
        self.a = torch.zeros(batch, heads, max_len, da, device=device, dtype=dtype)
        self.b = torch.zeros(batch, heads, max_len, db, device=device, dtype=dtype) if db else None

    def update(self, a: Tensor, b: Tensor | None, start: int) -> tuple[Tensor, Tensor | None]:
        end = start + a.shape[2]
        self.a[:, :, start:end] = a
        if self.b is None:
            return self.a[:, :, :end], None
        self.b[:, :, start:end] = b
        return self.a[:, :, :end], self.b[:, :, :end]

    def truncate(self, length: int, end: int | None = None) -> None:
        """Forget slots ``length``..``end`` (all later slots when None): zeroed, as a cache that never held them.

        Speculative decoding's rollback: rejected draft tokens were written there. Attention reads only the
        slots before a forward's own end, so rewinding the write position alone would do; zeroing makes the
        rollback visible, and tested: after it the cache equals one that decoded only the kept tokens.
        """
        self.a[:, :, length:end] = 0
        if self.b is not None:
            self.b[:, :, length:end] = 0

    def numbers_per_token(self) -> int:
        """Cached numbers per token in this layer, over all heads (batch and length divided out)."""
        return self.a[0, :, 0].numel() + (0 if self.b is None else self.b[0, :, 0].numel())


def make_cache(net: GPT, batch: int, max_len: int, dtype: torch.dtype | None = None) -> list[LayerCache]:
    """One cache per layer, laid out as its attention says: keys and values for MHA/GQA, [c_kv | k_rope] for MLA.

    ``dtype`` defaults to the autocast dtype when autocast is on (what the keys are computed in), else
    the parameters' dtype.
    """
    device, default = cache_placement(net)
    return [LayerCache(batch, max_len, block.attn.cache_layout(), device, dtype or default) for block in net.blocks]


def cache_placement(net: GPT) -> tuple[torch.device, torch.dtype]:
    """Where a cache of ``net`` lives and its dtype: the autocast dtype when autocast is on (what the keys are
    computed in), else the parameters'."""
    p = net.tok_emb.weight
    on = torch.is_autocast_enabled(p.device.type)
    return p.device, torch.get_autocast_dtype(p.device.type) if on else p.dtype


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit (..., V) outside the top-k and outside the nucleus of mass top_p (Holtzman 2019).

    Applied in transformers' order (its ``TopKLogitsWarper`` then ``TopPLogitsWarper``, after the temperature), with
    the same rules: top-k keeps every id tied with the k-th, and top-p drops an id when the mass of the ids ranked
    before it already reaches top_p (the most likely one always stays). Ties at the nucleus' edge stay or go together
    here, where transformers keeps whichever its unstable sort put first (tested against it).
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass ranked before each sorted id
        # An id tied with the one before it is ranked with the first of its ties (the smallest mass before).
        idx = torch.arange(logits.shape[-1], device=logits.device).expand_as(before)
        new = torch.ones_like(before, dtype=torch.bool)
        new[..., 1:] = sorted_logits[..., 1:] != sorted_logits[..., :-1]
        first = torch.where(new, idx, 0).cummax(dim=-1).values
        drop_sorted = before.gather(-1, first) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def penalize_repetition(logits: Tensor, tokens: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """``logits`` (B, V) with every id in ``tokens`` (B, T) where ``seen`` (B, T) is true made less likely: a positive
    logit divided by ``penalty``, a negative one multiplied (Keskar et al. 2019, CTRL, section 4.1; transformers'
    ``RepetitionPenaltyLogitsProcessor``, applied as it is before the temperature and the filters). An id counts once
    however often it occurs; a row's left padding is no token of its own."""
    if penalty == 1.0:
        return logits
    present = torch.zeros(logits.shape, dtype=torch.long, device=logits.device)
    present = present.scatter_add(-1, tokens, seen.long()) > 0  # (B, V): duplicates add, so no write order matters
    return torch.where(present, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def probabilities(logits: Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """The distribution (..., V) ``sample_next`` draws from: softmax of the filtered logits / temperature (> 0)."""
    return filter_logits(logits.float() / temperature, top_k, top_p).softmax(dim=-1)


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Next ids (B,) from last-position logits (B, V); temperature 0 is greedy."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = probabilities(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_next_logp(
    logits: Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Next ids (B,) drawn as ``sample_next`` draws them (temperature > 0), and their log-probabilities (B,) under
    that distribution (after temperature, top-k and top-p): what a policy gradient's importance ratio divides by."""
    filtered = filter_logits(logits.float() / temperature, top_k, top_p)  # (B, V)
    nxt = torch.multinomial(filtered.softmax(dim=-1), 1, generator=generator)  # (B, 1): probabilities(), as drawn
    return nxt.squeeze(-1), filtered.log_softmax(dim=-1).gather(-1, nxt).squeeze(-1)


def left_padded(prompts: list[Tensor], device: torch.device, slots: int) -> tuple[Tensor, Tensor]:
    """Ids (B, slots) with every prompt ending at slot P (the longest prompt's length), and pads (B,)."""
    lengths = torch.tensor([p.numel() for p in prompts], device=device)
    longest = int(lengths.max())
    pad = longest - lengths  # (B,)
    tokens = torch.zeros(len(prompts), slots, dtype=torch.long, device=device)  # (B, N)
    in_prompt = torch.arange(longest, device=device) >= pad[:, None]  # (B, P)
    tokens[:, :longest][in_prompt] = torch.cat([p.to(device) for p in prompts])  # row-major, as the mask enumerates
    return tokens, pad


def window_pad(pad: Tensor, first: int) -> Tensor | None:
    """Each row's padding within a window starting at slot ``first``; None when no row has any (no mask)."""
    inside = (pad - first).clamp_min(0)
    return inside if bool(inside.any()) else None


@dataclass(frozen=True)
class Generation:
    """How ``CausalLMModule``'s predict continues prompts: ``model.init_args.generation.temperature`` and so on in a
    config or on the command line, which ``predict --ckpt_path`` takes over the checkpoint's (they are no weights).

    Args:
        max_new_tokens: tokens generated per prompt (fewer at EOS or at the net's block_size).
        temperature: sampling temperature; 0 is greedy.
        top_k: sample among the k most likely tokens only; None: all.
        top_p: sample from the smallest set of tokens whose probability reaches top_p (nucleus); None: all.
        repetition_penalty: every id already in the prompt or the continuation has its logit divided by this when
            positive, multiplied when negative (CTRL's penalty, as transformers applies it), greedy or sampled; 1: none.
        seed: seed of the sampling of predict batch 0 (batch i: seed + i), so a prediction run repeats exactly.
        past_block_size: past the net's block_size, slide the context over the last block_size tokens, or refuse
            (error) a prompt and max_new_tokens that do not fit in it.
        draft: decode speculatively (``zoo.gpt.speculative``) with this smaller model proposing tokens: a zoo
            checkpoint of a ``CausalLMModule`` with the same tokenizer, or an MLflow model (models:/name/version,
            runs:/id/model) the application resolves; "mtp": the model's own multi-token-prediction module
            (``mtp_depth`` >= 1, self-speculation); None: plain decoding. The output is the same either way
            (greedy: token for token; sampled: in distribution).
        num_draft_tokens: tokens the draft proposes per target forward (k).
    """

    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int = 0
    past_block_size: Literal["slide", "error"] = "slide"
    draft: str | None = None
    num_draft_tokens: int = 4

    def __post_init__(self) -> None:
        # Checked when the config is read, before any run or data.
        bad = [
            (name, rule)
            for name, ok, rule in (
                ("max_new_tokens", self.max_new_tokens >= 1, "1 or more"),
                ("temperature", self.temperature >= 0, "0 or more (0: greedy)"),
                ("top_k", self.top_k is None or self.top_k >= 1, "1 or more, or null (all tokens)"),
                ("top_p", self.top_p is None or 0 < self.top_p <= 1, "in (0, 1], or null (all tokens)"),
                ("repetition_penalty", self.repetition_penalty > 0, "more than 0 (1: no penalty)"),
                ("num_draft_tokens", self.num_draft_tokens >= 1, "1 or more"),
                ("draft", self.draft is None or self.repetition_penalty == 1, "null with a repetition_penalty"),
            )
            if not ok
        ]
        if bad:
            name, rule = bad[0]
            raise InputError(
                f"model.init_args.generation.{name}={getattr(self, name)} must be {rule}: pass "
                f"--model.init_args.generation.{name}=<such a value>"
            )

    @classmethod
    def of(cls, value: Generation | dict) -> Generation:
        """From itself or from its fields as a dict (how checkpoints' hyperparameters carry it)."""
        return value if isinstance(value, cls) else cls(**value)


def checked_request(net: GPT, prompts: list[Tensor], max_new_tokens: int, past_block_size: str) -> int:
    """The longest prompt's length, once prompts and ``max_new_tokens`` are known to fit the net (else one error)."""
    if not prompts or any(p.ndim != 1 or p.numel() == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty 1-D id tensors")
    # What a user asks for (prompts, max_new_tokens) that cannot work: InputError, one line naming it and the fix.
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    longest, bs = max(p.numel() for p in prompts), net.block_size
    if longest >= bs:
        raise InputError(
            f"A prompt of {longest} tokens leaves no room in the model's block_size {bs}: shorten it to "
            f"at most {bs - 1} tokens"
        )
    check_token_memory(len(prompts), longest, max_new_tokens, net.tok_emb.weight.device)
    if past_block_size == "error" and longest + max_new_tokens > bs:
        raise InputError(
            f"{longest} prompt tokens + max_new_tokens={max_new_tokens} exceed the model's block_size "
            f"{bs} (past_block_size='error'): ask for at most {bs - longest} new tokens, or pass "
            f"past_block_size='slide'"
        )
    return longest


def check_token_memory(batch: int, longest: int, max_new_tokens: int, device: torch.device) -> None:
    """Refuse, before allocating it, a token buffer (B, longest prompt + max_new_tokens) of int64 ids larger than all
    of ``device``'s memory. Past block_size the context slides, so nothing else bounds max_new_tokens; the rule is
    the one a user expects of a typo (10**12 tokens: 8 TB): what the device could never hold is named, what might
    fit is tried."""
    need, total = batch * (longest + max_new_tokens) * 8, device_memory(device)
    if total is not None and need > total:
        raise InputError(
            f"model.init_args.generation.max_new_tokens={max_new_tokens:,} for {batch} prompt(s) of up to {longest} "
            f"tokens needs {need / 2**30:,.1f} GiB for the ids alone, more than the {total / 2**30:,.1f} GiB of "
            f"{device}: ask for fewer new tokens"
        )


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory on ``device`` (a CUDA GPU's, else the host's RAM); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return None


@contextmanager
def evaluating(*nets: nn.Module) -> Iterator[None]:
    """The nets in eval mode (no dropout) inside the block, then each back in the mode it was in, on an error too."""
    modes = [net.training for net in nets]
    for net in nets:
        net.eval()
    try:
        yield
    finally:
        for net, mode in zip(nets, modes):
            net.train(mode)


@dataclass
class Decoded:
    """What ``decode`` wrote: ``tokens`` (B, N) left-padded prompts ending at slot ``longest`` then the sampled ids,
    ``pad`` (B,), ``ended`` (B,) the slot of each row's stop token (N if none), and ``logps`` (B, N - longest) the
    sampled ids' log-probabilities when asked for (else None)."""

    tokens: Tensor
    pad: Tensor
    longest: int
    ended: Tensor
    logps: Tensor | None = None


@torch.inference_mode()
def generate(
    net: GPT,
    prompts: list[Tensor],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Sequence[int] = (),
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    past_block_size: Literal["slide", "error"] = "slide",
    repetition_penalty: float = 1.0,
) -> list[Tensor]:
    """Continue each 1-D prompt of ids by up to ``max_new_tokens``; returns the new ids only, EOS excluded.

    A row stops early at any of ``stop_ids`` (EOS; Llama 3 lists three). Past ``block_size`` tokens the context
    slides over the last ``block_size`` (``"slide"``), or the call is refused up front (``"error"``). A prompt must
    leave room for one token in ``block_size``. ``repetition_penalty`` (``penalize_repetition``) applies before
    sampling or the greedy choice.
    """
    args = (max_new_tokens, temperature, top_k, top_p, stop_ids, use_cache, generator, past_block_size)
    out = decode(net, prompts, *args, repetition_penalty=repetition_penalty)
    return [out.tokens[i, out.longest : int(out.ended[i])].clone() for i in range(len(prompts))]


def decode(*args, **kwargs) -> Decoded:
    """``decoding`` run to its end: every slot it wrote (``Decoded``); the arguments are ``decoding``'s."""
    steps = decoding(*args, **kwargs)
    while True:
        try:
            next(steps)
        except StopIteration as finished:
            return finished.value


@torch.inference_mode()  # entered again at each step a caller draws (torch wraps generator functions so)
def decoding(
    net: GPT,
    prompts: list[Tensor],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Sequence[int] = (),
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    past_block_size: Literal["slide", "error"] = "slide",
    logps: bool = False,
    repetition_penalty: float = 1.0,
) -> Generator[Tensor, None, Decoded]:
    """``generate``'s decoding loop, step by step: yields each step's sampled ids (B,) as soon as they are drawn (a
    row's ids after its stop id are not its continuation) and returns every slot it wrote. Streaming reads the steps,
    ``generate`` and rollouts the end: one loop, so a stream and ``generate`` give the same tokens. ``logps``
    (temperature > 0) also keeps the log-probability of each sampled id (``sample_next_logp``), as a rollout for a
    policy gradient needs."""
    if logps and temperature <= 0:
        raise ValueError("log-probabilities of a greedy decoding (temperature 0) are not those of a distribution")
    longest, bs = checked_request(net, prompts, max_new_tokens, past_block_size), net.block_size
    n = longest + max_new_tokens
    tokens, pad = left_padded(prompts, net.tok_emb.weight.device, n)  # (B, N), (B,)
    b = len(prompts)
    done = torch.zeros(b, dtype=torch.bool, device=tokens.device)
    ended = torch.full((b,), n, device=tokens.device)  # the slot where each row's continuation stops
    stop = torch.as_tensor(list(stop_ids), dtype=torch.long, device=tokens.device)
    kept = torch.zeros(b, max_new_tokens, device=tokens.device) if logps else None  # (B, N - P)

    with evaluating(net):
        cache = make_cache(net, b, min(n, bs)) if use_cache else None
        first = 0  # the window's first slot: the context is tokens[:, first:pos + 1]
        logits = net(tokens[:, :longest], cache, 0, window_pad(pad, 0))[:, -1]  # (B, V): every prompt in one pass
        for pos in range(longest, n):
            seen = torch.arange(pos, device=tokens.device) >= pad[:, None]  # (B, pos): each row's own tokens
            logits = penalize_repetition(logits, tokens[:, :pos], seen, repetition_penalty)
            if kept is None:
                nxt = sample_next(logits, temperature, top_k, top_p, generator)
            else:
                nxt, kept[:, pos - longest] = sample_next_logp(logits, temperature, top_k, top_p, generator)
            hit_eos = ~done & torch.isin(nxt, stop)
            ended = torch.where(hit_eos, pos, ended)
            done |= hit_eos
            tokens[:, pos] = nxt
            yield nxt
            if bool(done.all()) or pos + 1 == n:
                break
            slide = pos + 1 - first > bs  # the window is full: drop its oldest token and re-prefill
            first = pos + 1 - bs if slide else first
            if use_cache and not slide and not net.rope_restarts(pos + 1 - first):  # LongRoPE: a stale cache
                logits = net(tokens[:, pos : pos + 1], cache, pos - first, window_pad(pad, first))[:, -1]
            else:
                logits = net(tokens[:, first : pos + 1], cache, 0, window_pad(pad, first))[:, -1]
    return Decoded(tokens, pad, longest, ended, kept)
