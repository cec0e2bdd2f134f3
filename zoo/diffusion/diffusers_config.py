"""A diffusers model's ``config.json`` as the zoo net's arguments: every field that changes the function is read, and
a value the zoo's net does not implement is refused by name (as is a field it does not know), never ignored.

The config is data: read within size limits (``zoo.io.files.read_json``); its ``_class_name`` is matched as a string
against the classes read here, never imported, and a config naming code (``auto_map``) is refused.

- ``DiTTransformer2DModel`` (and a DiT saved as ``Transformer2DModel``: by older DiT pipelines, or by current diffusers,
  over that class's own defaults) -> ``DiT``: heads and head width, layers, patch and sample size, classes
  (``num_embeds_ada_norm``), ``out_channels`` = 2 x in (``learn_sigma``), ``norm_eps`` (the LayerNorm before each
  MLP), and diffusers' step frequencies (``time_freq_shift=1``). Transformer2DModel's fields for other models (cross
  attention, captions, PixArt's ``use_additional_conditions``) must hold the values with which it is a DiT.
- ``UNet2DModel`` -> ``UNet``: ``block_out_channels`` (multiples of the first), ``layers_per_block``, the attention
  resolutions (where ``AttnDownBlock2D`` sits), heads (channels / ``attention_head_dim``, alike at every attention
  block), ``norm_num_groups``, ``norm_eps``, ``freq_shift``, ``num_class_embeds`` (the last row the null class),
  ``dropout``, ``downsample_padding`` 1 or 0 (the DDPM release's), ``resnet_time_scale_shift: scale_shift`` (ADM's
  ``use_scale_shift_norm``), resampling by residual blocks (``ResnetDownsampleBlock2D``/``ResnetUpsampleBlock2D``,
  ``downsample_type``/``upsample_type: resnet``: ADM's ``resblock_updown``, the same at every level);
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
# Transformer2DModel's: its own defaults, not DiTTransformer2DModel's (a field left out is read as diffusers reads it).
TRANSFORMER_2D_FIELDS: dict[str, Any] = {
    "num_attention_heads": 16, "attention_head_dim": 88, "in_channels": None, "out_channels": None, "num_layers": 1,
    "dropout": 0.0, "norm_num_groups": 32, "cross_attention_dim": None, "attention_bias": False, "sample_size": None,
    "num_vector_embeds": None, "patch_size": None, "activation_fn": "geglu", "num_embeds_ada_norm": None,
    "use_linear_projection": False, "only_cross_attention": False, "double_self_attention": False,
    "upcast_attention": False, "norm_type": "layer_norm", "norm_elementwise_affine": True, "norm_eps": 1e-5,
    "attention_type": "default", "caption_channels": None, "interpolation_scale": None,
    "use_additional_conditions": None,
}  # fmt: skip
# Its fields for models other than a DiT (text conditioning, PixArt, VQ-Diffusion) and the values with which it is one.
# ``use_linear_projection`` is read for continuous inputs only and ``use_additional_conditions`` for PixArt's
# ada_norm_single only (None: off unless that): with a DiT's patches and ada_norm_zero both leave the function alone.
NOT_DIT: dict[str, tuple[Any, ...]] = {
    "cross_attention_dim": (None,), "num_vector_embeds": (None,), "only_cross_attention": (False,),
    "double_self_attention": (False,), "use_linear_projection": (False, True), "attention_type": ("default",),
    "caption_channels": (None,), "use_additional_conditions": (None, False, True),
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
    "Transformer2DModel": ("DiT", TRANSFORMER_2D_FIELDS),
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
    for field, allowed in NOT_DIT.items():
        if field in c.values:
            c.need_value(field, *allowed)
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
        "center_input_sample": (False,), "time_embedding_type": ("positional",), "mid_block_type": ("UNetMidBlock2D",),
        "mid_block_scale_factor": (1,), "act_fn": ("silu", "swish"), "add_attention": (True,),
        "resnet_time_scale_shift": ("default", "scale_shift"), "class_embed_type": (None,),
    }  # fmt: skip
    for field, allowed in fixed.items():
        c.need_value(field, *allowed)
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
    eps = c["norm_eps"]
    c.need("norm_eps", isinstance(eps, (int, float)) and not isinstance(eps, bool) and 0 < eps < 1, "0 < eps < 1")
    classes = c["num_class_embeds"]
    c.need("num_class_embeds", classes is None or (isinstance(classes, int) and classes >= 2), "K + 1 rows, K >= 1")
    attention, resnet_resampling = _blocks(c, size)
    padding = 1 if resnet_resampling or len(widths) == 1 else c["downsample_padding"]  # read by the convs only
    c.need("downsample_padding", padding in (0, 1) and not isinstance(padding, bool), "1, or 0 as in DDPM's release")
    scale_shift = c["resnet_time_scale_shift"] == "scale_shift"
    return {
        "in_channels": in_channels,
        "image_size": size,
        "base_channels": widths[0],
        "channel_mults": [w // widths[0] for w in widths],
        "num_res_blocks": _int(c, "layers_per_block"),
        "attention_resolutions": attention,
        "num_heads": _heads(c, widths),
        "dropout": float(c["dropout"]),
        "num_classes": classes - 1 if classes else 0,  # the zoo's null class is the last row, as any label K
        "norm_groups": groups,
        "learn_sigma": out_channels == 2 * in_channels,
        "time_freq_shift": float(c["freq_shift"]),
        "norm_eps": float(eps),
        "downsample_padding": padding,
        "use_scale_shift_norm": scale_shift,
        "resblock_updown": resnet_resampling,
        # diffusers' middle attention has its GroupNorm unless the step is a scale and shift and no groups are given
        "mid_attention_norm": not scale_shift or c["attn_norm_num_groups"] is not None,
    }


# Each block type: (attention after its residual blocks, how it resamples: "conv", "resnet", or None: as the config's
# downsample_type / upsample_type says). diffusers reads an old name "UNetRes<type>" as <type>.
_DOWN = {"DownBlock2D": (False, "conv"), "AttnDownBlock2D": (True, None), "ResnetDownsampleBlock2D": (False, "resnet")}
_UP = {"UpBlock2D": (False, "conv"), "AttnUpBlock2D": (True, None), "ResnetUpsampleBlock2D": (False, "resnet")}


def _blocks(c: Config, size: int) -> tuple[list[int], bool]:
    """The sides with attention (the levels of ``AttnDownBlock2D``, mirrored by ``AttnUpBlock2D`` on the way up), and
    whether every down- and upsampling is a residual block (else every one is a conv)."""
    kinds = {}
    for field, table, resample in (
        ("down_block_types", _DOWN, "downsample_type"),
        ("up_block_types", _UP, "upsample_type"),
    ):
        types = c[field]
        ok = isinstance(types, list) and len(types) == len(c["block_out_channels"])
        c.need(field, ok and all(isinstance(t, str) for t in types), "one per width")
        types = [t.removeprefix("UNetRes") for t in types]
        c.need(field, all(t in table for t in types), "of " + ", ".join(table))
        c.need_value(resample, "conv", "resnet")
        kinds[field] = [(table[t][0], table[t][1] or c[resample]) for t in types]
    down, up = kinds["down_block_types"], kinds["up_block_types"][::-1]  # up: level by level, as down
    c.need("up_block_types", [a for a, _ in up] == [a for a, _ in down], "attention where the down blocks have it")
    # level i downsamples to i + 1 (all but the last), its up block upsamples to i - 1 (all but the first)
    resampling = {r for _, r in down[:-1]} | {r for _, r in up[1:]}
    c.need("down_block_types", len(resampling) <= 1, "one resampling, conv or resnet, at every level down and up")
    return [size // 2**i for i, (a, _) in enumerate(down) if a], resampling == {"resnet"}


def _heads(c: Config, widths: list[int]) -> int:
    """channels / attention_head_dim at every attention block (the mid block's included), which the zoo's one
    ``num_heads`` must equal; no head width: one head of all channels."""
    dim = c["attention_head_dim"]
    if dim is None:
        return 1
    attended = [w for w, t in zip(widths, c["down_block_types"]) if t.endswith("AttnDownBlock2D")] + [widths[-1]]
    ok = isinstance(dim, int) and dim > 0 and all(w % dim == 0 for w in attended)
    c.need("attention_head_dim", ok and len({w // dim for w in attended}) == 1, "the same heads at every attention")
    return widths[-1] // dim


def _int(c: Config, field: str) -> int:
    c.need(field, isinstance(c[field], int) and not isinstance(c[field], bool) and c[field] > 0, "a positive integer")
    return c[field]


def _ints(values: Any) -> bool:
    return isinstance(values, list) and bool(values) and all(isinstance(v, int) and v > 0 for v in values)
