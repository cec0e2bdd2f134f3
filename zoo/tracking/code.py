"""The code a logged model carries, and whether it is the installed zoo's (``python -m zoo.tracking verify``).

A zoo model is a pyfunc logged as code: its folder holds the pyfunc file (``pyfunc.py``) and a copy of the zoo's
sources (``code/zoo``). ``mlflow.pyfunc.load_model`` and ``mlflow models serve`` run that file with ``code/`` first on
``sys.path`` (MLflow's design), so serving a model runs whatever its folder holds. The zoo's own loaders (``load``,
``load_model``, ``resolve_checkpoint``) never import it (they fetch it only to hash it, ``zoo.tracking.manifest``). At
registration ``save_model`` records ``code_sha256`` of what it bundled in the MLmodel's metadata (and
``log_checkpoint_model`` as a tag of the logged model and its versions, beside the manifest of every file); ``verify``
compares every file the store holds now with the manifest, and hashes the code the same way to compare it with the
installed zoo's.
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


def stored_code(uri: str, store: str) -> tuple[str, str | None, list[str], list[str]]:
    """The sha256 of the code the model at ``uri`` holds in ``store`` now, the one recorded at registration (None if
    none was), what else in its MLmodel would run code other than its pyfunc file, and each file that differs from the
    manifest recorded when it was logged (``zoo.tracking.manifest``). A model with no manifest is refused."""
    from mlflow.models import Model

    from zoo.errors import InputError
    from zoo.tracking.downloads import check_sizes, fetch, find, refusals
    from zoo.tracking.manifest import RELOG, differences, folder_manifest, model_folder_files, recorded_manifest
    from zoo.tracking.store import process_tracking_uri

    with tempfile.TemporaryDirectory() as tmp, process_tracking_uri(store), refusals(uri):
        manifest, inside = recorded_manifest(uri, store)
        if manifest is None or inside:
            raise InputError(
                f"{uri}: unverifiable, the tracking store records no manifest of its files (a version registered "
                f"from files by hand, a folder that is no logged model, or logged before the zoo recorded one): {RELOG}"
            )
        repo, path, files = find(uri, store, model_folder_files)
        check_sizes(files, uri)
        fetch(repo, files, Path(tmp), uri)
        folder = Path(tmp) / path
        changed = differences(manifest, folder_manifest(folder))
        meta = Model.load(str(folder / "MLmodel"))  # YAML, read safely
        pyfunc = meta.flavors.get("python_function", {})
        odd = [
            f"{key} is {pyfunc.get(key)!r}, not {want!r}"
            for key, want in (("loader_module", CODE_LOADER), ("code", "code"))
            if pyfunc.get(key) != want
        ]
        if Path(pyfunc.get("model_code_path") or "").name != PYFUNC:
            odd.append(f"its pyfunc file is {pyfunc.get('model_code_path')!r}, not {PYFUNC}")
        code = code_sha256(folder / "code", folder / PYFUNC) if (folder / PYFUNC).is_file() else "none (no pyfunc.py)"
        return code, (meta.metadata or {}).get(CODE_KEY), odd, changed


def verify(uri: str, store: str) -> bool:
    """Print whether the model at ``uri`` is every file as logged and its code the installed zoo's; True when so."""
    stored, recorded, odd, changed = stored_code(uri, store)
    installed = installed_code_sha256()
    print(f"{uri}: bundled code sha256 {stored}")
    print(f"  recorded at registration: {recorded or 'none (logged before the zoo recorded it)'}")
    print(f"  installed zoo:            {installed}")
    for line in odd:
        print(f"  its MLmodel: {line}")
    for line in changed:
        print(f"differ: {line}")
    if changed:
        print(
            "differ: its folder is not the one logged (by the manifest in the tracking store): "
            "mlflow.pyfunc.load_model and mlflow models serve would read files that nobody logged"
        )
        return False
    if stored == installed and not odd:
        print("match: every file is as logged, and serving it with mlflow runs the installed zoo's code")
        return True
    print("differ: mlflow.pyfunc.load_model and mlflow models serve would run code that is not the installed zoo's")
    return False
