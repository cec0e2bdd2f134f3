"""Denoiser weights from outside: published DiT checkpoints (facebookresearch/DiT), diffusers' DiT and UNet layouts.

The zoo's ``DiT`` keeps the reference implementation's parameter names, so a published ``DiT-XL-2-256x256.pt``
loads as it is (its ``pos_embed`` is a fixed table the net rebuilds, so that key is dropped). diffusers'
``DiTTransformer2DModel`` stores the same numbers under other names: q, k and v as three matrices, and a
copy of the step and label embedders in every block (identical after diffusers' own conversion script;
block 0's is used). ``from_diffusers`` maps them back. Loading is weights-only (``zoo.io.weights``).

diffusers computes the step features with ``downscale_freq_shift=1``, not the reference's 0: build the
net with ``time_freq_shift=1`` to reproduce a diffusers model's outputs, 0 (default) for DiT's own.

    net = DiT("XL", 2, image_size=32, in_channels=4, num_classes=1000, learn_sigma=True)
    load_dit_weights(net, "DiT-XL-2-256x256.pt")                                   # published
    load_dit_weights(net, "transformer/diffusion_pytorch_model.safetensors")      # diffusers, one file
    load_dit_weights(net, "DiT-XL-2-256")                   # a diffusers save_pretrained folder (or its pipeline)

diffusers' ``UNet2DModel`` is DDPM's UNet too, block for block: ``unet_from_diffusers`` renames its keys to the
zoo's ``UNet`` (q, k, v fused as the shared attention layer keeps them). A UNet2DModel matches a ``UNet`` built
with ``block_out_channels = base_channels * channel_mults``, ``layers_per_block = num_res_blocks``, ``Attn*``
blocks at the ``attention_resolutions``, heads = channels / ``attention_head_dim`` alike at every attention
block, ``num_class_embeds = num_classes + 1`` and ``freq_shift=0`` (the zoo's UNet has no other step
frequencies); its ``flip_sin_to_cos=False`` (sin-first features) is undone by permuting the step MLP's columns.

``load_pretrained`` is what ``DiffusionModule(init_weights=...)`` calls: these for a DiT, a safetensors file
(or checkpoint) of the zoo's own keys for any other net.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from zoo.diffusion.dit import DiT
from zoo.errors import InputError
from zoo.io.files import file_in, read_json
from zoo.io.weights import check_compatible, extract_state_dict, load_file


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


_UNET_RENAMES = [  # (diffusers' UNet2DModel, the zoo's UNet), applied in order to each key
    (r"^time_embedding\.linear_1\.", "time_embed.mlp.0."),
    (r"^time_embedding\.linear_2\.", "time_embed.mlp.2."),
    (r"^class_embedding\.", "label_embed.embedding_table."),
    (r"^(down|up)_blocks\.(\d+)\.resnets\.", r"\1.\2.res."),
    (r"^(down|up)_blocks\.(\d+)\.attentions\.", r"\1.\2.attn."),
    (r"^down_blocks\.(\d+)\.downsamplers\.0\.", r"downsample.\1."),
    (r"^up_blocks\.(\d+)\.upsamplers\.0\.", r"upsample.\1."),
    (r"^mid_block\.resnets\.0\.", "mid_res1."),
    (r"^mid_block\.resnets\.1\.", "mid_res2."),
    (r"^mid_block\.attentions\.0\.", "mid_attn."),
    (r"\.time_emb_proj\.", ".emb."),
    (r"\.conv_shortcut\.", ".skip."),
    (r"\.group_norm\.", ".norm."),
    (r"\.to_out\.0\.", ".attn.proj."),
    (r"^conv_norm_out\.", "norm_out."),
]


def unet_from_diffusers(state: Mapping[str, Tensor], flip_sin_to_cos: bool = True) -> dict[str, Tensor]:
    """A ``UNet2DModel`` state dict in the zoo ``UNet``'s key layout (see the module docstring for the arguments)."""
    out: dict[str, Tensor] = {}
    for name, value in state.items():
        if re.search(r"\.to_[kv]\.", name):
            continue  # fused with to_q below
        if ".to_q." in name:  # rows [q; k; v], as the shared attention layer's fused Linear
            value = torch.cat([value, state[name.replace(".to_q.", ".to_k.")], state[name.replace(".to_q.", ".to_v.")]])
            name = name.replace(".to_q.", ".attn.qkv.")
        for pattern, repl in _UNET_RENAMES:
            name = re.sub(pattern, repl, name)
        out[name] = value
    if not flip_sin_to_cos:  # features [sin, cos]: the zoo's [cos, sin] are the same columns swapped in halves
        w = out["time_embed.mlp.0.weight"]
        out["time_embed.mlp.0.weight"] = torch.cat(w.chunk(2, dim=1)[::-1], dim=1)
    return out


def dit_args(state: Mapping[str, Tensor]) -> dict[str, int | bool]:
    """The ``DiT`` arguments a reference-layout state dict was made with, as far as shapes tell (not the heads)."""
    w = state["x_embedder.proj.weight"]  # (D, C, p, p)
    hidden, in_channels, patch = w.shape[0], w.shape[1], w.shape[2]
    table = state.get("y_embedder.embedding_table.weight")
    return {
        "depth": 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks.")),
        "hidden_size": hidden,
        "patch_size": patch,
        "in_channels": in_channels,
        "num_classes": table.shape[0] - 1 if table is not None else 0,  # the last row is the null class
        "learn_sigma": state["final_layer.linear.weight"].shape[0] == 2 * patch * patch * in_channels,
    }


def diffusers_weights_file(folder: Path) -> Path:
    """The weights of a diffusers ``save_pretrained`` folder (the transformer's, or a pipeline's ``transformer/``)."""
    for sub in (folder, folder / "transformer"):
        for name in (
            "diffusion_pytorch_model.safetensors",
            "diffusion_pytorch_model.safetensors.index.json",
            "diffusion_pytorch_model.bin",
        ):
            if (sub / name).is_file():
                return sub / name
    raise FileNotFoundError(
        f"{str(folder)!r} is a folder without diffusers weights: expected diffusion_pytorch_model.safetensors "
        "(or .bin, or a sharded .safetensors.index.json) in it or in its transformer/ subfolder, as "
        "DiTTransformer2DModel.save_pretrained writes them"
    )


def _load_sharded(index: Path) -> dict[str, Tensor]:
    """A sharded safetensors checkpoint: the union of the shards its index names."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise InputError(f"{str(index)!r} has no weight_map of tensor names to shard files")
    shards = sorted({file_in(index.parent, shard, f"the shard index {str(index)!r}") for shard in weight_map.values()})
    return {k: v for shard in shards for k, v in load_file(shard).items()}


def _check_heads(net: nn.Module, weights: Path) -> None:
    # The heads do not show in any shape, so a wrong count loads silently and computes something else.
    config = weights.parent / "config.json"
    heads = read_json(config).get("num_attention_heads") if config.is_file() else None
    if heads is not None and heads != net.blocks[0].attn.num_heads:
        raise ValueError(
            f"{str(config)!r} has num_attention_heads={heads} but the net has {net.blocks[0].attn.num_heads}: "
            f"set model.init_args.net.init_args.num_heads={heads}"
        )


def load_dit_weights(net: nn.Module, path: str | Path) -> nn.Module:
    """Load published DiT weights (``.pt``), a diffusers transformer (folder, ``.safetensors`` or ``.bin``), or
    a safetensors file of the zoo's own DiT keys into ``net``; a mismatch lists the keys and the arguments to set."""
    path = Path(path)
    if path.is_dir():
        path = diffusers_weights_file(path)
        _check_heads(net, path)
    state = _load_sharded(path) if path.name.endswith(".index.json") else load_file(path)
    if isinstance(state.get("ema"), Mapping):  # DiT's training checkpoints: {"model", "ema", "opt", "args"}
        state = state["ema"]
    state = extract_state_dict(state, "net.")  # from a zoo Lightning checkpoint: the DiffusionModule's net
    if any(k.startswith("transformer_blocks.") for k in state):
        state = from_diffusers(state)
    state = {k: v for k, v in state.items() if k != "pos_embed"}  # a fixed table the net rebuilds
    try:
        check_compatible(net, state, f"DiT weights {str(path)!r}")
    except ValueError as err:
        if "x_embedder.proj.weight" not in state or "final_layer.linear.weight" not in state:
            raise
        args = " ".join(f"--model.init_args.net.init_args.{k}={v}" for k, v in dit_args(state).items())
        raise ValueError(
            f"{err}\nThese weights are a DiT with: {args} (and the heads they were trained with: "
            f"6, 12, 16, 16 in the S, B, L, XL presets)"
        ) from None
    net.load_state_dict(state)
    return net


def load_pretrained(net: nn.Module, path: str | Path) -> nn.Module:
    """``init_weights`` of ``DiffusionModule``: any DiT format for a ``DiT``; the zoo's own keys for other nets, or
    a diffusers ``UNet2DModel`` (a ``.safetensors``/``.bin`` file; its ``config.json`` beside it, if any, says
    whether the step features are sin-first) for a ``UNet``."""
    if isinstance(net, DiT):
        return load_dit_weights(net, path)
    state = extract_state_dict(load_file(path), "net.")
    if any(k.startswith("down_blocks.") for k in state):
        config = Path(path).parent / "config.json"
        flip = read_json(config).get("flip_sin_to_cos", True) if config.is_file() else True
        state = unet_from_diffusers(state, flip)
    check_compatible(net, state, f"weights file {str(path)!r}")
    net.load_state_dict(state)
    return net
