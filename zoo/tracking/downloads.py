"""Models and files downloaded from a tracking store, bounded: a store's listing is data, never an instruction.

``download(uri, store)`` fetches what ``models:/<name>/<version>``, ``models:/<name>@<alias>``, ``models:/<model id>``
(a logged model, as MLflow prints it) or ``runs:/<id>/<path>`` names into the model cache (``cache_dir()``), once,
and only what the zoo's loaders read (``MODEL_FILES``, or the one file a ``runs:/`` path names); never the model's
code. Before anything is fetched:

- a version's source must be an artifact location of that store's own run or logged model (``locations``);
- every path the store lists must stay inside the folder asked for (no ``..``, no absolute path);
- the listed sizes must add up to at most ``$ZOO_MAX_DOWNLOAD_BYTES`` (``max_download_bytes``).

While fetching, each file is written as it streams and stops at its listed size (one byte more is refused before it
is written), within a deadline (``zoo.tracking.remote``: a drip is refused, not waited on). Over HTTP the zoo reads
a tracking server's artifacts itself: the tracking credentials go to the server's own host and to the hosts
``$ZOO_TRUSTED_ARTIFACT_HOSTS`` lists, never to another host the server names or redirects to. A logged model's folder
must then match the manifest the tracking store recorded when it was logged (``zoo.tracking.manifest``: its other
files are hashed, never kept). A refusal is one ``DownloadRefused`` line naming the URI and what to do, and leaves
nothing in the cache.

The cache is keyed by the tracking store (``store_identity``) and what identifies the artifact in it, and each entry
records both (``.source``), checked on every read: one server's files never answer another server's URI, however
its ids were chosen.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse, urlsplit, urlunsplit

from zoo.tracking.remote import HTTP_SCHEMES, DownloadRefused, HttpArtifacts, copy_bounded, positive_setting

MAX_DOWNLOAD_ENV = "ZOO_MAX_DOWNLOAD_BYTES"
# Far above any zoo model trained here (a GPT-2 small's weights are 0.5 GB), far below filling a disk.
MAX_DOWNLOAD_BYTES = 16 * 2**30
SPEC, WEIGHTS = "module.json", "weights.safetensors"
# What load, load_model, resolve_checkpoint and local_weights read of a model folder: the MLmodel (load's signature),
# the spec and the weights. Nothing else is kept; the code the folder carries is read as bytes only, into temporary
# folders (its hash against the manifest, and `verify`'s against the installed zoo's).
MODEL_FILES = ("MLmodel", f"artifacts/{SPEC}", f"artifacts/{WEIGHTS}")
# Stores reached over the network: what they say a location is, a server chose.
REMOTE_STORES = ("http", "https", "databricks")


def cache_dir() -> Path:
    """Where downloaded models are kept: $ZOO_CACHE_DIR/models, else ~/.cache/zoo/models."""
    return Path(os.getenv("ZOO_CACHE_DIR") or Path.home() / ".cache" / "zoo") / "models"


def max_download_bytes() -> int:
    """The most bytes one download may fetch: $ZOO_MAX_DOWNLOAD_BYTES, else 16 GiB."""
    return positive_setting(MAX_DOWNLOAD_ENV, MAX_DOWNLOAD_BYTES, "bytes")


def logged_model_id(uri: str) -> str | None:
    """The logged model ``models:/<model_id>`` names (MLflow's own URI of a logged model, ``m-<hex>``), else None: a
    registered version is always ``<name>/<version>`` or ``<name>@<alias>``."""
    rest = uri.removeprefix("models:/").rstrip("/")
    return rest if uri.startswith("models:/") and rest and "/" not in rest and "@" not in rest else None


def model_version(uri: str, store: str):
    """The registered version ``models:/<name>/<version>`` or ``models:/<name>@<alias>`` names."""
    from mlflow.tracking import MlflowClient

    # Resolved here: MLflow resolves models:/ against its process-wide registry URI, not the one passed.
    name, _, version = uri.removeprefix("models:/").rstrip("/").partition("/")
    client = MlflowClient(store, registry_uri=store)
    if "@" in name:
        return client.get_model_version_by_alias(*name.split("@", 1))
    return client.get_model_version(name, version)


def safe_path(path: str, uri: str) -> str:
    """``path`` (relative, posix) if it stays inside its folder: no ``..``, no absolute path, no empty part."""
    parts = PurePosixPath(path).parts if path else ()
    if path.startswith("/") or "\\" in path or any(p in ("..", ".") for p in parts) or "//" in path:
        raise DownloadRefused(f"{uri}: the artifact path {path!r} leaves its folder: name a path inside the run")
    return path.strip("/")


def _is_local(location: str) -> bool:
    return urlparse(location).scheme in ("", "file") or bool(re.match(r"^[A-Za-z]:[\\/]", location))


def _normal(location: str) -> str:
    """A location for comparing prefixes: a local one as its absolute path, without a trailing slash."""
    if _is_local(location):
        return os.path.normpath(urlparse(location).path if location.startswith("file:") else location)
    return location.rstrip("/")


def _under(source: str, root: str, uri: str) -> str | None:
    """The path of ``source`` inside the artifact root ``root``, or None when it lies outside."""
    source, root = _normal(source), _normal(root)
    if source == root:
        return ""
    if not source.startswith(root + "/"):
        return None
    return safe_path(source.removeprefix(root + "/"), uri)


def run_locations(client, run_id: str, path: str, uri: str) -> list[tuple[str, str]]:
    """Where ``runs:/<run_id>/<path>`` may lie, as MLflow looks: the run's logged model named by the path's first
    part (MLflow 3 keeps a logged model's files apart from its run's), then the run's own artifacts."""
    run, path = client.get_run(run_id), safe_path(path, uri)
    name, _, rest = path.partition("/")
    found = []
    if re.fullmatch(r"[\w.-]+", name):  # quoted into a filter string: a name only
        models = client.search_logged_models([run.info.experiment_id], f"name = '{name}'")
        found = [(m.artifact_location, rest) for m in models if m.source_run_id == run_id][:1]
    return [*found, (run.info.artifact_uri, path)]


def version_locations(client, mv, uri: str) -> list[tuple[str, str]]:
    """Where a registered version's files lie. Its source must be an artifact location of the same store's own run
    or logged model: ``models:/<model_id>`` of a logged model of the version's run (or of no run, when the version
    names none), ``runs:/<the version's run>/<path>``, or a path under the artifact root of the version's run. A
    source anywhere else (``file:///home/...``, another run's or another store's artifacts) is refused: the
    registry would choose what this machine reads and copies into its cache."""
    source = mv.source
    if source.startswith("models:/"):
        model = client.get_logged_model(safe_path(source.removeprefix("models:/"), uri))
        if mv.run_id and model.source_run_id != mv.run_id:
            raise DownloadRefused(
                f"{uri}: its source {source} is a model of another run than the version's: register its own run's"
            )
        return [(model.artifact_location, "")]
    if source.startswith("runs:/"):
        run_id, _, path = source.removeprefix("runs:/").partition("/")
        if run_id == mv.run_id:
            return run_locations(client, run_id, path, uri)
    elif mv.run_id:
        inside = _under(source, client.get_run(mv.run_id).info.artifact_uri, uri)
        if inside is not None:
            return [(client.get_run(mv.run_id).info.artifact_uri, inside)]
    raise DownloadRefused(
        f"{uri}: its source {source} is not in the artifacts of its run ({mv.run_id}) in this store: register a "
        "version of a model logged to the store (python -m zoo.tracking log-model)"
    )


def locations(uri: str, store: str) -> list[tuple[str, str]]:
    """The (artifact root, path inside it) pairs where ``uri`` may lie in ``store``, most likely first (``served``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store, registry_uri=store)
    if (model_id := logged_model_id(uri)) is not None:
        found = [(client.get_logged_model(safe_path(model_id, uri)).artifact_location, "")]
    elif uri.startswith("models:/"):
        found = version_locations(client, model_version(uri, store), uri)
    else:
        run_id, _, path = uri.removeprefix("runs:/").partition("/")
        found = run_locations(client, run_id, path, uri)
    return served(found, store, uri)


def served(found: list[tuple[str, str]], store: str, uri: str) -> list[tuple[str, str]]:
    """``found``, unless a store reached over the network names a folder of this machine for it."""
    local = [root for root, _ in found if _is_local(root)]
    if urlparse(store).scheme in REMOTE_STORES and local:
        raise DownloadRefused(
            f"{uri}: the tracking server {store} places it in a folder of this machine ({local[0]}): have the "
            "server serve its artifacts (mlflow server --serve-artifacts, its default)"
        )
    return found


def listing(repo, path: str, uri: str) -> list:
    """The entries directly under ``path``, each checked to lie inside it."""
    entries = repo.list_artifacts(path or None)
    for entry in entries:
        inside = not path or entry.path.startswith(f"{path}/")
        name = entry.path.removeprefix(f"{path}/") if path else entry.path
        if not inside or "/" in name or name in ("", ".", ".."):
            raise DownloadRefused(
                f"{uri}: the store lists {entry.path!r} under {path!r}: refused, it leaves its folder"
            )
    return entries


def model_files(repo, path: str, uri: str) -> list | None:
    """What the loaders read at ``path``: the model folder's ``MODEL_FILES`` or the one file it names; None when
    nothing is there."""
    entries = listing(repo, path, uri)
    if not entries:  # a file, or nothing: a file is listed by its folder
        parent = path.rpartition("/")[0]
        return [e for e in listing(repo, parent, uri) if e.path == path and not e.is_dir] or None
    prefix = f"{path}/" if path else ""
    inner = [e for e in entries if e.path == f"{prefix}artifacts" and e.is_dir]
    entries += listing(repo, f"{prefix}artifacts", uri) if inner else []
    wanted = {f"{prefix}{f}" for f in MODEL_FILES}
    files = [e for e in entries if e.path in wanted and not e.is_dir]
    if not {f"{prefix}artifacts/{SPEC}", f"{prefix}artifacts/{WEIGHTS}"} <= {e.path for e in files}:
        raise DownloadRefused(f"{uri} holds no zoo model ({SPEC} + {WEIGHTS}): log one with zoo.tracking log-model")
    return files


def check_sizes(files: list, uri: str) -> int:
    """The listed total, refused above the limit or when the store gives no size."""
    limit = max_download_bytes()
    unsized = [f.path for f in files if f.file_size is None]
    if unsized:
        raise DownloadRefused(f"{uri}: the store lists no size for {unsized[0]}, so no limit can hold: refused")
    total = sum(f.file_size for f in files)
    if total > limit:
        raise DownloadRefused(
            f"{uri}: {total:,} bytes listed, over the {limit:,} bytes a download may take: raise "
            f"${MAX_DOWNLOAD_ENV} if you trust this store"
        )
    return total


def fetch(repo, files: list, dst: Path, uri: str) -> None:
    """``files`` into ``dst`` (kept at their listed paths), one at a time, each streamed to at most its listed size
    and the total to at most the limit; a file refused midway is removed."""
    limit, total = max_download_bytes(), 0
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        target = dst / safe_path(f.path, uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with opened(repo, f.path, dst, uri) as src, target.open("wb") as out:
                size = copy_bounded(src, out, min(f.file_size, limit - total), uri, f.path)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        total += size
        if size != f.file_size:
            target.unlink()
            raise DownloadRefused(
                f"{uri}: {f.path} ended at {size:,} bytes where the store listed {f.file_size:,}: refused"
            )


@contextlib.contextmanager
def opened(repo, path: str, dst: Path, uri: str):
    """The artifact at ``path`` as a ``read1`` stream: read where it lies (over HTTP by ``HttpArtifacts``, a local
    store's file in place); any other store's (s3://, gs://, ...) through MLflow into a folder beside ``dst``,
    measured as it is copied on."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    if isinstance(repo, HttpArtifacts):
        with repo.open(path) as stream:
            yield stream
        return
    if isinstance(repo, LocalArtifactRepository):
        local = Path(repo.artifact_dir) / path
        # A link in a shared artifact folder would otherwise hand out any file this user can read.
        if local.is_symlink() or not local.resolve().is_relative_to(Path(repo.artifact_dir).resolve()):
            raise DownloadRefused(f"{uri}: {path} is not a plain file inside its artifact folder: refused")
        with open(local, "rb") as stream:
            yield stream
        return
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".fetch-") as tmp:
        got = Path(repo.download_artifacts(path, tmp))
        if not got.resolve().is_relative_to(Path(tmp).resolve()):
            raise DownloadRefused(f"{uri}: {path} was written outside its download folder: refused")
        with open(got, "rb") as stream:
            yield stream


def find(uri: str, store: str, what) -> tuple[object, str, list]:
    """The artifact repository, the path inside it and the files ``what(repo, path, uri)`` picks, at the first
    location holding ``uri``."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    for root, path in locations(uri, store):
        if urlparse(root).scheme in HTTP_SCHEMES:  # read by the zoo: MLflow would send the credentials anywhere
            repo = HttpArtifacts(root, store, uri)
        else:
            repo = get_artifact_repository(root, tracking_uri=store, registry_uri=store)
        files = what(repo, path, uri)
        if files:
            return repo, path, files
    raise DownloadRefused(f"{uri}: no such artifact in {store}: check the run id and the path after it")


def store_identity(store: str) -> str:
    """The tracking store as the cache names it: scheme and host in lower case, the port spelled out, a local path
    absolute (``sqlite:///mlflow.db`` is a different store in each folder), no user, password or query."""
    parts = urlsplit(store)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or re.match(r"^[A-Za-z]:[\\/]", store):
        return "file://" + os.path.abspath(parts.path if scheme == "file" else store)
    if scheme == "sqlite":
        return "sqlite:///" + os.path.abspath(store.partition(":///")[2] or ":memory:")
    try:
        port = f":{parts.port}" if parts.port else {"http": ":80", "https": ":443"}.get(scheme, "")
    except ValueError:
        port = ""
    return urlunsplit((scheme, f"{(parts.hostname or '').lower()}{port}", parts.path.rstrip("/"), "", ""))


def _cache_key(uri: str, store: str) -> dict:
    """What a cache entry is of: the store and, in it, a version's run and source or the URI itself. Neither changes
    after it is logged (``log_checkpoint_model`` never writes into a folder a version points at), so a cached copy is
    never stale; an alias moving to another version resolves to another key. Ids are the server's to choose, so
    the store is part of the key: a server reusing another's ids gets its own entry."""
    artifact = uri
    if uri.startswith("models:/") and logged_model_id(uri) is None:
        mv = model_version(uri, store)
        artifact = f"{mv.run_id}:{mv.source}"
    return {"store": store_identity(store), "artifact": artifact}


def _cached(dst: Path, key: dict) -> bool:
    """Whether ``dst`` holds the entry ``key`` names, whole: its record names the same store and artifact and its
    files are there at their recorded sizes. Anything else (another store's, one written before records were kept,
    a file cut short) is no entry."""
    try:
        record = json.loads((dst / ".source").read_text())
        files = record.pop("files")
        whole = (dst / ".downloaded").is_file() and all((dst / n).stat().st_size == size for n, size in files.items())
        return record == key and whole
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


@contextlib.contextmanager
def refusals(uri: str):
    """MLflow's refusals (a missing run or version, a path it will not read) as one ``DownloadRefused`` line: its
    message is the reason; the URI and the fix are ours."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as err:
        raise DownloadRefused(f"{uri}: {err.message.splitlines()[0]}: check the name, version or run id") from err


def download(uri: str, store: str, check: Callable | None = None) -> Path:
    """A local copy of what ``uri`` names in ``store``, downloaded once into ``cache_dir()``: a model folder (its
    ``MODEL_FILES``) or one file. MLflow's own refusals (a missing run, a path it will not read) are
    ``DownloadRefused`` too. ``check(uri, store, repo, path, folder)`` judges the fetched files before they are
    cached (the loaders pass the manifest's, ``zoo.tracking.manifest.check_download``, which reads this module)."""
    with refusals(uri):
        key = _cache_key(uri, store)
        dst = cache_dir() / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        if dst.is_dir() and not _cached(dst, key):
            shutil.rmtree(dst, ignore_errors=True)
        if not dst.is_dir():
            _download_into(dst, uri, store, key, check)
    return dst / (dst / ".downloaded").read_text()


def _download_into(dst: Path, uri: str, store: str, key: dict, check: Callable | None) -> None:
    from zoo.tracking.store import process_tracking_uri

    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=dst.parent, prefix=".partial-"))
    try:
        # mlflow-artifacts:/ locations are reached through the process-wide tracking URI.
        with process_tracking_uri(store):
            repo, path, files = find(uri, store, model_files)
            check_sizes(files, uri)
            fetch(repo, files, partial / "files", uri)
            if check is not None:
                check(uri, store, repo, path, partial / "files")  # the folder as logged, by its manifest
        (partial / ".downloaded").write_text(f"files/{path}".rstrip("/"))  # what was asked: a file or a folder
        sizes = {f"files/{f.path}": f.file_size for f in files}
        (partial / ".source").write_text(json.dumps({**key, "files": sizes}, indent=1))
        partial.rename(dst)  # atomic: a concurrent download of the same key finds it whole or not at all
    except OSError:
        if not dst.is_dir():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
