"""A decoder-only transformer whose attention is injected: MHA, GQA/MQA or DeepSeek's Multi-head Latent Attention.

References:
  GPT-2: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (pre-norm blocks,
    residual projections initialised with std 0.02/sqrt(2 * n_layer)).
  The attention variants (RoPE, GQA, MLA) and their references are in ``attention.py``, the MLPs (GELU, SwiGLU)
  in ``mlp.py``.

The net only predicts logits; the loss is in ``losses.py`` and decoding (its caches, sampling) in
``generate.py``. ``forward`` takes an optional per-layer cache and the position of the first token, which
is all a decoder needs from the net.

Notation: B batch, T tokens in this call, D model width, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from zoo.gpt.attention import MHA, AttentionClass, LayerCache, rope_cache
from zoo.gpt.mlp import GeluMLP, SwiGLU, mlp_of_old_config
from zoo.gpt.moe import MoE
from zoo.gpt.norms import LayerNorm, NormClass, norm_of_old_config

# What GPT(mlp=...) takes: a class (or partial) called as cls(dim, hidden, bias, dropout); in YAML a class_path with
# the class's own init_args; the union is what the CLI accepts as class_path.
MLPClass = Callable[[int, "int | None", bool, float], GeluMLP | SwiGLU | MoE]


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, attn: nn.Module, mlp: nn.Module, norm: NormClass, dim: int, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm1, self.attn = norm(dim, eps=eps), attn
        self.norm2, self.mlp = norm(dim, eps=eps), mlp
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: LayerCache | None = None,
        start: int = 0,
        mask: Tensor | None = None,
    ) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), cos, sin, cache, start, mask))
        return x + self.mlp(self.norm2(x))


def padded_positions(pad: Tensor, start: int, t: int) -> tuple[Tensor, Tensor]:
    """Positions (B, T) and attention mask (B, 1, T, S) of slots start..start+T-1 in rows left-padded by ``pad``.

    A query sees the earlier slots of its row that are not padding; a padding query sees itself only, so
    its (unused) output is finite rather than a softmax over nothing.
    """
    s = start + t
    slots = torch.arange(start, s, device=pad.device)  # (T,)
    keys = torch.arange(s, device=pad.device)  # (S,)
    causal = keys <= slots[:, None]  # (T, S)
    real = keys >= pad[:, None, None]  # (B, 1, S)
    mask = causal & (real | (keys == slots[:, None]))  # (B, T, S)
    return (slots - pad[:, None]).clamp_min(0), mask.unsqueeze(1)


class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V)."""

    def __init__(
        self,
        vocab_size: int | None = None,
        block_size: int = 256,
        n_layer: int = 4,
        n_embd: int = 256,
        n_head: int = 4,
        attention: AttentionClass = MHA,
        norm: Literal["layernorm", "rmsnorm"] | NormClass = LayerNorm,
        norm_eps: float = 1e-5,
        mlp: Literal["gelu", "swiglu"] | MLPClass = GeluMLP,
        mlp_hidden: int | None = None,
        first_k_dense: int = 0,
        dense_hidden: int | None = None,
        gelu: Literal["exact", "tanh"] | None = None,
        position: Literal["learned", "rope"] = "learned",
        rope_base: float = 10000.0,
        bias: bool = True,
        tie_embeddings: bool = True,
        dropout: float = 0.0,
        activation_checkpointing: bool = False,
    ) -> None:
        """
        Args:
            vocab_size: number of token ids (V). Required; a config may leave it unset (None): ``cli.py`` then takes
                the tokenizer's (``zoo.app.sizes``) before the net is built, so it is never copied by hand.
            block_size: longest sequence (context length); sizes learned positions and RoPE tables.
            n_layer: transformer blocks.
            n_embd: model width D.
            n_head: query heads H.
            attention: the attention class of every block, with its own settings (``zoo.gpt.attention``):
                ``MHA`` (``n_kv_head`` for GQA/MQA) or ``MLA`` (DeepSeek-V2 latent attention); in Python a
                class or ``functools.partial(MLA, kv_lora_rank=...)``, called as (D, H, bias, dropout, rope).
            norm: the norm class (``zoo.gpt.norms``): ``LayerNorm`` (GPT-2) or ``RMSNorm``, called as (D, norm_eps); the
                strings "layernorm" and "rmsnorm" of older configs name them.
            norm_eps: epsilon of every norm.
            mlp: the MLP class of every block, with its own settings (``zoo.gpt.mlp``): ``GeluMLP`` (GPT-2;
                ``approximate`` exact or tanh) or ``SwiGLU``; called as (D, mlp_hidden, bias, dropout). The strings
                "gelu" and "swiglu" of older configs name them.
            mlp_hidden: MLP hidden width; None: the class's own (4D for GeluMLP, 8D/3 rounded up to 64 for SwiGLU;
                for ``MoE`` each routed expert's width).
            first_k_dense: the first blocks that take a dense ``SwiGLU`` instead of ``mlp`` (DeepSeek-V3's
                ``first_k_dense_replace``: 3 dense layers before its mixture-of-experts layers).
            dense_hidden: those dense SwiGLUs' hidden width; None: SwiGLU's own (8D/3 rounded up to 64).
            gelu: only with the older ``mlp: gelu``: its activation (now ``GeluMLP``'s ``approximate``).
            position: learned absolute positions (GPT-2) or RoPE (MLA always uses RoPE on its p channels).
            rope_base: RoPE's base wavelength.
            bias: biases in linear layers (GPT-2 has them).
            tie_embeddings: share the token embedding with the output head (GPT-2 does).
            dropout: dropout on embeddings, attention and residual branches.
            activation_checkpointing: recompute each block's activations in backward to save memory.
        """
        if vocab_size is None:
            raise ValueError("GPT needs vocab_size: the tokenizer's number of ids (cli.py takes it from the data)")
        super().__init__()
        self.vocab_size, self.block_size, self.n_layer = vocab_size, block_size, n_layer
        self.n_embd, self.tie_embeddings = n_embd, tie_embeddings
        self.position, self.rope_base = position, rope_base
        self.activation_checkpointing = activation_checkpointing
        norm_cls = norm_of_old_config(norm)
        mlp = mlp_of_old_config(mlp, gelu)
        self.tok_emb = nn.Embedding(vocab_size, n_embd)  # registered first, so a seed gives the same weights
        if position == "learned":
            self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(
                attention(n_embd, n_head, bias, dropout, position == "rope"),
                SwiGLU(n_embd, dense_hidden, bias, dropout)
                if i < first_k_dense
                else mlp(n_embd, mlp_hidden, bias, dropout),
                norm_cls,
                n_embd,
                norm_eps,
                dropout,
            )
            for i in range(n_layer)
        )
        self.norm_f = norm_cls(n_embd, eps=norm_eps)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        cos, sin = rope_cache(block_size, self.blocks[0].attn.rope_dim, rope_base)
        # Not persistent: rebuilt from the config, so checkpoints and HF conversions carry weights only.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), zero biases, residual output projections N(0, 0.02/sqrt(2L)) (the
        attention's ``proj`` and what each MLP names)."""
        residual = {id(p) for block in self.blocks for p in (block.attn.proj.weight, *block.mlp.residual_projections())}
        for name, p in self.named_parameters():  # in order, so a seed gives the weights it always gave
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layer) if id(p) in residual else 0.02)
            else:
                nn.init.ones_(p)  # norm weights

    def no_weight_decay(self) -> set[str]:
        """Embedding tables (the tied head included) take no weight decay."""
        names = {"tok_emb.weight"}
        if self.position == "learned":
            names.add("pos_emb.weight")
        return names

    def forward(
        self, idx: Tensor, cache: list[LayerCache] | None = None, start: int = 0, pad: Tensor | None = None
    ) -> Tensor:
        """Logits (B, T, V) for ids (B, T) in slots start..start+T-1; ``cache`` holds the earlier slots.

        ``pad`` (B,) left-pads rows of unequal prompts in one batch: row b's first pad[b] slots are
        padding, never attended to, and its tokens' positions are slot - pad[b], so each row computes what it
        would alone.
        """
        t = idx.shape[1]
        if start + t > self.block_size:
            raise ValueError(f"Sequence of {start + t} tokens exceeds block_size {self.block_size}")
        x = self.tok_emb(idx)  # (B, T, D)
        learned = self.position == "learned"
        if pad is None:  # every row at the same positions: slices, and SDPA's own causal mask
            mask = None
            cos, sin = self.rope_cos[start : start + t], self.rope_sin[start : start + t]  # (T, rope_dim/2)
            x = x + self.pos_emb.weight[start : start + t] if learned else x
        else:
            pos, mask = padded_positions(pad, start, t)  # (B, T), (B, 1, T, S)
            cos, sin = self.rope_cos[pos].unsqueeze(1), self.rope_sin[pos].unsqueeze(1)  # (B, 1, T, rope_dim/2)
            x = x + self.pos_emb(pos) if learned else x
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache[i]
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, layer_cache, start, mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, layer_cache, start, mask)
        return self.lm_head(self.norm_f(x))  # (B, T, V)

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token, forward and backward: 6 * matmul weights outside the MLPs, each MLP's own count
        (the weights a token goes through) and each layer's attention scores.

        The attention term (each class's ``flops_per_token``) counts QK^T and AV over the whole context as
        nanoGPT and PaLM (App. B) do, without halving for the causal mask, so MFU figures compare with theirs.
        """
        seq_len = seq_len or self.block_size
        in_mlps = {id(p) for block in self.blocks for p in block.mlp.parameters()}
        n = sum(
            p.numel()
            for name, p in self.named_parameters()
            if p.dim() >= 2 and "emb" not in name and id(p) not in in_mlps
        )
        if self.lm_head.weight is self.tok_emb.weight:
            n += self.lm_head.weight.numel()  # the tied head is a matmul too
        return 6 * n + sum(block.mlp.flops_per_token() + block.attn.flops_per_token(seq_len) for block in self.blocks)
