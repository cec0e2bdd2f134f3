"""A tripwire behind the stored-config builder: while something a file described is being built, this thread may not
start a process or a thread, signal a process, import a module or run a code file from outside the zoo's own
dependencies, load or call native code through ctypes, open a connection or a database, change the environment or the
working folder, or write a file outside the folders the caller names.

``zoo.io.build`` admits only classes the allowlist names, so nothing here should ever fire; it is the second line, so
that a bug in those rules becomes a refusal rather than code execution. It is a ``sys.addaudithook`` hook (PEP 578),
installed once per process and active only inside ``guard()`` on the thread that entered it: the MLflow logger's and
the DataLoaders' threads are not watched. Two primitives raise no audit event in CPython 3.11: ``_posixsubprocess
.fork_exec`` (what ``subprocess`` and ``multiprocessing`` call) and ``_thread.start_new_thread`` (before 3.13); at
install they are replaced, in their module and in every loaded module holding them (``subprocess._fork_exec``,
``threading._start_new_thread``), by a wrapper that raises an event of the same name first. Nested guards allow what
both allow: an inner guard cannot widen the outer one.

What it cannot stop: what a C extension does without raising an event; code compiled from a string (its file named
``<...>``, as ``dataclasses`` and ``namedtuple`` name theirs); code that was already running or a reference
to those two primitives held elsewhere than a module's globals before install (a class attribute, a closure); writes
through a descriptor opened before arming (``os.write`` raises no event; ``open(fd, "w")`` is let through where the
caller allowed writes, as ``tempfile`` wraps its own checked descriptors so). A write to a relative path is refused:
the ``open`` event does not say which folder (``dir_fd``) it is relative to. It stops what a payload reaches through
Python's own process, thread, import, exec, ctypes, socket, sqlite3, environment and file APIs, which is what a class
path in a config can name.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import os
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from zoo.io.weights import CheckpointError

# Events that start or signal a process, start a thread, reach the network or a database, change the environment or
# the working folder, load or call native code, find objects no module names, or open a browser.
REFUSED_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "_posixsubprocess.fork_exec",  # raised by the wrapper below
        "_winapi.CreateProcess",
        "os.system",
        "os.exec",  # every os.exec*; os.spawn* raise "os.spawn" on Windows, "os.fork" elsewhere
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.startfile",
        "os.kill",
        "os.killpg",
        "pty.spawn",
        "_thread.start_new_thread",  # the wrapper's before 3.13, CPython's own after
        "_thread.start_joinable_thread",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.getaddrinfo",
        "urllib.Request",
        "sqlite3.connect",
        "sqlite3.enable_load_extension",
        "sqlite3.load_extension",
        "os.putenv",
        "os.unsetenv",
        "os.chdir",  # would move every relative path used after the guard
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.dlsym/handle",
        "ctypes.cdata",  # an object at an address: a function pointer, say
        "ctypes.PyObj_FromPtr",
        "ctypes.call_function",
        "gc.get_objects",  # the unwrapped primitives, found without a module path
        "gc.get_referrers",
        "gc.get_referents",
        "pickle.find_class",
        "webbrowser.open",
    }
)
# Events that change the file system, with the positions of their paths (open is checked by its mode and flags).
WRITE_EVENTS = {
    "os.mkdir": (0,),
    "os.rename": (0, 1),  # os.replace too
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.symlink": (0, 1),
    "os.link": (0, 1),  # a hard link to a file outside would make a write inside land there
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.chflags": (0,),
    "os.lchflags": (0,),
    "os.utime": (0,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
}
WATCHED = REFUSED_EVENTS | WRITE_EVENTS.keys() | {"import", "open", "exec"}
# Process and thread starts that raise no audit event in CPython 3.11: (module, function, the event its wrapper raises).
UNAUDITED = (
    ("_posixsubprocess", "fork_exec", "_posixsubprocess.fork_exec"),
    ("_thread", "start_new_thread", "_thread.start_new_thread"),
    ("_thread", "start_new", "_thread.start_new_thread"),
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
    """The tripwire, armed on this thread for the block; ``writes``: folders the block may write in (absolute paths,
    each with everything under it); ``imports``: further top-level packages it may import (the user's own classes).
    Inside another guard, only what both allow."""
    _install()
    dependency_modules()  # read before arming: reading it imports
    outer = getattr(_state, "rules", None)
    folders = tuple(Path(os.path.realpath(p)) for p in writes)
    tops = frozenset(imports)
    if outer is not None:  # nested: a folder both hold (the deeper of two nested ones), a package both name
        folders = tuple(dict.fromkeys([*_within(folders, outer[0]), *_within(outer[0], folders)]))
        tops &= outer[1]
    _state.rules = (folders, tops)
    try:
        yield
    finally:
        _state.rules = outer


def _within(folders: tuple[Path, ...], others: tuple[Path, ...]) -> list[Path]:
    return [f for f in folders if any(f.is_relative_to(o) for o in others)]


@functools.cache
def _install() -> None:
    sys.addaudithook(_hook)
    _wrap_unaudited()


def _wrap_unaudited() -> None:
    """Each of ``UNAUDITED`` replaced by a wrapper raising its event, in its module and wherever a loaded module's
    globals hold it (``from _posixsubprocess import fork_exec``): modules imported later get the wrapper."""
    wrappers = {}
    for module_name, name, event in UNAUDITED:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # _posixsubprocess on Windows, where _winapi.CreateProcess raises its own event
            continue
        if (original := getattr(module, name, None)) is not None:
            wrappers[id(original)] = (original, _audited(event, original))
    for module in list(sys.modules.values()):
        held = vars(module) if isinstance(module, types.ModuleType) else {}
        if wrappers.keys() & set(map(id, held.values())):  # the few that do, found at C speed
            for key, value in list(held.items()):
                if (found := wrappers.get(id(value))) is not None and found[0] is value:
                    held[key] = found[1]


def _audited(event: str, original: Callable) -> Callable:
    def audited(*args, **kwargs):
        sys.audit(event, *args[:1])
        return original(*args, **kwargs)

    audited.__name__ = audited.__qualname__ = original.__name__
    return audited


def _hook(event: str, args: tuple) -> None:
    if event not in WATCHED:  # builtins.id (a thousand per deepcopy), object.__getattr__: most events, so first
        return
    rules = getattr(_state, "rules", None)
    if rules is None:
        return
    _state.rules = None  # what the checks below do (path resolution) is the hook's own, not the guarded block's
    try:
        _check(event, args, *rules)
    finally:
        _state.rules = rules  # still armed after a refusal: a payload that catches it gets no second try


def _check(event: str, args: tuple, folders: tuple[Path, ...], tops: frozenset[str]) -> None:
    if event in REFUSED_EVENTS:
        _refuse(f"{event}{_shown(args)}")
    elif event == "import":
        name = str(args[0])
        if not allowed_import(name, tops):
            _refuse(f"import {name}")
    elif event == "open":
        path, mode, flags = (list(args) + [None, None])[:3]
        writes = _writes(mode, flags)
        # a descriptor wrapped (tempfile's, from its own checked os.open) where the caller allows writes at all
        if writes and not (_inside(path, folders) or (isinstance(path, int) and folders)):
            _refuse(f"a write to {path}")
        # importlib.import_module raises no "import" event: the module's code file is opened, which is one
        if not writes and isinstance(path, (str, bytes)) and (top := code_file_module(os.fsdecode(path))):
            if not allowed_import(top, tops):
                _refuse(f"import {top} (from {os.fsdecode(path)})")
    elif event == "exec":  # a file run as code (runpy.run_path, imp.load_source) whatever its name ends with
        file = getattr(args[0], "co_filename", "<>") if args else "<>"
        if not file.startswith("<") and not allowed_import(_module_of(file) or "<>", tops):
            _refuse(f"running {file}")
    elif event in WRITE_EVENTS:
        for path in (args[i] for i in WRITE_EVENTS[event] if i < len(args)):
            if not _inside(path, folders):
                _refuse(f"{event} {path}")


def _writes(mode, flags) -> bool:
    """Whether an ``open`` event writes: a mode with w, a, x or + (``r+`` too), or flags asking to (``os.open``
    gives flags only, ``open()`` both)."""
    by_mode = isinstance(mode, str) and any(c in mode for c in "wax+")
    return by_mode or (isinstance(flags, int) and bool(flags & WRITE_FLAGS))


def _refuse(what: str) -> None:
    raise TripwireError(
        f"refused: while a stored config was being built, {what} was attempted; a file's settings may not run code, "
        "import, connect or write. If you trust the file, give its settings yourself (--config <your YAML>)"
    )


def _shown(args: tuple) -> str:
    text = repr(args)
    return f" {text[:120]}..." if len(text) > 120 else f" {text}"


def _inside(path, folders: tuple[Path, ...]) -> bool:
    """Whether ``path`` lies in one of ``folders``, resolved and by whole names (``/tmp/run`` holds ``/tmp/run/x``,
    not ``/tmp/run2``); a descriptor or a relative path never does (see the module's note)."""
    if not isinstance(path, (str, bytes, os.PathLike)) or not os.path.isabs(path := os.fsdecode(path)):
        return False
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(f) for f in folders)


CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")


def code_file_module(path: str) -> str | None:
    """The top-level module a Python code file belongs to, by the ``sys.path`` entry it lies under; None for a file
    that is not code or lies under no entry."""
    return _module_of(path) if path.endswith(CODE_SUFFIXES) else None


def _module_of(path: str) -> str | None:
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
