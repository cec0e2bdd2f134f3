"""SmolLM3, OLMo 2 and Granite folders: Llamas with a switch or two, in and out of the zoo's ``GPT``.

- SmolLM3 (Hugging Face 2025): a Llama whose layers listed 0 in ``no_rope_layers`` (by default every
  ``no_rope_layer_interval``-th) skip RoPE, NoPE (Kazemnejad et al. 2023): ``GPT(nope_layers=[...])``.
- OLMo 2 (OLMo et al. 2024, "2 OLMo 2 Furious"): each sublayer's output RMS-normed before the residual add and its input
  not (``GPT(norm_position="post")``; ``post_attention_layernorm``, ``post_feedforward_layernorm``), and the query and
  key RMS-normed over the whole projection, all heads together (``MHA(qk_norm=True, qk_norm_whole=True)``).
- Granite (IBM 2024, "Granite 3.0"): the embeddings times ``embedding_multiplier``, each sublayer's output times
  ``residual_multiplier`` before the add, ``attention_multiplier`` as the softmax's scale (for 1/sqrt(d)), the logits
  divided by ``logits_scaling``: ``GPT(embedding_multiplier=..., residual_multiplier=..., logits_scaling=...)`` and
  ``MHA(scale=...)``.

The weights have Llama's names (``llama.py`` converts them; OLMo 2's two norms per layer are the post-norm block's).
Every field of transformers' config class of each is read: the Llama ones by ``llama.llama_net_kwargs``, the
variant's here, and those that change no logit (token ids, ``use_cache``, ``initializer_range``, ``attention_dropout``,
which acts in training only) are ``INERT``; a field config.json leaves out takes the class's default (``DEFAULTS``),
as transformers does. Refused, in one line: a sliding window in use shorter than the context (SmolLM3's
``use_sliding_window`` on its NoPE layers), OLMo 2's ``attention_bias`` (biases in attention and none in the MLP,
which the GPT's one switch has not). A net with these switches exports as its model type (``hf_config``); a net with
none is a Llama.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

from zoo.errors import InputError
from zoo.gpt.attention import MHA, AcrossHeadsRMSNorm
from zoo.gpt.gpt import GPT

# ``llama.llama_net_kwargs``, which ``llama.net_kwargs`` hands each reader here (this module is imported by that one).
LlamaReader = Callable[[dict], dict]

# transformers' config fields that change no logit: ids the tokenizer and generate read, training-only dropout, init.
INERT = {"bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "attention_dropout"}
# What llama_net_kwargs reads (head_dim and the older top-level RoPE fields too, as transformers' modules read them).
LLAMA_FIELDS = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
    "attention_bias", "mlp_bias", "tie_word_embeddings", "head_dim", "rope_theta", "rope_scaling",
}  # fmt: skip
_SHAPE = dict(hidden_act="silu", attention_bias=False, rope_parameters=None)
# transformers' defaults (its config classes'), for a config.json that leaves a field out.
DEFAULTS = {
    "smollm3": _SHAPE
    | dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_theta=2000000.0, use_sliding_window=False, sliding_window=None, no_rope_layers=None,
        no_rope_layer_interval=4, layer_types=None, mlp_bias=False,
    ),
    "olmo2": _SHAPE
    | dict(
        vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=None, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_theta=10000.0,
    ),
    "granite": _SHAPE
    | dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=None, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_theta=10000.0, embedding_multiplier=1.0, residual_multiplier=1.0, attention_multiplier=1.0,
        logits_scaling=1.0, mlp_bias=False,
    ),
}  # fmt: skip
# Each type's own fields, read below (beside LLAMA_FIELDS and INERT).
OWN_FIELDS = {
    "smollm3": {"use_sliding_window", "sliding_window", "no_rope_layers", "no_rope_layer_interval", "layer_types"},
    "olmo2": set(),
    "granite": {"embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"},
}
MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "logits_scaling")  # the GPT's, by Granite's names


def _llama(config: dict, kind: str, llama_net_kwargs: LlamaReader) -> tuple[dict, dict]:
    """The config with transformers' defaults filled in, and the Llama ``GPT`` arguments of its Llama fields (a key
    transformers' class has not, e.g. an OLMo 2's ``mlp_bias``, is left out as transformers leaves it)."""
    config = DEFAULTS[kind] | {k: v for k, v in config.items() if k != "rope_parameters" or v is not None}
    llama = {k: config[k] for k in LLAMA_FIELDS & (set(DEFAULTS[kind]) | {"head_dim", "rope_scaling"}) if k in config}
    if config.get("rope_parameters") is None:
        del llama["rope_parameters"]  # the top-level rope_theta (a default or an older config's) instead
    return config, llama_net_kwargs(llama | {"model_type": kind})


def _with_attention(kwargs: dict, **settings) -> dict:
    attention = kwargs["attention"]
    return kwargs | {"attention": partial(MHA, **attention.keywords, **settings)}


def _layer_flags(config: dict, n: int) -> list[int]:
    """SmolLM3's ``no_rope_layers`` (1: RoPE, 0: NoPE), or as transformers derives it from the interval."""
    flags = config["no_rope_layers"]
    if flags is None:
        interval = config["no_rope_layer_interval"]
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise InputError(f"no_rope_layer_interval {interval!r} is not a whole number >= 1: fix config.json")
        return [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(flags, list) or len(flags) < n or any(f not in (0, 1) or isinstance(f, float) for f in flags):
        raise InputError(
            f"no_rope_layers {str(flags)[:80]!r} is not a list of {n} (num_hidden_layers) 0s and 1s (0: no RoPE in "
            f"that layer): fix config.json"
        )
    return [int(f) for f in flags[:n]]


def _check_sliding(config: dict, flags: list[int], n: int) -> None:
    """Refuse a layer that slides a window shorter than the context (transformers' SmolLM3: the NoPE layers when
    ``use_sliding_window``, or the layers ``layer_types`` names), which the zoo's attention does not."""
    window, context = config["sliding_window"], config["max_position_embeddings"]
    types = config["layer_types"]
    if types is None:  # as transformers derives them
        slides = config["use_sliding_window"] and window is not None
        types = ["sliding_attention" if slides and not flags[i] else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) < n or set(types) - {"full_attention", "sliding_attention"}:
        raise InputError(f"layer_types {str(types)[:80]!r} is not a list of {n} 'full_attention'/'sliding_attention'")
    sliding = [i for i in range(n) if types[i] == "sliding_attention"]
    if sliding and (not isinstance(window, int) or window < context):
        raise InputError(
            f"layers {sliding} attend through a sliding_window of {window!r} tokens, shorter than "
            f"max_position_embeddings {context}: the zoo's attention sees the whole context; set use_sliding_window to "
            f"false (and layer_types to full_attention) in config.json to load it as full attention, as SmolLM3-3B is"
        )


def smollm3_net_kwargs(config: dict, llama: LlamaReader) -> dict:
    """``GPT`` arguments for a Hugging Face ``SmolLM3Config`` dict: Llama with NoPE layers."""
    config, kwargs = _llama(config, "smollm3", llama)
    n = config["num_hidden_layers"]
    flags = _layer_flags(config, n)
    _check_sliding(config, flags, n)
    nope = [i for i in range(n) if not flags[i]]
    return kwargs | ({"nope_layers": nope} if nope else {})


def olmo2_net_kwargs(config: dict, llama: LlamaReader) -> dict:
    """``GPT`` arguments for a Hugging Face ``Olmo2Config`` dict: post-norm blocks, q/k norms over whole projections."""
    if config.get("attention_bias", False):
        raise InputError(
            "OLMo 2 with attention_bias has biases in q, k, v and o but none in the MLP, which the zoo's GPT (one bias "
            "switch) has not: load an OLMo 2 without attention_bias (as released), or a Llama with both"
        )
    config, kwargs = _llama(config, "olmo2", llama)
    kwargs = _with_attention(kwargs, qk_norm=True, qk_norm_whole=True, qk_norm_eps=config["rms_norm_eps"])
    return kwargs | {"norm_position": "post"}


def _number(config: dict, key: str) -> float:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value == 0:
        raise InputError(f"{key} {value!r} is not a finite nonzero number: fix config.json")
    return float(value)


def granite_net_kwargs(config: dict, llama: LlamaReader) -> dict:
    """``GPT`` arguments for a Hugging Face ``GraniteConfig`` dict: Llama with its four multipliers."""
    config, kwargs = _llama(config, "granite", llama)
    scales = {k: _number(config, k) for k in (*MULTIPLIERS, "attention_multiplier")}
    kwargs = _with_attention(kwargs, scale=scales.pop("attention_multiplier"))
    return kwargs | scales


READERS = {"smollm3": smollm3_net_kwargs, "olmo2": olmo2_net_kwargs, "granite": granite_net_kwargs}


def _switches(net: GPT) -> dict:
    """The settings of ``net`` a Llama has not, as ``GPT`` and ``MHA`` take them."""
    attn = net.blocks[0].attn
    whole = isinstance(getattr(attn, "q_norm", None), AcrossHeadsRMSNorm)
    return dict(
        nope_layers=[i for i, b in enumerate(net.blocks) if not getattr(b.attn, "rope", True)] or None,
        norm_position="post" if net.blocks[0].post_norm else "pre",
        embedding_multiplier=net.embedding_multiplier,
        residual_multiplier=net.blocks[0].residual_multiplier,
        logits_scaling=net.logits_scaling,
        scale=getattr(attn, "scale", None) if isinstance(attn, MHA) else None,
        qk_norm_whole=whole,
    )


def _from_kwargs(kwargs: dict) -> dict:
    """``_switches`` of the net ``GPT(**kwargs)`` would be."""
    attention = getattr(kwargs.get("attention"), "keywords", {})
    return dict(
        nope_layers=kwargs.get("nope_layers") or None,
        norm_position=kwargs.get("norm_position", "pre"),
        **{k: kwargs.get(k, 1.0) for k in MULTIPLIERS},
        scale=attention.get("scale"),
        qk_norm_whole=bool(attention.get("qk_norm_whole", False) and attention.get("qk_norm", False)),
    )


def check_switches(net: GPT, kwargs: dict, folder: Path) -> None:
    """Refuse to load a folder into a net built without the variant's settings (or with others): its weights would
    load whole and compute another function."""
    ours, theirs = _switches(net), _from_kwargs(kwargs)
    differ = [f"{k}={theirs[k]!r} (the net: {ours[k]!r})" for k in ours if ours[k] != theirs[k]]
    if differ:
        raise InputError(
            f"Hugging Face folder {str(folder)!r} states {', '.join(differ)}: build the net from the folder "
            "(zoo.gpt.from_pretrained, or init_weights with net: zoo.gpt.GPT and no settings of its own)"
        )


def model_type(net: GPT) -> str | None:
    """The Hugging Face model type of the switches ``net`` has (None: none, a Llama); a mix no one type has refused."""
    s = _switches(net)
    olmo = s["norm_position"] == "post" or s["qk_norm_whole"]
    granite = any(s[k] != 1.0 for k in MULTIPLIERS) or s["scale"] is not None
    types = [t for t, on in (("smollm3", s["nope_layers"]), ("olmo2", olmo), ("granite", granite)) if on]
    if len(types) > 1 or (olmo and not (s["norm_position"] == "post" and s["qk_norm_whole"])):
        raise InputError(
            f"A GPT with {s} has no Hugging Face form: NoPE layers export as SmolLM3, post-norm blocks with q/k norms "
            "over the whole projection as OLMo 2 (both), the multipliers and attention scale as Granite, one at a time"
        )
    return types[0] if types else None


def hf_config(net: GPT, kind: tuple[str, str], llama: dict) -> dict:
    """``net``'s config.json as its ``model_type``, from the Llama fields ``llama.hf_config`` wrote (``llama``)."""
    variant, attn = model_type(net), net.blocks[0].attn
    qkv_bias, proj_bias = attn.qkv.bias is not None, attn.proj.bias is not None
    plain = kind == ("mha", "dense") and not net.mtp and qkv_bias == proj_bias
    if not plain or (variant != "olmo2" and hasattr(attn, "q_norm")) or (variant == "olmo2" and proj_bias):
        raise InputError(
            f"A {variant} net exports with Llama's dense attention (MHA, one bias switch"
            f"{'' if variant == 'olmo2' else ', no q/k norms'}{', no biases' if variant == 'olmo2' else ''}, no MTP) "
            "and SwiGLU MLPs only"
        )
    config = llama | net.blocks[0].mlp.hf_config() | dict(num_key_value_heads=attn.n_kv_head, head_dim=attn.head_dim)
    config |= dict(model_type=variant, architectures=[_ARCHITECTURES[variant]])
    # The classes' default ids are their own tokenizers' (SmolLM3's pad 128004 sizes an embedding's padding row): none
    # here, as in llama.hf_config; generation_config.json and the tokenizer files state them.
    config |= dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)
    n = net.n_layer
    if variant == "smollm3":
        no_rope = [int(b.attn.rope) for b in net.blocks]
        return config | dict(
            no_rope_layers=no_rope, use_sliding_window=False, sliding_window=None, layer_types=["full_attention"] * n
        )
    if variant == "olmo2":
        del config["mlp_bias"]  # OLMo 2's MLP has no biases, and its config no such field
        return config
    scale = attn.scale if attn.scale is not None else attn.head_dim**-0.5
    return config | dict(
        embedding_multiplier=net.embedding_multiplier,
        residual_multiplier=net.blocks[0].residual_multiplier,
        attention_multiplier=scale,
        logits_scaling=net.logits_scaling,
    )


_ARCHITECTURES = {"smollm3": "SmolLM3ForCausalLM", "olmo2": "Olmo2ForCausalLM", "granite": "GraniteForCausalLM"}
