"""The tripwire behind the stored-config builder (``zoo.io.tripwire``), tested on its own: with the builder's checks
switched off, a payload in a stored config is refused when it runs, not when it is read."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from zoo.io import build, tripwire
from zoo.io.tripwire import TripwireError

CNN = {"_class_path": "zoo.cnn.ClassifierModule", "net": {"class_path": "zoo.cnn.ConvNet", "init_args": {}}}


def test_each_kind_of_payload_is_refused_while_armed_and_runs_when_not(tmp_path):
    marker = tmp_path / "marker"
    payloads = [
        lambda: subprocess.Popen(["true"]),
        lambda: __import__("os").system("true"),
        lambda: marker.write_text("x"),
        lambda: open(marker, "a").close(),
        lambda: marker.touch(),
        lambda: (tmp_path / "d").mkdir(),
        lambda: socket.create_connection(("127.0.0.1", 9), timeout=0.1),
        lambda: importlib.import_module("antigravity"),
    ]
    for payload in payloads:
        with pytest.raises(TripwireError, match="refused: while a stored config was being built"), tripwire.guard():
            payload()
    assert not marker.exists() and not (tmp_path / "d").exists()
    marker.write_text("x")  # disarmed outside the block
    with tripwire.guard(writes=[tmp_path]):
        (tmp_path / "inside").write_text("allowed")  # the caller's own folder
        assert marker.read_text() == "x"  # reads are not refused


def test_a_payload_that_catches_the_refusal_gets_no_second_try(tmp_path):
    with tripwire.guard():
        for _ in range(3):
            with pytest.raises(TripwireError):
                subprocess.Popen(["true"])
        with pytest.raises(TripwireError):
            (tmp_path / "x").write_text("x")


def test_only_the_thread_that_armed_it_is_watched(tmp_path):
    armed, done = threading.Event(), []

    def other() -> None:
        armed.wait(5)
        (tmp_path / "other").write_text("x")  # the MLflow logger's thread, say
        done.append(True)

    worker = threading.Thread(target=other)
    worker.start()  # before arming: a thread started while armed is refused
    with tripwire.guard():
        armed.set()
        worker.join(5)
    assert done == [True]


def test_a_process_started_below_subprocess_is_refused(tmp_path):
    import _posixsubprocess

    # fork_exec raises no audit event of its own; refused before its arguments are even read
    for fork_exec in (_posixsubprocess.fork_exec, subprocess._fork_exec):  # the module's and the copy subprocess holds
        with pytest.raises(TripwireError, match="_posixsubprocess.fork_exec"), tripwire.guard():
            fork_exec()
    with pytest.raises(TripwireError, match="os.kill"), tripwire.guard():
        os.kill(os.getpid(), 0)
    assert subprocess.run(["true"]).returncode == 0  # disarmed: through the wrapper as before


def test_a_thread_started_while_armed_is_refused_and_never_runs():
    import _thread

    ran = []
    for start in (
        lambda: threading.Thread(target=ran.append, args=[1]).start(),
        lambda: _thread.start_new_thread(ran.append, (1,)),
    ):
        with pytest.raises(TripwireError, match="_thread.start_new_thread"), tripwire.guard():
            start()
    assert ran == []


def test_a_database_connection_is_refused(tmp_path):
    import sqlite3

    for where in (tmp_path / "db.sqlite", ":memory:"):
        with pytest.raises(TripwireError, match="sqlite3.connect"), tripwire.guard(writes=[tmp_path]):
            sqlite3.connect(where)
    assert not (tmp_path / "db.sqlite").exists()


def test_the_environment_and_the_working_folder_stay_as_they_were(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_TRIPWIRE_KEPT", "1")
    (elsewhere := tmp_path / "elsewhere").mkdir()
    for change in (
        lambda: os.environ.__setitem__("ZOO_TRIPWIRE_SET", "1"),
        lambda: os.environ.pop("ZOO_TRIPWIRE_KEPT"),
        lambda: os.chdir(elsewhere),
    ):
        with pytest.raises(TripwireError, match="os.putenv|os.unsetenv|os.chdir"), tripwire.guard():
            change()
    assert "ZOO_TRIPWIRE_SET" not in os.environ and os.environ["ZOO_TRIPWIRE_KEPT"] == "1"
    assert Path.cwd() != elsewhere


def test_every_open_that_can_write_is_a_write(tmp_path):
    kept = tmp_path / "kept"
    kept.write_text("x")
    fd = os.open(kept, os.O_RDONLY)  # opened before arming
    opens = [
        lambda: open(fd, "w", closefd=False),  # no folder allowed: no descriptor written through either
        lambda: os.chmod(fd, 0o600),
        lambda: open(kept, "r+"),
        lambda: open(kept, "rb+"),
        lambda: open(tmp_path / "new", "x"),
        lambda: open(kept, "a"),
        *(
            lambda f=f: os.open(kept, f)
            for f in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_APPEND, os.O_RDONLY | os.O_TRUNC)
        ),
    ]
    for opened in opens:
        with pytest.raises(TripwireError, match="a write to|os.chmod"), tripwire.guard():
            opened()
    os.close(fd)
    assert kept.read_text() == "x" and not (tmp_path / "new").exists()
    with tripwire.guard():
        assert open(kept).read() == "x" and os.close(os.open(kept, os.O_RDONLY)) is None  # reads pass


def test_a_write_is_allowed_only_inside_the_named_folder_itself(tmp_path, monkeypatch):
    run, run2 = tmp_path / "run", tmp_path / "run2"
    run.mkdir(), run2.mkdir()
    (run / "link").symlink_to(run2)
    (run2 / "outside").write_text("x")
    monkeypatch.chdir(run)
    with tripwire.guard(writes=[run]):
        (run / "sub").mkdir()
        (run / "sub" / "deep").write_text("allowed")
        for outside in (run2 / "x", run / ".." / "run2" / "x", run / "link" / "x"):  # /run2 is not under /run
            with pytest.raises(TripwireError, match="a write to"):
                outside.write_text("x")
        for move in (
            lambda: os.rename(run / "sub" / "deep", run2 / "deep"),  # from inside to outside
            lambda: os.link(run2 / "outside", run / "hard"),  # a write through it would land outside
        ):
            with pytest.raises(TripwireError, match="os.rename|os.link"):
                move()
        with pytest.raises(TripwireError, match="a write to relative"):
            open("relative", "w")  # os.open's dir_fd is not in the event: relative to what is unknown
    assert sorted(p.name for p in run2.iterdir()) == ["outside"] and not (run / "relative").exists()


def test_native_code_through_ctypes_is_refused():
    import ctypes

    for native in (
        lambda: ctypes.CDLL(None),  # dlopen
        lambda: ctypes.pythonapi["Py_GetVersion"],  # a symbol of a library opened before arming
        lambda: ctypes.c_char.from_address(id(b"x")),  # an object at an address
        lambda: __import__("gc").get_objects(),  # the unwrapped primitives, found without a name
    ):
        with pytest.raises(TripwireError, match="ctypes.dlopen|ctypes.dlsym|ctypes.cdata|gc.get_objects"):
            with tripwire.guard():
                native()


def test_a_file_run_as_code_is_refused_whatever_its_name(tmp_path):
    import runpy

    (tmp_path / "payload.txt").write_text("ran = True\n")
    with pytest.raises(TripwireError, match="running .*payload.txt"), tripwire.guard():
        runpy.run_path(str(tmp_path / "payload.txt"))
    assert runpy.run_path(str(tmp_path / "payload.txt"))["ran"]  # disarmed


def test_a_nested_guard_allows_only_what_both_allow(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir(), (a / "sub").mkdir()
    pkg_a, pkg_b = (f"user_{uuid.uuid4().hex[:8]}" for _ in "ab")
    for name in (pkg_a, pkg_b):
        (tmp_path / f"{name}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with tripwire.guard(writes=[a], imports=[pkg_a]):
        with tripwire.guard(writes=[a / "sub", b], imports=[pkg_a, pkg_b]):
            (a / "sub" / "x").write_text("x")  # in both
            for outside in (b / "x", a / "y"):  # only the inner's; only the outer's
                with pytest.raises(TripwireError, match="a write to"):
                    outside.write_text("x")
            importlib.import_module(pkg_a)
            with pytest.raises(TripwireError, match=f"import {pkg_b}"):
                importlib.import_module(pkg_b)  # only the inner names it
        with tripwire.guard(writes=[tmp_path]):  # wider than the outer: the outer's folder only
            (a / "z").write_text("x")
            with pytest.raises(TripwireError):
                (tmp_path / "z").write_text("x")
        (a / "y").write_text("x")  # the outer's rules again
    assert not (b / "x").exists() and not (tmp_path / "z").exists()


def test_an_import_from_outside_the_zoos_dependencies_is_refused(tmp_path, monkeypatch):
    name = f"evil_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TripwireError, match=f"import {name}"), tripwire.guard():
        importlib.import_module(name)
    assert not (tmp_path / "ran").exists() and name not in sys.modules
    assert tripwire.allowed_import("torch.nn") and tripwire.allowed_import("json") and tripwire.allowed_import("zoo")
    assert not tripwire.allowed_import("webbrowser") and not tripwire.allowed_import(name)
    assert tripwire.allowed_import(name, frozenset({name}))  # the user's own package, named in their config


@pytest.fixture
def no_checks(monkeypatch):
    """The builder with its class checks switched off: any class path is imported and built."""

    def anything(self, value, bases, where, kind, depth):
        value = {"class_path": value} if isinstance(value, str) else value
        module, _, name = value["class_path"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        return build.Part(cls, value["class_path"], dict(value.get("init_args") or {}), "class")

    monkeypatch.setattr(build.Resolver, "nested", anything)


@pytest.mark.parametrize(
    "payload",
    [
        {"class_path": "subprocess.Popen", "init_args": {"args": "touch {m}", "shell": True}},
        {"class_path": "subprocess.run", "init_args": {"args": ["touch", "{m}"]}},
        {"class_path": "os.system", "init_args": {"command": "touch {m}"}},
        {"class_path": "shutil.copyfile", "init_args": {"src": __file__, "dst": "{m}"}},
        {"class_path": "builtins.open", "init_args": {"file": "{m}", "mode": "w"}},
        {"class_path": "socket.create_connection", "init_args": {"address": ["127.0.0.1", 9]}},
        {"class_path": "importlib.import_module", "init_args": {"name": "antigravity"}},
    ],
    ids=lambda p: p["class_path"],
)
def test_with_the_builders_checks_off_the_tripwire_still_refuses_the_payload(no_checks, tmp_path, payload):
    from zoo.io.trust import zoo_allowlist

    marker = tmp_path / "marker"
    filled = {"class_path": payload["class_path"], "init_args": {}}
    for key, value in payload["init_args"].items():
        filled["init_args"][key] = (
            value.replace("{m}", str(marker))
            if isinstance(value, str)
            else [str(v).replace("{m}", str(marker)) for v in value]
            if isinstance(value, list)
            else value
        )
    part = build.resolve_model({**CNN, "net": filled}, "evil.ckpt", zoo_allowlist())
    with pytest.raises(TripwireError):
        build.build(part)
    assert not marker.exists()
    assert not Path("antigravity").exists()
