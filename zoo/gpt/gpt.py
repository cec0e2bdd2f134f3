"""A decoder-only transformer whose attention is MHA, GQA/MQA or DeepSeek's Multi-head Latent Attention.

References:
  GPT-2: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (pre-norm blocks,
    residual projections initialised with std 0.02/sqrt(2 * n_layer)).
  RoPE: Su et al. 2021, "RoFormer". GQA: Ainslie et al. 2023. SwiGLU: Shazeer 2020.
  MLA: DeepSeek-AI 2024, "DeepSeek-V2", section 2.1: keys and values come from one compressed latent
    c_kv (kv_lora_rank numbers per token) and a RoPE key shared by all heads (qk_rope_head_dim numbers),
    so a decoding cache holds only those two.

The net only predicts logits; the loss is in ``losses.py`` and decoding (its caches, sampling) in
``generate.py``. ``forward`` takes an optional per-layer cache and the position of the first token, which
is all a decoder needs from the net.

Notation: B batch, T tokens in this call, S tokens attended to (cache + new), D model width,
H query heads, G key-value heads, d head size, r kv_lora_rank, p qk_rope_head_dim, n qk_nope_head_dim,
v v_head_dim, V vocabulary.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


class LayerCache(Protocol):
    """What an attention layer needs from a decoding cache (``generate.py`` has the implementations)."""

    def update(self, a: Tensor, b: Tensor | None, start: int) -> tuple[Tensor, Tensor | None]:
        """Write the new tokens' entries at ``start`` and return everything cached up to them."""


def rope_cache(max_len: int, dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos and sin tables (max_len, dim/2) for rotary embeddings over ``dim`` channels."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + dim/2) of x (..., T, dim) by position; cos/sin are (T, dim/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.type_as(x)


def causal_mask(t: int, s: int, device: torch.device) -> Tensor | None:
    """Boolean (T, S) mask for T new queries after S - T cached keys; None when SDPA's is_causal suffices."""
    if t == 1:
        return None  # one new token sees everything before it
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def attend(q: Tensor, k: Tensor, v: Tensor, scale: float | None, dropout: float) -> Tensor:
    """SDPA of q (B, H, T, *) over k, v (B, G, S, *) with G dividing H; causal, offset by S - T."""
    t, s = q.shape[-2], k.shape[-2]
    gqa = k.shape[1] != q.shape[1]
    if t == s:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa)
    mask = causal_mask(t, s, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=gqa)


class Attention(nn.Module):
    """Multi-head attention with G key-value heads: MHA when G == H, GQA when 1 < G < H, MQA when G == 1."""

    def __init__(self, dim: int, n_head: int, n_kv_head: int, bias: bool, rope: bool, dropout: float) -> None:
        super().__init__()
        if dim % n_head or n_head % n_kv_head:
            raise ValueError(f"Need n_embd % n_head == 0 and n_head % n_kv_head == 0; got {dim}, {n_head}, {n_kv_head}")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, dim // n_head
        self.rope, self.dropout = rope, dropout
        # One matmul for q, k, v, laid out [q heads | k heads | v heads] as GPT-2's c_attn.
        self.qkv = nn.Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias=bias)
        self.proj = nn.Linear(n_head * self.head_dim, dim, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache | None = None, start: int = 0) -> Tensor:
        b, t, _ = x.shape
        hd, h, g = self.head_dim, self.n_head, self.n_kv_head
        q, k, v = self.qkv(x).split([h * hd, g * hd, g * hd], dim=-1)
        q = q.view(b, t, h, hd).transpose(1, 2)  # (B, H, T, d)
        k = k.view(b, t, g, hd).transpose(1, 2)  # (B, G, T, d)
        v = v.view(b, t, g, hd).transpose(1, 2)
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, start)  # (B, G, S, d)
        y = attend(q, k, v, None, self.dropout if self.training else 0.0)  # (B, H, T, d)
        return self.proj(y.transpose(1, 2).reshape(b, t, h * hd))


class LatentAttention(nn.Module):
    """DeepSeek-V2 Multi-head Latent Attention.

    Training (no cache) expands the latent into per-head keys and values and runs ordinary attention.
    With a cache, only c_kv (r) and the shared RoPE key (p) are stored per token, and the key and value
    up-projections are absorbed: q_nope is mapped into the latent space by W_uk (per head), attention runs
    over the latents as one shared key-value head, and W_uv maps the attended latent back per head before
    the output projection. The two paths are the same function (tested).
    """

    def __init__(
        self, dim: int, n_head: int, kv_lora_rank: int, q_lora_rank: int | None,
        qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, bias: bool, dropout: float, eps: float,
    ) -> None:
        super().__init__()
        self.n_head, self.r = n_head, kv_lora_rank
        self.dn, self.dp, self.dv = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.scale = 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)
        self.dropout = dropout
        q_out = n_head * (qk_nope_head_dim + qk_rope_head_dim)
        if q_lora_rank:  # queries through their own low-rank latent (DeepSeek-V2 eq. 12-13)
            self.q_down = nn.Linear(dim, q_lora_rank, bias=bias)
            self.q_norm = nn.RMSNorm(q_lora_rank, eps=eps)
            self.q_up = nn.Linear(q_lora_rank, q_out, bias=False)
        else:
            self.q_proj = nn.Linear(dim, q_out, bias=bias)
        self.kv_down = nn.Linear(dim, kv_lora_rank + qk_rope_head_dim, bias=bias)  # [c_kv | k_rope]
        self.kv_norm = nn.RMSNorm(kv_lora_rank, eps=eps)
        self.kv_up = nn.Linear(kv_lora_rank, n_head * (qk_nope_head_dim + v_head_dim), bias=False)
        self.proj = nn.Linear(n_head * v_head_dim, dim, bias=bias)

    def queries(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        b, t, _ = x.shape
        q = self.q_up(self.q_norm(self.q_down(x))) if hasattr(self, "q_down") else self.q_proj(x)
        q = q.view(b, t, self.n_head, self.dn + self.dp).transpose(1, 2)  # (B, H, T, n + p)
        q_nope, q_rope = q.split([self.dn, self.dp], dim=-1)
        return q_nope, apply_rope(q_rope, cos, sin)

    def latents(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        c_kv, k_rope = self.kv_down(x).split([self.r, self.dp], dim=-1)
        return self.kv_norm(c_kv), apply_rope(k_rope.unsqueeze(1), cos, sin)  # (B, T, r), (B, 1, T, p)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache | None = None, start: int = 0) -> Tensor:
        b, t, _ = x.shape
        q_nope, q_rope = self.queries(x, cos, sin)
        c_kv, k_rope = self.latents(x, cos, sin)
        if cache is not None:
            # The cache keeps [c_kv | k_rope] in one buffer, so the shared key is a view, not a copy.
            latent, _ = cache.update(torch.cat((c_kv.unsqueeze(1), k_rope), dim=-1), None, start)  # (B, 1, S, r + p)
            if t == 1 or start > 0:
                return self.proj(self.absorbed(q_nope, q_rope, latent))
        # Training, and a prompt's prefill: per-head keys and values, as cheap as ordinary attention.
        return self.proj(self.expanded(q_nope, q_rope, c_kv, k_rope))

    def expanded(self, q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor) -> Tensor:
        b, h, t, _ = q_nope.shape
        kv = self.kv_up(c_kv).view(b, t, h, self.dn + self.dv).transpose(1, 2)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)  # (B, H, T, n), (B, H, T, v)
        q = torch.cat((q_nope, q_rope), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(b, h, t, self.dp)), dim=-1)
        # PyTorch's fused attention kernels want one width for q, k and v: pad v, as DeepSeek's code does.
        v = F.pad(v, (0, q.shape[-1] - self.dv)) if self.dv < q.shape[-1] else v
        y = attend(q, k, v, self.scale, self.dropout if self.training else 0.0)[..., : self.dv]  # (B, H, T, v)
        return y.transpose(1, 2).reshape(b, t, h * self.dv)

    def absorbed(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor) -> Tensor:
        b, h, t, _ = q_nope.shape
        w_uk, w_uv = self.kv_up.weight.view(h, self.dn + self.dv, self.r).split([self.dn, self.dv], dim=1)
        q_lat = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # W_uk absorbed into the query
        q = torch.cat((q_lat, q_rope), dim=-1)  # (B, H, T, r + p)
        # One key head shared by all; the value is the same buffer (its first r columns are c_kv), so q, k
        # and v share a width and the fused kernel runs; the k_rope columns of the output are dropped.
        o_lat = attend(q, latent, latent, self.scale, 0.0)[..., : self.r]  # (B, H, T, r)
        y = torch.einsum("bhtr,hvr->bhtv", o_lat, w_uv)  # W_uv absorbed on the way out
        return y.transpose(1, 2).reshape(b, t, h * self.dv)


class MLP(nn.Module):
    """GELU MLP (GPT-2) or SwiGLU (gate and up projections fused in one matmul)."""

    def __init__(self, dim: int, hidden: int, kind: Literal["gelu", "swiglu"], bias: bool, dropout: float) -> None:
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(dim, 2 * hidden if kind == "swiglu" else hidden, bias=bias)
        self.proj = nn.Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")  # GPT-2's gelu_new
        return self.drop(self.proj(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, attn: nn.Module, mlp: MLP, norm: type[nn.Module], dim: int, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm1, self.attn = norm(dim, eps=eps), attn
        self.norm2, self.mlp = norm(dim, eps=eps), mlp
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache | None = None, start: int = 0) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), cos, sin, cache, start))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V)."""

    def __init__(
        self,
        vocab_size: int = 257,
        block_size: int = 256,
        n_layer: int = 4,
        n_embd: int = 256,
        n_head: int = 4,
        n_kv_head: int | None = None,
        attention: Literal["mha", "mla"] = "mha",
        kv_lora_rank: int = 128,
        q_lora_rank: int | None = None,
        qk_nope_head_dim: int = 64,
        qk_rope_head_dim: int = 32,
        v_head_dim: int = 64,
        norm: Literal["layernorm", "rmsnorm"] = "layernorm",
        norm_eps: float = 1e-5,
        mlp: Literal["gelu", "swiglu"] = "gelu",
        mlp_hidden: int | None = None,
        position: Literal["learned", "rope"] = "learned",
        rope_base: float = 10000.0,
        bias: bool = True,
        tie_embeddings: bool = True,
        dropout: float = 0.0,
        activation_checkpointing: bool = False,
    ) -> None:
        """
        Args:
            vocab_size: number of token ids (V); the tokenizer's vocabulary must fit.
            block_size: longest sequence (context length); sizes learned positions and RoPE tables.
            n_layer: transformer blocks.
            n_embd: model width D.
            n_head: query heads H.
            n_kv_head: key-value heads G for attention="mha" (None = H: MHA; 1 = MQA; else GQA).
            attention: "mha" (MHA/GQA/MQA by n_kv_head) or "mla" (DeepSeek-V2 latent attention).
            kv_lora_rank: MLA's compressed key-value latent size r (cached per token).
            q_lora_rank: MLA's query latent size; None projects queries directly.
            qk_nope_head_dim: MLA's per-head query/key size without RoPE.
            qk_rope_head_dim: MLA's decoupled RoPE key size p, shared by all heads (cached per token).
            v_head_dim: MLA's per-head value size.
            norm: LayerNorm (GPT-2) or RMSNorm.
            norm_eps: epsilon of every norm.
            mlp: "gelu" (GPT-2) or "swiglu".
            mlp_hidden: MLP hidden width; None = 4D for gelu, 8D/3 rounded up to a multiple of 64 for swiglu.
            position: learned absolute positions (GPT-2) or RoPE (MLA always uses RoPE on its p channels).
            rope_base: RoPE's base wavelength.
            bias: biases in linear layers (GPT-2 has them).
            tie_embeddings: share the token embedding with the output head (GPT-2 does).
            dropout: dropout on embeddings, attention and residual branches.
            activation_checkpointing: recompute each block's activations in backward to save memory.
        """
        super().__init__()
        self.vocab_size, self.block_size, self.n_layer = vocab_size, block_size, n_layer
        self.attention, self.position = attention, position
        self.activation_checkpointing = activation_checkpointing
        norm_cls = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}[norm]
        if mlp_hidden is None:
            mlp_hidden = 4 * n_embd if mlp == "gelu" else 64 * math.ceil(8 * n_embd / 3 / 64)
        n_kv_head = n_kv_head or n_head

        def make_attn() -> nn.Module:
            if attention == "mla":
                return LatentAttention(n_embd, n_head, kv_lora_rank, q_lora_rank, qk_nope_head_dim,
                                       qk_rope_head_dim, v_head_dim, bias, dropout, norm_eps)
            return Attention(n_embd, n_head, n_kv_head, bias, position == "rope", dropout)

        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        if position == "learned":
            self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(make_attn(), MLP(n_embd, mlp_hidden, mlp, bias, dropout), norm_cls, n_embd, norm_eps, dropout)
            for _ in range(n_layer)
        )
        self.norm_f = norm_cls(n_embd, eps=norm_eps)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        rope_dim = qk_rope_head_dim if attention == "mla" else n_embd // n_head
        cos, sin = rope_cache(block_size, rope_dim, rope_base)
        # Not persistent: rebuilt from the config, so checkpoints and HF conversions carry weights only.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), zero biases, residual output projections N(0, 0.02/sqrt(2L))."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                residual = name.endswith(("attn.proj.weight", "mlp.proj.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layer) if residual else 0.02)
            else:
                nn.init.ones_(p)  # norm weights

    def no_weight_decay(self) -> set[str]:
        """Embedding tables (the tied head included) take no weight decay."""
        names = {"tok_emb.weight"}
        if self.position == "learned":
            names.add("pos_emb.weight")
        return names

    def forward(self, idx: Tensor, cache: list[LayerCache] | None = None, start: int = 0) -> Tensor:
        """Logits (B, T, V) for ids (B, T) at positions start..start+T-1; ``cache`` holds earlier tokens."""
        t = idx.shape[1]
        if start + t > self.block_size:
            raise ValueError(f"Sequence of {start + t} tokens exceeds block_size {self.block_size}")
        x = self.tok_emb(idx)  # (B, T, D)
        if self.position == "learned":
            x = x + self.pos_emb.weight[start:start + t]
        x = self.drop(x)
        cos, sin = self.rope_cos[start:start + t], self.rope_sin[start:start + t]
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache[i]
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, layer_cache, start, use_reentrant=False)
            else:
                x = block(x, cos, sin, layer_cache, start)
        return self.lm_head(self.norm_f(x))  # (B, T, V)

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token, forward and backward: 6 * matmul weights + 6 * L * T * (qk + v) widths.

        The attention term counts QK^T and AV over the whole context as nanoGPT and PaLM (App. B) do,
        without halving for the causal mask, so MFU figures compare with theirs.
        """
        seq_len = seq_len or self.block_size
        n = sum(p.numel() for name, p in self.named_parameters() if p.dim() >= 2 and "emb" not in name)
        if self.lm_head.weight is self.tok_emb.weight:
            n += self.lm_head.weight.numel()  # the tied head is a matmul too
        attn = self.blocks[0].attn
        if isinstance(attn, LatentAttention):
            qk, v = attn.n_head * (attn.dn + attn.dp), attn.n_head * attn.dv
        else:
            qk = v = attn.n_head * attn.head_dim
        return 6 * n + 6 * self.n_layer * seq_len * (qk + v)
