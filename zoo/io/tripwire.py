"""A tripwire behind the stored-config builder: while something a file described is being built, this thread may not
start a process, import a module from outside the zoo's own dependencies (an ``import`` event, or a code file
opened), open a connection or write a file outside the folders the caller names.

``zoo.io.build`` admits only classes the allowlist names, so nothing here should ever fire; it is the second line, so
that a bug in those rules becomes a refusal rather than code execution. It is a ``sys.addaudithook`` hook (PEP 578),
installed once per process and active only inside ``guard()`` on the thread that entered it: the MLflow logger's and
the DataLoaders' threads are not watched. An audit hook cannot stop what a C extension does without raising an event,
nor code that was already running, nor a thread started (Python 3.11 raises no event for it; the thread would also
need a callable, which the builder cannot make from data); it stops what a payload reaches through Python's own
process, import, socket and file APIs, which is what a class path in a config can name.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from zoo.io.weights import CheckpointError

# Events that start a process or run a shell, reach the network, start a thread or load a native library.
REFUSED_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.startfile",
        "pty.spawn",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.getaddrinfo",
        "urllib.Request",
        "_thread.start_new_thread",
        "ctypes.dlopen",
        "pickle.find_class",
        "webbrowser.open",
    }
)
# Events that change the file system at their first argument (open is checked by its mode).
WRITE_EVENTS = frozenset(
    {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link", "os.truncate", "os.chmod", "os.utime"}
)
# The standard library's modules that open a browser, a window or a shell, or install packages.
REFUSED_STDLIB = frozenset(
    {"antigravity", "this", "webbrowser", "idlelib", "tkinter", "turtle", "turtledemo", "pty", "ensurepip", "venv"}
)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
OWN_PACKAGES = ("zoo", "datamodules", "callbacks")


class TripwireError(CheckpointError):
    """Something a stored config described tried to run code, import, connect or write while it was built."""


_state = threading.local()


@contextlib.contextmanager
def guard(writes: Iterable[str | Path] = (), imports: Iterable[str] = ()) -> Iterator[None]:
    """The tripwire, armed on this thread for the block; ``writes``: folders the block may write in; ``imports``:
    further top-level packages it may import (the user's own classes)."""
    _install()
    dependency_modules()  # read before arming: reading it imports
    outer = getattr(_state, "rules", None)
    folders = tuple(os.path.realpath(p) for p in writes)
    tops = frozenset(imports)
    if outer is not None:  # nested: what both allow
        folders, tops = tuple(f for f in folders if f in outer[0]), tops & outer[1]
    _state.rules = (folders, tops)
    try:
        yield
    finally:
        _state.rules = outer


@functools.cache
def _install() -> None:
    sys.addaudithook(_hook)


def _hook(event: str, args: tuple) -> None:
    rules = getattr(_state, "rules", None)
    if rules is None:
        return
    _state.rules = None  # what the checks below do (path resolution) is the hook's own, not the guarded block's
    try:
        _check(event, args, *rules)
    finally:
        _state.rules = rules  # still armed after a refusal: a payload that catches it gets no second try


def _check(event: str, args: tuple, folders: tuple[str, ...], tops: frozenset[str]) -> None:
    if event in REFUSED_EVENTS or event.startswith(("os.exec", "os.spawn")):
        _refuse(f"{event}{_shown(args)}")
    elif event == "import":
        name = str(args[0])
        if not allowed_import(name, tops):
            _refuse(f"import {name}")
    elif event == "open":
        path, mode, flags = (list(args) + [None, None])[:3]
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
        if writes and not _inside(path, folders):
            _refuse(f"a write to {path}")
        # importlib.import_module raises no "import" event: the module's code file is opened, which is one
        if not writes and isinstance(path, (str, bytes)) and (top := code_file_module(os.fsdecode(path))):
            if not allowed_import(top, tops):
                _refuse(f"import {top} (from {os.fsdecode(path)})")
    elif event in WRITE_EVENTS and args and not _inside(args[0], folders):
        _refuse(f"{event} {args[0]}")


def _refuse(what: str) -> None:
    raise TripwireError(
        f"refused: while a stored config was being built, {what} was attempted; a file's settings may not run code, "
        "import, connect or write. If you trust the file, give its settings yourself (--config <your YAML>)"
    )


def _shown(args: tuple) -> str:
    text = repr(args)
    return f" {text[:120]}..." if len(text) > 120 else f" {text}"


def _inside(path, folders: tuple[str, ...]) -> bool:
    if isinstance(path, int):
        return True  # an already open descriptor: its own open was checked
    real = os.path.realpath(os.fsdecode(path))
    return any(real == f or real.startswith(f + os.sep) for f in folders)


CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")


def code_file_module(path: str) -> str | None:
    """The top-level module a Python code file belongs to, by the ``sys.path`` entry it lies under; None for a file
    that is not code or lies under no entry."""
    if not path.endswith(CODE_SUFFIXES):
        return None
    real = os.path.realpath(path)
    roots = [r for r in map(_real_entry, sys.path) if r and real.startswith(r + os.sep)]
    if not roots:
        return None
    parts = real[len(max(roots, key=len)) + 1 :].split(os.sep)
    first = parts[1] if parts[0] == "__pycache__" and len(parts) > 1 else parts[0]
    return first.split(".")[0]


@functools.lru_cache(maxsize=256)
def _real_entry(entry: str) -> str:
    return os.path.realpath(entry or os.curdir)


def allowed_import(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether a module may be imported while the tripwire is armed: the standard library less what opens browsers,
    windows or shells; the zoo; the distributions it depends on; ``extra`` top-level packages."""
    top = name.split(".")[0]
    if top in REFUSED_STDLIB:
        return False
    return top in sys.stdlib_module_names or top in OWN_PACKAGES or top in extra or top in dependency_modules()


@functools.cache
def dependency_modules() -> frozenset[str]:
    """The top-level modules of every installed distribution the zoo needs, with its extras, transitively."""
    from packaging.requirements import Requirement

    providers: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            providers.setdefault(_canonical(dist), set()).add(module)
    seen, todo = set(), ["zoo[latent,fid,rl,adapt]"]
    while todo:
        req = Requirement(todo.pop())
        name = _canonical(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            declared = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for dep in map(Requirement, declared):
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in [*req.extras, ""]):
                todo.append(str(dep).split(";")[0])
    return frozenset(m for d in seen for m in providers.get(d, ()))


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
