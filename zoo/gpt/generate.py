"""Autoregressive decoding for ``GPT``: per-layer caches, sampling filters and the decoding loop.

Caches are preallocated once per call (no concatenation per token), in the layout each attention class
states (``cache_layout``): for MHA/GQA its keys and values, 2 * G * d numbers per token; for MLA only the
compressed latent c_kv and the shared RoPE key side by side, r + p numbers per token (DeepSeek-V2,
section 2.1.3), which ``MLA`` reads with its up-projections absorbed.

Prompts of different lengths decode together as in Meta's Llama reference ``generate``: all rows
start at the shortest prompt's length, and while a row is still inside its prompt the sampled token is
replaced by the prompt's own. Every row then sits at the same position, so the caches need no padding
masks or per-row positions, and the result equals decoding each prompt alone.

Notation: B prompts, P longest prompt, N total length (P + max_new_tokens), V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

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

    def numbers_per_token(self) -> int:
        """Cached numbers per token in this layer, over all heads (batch and length divided out)."""
        return self.a[0, :, 0].numel() + (0 if self.b is None else self.b[0, :, 0].numel())


def make_cache(net: GPT, batch: int, max_len: int, dtype: torch.dtype | None = None) -> list[LayerCache]:
    """One cache per layer, laid out as its attention says: keys and values for MHA/GQA, [c_kv | k_rope] for MLA.

    ``dtype`` defaults to the autocast dtype when autocast is on (what the keys are computed in), else
    the parameters' dtype.
    """
    p = net.tok_emb.weight
    if dtype is None:
        on = torch.is_autocast_enabled(p.device.type)
        dtype = torch.get_autocast_dtype(p.device.type) if on else p.dtype
    return [LayerCache(batch, max_len, block.attn.cache_layout(), p.device, dtype) for block in net.blocks]


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit (B, V) outside the top-k and outside the nucleus of mass top_p (Holtzman 2019)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the mass before it already reaches top_p; the most likely one always stays.
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Next ids (B,) from last-position logits (B, V); temperature 0 is greedy."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(
    net: GPT,
    prompts: list[Tensor],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """Continue each 1-D prompt of ids by up to ``max_new_tokens``; returns the new ids only, EOS excluded.

    Decoding stops early for a row at ``eos_id`` and for all rows at the net's ``block_size``.
    """
    if not prompts or any(p.ndim != 1 or p.numel() == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty 1-D id tensors")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = net.tok_emb.weight.device
    lengths = torch.tensor([p.numel() for p in prompts], device=device)
    shortest, longest = int(lengths.min()), int(lengths.max())
    if longest >= net.block_size:
        raise ValueError(f"A prompt of {longest} tokens leaves no room in block_size {net.block_size}")
    total = min(longest + max_new_tokens, net.block_size)
    b = len(prompts)
    tokens = torch.zeros(b, total, dtype=torch.long, device=device)  # (B, N)
    in_prompt = torch.arange(total, device=device) < lengths[:, None]  # (B, N)
    tokens[in_prompt] = torch.cat([p.to(device) for p in prompts])  # row-major, as the mask enumerates
    limit = lengths + max_new_tokens  # each row's own end
    done = torch.zeros(b, dtype=torch.bool, device=device)
    ended = torch.full((b,), total, device=device)  # where each row's continuation stops

    was_training = net.training
    net.eval()
    cache = make_cache(net, b, total) if use_cache else None
    logits = net(tokens[:, :shortest], cache, 0)[:, -1]  # (B, V)
    for pos in range(shortest, total):
        active = ~done
        nxt = sample_next(logits, temperature, top_k, top_p, generator)
        nxt = torch.where(in_prompt[:, pos], tokens[:, pos], nxt)
        hit_eos = active & ~in_prompt[:, pos] & (nxt == eos_id) if eos_id is not None else torch.zeros_like(done)
        at_limit = active & ~hit_eos & (pos + 1 >= limit)
        ended = torch.where(hit_eos, pos, torch.where(at_limit, pos + 1, ended))
        tokens[:, pos] = torch.where(active, nxt, tokens[:, pos])
        done |= hit_eos | at_limit
        if bool(done.all()) or pos + 1 == total:
            break
        if use_cache:
            logits = net(tokens[:, pos:pos + 1], cache, pos)[:, -1]
        else:
            logits = net(tokens[:, :pos + 1])[:, -1]
    net.train(was_training)
    return [tokens[i, int(lengths[i]):int(ended[i])].clone() for i in range(b)]
