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

The folder is read once, into one ``zoo.gpt.formats.folder.Folder`` (``from_pretrained`` takes one too), from
which the net, the tokenizer, the decoding and the weights' loader all take what they need.

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
from zoo.gpt.formats.folder import Folder, generation_from, read_generation_config
from zoo.gpt.formats.hf import gpt2_net_kwargs, pretrained_gpt
from zoo.gpt.formats.llama import net_kwargs as llama_net_kwargs
from zoo.gpt.formats.phi3 import phi3_net_kwargs
from zoo.gpt.generate import Generation
from zoo.gpt.gpt import GPT
from zoo.gpt.module import CausalLMModule
from zoo.gpt.mtp import hf_mtp_depth
from zoo.io import budget, dtypes
from zoo.io.dtypes import Dtype
from zoo.io.trust import LIGHTNING_INSTANTIATOR


def read_folder(path: str | Path) -> tuple[Path, dict]:
    """The folder and its ``config.json`` (``Folder.read``)."""
    folder = Folder.read(path)
    return folder.path, folder.config


def net_kwargs(config: dict, folder: Folder | Path | None = None) -> dict:
    """``GPT`` arguments for a ``config.json`` dict of any of ``MODEL_TYPES``, with as many of DeepSeek-V3's MTP
    layers as ``folder``'s weights hold of those the config declares (transformers saves none)."""
    if config["model_type"] == "gpt2":
        return _gpt2_kwargs(config)
    kwargs = phi3_net_kwargs(config) if config["model_type"] == "phi3" else llama_net_kwargs(config)
    if folder is not None and hf_mtp_depth(config):
        keys = (folder if isinstance(folder, Folder) else Folder.read(folder)).tensor_names
        held = (f"model.layers.{config['num_hidden_layers'] + k}.eh_proj.weight" in keys for k in range(99))
        kwargs["mtp_depth"] = min(hf_mtp_depth(config), sum(1 for _ in itertools.takewhile(bool, held)))
    return kwargs


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
    """predict's decoding as ``folder``'s ``generation_config.json`` states it (``formats.folder.generation_from``: a
    setting that changes decoding and that the zoo does not implement is refused by name), greedy without one."""
    return generation_from(read_generation_config(Path(folder)))


def from_pretrained(
    path: str | Path | Folder, *, dtype: Dtype | torch.dtype = "auto", **module_kwargs: Any
) -> CausalLMModule:
    """A ``CausalLMModule`` holding the model of a local Hugging Face folder, ready to ``generate`` or to fit:
    the net from its config.json, every weight exact, its tokenizer and generation defaults attached.
    ``dtype``: the weights' dtype, as transformers 5's ``from_pretrained`` takes it (``auto``, its default: the folder's
    ``dtype``/``torch_dtype``, else its weights'; ``float32``, ``bfloat16``, ``float16``); RoPE's tables stay float32.
    ``module_kwargs`` go to ``CausalLMModule`` (``optimizer``, ``compile``, ``generation``, ...)."""
    folder = path if isinstance(path, Folder) else Folder.read(path)
    tokenizer = folder.tokenizer  # before the weights: a folder without one fails fast
    kwargs = net_kwargs(folder.config, folder)
    weights = [p for p in folder.shards if p.suffix == ".safetensors"]
    dtype = dtypes.resolve(dtype, folder.config, weights, str(folder.path / "config.json"))
    budget.check_kwargs(GPT, kwargs, str(folder.path), dtype)
    if tokenizer.vocab_size > kwargs["vocab_size"]:  # more ids would index past the embedding; fewer is padding
        raise InputError(
            f"{str(folder.path)!r}: the tokenizer has {tokenizer.vocab_size} ids, more than config.json's vocab_size "
            f"{kwargs['vocab_size']}: the tokenizer files are not this model's"
        )
    net = pretrained_gpt(kwargs, folder, dtype)  # built on the meta device: the weights are never in memory twice
    module_kwargs.setdefault("generation", folder.generation)
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
