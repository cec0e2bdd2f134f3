"""Text files to one token stream on disk: documents, cache keys, and (parallel) tokenisation.

A corpus is a ``.txt`` file (one document), a ``.jsonl`` file (one document per line, in a string
field), or a folder of both (recursive, sorted by path, so the order never depends on the file
system). Its token stream is every document followed by EOS, written once as raw ``uint16`` (or
``uint32`` for vocabularies over 65536) to ``tokens-<key>.bin`` under a folder named after the input
files (paths, sizes, mtimes), so later runs only ``np.memmap`` it. The key also holds the
tokenizer's ``to_dict``: another tokenizer gets another file, an edited input another folder.

Long documents are cut into pieces of about a megabyte only where the cut cannot change the tokens
(see ``split_document``), so single- and multi-process tokenisation write the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from zoo.errors import InputError
from zoo.io.files import replacing
from zoo.io.tokenizers import Tokenizer, tokenizer_from_dict

log = logging.getLogger(__name__)

SUFFIXES = (".txt", ".jsonl")
PIECE_CHARS = 1 << 20  # characters per tokenisation task: big enough to amortise IPC, small enough to stream
PARALLEL_BYTES = 20 << 20  # inputs above this are tokenised by a process pool when tokenize_workers=0
CACHE_VERSION = 1  # bump when the token file layout changes


def list_text_files(path: Path) -> list[Path]:
    """The ``.txt``/``.jsonl`` files of a corpus: ``path`` itself, or those under the folder ``path``."""
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise InputError(
                f"{str(path)!r} is neither .txt nor .jsonl: rename it, or pass a folder of .txt/.jsonl files"
            )
        return [path]
    files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    if not files:
        raise FileNotFoundError(f"no .txt or .jsonl files under {str(path)!r}")
    return files


def read_utf8(path: Path, setting: str = "path") -> str:
    """The text of ``path``; a file that is not UTF-8 (a binary, a Latin-1 export) is named, with the setting."""
    if path.is_dir():
        raise InputError(f"data.init_args.{setting}={str(path)!r} is a folder: pass a text file")
    try:
        return path.read_text("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"data.init_args.{setting}: {str(path)!r} is not UTF-8 text (byte {e.start}: {e.reason}); "
            f"convert it (iconv -t UTF-8) or pass another file"
        ) from None


def _jsonl_documents(path: Path, field: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:  # a line [[[[...]]]] nested past the limit
                raise InputError(
                    f"{path}:{n} is not a JSON line ({getattr(e, 'msg', 'nested deeper than Python parses')}): fix "
                    f"the line, or pass a .txt file"
                ) from None
            text = record.get(field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise InputError(
                    f"{path}:{n} has no string field {field!r} (found {keys}): set data.init_args.jsonl_field"
                )
            yield text


def iter_documents(files: Iterable[Path], jsonl_field: str) -> Iterator[str]:
    """Every non-empty document of the corpus, in file order."""
    for path in files:
        docs = _jsonl_documents(path, jsonl_field) if path.suffix == ".jsonl" else [read_utf8(path)]
        yield from (d for d in docs if d)


def training_text(files: list[Path], jsonl_field: str, val_fraction: float) -> Iterator[str]:
    """The documents up to the first ``1 - val_fraction`` of all characters: what a tokenizer may learn from.

    The validation split is the tail of the token stream (see ``TextDataModule``); cutting the text
    at the same fraction of characters keeps (almost exactly) that tail out of BPE training.
    """
    budget = int(sum(len(d) for d in iter_documents(files, jsonl_field)) * (1 - val_fraction))
    for doc in iter_documents(files, jsonl_field):
        if budget <= 0:
            return
        yield doc[:budget]
        budget -= len(doc)


# A cut right after a newline with non-space on both sides. GPT-2's pre-tokenizer regex makes such a
# newline a pre-token of its own and never lets one span it (the next pre-token starts at the
# non-space), and BPE merges only within pre-tokens; bytes and characters are exact anywhere.
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def split_document(doc: str, size: int | None = None) -> Iterator[str]:
    """Pieces of about ``size`` characters whose tokens, concatenated, are those of ``doc``."""
    size, start = size or PIECE_CHARS, 0
    while len(doc) - start > size:
        cut = _SAFE_CUT.search(doc, start + size)
        if cut is None:
            break
        yield doc[start : cut.start()]
        start = cut.start()
    yield doc[start:]


def tasks(docs: Iterable[str], size: int | None = None) -> Iterator[list[tuple[str, bool]]]:
    """Groups of (piece, ends_document) of about ``size`` characters: one tokenisation job each."""
    size = size or PIECE_CHARS  # read at call time, so a test can make tasks small
    group, chars = [], 0
    for doc in docs:
        pieces = list(split_document(doc, size))
        for i, piece in enumerate(pieces):
            group.append((piece, i == len(pieces) - 1))
            chars += len(piece)
            if chars >= size:
                yield group
                group, chars = [], 0
    if group:
        yield group


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def encode_task(tokenizer: Tokenizer, task: list[tuple[str, bool]]) -> np.ndarray:
    """The tokens of one task, EOS after each document's last piece."""
    ids: list[int] = []
    for piece_ids, (_, ends) in zip(tokenizer.encode_batch([p for p, _ in task]), task):
        ids.extend(piece_ids)
        if ends:
            ids.append(tokenizer.eos_id)
    return np.asarray(ids, dtype=token_dtype(tokenizer.vocab_size))


_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer_dict: dict) -> None:
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already; no Rust threads on top
    _worker_tokenizer = tokenizer_from_dict(tokenizer_dict)


def _encode_in_worker(task: list[tuple[str, bool]]) -> np.ndarray:
    return encode_task(_worker_tokenizer, task)


def auto_workers(files: list[Path], requested: int) -> int:
    """``requested`` if set, else a pool only for big inputs (starting processes costs more than small inputs)."""
    if requested > 0:
        return requested
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cpus, 8) if sum(f.stat().st_size for f in files) > PARALLEL_BYTES else 1


def _write_tokens(results: Iterable[np.ndarray], path: Path) -> int:
    n = 0
    with replacing(path) as tmp, open(tmp, "wb") as f:  # atomic: a crash never leaves half a token file
        for arr in results:
            f.write(arr.tobytes())
            n += len(arr)
    return n


def tokenize_to_file(files: list[Path], jsonl_field: str, tokenizer: Tokenizer, path: Path, workers: int) -> dict:
    """Tokenise the corpus into ``path`` (raw tokens) and return the metadata also written beside it."""
    jobs = tasks(iter_documents(files, jsonl_field))
    log.info("tokenising %d file(s) into %s with %d process(es)", len(files), path, workers)
    if workers <= 1:
        n = _write_tokens((encode_task(tokenizer, t) for t in jobs), path)
    else:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        with ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer.to_dict(),)) as pool:
            n = _write_tokens(pool.imap(_encode_in_worker, jobs), path)  # imap keeps document order
    meta = {"n_tokens": n, "dtype": token_dtype(tokenizer.vocab_size).name, "files": [str(f) for f in files]}
    write_json_atomic(path.with_suffix(".json"), meta)
    return meta


def write_json_atomic(path: Path, obj: dict) -> None:
    with replacing(path) as tmp:
        tmp.write_text(json.dumps(obj))


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def corpus_key(files: list[Path], jsonl_field: str) -> str:
    """Changes when any input file is added, removed, resized or touched."""
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return _digest({"files": stats, "jsonl_field": jsonl_field, "version": CACHE_VERSION})


def tokenizer_key(tokenizer: Tokenizer) -> str:
    """A digest of ``to_dict`` that ignores JSON formatting of an embedded ``tokenizer.json``."""
    d = dict(tokenizer.to_dict())
    if "json" in d:
        d["json"] = json.loads(d["json"])
    return _digest(d)
