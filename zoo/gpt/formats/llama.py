"""Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral and DeepSeek-V3 weights in and out of the zoo's ``GPT``, from and to
Hugging Face folders on disk.

The zoo's GPT with ``norm=RMSNorm, mlp=SwiGLU, position="rope", bias=False`` and ``MHA(n_kv_head=G)`` is
transformers' ``LlamaForCausalLM`` (Touvron et al. 2023; with ``rope_scaling=Llama3RoPE(...)`` Llama 3.1-3.3's);
``MHA(qkv_bias=True)`` is Qwen2's attention, ``MHA(qk_norm=True, head_dim=...)`` Qwen3's; with ``MLA`` it is
``DeepseekV3ForCausalLM`` (DeepSeek-AI 2024, "DeepSeek-V3", MLA as in DeepSeek-V2 section 2.1): dense, or with
``mlp=MoE`` (sigmoid_bias routing) past ``first_k_dense`` dense layers (its ``first_k_dense_replace``). MHA with a
softmax-routed ``MoE`` and no shared experts is ``MixtralForCausalLM`` (Jiang et al. 2024), or with Qwen3's attention
``Qwen3MoeForCausalLM`` (its ``mlp_only_layers``/``decoder_sparse_step`` dense layers as the GPT's ``dense_layers``).
``rope_type: yarn`` is ``YaRNRoPE`` (DeepSeek-V3's hub config, Qwen3's long contexts); on MLA it also scales the
softmax, as transformers' DeepSeek-V3 does. Only the layout differs:

- our ``MHA.qkv`` is Llama's q_proj, k_proj, v_proj stacked by rows; our SwiGLU ``fc`` is [gate | up]; the
  MoE's names are its class's (``moe.py``: per expert in files, stacked in ours).
- RoPE pairs channels (i, i + d/2) in both Llama and ours ("rotate half"). DeepSeek's released weights
  pair (2i, 2i + 1) instead (``rope_interleave``, default True), so the RoPE rows of ``q_b_proj`` and
  ``kv_a_proj_with_mqa`` are reordered to [even | odd] on import; q.k is unchanged by the same reordering
  of q and k, and after it the interleaved rotation is ours. Exports write ``rope_interleave: false``.

A sliding window shorter than the context (Mistral v0.1's 4096, Mixtral's, Qwen2/3's ``use_sliding_window`` layers
from ``max_window_layers`` on, or their ``layer_types``) is ``GPT(sliding_window=..., layer_types=...)``, as
transformers masks it; Gemma 2/3 folders are ``gemma.py``'s, with these names and sandwich norms.

Not representable, and refused with a message: RoPE scaling other than ``llama3`` and ``yarn`` (linear, dynamic),
attention and MLP biases that differ (but Qwen2's), a ``sliding_window`` in a Llama config (which LlamaForCausalLM
ignores: say ``mistral``), DeepSeek MoE other than V3's (softmax scoring, ``moe_layer_freq`` > 1), Qwen2-MoE (a gated
shared expert) and quantized weights (``quantization_config``: DeepSeek-V3's released FP8; a bf16 conversion loads).
Multi-token-prediction layers (``model.layers.{num_hidden_layers}``) load into a net with ``mtp_depth`` (what
``zoo.gpt.pretrained`` builds) and are left out of one without, by that choice. Nothing is downloaded: point at a
folder.

    python -m zoo.gpt export <lightning.ckpt> <out_folder> --format llama   # MHA: Llama or Mixtral (MoE);
                                                                              # MLA: DeepSeek-V3 (dense or MoE)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.attention import MHA, MLA, Llama3RoPE, YaRNRoPE
from zoo.gpt.formats import gemma, llama_variants
from zoo.gpt.formats.checks import REFUSED, check_tied_head, gemma_settings, missing_tensors_named, refused
from zoo.gpt.formats.folder import Folder
from zoo.gpt.gpt import GPT
from zoo.gpt.mlp import SwiGLU
from zoo.gpt.moe import MoE
from zoo.gpt.mtp import hf_mtp_depth, mtp_to_hf, mtp_to_zoo
from zoo.gpt.norms import RMSNorm
from zoo.io import budget
from zoo.io.files import replacing
from zoo.io.meta_load import assign_weights, on_meta, read_tensors, under
from zoo.io.weights import check_all_used, check_compatible

# (ours, theirs) inside block i / model.layers.i, shared by both families.
_NORM_KEYS = [("norm1.weight", "input_layernorm.weight"), ("norm2.weight", "post_attention_layernorm.weight")]
# OLMo 2's, which norm each sublayer's output (a block with ``post_norm``).
_POST_NORM_KEYS = [
    ("norm1.weight", "post_attention_layernorm.weight"),
    ("norm2.weight", "post_feedforward_layernorm.weight"),
]
_SANDWICH_NORM_KEYS = [  # Gemma 2/3's: the pre-norms, and a norm after each branch (GPT's sandwich_norm)
    ("norm1.weight", "input_layernorm.weight"),
    ("post_attn_norm.weight", "post_attention_layernorm.weight"),
    ("norm2.weight", "pre_feedforward_layernorm.weight"),
    ("post_mlp_norm.weight", "post_feedforward_layernorm.weight"),
]
_FUSED = ("gate_up_proj", "down_proj")  # transformers 5's stacked experts, (E, 2F, D) and (E, D, F)
# (ours, theirs) for MHA's output projection and Qwen3's per-head norms, beside the stacked q, k, v.
_MHA_KEYS = [
    ("proj.weight", "o_proj.weight"),
    ("proj.bias", "o_proj.bias"),
    ("q_norm.weight", "q_norm.weight"),
    ("k_norm.weight", "k_norm.weight"),
]
# (ours, theirs) for DeepSeek's MLA projections; q_down/q_norm/q_up exist with a q_lora_rank, q_proj without.
_MLA_KEYS = [
    ("q_down.weight", "q_a_proj.weight"),
    ("q_down.bias", "q_a_proj.bias"),
    ("q_norm.weight", "q_a_layernorm.weight"),
    ("q_up.weight", "q_b_proj.weight"),
    ("q_proj.weight", "q_proj.weight"),
    ("kv_down.weight", "kv_a_proj_with_mqa.weight"),
    ("kv_down.bias", "kv_a_proj_with_mqa.bias"),
    ("kv_norm.weight", "kv_a_layernorm.weight"),
    ("kv_up.weight", "kv_b_proj.weight"),
    ("proj.weight", "o_proj.weight"),
    ("proj.bias", "o_proj.bias"),
]


def _rope(config: dict) -> dict:
    """``rope_base`` and ``rope_scaling`` from a transformers 5 ``rope_parameters`` dict or an older top-level
    ``rope_theta`` and ``rope_scaling``; a scaling other than Llama 3's refused by name."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    if kind == "default":
        return dict(rope_base=theta)
    if kind == "yarn":
        return dict(rope_base=theta, rope_scaling=_yarn(config, params))
    if kind != "llama3":
        raise InputError(
            f"RoPE scaling {kind!r} ({params!r}) is not implemented by the zoo's GPT: plain RoPE, Llama 3's "
            f"'llama3' and YaRN's 'yarn' scaling only"
        )
    fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return dict(rope_base=theta, rope_scaling=Llama3RoPE(**{k: params[k] for k in fields if k in params}))


# A yarn dict's keys as transformers' _compute_yarn_parameters reads them (partial_rotary_factor sizes the rotated
# channels, which the attention's rope_dim states).
_YARN_KEYS = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow"}
_YARN_KEYS |= {"mscale", "mscale_all_dim", "attention_factor", "truncate", "partial_rotary_factor"}


def _yarn(config: dict, params: dict) -> YaRNRoPE:
    """``YaRNRoPE`` of a ``rope_type: yarn`` dict, with transformers' defaults: beta_fast/beta_slow unset or 0 are 32
    and 1, a top-level original_max_position_embeddings (Phi-3's place) wins over the dict's, and without either the
    context is the original one (a null factor is refused by its type, ``zoo.io.config_fields``)."""
    unknown = sorted(set(params) - _YARN_KEYS)
    if unknown or "factor" not in params:
        raise InputError(
            f"YaRN rope scaling {params!r} {'sets ' + ', '.join(unknown) if unknown else 'lacks factor'}: the zoo "
            f"reads {', '.join(sorted(_YARN_KEYS - {'type', 'rope_type', 'rope_theta'}))}; fix config.json"
        )
    context = config.get("max_position_embeddings", 2048)
    old = config.get("original_max_position_embeddings") or params.get("original_max_position_embeddings") or context
    return YaRNRoPE(
        factor=float(params["factor"]),
        original_max_position_embeddings=old,
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )


def _check_quantization(config: dict) -> None:
    """A quantized folder (DeepSeek-V3's released FP8 weights with their ``weight_scale_inv`` blocks, GPTQ, AWQ, ...)
    holds other tensors than the model's: refused by name rather than loaded as numbers they are not."""
    q = config.get("quantization_config")
    if q is not None:
        method = q.get("quant_method", "?") if isinstance(q, dict) else "?"
        raise InputError(
            f"config.json states quantization_config (quant_method {method!r}): the zoo's GPT loads unquantized "
            f"weights only; use a bf16 or fp32 conversion of the model (a folder without quantization_config)"
        )


def _common_kwargs(config: dict) -> dict:
    return dict(
        vocab_size=config["vocab_size"],
        block_size=config.get("max_position_embeddings", 2048),
        n_layer=config["num_hidden_layers"],
        n_embd=config["hidden_size"],
        n_head=config["num_attention_heads"],
        norm=RMSNorm,
        norm_eps=config.get("rms_norm_eps", 1e-6),
        mlp=SwiGLU.from_hf_config(config),
        mlp_hidden=config["intermediate_size"],
        position="rope",
        **_rope(config),
        tie_embeddings=config.get("tie_word_embeddings", False),
    )


def _check_window(config: dict) -> None:
    window = config.get("sliding_window")
    if window and window < config.get("max_position_embeddings", 2048):
        raise InputError(
            f"sliding_window {window} in a model_type {config.get('model_type', 'llama')!r} config, whose "
            f"transformers model ignores it: set model_type mistral for a windowed model, or sliding_window null"
        )


def _window(config: dict) -> dict:
    """``sliding_window`` and ``layer_types`` as transformers reads them: Mistral's (default 4096) and Mixtral's
    window in every layer; Qwen2/3's, with ``use_sliding_window``, in their ``layer_types`` or the layers from
    ``max_window_layers`` on. None where no window is shorter than the context."""
    kind, n = config.get("model_type", "llama"), config["num_hidden_layers"]
    if kind in ("qwen2", "qwen3"):
        window = config.get("sliding_window", 4096) if config.get("use_sliding_window", False) else None
        types = config.get("layer_types") or [
            "sliding_attention" if window is not None and i >= config.get("max_window_layers", 28) else "full_attention"
            for i in range(n)
        ]
    elif kind in ("mistral", "mixtral"):  # MistralModel masks every layer alike, whatever a layer_types says
        window = config.get("sliding_window", 4096 if kind == "mistral" else None)
        types = ["sliding_attention"] * n
    else:
        _check_window(config)
        return {}
    if window is None or window >= config.get("max_position_embeddings", 2048) or "sliding_attention" not in types:
        return {}
    return dict(sliding_window=window, layer_types=types)


def llama_net_kwargs(config: dict) -> dict:
    """``GPT`` arguments for a Hugging Face ``LlamaConfig`` dict (MHA, GQA or MQA), or Mistral's, Qwen2's (biases on
    q, k and v only) or Qwen3's (per-head q and k norms)."""
    kind = config.get("model_type", "llama")
    qwen2 = kind == "qwen2"  # q/k/v biases always, none on o_proj nor the MLP (transformers' Qwen2Attention)
    attention_bias = bool(config.get("attention_bias", False))
    if not qwen2 and attention_bias != bool(config.get("mlp_bias", False)):
        raise InputError("attention_bias and mlp_bias differ; the zoo's GPT has one bias switch")
    d, h = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // h
    attn = dict(n_kv_head=config.get("num_key_value_heads") or h)
    if head_dim != d // h:
        attn["head_dim"] = head_dim
    if qwen2:
        attn["qkv_bias"] = True
    if kind == "qwen3":
        attn |= dict(qk_norm=True, qk_norm_eps=config.get("rms_norm_eps", 1e-6))
    kwargs = dict(_common_kwargs(config), bias=attention_bias and not qwen2, attention=partial(MHA, **attn))
    return kwargs | _window(config)


def mixtral_net_kwargs(config: dict) -> dict:
    """``GPT`` arguments for a Hugging Face ``MixtralConfig`` dict (GQA and softmax top-k MoE in every layer)."""
    return dict(
        llama_net_kwargs(config),
        mlp=MoE.from_hf_config(dict(config, model_type="mixtral")),
        mlp_hidden=config["intermediate_size"],  # Mixtral's intermediate_size is each expert's width
    )


def deepseek_net_kwargs(config: dict) -> dict:
    """``GPT`` arguments for a Hugging Face ``DeepseekV3Config`` dict: dense layers, then MoE layers."""
    first_dense = config.get("first_k_dense_replace", 3)
    moe = {}
    if first_dense < config["num_hidden_layers"]:
        moe = dict(
            mlp=MoE.from_hf_config(dict(config, model_type="deepseek_v3")),
            mlp_hidden=config.get("moe_intermediate_size", 2048),
            first_k_dense=first_dense,
            dense_hidden=config["intermediate_size"],
        )
    rope = _rope(config)
    scaling = rope.get("rope_scaling")
    mscale = {"softmax_scale_factor": scaling.softmax_scale_factor()} if isinstance(scaling, YaRNRoPE) else {}
    mla = partial(
        MLA,
        kv_lora_rank=config["kv_lora_rank"],
        q_lora_rank=config.get("q_lora_rank"),
        qk_nope_head_dim=config["qk_nope_head_dim"],
        qk_rope_head_dim=config["qk_rope_head_dim"],
        v_head_dim=config["v_head_dim"],
        norm_eps=1e-6,
        **mscale,  # DeepSeek's YaRN scales the softmax too (transformers' yarn_apply_mscale)
    )  # transformers' latent norms keep eps=1e-6
    return dict(_common_kwargs(config), bias=bool(config.get("attention_bias", False)), attention=mla, **moe)


def qwen3_moe_net_kwargs(config: dict) -> dict:
    """``GPT`` arguments for a Hugging Face ``Qwen3MoeConfig`` dict: Qwen3's attention, and in layer i softmax top-k
    experts unless i is in ``mlp_only_layers`` or (i + 1) is no multiple of ``decoder_sparse_step`` (then a dense
    SwiGLU of ``intermediate_size``), as transformers' ``Qwen3MoeDecoderLayer`` chooses."""
    n, step = config["num_hidden_layers"], config.get("decoder_sparse_step", 1)
    if step < 1:
        raise InputError(f"decoder_sparse_step {step} is not a positive layer interval: fix config.json")
    experts = MoE.hf_experts(config)
    only = set(config.get("mlp_only_layers") or ())
    dense = [i for i in range(n) if i in only or not (experts > 0 and (i + 1) % step == 0)]
    attention = llama_net_kwargs(dict(config, model_type="qwen3"))  # per-head q/k norms, head_dim
    if len(dense) == n:  # no expert layer: a dense Qwen3
        return attention
    return dict(
        attention,
        mlp=MoE.from_hf_config(config),
        mlp_hidden=config.get("moe_intermediate_size", 768),  # Qwen3MoeConfig's default
        dense_hidden=config["intermediate_size"],
        **({"dense_layers": dense} if dense else {}),
    )


def _mla_rope_rows(w: Tensor, n_head: int, dn: int, dp: int, per_head: bool, inverse: bool) -> Tensor:
    """Reorder the RoPE output rows of a projection between DeepSeek's interleaved and our half layout."""
    perm = torch.cat((torch.arange(0, dp, 2), torch.arange(1, dp, 2)))
    if inverse:
        perm = torch.argsort(perm)
    if not per_head:  # kv_a_proj_with_mqa: [c_kv (r) | k_rope (p)]
        r = w.shape[0] - dp
        return torch.cat((w[:r], w[r:][perm]))
    w = w.view(n_head, dn + dp, *w.shape[1:])  # q_proj / q_b_proj: per head [nope (n) | rope (p)]
    return torch.cat((w[:, :dn], w[:, dn:][:, perm]), dim=1).flatten(0, 1)


def _attn_to_zoo(sd: Mapping[str, Tensor], pre: str, net: GPT, interleave: bool) -> dict[str, Tensor]:
    attn = net.blocks[0].attn
    if isinstance(attn, MHA):
        qkv = torch.cat([sd[f"{pre}self_attn.{n}_proj.weight"] for n in "qkv"])
        out = {"attn.qkv.weight": qkv}
        if f"{pre}self_attn.q_proj.bias" in sd:
            out["attn.qkv.bias"] = torch.cat([sd[f"{pre}self_attn.{n}_proj.bias"] for n in "qkv"])
        attn_sd = under(sd, f"{pre}self_attn.")
        out |= {f"attn.{ours}": attn_sd[theirs] for ours, theirs in _MHA_KEYS if theirs in attn_sd}
        return out
    out = {
        f"attn.{ours}": sd[f"{pre}self_attn.{theirs}"] for ours, theirs in _MLA_KEYS if f"{pre}self_attn.{theirs}" in sd
    }
    if interleave:
        for key, per_head in (
            ("attn.q_up.weight", True),
            ("attn.q_proj.weight", True),
            ("attn.kv_down.weight", False),
            ("attn.kv_down.bias", False),
        ):
            if key in out:
                out[key] = _mla_rope_rows(out[key], attn.n_head, attn.dn, attn.dp, per_head, inverse=False)
    return out


def hf_to_zoo(sd: Mapping[str, Tensor], net: GPT, interleave: bool = False) -> dict[str, Tensor]:
    """A LlamaForCausalLM / DeepseekV3ForCausalLM state dict in ``net``'s keys (extra layers, e.g. MTP, ignored);
    ``sd`` may read its tensors as asked (``zoo.io.meta_load``), each read once and the fused ones dropped at once."""
    out = {"tok_emb.weight": sd["model.embed_tokens.weight"], "norm_f.weight": sd["model.norm.weight"]}
    for i in range(net.n_layer):
        pre = f"model.layers.{i}."
        block = {ours: sd[pre + theirs] for ours, theirs in _norm_keys(net.blocks[i])}
        layer = under(sd, pre)  # the MLP picks its own keys
        block.update({f"mlp.{k}": v for k, v in net.blocks[i].mlp.from_hf(layer).items()})
        block.update(_attn_to_zoo(sd, pre, net, interleave))
        out.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    out["lm_head.weight"] = sd.get("lm_head.weight", out["tok_emb.weight"])
    return out | mtp_to_zoo(sd, net, interleave, hf_to_zoo)  # the MTP modules the net has (zoo.gpt.mtp)


def _norm_keys(block) -> list[tuple[str, str]]:
    if block.post_norm:  # OLMo 2
        return _POST_NORM_KEYS
    return _SANDWICH_NORM_KEYS if hasattr(block, "post_attn_norm") else _NORM_KEYS


def zoo_to_hf(sd: dict[str, Tensor], net: GPT) -> dict[str, Tensor]:
    """The inverse of ``hf_to_zoo`` (written without interleaving)."""
    out = {
        "model.embed_tokens.weight": sd["tok_emb.weight"],
        "model.norm.weight": sd["norm_f.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    qwen3_moe = _is_qwen3_moe(net)
    for i, block in enumerate(net.blocks):
        ours, pre = f"blocks.{i}.", f"model.layers.{i}."
        out.update({pre + theirs: sd[ours + o] for o, theirs in _norm_keys(block)})
        mlp = {k.removeprefix(ours + "mlp."): v for k, v in sd.items() if k.startswith(ours + "mlp.")}
        layout = ("qwen3_moe",) if qwen3_moe and block.mlp.hf_layout == "mixtral" else ()
        out.update({pre + k: v for k, v in block.mlp.to_hf(mlp, *layout).items()})
        attn = block.attn
        if isinstance(attn, MHA):
            sizes = [attn.n_head * attn.head_dim] + 2 * [attn.n_kv_head * attn.head_dim]
            for kind in ("weight", "bias"):
                if ours + f"attn.qkv.{kind}" in sd:
                    for n, w in zip("qkv", sd[ours + f"attn.qkv.{kind}"].split(sizes)):
                        out[pre + f"self_attn.{n}_proj.{kind}"] = w
            out |= {pre + f"self_attn.{t}": sd[ours + f"attn.{o}"] for o, t in _MHA_KEYS if ours + f"attn.{o}" in sd}
        else:
            out.update(
                {pre + f"self_attn.{t}": sd[ours + f"attn.{o}"] for o, t in _MLA_KEYS if ours + f"attn.{o}" in sd}
            )
    return out | mtp_to_hf(sd, net, zoo_to_hf)


def _read_folder(folder: str | Path | Folder) -> tuple[Folder, Mapping[str, Tensor]]:
    """The folder as read (``Folder``; read here when given its path) and every weights shard of it (safetensors read
    as asked, ``read_tensors``)."""
    folder = folder if isinstance(folder, Folder) else Folder.read(folder)
    if not folder.shards:
        raise FileNotFoundError(f"No *.safetensors or pytorch_model*.bin in {str(folder.path)!r}")
    return folder, read_tensors(list(folder.shards))


def net_kwargs(config: dict) -> dict:
    """``GPT`` arguments for a Llama-family, Mixtral, Qwen3-MoE or DeepSeek-V3 ``config.json`` dict."""
    kind = config.get("model_type", "llama")
    _check_quantization(config)
    if kind in llama_variants.READERS:  # SmolLM3, OLMo 2, Granite: Llama's fields read here, theirs there
        return llama_variants.READERS[kind](config, llama_net_kwargs)
    if kind in ("llama", "mistral", "qwen2", "qwen3"):
        return llama_net_kwargs(config)
    if kind == "mixtral":
        return mixtral_net_kwargs(config)
    if kind == "qwen3_moe":
        return qwen3_moe_net_kwargs(config)
    if kind == "deepseek_v3":
        return deepseek_net_kwargs(config)
    if kind in ("gemma2", "gemma3_text"):
        return gemma.net_kwargs(config)
    if kind in REFUSED:
        raise refused(kind)
    raise ValueError(f"model_type {kind!r} is not a Llama, Mixtral or DeepSeek-V3 config")


def load_hf_into(net: GPT, folder: str | Path | Folder) -> GPT:
    """Copy a local Llama-family, Mixtral or DeepSeek-V3 folder's weights into ``net``: every parameter set and every
    tensor of the files used (but the MTP layers of a net built without them), or an error naming what is left."""
    read, source = _read_folder(folder)
    config, folder = read.config, read.path
    kwargs = net_kwargs(config)  # refuses what no GPT holds (Qwen-MoE, RoPE scaling, ...), whatever net it goes into
    llama_variants.check_switches(net, kwargs, folder)  # a Granite's multipliers are not lost in a net without them
    interleave = config.get("model_type") == "deepseek_v3" and config.get("rope_interleave", True)
    name = f"Hugging Face folder {str(folder)!r}"
    with missing_tensors_named(name):
        sd = hf_to_zoo(source, net, interleave)
    check_compatible(net, sd, name)
    # The MTP layers a folder declares beyond the net's are left out by that choice (mtp_depth 0: the main model).
    skipped = tuple(f"model.layers.{i}." for i in range(net.n_layer + len(net.mtp), net.n_layer + hf_mtp_depth(config)))
    source_keys = {k for k in _moe_names(source) if not k.startswith(skipped or ("\0",))}
    check_all_used(source_keys, _used(sd, net), name, ("rotary_emb.inv_freq",))
    check_tied_head(net, sd, name)
    return assign_weights(net, sd, name)


def _moe_names(keys) -> set[str]:
    """Mixtral's ``block_sparse_moe.`` under transformers 5's ``mlp.`` name, as ``MoE.from_hf`` reads both."""
    return {k.replace(".block_sparse_moe.", ".mlp.") for k in keys}


def _used(sd: dict[str, Tensor], net: GPT) -> set[str]:
    """The source keys a conversion into ``net`` reads: what the inverse writes, and each expert list's fused pair
    (which ``MoE.from_hf`` reads instead of the per-expert tensors when a file holds it)."""
    used = _moe_names(zoo_to_hf(on_meta(sd), net))  # names only: nothing split or copied
    return used | {k.split(".experts.")[0] + f".experts.{n}" for k in used if ".experts.0." in k for n in _FUSED}


def load_hf(folder: str | Path | Folder) -> GPT:
    """A ``GPT`` holding the weights of a local Llama, Mixtral or DeepSeek-V3 Hugging Face folder."""
    read = folder if isinstance(folder, Folder) else Folder.read(folder)
    kwargs = net_kwargs(read.config)
    budget.check_kwargs(GPT, kwargs, str(read.path))
    return load_hf_into(GPT(**kwargs), read)


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_ARCHITECTURES["mistral"] = "MistralForCausalLM"


def _mha_model_type(attn: MHA) -> str:
    """The dense family whose attention is ``attn``'s: Llama (one bias switch), Qwen2 (biases on q, k, v only) or
    Qwen3 (per-head q and k norms)."""
    qkv_bias, proj_bias = attn.qkv.bias is not None, attn.proj.bias is not None
    if hasattr(attn, "q_norm") and qkv_bias == proj_bias:
        return "qwen3"
    if not hasattr(attn, "q_norm") and qkv_bias == proj_bias:
        return "llama"
    if not hasattr(attn, "q_norm") and qkv_bias and not proj_bias:
        return "qwen2"
    raise InputError("An MHA with q/k norms and biases on q, k, v only has no Hugging Face form (Qwen3 or Qwen2)")


def _is_qwen3_moe(net: GPT) -> bool:
    """Qwen3's attention (MHA with per-head q/k norms) and softmax-routed expert layers: a Qwen3-MoE."""
    attn = net.blocks[0].attn
    return isinstance(attn, MHA) and hasattr(attn, "q_norm") and any(b.mlp.hf_layout == "mixtral" for b in net.blocks)


def _rope_parameters(net: GPT) -> dict:
    params = {"rope_type": "default", "rope_theta": net.rope_base}
    if net.rope_scaling is not None:
        kind = "yarn" if isinstance(net.rope_scaling, YaRNRoPE) else "llama3"
        stated = {k: v for k, v in dataclasses.asdict(net.rope_scaling).items() if v is not None}
        params |= {"rope_type": kind, **stated}
    return params


def _qwen3_moe_config(net: GPT, attn: MHA, moe: MoE, layouts: list[str]) -> dict:
    """Qwen3-MoE's config.json keys: its MoE settings, and the dense layers as ``mlp_only_layers``."""
    dense = [i for i, layout in enumerate(layouts) if layout == "llama"]
    moe_keys = moe.hf_config("qwen3_moe")
    width = net.blocks[dense[0]].mlp.hf_config()["intermediate_size"] if dense else moe_keys["moe_intermediate_size"]
    return moe_keys | dict(
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        intermediate_size=width,  # the dense layers' (transformers requires it with none)
        mlp_only_layers=dense,
        decoder_sparse_step=1,
        num_key_value_heads=attn.n_kv_head,
        head_dim=attn.head_dim,
        use_sliding_window=False,
        sliding_window=None,
    )


def _windows(net: GPT, attn: MHA | MLA, model_type: str) -> dict:
    """The config fields of ``net``'s sliding windows for ``model_type`` (Mistral and Mixtral: every layer; Qwen2/3:
    any layers), or {}; a net with settings no such config holds is refused, naming them."""
    odd = gemma_settings(net)
    if llama_variants.model_type(net):  # Granite states its softmax scale too (attention_multiplier)
        odd = [s for s in odd if s != "scale"]
    if odd:
        raise InputError(
            f"A Llama-family config has no {', '.join(odd)}: this net exports as Gemma only if Gemma-shaped"
        )
    if "sliding_attention" not in net.layer_types:
        return {}
    if model_type in ("qwen2", "qwen3"):
        first = net.layer_types.index("sliding_attention")
        return dict(
            use_sliding_window=True,
            sliding_window=net.sliding_window,
            max_window_layers=first,
            layer_types=net.layer_types,
        )
    if model_type in ("llama", "mixtral") and set(net.layer_types) == {"sliding_attention"}:
        return dict(sliding_window=net.sliding_window)
    raise InputError(
        f"sliding-window layers {net.layer_types} have no {model_type} form: Mistral and Mixtral slide in every layer, "
        "Qwen2/3 (q/k/v biases or q/k norms) in any"
    )


def hf_config(net: GPT) -> dict:
    """The ``config.json`` of ``net`` as a Llama, Qwen2/3, Mixtral or Qwen3-MoE (MHA) or DeepSeek-V3 (MLA) model; a
    Gemma-shaped net's as Gemma 2/3 (``gemma.hf_config``)."""
    if gemma.is_gemma(net):
        return gemma.hf_config(net)
    layouts = [block.mlp.hf_layout for block in net.blocks]  # as each MLP class states its Hugging Face form
    first_dense = next((i for i, layout in enumerate(layouts) if layout != "llama"), net.n_layer)
    if net.position != "rope" or net.norm_f.hf_layout != "llama" or set(layouts) - {"llama", "deepseek_v3", "mixtral"}:
        raise ValueError("Only a Llama-shaped net (RoPE, RMSNorm, SwiGLU or MoE MLPs) exports as Llama or DeepSeek-V3")
    attn, moe = net.blocks[0].attn, net.blocks[min(first_dense, net.n_layer - 1)].mlp
    if isinstance(attn, MHA) and attn.rope_dim != attn.head_dim or hasattr(net.rope_scaling, "long_after"):
        raise InputError("A net with partial RoPE (rope_dim) or LongRoPE has no Llama form: export with --format phi3")
    kind = ("mla" if isinstance(attn, MLA) else "mha", moe.hf_layout if first_dense < net.n_layer else "dense")
    wanted = {("mha", "dense"), ("mla", "dense"), ("mha", "mixtral"), ("mla", "deepseek_v3")}
    qwen3_moe = _is_qwen3_moe(net)  # its dense layers may be anywhere (mlp_only_layers)
    interleaved = "llama" in layouts[first_dense:] or (kind[1] == "mixtral" and first_dense)
    if kind not in wanted or (interleaved and not qwen3_moe):
        raise InputError(
            f"A GPT with {kind[0].upper()} attention and MLPs {layouts} has no Hugging Face form: the mixture-of-"
            "experts layers export as DeepSeek-V3 (MLA, routing sigmoid_bias, after first_k_dense dense layers), as "
            "Mixtral (MHA, routing softmax, no dense layers and no shared experts) or as Qwen3-MoE (MHA with q/k "
            "norms, routing softmax, no shared experts)"
        )
    config = dict(
        vocab_size=net.vocab_size,
        max_position_embeddings=net.block_size,
        num_hidden_layers=net.n_layer,
        hidden_size=net.tok_emb.weight.shape[1],
        num_attention_heads=attn.n_head,
        **net.norm_f.hf_config(),
        tie_word_embeddings=net.lm_head.weight is net.tok_emb.weight,
        attention_bias=attn.proj.bias is not None,
        rope_parameters=_rope_parameters(net),
        attention_dropout=0.0,
    )
    mtp = {"num_nextn_predict_layers": len(net.mtp)} if net.mtp else {}  # DeepSeek-V3's layout (zoo.gpt.mtp)
    windows = _windows(net, attn, _mha_model_type(attn) if kind[0] == "mha" else "deepseek_v3")
    if windows and (qwen3_moe or llama_variants.model_type(net)):
        raise InputError(
            "A net with sliding windows and Qwen3-MoE's, SmolLM3's, OLMo 2's or Granite's settings has no Hugging Face "
            "form: those configs state no window the zoo writes"
        )
    if qwen3_moe:
        return config | _qwen3_moe_config(net, attn, moe, layouts) | mtp
    stated = net.rope_scaling.softmax_scale_factor() if isinstance(net.rope_scaling, YaRNRoPE) else 1.0
    if isinstance(attn, MLA) and attn.softmax_scale_factor != stated:  # DeepSeek's YaRN decides it in transformers
        raise InputError(
            f"The MLA's softmax_scale_factor {attn.softmax_scale_factor} is not the {stated} that DeepSeek-V3 derives "
            "from the net's rope_scaling (YaRN's mscale_all_dim): set it so, or to 1 without YaRN, to export"
        )
    if llama_variants.model_type(net):  # SmolLM3's NoPE layers, OLMo 2's post-norms, Granite's multipliers
        return llama_variants.hf_config(net, kind, config)
    if kind == ("mha", "mixtral"):
        if _mha_model_type(attn) != "llama":
            raise InputError("A Mixtral's attention has one bias switch and no q/k norms: this MoE net does not export")
        return (
            config
            | moe.hf_config()
            | dict(
                model_type="mixtral",
                architectures=["MixtralForCausalLM"],
                num_key_value_heads=attn.n_kv_head,
                head_dim=attn.head_dim,
                sliding_window=None,
            )
            | windows
            | mtp
        )
    if kind[0] == "mha":
        model_type = _mha_model_type(attn)
        if model_type == "llama" and windows:
            model_type = "mistral"  # a Llama whose every layer slides
        return (
            config
            | net.blocks[0].mlp.hf_config()
            | dict(
                model_type=model_type,
                architectures=[_ARCHITECTURES[model_type]],
                num_key_value_heads=attn.n_kv_head,
                head_dim=attn.head_dim,
            )
            | windows
            | mtp
        )
    if kind[1] == "deepseek_v3":  # DeepSeek-V3 states intermediate_size (the dense layers') even with none
        moe_config = moe.hf_config()
        config |= {"intermediate_size": moe_config["moe_intermediate_size"]} | moe_config
    else:  # routing settings the dense layers never use, valid for DeepseekV3Config
        config |= dict(n_routed_experts=1, num_experts_per_tok=1, n_group=1, topk_group=1)
    if first_dense:
        config |= net.blocks[0].mlp.hf_config()
    q_lora = attn.q_up.in_features if hasattr(attn, "q_up") else None
    return config | dict(
        model_type="deepseek_v3",
        architectures=["DeepseekV3ForCausalLM"],
        rope_interleave=False,
        num_key_value_heads=attn.n_head,
        kv_lora_rank=attn.r,
        q_lora_rank=q_lora,
        qk_nope_head_dim=attn.dn,
        qk_rope_head_dim=attn.dp,
        v_head_dim=attn.dv,
        first_k_dense_replace=first_dense,
        num_nextn_predict_layers=len(net.mtp),
    )


def export_hf(net: GPT, folder: str | Path) -> Path:
    """Write ``net`` as a Hugging Face Llama, Qwen2/3, Mixtral or Qwen3-MoE (MHA/GQA) or DeepSeek-V3 (MLA) folder
    that transformers loads."""
    return write_folder(net, folder, hf_config(net), zoo_to_hf)


def write_folder(net: GPT, folder: str | Path, config: dict, to_hf) -> Path:
    """``net``'s weights in Hugging Face names (``to_hf``) and ``config`` as a folder transformers loads."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = to_hf({k: v.detach().cpu() for k, v in net.state_dict().items()}, net)
    if config["tie_word_embeddings"]:
        del sd["lm_head.weight"]  # transformers re-ties it from embed_tokens
    # safetensors writes a file beside it and renames it over: a link planted at the name is replaced, as here.
    save_file({k: v.contiguous() for k, v in sd.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    with replacing(folder / "config.json") as tmp:  # a link planted in the folder is replaced, not followed
        tmp.write_text(json.dumps(config, indent=2))
    return folder
