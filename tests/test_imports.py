"""Dependencies run one way: cli.py -> callbacks/, datamodules/ -> zoo/. Nothing under zoo/ imports the others."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONFIGS, ROOT, cli

APPLICATION = ("callbacks", "datamodules", "cli")  # the packages zoo/ must never import, at any depth


def forbidden_imports(source: str) -> list[str]:
    """``line: module`` for every import of an application package in ``source``, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module", "__import__"
        ) and node.args and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value)]
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names if n.split(".")[0] in APPLICATION]
    return found


def test_the_checker_sees_imports_inside_functions():
    src = "import torch\ndef f():\n    from callbacks import X\n    import datamodules.text\n    importlib.import_module('cli')\n"
    assert forbidden_imports(src) == ["3: callbacks", "4: datamodules.text", "5: cli"]
    assert forbidden_imports("from zoo.layers import tokenizers\nimport callbacks_extra\n") == []


def test_nothing_under_zoo_imports_callbacks_datamodules_or_cli():
    bad = {
        str(path.relative_to(ROOT)): hits
        for path in sorted((ROOT / "zoo").rglob("*.py"))
        if (hits := forbidden_imports(path.read_text("utf-8")))
    }
    assert not bad, f"zoo/ imports application code (move the shared part under zoo/): {bad}"


def test_a_users_own_callbacks_and_datamodules_do_not_break_gpt_checkpoint_loading(tmp_path):
    c = cli("fit", "--config", str(CONFIGS / "gpt" / "gpt_tiny.yaml"), "--trainer.max_steps=2",
            "--trainer.limit_val_batches=0", "--trainer.logger=false")
    ckpt = tmp_path / "gpt.ckpt"
    c.trainer.save_checkpoint(ckpt)
    shadow = tmp_path / "user"
    shadow.mkdir()
    for name in ("callbacks", "datamodules"):  # a user's own modules of the same names, first on the path
        (shadow / f"{name}.py").write_text("USER = True\n")
    script = (
        "import callbacks, datamodules\n"
        "assert callbacks.USER and datamodules.USER  # the user's, not the zoo's\n"
        "from zoo.gpt import CausalLMModule\n"
        f"m = CausalLMModule.load_from_checkpoint({str(ckpt)!r}).eval()\n"
        "print(repr(m.generate(['ab'], max_new_tokens=3, temperature=0)[0]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", script], cwd=shadow, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().startswith("'")  # three generated characters, decoded by the carried tokenizer


def _built(*args: str):
    from cli import main

    return main(["--trainer.logger=false", *args], run=False)  # classes instantiated, nothing run


@pytest.mark.parametrize("config, callback", [("gpt/gpt_tiny.yaml", "LogTextSamples"),
                                              ("diffusion/ddpm_unet_shapes.yaml", "LogImageSamples"),
                                              ("diffusion/tiny.yaml", "LogImageSamples")])  # tiny lists its own
def test_the_cli_attaches_the_callbacks_a_module_declares_once(config, callback):
    names = [type(cb).__name__ for cb in _built("--config", str(CONFIGS / config)).trainer.callbacks]
    assert names.count(callback) == 1
    assert names.index(callback) < names.index("MonitoredCheckpoint")  # checkpoints stay last


def test_a_callback_the_config_lists_replaces_the_declared_default():
    c = _built("--config", str(CONFIGS / "gpt" / "gpt_tiny.yaml"), "--trainer.callbacks+=callbacks.LogTextSamples",
               "--trainer.callbacks.every_n_epochs=3")
    mine = [cb for cb in c.trainer.callbacks if type(cb).__name__ == "LogTextSamples"]
    assert len(mine) == 1 and mine[0].every_n_epochs == 3
