"""Files at names someone else may control: JSON read within bounds, a folder's index kept to its own files, and
outputs that replace what sits at their name instead of writing through it.

A pretrained folder, a cache or an output folder may be shared, and so written by someone else. What it holds is
data: a ``config.json`` or ``tokenizer.json`` is parsed within a size limit and a nesting depth, an index naming
shards names files of its own folder, and a file the zoo writes there never follows a link planted at its name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from zoo.errors import InputError
from zoo.io.config_fields import check_fields

# Twice the largest JSON a pretrained folder is known to hold (Gemma's 256k-entry tokenizer.json, 33 MB; configs
# and shard indexes are kilobytes to a few MB). Python's objects take 10-30x a JSON's bytes, so a file past this
# would cost gigabytes of memory before anything could look at it.
MAX_JSON_BYTES = 64 * 2**20


def read_bytes(path: str | Path, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of ``path``, or an ``InputError`` naming it when it holds more than ``max_bytes``: at most
    ``max_bytes + 1`` are read, so a file that lies about its size (``/dev/zero`` behind a link) is refused too."""
    with Path(path).open("rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(
            f"{str(path)!r} is larger than {max_bytes:,} bytes, more than any JSON or text a model folder, tokenizer "
            f"or cache holds: refused unread. Only load folders you created or trust"
        )
    return data


def read_json(path: str | Path, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON in ``path``; an ``InputError`` naming it when it is larger than ``max_bytes``, nested past Python's
    recursion limit (``[[[[...]]]]``, which json would raise a RecursionError traceback for) or not JSON at all."""
    path = Path(path)
    data = read_bytes(path, max_bytes)
    try:
        return json.loads(data)
    except RecursionError:
        raise InputError(
            f"{str(path)!r} nests its JSON deeper than Python parses ({sys.getrecursionlimit()} levels): refused"
        ) from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise InputError(f"{str(path)!r} is not JSON ({err})") from None


def read_config(path: str | Path, native: Collection[str] = ()) -> dict:
    """A model folder's JSON config (``config.json``, ``tokenizer_config.json``, ``generation_config.json``) read
    within bounds: an object that names no code, each field the zoo reads of its type (``zoo.io.config_fields``),
    else an ``InputError`` naming ``path``.

    ``auto_map`` is how a hub folder asks transformers to import its own ``modeling_*.py`` or ``tokenization_*.py``
    (``trust_remote_code``); the zoo runs no file of a folder, so a model that needs one does not load. Beside a
    ``model_type`` of ``native`` (those the caller builds itself, each one transformers implements in its own classes
    too) an ``auto_map`` alone is ignored, as transformers ignores it without ``trust_remote_code`` and builds its own
    class (DeepSeek-V3's hub config maps to its modeling files beside ``model_type: deepseek_v3``).
    """
    config = read_json(path)
    if not isinstance(config, dict):
        raise InputError(f"{str(path)!r} is not a JSON object: not a Hugging Face config")
    named = sorted(k for k in ("auto_map", "trust_remote_code", "custom_pipelines") if k in config)
    if named == ["auto_map"] and config.get("model_type") in native:
        named = []
    if named:
        raise InputError(
            f"{str(path)!r} names custom code ({', '.join(named)}): the zoo runs no code from a model folder, so a "
            f"model that needs its own modeling or tokenization module does not load. Only load folders you trust"
        )
    check_fields(config, path)  # a size as "64" would reach Python's arithmetic as a string
    return config


def file_in(folder: Path, name: Any, source: str) -> Path:
    """``folder / name`` for a file name that ``source`` (an index in ``folder``) gives: a plain file name of the
    folder, never a path out of it (``../../etc/x``, ``/abs``); an ``InputError`` naming ``source`` otherwise."""
    plain = isinstance(name, str) and name not in ("", ".", "..") and not set(name) & {"/", "\\", "\0"}
    if not plain:
        raise InputError(
            f"{source} names {name!r}, which is not a file of its own folder {str(folder)!r}: refused. Only load "
            f"folders you created or trust"
        )
    return folder / name


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A stand-in for ``path`` to write instead (by name: it does not exist yet), renamed over ``path`` once the block
    ends without an error, removed if it raises: readers see the old file or the whole new one.

    A link planted at ``path`` (pointing at someone's ``~/.bashrc``) is replaced, never followed: rename(2) swaps
    the name itself. Refusing links instead would need a check before the write, which a link planted between the
    two defeats. The stand-in has ``path``'s own name (writers record it: ``torch.export.save`` names its archive
    after it) inside a fresh folder beside it that only this user can enter (``mkdtemp``: a random name, mode
    0700), so nothing can be planted at it or swapped for it.
    """
    path = Path(path)
    folder = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        yield folder / path.name
        os.replace(folder / path.name, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_output_name(key: str, name: str | None) -> str | None:
    """``name`` unchanged when it is a folder or file name inside a run's folder: relative, and no ``..`` that
    leaves it; otherwise an InputError naming ``key``, checked before the run does any work."""
    if name is not None and (Path(name).is_absolute() or os.path.normpath(name).split(os.sep)[0] == os.pardir):
        raise InputError(
            f"{key}={name!r} is outside the run's folder: every output goes under the run's folder "
            f"(<default_root_dir>/<experiment id>/<run id>/), so give a name inside it (a relative path without "
            f"'..'), and copy the files elsewhere after the run"
        )
    return name
