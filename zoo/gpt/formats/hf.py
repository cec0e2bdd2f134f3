"""GPT-2 weights in and out of the zoo's ``GPT``, from and to Hugging Face checkpoint folders on disk.

A Hugging Face GPT-2 folder holds ``config.json`` and ``model.safetensors`` (or ``pytorch_model.bin``).
Its linear layers are ``Conv1D`` modules that store weights as (in, out), the transpose of
``nn.Linear``; its ``c_attn`` packs [q | k | v] in the order our ``MHA.qkv`` does. Nothing is
downloaded: point at a folder (``save_pretrained`` output, or a hub snapshot copied by hand).

    python -m zoo.gpt export <lightning.ckpt> <out_folder>        # our checkpoint -> HF GPT-2 folder
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.attention import MHA
from zoo.gpt.formats.checks import check_tied_head, gemma_settings, missing_tensors_named
from zoo.gpt.formats.folder import Folder
from zoo.gpt.gpt import GPT
from zoo.gpt.mlp import GeluMLP
from zoo.gpt.norms import LayerNorm
from zoo.io import budget
from zoo.io.files import read_config, replacing
from zoo.io.meta_load import assign_weights, on_meta, read_tensors, under
from zoo.io.weights import check_all_used, check_compatible, extract_state_dict

# (ours, theirs) per block; "T" marks Conv1D weights that are stored transposed.
_BLOCK_KEYS = [
    ("norm1.weight", "ln_1.weight", ""),
    ("norm1.bias", "ln_1.bias", ""),
    ("attn.qkv.weight", "attn.c_attn.weight", "T"),
    ("attn.qkv.bias", "attn.c_attn.bias", ""),
    ("attn.proj.weight", "attn.c_proj.weight", "T"),
    ("attn.proj.bias", "attn.c_proj.bias", ""),
    ("norm2.weight", "ln_2.weight", ""),
    ("norm2.bias", "ln_2.bias", ""),
]  # the MLP's keys are its class's (``to_hf``, ``from_hf``)
_TOP_KEYS = [
    ("tok_emb.weight", "wte.weight"),
    ("pos_emb.weight", "wpe.weight"),
    ("norm_f.weight", "ln_f.weight"),
    ("norm_f.bias", "ln_f.bias"),
]


def gpt2_net_kwargs(config: dict) -> dict:
    """``GPT`` arguments for a Hugging Face ``GPT2Config`` dict."""
    return dict(
        vocab_size=config["vocab_size"],
        block_size=config.get("n_positions", config.get("n_ctx", 1024)),
        n_layer=config["n_layer"],
        n_embd=config["n_embd"],
        n_head=config["n_head"],
        mlp_hidden=config.get("n_inner") or 4 * config["n_embd"],
        norm_eps=config.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=config.get("tie_word_embeddings", True),
        attention=MHA,
        norm=LayerNorm,
        mlp=GeluMLP.from_hf_config(config),
        position="learned",
        bias=True,
    )


def hf_to_zoo(sd: Mapping[str, Tensor], net: GPT) -> dict[str, Tensor]:
    """Rename and transpose a GPT2LMHeadModel (or GPT2Model) state dict into ``net``'s keys; ``sd`` may read its
    tensors as asked (``zoo.io.meta_load``), each read once."""
    pre = "transformer." if any(k.startswith("transformer.") for k in sd) else ""
    out = {ours: sd[pre + theirs] for ours, theirs in _TOP_KEYS}
    for i, block in enumerate(net.blocks):
        for ours, theirs, t in _BLOCK_KEYS:
            w = sd[f"{pre}h.{i}.{theirs}"]
            out[f"blocks.{i}.{ours}"] = w.t().contiguous() if t else w
        layer = under(sd, f"{pre}h.{i}.")
        out.update({f"blocks.{i}.mlp.{k}": v for k, v in block.mlp.from_hf(layer).items()})
    out["lm_head.weight"] = sd.get("lm_head.weight", out["tok_emb.weight"])
    return out


def zoo_to_hf(sd: dict[str, Tensor], net: GPT) -> dict[str, Tensor]:
    """The inverse of ``hf_to_zoo``: GPT2LMHeadModel keys, Conv1D weights transposed back."""
    out = {f"transformer.{theirs}": sd[ours] for ours, theirs in _TOP_KEYS}
    for i, block in enumerate(net.blocks):
        for ours, theirs, t in _BLOCK_KEYS:
            w = sd[f"blocks.{i}.{ours}"]
            out[f"transformer.h.{i}.{theirs}"] = w.t().contiguous() if t else w
        mlp = {k.removeprefix(f"blocks.{i}.mlp."): v for k, v in sd.items() if k.startswith(f"blocks.{i}.mlp.")}
        out.update({f"transformer.h.{i}.{k}": v for k, v in block.mlp.to_hf(mlp).items()})
    out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def _weights_file(folder: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"No model.safetensors or pytorch_model.bin in {str(folder)!r}: point at a Hugging Face GPT-2 folder "
        f"(config.json and weights), e.g. one written by GPT2LMHeadModel.save_pretrained"
    )


def load_gpt2(folder: str | Path) -> GPT:
    """A ``GPT`` holding the GPT-2 weights of a local Hugging Face folder (weights-only loading)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"No config.json in {str(folder)!r}: point at a Hugging Face GPT-2 folder")
    kwargs = gpt2_net_kwargs(read_config(folder / "config.json"))
    budget.check_kwargs(GPT, kwargs, str(folder))
    net = GPT(**kwargs)
    load_gpt2_into(net, folder)
    return net


# Buffers older GPT-2 files hold beside the weights: the causal mask and its fill value, rebuilt by any model.
_DERIVED = (".attn.bias", ".attn.masked_bias")


def load_gpt2_into(net: GPT, folder: str | Path) -> GPT:
    """Copy a local Hugging Face GPT-2 folder's weights into ``net``: every parameter set and every tensor of the
    file used (a tied head only where the file's equals the embedding), or an error naming what is left over."""
    folder = Path(folder)
    name = f"GPT-2 folder {str(folder)!r}"
    source = read_tensors([_weights_file(folder)])
    with missing_tensors_named(name):
        sd = hf_to_zoo(source, net)
    check_compatible(net, sd, name)
    pre = "transformer." if any(k.startswith("transformer.") for k in source) else ""
    written = zoo_to_hf(on_meta(sd), net)  # names only: nothing transposed back
    used = {k if k == "lm_head.weight" else pre + k.removeprefix("transformer.") for k in written}
    check_all_used(source, used, name, _DERIVED)
    check_tied_head(net, sd, name)
    return assign_weights(net, sd, name)


def export_gpt2(net: GPT, folder: str | Path, eos_id: int | None = None) -> Path:
    """Write ``net`` as a Hugging Face GPT-2 folder (config.json, model.safetensors) that transformers loads.

    ``eos_id`` becomes the config's bos/eos token id (GPT-2's 50256 when None and the vocabulary has it).
    """
    from safetensors.torch import save_file

    attn, mlp = net.blocks[0].attn, net.blocks[0].mlp
    gpt2_shaped = isinstance(attn, MHA) and attn.n_kv_head == attn.n_head and net.norm_f.hf_layout == "gpt2"
    layouts = {block.mlp.hf_layout for block in net.blocks}  # as each class states ("deepseek_v3" for an MoE)
    if not gpt2_shaped or layouts != {"gpt2"} or net.position != "learned":
        raise InputError(
            f"Only a GPT-2-shaped net (MHA, learned positions, LayerNorm, GELU MLPs) exports as GPT-2, not one with "
            f"{sorted(layouts)} MLPs (a mixture-of-experts net exports with --format llama)"
        )
    if odd := gemma_settings(net) + ["sliding_window"] * (net.sliding_window is not None):
        raise InputError(f"GPT-2's config has no {', '.join(odd)}: this net does not export as GPT-2")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = zoo_to_hf({k: v.detach().cpu() for k, v in net.state_dict().items()}, net)
    tied = net.lm_head.weight is net.tok_emb.weight
    if tied:
        del sd["lm_head.weight"]  # transformers re-ties it from wte
    # safetensors writes a file beside it and renames it over: a link planted at the name is replaced, as here.
    save_file({k: v.contiguous() for k, v in sd.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        **mlp.hf_config(),
        "vocab_size": net.vocab_size,
        "n_positions": net.block_size,
        "n_ctx": net.block_size,
        "n_embd": net.tok_emb.weight.shape[1],
        "n_layer": net.n_layer,
        "n_head": attn.n_head,
        **net.norm_f.hf_config(),
        "tie_word_embeddings": tied,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }
    if eos_id is None and net.vocab_size > 50256:
        eos_id = 50256
    config["bos_token_id"] = config["eos_token_id"] = eos_id
    with replacing(folder / "config.json") as tmp:  # a link planted in the folder is replaced, not followed
        tmp.write_text(json.dumps(config, indent=2))
    return folder


def save_safetensors(net: GPT, path: str | Path) -> Path:
    """Our own weights as one safetensors file; ``save_model`` stores the tied embedding once."""
    from safetensors.torch import save_model

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(net, str(path))
    return path


def load_safetensors(net: GPT, path: str | Path) -> GPT:
    """Load ``save_safetensors`` output (or any file of this net's keys), tied head included, shapes checked."""
    sd = extract_state_dict(read_tensors([path]), "net.")  # a zoo checkpoint's net too
    if net.lm_head.weight is net.tok_emb.weight:  # save_model keeps one name of the tied pair
        for a, b in (("lm_head.weight", "tok_emb.weight"), ("tok_emb.weight", "lm_head.weight")):
            if a not in sd and b in sd:
                sd[a] = sd[b]
    check_compatible(net, sd, f"weights file {str(path)!r}")
    return assign_weights(net, sd, f"weights file {str(path)!r}")


def load_pretrained(net: GPT, path: str | Path | Folder) -> GPT:
    """A Hugging Face GPT-2, Llama, Mixtral or DeepSeek-V3 folder (a ``Folder`` already read, or its path), or a
    safetensors/checkpoint file of this net, into ``net``."""
    if not isinstance(path, Folder):
        path = Path(path)
        if not path.is_dir():
            return load_safetensors(net, path)
        if not (path / "config.json").is_file():  # GPT-2's weights alone
            return load_gpt2_into(net, path)
        path = Folder.read(path)
    kind = path.config["model_type"]
    if kind == "phi3":  # fused projections, in their own converter
        from zoo.gpt.formats.phi3 import load_phi3_into

        return load_phi3_into(net, path)
    if kind != "gpt2":
        from zoo.gpt.formats.llama import load_hf_into  # Llama, Mixtral and DeepSeek-V3 layouts

        return load_hf_into(net, path)
    return load_gpt2_into(net, path.path)


def pretrained_gpt(kwargs: dict, path: str | Path | Folder, dtype: torch.dtype = torch.float32) -> GPT:
    """``GPT(**kwargs)`` holding the weights at ``path`` (as ``load_pretrained`` reads them) in ``dtype``, built on the
    meta device and given each tensor by assignment (``zoo.io.meta_load``): no random initialisation, the weights never
    in memory twice, and a tensor stored in ``dtype`` kept as read. RoPE's tables are computed in float32 whatever
    ``dtype`` (transformers keeps its ``inv_freq`` so)."""
    with torch.device("meta"):
        net = GPT(**kwargs).to(dtype)
    net.init_buffers()  # RoPE's tables and the routers' statistics are computed, not loaded
    return load_pretrained(net, path)
