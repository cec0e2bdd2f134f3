"""SigLIP's tokenizer: a folder's ``spiece.model`` run as transformers' ``SiglipTokenizer`` runs it.

transformers has no fast SigLIP tokenizer: ``AutoTokenizer`` on a SigLIP folder runs sentencepiece itself on
``spiece.model`` (a T5-style Unigram model) inside Python code of its own, so this file does the same, step by step
(``SiglipTokenizer`` and ``PreTrainedTokenizer.tokenize`` in transformers 5):
  1. ``▁`` is written before the text, and any ``▁`` in it as a space;
  2. the text is split around the added tokens (``added_tokens_decoder``: ``</s>``, ``<unk>``), leftmost and longest
     first, each token's ``lstrip``/``rstrip``/``single_word`` applied to its neighbours; an added token is its id;
  3. every other piece is canonicalised (lower case with ``do_lower_case``, ASCII punctuation removed, whitespace runs
     one space, stripped), then encoded by sentencepiece after ``<unk>`` and cut after the pieces of ``<unk>`` alone
     (transformers' way to encode without a dummy prefix, kept even where it eats a character), each piece its id;
  4. ``</s>`` ends the ids and pads them to ``model_max_length`` (``SiglipProcessor``'s ``padding="max_length"``): the
     zoo's ``tokenize`` (cut to T - 1, end-of-text, end-of-text padding) gives the same ids wherever the pad token is
     the end-of-text token, which is required.
With ``legacy: false`` the model's dummy prefix is switched off first, as transformers' ``SentencePieceBackend`` does.

Every ``tokenizer_config.json`` field is read, changes no id, or is refused by name. The model is data: read within a
size limit, its pieces counted, then handed to sentencepiece (as transformers hands it). Checkpoints carry the model
bytes (kind ``siglip``), so a checkpoint needs no folder.
"""

from __future__ import annotations

import base64
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zoo.errors import InputError
from zoo.io.files import read_bytes, read_config

# zoo.io.sp_tokenizer's bounds (not imported: zoo.io.tokenizers imports this file to restore a checkpoint's tokenizer).
MAX_MODEL_BYTES = 16 * 2**20  # three times the largest tokenizer.model known
MAX_PIECES = 2**18
UNDERLINE = "▁"
DEFAULTS = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>", "model_max_length": 64}  # SiglipTokenizer's
FLAGS = ("lstrip", "rstrip", "single_word")
# tokenizer_config.json fields: read (above, and these), and those that change no id.
READ = {"added_tokens_decoder", "do_lower_case", "legacy", "split_special_tokens"}
INERT = {
    "tokenizer_class", "backend", "clean_up_tokenization_spaces", "processor_class", "name_or_path",
    "model_input_names", "sp_model_kwargs", "extra_special_tokens", "additional_special_tokens", "padding_side",
    "truncation_side", "bos_token", "mask_token", "cls_token", "sep_token",
}  # fmt: skip
# ... at these values only: another changes the ids, their layout or the text tower's read-out.
NEUTRAL = {
    "tokenizer_class": ("SiglipTokenizer", None), "backend": ("sentencepiece", None), "sp_model_kwargs": ({}, None),
    "extra_special_tokens": ([], {}, None), "additional_special_tokens": ([], None), "padding_side": ("right", None),
    "truncation_side": ("right", None), "bos_token": (None,), "mask_token": (None,), "cls_token": (None,),
    "sep_token": (None,),
}  # fmt: skip


def special_token(value: Any) -> str | None:
    """A token as tokenizer_config.json writes it: a string, an AddedToken dict or null."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _refuse(where: Path, what: str) -> InputError:
    return InputError(
        f"{str(where)!r}: {what}, which the zoo's SigLIP tokenizer does not reproduce (SiglipTokenizer's defaults are)"
    )


def read_settings(config: dict, where: Path) -> dict:
    """The settings of ``tokenizer_config.json`` (``config``) that decide the ids; an ``InputError`` naming others."""
    if unknown := sorted(set(config) - set(DEFAULTS) - READ - INERT):
        raise _refuse(where, f"it sets {', '.join(unknown)}")
    for field, allowed in NEUTRAL.items():
        if config.get(field) not in allowed:
            raise _refuse(where, f"{field}={config[field]!r}")
    settings = {
        k: special_token(config.get(k, v)) if k.endswith("_token") else config.get(k, v) for k, v in DEFAULTS.items()
    }
    if settings["pad_token"] != settings["eos_token"]:
        raise _refuse(where, f"pad_token {settings['pad_token']!r} is not the eos_token {settings['eos_token']!r}")
    added = config.get("added_tokens_decoder") or {}
    if not isinstance(added, dict) or not all(isinstance(t, dict) and special_token(t) for t in added.values()):
        raise _refuse(where, "added_tokens_decoder is not {id: token}")
    for key in ("do_lower_case", "legacy", "split_special_tokens"):
        if type(config.get(key, True)) is not bool:
            raise _refuse(where, f"{key}={config[key]!r} (true or false)")
    if type(settings["model_max_length"]) is not int or settings["model_max_length"] <= 0:
        raise _refuse(where, f"model_max_length={settings['model_max_length']!r}")
    return settings | {
        "added": {
            str(i): {"content": t["content"], **{f: bool(t.get(f, False)) for f in FLAGS}} for i, t in added.items()
        },
        "do_lower_case": config.get("do_lower_case", True),
        "legacy": config.get("legacy", True),
        "split_special_tokens": config.get("split_special_tokens", False),
    }


class SiglipTokenizer:
    """``SiglipTokenizer``'s ids from its ``spiece.model`` (bytes) and settings (``read_settings``)."""

    kind = "siglip"

    def __init__(self, model: bytes, settings: dict) -> None:
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2

        try:
            proto = sentencepiece_model_pb2.ModelProto.FromString(model)
        except Exception as err:  # protobuf's DecodeError, or its C parser's own error type
            raise InputError(f"spiece.model is not a SentencePiece model ({type(err).__name__})") from None
        if not proto.pieces or len(proto.pieces) > MAX_PIECES:
            raise InputError(f"spiece.model holds {len(proto.pieces)} pieces, not 1 to {MAX_PIECES}: not a tokenizer")
        if not settings["legacy"] and proto.normalizer_spec.add_dummy_prefix:  # SentencePieceBackend.__init__
            proto.normalizer_spec.add_dummy_prefix = False
            model = proto.SerializeToString()
        self.model, self.settings = model, settings
        self.sp = spm.SentencePieceProcessor(model_proto=model)
        self.added = {t["content"]: (int(i), t) for i, t in sorted(settings["added"].items(), key=lambda x: int(x[0]))}
        for name in ("eos", "unk", "pad"):
            token = settings[f"{name}_token"]
            if token not in self.added and self.sp.id_to_piece(self.sp.piece_to_id(token)) != token:
                raise InputError(f"the SigLIP tokenizer's {name}_token {token!r} is not a piece of its spiece.model")
            self.added.setdefault(token, (self.sp.piece_to_id(token), {f: False for f in FLAGS}))
        self.eos_id = self._id(settings["eos_token"])
        self.unk = settings["unk_token"]
        self.unk_length = len(self.sp.encode(self.unk))
        self.stop_ids = (self.eos_id,)
        self.model_max_length = settings["model_max_length"]
        self.vocab_size = max(self.sp.get_piece_size(), max(i for i, _ in self.added.values()) + 1)
        by_length = sorted(self.added, key=len, reverse=True)  # at one position the longest token wins
        self.split = re.compile("|".join(map(re.escape, by_length)))

    @classmethod
    def from_folder(cls, folder: Path) -> SiglipTokenizer:
        path, config_path = folder / "spiece.model", folder / "tokenizer_config.json"
        if not path.is_file():
            raise InputError(
                f"{str(folder)!r} is a SigLIP folder without spiece.model, the one file transformers' SiglipTokenizer "
                "reads (a tokenizer.json is not): copy spiece.model and tokenizer_config.json from the model's folder"
            )
        config = read_config(config_path) if config_path.is_file() else {}
        return cls(read_bytes(path, MAX_MODEL_BYTES), read_settings(config, config_path))

    def _id(self, token: str) -> int:
        return self.added[token][0] if token in self.added else self.sp.piece_to_id(token)

    def _chunks(self, text: str) -> list[str]:
        """Step 2: ``PreTrainedTokenizer.tokenize``'s split around the added tokens, with their flags."""
        if self.settings["split_special_tokens"]:
            return [text]
        tokens, start = [], 0
        for m in self.split.finditer(text):
            tokens += [text[start : m.start()], m.group()]
            start = m.end()
        tokens.append(text[start:])
        tokens = [t for t in tokens if t] if len(tokens) > 1 else tokens
        for i, token in enumerate(tokens):
            if token not in self.added:
                continue
            flags = self.added[token][1]
            left = tokens[i - 1] if i > 0 else None
            right = tokens[i + 1] if i < len(tokens) - 1 else None
            # lstrip and rstrip change no id here (step 3 strips every piece), but are kept as transformers has them
            if flags["rstrip"] and right:
                tokens[i + 1] = right.lstrip()
            if flags["lstrip"] and left:
                tokens[i - 1] = left.rstrip()
            if flags["single_word"]:
                if left and left[-1] != " ":
                    tokens[i - 1] += token
                    tokens[i] = ""
                elif right and right[0] != " ":
                    tokens[i + 1] = token + tokens[i + 1]
                    tokens[i] = ""
        return tokens

    def canonical(self, text: str) -> str:
        """Step 3's ``canonicalize_text``."""
        text = text.lower() if self.settings["do_lower_case"] else text
        text = text.translate(str.maketrans("", "", string.punctuation))
        return re.sub(r"\s+", " ", text).strip()

    def _pieces(self, text: str) -> list[int]:
        pieces = self.sp.encode(self.unk + self.canonical(text), out_type=str)
        pieces = pieces[self.unk_length :] if len(pieces) >= self.unk_length else pieces
        return [self._id(p) for p in pieces]

    def encode(self, text: str) -> list[int]:
        """The ids without the closing ``</s>`` (``zoo.io.tokenizers.tokenize`` adds it)."""
        ids: list[int] = []
        for chunk in self._chunks(UNDERLINE + text.replace(UNDERLINE, " ")):
            if chunk in self.added:
                ids.append(self.added[chunk][0])
            elif chunk:
                ids += self._pieces(chunk)
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        kept = [int(i) for i in ids if 0 <= i < self.sp.get_piece_size() and i != self.eos_id]  # padding, -100 out
        return self.sp.decode(kept)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": base64.b64encode(self.model).decode("ascii"), "settings": self.settings}

    @classmethod
    def from_dict(cls, d: dict) -> SiglipTokenizer:
        return cls(base64.b64decode(d["model"]), d["settings"])

    def pipeline(self):
        raise InputError(
            "a SigLIP tokenizer runs sentencepiece as transformers' SiglipTokenizer does: it has no tokenizer.json "
            "pipeline to write"
        )
