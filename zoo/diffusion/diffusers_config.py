"""A diffusers model's ``config.json`` as the zoo net's arguments: every field that changes the function is read, and
a value the zoo's net does not implement is refused by name (as is a field it does not know), never ignored.

The config is data: read within size limits (``zoo.io.files.read_json``); its ``_class_name`` is matched as a string
against the classes read here, never imported, and a config naming code (``auto_map``) is refused.

- ``DiTTransformer2DModel`` (and the ``Transformer2DModel`` of older DiT pipelines) -> ``DiT``: heads and head width,
  layers, patch and sample size, classes (``num_embeds_ada_norm``), ``out_channels`` = 2 x in (``learn_sigma``),
  ``norm_eps`` (the LayerNorm before each MLP), and diffusers' step frequencies (``time_freq_shift=1``).
- ``UNet2DModel`` -> ``UNet``: ``block_out_channels`` (multiples of the first), ``layers_per_block``, the attention
  resolutions (where ``AttnDownBlock2D`` sits), heads (channels / ``attention_head_dim``, alike at every attention
  block), ``norm_num_groups``, ``freq_shift``, ``num_class_embeds`` (the last row the null class), ``dropout``;
  ``flip_sin_to_cos`` is a permutation of the step MLP's columns (``zoo.diffusion.convert``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zoo.errors import InputError
from zoo.io.files import read_json

# Each class's fields and diffusers' defaults (a config written by hand may leave any out, as diffusers allows).
DIT_FIELDS: dict[str, Any] = {
    "num_attention_heads": 16, "attention_head_dim": 72, "in_channels": 4, "out_channels": None, "num_layers": 28,
    "dropout": 0.0, "norm_num_groups": 32, "attention_bias": True, "sample_size": 32, "patch_size": 2,
    "activation_fn": "gelu-approximate", "num_embeds_ada_norm": 1000, "upcast_attention": False,
    "norm_type": "ada_norm_zero", "norm_elementwise_affine": False, "norm_eps": 1e-5,
}  # fmt: skip
# Transformer2DModel's other fields, at the values with which it is a DiT (diffusers' DiT pipelines before 0.28).
TRANSFORMER_2D_FIELDS: dict[str, Any] = {
    "cross_attention_dim": None, "num_vector_embeds": None, "only_cross_attention": False,
    "double_self_attention": False, "use_linear_projection": False, "attention_type": "default",
    "caption_channels": None, "interpolation_scale": None,
}  # fmt: skip
UNET_FIELDS: dict[str, Any] = {
    "sample_size": None, "in_channels": 3, "out_channels": 3, "center_input_sample": False,
    "time_embedding_type": "positional", "time_embedding_dim": None, "freq_shift": 0, "flip_sin_to_cos": True,
    "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"],
    "mid_block_type": "UNetMidBlock2D",
    "up_block_types": ["AttnUpBlock2D", "AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [224, 448, 672, 896], "layers_per_block": 2, "mid_block_scale_factor": 1,
    "downsample_padding": 1, "downsample_type": "conv", "upsample_type": "conv", "dropout": 0.0, "act_fn": "silu",
    "attention_head_dim": 8, "norm_num_groups": 32, "attn_norm_num_groups": None, "norm_eps": 1e-5,
    "resnet_time_scale_shift": "default", "add_attention": True, "class_embed_type": None, "num_class_embeds": None,
    "num_train_timesteps": None,
}  # fmt: skip
CLASSES = {  # _class_name: (the zoo's net, its fields)
    "DiTTransformer2DModel": ("DiT", DIT_FIELDS),
    "Transformer2DModel": ("DiT", DIT_FIELDS | TRANSFORMER_2D_FIELDS),
    "UNet2DModel": ("UNet", UNET_FIELDS),
}


class Config:
    """A config.json's fields over diffusers' defaults; ``need`` refuses a value the zoo does not implement."""

    def __init__(self, data: Any, path: Path) -> None:
        self.where = str(path)
        if not isinstance(data, Mapping):
            raise InputError(f"{self.where!r} is not a JSON object of a diffusers model's settings")
        if "auto_map" in data:
            raise InputError(f"{self.where!r} names code to run (auto_map): refused, a model folder is data only")
        name = data.get("_class_name")
        if name not in CLASSES:
            raise InputError(
                f"{self.where!r} is a {name!r}, not a model the zoo reads: {', '.join(CLASSES)} (its _class_name)"
            )
        self.net, fields = CLASSES[name]
        unknown = sorted(k for k in data if not k.startswith("_") and k not in fields)
        if unknown:
            raise InputError(f"{self.where!r} sets {', '.join(unknown)}, which the zoo's {self.net} does not implement")
        self.values = {**fields, **{k: v for k, v in data.items() if not k.startswith("_")}}

    def __getitem__(self, field: str) -> Any:
        return self.values[field]

    def need(self, field: str, ok: bool, what: str) -> None:
        if not ok:
            raise InputError(
                f"{self.where!r} has {field}={self.values[field]!r}, which the zoo's {self.net} does not implement "
                f"({what}): refused, as loading it would compute something else"
            )

    def need_value(self, field: str, *allowed: Any) -> None:
        self.need(field, self.values[field] in allowed, "it implements " + " or ".join(map(repr, allowed)))


def read_config(path: Path) -> Config:
    return Config(read_json(path), path)


def dit_settings(c: Config, block_embedders: bool) -> dict[str, Any]:
    """``DiT`` arguments of a ``DiTTransformer2DModel`` config (``block_embedders``: what its weights need)."""
    for field, value in TRANSFORMER_2D_FIELDS.items():
        if field in c.values and field != "interpolation_scale":
            c.need_value(field, value)
    if "interpolation_scale" in c.values:  # Transformer2DModel's default: max(sample_size // 64, 1)
        scale = c["interpolation_scale"] or max(_int(c, "sample_size") // 64, 1)
        c.need("interpolation_scale", scale == 1, "position tables at the sample size's own grid")
    for field in ("norm_type", "activation_fn", "attention_bias", "norm_elementwise_affine", "dropout"):
        c.need_value(field, DIT_FIELDS[field])
    heads, in_channels, classes = _int(c, "num_attention_heads"), _int(c, "in_channels"), c["num_embeds_ada_norm"]
    c.need("num_embeds_ada_norm", isinstance(classes, int) and classes > 0, "a DiT conditioned on classes")
    c.need_value("out_channels", None, in_channels, 2 * in_channels)
    return {
        "depth": _int(c, "num_layers"),
        "hidden_size": heads * _int(c, "attention_head_dim"),
        "num_heads": heads,
        "image_size": _int(c, "sample_size"),
        "patch_size": _int(c, "patch_size"),
        "in_channels": in_channels,
        "num_classes": classes,
        "learn_sigma": c["out_channels"] == 2 * in_channels,
        "time_freq_shift": 1.0,  # diffusers' Timesteps(downscale_freq_shift=1) in CombinedTimestepLabelEmbeddings
        "mlp_norm_eps": float(c["norm_eps"]),
        "block_embedders": block_embedders,
    }


def unet_settings(c: Config) -> dict[str, Any]:
    """``UNet`` arguments of a ``UNet2DModel`` config."""
    fixed = {
        "center_input_sample": False, "time_embedding_type": "positional", "mid_block_type": "UNetMidBlock2D",
        "mid_block_scale_factor": 1, "downsample_padding": 1, "downsample_type": "conv", "upsample_type": "conv",
        "act_fn": "silu", "norm_eps": 1e-5, "resnet_time_scale_shift": "default", "add_attention": True,
        "class_embed_type": None,
    }  # fmt: skip
    for field, value in fixed.items():
        c.need_value(field, value)
    size, widths = c["sample_size"], c["block_out_channels"]
    if isinstance(size, list):
        c.need("sample_size", len(size) == 2 and size[0] == size[1], "square images")
        size = size[0]
    c.need("sample_size", isinstance(size, int) and size > 0, "the image side it is trained on")
    c.need("block_out_channels", _ints(widths) and all(w % widths[0] == 0 for w in widths), "multiples of the first")
    c.need_value("time_embedding_dim", None, 4 * widths[0])
    in_channels, out_channels, groups = _int(c, "in_channels"), _int(c, "out_channels"), _int(c, "norm_num_groups")
    c.need_value("out_channels", in_channels, 2 * in_channels)
    c.need("norm_num_groups", all(w % groups == 0 for w in widths), "groups that divide every width")
    c.need_value("attn_norm_num_groups", None, groups)
    classes = c["num_class_embeds"]
    c.need("num_class_embeds", classes is None or (isinstance(classes, int) and classes >= 2), "K + 1 rows, K >= 1")
    return {
        "in_channels": in_channels,
        "image_size": size,
        "base_channels": widths[0],
        "channel_mults": [w // widths[0] for w in widths],
        "num_res_blocks": _int(c, "layers_per_block"),
        "attention_resolutions": _attention(c, size),
        "num_heads": _heads(c, widths),
        "dropout": float(c["dropout"]),
        "num_classes": classes - 1 if classes else 0,  # the zoo's null class is the last row, as any label K
        "norm_groups": groups,
        "learn_sigma": out_channels == 2 * in_channels,
        "time_freq_shift": float(c["freq_shift"]),
    }


def _attention(c: Config, size: int) -> list[int]:
    """The sides with attention: the levels of ``AttnDownBlock2D``, mirrored by ``AttnUpBlock2D`` on the way up."""
    down, up = c["down_block_types"], c["up_block_types"]
    c.need("down_block_types", isinstance(down, list) and len(down) == len(c["block_out_channels"]), "one per width")
    c.need("down_block_types", all(t in ("DownBlock2D", "AttnDownBlock2D") for t in down), "DownBlock2D, AttnDown...")
    mirror = [t.replace("Down", "Up") for t in reversed(down)]
    c.need("up_block_types", up == mirror, f"the down blocks mirrored: {mirror}")
    return [size // 2**i for i, t in enumerate(down) if t == "AttnDownBlock2D"]


def _heads(c: Config, widths: list[int]) -> int:
    """channels / attention_head_dim at every attention block (the mid block's included), which the zoo's one
    ``num_heads`` must equal; no head width: one head of all channels."""
    dim = c["attention_head_dim"]
    if dim is None:
        return 1
    attended = [w for w, t in zip(widths, c["down_block_types"]) if t == "AttnDownBlock2D"] + [widths[-1]]
    ok = isinstance(dim, int) and dim > 0 and all(w % dim == 0 for w in attended)
    c.need("attention_head_dim", ok and len({w // dim for w in attended}) == 1, "the same heads at every attention")
    return widths[-1] // dim


def _int(c: Config, field: str) -> int:
    c.need(field, isinstance(c[field], int) and not isinstance(c[field], bool) and c[field] > 0, "a positive integer")
    return c[field]


def _ints(values: Any) -> bool:
    return isinstance(values, list) and bool(values) and all(isinstance(v, int) and v > 0 for v in values)
