"""Tokenizers for the GPT and CLIP families: bytes, characters, a locally trained BPE, GPT-2's BPE, and any model
folder's ``tokenizer.json`` (``zoo.io.hf_tokenizer``).

Model-side: a checkpoint carries its tokenizer (``to_dict``), so loading one needs only ``zoo``.

All five share one small protocol (``Tokenizer``): ``encode``/``encode_batch``/``decode``,
``vocab_size``, ``eos_id``, ``stop_ids``, ``to_dict`` and ``pipeline`` (the same ids as a ``tokenizers`` pipeline, which
an exported model folder holds as its ``tokenizer.json``). ``to_dict`` is JSON-able and complete (the BPE kinds
carry their whole ``tokenizer.json``), so a checkpoint restores the exact tokenizer with
``tokenizer_from_dict`` and needs no files. ``decode`` drops EOS and ids outside the vocabulary
(e.g. the ignore index -100), so it can be handed model outputs and padded targets as they are.

Byte-level BPE follows GPT-2 (Radford et al., 2019, "Language Models are Unsupervised Multitask
Learners", sec. 2.2): BPE over UTF-8 bytes with a regex pre-split, so any string is encodable and
no merge crosses a word/space/punctuation boundary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer
from torch import Tensor

from zoo.errors import InputError, missing_extra
from zoo.io.files import read_bytes, read_json, replacing
from zoo.io.patterns import check_patterns

EOS_TOKEN = "<|endoftext|>"


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int
    stop_ids: tuple[int, ...]  # generation ends at any: EOS, and the others a model's generation_config.json lists

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_dict(self) -> dict: ...

    def pipeline(self) -> HFTokenizer: ...


def _ids_below(ids: Sequence[int], limit: int) -> np.ndarray:
    """``ids`` as an int64 array without EOS, padding (-100) or anything else outside ``[0, limit)``."""
    arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    return arr[(arr >= 0) & (arr < limit)]


class ByteTokenizer:
    """UTF-8 bytes are the ids 0..255, EOS is 256: no files, no training, every string encodable."""

    vocab_size = 257
    eos_id = 256
    stop_ids = (256,)

    def encode(self, text: str) -> list[int]:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        # A window may cut a multi-byte character in half; "replace" shows that as U+FFFD instead of raising.
        return _ids_below(ids, 256).astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {"kind": "bytes"}

    def pipeline(self) -> HFTokenizer:
        """GPT-2's byte-level symbols at their bytes' ids with no merges, EOS an added token: the same ids, except
        that a text spelling ``<|endoftext|>`` is EOS there (as in GPT-2's, and as a chat template's end of reply
        must be) and bytes here."""
        hf = _byte_level(models.BPE({symbol: b for b, symbol in enumerate(_byte_symbols())}, []))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # no merge to bound
        hf.add_special_tokens([EOS_TOKEN])
        return hf


class CharTokenizer:
    """One id per character seen in the data (sorted, so the ids do not depend on reading order), EOS last.

    Characters are mapped through their code points with ``searchsorted``, so encoding a text is a
    few numpy calls rather than a Python loop over its characters.
    """

    def __init__(self, chars: Iterable[str]) -> None:
        self.chars = sorted(set(chars))
        if any(len(c) != 1 for c in self.chars):
            raise ValueError("CharTokenizer needs single characters")
        self.codepoints = np.array([ord(c) for c in self.chars], dtype=np.uint32)
        self.vocab_size = len(self.chars) + 1
        self.eos_id = len(self.chars)
        self.stop_ids = (self.eos_id,)

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        return cls(set(text))

    def encode(self, text: str) -> list[int]:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.searchsorted(self.codepoints, cps).clip(max=len(self.codepoints) - 1)
        unknown = self.codepoints[ids] != cps
        if unknown.any():
            c = chr(int(cps[unknown.argmax()]))
            raise ValueError(
                f"character {c!r} (U+{ord(c):04X}) is not in the CharTokenizer vocabulary of "
                f"{len(self.chars)} characters fitted on the training text; use tokenizer='bytes' for open text"
            )
        return ids.tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return self.codepoints[_ids_below(ids, len(self.chars))].astype("<u4").tobytes().decode("utf-32-le")

    def to_dict(self) -> dict:
        return {"kind": "chars", "chars": "".join(self.chars)}

    def pipeline(self) -> HFTokenizer:
        """Each character a token at its id, no merges, EOS an added token: the same ids, except that a text spelling
        ``<|endoftext|>`` is EOS there, and a character outside the vocabulary, refused here, is dropped there."""
        hf = HFTokenizer(models.BPE({c: i for i, c in enumerate(self.chars)}, []))  # no pre-split: one word
        hf.decoder = decoders.Fuse()  # the characters joined, not space-separated
        hf.add_special_tokens([EOS_TOKEN])
        return hf


def _byte_level(model: models.Model) -> HFTokenizer:
    """GPT-2's pipeline around a BPE ``model``: regex pre-split into byte-level symbols, no prefix space."""
    hf = HFTokenizer(model)
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return hf


class _HFTokenizer:
    """Shared by the two BPE kinds: a HF ``tokenizers.Tokenizer`` with ``<|endoftext|>`` as EOS."""

    kind = ""
    eos_token = EOS_TOKEN

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self.hf = tokenizer
        eos = tokenizer.token_to_id(self.eos_token)
        if eos is None:
            raise ValueError(f"the {self.kind} vocabulary has no {self.eos_token} token")
        self.eos_id, self.stop_ids = eos, (eos,)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # Rust-side batch encoding (threads across texts); the fast path for building token caches.
        return [e.ids for e in self.hf.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(_ids_below(ids, self.vocab_size).tolist(), skip_special_tokens=True)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "json": self.hf.to_str()}

    def pipeline(self) -> HFTokenizer:
        return self.hf

    @classmethod
    def from_json(cls, text: str):
        return cls(parse_tokenizer_json(text, f"the checkpoint's {cls.kind} tokenizer"))


class BPETokenizer(_HFTokenizer):
    """Byte-level BPE trained here (GPT-2's pre-split and byte alphabet), ``<|endoftext|>`` as EOS."""

    kind = "bpe"

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,  # a pair seen once is noise, not a unit (HF's byte-level default)
            special_tokens=[EOS_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is ever unknown
            show_progress=False,
        )
        hf = _byte_level(models.BPE())
        hf.train_from_iterator(texts, trainer)
        return cls(hf)

    def save(self, directory: str | Path) -> Path:
        """Write ``<directory>/tokenizer.json`` (HF's format) and return its path."""
        path = Path(directory) / "tokenizer.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:  # atomic: a concurrent reader never sees half a file, nor a link's target
            self.hf.save(str(tmp))
        return path

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """From a ``tokenizer.json`` or a folder holding one."""
        path = Path(path)
        # Read within bounds by the zoo, then handed over whole: tokenizers' own parser has neither limit.
        return cls.from_json(json.dumps(read_json(path / "tokenizer.json" if path.is_dir() else path)))


class GPT2Tokenizer(_HFTokenizer):
    """GPT-2's byte-level BPE from a local folder with ``vocab.json`` and ``merges.txt``.

    Built as transformers' GPT2TokenizerFast builds it (BPE model, ByteLevel pre-tokenizer without a
    prefix space, ByteLevel decoder), so the ids are GPT-2's; ``<|endoftext|>`` is 50256 in the real files.
    """

    kind = "gpt2"

    @classmethod
    def from_dir(cls, directory: str | Path) -> GPT2Tokenizer:
        directory = Path(directory)
        for name in ("vocab.json", "merges.txt"):
            if not (directory / name).is_file():
                raise FileNotFoundError(
                    f"GPT-2 tokenizer file {name} not found in {str(directory)!r}: pass gpt2_dir=<folder with "
                    "GPT-2's vocab.json and merges.txt>; nothing is downloaded (no tiktoken, no hub)"
                )
        # Read by the zoo within bounds and handed over as data (tokenizers' from_file reads any size, any depth).
        # merges.txt is "a b" per line after a "#version" header, as BPE.from_file parses it.
        vocab = read_json(directory / "vocab.json")
        lines = read_bytes(directory / "merges.txt").decode("utf-8").splitlines()
        merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
        if not isinstance(vocab, dict) or any(len(m) != 2 for m in merges):
            raise InputError(f"{str(directory)!r} does not hold GPT-2's vocab.json (an object) and merges.txt (pairs)")
        hf = _byte_level(models.BPE(vocab, merges))
        # Special, as in GPT-2's own tokenizer: the literal text "<|endoftext|>" encodes to the EOS id.
        hf.add_special_tokens([EOS_TOKEN])
        return cls(hf)


SPECIALS = ("bos", "eos", "pad")


def special_token(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, an AddedToken dict or null."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class PretrainedTokenizer(_HFTokenizer):
    """A model folder's ``tokenizer.json`` with its BOS/EOS/pad tokens, chat template (a string; rendered only by
    ``zoo.io.chat_template``) and the
    further ids generation stops at (Llama 3's generation_config.json lists three EOS ids)."""

    kind = "hf"

    def __init__(
        self,
        tokenizer: HFTokenizer,
        special: dict[str, str | None],
        chat_template: Any = None,
        stop_ids: Sequence[int] = (),
    ) -> None:
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
        stop_ids = stop_ids if isinstance(stop_ids, (list, tuple)) else [stop_ids]  # data: maybe anything
        # An id past the tokenizer's is kept, as transformers keeps it: the model's vocabulary may be larger.
        bad = [i for i in stop_ids if type(i) is not int or i < 0]
        if bad:
            raise InputError(f"the EOS ids {bad} (eos_token_id in generation_config.json or config.json) are not ids")
        self.stop_ids = tuple(dict.fromkeys([self.eos_id, *stop_ids]))  # EOS first, each once

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "json": self.hf.to_str(),
            "special": self.special,
            "chat_template": self.chat_template,
            "stop_ids": list(self.stop_ids),
        }

    @classmethod
    def from_dict(cls, d: dict) -> PretrainedTokenizer:
        return cls(
            parse_tokenizer_json(d["json"], "the checkpoint's tokenizer"),
            d.get("special") or {},
            d.get("chat_template"),
            d.get("stop_ids") or (),
        )


def parse_tokenizer_json(text: str, source: str) -> HFTokenizer:
    """The pipeline ``text`` describes, holding only regexes the zoo runs (``zoo.io.patterns``)."""
    try:
        hf = HFTokenizer.from_str(text)
    except Exception as err:  # tokenizers raises its own Exception type for any malformed pipeline
        raise InputError(f"{source} is not a tokenizer.json that the tokenizers library reads ({err})") from None
    check_patterns(hf, source)
    return hf


class OpenCLIPTokenizer(_HFTokenizer):
    """OpenAI CLIP's BPE as open_clip's ``SimpleTokenizer`` applies it (and OpenAI's ``clip.tokenize``).

    The text is cleaned as open_clip cleans it (ftfy's ``fix_text``, HTML entities unescaped twice, whitespace runs
    made one space, lower case), split by its regex (``'s``-style contractions, runs of letters, single digits, runs
    of other non-space characters; whitespace dropped), and each piece byte-encoded and merged with ``</w>`` marking
    its end; ids start with ``<start_of_text>``. Built from open_clip's ``bpe_simple_vocab_16e6.txt.gz`` (the first
    48,894 merges): 256 byte symbols, the same with ``</w>``, one per merge, then the two special tokens.
    """

    kind = "open_clip"
    eos_token = "<end_of_text>"
    SPECIAL = ("<start_of_text>", "<end_of_text>")
    PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
    N_MERGES = 49152 - 256 - 2

    @classmethod
    def from_merges_file(cls, path: str | Path) -> OpenCLIPTokenizer:
        """From ``bpe_simple_vocab_16e6.txt.gz`` (gzip, read within bounds)."""
        import gzip

        lines = gzip.decompress(read_bytes(path, 8 * 2**20)).decode("utf-8").split("\n")[1 : cls.N_MERGES + 1]
        merges = [tuple(line.split()) for line in lines]
        if len(merges) != cls.N_MERGES or any(len(m) != 2 for m in merges):
            raise InputError(f"{str(path)!r} is not open_clip's bpe_simple_vocab_16e6.txt.gz ({cls.N_MERGES} merges)")
        symbols = _clip_byte_symbols()
        vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges] + list(cls.SPECIAL)
        bpe = models.BPE({t: i for i, t in enumerate(vocab)}, merges, end_of_word_suffix="</w>")
        hf = HFTokenizer(bpe)
        # Specials matched whole before the split, as open_clip's regex tries them first (its cache maps them to
        # their ids); open_clip's split keeps matches only: "removed" with invert drops everything between them.
        hf.add_special_tokens(list(cls.SPECIAL))
        split = pre_tokenizers.Split(Regex(cls.PATTERN), behavior="removed", invert=True)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        hf.decoder = decoders.Sequence([decoders.Replace("</w>", " "), decoders.ByteLevel()])
        hf.post_processor = processors.TemplateProcessing(
            single="<start_of_text> $A", special_tokens=[(cls.SPECIAL[0], len(vocab) - 2)]
        )
        return cls(hf)

    @staticmethod
    def clean(text: str) -> str:
        """open_clip's ``clean="lower"``: ``whitespace_clean(basic_clean(text)).lower()``."""
        import html

        try:
            import ftfy
        except ImportError as err:
            raise missing_extra("ftfy", "open_clip's tokenizer (it cleans text with ftfy)") from err
        return " ".join(html.unescape(html.unescape(ftfy.fix_text(text))).split()).lower()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(self.clean(text)).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch([self.clean(t) for t in texts])]

    def decode(self, ids: Sequence[int]) -> str:
        return super().decode(ids).strip()

    def pipeline(self) -> HFTokenizer:
        raise InputError(
            "open_clip's tokenizer cleans text (ftfy, HTML entities, lower case) before its pipeline, which a "
            "tokenizer.json cannot state: it is not written as one"
        )


PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]


def _clip_byte_symbols() -> list[str]:
    """The 256 byte symbols in CLIP's vocabulary order (``bytes_to_unicode().values()``): the printable bytes as
    themselves, by byte, then the others as U+0100 onwards (GPT-2's byte alphabet, ordered)."""
    return [chr(b) for b in PRINTABLE] + [chr(256 + n) for n in range(256 - len(PRINTABLE))]


def _byte_symbols() -> list[str]:
    """GPT-2's ``bytes_to_unicode`` by byte: a printable byte is itself, the others U+0100 onwards in byte order."""
    others = iter(range(256, 512))
    return [chr(b) if b in PRINTABLE else chr(next(others)) for b in range(256)]


def tokenizer_from_dict(d: dict) -> Tokenizer:
    """Inverse of ``to_dict`` for every kind."""
    kind = d.get("kind")
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "chars":
        return CharTokenizer(d["chars"])
    if kind == "bpe":
        return BPETokenizer.from_json(d["json"])
    if kind == "gpt2":
        return GPT2Tokenizer.from_json(d["json"])
    if kind == "hf":  # a pretrained folder's (read by zoo.io.hf_tokenizer)
        return PretrainedTokenizer.from_dict(d)
    if kind == "open_clip":
        return OpenCLIPTokenizer.from_json(d["json"])
    if kind == "siglip":  # a SigLIP folder's spiece.model (zoo.io.siglip_tokenizer)
        from zoo.io.siglip_tokenizer import SiglipTokenizer

        return SiglipTokenizer.from_dict(d)
    raise ValueError(f"unknown tokenizer kind {kind!r} in {json.dumps(d)[:200]}")


def prompt_ids(tokenizer: Tokenizer, texts: Sequence[str]) -> list[Tensor]:
    """Each prompt's 1-D int64 ids; an empty one is EOS alone, a new document, as GPT-2 samples unconditionally."""
    return [torch.tensor(tokenizer.encode(t) or [tokenizer.eos_id], dtype=torch.long) for t in texts]


def tokenize(tokenizer: Tokenizer, texts: Sequence[str], context_length: int) -> Tensor:
    """(N, T) int64 ids: each text's ids cut to T - 1, then end-of-text, padded with end-of-text (CLIP's layout)."""
    eos = tokenizer.eos_id
    out = torch.full((len(texts), context_length), eos, dtype=torch.long)
    for i, ids in enumerate(tokenizer.encode_batch(list(texts))):
        ids = ids[: context_length - 1]
        out[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    return out
