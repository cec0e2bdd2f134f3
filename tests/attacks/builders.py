"""Pieces the payloads are made of: what a payload runs if it runs (a marker), pickles that call it, the tiny zoo
models and public-format folders the payloads are planted in."""

from __future__ import annotations

import functools
import io
import json
import pickle
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from harness import MARKER_NAME, MARKER_TEXT

TINY_NET = {"vocab_size": 17, "block_size": 8, "n_layer": 1, "n_embd": 16, "n_head": 2}


@functools.cache
def tiny_gpt2_folder(text: str, vocab_size: int) -> Path:
    """A whole GPT-2 folder of the tiny net (weights, config, tokenizer trained on ``text``), built once per process;
    payloads copy it before they tamper."""
    from zoo.gpt import GPT
    from zoo.gpt.formats.hf import export_gpt2
    from zoo.io.tokenizers import BPETokenizer

    folder = Path(tempfile.mkdtemp(prefix="corpus-gpt2-"))
    tokenizer = BPETokenizer.train([text] * 20, vocab_size)
    export_gpt2(GPT(**{**TINY_NET, "vocab_size": tokenizer.vocab_size}), folder)
    tokenizer.save(folder)
    return folder


GPT_HPARAMS = {"_class_path": "zoo.gpt.CausalLMModule", "net": {"class_path": "zoo.gpt.GPT", "init_args": TINY_NET}}


def shell(outside: Path) -> str:
    """A shell command that leaves the marker: what a payload that reaches a shell runs."""
    return f"touch {outside / MARKER_NAME}; echo {MARKER_TEXT}"


def python(outside: Path) -> str:
    """Python source that leaves the marker: what a payload that reaches exec/eval runs."""
    return f"open({str(outside / MARKER_NAME)!r}, 'w').write('ran'); print({MARKER_TEXT!r})"


class Call:
    """Pickles as ``fn(*args)``: unpickling it calls ``fn``."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def stack_global(module: str, name: str, *args: str) -> bytes:
    """A protocol-4 pickle calling ``module.name(*args)`` through STACK_GLOBAL (no GLOBAL opcode: the form
    scanners that grep for GLOBAL miss)."""

    def unicode(s: str) -> bytes:
        data = s.encode()
        return b"\x8c" + bytes([len(data)]) + data if len(data) < 256 else b"X" + struct.pack("<I", len(data)) + data

    body = unicode(module) + unicode(name) + b"\x93" + b"".join(unicode(a) for a in args)
    return b"\x80\x04" + body + {1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(len(args), b"") + b"R."


def torch_zip(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def tiny_state() -> dict:
    from zoo.gpt import GPT, CausalLMModule

    return CausalLMModule(GPT(**TINY_NET)).state_dict()


def checkpoint(path: Path, hparams: dict | None = None, data: dict | None = None, state: dict | None = None) -> Path:
    """A checkpoint as cli.py writes one (weights, the module's stored config, the data's), with ``hparams`` and
    ``data`` as given."""
    import lightning

    ckpt = {
        "state_dict": tiny_state() if state is None else state,
        "hyper_parameters": hparams or GPT_HPARAMS,
        "pytorch-lightning_version": lightning.__version__,
    }
    if data is not None:
        ckpt["datamodule_hyper_parameters"] = data
    torch.save(ckpt, path)
    return path


def replace_member(src: bytes, member_suffix: str, data: bytes, compress: int = zipfile.ZIP_STORED) -> bytes:
    """A zip (a torch.save archive) with the member ending ``member_suffix`` replaced by ``data``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(src)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            raw = data if info.filename.endswith(member_suffix) else zin.read(info)
            zout.writestr(info.filename, raw, compress_type=compress if info.filename.endswith(member_suffix) else 0)
    return out.getvalue()


def added_members(src: bytes, members: dict[str, bytes]) -> bytes:
    out = io.BytesIO(src)
    with zipfile.ZipFile(out, "a") as z:
        for name, raw in members.items():
            z.writestr(name, raw)
    return out.getvalue()


def safetensors_bytes(header: Any, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: an 8-byte little-endian header length (``length``, else the header's own), the header
    (JSON of ``header``, or bytes given as they are) and the data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def pickled(obj: Any, protocol: int = 2) -> bytes:
    return pickle.dumps(obj, protocol=protocol)
