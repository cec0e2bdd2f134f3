"""Multi-head self-attention (Vaswani et al. 2017), shared by the DiT, the CLIP towers and the UNet.

q, k and v come from one fused matmul laid out [q heads | k heads | v heads]: the layout of DiT's
``qkv``, OpenAI CLIP's ``in_proj`` and GPT-2's ``c_attn`` weights, so those load as they are. The heads
reach ``scaled_dot_product_attention`` as (B, h, T, d) views with unit stride along d, which is what
PyTorch's fused kernels (flash, memory-efficient) require: heads strided along d (the UNet's, taken from
a (B, 3C, HW) convolution output) send SDPA to its math kernel, which materialises every T x T score
matrix (64% of the UNet's forward before this layer; tests/gpt/test_attention_kernels.py guards the layout).

Notation: B batch, T tokens, D width, h heads, d = D / h head size.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def split_heads(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """(B, T, 3D) laid out [q | k | v] -> q, k, v as (B, h, T, d) views with unit stride along d."""
    b, t, three_d = qkv.shape
    q, k, v = qkv.view(b, t, 3, num_heads, three_d // (3 * num_heads)).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v


def merge_heads(y: Tensor) -> Tensor:
    """(B, h, T, d) -> (B, T, h d), heads side by side as the output projection reads them."""
    b, h, t, d = y.shape
    return y.transpose(1, 2).reshape(b, t, h * d)


class SelfAttention(nn.Module):
    """(B, T, D) -> (B, T, D): every token attends to every token (or, ``causal``, to itself and earlier ones)."""

    def __init__(self, dim: int, num_heads: int, causal: bool = False, bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} does not split into {num_heads} heads")
        self.num_heads, self.causal = num_heads, causal
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = split_heads(self.qkv(x), self.num_heads)  # 3 x (B, h, T, d)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # (B, h, T, d)
        return self.proj(merge_heads(y))  # (B, T, D)
