"""A SentencePiece ``tokenizer.model`` (Llama 2) rebuilt as the ``tokenizers`` pipeline that transformers'
``LlamaTokenizer`` makes of it: the ids are ``AutoTokenizer``'s, and it travels as a ``tokenizer.json`` (kind ``hf``).

transformers 5 does not run sentencepiece on such a folder: it reads the model's pieces and rebuilds them as a BPE
(``SentencePieceExtractor`` and ``LlamaTokenizer.__init__``), and so does this file, by the same rules:
  1. the vocabulary is the pieces in id order; the merges are every split of a piece into two pieces, ranked by the
     merged piece's id (transformers' ``generate_merges``);
  2. BPE with byte fallback (``<0xNN>`` pieces) and no unknown token; no normalizer; a Metaspace pre-tokenizer that
     writes spaces as ``▁`` and prepends one to the text (``add_prefix_space``, default true) at its start only,
     or before every chunk between special tokens with ``legacy: true``; the decoder undoes both;
  3. the control and user-defined pieces, then BOS/EOS/UNK/pad (``tokenizer_config.json``; LlamaTokenizer's
     ``<s>``, ``</s>``, ``<unk>`` by default) are added tokens, matched whole in the text;
  4. BOS and EOS are added as ``add_bos_token`` and ``add_eos_token`` say (both false when absent, as
     transformers 5 reads a config without them).
Running sentencepiece itself would give other ids for some texts (a leading space, a special token written in the
text, one starting with ``▁``); the pipeline here equals ``AutoTokenizer``'s tokenizer.json, key for key (tested).

Refused in one line: a model transformers reads otherwise or loses text with (a Unigram model, no byte fallback, a
normalization rule or whitespace folding, which LlamaTokenizer ignores and sentencepiece applies, a
``tokenizer_class`` other than LlamaTokenizer, a Mistral or Qwen2 folder); a file that is not a model proto. The
file is data: read within a size limit and parsed by sentencepiece's own protobuf schema, nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from zoo.errors import InputError
from zoo.io.files import read_bytes
from zoo.io.tokenizers import special_token

# Three times the largest tokenizer.model known (Gemma 3's 262k pieces, 4.7 MB).
MAX_MODEL_BYTES = 16 * 2**20
# Merges are found by splitting each piece at every position: quadratic in a piece's length (a file of the largest
# size made of pieces this long takes seconds). sentencepiece's trainer makes pieces of at most 16 characters
# (max_sentencepiece_length); tags added by hand are short too.
MAX_PIECE_CHARS = 512
# Counts, checked before anything is built (a file within the size limit holds ~2M short pieces, which made 8.4M
# merges: 30 s and 3.3 GB): eight times Llama 2's 32,000 pieces, sixteen times its 61,249 merges (a model read as
# LlamaTokenizer reads it); at these the pipeline builds in seconds.
MAX_PIECES = 2**18
MAX_MERGES = 2**20
BPE, CONTROL, USER_DEFINED = 2, 3, 4  # sentencepiece_model.proto's ModelType.BPE and Piece.Type values
LLAMA_CLASSES = ("LlamaTokenizer", "LlamaTokenizerFast")
# Model types for which AutoTokenizer reads tokenizer.model with another class than LlamaTokenizer (depending on
# what else is installed, for Mistral's): their ids would not be the ones built here.
OTHER_READERS = ("mistral", "mixtral", "qwen2")
DEFAULTS = {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "pad": None}  # LlamaTokenizer's


def read_model(path: Path, config: dict, model_type: str | None = None) -> tuple[HFTokenizer, dict[str, str | None]]:
    """The pipeline of ``path`` (a tokenizer.model) under ``config`` (tokenizer_config.json) and its BOS/EOS/pad."""
    _check_reader(path, config, model_type)
    proto = _parse(read_bytes(path, MAX_MODEL_BYTES), path)
    special = {name: special_token(config.get(f"{name}_token", default)) for name, default in DEFAULTS.items()}
    hf = _pipeline(proto, config)
    _add_tokens(hf, proto, config, special, path)
    hf.post_processor = _bos_eos(hf, special, config)
    return hf, {name: special[name] for name in ("bos", "eos", "pad")}


def _check_reader(path: Path, config: dict, model_type: str | None) -> None:
    cls = config.get("tokenizer_class")
    if cls not in LLAMA_CLASSES or model_type in OTHER_READERS:
        said = f"model_type {model_type!r}" if model_type in OTHER_READERS else f"tokenizer_class {cls!r}"
        raise InputError(
            f"{str(path)!r}: the zoo reads a tokenizer.model as transformers' LlamaTokenizer does (tokenizer_class "
            f"LlamaTokenizer in tokenizer_config.json, a Llama-2-style folder), and transformers reads this one, with "
            f"{said}, otherwise: write its tokenizer.json where transformers is installed, "
            f"AutoTokenizer.from_pretrained(folder).save_pretrained(folder)"
        )


def _parse(data: bytes, path: Path) -> Any:
    """The model proto, checked to be one this file rebuilds exactly."""
    from sentencepiece import sentencepiece_model_pb2

    try:
        proto = sentencepiece_model_pb2.ModelProto.FromString(data)
    except Exception as err:  # protobuf's DecodeError, or its C parser's own error type
        said = " ".join(str(err).split())  # one line
        raise InputError(f"{str(path)!r} is not a SentencePiece model ({type(err).__name__}: {said})") from None
    if len(proto.pieces) > MAX_PIECES:
        raise InputError(
            f"{str(path)!r} holds {len(proto.pieces)} pieces, more than the {MAX_PIECES} the zoo reads (eight times "
            f"Llama 2's): it is not a tokenizer to build"
        )
    pieces = [p.piece for p in proto.pieces]
    bytes_held = {f"<0x{b:02X}>" for b in range(256)} <= set(pieces)
    norm = proto.normalizer_spec
    problem = next(
        (
            why
            for bad, why in (
                (not pieces, "it holds no pieces"),
                (proto.trainer_spec.model_type != BPE, "it is not a BPE model (transformers would rebuild it as one)"),
                (len(set(pieces)) != len(pieces), "two pieces are the same string"),
                (max(map(len, pieces), default=0) > MAX_PIECE_CHARS, f"a piece is over {MAX_PIECE_CHARS} characters"),
                (not (proto.trainer_spec.byte_fallback and bytes_held), "it has no byte fallback (unknown text lost)"),
                (bool(norm.precompiled_charsmap), f"it normalizes text ({norm.name}), which LlamaTokenizer skips"),
                (norm.remove_extra_whitespaces, "it folds whitespace runs, which LlamaTokenizer does not"),
            )
            if bad
        ),
        None,
    )
    if problem:
        raise InputError(
            f"{str(path)!r} is not a SentencePiece model the zoo reads exactly as transformers' LlamaTokenizer "
            f"does: {problem}"
        )
    return proto


def _pipeline(proto: Any, config: dict) -> HFTokenizer:
    """Steps 1 and 2: the BPE, pre-tokenizer and decoder of ``LlamaTokenizer.__init__``."""
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    hf = HFTokenizer(models.BPE(vocab, merges(vocab), fuse_unk=True, byte_fallback=True, dropout=None))
    prefix = config.get("add_prefix_space")
    prefix = True if prefix is None else bool(prefix)
    scheme = ("always" if config.get("legacy", False) else "first") if prefix else "never"
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    hf.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return hf


def merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces, ranked by the merged piece's id, then by the left part's length
    (transformers' ``generate_merges`` without scores); refused past ``MAX_MERGES``, counted as they are found."""
    found = []
    for p, i in vocab.items():
        found += [(i, k, p) for k in range(1, len(p)) if p[:k] in vocab and p[k:] in vocab]
        if len(found) > MAX_MERGES:
            raise InputError(
                f"the tokenizer.model's pieces make more than {MAX_MERGES} merges (each split of a piece into two "
                f"pieces is one), more than the zoo builds: it is not a tokenizer to build"
            )
    return [(piece[:k], piece[k:]) for _, k, piece in sorted(found)]  # (id, k) is unique: pieces never compared


def _add_tokens(hf: HFTokenizer, proto: Any, config: dict, special: dict, path: Path) -> None:
    """Step 3: the control and user-defined pieces; then the named tokens not among them, with their flags (an
    AddedToken dict's); then ``added_tokens_decoder``'s, whose flags win: the order transformers adds them in."""
    tagged = [p for p in proto.pieces if p.type in (CONTROL, USER_DEFINED)]
    names = {t for t in special.values() if t}  # special, whatever their piece or flags say
    hf.add_tokens(
        [AddedToken(p.piece, normalized=False, special=p.type == CONTROL or p.piece in names) for p in tagged]
    )
    pieces = {p.piece for p in tagged}
    hf.add_special_tokens(
        [_added(config.get(f"{n}_token", t), special=True) for n, t in special.items() if t in names - pieces]
    )
    _add_listed(hf, config.get("added_tokens_decoder") or {}, path, {p.piece for p in tagged if p.type == CONTROL})


def _bos_eos(hf: HFTokenizer, special: dict[str, str | None], config: dict) -> processors.TemplateProcessing:
    """Step 4, as transformers' ``update_post_processor`` writes it."""
    bos = special["bos"] if config.get("add_bos_token", False) else None
    eos = special["eos"] if config.get("add_eos_token", False) else None
    single = f"{f'{bos}:0 ' if bos else ''}$A:0{f' {eos}:0' if eos else ''}"
    pair = f"{single}{f' {bos}:1' if bos else ''} $B:1{f' {eos}:1' if eos else ''}"
    used = [(t, hf.token_to_id(t)) for t in (bos, eos) if t]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=used)


FLAGS = ("lstrip", "rstrip", "single_word", "normalized", "special")


def _added(value: str | dict, **override: bool) -> AddedToken:
    """A token of tokenizer_config.json: a string (special), or an AddedToken dict with its flags."""
    flags = {k: bool(value[k]) for k in FLAGS if k in value} if isinstance(value, dict) else {}
    return AddedToken(special_token(value), **({"normalized": False, "special": True} | flags | override))


def _add_listed(hf: HFTokenizer, listed: dict, path: Path, control: set[str]) -> None:
    """``added_tokens_decoder`` ({id: AddedToken dict}), in id order; each must land on its own id, and a control
    piece stays special (transformers' decode would still skip it)."""
    try:
        entries = sorted((int(i), t) for i, t in listed.items() if isinstance(t, dict) and special_token(t))
    except (AttributeError, TypeError, ValueError):  # not a dict, keys not ids, one id twice
        entries = None
    if entries is None or len(entries) != len(listed):
        raise InputError(f"{str(path.parent / 'tokenizer_config.json')!r}: added_tokens_decoder is not {{id: token}}")
    for i, token in entries:
        added = _added(token)
        (hf.add_special_tokens if added.special else hf.add_tokens)([added])  # the former sets special
        if hf.token_to_id(added.content) != i or (added.content in control and not added.special):
            raise InputError(
                f"{str(path.parent / 'tokenizer_config.json')!r}: added_tokens_decoder's {i}: {token} is not "
                f"the tokenizer.model's {hf.id_to_token(i)!r} (or not special, as its control pieces are)"
            )
