"""The types of the fields the zoo reads from a model folder's JSON configs (transformers' ``config.json``,
``generation_config.json``, ``tokenizer_config.json``), checked when the file is read (``zoo.io.files.read_config``):
a size stated as ``"64"`` would reach Python's ``//`` as a string and end in a bare ``TypeError``; here it is one
line naming the file, the field, the value and the type expected.

As transformers' config classes type them: an integer is a JSON integer (``true`` is not 1), a float any JSON number,
a flag ``true`` or ``false`` (not 0 or 1). Fields the zoo never reads are not checked, nor PEFT's
``adapter_config.json`` fields, which ``zoo.gpt.formats.peft_adapter`` checks as LoRA settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zoo.errors import InputError

INT, FLOAT, BOOL, STR, LIST, DICT, NULL = "int", "float", "bool", "str", "list", "dict", "null"

_INTS = """vocab_size n_positions n_ctx n_layer n_embd n_head hidden_size intermediate_size num_hidden_layers
num_attention_heads max_position_embeddings moe_intermediate_size num_experts_per_tok num_local_experts
n_routed_experts n_shared_experts n_group topk_group first_k_dense_replace moe_layer_freq kv_lora_rank
qk_rope_head_dim qk_nope_head_dim v_head_dim num_nextn_predict_layers num_mtp_layers projection_dim image_size
patch_size num_channels original_max_position_embeddings decoder_sparse_step num_experts""".split()
_NULLABLE_INTS = """n_inner head_dim num_key_value_heads sliding_window q_lora_rank max_new_tokens top_k bos_token_id
pad_token_id""".split()
_FLOATS = """rope_theta rms_norm_eps layer_norm_epsilon layer_norm_eps routed_scaling_factor router_aux_loss_coef
logit_scale_init_value factor low_freq_factor high_freq_factor""".split()
_NULLABLE_FLOATS = "temperature top_p beta_fast beta_slow mscale mscale_all_dim attention_factor".split()
_FLOATS += ["partial_rotary_factor"]  # Phi-3's RoPE settings
_BOOLS = """tie_word_embeddings attention_bias mlp_bias use_sliding_window norm_topk_prob rope_interleave
do_sample output_router_logits truncate""".split()
_STRS = "model_type hidden_act activation_function scoring_func topk_method rope_type type".split()

# field -> the JSON kinds it may hold
FIELDS: dict[str, tuple[str, ...]] = {
    **{f: (INT,) for f in _INTS},
    **{f: (INT, NULL) for f in _NULLABLE_INTS},
    **{f: (FLOAT,) for f in _FLOATS},
    **{f: (FLOAT, NULL) for f in _NULLABLE_FLOATS},
    **{f: (BOOL,) for f in _BOOLS},
    **{f: (STR,) for f in _STRS},
    "eos_token_id": (INT, LIST, NULL),  # one id or several
    "mlp_only_layers": (LIST, NULL),  # Qwen3-MoE's dense layers
    "rope_scaling": (DICT, NULL),
    "rope_parameters": (DICT, NULL),
    "text_config": (DICT,),
    "vision_config": (DICT,),
}
NESTED = ("rope_scaling", "rope_parameters", "text_config", "vision_config")  # their fields are checked too
_WORDS = {
    INT: "an integer",
    FLOAT: "a number",
    BOOL: "true or false",
    STR: "a string",
    LIST: "a list",
    DICT: "an object",
    NULL: "null",
}


def is_kind(value: Any, kind: str) -> bool:
    if kind == INT:
        return type(value) is int
    if kind == FLOAT:
        return type(value) in (int, float)
    if kind == BOOL:
        return type(value) is bool
    if kind == LIST:
        return isinstance(value, list) and all(type(v) is int for v in value)  # eos_token_id's ids
    return isinstance(value, {STR: str, DICT: dict, NULL: type(None)}[kind])


def check_fields(config: Mapping[str, Any], path: str | Path, prefix: str = "") -> None:
    """An ``InputError`` naming ``path``, the field, its value and the type expected, for the first field of
    ``FIELDS`` whose value is not of its kinds (at the top and in the ``NESTED`` objects)."""
    for field, value in config.items():
        kinds = FIELDS.get(field)
        if kinds is None:
            continue
        if not any(is_kind(value, k) for k in kinds):
            shown = repr(value) if len(repr(value)) <= 60 else f"{repr(value)[:60]}..."
            expected = " or ".join(_WORDS[k] for k in kinds).replace("a list", "a list of integers")
            raise InputError(
                f"{str(path)!r}: {prefix}{field} is {shown} ({type(value).__name__}), expected {expected}: fix the "
                "file, or use a folder transformers wrote"
            )
        if field in NESTED and isinstance(value, dict):
            check_fields(value, path, f"{prefix}{field}.")


def require_fields(config: Mapping[str, Any], names: tuple[str, ...], path: str | Path, prefix: str = "") -> None:
    """An ``InputError`` naming ``path`` and the first of ``names`` (``a.b`` into a nested object) that ``config``
    lacks: a converter reading it would end in a bare ``KeyError``."""
    for name in names:
        at: Any = config
        for part in name.split("."):
            if not (isinstance(at, Mapping) and part in at):
                raise InputError(
                    f"{str(path)!r} lacks the field {prefix}{name}, which the zoo reads and has no default for: "
                    "add it as the model states it, or use a folder transformers wrote"
                )
            at = at[part]
