"""The GPT's norms, each one class chosen by config like the attention and MLP variants (``norm: zoo.gpt.RMSNorm``).

The GPT builds every norm as ``norm(dim, eps)``. Each class states its Hugging Face layout (``hf_layout``) and
its ``config.json`` field (``hf_config()``), so the exporters ask it instead of testing its type; its weights keep
torch's names (``weight``, and ``bias`` for LayerNorm), which both layouts share. A new norm is one class here,
added to ``NormClass``.

References: LayerNorm: Ba et al. 2016 (GPT-2's). RMSNorm: Zhang & Sennrich 2019 (Llama's, DeepSeek's; Gemma's with a
1 + weight scale).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class LayerNorm(nn.LayerNorm):
    """LayerNorm with a weight and a bias (GPT-2's ``ln_1``, ``ln_2``, ``ln_f``)."""

    hf_layout = "gpt2"

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        """
        Args:
            dim: model width D (given by the GPT).
            eps: added to the variance (given by the GPT's ``norm_eps``).
        """
        super().__init__(dim, eps=eps)

    def hf_config(self) -> dict:
        return {"layer_norm_epsilon": self.eps}


class RMSNorm(nn.RMSNorm):
    """RMSNorm, a weight and no bias (Llama's ``input_layernorm``, ``post_attention_layernorm``, ``norm``)."""

    hf_layout = "llama"

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        """
        Args:
            dim: model width D (given by the GPT).
            eps: added to the mean square (given by the GPT's ``norm_eps``).
        """
        super().__init__(dim, eps=eps)

    def hf_config(self) -> dict:
        return {"rms_norm_eps": self.eps}


class GemmaRMSNorm(nn.Module):
    """RMSNorm scaling by 1 + weight, so a zero weight is the identity (Gemma's every norm, its q/k norms too),
    computed in float32 and cast back after the scale, as transformers' ``Gemma2RMSNorm``: its weights load as
    stored, exact in any dtype (folding 1 + w into a bf16 weight would round w to 1's precision)."""

    hf_layout = "gemma"
    identity_weight = 0.0  # what GPT.reset_parameters starts it at

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        """
        Args:
            dim: model width D (given by the GPT), or the head size for q/k norms.
            eps: added to the mean square (given by the GPT's ``norm_eps``).
        """
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)

    def hf_config(self) -> dict:
        return {"rms_norm_eps": self.eps}


# What GPT(norm=...) takes: a class called as cls(dim, eps); in YAML a class path.
NormClass = Callable[[int, float], LayerNorm | RMSNorm | GemmaRMSNorm]
