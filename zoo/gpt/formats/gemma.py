"""Gemma 2 and Gemma 3 (text) folders as the zoo's ``GPT``, and back: ``config.json`` to ``GPT`` arguments and the
inverse (the weights go through ``llama.py``, whose names Gemma's are, plus the sandwich norms).

Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size" (section 2) and 2025, "Gemma 3
Technical Report", as transformers' ``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM`` compute them:

- every norm is an RMSNorm scaling by 1 + weight in float32 (``norms.GemmaRMSNorm``, weights loaded as stored), one
  before and one after each of attention and the MLP (``GPT(sandwich_norm=True)``);
- token embeddings times sqrt(hidden_size) in their dtype (``embed_scale``), the head tied to them;
- a GELU-gated MLP (``mlp.GeGLU``), attention scaled by ``query_pre_attn_scalar`` ** -0.5 (``MHA(scale=...)``);
- sliding-window layers as ``layer_types`` says (Gemma 2: every other layer, first one sliding; Gemma 3: by
  ``sliding_window_pattern``, five of six), a query seeing the ``sliding_window`` keys up to itself;
- Gemma 2: the attention scores and the final logits soft-capped, c * tanh(x / c) (``attn_logit_softcapping``,
  ``final_logit_softcapping``); Gemma 3: per-head q and k norms and its own RoPE base for the sliding layers
  (``rope_local_base_freq``, or ``rope_parameters["sliding_attention"]``). transformers' Gemma 3 attention ignores
  ``attn_logit_softcapping``, and so does the zoo.

A missing field takes transformers' default for the model type (they are not Llama's: head_dim 256, 4 key-value
heads, a window of 4096). Refused by name: RoPE scaling (Gemma 3 4B-27B's ``linear`` on its full layers),
``use_bidirectional_attention``, ``attention_bias``, a ``hidden_activation`` other than GELU. Multimodal Gemma 3
folders (``model_type: gemma3``) are refused by ``pretrained.read_folder``: their text model is not a separate folder.
"""

from __future__ import annotations

from functools import partial

from zoo.errors import InputError
from zoo.gpt.attention import MHA
from zoo.gpt.gpt import GPT
from zoo.gpt.mlp import GeGLU
from zoo.gpt.norms import GemmaRMSNorm

MODEL_TYPES = ("gemma2", "gemma3_text")

# transformers' Gemma2Config / Gemma3TextConfig defaults, which a config.json may leave out.
_DEFAULTS = dict(
    num_key_value_heads=4,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_bias=False,
    query_pre_attn_scalar=256,
    sliding_window=4096,
)
DEFAULTS = {
    "gemma2": _DEFAULTS | dict(max_position_embeddings=8192, final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
    "gemma3_text": _DEFAULTS | dict(max_position_embeddings=131072, final_logit_softcapping=None),
}


def layer_types(config: dict) -> list[str]:
    """Each layer's attention as transformers reads the config: its ``layer_types``, else Gemma 2's alternation
    (sliding first) or Gemma 3's ``sliding_window_pattern`` (every n-th layer full)."""
    if config.get("layer_types") is not None:
        return list(config["layer_types"])
    every = 2 if config["model_type"] == "gemma2" else config.get("sliding_window_pattern", 6)
    n = config["num_hidden_layers"]
    return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]


def _theta(params: dict, layers: str) -> float:
    """The base of plain RoPE parameters; a scaling (Gemma 3 4B-27B's ``linear`` on the full layers) refused."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise InputError(f"RoPE scaling {kind!r} of the {layers} layers ({params!r}): the zoo's Gemma takes plain RoPE")
    return float(params.get("rope_theta", 10_000.0))


def _gemma2_rope(config: dict) -> dict:
    """``rope_base`` from a transformers 5 ``rope_parameters`` dict or the older ``rope_theta`` and ``rope_scaling``."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return dict(rope_base=_theta({"rope_theta": config.get("rope_theta", 10_000.0)} | params, "model's"))


def _gemma3_rope(config: dict, sliding: bool) -> dict:
    """``rope_base`` (and ``rope_scaling``) of the full layers and ``rope_local_base`` of the sliding ones, from
    transformers 5's per-layer-type ``rope_parameters`` or the older ``rope_theta``, ``rope_local_base_freq`` and
    ``rope_scaling`` (the full layers')."""
    params = config.get("rope_parameters")
    if params is not None and not {"full_attention", "sliding_attention"} >= set(params):
        raise InputError(
            f"rope_parameters {params!r}: a Gemma 3 config keys them by layer type (full_attention, sliding_attention)"
        )
    if params is None:
        full = dict(config.get("rope_scaling") or {"rope_type": "default"})
        full.setdefault("rope_theta", config.get("rope_theta", 1_000_000.0))
        local = {"rope_type": "default", "rope_theta": config.get("rope_local_base_freq", 10_000.0)}
    else:
        full = params.get("full_attention") or {"rope_type": "default", "rope_theta": 1_000_000.0}
        local = params.get("sliding_attention") or {"rope_type": "default", "rope_theta": 10_000.0}
    out = dict(rope_base=_theta({"rope_theta": 1_000_000.0} | full, "full attention"))
    if sliding:
        out["rope_local_base"] = _theta(local, "sliding")
    return out


def net_kwargs(config: dict) -> dict:
    """``GPT`` arguments for a Hugging Face ``Gemma2Config`` or ``Gemma3TextConfig`` dict."""
    kind = config["model_type"]
    config = DEFAULTS[kind] | config
    for name in ("use_bidirectional_attention", "attention_bias"):
        if config.get(name):
            raise InputError(f"{name}={config[name]!r} is not implemented by the zoo's GPT: a causal Gemma without it")
    types, window = layer_types(config), config["sliding_window"]
    sliding = window is not None and "sliding_attention" in types
    attn = dict(
        n_kv_head=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        scale=config["query_pre_attn_scalar"] ** -0.5,
    )
    if kind == "gemma2":
        rope = _gemma2_rope(config)
        attn["softcap"] = config["attn_logit_softcapping"]
    else:  # transformers' Gemma3Attention passes no softcap, whatever the config says
        rope = _gemma3_rope(config, sliding)
        attn |= dict(qk_norm=True, qk_norm_eps=config["rms_norm_eps"], qk_norm_unit_offset=True)
    return dict(
        vocab_size=config["vocab_size"],
        block_size=config["max_position_embeddings"],
        n_layer=config["num_hidden_layers"],
        n_embd=config["hidden_size"],
        n_head=config["num_attention_heads"],
        norm=GemmaRMSNorm,
        norm_eps=config["rms_norm_eps"],
        mlp=GeGLU.from_hf_config(config),
        mlp_hidden=config["intermediate_size"],
        position="rope",
        **rope,
        tie_embeddings=config["tie_word_embeddings"],
        bias=False,
        attention=partial(MHA, **attn),
        sliding_window=window if sliding else None,
        layer_types=types if sliding else None,
        sandwich_norm=True,
        embed_scale=config["hidden_size"] ** 0.5,
        logit_softcap=config["final_logit_softcapping"],
    )


def is_gemma(net: GPT) -> bool:
    """Whether ``net`` is built as a Gemma (its norms scale by 1 + weight): ``hf_config`` writes it."""
    return net.norm_f.hf_layout == "gemma"


def hf_config(net: GPT) -> dict:
    """``net``'s ``config.json`` as a Gemma 3 text model (with q/k norms) or a Gemma 2 (without)."""
    attn, mlp = net.blocks[0].attn, net.blocks[0].mlp
    d = net.tok_emb.weight.shape[1]
    gemma3 = hasattr(attn, "q_norm")
    shaped = (
        isinstance(attn, MHA)
        and net.position == "rope"
        and hasattr(net.blocks[0], "post_attn_norm")
        and {block.mlp.hf_layout for block in net.blocks} == {"gemma"}
        and net.embed_scale == d**0.5
        and attn.qkv.bias is None
        and attn.proj.bias is None
        and (getattr(attn.q_norm, "hf_layout", None) == "gemma" if gemma3 else net.rope_local_base is None)
        and not (gemma3 and attn.softcap is not None)
        and net.rope_scaling is None
    )
    if not shaped:
        raise InputError(
            "Only a Gemma-shaped net exports as Gemma: MHA without biases, RoPE, GemmaRMSNorm sandwich norms, GeGLU "
            "MLPs, embed_scale sqrt(n_embd), plain RoPE; with 1 + weight q/k norms and no attention softcap (Gemma 3) "
            "or without q/k norms and rope_local_base (Gemma 2)"
        )
    scalar = round((attn.scale or attn.head_dim**-0.5) ** -2)  # transformers' query_pre_attn_scalar is an int
    if scalar**-0.5 != (attn.scale or attn.head_dim**-0.5):
        raise InputError(f"MHA scale {attn.scale} is no integer's inverse square root: Gemma's query_pre_attn_scalar")
    window = net.sliding_window
    config = dict(
        vocab_size=net.vocab_size,
        hidden_size=d,
        num_hidden_layers=net.n_layer,
        num_attention_heads=attn.n_head,
        num_key_value_heads=attn.n_kv_head,
        head_dim=attn.head_dim,
        max_position_embeddings=net.block_size,
        **net.norm_f.hf_config(),
        **mlp.hf_config(),
        tie_word_embeddings=net.lm_head.weight is net.tok_emb.weight,
        attention_bias=False,
        attention_dropout=0.0,
        query_pre_attn_scalar=scalar,
        sliding_window=window if window is not None else net.block_size,
        layer_types=net.layer_types,
        final_logit_softcapping=net.logit_softcap,
        attn_logit_softcapping=attn.softcap,
        use_bidirectional_attention=False,
    )
    if not gemma3:
        rope = {"rope_type": "default", "rope_theta": net.rope_base}
        return config | dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], rope_parameters=rope)
    local = net.rope_local_base if net.rope_local_base is not None else net.rope_base
    rope = {
        "full_attention": {"rope_type": "default", "rope_theta": net.rope_base},
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
    }
    return config | dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], rope_parameters=rope)
