"""An open_clip folder's ``model_cfg`` (``open_clip_config.json``) as the zoo's ``CLIP`` arguments: every field that
changes the function is read, and a value the zoo's towers do not implement is refused by name (as is a field it
does not know), never ignored.

The config is data: read within size limits (``zoo.io.files.read_json``); nothing it names is imported.

- ``vision_cfg`` -> ``VisionTransformer``: image and patch size, width, layers, heads (width / ``head_width``),
  ``mlp_ratio``; the class token read out (``pool_type: tok``), learned positions, LayerNorm before and after.
- ``text_cfg`` -> ``TextTransformer``: vocabulary, context, width, heads, layers, ``mlp_ratio``; read at the
  end-of-text token: ``pool_type: argmax`` (the largest id, OpenAI's BPE's end of text: ``vocab_size - 1``) or
  ``eos`` (``eos_id``).
- ``quick_gelu`` -> both towers' ``act``; ``embed_dim`` -> both projections.

open_clip's defaults are its 3.x ``CLIPVisionCfg`` and ``CLIPTextCfg``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zoo.errors import InputError

# Fields read, or at these values the zoo's towers compute what open_clip's do (open_clip's defaults).
VISION_FIXED: dict[str, Any] = {
    "ls_init_value": None, "attentional_pool": False, "no_ln_pre": False, "pos_embed_type": "learnable",
    "final_ln_after_pool": False, "pool_type": "tok", "act_kwargs": None, "norm_kwargs": None, "block_type": None,
    "qk_norm": False, "scaled_cosine_attn": False, "scale_heads": False, "scale_attn_inner": False,
    "scale_attn": False, "scale_fc": False, "timm_model_name": None,
}  # fmt: skip
TEXT_FIXED: dict[str, Any] = {
    "ls_init_value": None, "embed_cls": False, "no_causal_mask": False, "final_ln_after_pool": False,
    "proj_bias": False, "proj_type": "linear", "act_kwargs": None, "norm_kwargs": None, "block_type": None,
    "qk_norm": False, "scaled_cosine_attn": False, "scale_heads": False, "scale_attn_inner": False,
    "scale_attn": False, "scale_fc": False, "hf_model_name": None, "tokenizer_mode": None,
}  # fmt: skip
# Fields that change nothing the zoo computes: training-only (patch dropout), outputs, the tokenizer's (read by
# zoo.clip.pretrained.source_tokenizer), and the settings of parts the fixed values above leave out.
VISION_FREE = {
    "patch_dropout", "attn_pooler_queries", "attn_pooler_heads", "output_tokens", "timm_model_pretrained",
    "timm_pool", "timm_proj", "timm_proj_bias", "timm_drop", "timm_drop_path",
}  # fmt: skip
TEXT_FREE = {
    "hf_tokenizer_name", "tokenizer_kwargs", "pad_id", "output_tokens", "hf_model_pretrained", "hf_proj_type",
    "hf_pooler_type",
}  # fmt: skip
VISION_READ = {"layers": 12, "width": 768, "head_width": 64, "mlp_ratio": 4.0, "patch_size": 16, "image_size": 224}
TEXT_READ = {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": 12, "mlp_ratio": 4.0}
TEXT_READ |= {"pool_type": "argmax", "eos_id": 2}
TOP = {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu", "cast_dtype", "output_dict", "init_logit_scale"}
TOP |= {"init_logit_bias", "custom_text", "nonscalar_logit_scale"}


class Section:
    """One object of the config over open_clip's defaults; ``need`` refuses a value the zoo does not implement."""

    def __init__(self, data: Any, where: str, read: dict, fixed: dict, free: set) -> None:
        if not isinstance(data, Mapping):
            raise InputError(f"{where} is not a JSON object of open_clip's settings")
        self.where = where
        if unknown := sorted(set(data) - set(read) - set(fixed) - free):
            raise InputError(f"{where} sets {', '.join(unknown)}, which the zoo's CLIP does not implement")
        self.values = {**read, **fixed, **data}
        for field, value in fixed.items():
            self.need(field, self.values[field] == value or (field == "block_type" and self[field] == "default"))

    def __getitem__(self, field: str) -> Any:
        return self.values[field]

    def need(self, field: str, ok: bool, what: str = "") -> None:
        if not ok:
            raise InputError(
                f"{self.where} has {field}={self.values[field]!r}, which the zoo's CLIP does not implement"
                f"{f' ({what})' if what else ''}: refused, as loading it would compute something else"
            )

    def int(self, field: str) -> int:
        value = self.values[field]
        self.need(field, type(value) is int and value > 0, "a positive integer")
        return value


def open_clip_kwargs(model_cfg: Any, path: Path) -> dict[str, dict[str, Any]]:
    """``VisionTransformer`` and ``TextTransformer`` arguments (``vision``, ``text``) for an open_clip ``model_cfg``."""
    where = f"{str(path)!r}: model_cfg"
    top = Section(model_cfg, where, {"quick_gelu": False, "embed_dim": None}, {}, TOP - {"quick_gelu", "embed_dim"})
    top.need("init_logit_bias", top.values.get("init_logit_bias") is None, "a SigLIP logit bias is not imported")
    top.need("custom_text", not top.values.get("custom_text"), "its text tower's weights are laid out apart")
    embed = top.int("embed_dim")
    act = "quick_gelu" if top["quick_gelu"] else "gelu"
    v = Section(top.values.get("vision_cfg", {}), f"{where}.vision_cfg", VISION_READ, VISION_FIXED, VISION_FREE)
    t = Section(top.values.get("text_cfg", {}), f"{where}.text_cfg", TEXT_READ, TEXT_FIXED, TEXT_FREE)
    size, width = v["image_size"], v.int("width")
    v.need("image_size", type(size) is int or (isinstance(size, list) and len(set(size)) == 1), "square images")
    v.need("layers", type(v["layers"]) is int, "a ViT: a list of layers is a ResNet image tower")
    v.need("head_width", type(v["head_width"]) is int and width % v["head_width"] == 0, "widths whole heads divide")
    vision = dict(
        image_size=size if type(size) is int else size[0],
        patch_size=v.int("patch_size"),
        in_channels=3,
        width=width,
        layers=v.int("layers"),
        heads=width // v.int("head_width"),
        mlp_ratio=float(v["mlp_ratio"]),
        embed_dim=embed,
        pool="cls",
        act=act,
        norm_eps=1e-5,  # open_clip's LayerNorm
    )
    return {"vision": vision, "text": _text(t, embed, act)}


def _text(t: Section, embed: int, act: str) -> dict[str, Any]:
    """The text tower, read at the end-of-text token: the largest id (argmax, OpenAI's BPE) or ``eos_id``."""
    vocab = t.int("vocab_size")
    t.need("pool_type", t["pool_type"] in ("argmax", "eos"), "it reads the end-of-text token: argmax or eos")
    argmax = t["pool_type"] == "argmax"
    t.need("pool_type", not (argmax and t.values.get("hf_tokenizer_name")), "argmax with a Hugging Face tokenizer")
    return dict(
        vocab_size=vocab,
        context_length=t.int("context_length"),
        width=t.int("width"),
        layers=t.int("layers"),
        heads=t.int("heads"),
        mlp_ratio=float(t["mlp_ratio"]),
        embed_dim=embed,
        eot_id=vocab - 1 if argmax else t.int("eos_id"),
        act=act,
        norm_eps=1e-5,
    )
