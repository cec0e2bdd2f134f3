"""A ``CausalLMModule`` as a whole Hugging Face model folder: what ``python -m zoo.gpt export`` writes.

    config.json, model.safetensors       the net (``hf.export_gpt2``, ``llama.export_hf`` or ``phi3.export_phi3``)
    adapter/                             its LoRA adapters in PEFT's format (``peft_adapter``), unless merged
    tokenizer.json, tokenizer_config.json  the tokenizer, special tokens and chat template (``zoo.io.hf_tokenizer``)
    generation_config.json               predict's decoding and the stop ids

so transformers' ``AutoTokenizer``, ``AutoModelForCausalLM`` and ``GenerationConfig`` (and PEFT's ``PeftModel`` on the
adapter) read the zoo's ids, logits and decoding, and ``zoo.gpt.from_pretrained`` reads the same module back.
"""

from __future__ import annotations

import json
from pathlib import Path

from zoo.adapt import merge as merge_adapters
from zoo.gpt.formats.hf import export_gpt2
from zoo.gpt.formats.llama import export_hf
from zoo.gpt.formats.peft_adapter import lora_layers, plain_layers, save_adapter
from zoo.gpt.formats.phi3 import export_phi3
from zoo.gpt.generate import Generation
from zoo.gpt.module import CausalLMModule
from zoo.io import hf_tokenizer
from zoo.io.chat_template import template_source
from zoo.io.files import read_config, replacing
from zoo.io.tokenizers import Tokenizer


def generation_config(generation: Generation, tokenizer: Tokenizer | None) -> dict:
    """generation_config.json for predict's ``generation``: greedy at temperature 0, else sampled with its
    temperature, top_k (0: all tokens) and top_p (1: all); its repetition_penalty unless 1; the tokenizer's EOS ids
    (each one generation stops at), BOS and pad. ``zoo.gpt.pretrained.generation_defaults`` and transformers'
    ``generate`` read it back alike."""
    config: dict = {"max_new_tokens": generation.max_new_tokens, "do_sample": generation.temperature > 0}
    if config["do_sample"]:  # greedy states no sampling settings (transformers warns on those it would ignore)
        config |= {"temperature": generation.temperature, "top_k": generation.top_k or 0, "top_p": generation.top_p}
        config["top_p"] = config["top_p"] or 1.0
    if generation.repetition_penalty != 1.0:  # applied greedy or sampled, as the zoo does
        config["repetition_penalty"] = generation.repetition_penalty
    if tokenizer is not None:
        stop = list(tokenizer.stop_ids)
        config["eos_token_id"] = stop[0] if len(stop) == 1 else stop
        for name in ("bos", "pad"):  # the zoo's own tokenizers have neither
            if getattr(tokenizer, f"{name}_id", None) is not None:
                config[f"{name}_token_id"] = getattr(tokenizer, f"{name}_id")
    return config


def default_format(module: CausalLMModule) -> str:
    """The format a module exports as unless told: "phi3" when it started from a Phi-3 folder (its init_weights) or
    only a Phi-3 holds its net (partial RoPE, LongRoPE), else "gpt2" for learned positions and "llama" for RoPE."""
    source = Path(str(module.hparams.get("init_weights") or "")) / "config.json"
    if source.is_file() and read_config(source).get("model_type") == "phi3":
        return "phi3"
    if module.net.position == "learned":
        return "gpt2"
    attn = module.net.blocks[0].attn
    partial = getattr(attn, "rope_dim", None) != getattr(attn, "head_dim", None)
    return "phi3" if partial or hasattr(module.net.rope_scaling, "long_after") else "llama"


def export(module: CausalLMModule, folder: str | Path, format: str | None = None, merge: bool = False) -> list[str]:
    """Write ``module`` into ``folder`` as a Hugging Face ``format`` ("gpt2", "llama" or "phi3"; None:
    ``default_format``) model; with ``merge`` its LoRA adapters folded into the weights, else in ``<folder>/adapter``.
    Returns what was written, a line each."""
    folder = Path(folder)
    format = format or default_format(module)
    if merge and lora_layers(module.net):
        merge_adapters(module)
    tokenizer = module.tokenizer
    with plain_layers(module.net):  # the base model: what the adapters, if any, were trained on
        eos = tokenizer.eos_id if tokenizer is not None else None
        if format == "phi3":
            written = [export_phi3(module.net, folder)]
        else:
            written = [export_hf(module.net, folder) if format == "llama" else export_gpt2(module.net, folder, eos)]
    if lora_layers(module.net):
        written.append(f"{save_adapter(module, folder / 'adapter', format, base=str(folder))} (PEFT LoRA)")
    if tokenizer is None:
        written.append("no tokenizer: the checkpoint carries none (trained on ids), so the folder has none")
    else:
        written += hf_tokenizer.to_folder(tokenizer, folder, template_source(tokenizer), module.net.block_size)
    config = generation_config(Generation.of(module.hparams.generation), tokenizer)
    with replacing(folder / "generation_config.json") as tmp:  # a link planted in the folder is replaced
        tmp.write_text(json.dumps(config, indent=2))
    return [str(w) for w in [*written, folder / "generation_config.json"]]
