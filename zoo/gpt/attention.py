"""The GPT's causal attention variants, each one class chosen by config:

    attention:
      class_path: zoo.gpt.attention.MLA
      init_args: {kv_lora_rank: 128, qk_nope_head_dim: 32, qk_rope_head_dim: 16, v_head_dim: 32}

The GPT builds every layer by calling the class with what all variants share, ``(dim, n_head, bias,
dropout, rope)``; ``init_args`` hold only the variant's own settings, so MLA's cannot be given to MHA, nor
``n_kv_head`` to MLA (the CLI refuses such a config at parse time, naming the option). Each class
describes itself to the rest of the zoo instead of being recognised by type:
``cache_layout()`` is what ``generate.py`` preallocates per layer, ``flops_per_token(T)`` is its share of
``GPT.flops_per_token``, and ``rope_dim`` sizes the GPT's RoPE tables. A new variant is one class here,
added to ``AttentionClass``.

References:
  RoPE: Su et al. 2021, "RoFormer". GQA: Ainslie et al. 2023.
  MLA: DeepSeek-AI 2024, "DeepSeek-V2", section 2.1: keys and values come from one compressed latent
    c_kv (kv_lora_rank numbers per token) and a RoPE key shared by all heads (qk_rope_head_dim numbers),
    so a decoding cache holds only those two.

Notation: B batch, T tokens in this call, S tokens attended to (cache + new), D model width,
H query heads, G key-value heads, d head size, r kv_lora_rank, p qk_rope_head_dim, n qk_nope_head_dim,
v v_head_dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.errors import InputError
from zoo.gpt.norms import GemmaRMSNorm


class LayerCache(Protocol):
    """What an attention layer needs from a decoding cache (``generate.py`` has the implementation)."""

    def update(self, a: Tensor, b: Tensor | None, start: int) -> tuple[Tensor, Tensor | None]:
        """Write the new tokens' entries at ``start`` and return everything cached up to them."""


@dataclass(frozen=True)
class Llama3RoPE:
    """Llama 3.1's RoPE frequency scaling (``rope_type: llama3``): wavelengths longer than the original context /
    ``low_freq_factor`` are stretched by ``factor``, those shorter than it / ``high_freq_factor`` kept, and the band
    between interpolated smoothly (Meta 2024, "The Llama 3 Herd of Models", as transformers computes it).

    Args:
        factor: how much the long wavelengths are stretched.
        low_freq_factor: original context / this is the wavelength past which they are.
        high_freq_factor: original context / this is the wavelength below which nothing changes.
        original_max_position_embeddings: the context the model was first trained at.
    """

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def scale(self, inv_freq: Tensor) -> Tensor:
        old = self.original_max_position_embeddings
        wavelen = 2 * math.pi / inv_freq
        long = wavelen > old / self.low_freq_factor
        short = wavelen < old / self.high_freq_factor
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
        return torch.where(long, inv_freq / self.factor, torch.where(short, inv_freq, blended))

    def frequencies(self, dim: int, base: float) -> tuple[Tensor, float]:
        """The scaled inverse frequencies over ``dim`` channels and the tables' factor (none: 1)."""
        return self.scale(rope_frequencies(dim, base)), 1.0


@dataclass(frozen=True)
class YaRNRoPE:
    """YaRN's RoPE scaling (``rope_type: yarn``; Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large
    Language Models", sec. 3.2-3.4), as transformers' ``_compute_yarn_parameters`` computes it: each frequency is a
    blend of itself (extrapolation) and itself / ``factor`` (interpolation), by a ramp over the channels between the
    ones turning ``beta_fast`` and ``beta_slow`` times in the original context; cos and sin are multiplied by the
    attention factor (0.1 ln(factor) + 1, or the ratio of that at ``mscale`` and ``mscale_all_dim``).

    Args:
        factor: how much the context is extended (DeepSeek-V3: 40).
        original_max_position_embeddings: the context the model was first trained at (DeepSeek-V3: 4096).
        beta_fast: rotations in the original context above which a channel keeps its frequency (paper's beta).
        beta_slow: rotations below which a channel is interpolated fully (paper's alpha).
        mscale: DeepSeek's numerator of the attention factor, 0.1 mscale ln(factor) + 1; None: 1.
        mscale_all_dim: DeepSeek's denominator of it; None: 1. Where set, DeepSeek's MLA also multiplies its softmax
            scale by (0.1 mscale_all_dim ln(factor) + 1)^2 (``softmax_scale_factor``, which ``MLA`` takes).
        attention_factor: the tables' factor stated outright; None: from ``factor``, ``mscale`` and ``mscale_all_dim``.
        truncate: round the ramp's ends to whole channels (transformers' default; gpt-oss sets false).
    """

    factor: float = 4.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    @staticmethod
    def _mscale(factor: float, mscale: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0

    def frequencies(self, dim: int, base: float) -> tuple[Tensor, float]:
        """The blended inverse frequencies over ``dim`` channels and the tables' attention factor."""
        gain = self.attention_factor
        if gain is None and self.mscale and self.mscale_all_dim:  # transformers' test: unset or 0 is "not given"
            gain = self._mscale(self.factor, self.mscale) / self._mscale(self.factor, self.mscale_all_dim)
        elif gain is None:
            gain = self._mscale(self.factor)
        old = self.original_max_position_embeddings

        def channel(rotations: float) -> float:  # the channel turning ``rotations`` times over the original context
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = channel(self.beta_fast), channel(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        high = high + 0.001 if low == high else high  # transformers' guard against 0/0
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1: the channel keeps its frequency (fast), 0: divided by factor (slow)
        pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        inv_freq = 1.0 / (self.factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep
        return inv_freq, float(gain)

    def softmax_scale_factor(self) -> float:
        """DeepSeek's extra factor on the attention's softmax scale (transformers' ``yarn_apply_mscale``): the square
        of 0.1 mscale_all_dim ln(factor) + 1 where ``mscale_all_dim`` is set, else 1."""
        return self._mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


@dataclass(frozen=True)
class LongRoPE:
    """Phi-3's LongRoPE (``rope_type: longrope``; Ding et al. 2024, "LongRoPE"): each frequency divided by its own
    factor, ``short_factor``'s for a sequence of at most ``original_max_position_embeddings`` tokens and
    ``long_factor``'s for the whole of a longer one (transformers chooses per forward by its last position), cos and
    sin scaled by ``attention_factor`` at every length (the ``zoo.gpt.formats.phi3`` converter computes it as
    transformers does: sqrt(1 + ln(factor) / ln(original)) unless stated).

    Args:
        short_factor: one divisor per frequency (rotated channels / 2) up to the original context.
        long_factor: one divisor per frequency past it.
        original_max_position_embeddings: the longest sequence that takes the short factors.
        attention_factor: what cos and sin are multiplied by.
    """

    short_factor: list[float]
    long_factor: list[float]
    original_max_position_embeddings: int = 4096
    attention_factor: float = 1.0

    def long_after(self) -> int:
        """The sequence length past which the long factors apply (``GPT`` keeps a second table for them)."""
        return self.original_max_position_embeddings

    def frequencies(self, dim: int, base: float, long: bool = False) -> tuple[Tensor, float]:
        """The frequencies of ``dim`` rotated channels, computed in transformers' order (so bit for bit its), and the
        tables' factor."""
        factors = torch.tensor(self.long_factor if long else self.short_factor, dtype=torch.float32)
        return 1.0 / (factors * base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), self.attention_factor


def rope_frequencies(dim: int, base: float) -> Tensor:
    """RoPE's inverse frequencies base^(-2i/dim), i < dim/2."""
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)


def rope_cache(
    max_len: int, dim: int, base: float, scaling: Llama3RoPE | YaRNRoPE | LongRoPE | None = None, long: bool = False
) -> tuple[Tensor, Tensor]:
    """cos and sin tables (max_len, dim/2) for rotary embeddings over ``dim`` channels; a scaling states its own
    frequencies and the factor both tables take (YaRN's and LongRoPE's attention factor; 1 otherwise). ``long``: a
    ``LongRoPE``'s table for sequences past its original context."""
    if scaling is None:
        inv_freq, gain = rope_frequencies(dim, base), 1.0
    elif isinstance(scaling, LongRoPE):
        inv_freq, gain = scaling.frequencies(dim, base, long)
    else:
        inv_freq, gain = scaling.frequencies(dim, base)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return angles.cos() * gain, angles.sin() * gain


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + r/2) of the first r = 2 cos.shape[-1] channels of x (..., T, dim) by position;
    cos/sin are (T, r/2). The channels past r pass unrotated (partial RoPE: Phi-4-mini rotates 3/4 of each head)."""
    r = 2 * cos.shape[-1]
    x1, x2 = x[..., :r].float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:].float()), dim=-1)
    return out.type_as(x)


def causal_mask(t: int, s: int, device: torch.device) -> Tensor | None:
    """Boolean (T, S) mask for T new queries after S - T cached keys; None when SDPA's is_causal suffices."""
    if t == 1:
        return None  # one new token sees everything before it
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None,
    dropout: float,
    mask: Tensor | None = None,
    softcap: float | None = None,
) -> Tensor:
    """SDPA of q (B, H, T, *) over k, v (B, G, S, *) with G dividing H; causal, offset by S - T, unless ``mask``
    (B, 1, T, S) (the GPT's, for left-padded rows and sliding windows) says which keys each query sees. With
    ``softcap`` c the scores are c * tanh(scores / c) before the softmax (Gemma 2), which SDPA has no place for."""
    t, s = q.shape[-2], k.shape[-2]
    gqa = k.shape[1] != q.shape[1]
    if softcap is not None:
        return softcapped_attention(
            q, k, v, scale, dropout, causal_mask(t, s, q.device) if mask is None else mask, softcap
        )
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=gqa)
    if t == s:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa)
    mask = causal_mask(t, s, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=gqa)


class AcrossHeadsRMSNorm(nn.RMSNorm):
    """RMSNorm of each token's heads (B, X, T, d) taken together as one vector of X d channels (OLMo 2's q_norm and
    k_norm, over the whole projection), one weight per channel."""

    def forward(self, x: Tensor) -> Tensor:
        b, h, t, d = x.shape
        y = super().forward(x.transpose(1, 2).reshape(b, t, h * d))  # (B, T, X d)
        return y.view(b, t, h, d).transpose(1, 2)  # (B, X, T, d)


def softcapped_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float | None, dropout: float, mask: Tensor | None, softcap: float
) -> Tensor:
    """Attention written out, its scores soft-capped, as transformers' eager Gemma 2 attention computes it."""
    h, g = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)  # (B, H, S, d)
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)  # (B, H, T, S)
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = F.dropout(scores.softmax(-1, dtype=torch.float32).to(q.dtype), dropout)
    return p @ v  # (B, H, T, d)


class MHA(nn.Module):
    """Multi-head attention with G key-value heads: MHA when G == H, GQA when 1 < G < H, MQA when G == 1."""

    def __init__(
        self,
        dim: int,
        n_head: int,
        bias: bool = True,
        dropout: float = 0.0,
        rope: bool = False,
        n_kv_head: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool | None = None,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        rope_dim: int | None = None,
        scale: float | None = None,
        qk_norm_whole: bool = False,
        softcap: float | None = None,
        qk_norm_unit_offset: bool = False,
    ) -> None:
        """
        Args:
            dim: model width D (given by the GPT).
            n_head: query heads H (given by the GPT).
            bias: biases in the projections (given by the GPT).
            dropout: attention dropout (given by the GPT).
            rope: rotate queries and keys by position (given by the GPT: its ``position="rope"``).
            n_kv_head: key-value heads G (None = H: MHA; 1 = MQA; else GQA), must divide H.
            head_dim: per-head size d; None: D / H (Qwen3 and Gemma state a larger one).
            qkv_bias: biases on the q, k, v projections only, whatever ``bias`` says of the output projection
                (Qwen2's layout); None: as ``bias``.
            qk_norm: RMS-normalise each head's query and key before RoPE (Qwen3; Dehghani et al. 2023, "Scaling
                Vision Transformers to 22B parameters", against growing attention logits).
            qk_norm_eps: those norms' epsilon.
            rope_dim: rotate only the first rope_dim channels of each head's query and key (partial RoPE, even; Phi-4-
                mini's partial_rotary_factor 0.75 rotates 96 of 128); None: all d.
            scale: the softmax's scale of q.k; None: 1/sqrt(d) (Granite states its own, ``attention_multiplier``).
            qk_norm_whole: with ``qk_norm``, each token's query and key normalised over all their heads' channels
                together, one weight per channel (OLMo 2's q_norm and k_norm), rather than head by head.
            softcap: c in c * tanh(scores / c) on the attention scores (Gemma 2's ``attn_logit_softcapping``);
                None: none (and PyTorch's fused kernels).
            qk_norm_unit_offset: the q and k norms scale by 1 + weight (Gemma 3's, ``norms.GemmaRMSNorm``).
        """
        super().__init__()
        n_kv_head = n_kv_head or n_head
        if (head_dim is None and dim % n_head) or n_head % n_kv_head:
            raise InputError(
                f"Need n_embd % n_head == 0 and n_head % n_kv_head == 0; got n_embd={dim}, "
                f"n_head={n_head}, n_kv_head={n_kv_head}: choose heads that divide them"
            )
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim or dim // n_head
        self.rope, self.dropout, self.scale = rope, dropout, scale
        if rope_dim is not None and not (0 < rope_dim <= self.head_dim and rope_dim % 2 == 0):
            raise InputError(f"rope_dim={rope_dim} must be even and in (0, head_dim={self.head_dim}]")
        self.rope_dim = rope_dim or self.head_dim  # the GPT builds its tables for this width (used when ``rope``)
        self.softcap = softcap
        # One matmul for q, k, v, laid out [q heads | k heads | v heads] as GPT-2's c_attn.
        qkv_bias = bias if qkv_bias is None else qkv_bias
        self.qkv = nn.Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias=qkv_bias)
        self.proj = nn.Linear(n_head * self.head_dim, dim, bias=bias)
        if qk_norm and qk_norm_whole:
            self.q_norm = AcrossHeadsRMSNorm(n_head * self.head_dim, eps=qk_norm_eps)
            self.k_norm = AcrossHeadsRMSNorm(n_kv_head * self.head_dim, eps=qk_norm_eps)
        elif qk_norm:  # one (d,) weight each, shared by every head, as Qwen3's q_norm and k_norm
            qk = GemmaRMSNorm if qk_norm_unit_offset else nn.RMSNorm
            self.q_norm = qk(self.head_dim, eps=qk_norm_eps)
            self.k_norm = qk(self.head_dim, eps=qk_norm_eps)

    def cache_layout(self) -> tuple[int, int, int]:
        """(heads, a, b) per cached token: G heads of a key (d numbers) and a value (d numbers)."""
        return self.n_kv_head, self.head_dim, self.head_dim

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token of QK^T and AV over ``seq_len`` keys (forward and backward, no causal halving)."""
        return 6 * seq_len * 2 * self.n_head * self.head_dim

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: LayerCache | None = None,
        start: int = 0,
        mask: Tensor | None = None,
    ) -> Tensor:
        b, t, _ = x.shape
        hd, h, g = self.head_dim, self.n_head, self.n_kv_head
        q, k, v = self.qkv(x).split([h * hd, g * hd, g * hd], dim=-1)
        q = q.view(b, t, h, hd).transpose(1, 2)  # (B, H, T, d)
        k = k.view(b, t, g, hd).transpose(1, 2)  # (B, G, T, d)
        v = v.view(b, t, g, hd).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, start)  # (B, G, S, d)
        y = attend(q, k, v, self.scale, self.dropout if self.training else 0.0, mask, self.softcap)  # (B, H, T, d)
        return self.proj(y.transpose(1, 2).reshape(b, t, h * hd))


class MLA(nn.Module):
    """DeepSeek-V2 Multi-head Latent Attention.

    Training (no cache) expands the latent into per-head keys and values and runs ordinary attention.
    With a cache, only c_kv (r) and the shared RoPE key (p) are stored per token, and the key and value
    up-projections are absorbed: q_nope is mapped into the latent space by W_uk (per head), attention runs
    over the latents as one shared key-value head, and W_uv maps the attended latent back per head before
    the output projection. The two paths are the same function (tested).
    """

    def __init__(
        self,
        dim: int,
        n_head: int,
        bias: bool = True,
        dropout: float = 0.0,
        rope: bool = True,
        kv_lora_rank: int = 128,
        q_lora_rank: int | None = None,
        qk_nope_head_dim: int = 64,
        qk_rope_head_dim: int = 32,
        v_head_dim: int = 64,
        norm_eps: float = 1e-5,
        softmax_scale_factor: float = 1.0,
    ) -> None:
        """
        Args:
            dim: model width D (given by the GPT).
            n_head: query heads H (given by the GPT).
            bias: biases in the down- and output projections (given by the GPT).
            dropout: attention dropout (given by the GPT).
            rope: given by the GPT; MLA rotates its decoupled key and query channels whatever the GPT's
                ``position`` (DeepSeek-V2 eq. 14), which only decides whether learned positions are added too.
            kv_lora_rank: the compressed key-value latent size r (cached per token).
            q_lora_rank: the query latent size; None projects queries directly (DeepSeek-V2-Lite).
            qk_nope_head_dim: per-head query/key size without RoPE, n.
            qk_rope_head_dim: the decoupled RoPE key size p, shared by all heads (cached per token).
            v_head_dim: per-head value size v.
            norm_eps: epsilon of the RMSNorms on the latents.
            softmax_scale_factor: multiplies the softmax scale 1/sqrt(n + p): DeepSeek's YaRN sets it to
                ``YaRNRoPE.softmax_scale_factor()`` (transformers' ``yarn_apply_mscale``); 1: none.
        """
        super().__init__()
        self.n_head, self.r = n_head, kv_lora_rank
        self.dn, self.dp, self.dv = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.rope_dim = qk_rope_head_dim
        self.scale = 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim) * softmax_scale_factor
        self.softmax_scale_factor = softmax_scale_factor
        self.dropout = dropout
        q_out = n_head * (qk_nope_head_dim + qk_rope_head_dim)
        if q_lora_rank:  # queries through their own low-rank latent (DeepSeek-V2 eq. 12-13)
            self.q_down = nn.Linear(dim, q_lora_rank, bias=bias)
            self.q_norm = nn.RMSNorm(q_lora_rank, eps=norm_eps)
            self.q_up = nn.Linear(q_lora_rank, q_out, bias=False)
        else:
            self.q_proj = nn.Linear(dim, q_out, bias=bias)
        self.kv_down = nn.Linear(dim, kv_lora_rank + qk_rope_head_dim, bias=bias)  # [c_kv | k_rope]
        self.kv_norm = nn.RMSNorm(kv_lora_rank, eps=norm_eps)
        self.kv_up = nn.Linear(kv_lora_rank, n_head * (qk_nope_head_dim + v_head_dim), bias=False)
        self.proj = nn.Linear(n_head * v_head_dim, dim, bias=bias)

    def cache_layout(self) -> tuple[int, int, int]:
        """(heads, a, b) per cached token: one shared head of [c_kv | k_rope], r + p numbers, and no value."""
        return 1, self.r + self.dp, 0

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token of QK^T and AV over ``seq_len`` keys, in the expanded (training) form."""
        return 6 * seq_len * self.n_head * (self.dn + self.dp + self.dv)

    def queries(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        b, t, _ = x.shape
        q = self.q_up(self.q_norm(self.q_down(x))) if hasattr(self, "q_down") else self.q_proj(x)
        q = q.view(b, t, self.n_head, self.dn + self.dp).transpose(1, 2)  # (B, H, T, n + p)
        q_nope, q_rope = q.split([self.dn, self.dp], dim=-1)
        return q_nope, apply_rope(q_rope, cos, sin)

    def latents(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        c_kv, k_rope = self.kv_down(x).split([self.r, self.dp], dim=-1)
        return self.kv_norm(c_kv), apply_rope(k_rope.unsqueeze(1), cos, sin)  # (B, T, r), (B, 1, T, p)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: LayerCache | None = None,
        start: int = 0,
        mask: Tensor | None = None,
    ) -> Tensor:
        q_nope, q_rope = self.queries(x, cos, sin)
        c_kv, k_rope = self.latents(x, cos, sin)
        if cache is not None:
            # The cache keeps [c_kv | k_rope] in one buffer, so the shared key is a view, not a copy.
            latent, _ = cache.update(torch.cat((c_kv.unsqueeze(1), k_rope), dim=-1), None, start)  # (B, 1, S, r + p)
            if x.shape[1] == 1 or start > 0:
                return self.proj(self.absorbed(q_nope, q_rope, latent, mask))
        # Training, and a prompt's prefill: per-head keys and values, as cheap as ordinary attention.
        return self.proj(self.expanded(q_nope, q_rope, c_kv, k_rope, mask))

    def expanded(self, q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor, mask: Tensor | None) -> Tensor:
        b, h, t, _ = q_nope.shape
        kv = self.kv_up(c_kv).view(b, t, h, self.dn + self.dv).transpose(1, 2)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)  # (B, H, T, n), (B, H, T, v)
        q = torch.cat((q_nope, q_rope), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(b, h, t, self.dp)), dim=-1)
        # PyTorch's fused attention kernels want one width for q, k and v: pad v, as DeepSeek's code does.
        v = F.pad(v, (0, q.shape[-1] - self.dv)) if self.dv < q.shape[-1] else v
        y = attend(q, k, v, self.scale, self.dropout if self.training else 0.0, mask)[..., : self.dv]  # (B, H, T, v)
        return y.transpose(1, 2).reshape(b, t, h * self.dv)

    def absorbed(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, mask: Tensor | None) -> Tensor:
        b, h, t, _ = q_nope.shape
        s = latent.shape[2]
        w_uk, w_uv = self.kv_up.weight.view(h, self.dn + self.dv, self.r).split([self.dn, self.dv], dim=1)
        q_lat = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # W_uk absorbed into the query
        # Every head reads the same latent, so the heads fold into the query rows: one single-head attention
        # of H x T queries against the S latents, one batched matmul each way, the cache never copied per head
        # (a GQA-style call broadcasting one key head to H heads copies it on some backends).
        q = torch.cat((q_lat, q_rope), dim=-1).reshape(b, 1, h * t, self.r + self.dp)  # (B, 1, H T, r + p)
        if mask is None and t > 1:
            mask = causal_mask(t, s, q.device)
        if mask is not None:  # (T, S) or (B, 1, T, S) -> (B, 1, H T, S), head-major as the query rows
            mask = mask.expand(b, h, t, s).reshape(b, 1, h * t, s)
        # The value is the same buffer as the key (its first r columns are c_kv), so q, k and v share a width
        # and the fused kernel runs; the k_rope columns of the output are dropped.
        o_lat = F.scaled_dot_product_attention(q, latent, latent, attn_mask=mask, scale=self.scale)
        o_lat = o_lat[..., : self.r].reshape(b, h, t, self.r)  # (B, H, T, r)
        y = torch.einsum("bhtr,hvr->bhtv", o_lat, w_uv)  # W_uv absorbed on the way out
        return y.transpose(1, 2).reshape(b, t, h * self.dv)


# What GPT(attention=...) takes: a class (or partial) called as cls(dim, n_head, bias, dropout, rope). In YAML,
# a class_path with the variant's own init_args; the union is what the CLI accepts as class_path.
AttentionClass = Callable[[int, int, bool, float, bool], MHA | MLA]
