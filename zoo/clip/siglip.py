"""Hugging Face SigLIP folders (``model_type: siglip``, ``SiglipModel.save_pretrained``) into the zoo's ``CLIP``.

Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training". What differs from CLIP, and how the towers
(``zoo.clip.towers``) compute it:
  * vision: a patch embedding with a bias, learned positions and no class token, no LayerNorm before the blocks,
    ``post_layernorm`` on every token, then the MAP head (``head``: a learned ``probe`` attends over the patches, then
    x + MLP(LayerNorm(x))); no projection: the head's output is the feature (``pool="map"``, ``projection=False``);
  * text: learned positions, bidirectional blocks, ``final_layer_norm``, read at the last position (texts are padded
    to ``max_position_embeddings`` with the end-of-text id), then ``head``, a linear layer with a bias;
  * logits: exp(``logit_scale``) x cosine + ``logit_bias``, each pair a sigmoid probability (the zoo's ``siglip``
    loss, and zero-shot probabilities by ``sigmoid``). SigLIP does not clamp the scale, so neither does the net here.

``config.json`` is read whole: each field is read, changes nothing the zoo computes (ids the tokenizer states,
bookkeeping), or is refused by name; what it leaves out takes transformers' ``SiglipConfig`` defaults. SigLIP 2
(``siglip2``: NaFlex patches at the image's own aspect ratio, resized positions) is refused. The state dict is read
whole too: a tensor left over is refused by name.

Notation: D width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from zoo.errors import InputError

# transformers' SiglipVisionConfig / SiglipTextConfig defaults for the fields the zoo reads.
VISION_READ = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
}  # fmt: skip
TEXT_READ = {
    "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
    "num_attention_heads": 12, "max_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6, "projection_size": None,
}  # fmt: skip
# At these values the towers compute what transformers' do; another is refused by name.
FIXED = {"vision_use_head": True, "attention_dropout": 0.0}
# Fields that change nothing the towers compute: ids the tokenizer states (zoo.clip.siglip_tokenizer reads its own),
# initialisation, outputs, transformers' bookkeeping.
INERT = {
    "model_type", "architectures", "transformers_version", "dtype", "torch_dtype", "initializer_factor",
    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "_name_or_path", "_commit_hash",
    "return_dict", "output_hidden_states", "output_attentions", "use_return_dict", "torchscript",
    "tie_word_embeddings", "_attn_implementation_autoset", "id2label", "label2id", "problem_type",
}  # fmt: skip
TOP = {"text_config", "vision_config"}
# transformers' activation names -> the towers' (``zoo.clip.towers.ACTIVATIONS``).
ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "quick_gelu": "quick_gelu"}


def _section(data: Any, where: str, read: dict) -> dict:
    """``data`` over ``read``'s defaults, each field read, fixed, inert or refused by name."""
    if not isinstance(data, Mapping):
        raise InputError(f"{where} is not an object of SigLIP settings: use a folder SiglipModel.save_pretrained wrote")
    if unknown := sorted(set(data) - set(read) - set(FIXED) - INERT):
        raise InputError(
            f"{where} sets {', '.join(unknown)}, which the zoo's SigLIP does not read: refused, as loading it might "
            "compute something else (a SiglipModel folder transformers wrote loads)"
        )
    for field, value in FIXED.items():
        if field in data and data[field] != value:
            raise InputError(
                f"{where} has {field}={data[field]!r}, which the zoo's SigLIP does not implement ({value!r} is): "
                "refused, as loading it would compute something else"
            )
    values = {**read, **{k: v for k, v in data.items() if k in read}}
    if values["hidden_act"] not in ACTS:
        raise InputError(
            f"{where} has hidden_act={values['hidden_act']!r}, which the zoo's SigLIP does not implement "
            f"({', '.join(ACTS)} are)"
        )
    return values


def _square(value: Any, field: str, where: str) -> int:
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if type(value) is not int or value <= 0:
        raise InputError(f"{where} has {field}={value!r}, not a positive integer (a square side), which the zoo reads")
    return value


def _vision(v: dict, where: str) -> dict:
    """``VisionTransformer``'s arguments of a ``vision_config`` read by ``_section``."""
    width = v["hidden_size"]
    return dict(
        image_size=_square(v["image_size"], "image_size", where),
        patch_size=_square(v["patch_size"], "patch_size", where),
        in_channels=v["num_channels"],
        width=width,
        layers=v["num_hidden_layers"],
        heads=v["num_attention_heads"],
        mlp_ratio=v["intermediate_size"] / width,
        embed_dim=width,
        pool="map",
        act=ACTS[v["hidden_act"]],
        norm_eps=v["layer_norm_eps"],
        pre_norm=False,
        patch_bias=True,
        projection=False,
        drop_remainder=True,  # transformers' patch embedding is a "valid" convolution
    )


def _text(t: dict, embed: int) -> dict:
    """``TextTransformer``'s arguments of a ``text_config`` read by ``_section``, its head to ``embed`` features."""
    return dict(
        vocab_size=t["vocab_size"],
        context_length=t["max_position_embeddings"],
        width=t["hidden_size"],
        layers=t["num_hidden_layers"],
        heads=t["num_attention_heads"],
        mlp_ratio=t["intermediate_size"] / t["hidden_size"],
        embed_dim=embed,
        act=ACTS[t["hidden_act"]],
        norm_eps=t["layer_norm_eps"],
        causal=False,
        pool="last",
        proj_bias=True,
    )


def siglip_kwargs(config: Mapping[str, Any], path: str | Path = "config.json") -> dict:
    """``VisionTransformer``, ``TextTransformer`` and ``CLIP`` arguments of a ``SiglipConfig`` dict read from ``path``;
    an ``InputError`` naming the first field the zoo does not compute."""
    where = repr(str(path))
    if unknown := sorted(set(config) - TOP - INERT):
        raise InputError(f"{where} sets {', '.join(unknown)}, which the zoo's SigLIP does not read: refused")
    v = _section(config.get("vision_config", {}), f"{where}'s vision_config", VISION_READ)
    t = _section(config.get("text_config", {}), f"{where}'s text_config", TEXT_READ)
    width = v["hidden_size"]
    embed = t["projection_size"] if t["projection_size"] is not None else t["hidden_size"]
    if embed != width:
        raise InputError(
            f"{where}: the text head's projection_size {embed} is not the vision tower's hidden_size {width}, so the "
            "two features cannot be compared (SiglipModel would fail too)"
        )
    vision, text = _vision(v, where), _text(t, embed)
    for name, tower in (("vision", vision), ("text", text)):
        hidden = (v if name == "vision" else t)["intermediate_size"]
        if round(tower["width"] * tower["mlp_ratio"]) != hidden:
            raise InputError(f"{where}'s {name}_config intermediate_size {hidden} is not a width the zoo's MLP takes")
    # SigLIP's initial values (t' = log 10, b = -10), replaced by the weights; no clamp on the scale.
    clip = {"init_logit_scale": math.log(10), "init_logit_bias": -10.0, "max_logit_scale": math.inf}
    return {"vision": vision, "text": text, "clip": clip}


def siglip_net(k: dict) -> dict:
    """The ``CLIP`` config (``{class_path, init_args}``) of ``siglip_kwargs``' arguments."""
    return {
        "class_path": "zoo.clip.CLIP",
        "init_args": {
            "image_encoder": {"class_path": "zoo.clip.VisionTransformer", "init_args": k["vision"]},
            "text_encoder": {"class_path": "zoo.clip.TextTransformer", "init_args": k["text"]},
            **k["clip"],
        },
    }


# Per block, as zoo.clip.hf's CLIP blocks: (ours, transformers'); q, k and v fused apart.
_BLOCK = [
    ("ln_1", "layer_norm1"),
    ("attn.proj", "self_attn.out_proj"),
    ("ln_2", "layer_norm2"),
    ("mlp.fc", "mlp.fc1"),
    ("mlp.proj", "mlp.fc2"),
]
_TOP = [
    ("image_encoder.conv1", "vision_model.embeddings.patch_embedding"),
    ("image_encoder.ln_post", "vision_model.post_layernorm"),
    ("image_encoder.attn_pool.attn.out_proj", "vision_model.head.attention.out_proj"),
    ("image_encoder.attn_pool.ln", "vision_model.head.layernorm"),
    ("image_encoder.attn_pool.mlp.fc", "vision_model.head.mlp.fc1"),
    ("image_encoder.attn_pool.mlp.proj", "vision_model.head.mlp.fc2"),
    ("text_encoder.ln_final", "text_model.final_layer_norm"),
    ("text_encoder.proj", "text_model.head"),
]
_TENSORS = {
    "image_encoder.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "image_encoder.attn_pool.query": "vision_model.head.probe",
    "image_encoder.attn_pool.attn.in_proj_weight": "vision_model.head.attention.in_proj_weight",
    "image_encoder.attn_pool.attn.in_proj_bias": "vision_model.head.attention.in_proj_bias",
    "text_encoder.token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "text_encoder.positional_embedding": "text_model.embeddings.position_embedding.weight",
    "logit_scale": "logit_scale",
    "logit_bias": "logit_bias",
}
_TOWERS = {"image_encoder": "vision_model.encoder.layers", "text_encoder": "text_model.encoder.layers"}
PROBE = "vision_model.head.probe"  # what tells a SiglipModel state dict from a CLIPModel one


def siglip_to_zoo(sd: Mapping[str, Tensor], source: str) -> dict[str, Tensor]:
    """Rename a ``SiglipModel`` state dict into ``CLIP``'s keys, fusing each block's q, k, v; a tensor it does not
    use is refused by name (the CLIP parameters it misses are named by the load's key check)."""
    used: set[str] = set()

    def take(key: str) -> Tensor:
        if key not in sd:
            raise InputError(f"{source} lacks the SigLIP tensor {key}: not a SiglipModel's weights")
        used.add(key)
        return sd[key]

    out = {ours: take(theirs) for ours, theirs in _TENSORS.items()}
    for ours, theirs in _TOP:
        for kind in ("weight", "bias"):
            out[f"{ours}.{kind}"] = take(f"{theirs}.{kind}")
    for tower, prefix in _TOWERS.items():
        layers = {k[len(prefix) + 1 :].split(".")[0] for k in sd if k.startswith(prefix + ".")}
        for i in range(len(layers)):
            src, dst = f"{prefix}.{i}", f"{tower}.blocks.{i}"
            for kind in ("weight", "bias"):
                for ours, theirs in _BLOCK:
                    out[f"{dst}.{ours}.{kind}"] = take(f"{src}.{theirs}.{kind}")
                out[f"{dst}.attn.qkv.{kind}"] = torch.cat([take(f"{src}.self_attn.{p}_proj.{kind}") for p in "qkv"])
    left = sorted(k for k in set(sd) - used if not k.endswith("position_ids"))  # transformers' index buffers
    if left:
        raise InputError(
            f"{source} holds SigLIP tensors the zoo's towers have no place for: {', '.join(left[:5])}"
            f"{f' and {len(left) - 5} more' if len(left) > 5 else ''}: refused, as they would be left out"
        )
    out["logit_scale"], out["logit_bias"] = out["logit_scale"].reshape(1), out["logit_bias"].reshape(1)
    return out
