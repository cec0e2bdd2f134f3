"""The tokenizer of a Hugging Face model folder: ``tokenizer.json`` through the ``tokenizers`` library, with the
special tokens and the chat template of ``tokenizer_config.json``.

``tokenizer.json`` is the whole pipeline (normalizer, pre-tokenizer, model, post-processor adding BOS, decoder) in
the format ``tokenizers`` writes, which transformers' fast tokenizers run as they are: so the ids are
``AutoTokenizer``'s for any model that ships one (Llama 3, Mistral, Qwen, DeepSeek, GPT-2 in transformers 5). A
SentencePiece ``tokenizer.model`` alone (Llama 2) is refused: reading it needs ``sentencepiece``, which the zoo does
not depend on, and transformers converts it to a ``tokenizer.json`` once.

Every file is data: read within a size limit (``zoo.io.files``), a config naming code (``auto_map``) is refused, and
the ``chat_template`` (a Jinja program) is kept as a string for the chat issue, never rendered here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from zoo.errors import InputError
from zoo.io.files import read_bytes, read_config, read_json
from zoo.io.tokenizers import _HFTokenizer

SPECIALS = ("bos", "eos", "pad")


def _token(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, an AddedToken dict or null."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class PretrainedTokenizer(_HFTokenizer):
    """A model folder's ``tokenizer.json`` with its BOS/EOS/pad tokens and chat template (kept, never run)."""

    kind = "hf"

    def __init__(self, tokenizer: HFTokenizer, special: dict[str, str | None], chat_template: Any = None) -> None:
        self.hf, self.special, self.chat_template = tokenizer, dict(special), chat_template
        ids = {name: tokenizer.token_to_id(tok) if tok else None for name, tok in self.special.items()}
        for name, tok in self.special.items():
            if tok and ids[name] is None:
                raise InputError(f"the {name} token {tok!r} is not in the tokenizer's vocabulary")
        if ids.get("eos") is None:
            raise InputError(
                "the tokenizer states no EOS token (eos_token in tokenizer_config.json, or eos_token_id in "
                "generation_config.json or config.json): generation would not know where a text ends"
            )
        self.eos_id, self.bos_id, self.pad_id = ids["eos"], ids.get("bos"), ids.get("pad")
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def to_dict(self) -> dict:
        template = self.chat_template
        return {"kind": self.kind, "json": self.hf.to_str(), "special": self.special, "chat_template": template}

    @classmethod
    def from_dict(cls, d: dict) -> PretrainedTokenizer:
        return cls(_parse(d["json"], "the checkpoint's tokenizer"), d.get("special") or {}, d.get("chat_template"))

    @classmethod
    def from_folder(cls, folder: str | Path, eos_ids: list[int] = ()) -> PretrainedTokenizer:
        """From ``folder``'s tokenizer.json and tokenizer_config.json (and chat_template.jinja); ``eos_ids``: the
        EOS ids generation_config.json or config.json state, the first used when tokenizer_config.json has none."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise InputError(_missing(folder))
        hf = _parse(json.dumps(read_json(path)), repr(str(path)))  # bounded by the zoo, then handed over as data
        config_path = folder / "tokenizer_config.json"
        config = read_config(config_path) if config_path.is_file() else {}
        special = {name: _token(config.get(f"{name}_token")) for name in SPECIALS}
        if special["eos"] is None and eos_ids:
            special["eos"] = hf.id_to_token(eos_ids[0])
        template = config.get("chat_template")
        if (folder / "chat_template.jinja").is_file():  # transformers 5 writes it beside the config
            template = read_bytes(folder / "chat_template.jinja").decode("utf-8")
        return cls(hf, special, template)


def _parse(text: str, source: str) -> HFTokenizer:
    try:
        return HFTokenizer.from_str(text)
    except Exception as err:  # tokenizers raises its own Exception type for any malformed pipeline
        raise InputError(f"{source} is not a tokenizer.json that the tokenizers library reads ({err})") from None


def _missing(folder: Path) -> str:
    if (folder / "tokenizer.model").is_file():
        return (
            f"{str(folder)!r} holds a SentencePiece tokenizer.model but no tokenizer.json, which is what the zoo "
            f"reads (with the tokenizers library, not sentencepiece): write one where transformers and sentencepiece "
            f"are installed, AutoTokenizer.from_pretrained(folder).save_pretrained(folder) converts it"
        )
    return (
        f"{str(folder)!r} has no tokenizer.json (nor GPT-2's vocab.json and merges.txt): a pretrained folder brings "
        f"its tokenizer; copy the model's tokenizer files into it"
    )
