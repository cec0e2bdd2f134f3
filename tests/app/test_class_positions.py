"""Only what the user types as a class is a class (issue 52): a dotted word on the command line vouches for a class
path only in a position that takes a class (a ``class_path``, a bare value where the class it sets takes a class); a
checkpoint's file name, a folder or any other value never does, so a stored config naming the same word is refused
and nothing is imported. A refusal says exactly what was imported.

Each checkpoint here is plain data (a stored config, no tensors) naming a module of ``planted``, which leaves a marker
file when its code runs; ``this`` and ``antigravity`` are the standard library's modules with visible effects.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, terminal

PLANTED = """
import pathlib
pathlib.Path({marker!r}).touch()
import torch


class Net(torch.nn.Module):
    def __init__(self, num_classes: int | None = None):
        super().__init__()
"""


class Planted:
    def __init__(self, folder: Path, monkeypatch) -> None:
        self.name = f"planted_{uuid.uuid4().hex[:8]}"
        self.marker = folder / f"{self.name}.ran"
        (folder / f"{self.name}.py").write_text(PLANTED.format(marker=str(self.marker)))
        monkeypatch.syspath_prepend(str(folder))

    def ran(self) -> bool:
        return self.marker.exists() or self.name in sys.modules


@pytest.fixture
def planted(tmp_path, monkeypatch) -> Planted:
    folder = tmp_path / "site"
    folder.mkdir()
    yield (p := Planted(folder, monkeypatch))
    sys.modules.pop(p.name, None)


def checkpoint(path: str, net: str, module: str = "zoo.cnn.ClassifierModule") -> str:
    torch.save({"state_dict": {}, "hyper_parameters": {"_class_path": module, "net": {"class_path": net}}}, path)
    return path


def refused_importing_nothing(monkeypatch, capsys, *args: str) -> str:
    status, out, err = terminal(monkeypatch, capsys, *args)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status != 0 and len(lines) == 1, err
    assert "nothing it names was imported" in lines[0], lines[0]
    assert "The Zen of Python" not in out + err
    return lines[0]


@pytest.mark.parametrize("stdlib", ["this", "antigravity"])
def test_a_checkpoints_file_name_is_not_a_class_path(monkeypatch, capsys, stdlib):
    assert stdlib not in sys.modules
    if stdlib == "this":  # the module class, read by test
        torch.save({"state_dict": {}, "hyper_parameters": {"_class_path": "this.ckpt"}}, "this.ckpt")
    else:  # the net class, read by predict
        checkpoint("antigravity.ckpt", "antigravity.ckpt")
    sub = "test" if stdlib == "this" else "predict"
    line = refused_importing_nothing(monkeypatch, capsys, sub, "--ckpt_path", f"{stdlib}.ckpt")
    assert f"is '{stdlib}.ckpt'" in line
    assert stdlib not in sys.modules


def test_no_value_but_a_class_position_vouches_for_a_class(monkeypatch, capsys, planted):
    """The stored net names the planted module; the user types the same word as a file name, a folder, a data path
    and a weights path: each is a value, so the checkpoint is refused and the module never runs."""
    ck = checkpoint(f"{planted.name}.ckpt", f"{planted.name}.ckpt")
    other = checkpoint("other.ckpt", f"{planted.name}.Net")
    cases = [
        ("test", "--ckpt_path", ck),
        ("test", "--ckpt_path", other, f"--trainer.default_root_dir={planted.name}.Net"),
        ("test", "--ckpt_path", other, f"--data.init_args.path={planted.name}.Net"),
        ("test", "--ckpt_path", other, "--model.init_args.label_smoothing", f"{planted.name}.Net"),
    ]
    for args in cases:
        refused_importing_nothing(monkeypatch, capsys, *args)
        assert not planted.ran(), args
    # init_weights: a fit reads the net the file stores, against the classes the user's config names
    cnn = str(CONFIGS / "cnn" / "convnet_digits.yaml")
    refused_importing_nothing(monkeypatch, capsys, "fit", "--config", cnn, f"--model.init_args.init_weights={ck}")
    assert not planted.ran()


def test_a_class_path_the_user_types_is_theirs(planted):
    from zoo.app.stored_config import from_checkpoint

    ck = checkpoint("mine.ckpt", f"{planted.name}.Net")
    for flag in (f"--model.init_args.net.class_path={planted.name}.Net", f"--model.net={planted.name}.Net"):
        sys.modules.pop(planted.name, None)
        assert from_checkpoint(["predict", "--ckpt_path", ck, flag]).model is not None
        assert planted.ran()


@pytest.mark.parametrize("fails", [False, True], ids=["no-such-class", "its-import-fails-half-way"])
def test_a_refusal_names_what_the_users_own_class_path_imported(monkeypatch, capsys, planted, fails):
    if fails:  # its code runs, then fails: gone from sys.modules, but it ran
        path = Path(sys.path[0]) / f"{planted.name}.py"
        path.write_text(path.read_text() + "\nimport no_such_module_anywhere\n")
    ck = checkpoint("mine.ckpt", f"{planted.name}.Missing")
    status, _, err = terminal(
        monkeypatch, capsys, "predict", "--ckpt_path", ck, f"--model.init_args.net.class_path={planted.name}.Missing"
    )
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status != 0 and len(lines) == 1, err
    assert f"only {planted.name} (named by your own config or flags) was imported" in lines[0], lines[0]
    assert "nothing it names was imported" not in lines[0] and planted.marker.exists()


def test_wrappers_and_env_ids_the_user_types_are_theirs_and_their_other_values_are_not():
    from zoo.io.trust import trusted_class_paths

    flags = {"wrappers": ["my.Wrap"], "env_id": "my_envs:Env", "net": {"class_path": "my.Net", "init_args": {}}}
    values = {
        "path": "corpus.txt",
        "default_root_dir": "some.module",
        "names": ["a.b", {"x": "c.d"}],
        "root": "os.system",
    }
    assert trusted_class_paths({**flags, **values}) == {"my.Wrap", "my_envs:Env", "my.Net"}
