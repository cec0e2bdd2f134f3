"""Phi-3 and Phi-4-mini (``model_type: phi3``) weights in and out of the zoo's ``GPT``, from and to Hugging Face
folders on disk.

transformers' ``Phi3ForCausalLM`` (Abdin et al. 2024, "Phi-3 Technical Report"; Microsoft 2025, "Phi-4-Mini") is a
Llama with no biases, whose layers store their projections fused, as ours do:

- ``qkv_proj`` is our ``MHA.qkv`` (q, k, v heads stacked by rows) and ``gate_up_proj`` our SwiGLU ``fc`` ([gate |
  up]): both read and written as they are.
- ``partial_rotary_factor`` (Phi-4-mini: 0.75) rotates the first ``int(head_dim * factor)`` channels of each head,
  pairing (i, i + r/2) within them as transformers' ``rotate_half`` of the rotary part does: ``MHA(rope_dim=r)``.
- ``rope_type: longrope`` (also the legacy ``su`` and ``yarn`` names, as Phi3Config renames them) is
  ``attention.LongRoPE``: ``short_factor`` for sequences of at most ``original_max_position_embeddings`` tokens,
  ``long_factor`` for the whole of a longer one, cos and sin times ``attention_factor`` (stated, else sqrt(1 +
  ln(factor) / ln(original)) with ``factor`` stated, else max_position_embeddings / original; 1 when factor <= 1).
  ``original_max_position_embeddings`` stated both at the top and inside the RoPE settings must agree (transformers
  reads one or the other, depending on the type's name). Decoding re-prefills its cache when a sequence first grows
  past the original context, where transformers' Phi-3 ``generate`` drops its cache (``GPT.rope_restarts``).
- ``sliding_window`` is applied by transformers' Phi-3 in every layer whenever it is not null, as Mistral's: one
  shorter than the context (Phi-3-mini-4k's 2047 of 4096) is ``GPT(sliding_window=W)`` with every layer sliding.

Every key of ``config.json`` is read: what the function depends on is implemented or refused by name, and the rest
is listed below as changing nothing transformers computes (dropouts, ids, bookkeeping, and the bias switches that
transformers' Phi-3 ignores: a bias tensor in the files is left over and refused). An unknown key is refused.

    python -m zoo.gpt export <lightning.ckpt> <out_folder> --format phi3   # Phi3ForCausalLM, fused projections
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.attention import MHA, Llama3RoPE, LongRoPE
from zoo.gpt.formats.checks import check_tied_head, missing_tensors_named
from zoo.gpt.formats.folder import Folder
from zoo.gpt.formats.llama import _NORM_KEYS, _read_folder, write_folder
from zoo.gpt.gpt import GPT
from zoo.gpt.mlp import SwiGLU
from zoo.gpt.norms import RMSNorm
from zoo.io.meta_load import assign_weights, on_meta
from zoo.io.weights import check_all_used, check_compatible

# Phi3Config's keys that set the function: each read by ``phi3_net_kwargs`` (rope_scaling is the older name of
# rope_parameters; head_dim, which Phi3Config has not, is refused unless hidden_size / num_attention_heads).
READ = {
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "original_max_position_embeddings",
    "rms_norm_eps", "tie_word_embeddings", "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
    "sliding_window", "head_dim",
}  # fmt: skip
# Keys that change no logit: training dropouts (the zoo's one ``dropout`` setting is the run's own), token ids (the
# tokenizer's and generation_config.json's), transformers' bookkeeping, and switches transformers' Phi-3 ignores
# (its projections never have biases; Phi-4-mini states full_attn_mod and interpolate_factor for no code of it).
INERT = {
    "resid_pdrop", "embd_pdrop", "attention_dropout", "initializer_range", "use_cache", "bos_token_id",
    "eos_token_id", "pad_token_id", "architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path",
    "auto_map", "attention_bias", "mlp_bias", "lm_head_bias", "full_attn_mod", "interpolate_factor", "return_dict",
    "output_hidden_states", "output_attentions", "id2label", "label2id", "problem_type", "tokenizer_class",
    "chunk_size_feed_forward", "is_encoder_decoder", "tie_encoder_decoder", "add_cross_attention", "is_decoder",
}  # fmt: skip
_LONGROPE = ("longrope", "su", "yarn")  # Phi3Config's names for LongRoPE (the two older ones renamed on load)


def _check_keys(config: dict) -> None:
    unknown = sorted(set(config) - READ - INERT)
    if unknown:
        raise InputError(
            f"config.json (model_type 'phi3') sets {', '.join(unknown)}, which the zoo's Phi-3 converter does not "
            "know: it cannot tell whether the model computes what transformers' Phi3ForCausalLM does without them"
        )


def _rope(config: dict, head_dim: int) -> dict:
    """``rope_base``, ``rope_scaling`` and the rotated channels per head, as Phi3Config standardises them."""
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}  # Phi3Config: rope_scaling first
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    fraction = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    rope_dim = int(head_dim * fraction)
    if not (0 < fraction <= 1) or rope_dim % 2:
        raise InputError(
            f"partial_rotary_factor {fraction} rotates {rope_dim} of {head_dim} channels per head: the zoo rotates an "
            "even number of them, at least 2 (transformers' rotate_half pairs them)"
        )
    out = dict(rope_base=theta, rope_dim=rope_dim)
    if kind == "default":
        return out
    if kind not in _LONGROPE:
        raise InputError(
            f"RoPE scaling {kind!r} is not one transformers' Phi-3 implements: rope_type 'default' or 'longrope'"
        )
    original = config.get("original_max_position_embeddings", 4096)
    if params.get("original_max_position_embeddings", original) != original:  # transformers reads one or the other
        raise InputError(
            f"original_max_position_embeddings is {original} in config.json and "
            f"{params['original_max_position_embeddings']} in its RoPE settings: state one value"
        )
    factors = [params.get(k) for k in ("short_factor", "long_factor")]
    numbers = (isinstance(x, (int, float)) and not isinstance(x, bool) for f in factors for x in f)
    if not all(isinstance(f, list) and len(f) == rope_dim // 2 for f in factors) or not all(numbers):
        raise InputError(
            f"longrope's short_factor and long_factor must be lists of {rope_dim // 2} numbers (rotated channels / 2)"
        )
    factor = params.get("factor") or config.get("max_position_embeddings", 4096) / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    scaling = LongRoPE([float(f) for f in factors[0]], [float(f) for f in factors[1]], original, float(attention))
    return out | dict(rope_scaling=scaling)


def phi3_net_kwargs(config: dict) -> dict:
    """``GPT`` arguments for a Hugging Face ``Phi3Config`` dict (Phi-3, Phi-3.5-mini, Phi-4-mini), its defaults
    Phi3Config's; every key read, or refused by name."""
    _check_keys(config)
    window, n = config.get("sliding_window"), config.get("num_hidden_layers", 32)
    slides = window is not None and window < config.get("max_position_embeddings", 4096)
    d, h = config.get("hidden_size", 3072), config.get("num_attention_heads", 32)
    if config.get("head_dim") not in (None, d // h):
        raise InputError(
            f"head_dim {config['head_dim']} is not hidden_size / num_attention_heads ({d // h}), which transformers' "
            "Phi-3 attention and RoPE disagree on: remove head_dim from config.json only if it is the model's"
        )
    rope = _rope(config, d // h)
    attn = dict(n_kv_head=config.get("num_key_value_heads") or h)
    if rope["rope_dim"] != d // h:
        attn["rope_dim"] = rope["rope_dim"]
    return dict(
        vocab_size=config.get("vocab_size", 32064),
        block_size=config.get("max_position_embeddings", 4096),
        n_layer=config.get("num_hidden_layers", 32),
        n_embd=d,
        n_head=h,
        attention=partial(MHA, **attn),
        norm=RMSNorm,
        norm_eps=config.get("rms_norm_eps", 1e-5),
        mlp=SwiGLU.from_hf_config(config),
        mlp_hidden=config.get("intermediate_size", 8192),
        position="rope",
        rope_base=rope["rope_base"],
        **({"rope_scaling": rope["rope_scaling"]} if "rope_scaling" in rope else {}),
        bias=False,
        tie_embeddings=config.get("tie_word_embeddings", False),
        **(dict(sliding_window=window, layer_types=["sliding_attention"] * n) if slides else {}),
    )


# (ours, theirs) inside block i / model.layers.i: the fused projections as they are.
_KEYS = [
    *_NORM_KEYS,
    ("attn.qkv.weight", "self_attn.qkv_proj.weight"),
    ("attn.proj.weight", "self_attn.o_proj.weight"),
    ("mlp.fc.weight", "mlp.gate_up_proj.weight"),
    ("mlp.proj.weight", "mlp.down_proj.weight"),
]


def hf_to_zoo(sd: Mapping[str, Tensor], net: GPT) -> dict[str, Tensor]:
    """A Phi3ForCausalLM state dict in ``net``'s keys; a tied net's head is the embedding when the file has none."""
    out = {"tok_emb.weight": sd["model.embed_tokens.weight"], "norm_f.weight": sd["model.norm.weight"]}
    for i in range(net.n_layer):
        out |= {f"blocks.{i}.{ours}": sd[f"model.layers.{i}.{theirs}"] for ours, theirs in _KEYS}
    tied = net.lm_head.weight is net.tok_emb.weight
    out["lm_head.weight"] = sd.get("lm_head.weight", out["tok_emb.weight"]) if tied else sd["lm_head.weight"]
    return out


def zoo_to_hf(sd: Mapping[str, Tensor], net: GPT) -> dict[str, Tensor]:
    """The inverse of ``hf_to_zoo``."""
    out = {
        "model.embed_tokens.weight": sd["tok_emb.weight"],
        "model.norm.weight": sd["norm_f.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(net.n_layer):
        out |= {f"model.layers.{i}.{theirs}": sd[f"blocks.{i}.{ours}"] for ours, theirs in _KEYS}
    return out


def load_phi3_into(net: GPT, folder: str | Path | Folder) -> GPT:
    """Copy a local Phi-3 folder's weights into ``net``: every parameter set and every tensor of the files used, or
    an error naming what is left."""
    read, source = _read_folder(folder)
    folder = read.path
    phi3_net_kwargs(read.config)  # refuses what no GPT computes, whatever net it goes into
    name = f"Hugging Face folder {str(folder)!r}"
    with missing_tensors_named(name):
        sd = hf_to_zoo(source, net)
    check_compatible(net, sd, name)
    check_all_used(set(source), set(zoo_to_hf(on_meta(sd), net)), name, ("rotary_emb.inv_freq",))
    check_tied_head(net, sd, name)
    return assign_weights(net, sd, name)


def _refuse(why: str, other: str = "llama") -> InputError:
    return InputError(f"{why}: this net has no Phi3ForCausalLM form; export it with --format {other}")


def hf_config(net: GPT) -> dict:
    """The ``config.json`` of ``net`` as a Phi-3 model, or one error naming what a Phi-3 cannot hold."""
    attn, mlps = net.blocks[0].attn, [block.mlp for block in net.blocks]
    if net.position != "rope" or net.norm_f.hf_layout != "llama" or any(type(m) is not SwiGLU for m in mlps):
        raise _refuse("A Phi-3 has RoPE, RMSNorm and SwiGLU MLPs in every layer", "gpt2 or --format llama")
    if not isinstance(attn, MHA) or hasattr(attn, "q_norm") or attn.qkv.bias is not None or net.mtp:
        raise _refuse("A Phi-3's attention is MHA/GQA without q/k norms or q/k/v biases, and it has no MTP layers")
    if attn.proj.bias is not None or mlps[0].proj.bias is not None:
        raise _refuse("A Phi-3 has no biases")
    if attn.head_dim * attn.n_head != net.n_embd or isinstance(net.rope_scaling, Llama3RoPE):
        raise _refuse("A Phi-3's head size is hidden_size / heads and its RoPE scaling is none or longrope")
    if set(net.layer_types) not in ({"full_attention"}, {"sliding_attention"}):
        raise _refuse(f"A Phi-3's layers all slide or none does, not {net.layer_types}")
    fraction = attn.rope_dim / attn.head_dim
    if int(attn.head_dim * fraction) != attn.rope_dim:
        raise _refuse(f"rope_dim {attn.rope_dim} of head_dim {attn.head_dim} is no partial_rotary_factor")
    rope = {"rope_type": "default", "rope_theta": net.rope_base, "partial_rotary_factor": fraction}
    original = net.block_size
    if isinstance(net.rope_scaling, LongRoPE):
        s = net.rope_scaling
        rope |= dict(rope_type="longrope", short_factor=s.short_factor, long_factor=s.long_factor)
        rope |= dict(attention_factor=s.attention_factor, original_max_position_embeddings=s.long_after())
        original = s.long_after()
    return dict(
        model_type="phi3",
        architectures=["Phi3ForCausalLM"],
        vocab_size=net.vocab_size,
        hidden_size=net.n_embd,
        intermediate_size=mlps[0].proj.in_features,
        num_hidden_layers=net.n_layer,
        num_attention_heads=attn.n_head,
        num_key_value_heads=attn.n_kv_head,
        hidden_act="silu",
        max_position_embeddings=net.block_size,
        original_max_position_embeddings=original,
        **net.norm_f.hf_config(),
        tie_word_embeddings=net.lm_head.weight is net.tok_emb.weight,
        rope_parameters=rope,
        partial_rotary_factor=fraction,
        sliding_window=net.sliding_window if "sliding_attention" in net.layer_types else None,
        bos_token_id=None,  # Phi3Config's defaults are Phi-3's ids (pad 32000), past a smaller vocabulary's end;
        eos_token_id=None,  # generation_config.json states the tokenizer's (zoo.gpt.export)
        pad_token_id=None,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attention_dropout=0.0,
    )


def export_phi3(net: GPT, folder: str | Path) -> Path:
    """Write ``net`` as a Hugging Face Phi-3 folder (``Phi3ForCausalLM``) that transformers loads."""
    return write_folder(net, folder, hf_config(net), zoo_to_hf)
