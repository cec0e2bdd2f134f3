"""A decoder-only transformer whose attention is injected: MHA, GQA/MQA or DeepSeek's Multi-head Latent Attention.

References:
  GPT-2: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (pre-norm blocks,
    residual projections initialised with std 0.02/sqrt(2 * n_layer)).
  Sliding-window layers: Beltagy et al. 2020, "Longformer" (Mistral 7B's every layer; Gemma 2's every other one,
    Gemma 3's five of six, each with its own RoPE base); Gemma 2/3's sandwich norms, embedding scale and logit
    soft-capping: Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size", section 2.
  The attention variants (RoPE, GQA, MLA) and their references are in ``attention.py``, the MLPs (GELU, SwiGLU)
  in ``mlp.py``.

The net only predicts logits; the loss is in ``losses.py`` and decoding (its caches, sampling) in
``generate.py``. ``forward`` takes an optional per-layer cache and the position of the first token, which
is all a decoder needs from the net. With ``mtp_depth`` D > 0 the net also holds DeepSeek-V3's multi-token
prediction modules (``mtp.py``), run only when asked (``forward(..., mtp=True)`` in training, ``mtp_forward`` to
draft).

Notation: B batch, T tokens in this call, D model width, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from zoo.compat import apply_keeping_float32
from zoo.errors import InputError
from zoo.gpt.attention import MHA, AttentionClass, LayerCache, Llama3RoPE, LongRoPE, YaRNRoPE, rope_cache
from zoo.gpt.mlp import GeGLU, GeluMLP, SwiGLU
from zoo.gpt.moe import MoE
from zoo.gpt.mtp import MTPModule
from zoo.gpt.norms import LayerNorm, NormClass

# What GPT(mlp=...) takes: a class (or partial) called as cls(dim, hidden, bias, dropout), whose forward returns
# (output, auxiliary loss or None); in YAML a class_path with the class's own init_args; the union is what the CLI
# accepts as class_path.
MLPClass = Callable[[int, "int | None", bool, float], GeluMLP | SwiGLU | MoE | GeGLU]


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)); also the MLP's auxiliary loss term
    (a mixture of experts' balance term in training; None for a dense MLP).

    ``post_norm``: x + norm(attn(x)), then x + norm(mlp(x)) instead (OLMo 2: the sublayer's output normed, its input
    not). ``residual_multiplier``: each sublayer's output scaled by it before the add (Granite). With ``sandwich`` each
    branch's output is normed too before it joins the residual stream (Gemma 2/3's post_attention and post_feedforward
    norms)."""

    def __init__(
        self,
        attn: nn.Module,
        mlp: nn.Module,
        norm: NormClass,
        dim: int,
        eps: float,
        dropout: float,
        post_norm: bool = False,
        residual_multiplier: float = 1.0,
        sandwich: bool = False,
    ) -> None:
        super().__init__()
        self.norm1, self.attn = norm(dim, eps=eps), attn
        self.norm2, self.mlp = norm(dim, eps=eps), mlp
        self.drop = nn.Dropout(dropout)
        self.post_norm, self.residual_multiplier = post_norm, residual_multiplier
        if sandwich:
            self.post_attn_norm, self.post_mlp_norm = norm(dim, eps=eps), norm(dim, eps=eps)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: LayerCache | None = None,
        start: int = 0,
        mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        m = self.residual_multiplier
        if self.post_norm:
            x = x + scaled(self.norm1(self.drop(self.attn(x, cos, sin, cache, start, mask))), m)
            y, aux = self.mlp(x)
            return x + scaled(self.norm2(y), m), aux
        a = self.attn(self.norm1(x), cos, sin, cache, start, mask)
        x = x + scaled(self.drop(self.post_attn_norm(a) if hasattr(self, "post_attn_norm") else a), m)
        y, aux = self.mlp(self.norm2(x))
        return x + scaled(self.post_mlp_norm(y) if hasattr(self, "post_mlp_norm") else y, m), aux


def scaled(x: Tensor, m: float) -> Tensor:
    """``x * m``, and ``x`` itself at 1 (no pass over the tensor for the nets that scale nothing)."""
    return x if m == 1 else x * m


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
        norm: NormClass = LayerNorm,
        norm_eps: float = 1e-5,
        mlp: MLPClass = GeluMLP,
        mlp_hidden: int | None = None,
        first_k_dense: int = 0,
        dense_hidden: int | None = None,
        position: Literal["learned", "rope"] = "learned",
        rope_base: float = 10000.0,
        rope_scaling: Llama3RoPE | YaRNRoPE | LongRoPE | None = None,
        bias: bool = True,
        tie_embeddings: bool = True,
        dropout: float = 0.0,
        activation_checkpointing: bool = False,
        mtp_depth: int = 0,
        dense_layers: list[int] | None = None,
        nope_layers: list[int] | None = None,
        norm_position: Literal["pre", "post"] = "pre",
        embedding_multiplier: float = 1.0,
        residual_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        sliding_window: int | None = None,
        layer_types: list[Literal["full_attention", "sliding_attention"]] | None = None,
        rope_local_base: float | None = None,
        sandwich_norm: bool = False,
        embed_scale: float | None = None,
        logit_softcap: float | None = None,
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
            norm: the norm class (``zoo.gpt.norms``): ``LayerNorm`` (GPT-2) or ``RMSNorm``, called as (D, norm_eps).
            norm_eps: epsilon of every norm.
            mlp: the MLP class of every block, with its own settings (``zoo.gpt.mlp``): ``GeluMLP`` (GPT-2;
                ``approximate`` exact or tanh), ``SwiGLU`` or ``MoE``; called as (D, mlp_hidden, bias, dropout).
            mlp_hidden: MLP hidden width; None: the class's own (4D for GeluMLP, 8D/3 rounded up to 64 for SwiGLU;
                for ``MoE`` each routed expert's width).
            first_k_dense: the first blocks that take a dense ``SwiGLU`` instead of ``mlp`` (DeepSeek-V3's
                ``first_k_dense_replace``: 3 dense layers before its mixture-of-experts layers).
            dense_hidden: those dense SwiGLUs' hidden width; None: SwiGLU's own (8D/3 rounded up to 64).
            position: learned absolute positions (GPT-2) or RoPE (MLA always uses RoPE on its p channels).
            rope_base: RoPE's base wavelength.
            rope_scaling: RoPE's frequencies rescaled for a longer context (``Llama3RoPE``: Llama 3.1-3.3's
                ``rope_type: llama3``; ``YaRNRoPE``: ``rope_type: yarn``, DeepSeek-V3's and Qwen3's long contexts;
                ``LongRoPE``: Phi-3's ``longrope``); None: plain RoPE.
            bias: biases in linear layers (GPT-2 has them).
            tie_embeddings: share the token embedding with the output head (GPT-2 does).
            dropout: dropout on embeddings, attention and residual branches.
            activation_checkpointing: recompute each block's activations in backward to save memory.
            mtp_depth: multi-token prediction modules D (DeepSeek-V3 section 2.2, ``zoo.gpt.mtp``; DeepSeek-V3: 1),
                each a block built as the last one plus two norms and a 2D -> D projection, sharing the embedding
                and the head; 0: none (the net and its checkpoints as without the option).
            dense_layers: blocks (by index) that take a dense ``SwiGLU`` of ``dense_hidden`` instead of ``mlp``,
                beside the first ``first_k_dense`` (Qwen3-MoE's ``mlp_only_layers`` and ``decoder_sparse_step``);
                None: none.
            nope_layers: indices of the blocks whose attention skips RoPE (NoPE: no positional encoding, causal
                attention alone orders the tokens; Kazemnejad et al. 2023; SmolLM3 every 4th layer); None: none.
            norm_position: "pre" norms each sublayer's input (GPT-2, Llama); "post" its output, before the residual
                add (OLMo 2's ``post_attention_layernorm`` and ``post_feedforward_layernorm``).
            embedding_multiplier: the token embeddings scaled by it (Granite's ``embedding_multiplier``).
            residual_multiplier: each sublayer's output scaled by it before the residual add (Granite's).
            logits_scaling: the logits divided by it (Granite's ``logits_scaling``).
            sliding_window: W, the keys a sliding-window layer's query sees, itself included (transformers'
                ``sliding_window``: slot i sees slots i-W+1..i); None: every layer sees the whole context.
            layer_types: each layer's attention, "full_attention" or "sliding_attention" (transformers'
                ``layer_types``); None: every layer sliding when ``sliding_window`` is set (Mistral), else full.
            rope_local_base: the RoPE base of the sliding-window layers (Gemma 3's ``rope_local_base_freq``; plain
                RoPE, no ``rope_scaling``); None: ``rope_base`` in every layer.
            sandwich_norm: also norm each attention and MLP output before the residual add (Gemma 2/3).
            embed_scale: multiply the token embeddings by this, rounded to their dtype (Gemma: sqrt(n_embd)); None:
                not scaled.
            logit_softcap: c in c * tanh(logits / c) on the output logits (Gemma 2's ``final_logit_softcapping``);
                None: raw logits.
        """
        if vocab_size is None:
            raise ValueError("GPT needs vocab_size: the tokenizer's number of ids (cli.py takes it from the data)")
        super().__init__()
        self.vocab_size, self.block_size, self.n_layer = vocab_size, block_size, n_layer
        self.n_embd, self.tie_embeddings = n_embd, tie_embeddings
        self.position, self.rope_base, self.rope_scaling = position, rope_base, rope_scaling
        self.activation_checkpointing = activation_checkpointing
        self.embedding_multiplier, self.logits_scaling = embedding_multiplier, logits_scaling
        nope = set(nope_layers or ())
        self.sliding_window, self.rope_local_base = sliding_window, rope_local_base
        self.embed_scale, self.logit_softcap = embed_scale, logit_softcap
        self.layer_types = _layer_types(n_layer, sliding_window, layer_types)
        self.tok_emb = nn.Embedding(vocab_size, n_embd)  # registered first, so a seed gives the same weights
        if position == "learned":
            self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)

        def block(i: int) -> Block:
            return Block(
                attention(n_embd, n_head, bias, dropout, position == "rope" and i not in nope),
                SwiGLU(n_embd, dense_hidden, bias, dropout)
                if i < first_k_dense or i in (dense_layers or ())
                else mlp(n_embd, mlp_hidden, bias, dropout),
                norm,
                n_embd,
                norm_eps,
                dropout,
                norm_position == "post",
                residual_multiplier,
                sandwich_norm,
            )

        self.blocks = nn.ModuleList(block(i) for i in range(n_layer))
        self.norm_f = norm(n_embd, eps=norm_eps)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        # Registered last and built without drawing from the global generator, so a seed gives the main model the
        # weights it gives without MTP (reset_parameters draws them first): runs with and without MTP start alike.
        with torch.random.fork_rng(devices=[]):
            self.mtp = nn.ModuleList(MTPModule(block(n_layer - 1), norm, n_embd, norm_eps) for _ in range(mtp_depth))
        self.init_buffers()
        self.reset_parameters()

    def init_buffers(self) -> None:
        """Compute the buffers that are not saved (RoPE's tables, and those of each part that has an
        ``init_buffers``: a mixture of experts' routing statistics) on the default device. A net built on the meta
        device, to take its weights by assignment (``zoo.io.meta_load``), calls it once built."""
        cos, sin = rope_cache(self.block_size, self.blocks[0].attn.rope_dim, self.rope_base, self.rope_scaling)
        # Not persistent: rebuilt from the config, so checkpoints and HF conversions carry weights only.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if hasattr(self.rope_scaling, "long_after"):  # LongRoPE: a second table, for sequences past its original
            dim = self.blocks[0].attn.rope_dim
            cos, sin = rope_cache(self.block_size, dim, self.rope_base, self.rope_scaling, long=True)
            self.register_buffer("rope_cos_long", cos, persistent=False)
            self.register_buffer("rope_sin_long", sin, persistent=False)
        if self.rope_local_base is not None:  # the sliding layers' own tables (Gemma 3: base 10,000, unscaled)
            cos, sin = rope_cache(self.block_size, self.blocks[0].attn.rope_dim, self.rope_local_base)
            self.register_buffer("rope_cos_local", cos, persistent=False)
            self.register_buffer("rope_sin_local", sin, persistent=False)
        for module in self.modules():
            if module is not self and hasattr(module, "init_buffers"):
                module.init_buffers()

    def _apply(self, fn, recurse=True):
        """RoPE's tables keep float32 when the net is cast (``.to``, ``.half``, Lightning's ``*-true`` precisions), as
        ``apply_rope`` rotates in float32 and as transformers computes its tables from a float32 ``inv_freq``."""
        return apply_keeping_float32(self, fn, recurse, ("rope_cos", "rope_sin"))

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), zero biases, residual output projections N(0, 0.02/sqrt(2L)) (the
        attention's ``proj`` and what each MLP names)."""
        residual = {
            id(p) for block in self.all_blocks() for p in (block.attn.proj.weight, *block.mlp.residual_projections())
        }
        for name, p in self.named_parameters():  # in order, so a seed gives the weights it always gave
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layer) if id(p) in residual else 0.02)
            else:
                nn.init.ones_(p)  # norm weights
        for module in self.modules():  # a norm that scales by 1 + weight (Gemma's) is the identity at zero
            if getattr(module, "identity_weight", 1.0) != 1.0:
                nn.init.constant_(module.weight, module.identity_weight)

    def all_blocks(self) -> list[Block]:
        """The main blocks, then each multi-token prediction module's block (the FSDP2 units)."""
        return [*self.blocks, *(m.block for m in self.mtp)]

    def io_layers(self) -> tuple[str, ...]:
        """The embeddings and the output head (tied or not): Muon takes the hidden matrices only."""
        return ("tok_emb", "pos_emb", "lm_head")

    def no_weight_decay(self) -> set[str]:
        """Embedding tables (the tied head included) take no weight decay."""
        names = {"tok_emb.weight"}
        if self.position == "learned":
            names.add("pos_emb.weight")
        return names

    def forward(
        self,
        idx: Tensor,
        cache: list[LayerCache] | None = None,
        start: int = 0,
        pad: Tensor | None = None,
        mtp: bool = False,
        return_hidden: bool = False,
        aux: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, list[Tensor]] | tuple[Tensor, list[Tensor], list[Tensor]]:
        """Logits (B, T, V) for ids (B, T) in slots start..start+T-1; ``cache`` holds the earlier slots.

        ``pad`` (B,) left-pads rows of unequal prompts in one batch: row b's first pad[b] slots are
        padding, never attended to, and its tokens' positions are slot - pad[b], so each row computes what it
        would alone.

        ``return_hidden``: also the hidden state (B, T, D) the head read (after the final norm), h^0 of ``mtp_forward``.
        ``mtp`` (training, no cache): also every depth's logits, ``mtp[k-1]`` (B, T-k, V) at position i predicting
        token t_{i+k+1}, i.e. ``targets[:, k:]`` (``losses.mtp_loss``). Computed here rather than by a second method so
        that FSDP2, which gathers the shared embedding and head around ``forward``, sees one call.
        ``aux`` (training): also the MLPs' auxiliary loss terms, last: scalars from every block that ran, MTP's
        included (a mixture of experts' balance term; ``losses.causal_lm_objective`` adds them); [] for a dense net.
        """
        t = idx.shape[1]
        if start + t > self.block_size:
            raise ValueError(f"Sequence of {start + t} tokens exceeds block_size {self.block_size}")
        x = scaled(self.tok_emb(idx), self.embedding_multiplier)  # (B, T, D)
        if self.embed_scale is not None:  # in the embedding's dtype, as Gemma rounds it (sqrt(3072) is 55.5 in bf16)
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        cos, sin, mask, pos = self._positions(start, t, pad)
        inputs = {"full_attention": (cos, sin, mask)}
        if "sliding_attention" in self.layer_types:
            inputs["sliding_attention"] = self._sliding_inputs(start, t, pos, cos, sin, mask)
        if self.position == "learned":
            x = x + self.pos_emb.weight[start : start + t] if pos is None else x + self.pos_emb(pos)
        x = self.drop(x)
        aux_terms: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            cos, sin, mask = inputs[self.layer_types[i]]
            x, a = self._block(block, x, cos, sin, None if cache is None else cache[i], start, mask)
            aux_terms += [] if a is None else [a]
        h = self.norm_f(x)  # (B, T, D)
        logits = self._softcap(self.lm_head(h))  # (B, T, V)
        if self.logits_scaling != 1:
            logits = logits / self.logits_scaling  # divided, as Granite does: a reciprocal's product rounds otherwise
        if mtp:
            mtp_logits = self._mtp_logits(h, idx, aux_terms)
            return (logits, mtp_logits, aux_terms) if aux else (logits, mtp_logits)
        if return_hidden:
            return logits, h
        return (logits, aux_terms) if aux else logits

    def _positions(self, start: int, t: int, pad: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """RoPE tables, attention mask and (with ``pad``) positions (B, T) of slots start..start+T-1."""
        cos, sin = self.rope_cos, self.rope_sin
        if self.rope_restarts(start + t, since=1):  # LongRoPE past its original context: the long table throughout
            cos, sin = self.rope_cos_long, self.rope_sin_long
        if pad is None:  # every row at the same positions: slices, and SDPA's own causal mask
            return cos[start : start + t], sin[start : start + t], None, None  # (T, rope_dim/2)
        pos, mask = padded_positions(pad, start, t)  # (B, T), (B, 1, T, S)
        return cos[pos].unsqueeze(1), sin[pos].unsqueeze(1), mask, pos  # (B, 1, T, rope_dim/2)

    def rope_restarts(self, length: int, since: int | None = None) -> bool:
        """Whether a sequence of ``length`` tokens reads other RoPE tables than one of ``since`` tokens (None:
        ``length - 1``): a ``LongRoPE`` switching to its long factors. A cache filled before the switch is stale, so
        decoding re-prefills there, as transformers' Phi-3 ``generate`` drops its cache at that length."""
        after = self.rope_scaling.long_after() if hasattr(self.rope_scaling, "long_after") else None
        since = length - 1 if since is None else since
        return after is not None and since <= after < length

    def _sliding_inputs(
        self, start: int, t: int, pos: Tensor | None, cos: Tensor, sin: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """A sliding-window layer's RoPE tables and mask: the full layers' mask less the keys W or more slots back
        (slots and positions differ by each row's padding only, so the window is the same in either)."""
        if self.rope_local_base is not None:
            tables = self.rope_cos_local, self.rope_sin_local
            cos, sin = (tab[start : start + t] if pos is None else tab[pos].unsqueeze(1) for tab in tables)
        s = start + t
        if s <= self.sliding_window:
            return cos, sin, mask  # no key is out of reach yet
        slots = torch.arange(start, s, device=cos.device)[:, None]  # (T, 1)
        keys = torch.arange(s, device=cos.device)  # (S,)
        near = slots - keys < self.sliding_window  # (T, S)
        return cos, sin, near & (keys <= slots if mask is None else mask)

    def _softcap(self, logits: Tensor) -> Tensor:
        if self.logit_softcap is None:
            return logits
        return torch.tanh(logits / self.logit_softcap) * self.logit_softcap

    def _block(
        self, block: nn.Module, x: Tensor, cos, sin, cache: LayerCache | None, start: int, mask
    ) -> tuple[Tensor, Tensor | None]:
        if self.activation_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(block, x, cos, sin, cache, start, mask, use_reentrant=False)
        return block(x, cos, sin, cache, start, mask)

    def _mtp_logits(self, h: Tensor, idx: Tensor, aux_terms: list[Tensor]) -> list[Tensor]:
        """Every depth's logits in training: depth k over positions 0..T-k-1 reads h^{k-1} there and t_{i+k}; each
        depth's auxiliary loss term goes to ``aux_terms``."""
        out = []
        for k in range(1, min(len(self.mtp), idx.shape[1] - 1) + 1):
            logits, h, a = self._mtp_step(h[:, :-1], idx[:, k:], k)  # (B, T-k, V), (B, T-k, D)
            out.append(logits)
            aux_terms += [] if a is None else [a]
        return out

    def mtp_forward(
        self,
        h: Tensor,
        next_ids: Tensor,
        depth: int,
        cache: LayerCache | None = None,
        start: int = 0,
        pad: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Multi-token prediction module ``depth`` (1..D) at slots start..start+T-1: h^{depth-1} (B, T, D) there and
        the ids (B, T) of the tokens one slot later -> (logits (B, T, V) of the tokens two slots later, h^{depth}).

        To draft: h^0 from ``forward(..., return_hidden=True)`` at the last slot s and the token sampled for s+1 give
        depth 1's guess for s+2; its h^1 and that guess give depth 2's for s+3, and so on. ``cache`` is this module's
        own ``LayerCache`` (``generate.make_cache`` layout of the block, indexed by the slot of h), filled like a main
        layer's; ``pad`` as in ``forward``.
        """
        logits, h, _ = self._mtp_step(h, next_ids, depth, cache, start, pad)
        return logits, h

    def _mtp_step(
        self, h: Tensor, next_ids: Tensor, depth: int, cache: LayerCache | None = None, start: int = 0, pad=None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``mtp_forward`` and the module's auxiliary loss term."""
        module = self.mtp[depth - 1]
        cos, sin, mask, _ = self._positions(start, h.shape[1], pad)
        x = module.combine(h, self.tok_emb(next_ids))  # (B, T, D)
        x, aux = self._block(module.block, x, cos, sin, cache, start, mask)
        h = module.norm(x)  # h^depth
        return self._softcap(self.lm_head(h)), h, aux

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token, forward and backward: 6 * matmul weights outside the MLPs, each MLP's own count
        (the weights a token goes through) and each layer's attention scores.

        The attention term (each class's ``flops_per_token``) counts QK^T and AV over the whole context as
        nanoGPT and PaLM (App. B) do, without halving for the causal mask, so MFU figures compare with theirs.
        """
        seq_len = seq_len or self.block_size
        blocks = self.all_blocks()
        in_mlps = {id(p) for block in blocks for p in block.mlp.parameters()}
        n = sum(
            p.numel()
            for name, p in self.named_parameters()
            if p.dim() >= 2 and "emb" not in name and id(p) not in in_mlps
        )
        if self.lm_head.weight is self.tok_emb.weight:
            n += self.lm_head.weight.numel()  # the tied head is a matmul too
        n += len(self.mtp) * self.lm_head.weight.numel()  # each MTP depth runs the shared head again
        return 6 * n + sum(block.mlp.flops_per_token() + block.attn.flops_per_token(seq_len) for block in blocks)


def _layer_types(n_layer: int, window: int | None, types: list[str] | None) -> list[str]:
    """Each layer's attention kind: ``types`` as given (one per layer), or all sliding with a window, else all full."""
    if types is None:
        return ["sliding_attention" if window else "full_attention"] * n_layer
    if len(types) != n_layer or set(types) - {"full_attention", "sliding_attention"}:
        raise InputError(
            f"layer_types must name full_attention or sliding_attention for each of the {n_layer} layers, not {types}"
        )
    if "sliding_attention" in types and not window:
        raise InputError("layer_types names sliding_attention layers but sliding_window is not set: give its size")
    return list(types)
