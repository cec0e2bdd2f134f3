"""The tripwire behind the stored-config builder (``zoo.io.tripwire``), tested on its own: with the builder's checks
switched off, a payload in a stored config is refused when it runs, not when it is read."""

from __future__ import annotations

import importlib
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
    done = []

    def other() -> None:
        (tmp_path / "other").write_text("x")  # the MLflow logger's thread, say
        done.append(True)

    worker = threading.Thread(target=other)
    with tripwire.guard():
        worker.start()
        worker.join()
    assert done == [True]


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
