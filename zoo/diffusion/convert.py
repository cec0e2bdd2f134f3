"""Denoiser weights from outside, exact or refused: published DiT checkpoints (facebookresearch/DiT), diffusers'
``DiTTransformer2DModel`` and ``UNet2DModel``, and the zoo's own keys.

Every tensor of the source is used and every parameter of the net is set (``Source``, then ``check_compatible``),
and a diffusers layout is read with its config.json (``zoo.diffusion.diffusers_config``), against which the net's
heads, norm groups, eps and step features are checked: a load that would compute something else is one
``InputError`` naming what is left over, missing or different. Loading is weights-only (``zoo.io.weights``).

The zoo's ``DiT`` keeps the reference implementation's parameter names, so a published ``DiT-XL-2-256x256.pt``
loads as it is (its ``pos_embed`` is the fixed table the net rebuilds: checked equal, not loaded). diffusers'
``DiTTransformer2DModel`` stores the same numbers under other names (q, k and v as three matrices) and a step and
label embedder in every block: equal copies after diffusers' conversion of a published DiT, which a ``DiT`` shares;
different ones in a DiT trained or fine-tuned in diffusers, which a ``DiT(block_embedders=True)`` holds per block
(and a sharing DiT refuses). diffusers computes the step features with ``downscale_freq_shift=1``
(``time_freq_shift=1``), and its LayerNorm before each MLP with its config's ``norm_eps``.

diffusers' ``UNet2DModel`` is DDPM's UNet too, block for block: ``unet_from_diffusers`` renames its keys to the
zoo's ``UNet`` (q, k, v fused as the shared attention layer keeps them; a resampling residual block's keys as any
residual block's); its ``flip_sin_to_cos=False`` (sin-first features) is undone by permuting the step MLP's columns.

    net = DiT("XL", 2, image_size=32, in_channels=4, num_classes=1000, learn_sigma=True)
    load_pretrained(net, "DiT-XL-2-256x256.pt")    # published
    module = zoo.diffusion.from_pretrained("DiT-XL-2-256")   # a diffusers folder: the net built from its config
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from zoo.diffusion.diffusers_config import Config, dit_settings, read_config, unet_settings
from zoo.diffusion.dit import DiT
from zoo.diffusion.embeddings import TimestepEmbedder
from zoo.diffusion.unet import Downsample, ResBlock, UNet
from zoo.errors import InputError
from zoo.io.files import file_in, read_json
from zoo.io.weights import check_compatible, extract_state_dict, is_remote, load_file
from zoo.nn.attention import SelfAttention


class Source:
    """A source state dict whose tensors are each taken once: what is never taken is left over, and refused, so no
    tensor of a pretrained model can be dropped without a word."""

    def __init__(self, state: Mapping[str, Tensor], name: str) -> None:
        self.left, self.name = dict(state), name

    def take(self, key: str) -> Tensor:
        if key not in self.left:
            raise InputError(f"{self.name} has no tensor {key!r}, which the layout it is in always has: refused")
        return self.left.pop(key)

    def done(self) -> None:
        if self.left:
            names = ", ".join(sorted(self.left)[:8]) + (", ..." if len(self.left) > 8 else "")
            raise InputError(
                f"{self.name} has {len(self.left)} tensors the zoo's net has no place for ({names}): refused, as "
                "loading without them would compute something else"
            )


# A block's step and label embedders (adaLN-Zero's conditioning), diffusers' names -> the zoo's.
_EMBEDDERS = {
    "timestep_embedder.linear_1.weight": "t_embedder.mlp.0.weight",
    "timestep_embedder.linear_1.bias": "t_embedder.mlp.0.bias",
    "timestep_embedder.linear_2.weight": "t_embedder.mlp.2.weight",
    "timestep_embedder.linear_2.bias": "t_embedder.mlp.2.bias",
    "class_embedder.embedding_table.weight": "y_embedder.embedding_table.weight",
}


def block_embedders_differ(state: Mapping[str, Tensor]) -> bool:
    """Whether a ``DiTTransformer2DModel`` state dict's blocks hold embedders that are not all block 0's."""
    first = {k.split(".", 2)[2]: v for k, v in state.items() if k.startswith("transformer_blocks.0.norm1.emb.")}
    return any(
        not torch.equal(v, first.get(k.split(".", 2)[2], v.new_empty(0)))
        for k, v in state.items()
        if re.match(r"transformer_blocks\.\d+\.norm1\.emb\.", k)
    )


def _embedders(src: Source, out: dict[str, Tensor], depth: int, per_block: bool) -> None:
    """Block 0's embedders are the net's (they condition the final layer too, in diffusers as here); the others
    are each block's own (``per_block``), or must equal block 0's, which the net then shares."""
    for i in range(depth):
        for name, zoo_name in _EMBEDDERS.items():
            key = f"transformer_blocks.{i}.norm1.emb.{name}"
            if name.startswith("class_") and key not in src.left and zoo_name not in out:
                continue  # an unconditional net: no label embedder in any block
            value = src.take(key)
            if i == 0 or per_block:
                out[f"blocks.{i}.{zoo_name}" if i else zoo_name] = value
            elif not torch.equal(value, out[zoo_name]):
                raise InputError(
                    f"{src.name}: the blocks have step and label embedders of their own ({key} differs from block "
                    "0's), which a DiT sharing one pair cannot hold: set model.init_args.net.init_args."
                    "block_embedders=true (or load the folder with zoo.diffusion.from_pretrained)"
                )


def from_diffusers(
    state: Mapping[str, Tensor], block_embedders: bool = False, name: str = "the diffusers DiT"
) -> dict[str, Tensor]:
    """A ``DiTTransformer2DModel`` state dict in the reference DiT's key layout (``block_embedders``: for a
    ``DiT(block_embedders=True)``); every tensor is used, or an ``InputError`` names those left over."""
    src = Source(state, name)
    out = {
        "x_embedder.proj.weight": src.take("pos_embed.proj.weight"),
        "x_embedder.proj.bias": src.take("pos_embed.proj.bias"),
        "final_layer.adaLN_modulation.1.weight": src.take("proj_out_1.weight"),
        "final_layer.adaLN_modulation.1.bias": src.take("proj_out_1.bias"),
        "final_layer.linear.weight": src.take("proj_out_2.weight"),
        "final_layer.linear.bias": src.take("proj_out_2.bias"),
    }
    depth = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("transformer_blocks."))
    _embedders(src, out, depth, block_embedders)
    for i in range(depth):
        d, z = f"transformer_blocks.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            qkv = [src.take(f"{d}attn1.to_{n}.{kind}") for n in "qkv"]
            out[f"{z}attn.qkv.{kind}"] = torch.cat(qkv)  # rows [q; k; v], as the reference's fused Linear
            out[f"{z}attn.proj.{kind}"] = src.take(f"{d}attn1.to_out.0.{kind}")
            out[f"{z}mlp.fc1.{kind}"] = src.take(f"{d}ff.net.0.proj.{kind}")
            out[f"{z}mlp.fc2.{kind}"] = src.take(f"{d}ff.net.2.{kind}")
            out[f"{z}adaLN_modulation.1.{kind}"] = src.take(f"{d}norm1.linear.{kind}")
    src.done()
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


def unet_from_diffusers(
    state: Mapping[str, Tensor],
    flip_sin_to_cos: bool = True,
    name: str = "the diffusers UNet2DModel",
    keys: Collection[str] | None = None,
) -> dict[str, Tensor]:
    """A ``UNet2DModel`` state dict in the zoo ``UNet``'s key layout: every key renamed (a name the zoo's net lacks
    is refused: ``keys``, the net's, or else ``check_compatible``), q, k and v fused (a k or v without its q is left
    over, and refused).
    ``flip_sin_to_cos=False``: sin-first step features, undone by swapping the step MLP's column halves."""
    src, out = Source(state, name), {}
    for key in [k for k in state if not re.search(r"\.to_[kv]\.", k)]:
        zoo_key = key.replace(".to_q.", ".attn.qkv.")
        for pattern, repl in _UNET_RENAMES:
            zoo_key = re.sub(pattern, repl, zoo_key)
        if keys is not None and zoo_key not in keys:
            continue  # left over, named as the source names it
        value = src.take(key)
        if ".to_q." in key:  # rows [q; k; v], as the shared attention layer's fused Linear
            value = torch.cat(
                [value, src.take(key.replace(".to_q.", ".to_k.")), src.take(key.replace(".to_q.", ".to_v."))]
            )
        out[zoo_key] = value
    src.done()
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
    """The weights of a diffusers ``save_pretrained`` folder, or of a pipeline's ``transformer/`` or ``unet/``."""
    for sub in (folder, folder / "transformer", folder / "unet"):
        for name in (
            "diffusion_pytorch_model.safetensors",
            "diffusion_pytorch_model.safetensors.index.json",
            "diffusion_pytorch_model.bin",
        ):
            if (sub / name).is_file():
                return sub / name
    raise FileNotFoundError(
        f"{str(folder)!r} is a folder without diffusers weights: expected diffusion_pytorch_model.safetensors "
        "(or .bin, or a sharded .safetensors.index.json) in it or in its transformer/ or unet/ subfolder, as "
        "diffusers' save_pretrained writes them"
    )


def _load_sharded(index: Path) -> dict[str, Tensor]:
    """A sharded safetensors checkpoint: the union of the shards its index names."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise InputError(f"{str(index)!r} has no weight_map of tensor names to shard files")
    shards = sorted({file_in(index.parent, shard, f"the shard index {str(index)!r}") for shard in weight_map.values()})
    return {k: v for shard in shards for k, v in load_file(shard).items()}


@dataclasses.dataclass
class Pretrained:
    """What a path holds: its tensors, where they came from, and for diffusers' layouts the config.json beside them."""

    state: dict[str, Tensor]
    source: str
    config: Config | None = None

    @property
    def layout(self) -> str | None:
        """The diffusers net whose key layout the tensors are in ("DiT", "UNet"), None for the zoo's or DiT's own."""
        if any(k.startswith("transformer_blocks.") for k in self.state):
            return "DiT"
        return "UNet" if any(k.startswith("down_blocks.") for k in self.state) else None


def read_pretrained(path: str | Path) -> Pretrained:
    """The tensors of a file or folder (a diffusers model, a pipeline, a zoo checkpoint), weights-only; for a diffusers
    layout, with its config.json, without which it is refused (heads, groups and the step features do not show in
    any shape, so they would be guessed)."""
    if is_remote(path):
        return Pretrained(extract_state_dict(load_file(path), "net."), str(path))
    path = Path(path)
    weights = diffusers_weights_file(path) if path.is_dir() else path
    state = _load_sharded(weights) if weights.name.endswith(".index.json") else load_file(weights)
    if isinstance(state.get("ema"), Mapping):  # DiT's training checkpoints: {"model", "ema", "opt", "args"}
        state = state["ema"]
    pre = Pretrained(extract_state_dict(state, "net."), str(weights))  # a zoo checkpoint: the module's net
    if pre.layout is not None:
        config = weights.parent / "config.json"
        if not config.is_file():
            raise InputError(
                f"{str(weights)!r} holds a diffusers {pre.layout}'s weights without the config.json saved beside them, "
                "whose heads, norm groups and step features do not show in the weights: pass the model's folder"
            )
        pre.config = read_config(config)
    return pre


# What a net's modules compute with besides their weights: a net built from the config must agree on each.
_SETTINGS = {
    nn.GroupNorm: ("num_groups", "eps"),
    nn.LayerNorm: ("eps",),
    SelfAttention: ("num_heads",),
    TimestepEmbedder: ("frequency_dim", "freq_shift"),
    Downsample: ("padding",),
    ResBlock: ("scale_shift", "resample"),
    DiT: ("image_size", "patch_size"),
    UNet: ("image_size",),
}


def _settings_of(net: nn.Module) -> dict[str, object]:
    return {
        f"{name or type(net).__name__}.{attr}": getattr(m, attr)
        for name, m in net.named_modules()
        for cls, attrs in _SETTINGS.items()
        if isinstance(m, cls)
        for attr in attrs
    }


def _check_settings(net: nn.Module, settings: dict, pre: Pretrained) -> None:
    """Refuse a net that would load the weights but compute something else than the config says."""
    cls = DiT if pre.config.net == "DiT" else UNet
    with torch.device("meta"):
        want = _settings_of(cls(**settings))
    have = _settings_of(net) if isinstance(net, cls) else {}
    wrong = [f"{k} {want[k]} (net: {have[k]})" for k in want.keys() & have.keys() if want[k] != have[k]]
    if not have or wrong:
        flags = " ".join(f"--model.init_args.net.init_args.{k}={v}" for k, v in settings.items())
        raise InputError(
            f"{pre.config.where!r} is a {cls.__name__} other than the configured {type(net).__name__}"
            f"{': ' + ', '.join(sorted(wrong)[:4]) if wrong else ''}: build it with {flags}, or load the folder "
            "with zoo.diffusion.from_pretrained"
        )


def net_state(net: nn.Module, pre: Pretrained) -> dict[str, Tensor]:
    """``pre``'s tensors in ``net``'s key layout, for a net that computes what its config says, or refused."""
    if pre.layout is None:
        return _own_state(net, pre)
    if pre.config.net != pre.layout:
        raise InputError(f"{pre.config.where!r} describes a {pre.config.net} but {pre.source!r} holds a {pre.layout}'s")
    if pre.layout == "DiT":
        per_block = isinstance(net, DiT) and net.blocks[-1].t_embedder is not None
        _check_settings(net, dit_settings(pre.config, per_block), pre)
        return from_diffusers(pre.state, per_block, repr(pre.source))
    _check_settings(net, unet_settings(pre.config), pre)
    return unet_from_diffusers(pre.state, pre.config["flip_sin_to_cos"], repr(pre.source), net.state_dict().keys())


def _own_state(net: nn.Module, pre: Pretrained) -> dict[str, Tensor]:
    """The zoo's keys or a published DiT's: a DiT's position table is fixed, so it is checked, not loaded."""
    state = dict(pre.state)
    table = state.pop("pos_embed", None)
    if table is not None and isinstance(net, DiT):
        fixed = net.pos_embed.to(table)
        if table.shape != fixed.shape or not torch.allclose(table, fixed, atol=1e-5):
            raise InputError(
                f"{pre.source!r} has a pos_embed other than the fixed sin-cos table of the configured DiT, which the "
                "net rebuilds: set image_size and patch_size to the weights' (or the table was learned: not a DiT)"
            )
    elif table is not None:
        state["pos_embed"] = table  # not a DiT's: left for check_compatible to name
    return state


def load_state(net: nn.Module, state: Mapping[str, Tensor], source: str) -> nn.Module:
    """Every parameter of ``net`` set from ``state`` and every tensor of ``state`` used, or an ``InputError``."""
    try:
        check_compatible(net, state, source)
    except ValueError as err:
        hint = ""
        if isinstance(net, DiT) and "x_embedder.proj.weight" in state and "final_layer.linear.weight" in state:
            args = " ".join(f"--model.init_args.net.init_args.{k}={v}" for k, v in dit_args(state).items())
            hint = f"\nThese weights are a DiT with: {args} (and the heads it was trained with: 6, 12, 16, 16 in S-XL)"
        raise InputError(f"{err}{hint}") from None
    net.load_state_dict(state)
    return net


def load_pretrained(net: nn.Module, path: str | Path) -> nn.Module:
    """``init_weights`` of ``DiffusionModule``, exact or refused: a diffusers ``DiTTransformer2DModel`` or
    ``UNet2DModel`` (its folder, a pipeline's, or its weights file with config.json beside it), a published DiT
    ``.pt``, or the zoo's own keys (a safetensors file, a checkpoint); an ``InputError`` naming what is left over,
    missing, or computed otherwise."""
    pre = read_pretrained(path)
    return load_state(net, net_state(net, pre), f"weights {pre.source!r}")


load_dit_weights = load_pretrained  # the name this had when it read DiTs only
