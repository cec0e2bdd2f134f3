"""The code a logged model carries, and whether it is the installed zoo's (``python -m zoo.tracking verify``).

A zoo model is a pyfunc logged as code: its folder holds the pyfunc file (``pyfunc.py``) and a copy of the zoo's
sources (``code/zoo``). ``mlflow.pyfunc.load_model`` and ``mlflow models serve`` run that file with ``code/`` first on
``sys.path`` (MLflow's design), so serving a model runs whatever its folder holds. The zoo's own loaders (``load``,
``load_model``, ``resolve_checkpoint``) never fetch nor import it. At registration ``save_model`` records
``code_sha256`` of what it bundled in the MLmodel's metadata (and ``log_checkpoint_model`` as a tag of the logged model
and its versions); ``verify`` hashes the code the store holds now, the same way, and compares it with the installed
zoo's.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

CODE_KEY = "zoo_code_sha256"  # the MLmodel's metadata
CODE_TAG = "zoo.code_sha256"  # the logged model's and its registered versions' tags
PYFUNC = "pyfunc.py"
# MLflow's loader of a model logged as code: it runs the pyfunc file named by model_code_path, with `code` on sys.path.
CODE_LOADER = "mlflow.pyfunc.loaders.code_model"
MAX_CODE_FILES = 5000  # the zoo has a few hundred; a listing of more is not a zoo model's


def bundle_code(dst: Path) -> Path:
    """The installed zoo's sources copied into ``dst/zoo`` as a model bundles them (compiled caches are the saving
    interpreter's, not the model's); returns ``dst``."""
    zoo_dir = Path(__file__).resolve().parents[1]
    shutil.copytree(zoo_dir, dst / "zoo", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def code_sha256(code: Path, pyfunc: Path) -> str:
    """sha256 over what a served model runs: its pyfunc file and every file under ``code`` (``.py`` or not: a stray
    ``.pyc`` or ``.pth`` runs too), in sorted order of their paths, each as ``path NUL size NUL bytes``."""
    files = {f"code/{p.relative_to(code).as_posix()}": p for p in sorted(code.rglob("*")) if p.is_file()}
    files[PYFUNC] = pyfunc
    digest = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def installed_code_sha256() -> str:
    """``code_sha256`` of the installed zoo, bundled as ``save_model`` bundles it."""
    with tempfile.TemporaryDirectory() as tmp:
        return code_sha256(bundle_code(Path(tmp)), Path(__file__).with_name(PYFUNC))


def code_files(repo, path: str, uri: str) -> list | None:
    """The files a served model runs at ``path`` (its MLmodel, pyfunc file and ``code/`` tree), listed and checked
    like a download's; None when no MLmodel is there."""
    from zoo.tracking.downloads import DownloadRefused, listing

    prefix = f"{path}/" if path else ""
    top = listing(repo, path, uri)
    files = [e for e in top if not e.is_dir and e.path in (f"{prefix}MLmodel", f"{prefix}{PYFUNC}")]
    if f"{prefix}MLmodel" not in {e.path for e in files}:
        return None
    todo = [e.path for e in top if e.is_dir and e.path == f"{prefix}code"]
    while todo:
        for entry in listing(repo, todo.pop(), uri):
            if entry.is_dir:
                todo.append(entry.path)
            else:
                files.append(entry)
        if len(files) > MAX_CODE_FILES:
            raise DownloadRefused(f"{uri}: its code/ folder lists over {MAX_CODE_FILES} files: not a zoo model")
    return files


def stored_code(uri: str, store: str) -> tuple[str, str | None, list[str]]:
    """The sha256 of the code the model at ``uri`` holds in ``store`` now, the one recorded at registration (None if
    none was), and what else in its MLmodel would run code other than its pyfunc file."""
    from mlflow.models import Model

    from zoo.tracking.downloads import check_sizes, fetch, find, refusals
    from zoo.tracking.store import process_tracking_uri

    with tempfile.TemporaryDirectory() as tmp, process_tracking_uri(store), refusals(uri):
        repo, path, files = find(uri, store, code_files)
        check_sizes(files, uri)
        fetch(repo, files, Path(tmp), uri)
        folder = Path(tmp) / path
        meta = Model.load(str(folder / "MLmodel"))  # YAML, read safely
        pyfunc = meta.flavors.get("python_function", {})
        odd = [
            f"{key} is {pyfunc.get(key)!r}, not {want!r}"
            for key, want in (("loader_module", CODE_LOADER), ("code", "code"))
            if pyfunc.get(key) != want
        ]
        if Path(pyfunc.get("model_code_path") or "").name != PYFUNC:
            odd.append(f"its pyfunc file is {pyfunc.get('model_code_path')!r}, not {PYFUNC}")
        return code_sha256(folder / "code", folder / PYFUNC), (meta.metadata or {}).get(CODE_KEY), odd


def verify(uri: str, store: str) -> bool:
    """Print whether the code the model at ``uri`` carries is the installed zoo's; True when it is."""
    stored, recorded, odd = stored_code(uri, store)
    installed = installed_code_sha256()
    print(f"{uri}: bundled code sha256 {stored}")
    print(f"  recorded at registration: {recorded or 'none (logged before the zoo recorded it)'}")
    print(f"  installed zoo:            {installed}")
    for line in odd:
        print(f"  its MLmodel: {line}")
    if stored == installed and not odd:
        print("match: serving it with mlflow runs the installed zoo's code")
        return True
    print("differ: mlflow.pyfunc.load_model and mlflow models serve would run code that is not the installed zoo's")
    return False
