"""GPT language models: MHA/GQA/MLA decoder, causal-LM and DPO objectives, cached generation, pretrained Hugging
Face folders."""

from zoo.gpt.attention import MHA, MLA
from zoo.gpt.generate import Generation, generate
from zoo.gpt.gpt import GPT
from zoo.gpt.mlp import GeluMLP, SwiGLU
from zoo.gpt.module import CausalLMModule
from zoo.gpt.moe import MoE
from zoo.gpt.norms import LayerNorm, RMSNorm
from zoo.gpt.pretrained import from_pretrained
from zoo.gpt.tune.dpo import DPOModule
from zoo.gpt.tune.grpo import GRPOModule

__all__ = [
    "GPT",
    "MHA",
    "MLA",
    "CausalLMModule",
    "DPOModule",
    "GRPOModule",
    "GeluMLP",
    "Generation",
    "LayerNorm",
    "MoE",
    "RMSNorm",
    "SwiGLU",
    "from_pretrained",
    "generate",
]
