"""CLIP's two towers: a Vision Transformer for images and a causal Transformer for text.

References:
  ViT: Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words" (patch embedding, class token,
    learned positions, pre-norm blocks).
  CLIP: Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision":
    an extra LayerNorm before the image blocks (``ln_pre``), the text tower as a causal transformer
    whose feature is the final-LayerNorm output at the end-of-text token, linear projections with no
    bias into the joint space, QuickGELU (x * sigmoid(1.702 x)) in the original weights.
  Attention pooling: Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training" (SigLIP's MAP
    head: one learned query attends over all patch tokens, then a residual MLP; no class token). SigLIP's towers
    also drop CLIP's ``ln_pre``, give the patch embedding a bias, have no image projection (the head's output is
    the feature), and read the text tower bidirectionally at its last position into a linear head with a bias.

Both towers return unnormalised (B, E) features; ``clip.CLIP`` normalises them. Parameter names
follow OpenAI's CLIP (``class_embedding``, ``positional_embedding``, ``ln_pre``, ``ln_post``), so
weight conversion reads as a renaming.

Notation: B batch, C channels, H/W image side, P patch side, N patches, T tokens, D tower width,
E joint embedding dim, h heads, d head size.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.nn.attention import SelfAttention

Activation = Literal["quick_gelu", "gelu", "gelu_tanh"]


def quick_gelu(x: Tensor) -> Tensor:
    """OpenAI CLIP's sigmoid approximation of GELU; its released weights were trained with it."""
    return x * torch.sigmoid(1.702 * x)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation (Hendrycks and Gimpel 2016), SigLIP's ``gelu_pytorch_tanh``."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"quick_gelu": quick_gelu, "gelu": F.gelu, "gelu_tanh": gelu_tanh}


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: Activation) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.proj = nn.Linear(hidden, dim)
        self.act = ACTIVATIONS[act]

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, dim: int, n_head: int, mlp_ratio: float, act: Activation, causal: bool, eps: float) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(dim, eps=eps), SelfAttention(dim, n_head, causal)
        self.ln_2, self.mlp = nn.LayerNorm(dim, eps=eps), MLP(dim, round(dim * mlp_ratio), act)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def init_blocks(blocks: nn.ModuleList, width: int) -> None:
    """CLIP's initialisation: attention std D^-1/2, residual projections scaled by (2 x layers)^-1/2."""
    attn_std, proj_std, fc_std = width**-0.5, width**-0.5 * (2 * len(blocks)) ** -0.5, (2 * width) ** -0.5
    for blk in blocks:
        nn.init.normal_(blk.attn.qkv.weight, std=attn_std)
        nn.init.normal_(blk.attn.proj.weight, std=proj_std)
        nn.init.normal_(blk.mlp.fc.weight, std=fc_std)
        nn.init.normal_(blk.mlp.proj.weight, std=proj_std)
        for lin in (blk.attn.qkv, blk.attn.proj, blk.mlp.fc, blk.mlp.proj):
            nn.init.zeros_(lin.bias)


class AttentionPool(nn.Module):
    """One learned query attends over all tokens; with ``mlp`` then x + mlp(ln(x)) (SigLIP's whole MAP head)."""

    def __init__(self, dim: int, n_head: int, mlp: MLP | None = None, eps: float = 1e-5) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, 1, dim) * dim**-0.5)
        self.attn = nn.MultiheadAttention(dim, n_head, batch_first=True)
        if mlp is not None:
            self.ln, self.mlp = nn.LayerNorm(dim, eps=eps), mlp

    def forward(self, x: Tensor) -> Tensor:
        q = self.query.expand(x.shape[0], -1, -1)  # (B, 1, D)
        pooled = self.attn(q, x, x, need_weights=False)[0][:, 0]  # (B, D)
        return pooled + self.mlp(self.ln(pooled)) if hasattr(self, "mlp") else pooled


def conv_stem(in_channels: int, width: int, patch_size: int) -> nn.Sequential:
    """Stride-2 3x3 convolutions down to 1/patch_size resolution, then a 1x1 to the width (Xiao et al. 2021,
    "Early Convolutions Help Transformers See Better"): a ViT on small data learns shapes far sooner."""
    n = patch_size.bit_length() - 1
    if patch_size != 2**n or n == 0:
        raise ValueError(f"stem='conv' needs a power-of-two patch_size > 1, got {patch_size}")
    chans = [in_channels] + [max(width // 2 ** (n - i), 8) for i in range(1, n + 1)]
    layers: list[nn.Module] = []
    for a, b in zip(chans[:-1], chans[1:]):
        layers += [nn.Conv2d(a, b, 3, stride=2, padding=1), nn.GELU()]
    return nn.Sequential(*layers, nn.Conv2d(chans[-1], width, 1, bias=False))


class VisionTransformer(nn.Module):
    """Images (B, C, H, W) -> features (B, E): patches, [class token], blocks, pooled, projected."""

    def __init__(
        self,
        image_size: int = 224,
        patch_size: int = 16,
        in_channels: int = 3,
        width: int = 768,
        layers: int = 12,
        heads: int = 12,
        mlp_ratio: float = 4.0,
        embed_dim: int = 512,
        pool: Literal["cls", "attention", "map"] = "cls",
        stem: Literal["patch", "conv"] = "patch",
        act: Activation = "gelu",
        norm_eps: float = 1e-5,
        pre_norm: bool = True,
        patch_bias: bool = False,
        projection: bool = True,
        drop_remainder: bool = False,
    ) -> None:
        """
        Args:
            image_size: side of the square input images (positions are learned for this size).
            patch_size: side P of the square patches; image_size must be a multiple of it.
            in_channels: image channels.
            width: tower width D.
            layers: transformer blocks.
            heads: attention heads (width must be divisible by it).
            mlp_ratio: MLP hidden width as a multiple of D.
            embed_dim: joint embedding dim E the features are projected to.
            pool: ``cls`` reads a class token (CLIP); ``attention`` pools with a learned query; ``map`` with a learned
                query and a residual MLP (SigLIP's head).
            stem: ``patch`` embeds each patch with one strided convolution (ViT, CLIP); ``conv`` with a few
                stride-2 3x3 convolutions (needs a power-of-two patch_size; no pretrained weights use it).
            act: MLP activation; quick_gelu to load OpenAI's weights, gelu_tanh SigLIP's.
            norm_eps: LayerNorm epsilon.
            pre_norm: a LayerNorm on the embedded patches before the blocks (CLIP's ``ln_pre``; SigLIP has none).
            patch_bias: the patch embedding has a bias (SigLIP).
            projection: a linear projection to ``embed_dim``; without one (SigLIP) the pooled width is the feature,
                and ``embed_dim`` must equal ``width``.
            drop_remainder: an image_size that is not a multiple of patch_size drops the pixels past the last whole
                patch (a strided convolution without padding, as SigLIP's so400m-patch14-384 does: 384 = 27 x 14 + 6).
        """
        super().__init__()
        if not projection and embed_dim != width:
            raise ValueError(f"projection=False needs embed_dim equal to width, got {embed_dim} and {width}")
        if image_size % patch_size and not drop_remainder:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        self.embed_dim, self.pool, self.image_size = embed_dim, pool, image_size
        n_tokens = (image_size // patch_size) ** 2 + (pool == "cls")
        scale = width**-0.5
        if stem == "conv":
            self.conv1 = conv_stem(in_channels, width, patch_size)
        else:
            self.conv1 = nn.Conv2d(in_channels, width, patch_size, stride=patch_size, bias=patch_bias)
        if pool == "cls":
            self.class_embedding = nn.Parameter(scale * torch.randn(width))
        self.positional_embedding = nn.Parameter(scale * torch.randn(n_tokens, width))
        self.ln_pre = nn.LayerNorm(width, eps=norm_eps) if pre_norm else nn.Identity()
        self.blocks = nn.ModuleList(Block(width, heads, mlp_ratio, act, False, norm_eps) for _ in range(layers))
        self.ln_post = nn.LayerNorm(width, eps=norm_eps)
        head_mlp = MLP(width, round(width * mlp_ratio), act) if pool == "map" else None
        self.attn_pool = AttentionPool(width, heads, head_mlp, norm_eps) if pool != "cls" else None
        self.proj = nn.Linear(width, embed_dim, bias=False) if projection else nn.Identity()
        init_blocks(self.blocks, width)
        if projection:
            nn.init.normal_(self.proj.weight, std=scale)

    def no_weight_decay(self) -> tuple[str, ...]:
        return ("class_embedding", "positional_embedding", "attn_pool.query")

    def io_layers(self) -> tuple[str, ...]:
        """The patch embedding (or conv stem) and the projection to the joint space: not hidden, so not Muon's."""
        return ("conv1", "proj")

    def forward(self, images: Tensor) -> Tensor:
        x = self.conv1(images).flatten(2).transpose(1, 2)  # (B, N, D)
        if self.pool == "cls":
            x = torch.cat([self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1), x], dim=1)  # (B, 1 + N, D)
        x = self.ln_pre(x + self.positional_embedding.to(x.dtype))
        for blk in self.blocks:
            x = blk(x)
        pooled = self.ln_post(x[:, 0]) if self.pool == "cls" else self.attn_pool(self.ln_post(x))  # (B, D)
        return self.proj(pooled)  # (B, E)


class TextTransformer(nn.Module):
    """Token ids (B, T) -> features (B, E): causal blocks, final norm, read at the first end-of-text token."""

    def __init__(
        self,
        vocab_size: int = 257,
        context_length: int = 77,
        width: int = 512,
        layers: int = 12,
        heads: int = 8,
        mlp_ratio: float = 4.0,
        embed_dim: int = 512,
        eot_id: int = 256,
        act: Activation = "gelu",
        norm_eps: float = 1e-5,
        causal: bool = True,
        pool: Literal["eot", "last"] = "eot",
        proj_bias: bool = False,
    ) -> None:
        """
        Args:
            vocab_size: token ids (257 for the zoo's byte tokenizer: 256 bytes and EOS).
            context_length: longest token sequence T (positions are learned up to it).
            width: tower width D.
            layers: transformer blocks.
            heads: attention heads (width must be divisible by it).
            mlp_ratio: MLP hidden width as a multiple of D.
            embed_dim: joint embedding dim E the features are projected to.
            eot_id: the end-of-text id whose first occurrence is read out (256: the byte tokenizer's EOS);
                a sequence without it is read at its last position.
            act: MLP activation; quick_gelu to load OpenAI's weights, gelu_tanh SigLIP's.
            norm_eps: LayerNorm epsilon.
            causal: each token attends to itself and earlier ones (CLIP); False: to every token (SigLIP).
            pool: ``eot`` reads the first end-of-text token (CLIP); ``last`` the last position, whatever it holds
                (SigLIP, whose texts are always padded to ``context_length``).
            proj_bias: the projection to the joint space has a bias (SigLIP's text ``head``).
        """
        super().__init__()
        self.pool = pool
        self.vocab_size, self.context_length, self.embed_dim, self.eot_id = (
            vocab_size,
            context_length,
            embed_dim,
            eot_id,
        )
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(context_length, width))
        self.blocks = nn.ModuleList(Block(width, heads, mlp_ratio, act, causal, norm_eps) for _ in range(layers))
        self.ln_final = nn.LayerNorm(width, eps=norm_eps)
        self.proj = nn.Linear(width, embed_dim, bias=proj_bias)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        init_blocks(self.blocks, width)
        nn.init.normal_(self.proj.weight, std=width**-0.5)
        if proj_bias:
            nn.init.zeros_(self.proj.bias)

    def no_weight_decay(self) -> tuple[str, ...]:
        return ("positional_embedding",)

    def io_layers(self) -> tuple[str, ...]:
        """The token embedding and the projection to the joint space: not hidden, so not Muon's."""
        return ("token_embedding", "proj")

    def eot_positions(self, ids: Tensor) -> Tensor:
        """(B,) index of each row's first end-of-text token, or its last position when there is none (or ``pool`` is
        ``last``)."""
        if self.pool == "last":
            return torch.full(ids.shape[:1], ids.shape[1] - 1, device=ids.device)
        is_eot = ids == self.eot_id
        first = is_eot.int().argmax(dim=-1)
        return torch.where(is_eot.any(dim=-1), first, ids.shape[1] - 1)

    def forward(self, ids: Tensor) -> Tensor:
        t = ids.shape[1]
        if t > self.context_length:
            raise ValueError(f"{t} tokens exceed the text tower's context_length {self.context_length}")
        x = self.token_embedding(ids) + self.positional_embedding[:t]  # (B, T, D)
        for blk in self.blocks:
            x = blk(x)  # causal: positions after the end-of-text token (padding) never reach it (SigLIP: they do)
        pooled = x[torch.arange(x.shape[0], device=x.device), self.eot_positions(ids)]  # (B, D)
        return self.proj(self.ln_final(pooled))  # (B, E); LayerNorm is per token, so norm after the read-out
