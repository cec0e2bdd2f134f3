"""DiT weights from outside: the published checkpoints (facebookresearch/DiT) and diffusers' layout.

The zoo's ``DiT`` keeps the reference implementation's parameter names, so a published ``DiT-XL-2-256x256.pt``
loads as it is (its ``pos_embed`` is a fixed table the net rebuilds, so that key is dropped). diffusers'
``DiTTransformer2DModel`` stores the same numbers under other names: q, k and v as three matrices, and a
copy of the step and label embedders in every block (identical after diffusers' own conversion script;
block 0's is used). ``from_diffusers`` maps them back. Loading is weights-only (``zoo.layers.weights``).

diffusers computes the step features with ``downscale_freq_shift=1``, not the reference's 0: build the
net with ``time_freq_shift=1`` to reproduce a diffusers model's outputs, 0 (default) for DiT's own.

    net = DiT("XL", 2, image_size=32, in_channels=4, num_classes=1000, learn_sigma=True)
    load_dit_weights(net, "DiT-XL-2-256x256.pt")                                   # published
    load_dit_weights(net, "transformer/diffusion_pytorch_model.safetensors")      # diffusers
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from zoo.layers.weights import check_compatible, extract_state_dict, load_file


def from_diffusers(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A ``DiTTransformer2DModel`` state dict in the reference DiT's key layout."""
    emb = "transformer_blocks.0.norm1.emb."
    out = {
        "x_embedder.proj.weight": state["pos_embed.proj.weight"],
        "x_embedder.proj.bias": state["pos_embed.proj.bias"],
        "t_embedder.mlp.0.weight": state[emb + "timestep_embedder.linear_1.weight"],
        "t_embedder.mlp.0.bias": state[emb + "timestep_embedder.linear_1.bias"],
        "t_embedder.mlp.2.weight": state[emb + "timestep_embedder.linear_2.weight"],
        "t_embedder.mlp.2.bias": state[emb + "timestep_embedder.linear_2.bias"],
        "final_layer.adaLN_modulation.1.weight": state["proj_out_1.weight"],
        "final_layer.adaLN_modulation.1.bias": state["proj_out_1.bias"],
        "final_layer.linear.weight": state["proj_out_2.weight"],
        "final_layer.linear.bias": state["proj_out_2.bias"],
    }
    if emb + "class_embedder.embedding_table.weight" in state:
        out["y_embedder.embedding_table.weight"] = state[emb + "class_embedder.embedding_table.weight"]
    depth = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("transformer_blocks."))
    for i in range(depth):
        d, z = f"transformer_blocks.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            qkv = [state[f"{d}attn1.to_{n}.{kind}"] for n in "qkv"]
            out[f"{z}attn.qkv.{kind}"] = torch.cat(qkv)  # rows [q; k; v], as the reference's fused Linear
            out[f"{z}attn.proj.{kind}"] = state[f"{d}attn1.to_out.0.{kind}"]
            out[f"{z}mlp.fc1.{kind}"] = state[f"{d}ff.net.0.proj.{kind}"]
            out[f"{z}mlp.fc2.{kind}"] = state[f"{d}ff.net.2.{kind}"]
            out[f"{z}adaLN_modulation.1.{kind}"] = state[f"{d}norm1.linear.{kind}"]
    return out


def load_dit_weights(net: nn.Module, path: str | Path) -> nn.Module:
    """Load a published DiT checkpoint (``.pt``) or a diffusers transformer (``.safetensors``/``.bin``) into ``net``."""
    state = load_file(path)
    if isinstance(state.get("ema"), Mapping):  # DiT's training checkpoints: {"model", "ema", "opt", "args"}
        state = state["ema"]
    state = extract_state_dict(state)
    if any(k.startswith("transformer_blocks.") for k in state):
        state = from_diffusers(state)
    state = {k: v for k, v in state.items() if k != "pos_embed"}  # a fixed table the net rebuilds
    check_compatible(net, state, f"DiT weights {str(path)!r}")
    net.load_state_dict(state)
    return net
