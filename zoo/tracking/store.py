"""The lock on a sqlite run store, and the check that its folder can be one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from zoo.errors import InputError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def store_lock(tracking_uri: str) -> contextlib.AbstractContextManager:
    """A lock on a sqlite store, held while a process opens the store or creates an experiment in it.

    MLflow creates and migrates a sqlite schema on first use without a lock: three runs started together in a
    fresh folder crashed in two ("table experiments already exists", "duplicate column name: step"), and two
    that both found no experiment would both create it. With a file lock beside the database (``<db>.lock``,
    fcntl on POSIX, through ``filelock``) the first run does it and the others find it done. Servers serialise
    their own writes: no lock for them.
    """
    path = _sqlite_path(tracking_uri)
    return FileLock(f"{path}.lock") if path else contextlib.nullcontext()


def check_store_folder(tracking_uri: str) -> None:
    """Refuse, in one line, a sqlite store whose folder cannot be one: a path through a regular file (the lock file
    and MLflow would otherwise fail deep inside, as a FileExistsError or an SQLAlchemy error)."""
    path = _sqlite_path(tracking_uri)
    if path and Path(path).is_dir():
        raise InputError(
            f"MLflow store {tracking_uri} is a folder, not a database file: name one inside it "
            f"(sqlite:///{Path(path).resolve() / 'mlflow.db'}) in MLFLOW_TRACKING_URI or "
            f"trainer.logger.init_args.tracking_uri"
        )
    for folder in Path(path).parents if path else ():
        if folder.exists() and not folder.is_dir():
            raise InputError(
                f"MLflow store {tracking_uri}: {str(folder)!r} is a file, not a folder. Fix MLFLOW_TRACKING_URI or "
                f"trainer.logger.init_args.tracking_uri (sqlite:///<a folder>/mlflow.db), or unset them to log to "
                f"{DEFAULT_TRACKING_URI}."
            )


@contextlib.contextmanager
def known_store(tracking_uri: str) -> Iterator[None]:
    """Within it, MLflow's refusal of a URI it has no store for (``foo://bar``: a KeyError, then its exception, then
    jsonargparse's around both) is one line naming the URI, the schemes MLflow takes and where the URI came from."""
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    try:
        yield
    except UnsupportedModelRegistryStoreURIException as err:
        schemes = ", ".join(f"{s}://" for s in err.supported_uri_schemes if s)
        raise InputError(
            f"MLflow has no store for {tracking_uri} (it takes {schemes} URIs): fix "
            f"MLFLOW_TRACKING_URI or trainer.logger.init_args.tracking_uri, or unset them to log to "
            f"{DEFAULT_TRACKING_URI}"
        ) from err


def _sqlite_path(tracking_uri: str) -> str | None:
    """The database file of a ``sqlite:///<path>`` URI (None for other stores and in-memory databases)."""
    path = tracking_uri.removeprefix("sqlite:///") if tracking_uri.startswith("sqlite:///") else None
    return path if path and not path.startswith(":memory:") else None


def tracking_uri() -> str:
    """Where ``ZooMLFlowLogger`` logs by default: $MLFLOW_TRACKING_URI, else ./mlflow.db."""
    return os.getenv("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('mlflow.db').resolve()}"


@contextlib.contextmanager
def process_tracking_uri(uri: str):
    """MLflow's process-wide tracking URI set to ``uri`` for the block, then put back as it was (the variable
    $MLFLOW_TRACKING_URI included). MLflow's SQL registry looks a ``models:/<model_id>`` source up with a client of
    the process-wide URI, not the registering client's (a TODO in its ``create_model_version``)."""
    import mlflow

    env = os.environ.pop("MLFLOW_TRACKING_URI", None)
    # Set by mlflow.set_tracking_uri, not by the variable (which is_tracking_uri_set also reads): the one to restore.
    before = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)  # which sets or unsets $MLFLOW_TRACKING_URI: put back as it was
        if env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = env
