"""The tokenizer of a Hugging Face model folder: ``tokenizer.json`` through the ``tokenizers`` library, with the
special tokens and the chat template of ``tokenizer_config.json``; a SentencePiece ``tokenizer.model`` without one.

``tokenizer.json`` is the whole pipeline (normalizer, pre-tokenizer, model, post-processor adding BOS, decoder) in
the format ``tokenizers`` writes, which transformers' fast tokenizers run as they are: so the ids are
``AutoTokenizer``'s for any model that ships one (Llama 3, Mistral, Qwen, DeepSeek, GPT-2 in transformers 5). A
SentencePiece ``tokenizer.model`` alone (Llama 2) is rebuilt as the pipeline transformers' ``LlamaTokenizer`` makes
of it (``zoo.io.sp_tokenizer``), so either way the module holds a ``tokenizers`` pipeline and its checkpoints carry
it as a ``tokenizer.json`` (kind ``hf``).

``to_folder`` writes the inverse for any zoo tokenizer: its ``pipeline()`` as tokenizer.json and a tokenizer_config.json
naming the special tokens and the chat template, with ``tokenizer_class`` the generic fast tokenizer, which runs the
pipeline as it is (a model's own class may rebuild it: transformers 5's LlamaTokenizer re-adds BOS).

Every file is data: read within a size limit (``zoo.io.files``), a config naming code (``auto_map``) is refused, and
the ``chat_template`` (a Jinja program) is kept as a string, rendered only by ``zoo.io.chat_template``'s sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

from zoo.errors import InputError
from zoo.io import sp_tokenizer
from zoo.io.files import read_bytes, read_config, read_json, replacing
from zoo.io.tokenizers import SPECIALS, PretrainedTokenizer, Tokenizer, parse_tokenizer_json, special_token


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


def to_folder(tokenizer: Tokenizer, folder: str | Path, chat_template: object, model_max_length: int) -> list[Path]:
    """Write ``tokenizer`` into ``folder`` as tokenizer.json and tokenizer_config.json (its BOS, EOS, pad and unknown
    tokens, ``chat_template`` unless None), which ``from_folder`` and transformers' ``AutoTokenizer`` read back with
    the same ids; returns the paths written."""
    hf = tokenizer.pipeline()
    ids = {name: getattr(tokenizer, f"{name}_id", None) for name in SPECIALS}  # the zoo's own kinds: EOS alone
    config = {f"{name}_token": hf.id_to_token(i) if i is not None else None for name, i in ids.items()}
    unk = json.loads(hf.to_str())["model"].get("unk_token")
    config |= {"unk_token": unk} if unk else {}
    config |= {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length}
    config |= {"clean_up_tokenization_spaces": False}  # decode as the pipeline does, no spaces dropped before marks
    if chat_template is not None:
        config["chat_template"] = chat_template
    folder = Path(folder)
    paths = [folder / "tokenizer.json", folder / "tokenizer_config.json"]
    for path, text in zip(paths, (hf.to_str(), json.dumps(config, indent=2, ensure_ascii=False)), strict=True):
        with replacing(path) as tmp:  # a link planted in the folder is replaced, not followed
            tmp.write_text(text, encoding="utf-8")
    return paths
