"""DiT: a Vision Transformer denoiser with adaLN-Zero conditioning (Peebles & Xie 2023, "Scalable
Diffusion Models with Transformers"), read top-down: patchify -> blocks -> final layer -> unpatchify.

The image is cut into p x p patches embedded as tokens, plus a fixed 2-D sin-cos position embedding
(MAE's, He et al. 2022). The step and the label embeddings are summed into one conditioning vector c
that regresses, per block, a shift, a scale and a gate for each of the two sub-layers (adaLN); the
regression starts at zero, so every block starts as the identity ("adaLN-Zero", sec. 3.2). Label
``num_classes`` is the null class of classifier-free guidance.

Model sizes of the paper's table 1, chosen by name and combined with a patch size (``DiT.preset("S/2")``):

    size  depth  hidden  heads   Gflops at 256px, patch 2/4/8 (paper)
    S     12     384     6       6.1 / 1.4 / 0.36
    B     12     768     12      23  / 5.6 / 1.4
    L     24     1024    16      80  / 19  / 4.9
    XL    28     1152    16      119 / 29  / 7.5

``depth``, ``hidden_size`` and ``num_heads`` override the preset (tiny test nets). The paper's
``learn_sigma`` adds a second output half, the variance of Nichol & Dhariwal 2021 (as the published
checkpoints have it): ``DiffusionModule`` trains it with their hybrid loss and the samplers use it.

Notation: B batch, C channels, H = W = image side, p patch side, N = (H/p)^2 tokens, D hidden width.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.diffusion.embeddings import LabelEmbedder, TimestepEmbedder
from zoo.nn.attention import SelfAttention

SIZES: dict[str, tuple[int, int, int]] = {  # name: (depth, hidden_size, num_heads)
    "S": (12, 384, 6),
    "B": (12, 768, 12),
    "L": (24, 1024, 16),
    "XL": (28, 1152, 16),
}


def sincos_2d(dim: int, grid: int) -> Tensor:
    """(grid^2, dim) fixed position embedding: half the features encode the row, half the column (MAE)."""
    if dim % 4:
        raise ValueError(f"hidden size {dim} must be divisible by 4 for the 2-D sin-cos embedding")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))  # (D/4,)
    coords = torch.arange(grid, dtype=torch.float64)
    h, w = torch.meshgrid(coords, coords, indexing="ij")  # (grid, grid) each; MAE embeds w first

    def encode(pos: Tensor) -> Tensor:
        out = pos.reshape(-1, 1) * omega  # (grid^2, D/4)
        return torch.cat([out.sin(), out.cos()], dim=1)  # (grid^2, D/2)

    return torch.cat([encode(w), encode(h)], dim=1).float()  # (grid^2, D)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]  # (B, N, D) with (B, D) shift and scale


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    """x + gate_a * attn(adaLN(x)), then x + gate_m * mlp(adaLN(x)); six (B, D) modulations from c."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, mlp_norm_eps: float = 1e-6) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(dim, num_heads)  # over the N tokens
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=mlp_norm_eps)
        self.mlp = MLP(dim, int(dim * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        # Its own step and label embedders (``DiT(block_embedders=True)``); None: the net's, shared by every block.
        self.t_embedder: TimestepEmbedder | None = None
        self.y_embedder: LabelEmbedder | None = None

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.adaLN_modulation(c).chunk(6, dim=1)  # (B, D) each
        x = x + gate_a[:, None] * self.attn(modulate(self.norm1(x), shift_a, scale_a))
        return x + gate_m[:, None] * self.mlp(modulate(self.norm2(x), shift_m, scale_m))  # (B, N, D)


class FinalLayer(nn.Module):
    """adaLN (shift, scale) then a linear map from each token to its p*p*C_out patch values."""

    def __init__(self, dim: int, patch_size: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))  # (B, N, p*p*C_out)


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, N, D): a p x p convolution with stride p."""

    def __init__(self, patch_size: int, in_channels: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class DiT(nn.Module):
    """(x_t (B, C, H, W), t (B,), y (B,) or None) -> (B, C, H, W) (2C with ``learn_sigma``)."""

    def __init__(
        self,
        size: Literal["S", "B", "L", "XL"] = "S",
        patch_size: Literal[2, 4, 8] = 2,
        image_size: int = 32,
        in_channels: int = 4,
        num_classes: int = 1000,
        depth: int | None = None,
        hidden_size: int | None = None,
        num_heads: int | None = None,
        mlp_ratio: float = 4.0,
        learn_sigma: bool = False,
        time_freq_shift: float = 0.0,
        mlp_norm_eps: float = 1e-6,
        block_embedders: bool = False,
    ) -> None:
        """
        Args:
            size: the paper's model size (see ``SIZES``): S, B, L or XL.
            patch_size: p, the side of the square patches that become tokens (2, 4 or 8 in the paper).
            image_size: side of the square inputs (32 for the paper's 256px images in SD's VAE latents).
            in_channels: C (4 for VAE latents, 3 for RGB pixels).
            num_classes: K > 0 adds a label embedding with K + 1 rows (label K = null class); 0: unconditional.
            depth: number of blocks; None: the preset's.
            hidden_size: token width D; None: the preset's.
            num_heads: attention heads; None: the preset's.
            mlp_ratio: MLP hidden width as a multiple of D.
            learn_sigma: also output C channels of variance interpolation (Nichol & Dhariwal 2021; the published
                checkpoints do), trained by the module's hybrid loss and used by the samplers.
            time_freq_shift: 0 as in DiT; 1 reproduces diffusers' DiTTransformer2DModel, whose step features
                use slightly different frequencies (``downscale_freq_shift=1``) than the weights were trained with.
            mlp_norm_eps: eps of the LayerNorm before each block's MLP: 1e-6 in DiT; diffusers' ``norm_eps`` (its
                default 1e-5) sets it there and nowhere else.
            block_embedders: each block after the first has its own step and label embedders, as diffusers'
                DiTTransformer2DModel has (a copy per block; the first block's also condition the final layer):
                what a DiT trained or fine-tuned in diffusers needs. False: one pair for all, as in the paper.
        """
        super().__init__()
        p_depth, p_dim, p_heads = SIZES[size]
        depth, dim, heads = depth or p_depth, hidden_size or p_dim, num_heads or p_heads
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not divisible by patch_size {patch_size}")
        self.in_channels, self.image_size, self.num_classes = in_channels, image_size, num_classes
        self.patch_size, self.out_channels = patch_size, in_channels * (2 if learn_sigma else 1)
        self.x_embedder = PatchEmbed(patch_size, in_channels, dim)
        self.t_embedder = TimestepEmbedder(dim, freq_shift=time_freq_shift)
        self.y_embedder = LabelEmbedder(num_classes, dim) if num_classes > 0 else None
        grid = image_size // patch_size
        self.register_buffer("pos_embed", sincos_2d(dim, grid)[None], persistent=False)  # (1, N, D), fixed
        self.blocks = nn.ModuleList(DiTBlock(dim, heads, mlp_ratio, mlp_norm_eps) for _ in range(depth))
        for block in self.blocks[1:] if block_embedders else ():
            block.t_embedder = TimestepEmbedder(dim, freq_shift=time_freq_shift)
            block.y_embedder = LabelEmbedder(num_classes, dim) if num_classes > 0 else None
        self.final_layer = FinalLayer(dim, patch_size, self.out_channels)
        self.reset_parameters()

    @classmethod
    def preset(cls, name: str, **kwargs) -> DiT:
        """``DiT.preset("S/2", image_size=32, in_channels=3, num_classes=6)``: a table-1 size and a patch size."""
        size, patch = name.split("/")
        return cls(size=size, patch_size=int(patch), **kwargs)

    def reset_parameters(self) -> None:
        """The reference initialisation: Xavier-uniform linears, N(0, 0.02) embeddings, zero adaLN and output."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        w = self.x_embedder.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))  # as a linear map of the flattened patch
        nn.init.zeros_(self.x_embedder.proj.bias)
        for owner in (self, *(b for b in self.blocks if b.t_embedder is not None)):
            if owner.y_embedder is not None:
                nn.init.normal_(owner.y_embedder.embedding_table.weight, std=0.02)
            for layer in (owner.t_embedder.mlp[0], owner.t_embedder.mlp[2]):
                nn.init.normal_(layer.weight, std=0.02)
        zero_init = [b.adaLN_modulation[-1] for b in self.blocks]
        for mod in zero_init + [self.final_layer.adaLN_modulation[-1], self.final_layer.linear]:
            nn.init.zeros_(mod.weight)  # adaLN-Zero: every block is the identity at init
            nn.init.zeros_(mod.bias)

    def io_layers(self) -> tuple[str, ...]:
        """The patch embedding and the output projection: Muon takes the hidden matrices (adaLN included)."""
        return ("x_embedder", "final_layer.linear")

    def condition(self, t: Tensor, y: Tensor | None, owner: nn.Module | None = None) -> Tensor:
        """c = embed(t) + embed(y), (B, D), by the net's embedders or ``owner``'s (a block with its own); a
        conditional net given no label uses the null class."""
        owner = self if owner is None else owner
        c = owner.t_embedder(t)
        if owner.y_embedder is not None:
            if y is None:
                y = torch.full_like(t, self.num_classes, dtype=torch.long)
            c = c + owner.y_embedder(y)
        return c

    def unpatchify(self, x: Tensor) -> Tensor:
        """(B, N, p*p*C_out) -> (B, C_out, H, W)."""
        b, p, c = x.shape[0], self.patch_size, self.out_channels
        g = self.image_size // p
        x = x.view(b, g, g, p, p, c)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(b, c, g * p, g * p)

    def forward(self, x: Tensor, t: Tensor, y: Tensor | None = None) -> Tensor:
        h = self.x_embedder(x) + self.pos_embed  # (B, N, D)
        c = self.condition(t, y)  # (B, D)
        for block in self.blocks:
            h = block(h, c if block.t_embedder is None else self.condition(t, y, block))
        return self.unpatchify(self.final_layer(h, c))  # (B, C_out, H, W)
