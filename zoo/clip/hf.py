"""Pretrained CLIP weights into the zoo's ``CLIP``: Hugging Face folders and OpenAI/open_clip state dicts.

A Hugging Face CLIP folder holds ``config.json`` and ``model.safetensors`` (or ``pytorch_model.bin``):
``CLIPModel.save_pretrained`` output or a hub snapshot copied by hand; nothing is downloaded. Its
attention keeps q, k and v as three linears, which become our one fused ``qkv`` ([q | k | v] rows).
OpenAI's layout (open_clip's ``open_clip_pytorch_model.bin``, or a state dict saved from OpenAI's
``clip`` package) already fuses them (``in_proj_weight``) and stores the projections as (width, E)
matrices multiplied from the right, the transpose of ``nn.Linear``. Every file is read weights-only.

Only ViT image towers convert; the text tower must read the tokenizer's end-of-text id (``eot_id``). A SigLIP folder
(``model_type: siglip``) is read by ``zoo.clip.siglip``.
Imported weights expect CLIP's token ids: ``zoo.clip.pretrained`` attaches the folder's ``tokenizer.json`` or, for
OpenAI-layout weights, open_clip's tokenizer, with the source's image preprocessing.

    python -m zoo.clip.hf config <hf_folder>    # print the zoo YAML block for a Hugging Face folder
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from zoo.clip import siglip
from zoo.clip.clip import CLIP
from zoo.clip.towers import TextTransformer, VisionTransformer
from zoo.errors import InputError
from zoo.io import build
from zoo.io.config_fields import require_fields
from zoo.io.files import read_config
from zoo.io.weights import classifier_head, extract_state_dict, load_file, load_with_new_head

# Per block: (ours, Hugging Face, OpenAI); the q/k/v triple is handled apart.
_BLOCK_KEYS = [
    ("ln_1.weight", "layer_norm1.weight", "ln_1.weight"),
    ("ln_1.bias", "layer_norm1.bias", "ln_1.bias"),
    ("attn.proj.weight", "self_attn.out_proj.weight", "attn.out_proj.weight"),
    ("attn.proj.bias", "self_attn.out_proj.bias", "attn.out_proj.bias"),
    ("ln_2.weight", "layer_norm2.weight", "ln_2.weight"),
    ("ln_2.bias", "layer_norm2.bias", "ln_2.bias"),
    ("mlp.fc.weight", "mlp.fc1.weight", "mlp.c_fc.weight"),
    ("mlp.fc.bias", "mlp.fc1.bias", "mlp.c_fc.bias"),
    ("mlp.proj.weight", "mlp.fc2.weight", "mlp.c_proj.weight"),
    ("mlp.proj.bias", "mlp.fc2.bias", "mlp.c_proj.bias"),
]
# Whole-model keys: (ours, Hugging Face, OpenAI, OpenAI stores it transposed).
_TOP_KEYS = [
    ("image_encoder.conv1.weight", "vision_model.embeddings.patch_embedding.weight", "visual.conv1.weight", False),
    ("image_encoder.class_embedding", "vision_model.embeddings.class_embedding", "visual.class_embedding", False),
    (
        "image_encoder.positional_embedding",
        "vision_model.embeddings.position_embedding.weight",
        "visual.positional_embedding",
        False,
    ),
    ("image_encoder.ln_pre.weight", "vision_model.pre_layrnorm.weight", "visual.ln_pre.weight", False),
    ("image_encoder.ln_pre.bias", "vision_model.pre_layrnorm.bias", "visual.ln_pre.bias", False),
    ("image_encoder.ln_post.weight", "vision_model.post_layernorm.weight", "visual.ln_post.weight", False),
    ("image_encoder.ln_post.bias", "vision_model.post_layernorm.bias", "visual.ln_post.bias", False),
    ("image_encoder.proj.weight", "visual_projection.weight", "visual.proj", True),
    (
        "text_encoder.token_embedding.weight",
        "text_model.embeddings.token_embedding.weight",
        "token_embedding.weight",
        False,
    ),
    (
        "text_encoder.positional_embedding",
        "text_model.embeddings.position_embedding.weight",
        "positional_embedding",
        False,
    ),
    ("text_encoder.ln_final.weight", "text_model.final_layer_norm.weight", "ln_final.weight", False),
    ("text_encoder.ln_final.bias", "text_model.final_layer_norm.bias", "ln_final.bias", False),
    ("text_encoder.proj.weight", "text_projection.weight", "text_projection", True),
    ("logit_scale", "logit_scale", "logit_scale", False),
]
_TOWERS = {
    "image_encoder": ("vision_model.encoder.layers", "visual.transformer.resblocks"),
    "text_encoder": ("text_model.encoder.layers", "transformer.resblocks"),
}


# open_clip's own names first, in its order of preference (open_clip.factory._find_checkpoint_in_dir).
_WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin", "model.safetensors", "pytorch_model.bin")


def _layers(sd: dict[str, Tensor], prefix: str) -> int:
    return len({k[len(prefix) + 1 :].split(".")[0] for k in sd if k.startswith(prefix + ".")})


def hf_to_zoo(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename a ``CLIPModel`` state dict into ``CLIP``'s keys, fusing each block's q, k, v."""
    out = {ours: sd[hf] for ours, hf, _, _ in _TOP_KEYS}
    out["logit_scale"] = out["logit_scale"].reshape(1)  # a scalar there, (1,) here (FSDP2 shards along dim 0)
    for tower, (hf_prefix, _) in _TOWERS.items():
        for i in range(_layers(sd, hf_prefix)):
            src, dst = f"{hf_prefix}.{i}", f"{tower}.blocks.{i}"
            for ours, hf, _ in _BLOCK_KEYS:
                out[f"{dst}.{ours}"] = sd[f"{src}.{hf}"]
            for kind in ("weight", "bias"):
                out[f"{dst}.attn.qkv.{kind}"] = torch.cat([sd[f"{src}.self_attn.{p}_proj.{kind}"] for p in "qkv"])
    return out


def openai_to_zoo(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename an OpenAI/open_clip CLIP state dict into ``CLIP``'s keys, projections transposed."""
    out = {ours: (sd[oa].t().contiguous() if t else sd[oa]) for ours, _, oa, t in _TOP_KEYS}
    out["logit_scale"] = out["logit_scale"].reshape(1)
    for tower, (_, oa_prefix) in _TOWERS.items():
        for i in range(_layers(sd, oa_prefix)):
            src, dst = f"{oa_prefix}.{i}", f"{tower}.blocks.{i}"
            for ours, _, oa in _BLOCK_KEYS:
                out[f"{dst}.{ours}"] = sd[f"{src}.{oa}"]
            out[f"{dst}.attn.qkv.weight"] = sd[f"{src}.attn.in_proj_weight"]
            out[f"{dst}.attn.qkv.bias"] = sd[f"{src}.attn.in_proj_bias"]
    return out


def zoo_to_openai(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of ``openai_to_zoo``, for writing open_clip-readable state dicts."""
    out = {oa: (sd[ours].t().contiguous() if t else sd[ours]) for ours, _, oa, t in _TOP_KEYS}
    out["logit_scale"] = out["logit_scale"].reshape(())
    for tower, (_, oa_prefix) in _TOWERS.items():
        for i in range(_layers(sd, f"{tower}.blocks")):
            src, dst = f"{tower}.blocks.{i}", f"{oa_prefix}.{i}"
            for ours, _, oa in _BLOCK_KEYS:
                out[f"{dst}.{oa}"] = sd[f"{src}.{ours}"]
            out[f"{dst}.attn.in_proj_weight"] = sd[f"{src}.attn.qkv.weight"]
            out[f"{dst}.attn.in_proj_bias"] = sd[f"{src}.attn.qkv.bias"]
    return out


# The fields of a CLIPConfig the zoo reads that have no default (transformers writes them all).
HF_CLIP_FIELDS = tuple(
    f"{tower}_config.{field}"
    for tower in ("vision", "text")
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
) + ("vision_config.image_size", "vision_config.patch_size", "text_config.vocab_size")


def hf_clip_kwargs(config: dict, where: str | Path = "config.json") -> dict:
    """``CLIP``, ``VisionTransformer`` and ``TextTransformer`` arguments for a Hugging Face ``CLIPConfig`` dict read
    from ``where``; an ``InputError`` naming a field it lacks."""
    require_fields(config, HF_CLIP_FIELDS, where)
    v, t = config["vision_config"], config["text_config"]
    for name, c in (("vision", v), ("text", t)):
        if c.get("hidden_act", "quick_gelu") not in ("quick_gelu", "gelu"):
            raise ValueError(f"the {name} tower's hidden_act {c['hidden_act']!r} is not quick_gelu or gelu")
    embed = config.get("projection_dim", 512)
    # Checkpoints made before transformers PR #24773 say eos_token_id=2 and pool at the largest id, which
    # is CLIP's end-of-text token (the last of the vocabulary).
    eot = t.get("eos_token_id", 49407)
    eot = t["vocab_size"] - 1 if eot == 2 else eot
    vision = dict(
        image_size=v["image_size"],
        patch_size=v["patch_size"],
        in_channels=v.get("num_channels", 3),
        width=v["hidden_size"],
        layers=v["num_hidden_layers"],
        heads=v["num_attention_heads"],
        mlp_ratio=v["intermediate_size"] / v["hidden_size"],
        embed_dim=embed,
        pool="cls",
        act=v.get("hidden_act", "quick_gelu"),
        norm_eps=v.get("layer_norm_eps", 1e-5),
    )
    text = dict(
        vocab_size=t["vocab_size"],
        context_length=t.get("max_position_embeddings", 77),
        width=t["hidden_size"],
        layers=t["num_hidden_layers"],
        heads=t["num_attention_heads"],
        mlp_ratio=t["intermediate_size"] / t["hidden_size"],
        embed_dim=embed,
        eot_id=eot,
        act=t.get("hidden_act", "quick_gelu"),
        norm_eps=t.get("layer_norm_eps", 1e-5),
    )
    return {"vision": vision, "text": text, "init_logit_scale": config.get("logit_scale_init_value", 2.6592)}


def _weights_file(folder: Path) -> Path:
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"No {' or '.join(_WEIGHT_FILES)} in {str(folder)!r}: point at a Hugging Face CLIP folder (config.json and "
        "weights, e.g. written by CLIPModel.save_pretrained) or an open_clip one (open_clip_config.json and weights)"
    )


def _read_config(folder: Path) -> dict:
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"No config.json in {str(folder)!r}: point at a Hugging Face CLIP folder")
    return read_config(folder / "config.json")  # no code named, each field read of its type


def folder_net(folder: str | Path) -> dict:
    """The ``CLIP`` (``{class_path, init_args}``) a Hugging Face CLIP or SigLIP folder's ``config.json`` states."""
    config = _read_config(Path(folder))
    if config.get("model_type") == "siglip":
        return siglip.siglip_net(siglip.siglip_kwargs(config, Path(folder) / "config.json"))
    k = hf_clip_kwargs(config, Path(folder) / "config.json")
    block = clip_net(k)
    block["init_args"]["init_logit_scale"] = k["init_logit_scale"]
    return block


def load_hf_clip(folder: str | Path) -> CLIP:
    """A ``CLIP`` built from a local Hugging Face CLIP or SigLIP folder's config, holding its weights."""
    block = folder_net(folder)
    build.check_net(block, str(folder))
    args = dict(block["init_args"])
    towers = (
        VisionTransformer(**args.pop("image_encoder")["init_args"]),
        TextTransformer(**args.pop("text_encoder")["init_args"]),
    )
    return load_hf_clip_into(CLIP(*towers, **args), folder)


def load_hf_clip_into(net: CLIP, path: str | Path) -> CLIP:
    """Weights into a configured ``net`` from a Hugging Face folder, an OpenAI/open_clip state dict file or
    folder, or a file of the zoo's own keys (a Lightning checkpoint included); ``load_source_into``."""
    load_source_into(net, path)
    return net


def load_source_into(net: CLIP, path: str | Path) -> str:
    """Weights into ``net`` as ``load_hf_clip_into``; returns the layout they came in: ``hf``, ``siglip``, ``openai`` or
    ``zoo``.
    Every key and shape is checked, except the towers' output projections: one of another embedding size is
    replaced (fine-tuning to a new joint space), and a line says so."""
    path = Path(path)
    sd = extract_state_dict(load_file(_weights_file(path) if path.is_dir() else path), "net.")
    layout = "zoo"
    if siglip.PROBE in sd:
        sd, layout = siglip.siglip_to_zoo(sd, f"CLIP weights {str(path)!r}"), "siglip"
        if float(sd["logit_scale"]) > net.max_logit_scale:  # the forward would clamp what SigLIP does not
            raise InputError(
                f"CLIP weights {str(path)!r} have logit_scale {float(sd['logit_scale']):.4g}, above the net's "
                f"max_logit_scale {net.max_logit_scale:.4g}: leave max_logit_scale out of the net block (the folder's "
                "config sets it)"
            )
    elif "vision_model.embeddings.class_embedding" in sd:
        sd, layout = hf_to_zoo(sd), "hf"
    elif "visual.class_embedding" in sd:
        sd, layout = openai_to_zoo(sd), "openai"
    if net.logit_bias is not None and "logit_bias" not in sd:  # CLIP weights, a SigLIP loss: keep the fresh bias
        sd["logit_bias"] = net.logit_bias.detach().clone()
    # A tower without a projection (SigLIP's image tower) has none to replace: its last linear is its head's MLP.
    towers = [
        name
        for name in ("image_encoder", "text_encoder")
        if not isinstance(getattr(getattr(net, name), "proj", None), nn.Identity)
    ]
    heads = [f"{name}.{classifier_head(getattr(net, name))}" for name in towers]
    for line in load_with_new_head(net, sd, f"CLIP weights {str(path)!r}", heads):
        rank_zero_info(f"init_weights: replaced a tower's projection, {line}")
    return layout


def clip_net(k: dict) -> dict:
    """The ``CLIP`` config (``{class_path, init_args}``) of the towers' arguments ``k["vision"]`` and ``k["text"]``."""
    return {
        "class_path": "zoo.clip.CLIP",
        "init_args": {
            "image_encoder": {"class_path": "zoo.clip.VisionTransformer", "init_args": k["vision"]},
            "text_encoder": {"class_path": "zoo.clip.TextTransformer", "init_args": k["text"]},
        },
    }


def zoo_yaml(folder: str | Path) -> str:
    """The ``model.init_args.net`` YAML block matching a Hugging Face CLIP or SigLIP folder, for a config file."""
    return yaml.safe_dump({"net": folder_net(folder)}, sort_keys=False)


def _main() -> None:
    parser = argparse.ArgumentParser(description="Zoo CLIP settings for a Hugging Face CLIP folder.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("config", help="print the YAML net block for a Hugging Face folder").add_argument("folder")
    args = parser.parse_args()
    print(zoo_yaml(args.folder), end="")


if __name__ == "__main__":
    _main()
