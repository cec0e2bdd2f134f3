"""The GPT's feed-forward parts, each one class chosen by config like the attention variants:

    mlp:
      class_path: zoo.gpt.mlp.GeluMLP
      init_args: {approximate: exact}

The GPT builds every MLP as ``mlp(dim, hidden, bias, dropout)`` (``hidden`` None: the class's own default width);
``init_args`` hold only the class's own settings. Every MLP's ``forward`` returns (output (B, T, D), its auxiliary
loss term or None): the mixture of experts' router returns its balance term there, which ``losses.causal_lm_objective``
adds to the training loss (a dense MLP has none). Each class describes
itself to the rest of the zoo instead of being recognised by type: ``flops_per_token()`` is an MLP's share of
``GPT.flops_per_token``, ``residual_projections()`` the weights GPT-2 initialises scaled by depth, and
``hf_layout``, ``hf_config()``/``from_hf_config()``, ``to_hf()``/``from_hf()`` its names in Hugging Face's GPT-2
or Llama layout (``hf.py``, ``llama.py``). A new MLP is one class, added to ``gpt.MLPClass``; the mixture of
experts (``moe.py``, whose ``flops_per_token`` counts the experts a token visits) is one.

References:
  GPT-2: Radford et al. 2019 (GELU MLP 4D wide, LayerNorm). SwiGLU: Shazeer 2020, "GLU Variants Improve
  Transformer" (hidden 8D/3 keeps the parameters of a 4D GELU MLP; GeGLU, its GELU-gated form, is Gemma's).

Notation: B batch, T tokens, D model width, F hidden width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# transformers' GPT-2 activation names -> GeluMLP(approximate=...): GPT-2's own weights use the tanh form.
_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "exact"}


class GeluMLP(nn.Module):
    """GPT-2's MLP: fc (D -> F), GELU, proj (F -> D)."""

    hf_layout = "gpt2"  # the Hugging Face architecture whose MLP this is (GPT2LMHeadModel)

    def __init__(
        self,
        dim: int,
        hidden: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        approximate: Literal["exact", "tanh"] = "tanh",
    ) -> None:
        """
        Args:
            dim: model width D (given by the GPT).
            hidden: hidden width F (given by the GPT's ``mlp_hidden``); None: 4D.
            bias: biases in both projections (given by the GPT).
            dropout: dropout on the output (given by the GPT).
            approximate: "exact" (erf; nanoGPT, new models) or "tanh", GPT-2's approximation ("gelu_new"), which
                its weights were trained with. The default stays "tanh" so checkpoints saved before this option
                existed rebuild as trained; the configs say "exact", 2.3x cheaper on a CPU (issue 16).
        """
        super().__init__()
        hidden = hidden or 4 * dim
        self.approximate = approximate if approximate == "tanh" else "none"  # F.gelu's name for the choice
        self.fc = nn.Linear(dim, hidden, bias=bias)
        self.proj = nn.Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> tuple[Tensor, None]:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate=self.approximate))), None  # (B, T, D), no aux loss

    def flops_per_token(self) -> int:
        """Training FLOPs per token of its two matmuls, forward and backward (6 per weight)."""
        return 6 * (self.fc.weight.numel() + self.proj.weight.numel())

    def residual_projections(self) -> list[Tensor]:
        """The weights writing into the residual stream, which GPT-2 initialises with std 0.02/sqrt(2L)."""
        return [self.proj.weight]

    @classmethod
    def from_hf_config(cls, config: dict) -> Callable[..., GeluMLP]:
        """This class with the settings of a Hugging Face ``GPT2Config`` dict."""
        act = config.get("activation_function", "gelu_new")
        if act not in _GELU:
            raise ValueError(f"Only GELU (tanh or exact) is supported, the config has activation_function={act!r}")
        return partial(cls, approximate=_GELU[act])

    def hf_config(self) -> dict:
        return {
            "activation_function": "gelu_new" if self.approximate == "tanh" else "gelu",
            "n_inner": self.proj.in_features,
        }

    def to_hf(self, sd: dict[str, Tensor]) -> dict[str, Tensor]:
        """Our keys (``fc.weight``, ...) -> GPT-2's inside a layer; its ``Conv1D`` stores weights as (in, out)."""
        return {f"mlp.c_{k}": (v.t().contiguous() if k.endswith("weight") else v) for k, v in sd.items()}

    def from_hf(self, sd: dict[str, Tensor]) -> dict[str, Tensor]:
        """The inverse of ``to_hf``: a GPT-2 layer's keys (``mlp.c_fc.weight``, ...) -> ours."""
        return {
            k.removeprefix("mlp.c_"): (sd[k].t().contiguous() if k.endswith("weight") else sd[k])
            for k in sd
            if k.startswith("mlp.")
        }


class SwiGLU(nn.Module):
    """Gated MLP: silu(x W_gate) * (x W_up), then proj; gate and up fused in one matmul ``fc`` = [gate | up]."""

    hf_layout = "llama"  # LlamaForCausalLM's MLP, also DeepSeek-V3's dense layers

    def __init__(self, dim: int, hidden: int | None = None, bias: bool = True, dropout: float = 0.0) -> None:
        """
        Args:
            dim: model width D (given by the GPT).
            hidden: hidden width F (given by the GPT's ``mlp_hidden``); None: 8D/3 rounded up to a multiple of 64.
            bias: biases in the projections (given by the GPT).
            dropout: dropout on the output (given by the GPT).
        """
        super().__init__()
        hidden = hidden or 64 * math.ceil(8 * dim / 3 / 64)
        self.fc = nn.Linear(dim, 2 * hidden, bias=bias)
        self.proj = nn.Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> tuple[Tensor, None]:
        gate, up = self.fc(x).chunk(2, dim=-1)  # (B, T, F) each
        return self.drop(self.proj(F.silu(gate) * up)), None  # (B, T, D), no aux loss

    def flops_per_token(self) -> int:
        """Training FLOPs per token of its matmuls (gate, up, down), forward and backward."""
        return 6 * (self.fc.weight.numel() + self.proj.weight.numel())

    def residual_projections(self) -> list[Tensor]:
        """The weights writing into the residual stream, which GPT-2 initialises with std 0.02/sqrt(2L)."""
        return [self.proj.weight]

    @classmethod
    def from_hf_config(cls, config: dict) -> Callable[..., SwiGLU]:
        """This class with the settings of a Hugging Face Llama or DeepSeek-V3 config dict."""
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Only SwiGLU (hidden_act='silu') is supported, the config has {config['hidden_act']!r}")
        return cls

    def hf_config(self) -> dict:
        return {
            "hidden_act": "silu",
            "intermediate_size": self.proj.in_features,
            "mlp_bias": self.proj.bias is not None,
        }

    def to_hf(self, sd: dict[str, Tensor]) -> dict[str, Tensor]:
        """Our keys -> Llama's inside a layer: ``fc`` splits into gate_proj and up_proj, ``proj`` is down_proj."""
        out = {}
        for kind in ("weight", "bias"):
            if f"fc.{kind}" in sd:
                out[f"mlp.gate_proj.{kind}"], out[f"mlp.up_proj.{kind}"] = sd[f"fc.{kind}"].chunk(2)
                out[f"mlp.down_proj.{kind}"] = sd[f"proj.{kind}"]
        return out

    def from_hf(self, sd: dict[str, Tensor]) -> dict[str, Tensor]:
        """The inverse of ``to_hf``."""
        out = {}
        for kind in ("weight", "bias"):
            if f"mlp.gate_proj.{kind}" in sd:
                out[f"fc.{kind}"] = torch.cat((sd[f"mlp.gate_proj.{kind}"], sd[f"mlp.up_proj.{kind}"]))
                out[f"proj.{kind}"] = sd[f"mlp.down_proj.{kind}"]
        return out


class GeGLU(SwiGLU):
    """Gated MLP with a GELU gate: gelu(x W_gate) * (x W_up), then proj, laid out as ``SwiGLU`` (``fc`` = [gate | up],
    Llama's gate_proj, up_proj, down_proj names): Gemma's MLP (``hidden_activation: gelu_pytorch_tanh``)."""

    hf_layout = "gemma"

    def __init__(
        self,
        dim: int,
        hidden: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        approximate: Literal["exact", "tanh"] = "tanh",
    ) -> None:
        """
        Args:
            dim, hidden, bias, dropout: as ``SwiGLU``'s (given by the GPT).
            approximate: the GELU, "tanh" (Gemma's gelu_pytorch_tanh) or "exact" (erf).
        """
        super().__init__(dim, hidden, bias, dropout)
        self.approximate = "tanh" if approximate == "tanh" else "none"  # F.gelu's name for the choice

    def forward(self, x: Tensor) -> tuple[Tensor, None]:
        gate, up = self.fc(x).chunk(2, dim=-1)  # (B, T, F) each
        return self.drop(self.proj(F.gelu(gate, approximate=self.approximate) * up)), None  # (B, T, D), no aux loss

    @classmethod
    def from_hf_config(cls, config: dict) -> Callable[..., GeGLU]:
        """This class with the settings of a Hugging Face Gemma 2/3 config dict (``hidden_activation``)."""
        act = config.get("hidden_activation", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"hidden_activation {act!r}: the zoo's GeGLU has gelu_pytorch_tanh and gelu")
        return partial(cls, approximate="tanh" if act == "gelu_pytorch_tanh" else "exact")

    def hf_config(self) -> dict:
        return {
            "hidden_activation": "gelu_pytorch_tanh" if self.approximate == "tanh" else "gelu",
            "intermediate_size": self.proj.in_features,
        }


# What GPT(mlp=...) takes (``gpt.MLPClass`` names every class the CLI accepts, ``moe.MoE`` too).
MLPClass = Callable[[int, "int | None", bool, float], nn.Module]
