"""The manifest of a logged model: the sha256 of every file of its folder, recorded in the tracking store when it is
logged, and compared with the folder the artifact store holds now (``python -m zoo.tracking verify`` and the zoo's
``models:/``/``runs:/`` downloads).

Why every file: ``mlflow.pyfunc.load_model`` and ``mlflow models serve`` read the whole folder. The ``MLmodel``'s
``python_function`` flavor chooses what runs (``loader_module``, ``data``, ``code``, ``model_code_path``), the pyfunc
file and ``code/`` are run, and ``--env-manager virtualenv`` (or ``conda``) installs ``requirements.txt``,
``constraints.txt``, ``python_env.yaml`` (``conda.yaml``). A hash of the code alone left the rest to whoever can
write the artifacts.

Why the tracking store: in MLflow 3 a logged model's files live in the artifact store (a folder, a bucket, the
server's ``--artifacts-destination``) while its tags, and the registry's versions and their tags, live in the tracking
store (``sqlite:///mlflow.db``, a database behind ``mlflow server``). ``log_checkpoint_model`` tags the logged model
and each version it registers with ``zoo.manifest``; whoever can rewrite the files but not the database cannot make
them agree. One who can write both (a shared folder holding ``mlflow.db`` and ``mlruns/``) can; nothing in a store
guards against its owner.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from pathlib import Path

from zoo.tracking.downloads import (
    DownloadRefused,
    check_sizes,
    fetch,
    listing,
    logged_model_id,
    model_version,
    safe_path,
)

MANIFEST_TAG = "zoo.manifest"  # the logged model's and its registered versions' tags
MAX_FILES = 5000  # a zoo model folder holds about 150; a listing of more is not a zoo model's
# A manifest of MAX_FILES paths of a few hundred characters each; a tag longer than this is not one.
MAX_MANIFEST_CHARS = MAX_FILES * 400
RELOG = "log it again from its checkpoint: python -m zoo.tracking log-model <ckpt> --registered_model_name <name>"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_manifest(folder: Path) -> dict[str, str]:
    """``{path inside folder (posix): sha256}`` of every file under ``folder``; a link is refused, not followed."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise DownloadRefused(f"{path}: a link in a model folder: refused")
        if path.is_file():
            found[path.relative_to(folder).as_posix()] = sha256_file(path)
    return found


def encode(manifest: dict[str, str]) -> str:
    return json.dumps(dict(sorted(manifest.items())), separators=(",", ":"))


def decode(text: str | None, uri: str) -> dict[str, str] | None:
    """A recorded manifest, checked: paths inside the folder, sha256 digests, a bounded count; None when none was
    recorded."""
    if text is None:
        return None
    bad = DownloadRefused(f"{uri}: its {MANIFEST_TAG} tag is not a manifest of files: {RELOG}")
    if len(text) > MAX_MANIFEST_CHARS:
        raise bad
    try:
        manifest = json.loads(text)
    except ValueError:
        raise bad from None
    if not isinstance(manifest, dict) or len(manifest) > MAX_FILES:
        raise bad
    for path, digest in manifest.items():
        if not (path and isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            raise bad
        try:
            safe_path(path, uri)
        except DownloadRefused:
            raise bad from None
    return manifest


def differences(recorded: dict[str, str], found: dict[str, str]) -> list[str]:
    """What differs between two manifests, one ``<path> added|removed|changed`` per file, in path order."""
    what = {p: "added" for p in found.keys() - recorded.keys()}
    what |= {p: "removed" for p in recorded.keys() - found.keys()}
    what |= {p: "changed" for p in found.keys() & recorded.keys() if found[p] != recorded[p]}
    return [f"{p} {what[p]}" for p in sorted(what)]


def recorded_manifest(uri: str, store: str) -> tuple[dict[str, str] | None, str]:
    """The manifest the tracking store holds for the logged model ``uri`` names (a registered version's own tag, else
    its logged model's), and the path inside that model's folder ``uri`` names (``""``: the folder itself). None when
    none is recorded: a version registered from a run's files by hand, or ``runs:/`` files that are no logged model."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store, registry_uri=store)
    if (model_id := logged_model_id(uri)) is not None:
        return decode(client.get_logged_model(safe_path(model_id, uri)).tags.get(MANIFEST_TAG), uri), ""
    if uri.startswith("models:/"):
        mv = model_version(uri, store)
        if MANIFEST_TAG in mv.tags:
            return decode(mv.tags[MANIFEST_TAG], uri), ""
        # Registered without the zoo's tags (mlflow.register_model): its source's, where that is a logged model of its
        # own run (as zoo.tracking.downloads reads it; MLflow's sqlite registry keeps no model_id).
        if logged_model_id(mv.source) is not None or (mv.run_id and mv.source.startswith(f"runs:/{mv.run_id}/")):
            return recorded_manifest(mv.source, store)
        return None, ""
    run_id, _, path = uri.removeprefix("runs:/").partition("/")
    name, _, rest = safe_path(path, uri).partition("/")
    if not re.fullmatch(r"[\w.-]+", name):  # quoted into a filter string: a name only
        return None, rest
    run = client.get_run(run_id)
    models = client.search_logged_models([run.info.experiment_id], f"name = '{name}'")
    model = next((m for m in models if m.source_run_id == run_id), None)
    return (decode(model.tags.get(MANIFEST_TAG), uri) if model else None), rest


def folder_files(repo, path: str, uri: str) -> list:
    """Every file under ``path`` in the artifact repository, listed and checked like a download's, at most
    ``MAX_FILES`` entries (folders counted)."""
    files, todo, seen = [], [path], 0
    while todo:
        for entry in listing(repo, todo.pop(), uri):
            seen += 1
            if entry.is_dir:
                todo.append(entry.path)
            else:
                files.append(entry)
            if seen > MAX_FILES:
                raise DownloadRefused(f"{uri}: its folder lists over {MAX_FILES} entries: not a zoo model")
    return files


def stored_manifest(repo, path: str, uri: str, have: Path) -> dict[str, str]:
    """The manifest of the folder at ``path`` as the store holds it now, keyed by path inside that folder: each file
    hashed from ``have`` (a folder its files were fetched into, at their listed paths) where it lies there, the others
    fetched into a temporary folder, bounded like a download, and dropped (or, in an artifact folder of this machine,
    hashed where they lie)."""
    entries = folder_files(repo, path, uri)
    check_sizes(entries, uri)
    prefix = f"{path}/" if path else ""
    with tempfile.TemporaryDirectory() as tmp:
        missing = [e for e in entries if not (have / e.path).is_file()]
        where = {e.path: have / e.path for e in entries if (have / e.path).is_file()} | _local(repo, missing, uri)
        fetch(repo, [e for e in missing if e.path not in where], Path(tmp), uri)
        return {p.removeprefix(prefix): sha256_file(where.get(p, Path(tmp) / p)) for p in (e.path for e in entries)}


def _local(repo, entries: list, uri: str) -> dict[str, Path]:
    """Where ``entries`` lie when ``repo`` is a folder of this machine (copying each costs MLflow a thread task): plain
    files inside it, at their listed sizes; {} for any other store."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    if type(repo) is not LocalArtifactRepository:
        return {}
    root, found = Path(repo.artifact_dir).resolve(), {}
    for e in entries:
        local = Path(repo.artifact_dir, e.path)
        if local.is_symlink() or not local.is_file() or not local.resolve().is_relative_to(root):
            raise DownloadRefused(f"{uri}: {e.path} is not a plain file inside its artifact folder: refused")
        if local.stat().st_size != e.file_size:
            raise DownloadRefused(f"{uri}: {e.path} holds {local.stat().st_size:,} bytes, listed {e.file_size:,}")
        found[e.path] = local
    return found


def model_folder_files(repo, path: str, uri: str) -> list | None:
    """``folder_files`` of a model folder (an ``MLmodel`` at its top); None when there is none at ``path``."""
    prefix = f"{path}/" if path else ""
    files = folder_files(repo, path, uri)
    return files if any(e.path == f"{prefix}MLmodel" for e in files) else None


# MLflow's own note in a registered model's folder (its name and version, YAML): loading ``models:/`` from a store on
# this machine (``mlflow.pyfunc.load_model``) writes it into the store's folder itself, as MLflow hands out that folder
# rather than a copy. No loader of the zoo reads it; any other file the manifest does not hold is still refused.
MLFLOW_META = "registered_model_meta"


def check_download(uri: str, store: str, repo, path: str, local: Path) -> None:
    """Refuse a download (``DownloadRefused`` naming the first file that differs) whose model folder is not the one
    logged, by its manifest: ``local`` holds what the loaders fetched at ``path``; the folder's other files are fetched
    only to be hashed. A model with no manifest passes: the loaders read only its JSON and safetensors."""
    recorded, inside = recorded_manifest(uri, store)
    if recorded is None:
        return
    target = local / path
    if target.is_file():
        found = {inside: sha256_file(target)}
    else:
        found = {f"{inside}/{p}".lstrip("/"): h for p, h in stored_manifest(repo, path, uri, local).items()}
    wanted = {p: h for p, h in recorded.items() if not inside or p == inside or p.startswith(f"{inside}/")}
    found = {p: h for p, h in found.items() if p != MLFLOW_META or p in recorded}
    changed = differences(wanted, found)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise DownloadRefused(
            f"{uri}: its files differ from the manifest recorded when it was logged: {changed[0]}{more}: something "
            f"rewrote them in the artifact store; check with python -m zoo.tracking verify {uri}, or {RELOG}"
        )
