"""The tokenizer of a Hugging Face model folder: ``tokenizer.json`` through the ``tokenizers`` library, with the
special tokens and the chat template of ``tokenizer_config.json``; a SentencePiece ``tokenizer.model`` without one.

``tokenizer.json`` is the whole pipeline (normalizer, pre-tokenizer, model, post-processor adding BOS, decoder) in
the format ``tokenizers`` writes, which transformers' fast tokenizers run as they are: so the ids are
``AutoTokenizer``'s for any model that ships one (Llama 3, Mistral, Qwen, DeepSeek, GPT-2 in transformers 5). A
SentencePiece ``tokenizer.model`` alone (Llama 2) is rebuilt as the pipeline transformers' ``LlamaTokenizer`` makes
of it (``zoo.io.sp_tokenizer``), so either way the module holds a ``tokenizers`` pipeline and its checkpoints carry
it as a ``tokenizer.json`` (kind ``hf``).

Every file is data: read within a size limit (``zoo.io.files``), a config naming code (``auto_map``) is refused, and
the ``chat_template`` (a Jinja program) is kept as a string, rendered only by ``zoo.io.chat_template``'s sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

from zoo.errors import InputError
from zoo.io import sp_tokenizer
from zoo.io.files import read_bytes, read_config, read_json
from zoo.io.tokenizers import SPECIALS, PretrainedTokenizer, parse_tokenizer_json, special_token


def from_folder(folder: str | Path, eos_ids: list[int] = (), model_type: str | None = None) -> PretrainedTokenizer:
    """From ``folder``'s tokenizer.json, else its tokenizer.model, with tokenizer_config.json (and
    chat_template.jinja). ``eos_ids``: the EOS ids generation_config.json or config.json state, at any of which
    generation stops (the first is the EOS when tokenizer_config.json names none); ``model_type``: config.json's,
    which decides how transformers reads a tokenizer.model."""
    folder = Path(folder)
    config_path = folder / "tokenizer_config.json"
    config = read_config(config_path) if config_path.is_file() else {}
    path = folder / "tokenizer.json"
    if path.is_file():
        hf = parse_tokenizer_json(json.dumps(read_json(path)), repr(str(path)))  # bounded by the zoo, then data
        special = {name: special_token(config.get(f"{name}_token")) for name in SPECIALS}
    elif (folder / "tokenizer.model").is_file():
        hf, special = sp_tokenizer.read_model(folder / "tokenizer.model", config, model_type)
    else:
        raise InputError(
            f"{str(folder)!r} has no tokenizer.json or tokenizer.model (nor GPT-2's vocab.json and merges.txt): a "
            f"pretrained folder brings its tokenizer; copy the model's tokenizer files into it"
        )
    if special["eos"] is None and eos_ids:
        special["eos"] = hf.id_to_token(eos_ids[0])
    template = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():  # transformers 5 writes it beside the config
        template = read_bytes(folder / "chat_template.jinja").decode("utf-8")
    return PretrainedTokenizer(hf, special, template, eos_ids)
