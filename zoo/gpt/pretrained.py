"""A Hugging Face model folder as a ready ``CausalLMModule``: the net built from its ``config.json``, its weights loaded
exactly, its tokenizer and generation defaults attached.

    module = zoo.gpt.from_pretrained("Llama-3.2-1B")          # a local folder; nothing is downloaded
    module.generate(["The capital of France is"], max_new_tokens=20, temperature=0)

GPT-2, Llama (Llama 3.1-3.3's RoPE scaling included), Mistral, Qwen2/2.5, Qwen3, Qwen3-MoE, Mixtral, DeepSeek-V3
(its hub config, YaRN included), Phi-3 / Phi-4-mini, SmolLM3, OLMo 2, Granite, Gemma 2 and Gemma 3 text folders load
(``hf.py``, ``llama.py``, ``phi3.py``, ``llama_variants.py``, ``gemma.py``; sliding windows included); a config option
the zoo's GPT does not implement is refused by name. The weights are exact or refused: every parameter is set and every
tensor of the files used, or one error names what is left over.
The tokenizer is the folder's ``tokenizer.json`` (``zoo.io.hf_tokenizer``), else its SentencePiece ``tokenizer.model``
(Llama 2, rebuilt as transformers' LlamaTokenizer does: ``zoo.io.sp_tokenizer``), else GPT-2's vocab.json and
merges.txt; ``generation_config.json`` sets predict's defaults as transformers reads them (no ``do_sample``: greedy;
``repetition_penalty`` either way), and a decoding setting in it that the zoo lacks is refused by name.

Every file is data: configs are read within size limits, and a folder that names code of its own (``auto_map``) is
refused, unless its ``model_type`` is one of ``MODEL_TYPES``, which transformers builds from its own classes too,
ignoring the ``auto_map`` without ``trust_remote_code``; the zoo ignores it as well. The module records its net as
a ``{class_path, init_args}`` config, as ``cli.py`` does, so its checkpoints rebuild it without the folder.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
from pathlib import Path
from typing import Any

import torch

from zoo.compat import given_hyperparameters_context
from zoo.errors import InputError
from zoo.gpt.formats.checks import MODEL_TYPES
from zoo.gpt.formats.hf import gpt2_net_kwargs, pretrained_gpt
from zoo.gpt.formats.llama import net_kwargs as llama_net_kwargs
from zoo.gpt.formats.phi3 import phi3_net_kwargs
from zoo.gpt.generate import Generation
from zoo.gpt.gpt import GPT
from zoo.gpt.module import CausalLMModule
from zoo.gpt.mtp import hf_mtp_depth
from zoo.io import budget, dtypes, hf_tokenizer
from zoo.io.dtypes import Dtype
from zoo.io.files import read_config
from zoo.io.tokenizers import GPT2Tokenizer, Tokenizer
from zoo.io.trust import LIGHTNING_INSTANTIATOR


def read_folder(path: str | Path) -> tuple[Path, dict]:
    """The folder and its ``config.json``, which must name one of ``MODEL_TYPES`` and no code."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{str(folder)!r} is not a folder: point at a Hugging Face model folder (config, weights)")
    if not (folder / "config.json").is_file():
        raise InputError(f"{str(folder)!r} has no config.json: not a Hugging Face model folder")
    config = read_config(folder / "config.json", MODEL_TYPES)  # an auto_map beside these: ignored, as transformers does
    kind = config.get("model_type")
    if kind not in MODEL_TYPES:
        raise InputError(
            f"{str(folder / 'config.json')!r} has model_type {kind!r}: the zoo's GPT loads {', '.join(MODEL_TYPES)}"
        )
    return folder, config


def net_kwargs(config: dict, folder: Path | None = None) -> dict:
    """``GPT`` arguments for a ``config.json`` dict of any of ``MODEL_TYPES``, with as many of DeepSeek-V3's MTP
    layers as ``folder``'s weights hold of those the config declares (transformers saves none)."""
    if config["model_type"] == "gpt2":
        return _gpt2_kwargs(config)
    kwargs = phi3_net_kwargs(config) if config["model_type"] == "phi3" else llama_net_kwargs(config)
    if folder is not None and hf_mtp_depth(config):
        keys = _weight_names(folder)
        held = (f"model.layers.{config['num_hidden_layers'] + k}.eh_proj.weight" in keys for k in range(99))
        kwargs["mtp_depth"] = min(hf_mtp_depth(config), sum(1 for _ in itertools.takewhile(bool, held)))
    return kwargs


def _weight_names(folder: Path) -> set[str]:
    """The tensor names of a folder's safetensors files, from their headers (nothing else is read)."""
    from safetensors import safe_open

    names: set[str] = set()
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            names |= set(f.keys())
    return names


def _gpt2_kwargs(config: dict) -> dict:
    # Options of transformers' GPT2Attention that change the function and that the zoo's MHA has not.
    unlike = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}
    named = [k for k, usual in unlike.items() if k in config and config[k] != usual]
    if named:
        raise InputError(f"GPT-2 option {', '.join(f'{k}={config[k]!r}' for k in named)} is not implemented by the zoo")
    return gpt2_net_kwargs(config)


def net_config(kwargs: dict) -> dict:
    """``kwargs`` (classes, partials, settings dataclasses) as the ``{class_path, init_args}`` config ``cli.py``
    writes, which a checkpoint rebuilds the net from."""
    return {"class_path": "zoo.gpt.GPT", "init_args": {k: _config_value(v) for k, v in kwargs.items()}}


def _config_value(value: Any) -> Any:
    if isinstance(value, functools.partial):
        init = {k: _config_value(v) for k, v in value.keywords.items()}
        return {"class_path": f"{value.func.__module__}.{value.func.__qualname__}", "init_args": init}
    if isinstance(value, type):
        return {"class_path": f"{value.__module__}.{value.__qualname__}", "init_args": {}}
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return value


def generation_defaults(folder: Path) -> Generation:
    """predict's decoding as ``generation_config.json`` states it: sampled (its temperature, top_k, top_p) only with
    ``do_sample``, else greedy, as transformers' ``generate`` reads the file; its ``repetition_penalty`` either way;
    greedy without one. The whole file is read: a setting that changes decoding and that the zoo does not implement
    (beams, n-gram bans, min lengths, ...) is refused by name (``checked_generation_config``)."""
    path = folder / "generation_config.json"
    g = checked_generation_config(read_config(path), str(path)) if path.is_file() else {}
    penalty = {"repetition_penalty": float(g["repetition_penalty"])} if g.get("repetition_penalty") else {}
    if not g.get("do_sample", False):
        return Generation(temperature=0.0, **_max_new(g), **penalty)
    top_p = g.get("top_p")
    return Generation(
        temperature=float(g.get("temperature", 1.0)),
        top_k=g.get("top_k") or None,
        top_p=None if top_p in (None, 1.0) else float(top_p),
        **_max_new(g),
        **penalty,
    )


# generation_config.json's keys the zoo reads (generation_defaults; eos_token_id: _eos_ids), and those that change no
# decoded token: ids the tokenizer states, what generate returns beside the tokens, transformers' own bookkeeping.
# max_length bounds prompt + continuation: the zoo's bound is max_new_tokens (and the net's block_size past which the
# context slides), which the file's max_new_tokens sets.
READ_KEYS = {"do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens", "eos_token_id"}
INERT_KEYS = {
    "bos_token_id", "pad_token_id", "decoder_start_token_id", "transformers_version", "_from_model_config",
    "use_cache", "max_length", "output_attentions", "output_hidden_states", "output_scores", "output_logits",
    "return_dict_in_generate", "cache_implementation", "cache_config",
}  # fmt: skip
# transformers' decoding settings the zoo does not implement, at the values that leave decoding as the zoo does it.
NEUTRAL = {
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "diversity_penalty": 0.0, "length_penalty": 1.0,
    "early_stopping": False, "num_return_sequences": 1, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0, "min_length": 0, "min_new_tokens": None, "bad_words_ids": None,
    "force_words_ids": None, "constraints": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "min_p": None, "top_h": None, "renormalize_logits": False, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "remove_invalid_values": False, "exponential_decay_length_penalty": None,
    "suppress_tokens": None, "begin_suppress_tokens": None, "sequence_bias": None, "token_healing": False,
    "guidance_scale": None, "low_memory": None, "watermarking_config": None, "stop_strings": None,
    "max_time": None, "dola_layers": None, "prompt_lookup_num_tokens": None, "assistant_early_exit": None,
}  # fmt: skip


# What each key the zoo reads holds: "bool", "int" (or null), "number" (or null); eos_token_id: _eos_ids'.
KINDS = {"do_sample": "bool", "max_new_tokens": "int", "top_k": "int"}
KINDS |= {k: "number" for k in ("temperature", "top_p", "repetition_penalty")}


def _of_kind(value: Any, kind: str) -> bool:
    if kind == "bool" or isinstance(value, bool):  # JSON's true is no number here
        return isinstance(value, bool) and kind == "bool"
    return value is None or isinstance(value, int if kind == "int" else (int, float))


def checked_generation_config(g: Any, where: str) -> dict:
    """``g`` (a generation_config.json) when every key in it is read by the zoo, changes no decoded token, or holds
    transformers' default; else one error naming each other key, which the zoo would otherwise silently ignore."""
    if not isinstance(g, dict):
        raise InputError(f"{where!r} is not a JSON object: a generation_config.json maps settings to values")
    bad = [
        f"{k}={v!r}" if k in NEUTRAL else f"{k} (unknown)"
        for k, v in g.items()
        if k not in READ_KEYS | INERT_KEYS and not (k in NEUTRAL and v == NEUTRAL[k])
    ]
    mistyped = [f"{k}={v!r}" for k, v in g.items() if k in KINDS and not _of_kind(v, KINDS[k])]
    if mistyped:
        raise InputError(
            f"{where!r} sets {', '.join(mistyped)}: do_sample takes true or false, top_k and max_new_tokens a whole "
            "number, temperature, top_p and repetition_penalty a number: fix the file"
        )
    if bad:
        raise InputError(
            f"{where!r} sets {', '.join(bad)}: decoding the zoo does not implement (it does greedy or temperature, "
            f"top_k, top_p and repetition_penalty sampling); remove these from the file to decode without them"
        )
    return g


def _max_new(g: dict) -> dict:
    return {"max_new_tokens": int(g["max_new_tokens"])} if g.get("max_new_tokens") else {}


def _eos_ids(folder: Path, config: dict) -> list[int]:
    """The EOS ids ``generation_config.json`` or ``config.json`` state (an int or a list), first found first."""
    path = folder / "generation_config.json"
    for source in (read_config(path) if path.is_file() else {}, config):
        eos = source.get("eos_token_id")
        if eos is not None:
            return [eos] if isinstance(eos, int) else list(eos)
    return []


def folder_tokenizer(folder: Path, config: dict) -> Tokenizer:
    """The folder's ``tokenizer.json`` or ``tokenizer.model`` with its special tokens; GPT-2's vocab.json and
    merges.txt without either."""
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        if (folder / "vocab.json").is_file():
            return GPT2Tokenizer.from_dir(folder)
    return hf_tokenizer.from_folder(folder, _eos_ids(folder, config), config.get("model_type"))


def from_pretrained(path: str | Path, *, dtype: Dtype | torch.dtype = "auto", **module_kwargs: Any) -> CausalLMModule:
    """A ``CausalLMModule`` holding the model of a local Hugging Face folder, ready to ``generate`` or to fit:
    the net from its config.json, every weight exact, its tokenizer and generation defaults attached.
    ``dtype``: the weights' dtype, as transformers 5's ``from_pretrained`` takes it (``auto``, its default: the folder's
    ``dtype``/``torch_dtype``, else its weights'; ``float32``, ``bfloat16``, ``float16``); RoPE's tables stay float32.
    ``module_kwargs`` go to ``CausalLMModule`` (``optimizer``, ``compile``, ``generation``, ...)."""
    folder, config = read_folder(path)
    tokenizer = folder_tokenizer(folder, config)  # before the weights: a folder without one fails fast
    kwargs = net_kwargs(config, folder)
    dtype = dtypes.resolve(dtype, config, sorted(folder.glob("*.safetensors")), str(folder / "config.json"))
    budget.check_kwargs(GPT, kwargs, str(folder), dtype)
    if tokenizer.vocab_size > kwargs["vocab_size"]:  # more ids would index past the embedding; fewer is padding
        raise InputError(
            f"{str(folder)!r}: the tokenizer has {tokenizer.vocab_size} ids, more than config.json's vocab_size "
            f"{kwargs['vocab_size']}: the tokenizer files are not this model's"
        )
    net = pretrained_gpt(kwargs, folder, dtype)  # built on the meta device: the weights are never in memory twice
    module_kwargs.setdefault("generation", generation_defaults(folder))
    module = recorded_module(net, kwargs, **module_kwargs)
    module.tokenizer = tokenizer
    return module.eval()


def recorded_module(net: GPT, net_kwargs: dict, **module_kwargs: Any) -> CausalLMModule:
    """A ``CausalLMModule`` around ``net`` (built from ``net_kwargs``) whose hyperparameters are what ``cli.py``
    records: the net as its ``{class_path, init_args}`` config and every setting, given or default, so its
    checkpoints rebuild it without the objects and a fit finds every setting it reads."""
    params = inspect.signature(CausalLMModule).parameters
    settings = {k: p.default for k, p in params.items() if k != "net"} | module_kwargs
    hparams = {"net": net_config(net_kwargs)} | {
        k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in settings.items()
    }
    with given_hyperparameters_context(hparams, LIGHTNING_INSTANTIATOR):
        return CausalLMModule(net=net, **module_kwargs)
