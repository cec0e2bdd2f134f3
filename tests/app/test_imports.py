"""Dependencies run one way: the application (cli.py, callbacks/, datamodules/, zoo.tracking, zoo.app) -> the five
families, side by side -> the shared parts (zoo.nn, zoo.io, zoo.train, zoo.compat, zoo.errors).
No family names the application or another family."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest
from conftest import CONFIGS, ROOT, cli

FAMILIES = ("zoo.gpt", "zoo.clip", "zoo.cnn", "zoo.diffusion", "zoo.rl")
SHARED = ("zoo.nn", "zoo.io", "zoo.train", "zoo.compat", "zoo.errors")
# The application: the packages no family and no shared part may name, at any depth, by import or class-path string.
APPLICATION = ("callbacks", "datamodules", "cli", "zoo.tracking", "zoo.app")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")  # a whole string that reads as a module or class path


def references(source: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` for every import in ``source`` (inside functions, by ``importlib`` too) and every string
    that is a dotted path: a class path a caller would import is an import in disguise."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names = [str(node.args[0].value)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            names = [node.value]
        else:
            continue
        found += [(node.lineno, n) for n in names]
    return sorted(set(found))


def owner(name: str) -> str | None:
    """The package of the graph that ``name`` lies in: a family, a shared part, "application", or None (outside)."""
    for package in (*FAMILIES, *SHARED):
        if name == package or name.startswith(package + "."):
            return package
    if any(name == a or name.startswith(a + ".") for a in APPLICATION):
        return "application"
    return None


def reaches(source: str, package: str) -> list[str]:
    """``line: name`` for each reference of ``source`` (a file of ``package``) into the application or another
    family."""
    return [
        f"{line}: {name}"
        for line, name in references(source)
        if (to := owner(name)) not in (None, package, *SHARED) and (to == "application" or package in FAMILIES)
    ]


def files_of(package: str) -> list:
    """The .py files of a package, or the one file of a module (``zoo.compat``)."""
    base = ROOT / package.replace(".", "/")
    return sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]


def graph() -> dict[str, dict[str, list[tuple[str, bool]]]]:
    """package -> {package it names -> [("file:line name", whether by import), ...]}, for families and shared parts."""
    edges: dict[str, dict[str, list[tuple[str, bool]]]] = {p: {} for p in (*FAMILIES, *SHARED)}
    for package in edges:
        for path in files_of(package):
            source = path.read_text("utf-8")
            imported = {n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))}
            for line, name in references(source):
                if (to := owner(name)) not in (None, package):
                    ref = f"{path.relative_to(ROOT)}:{line} {name}"
                    edges[package].setdefault(to, []).append((ref, line in imported))
    return edges


def test_the_checker_sees_imports_inside_functions_and_class_path_strings():
    src = (
        "import torch\ndef f():\n    from callbacks import X\n    import datamodules.text\n"
        "    importlib.import_module('cli')\n"
        "default_callbacks = ('callbacks.LogTextSamples',)\n"
        "from zoo.tracking import local_weights\n"
        "from zoo.cnn import ClassifierModule\n"
        "doc = 'names callbacks.LogTextSamples in a sentence'\n"
    )
    assert reaches(src, "zoo.gpt") == [
        "3: callbacks",
        "4: datamodules.text",
        "5: cli",
        "6: callbacks.LogTextSamples",
        "7: zoo.tracking",
        "8: zoo.cnn",
    ]
    assert reaches("from zoo.io import tokenizers\nimport callbacks_extra\nx = 'zoo.gpt.GPT'\n", "zoo.gpt") == []
    assert reaches("x = 'zoo.gpt.GPT'\n", "zoo.io") == []  # a shared part may name the families' classes


def test_no_family_or_shared_part_reaches_into_the_application_or_another_family():
    bad = {
        str(path.relative_to(ROOT)): hits
        for package in (*FAMILIES, *SHARED)
        for path in files_of(package)
        if (hits := reaches(path.read_text("utf-8"), package))
    }
    assert not bad, f"library code names the application or another family (pass it in from the application): {bad}"


def test_the_import_graph_has_the_five_families_side_by_side_and_no_cycle():
    edges = graph()

    def targets(package: str, imports: bool) -> list[str]:
        return sorted(to for to, refs in edges[package].items() if any(by_import == imports for _, by_import in refs))

    lines = [
        f"  {p:<14} -> {', '.join(targets(p, True)) or '(torch, lightning, torchmetrics only)'}"
        + (f"   (names only: {', '.join(names)})" if (names := targets(p, False)) else "")
        for p in edges
    ]
    print(f"\nthe application ({', '.join(APPLICATION)}) -> any of:\n" + "\n".join(lines))
    for family in FAMILIES:
        assert set(edges[family]) <= set(SHARED), (family, edges[family])
    # No cycle: the shared parts import no family. trust.py alone names them (its allowlist: a stored config may name
    # any family's class; it imports that fixed list of packages to hold their classes).
    for shared in SHARED:
        assert "application" not in edges[shared], (shared, edges[shared])
        assert not set(targets(shared, True)) & set(FAMILIES), edges[shared]
        families = {ref.split(":")[0] for to, refs in edges[shared].items() if to in FAMILIES for ref, _ in refs}
        assert families <= {"zoo/io/trust.py"}, families


def test_a_users_own_callbacks_and_datamodules_do_not_break_gpt_checkpoint_loading(tmp_path):
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=0",
        "--trainer.logger=false",
    )
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
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=shadow, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().startswith("'")  # three generated characters, decoded by the carried tokenizer


def _built(*args: str):
    from cli import main

    return main(["--trainer.logger=false", *args], run=False)  # classes instantiated, nothing run


@pytest.mark.parametrize(
    "config, callback",
    [
        ("gpt/gpt_tiny.yaml", "LogTextSamples"),
        ("diffusion/ddpm_unet_shapes.yaml", "LogImageSamples"),
        ("diffusion/tiny.yaml", "LogImageSamples"),
    ],
)  # tiny lists its own
def test_the_cli_attaches_the_callbacks_a_module_declares_once(config, callback):
    names = [type(cb).__name__ for cb in _built("--config", str(CONFIGS / config)).trainer.callbacks]
    assert names.count(callback) == 1
    assert names.index(callback) < names.index("MonitoredCheckpoint")  # checkpoints stay last


def test_a_callback_the_config_lists_replaces_the_declared_default():
    c = _built(
        "--config",
        str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
        "--trainer.callbacks+=callbacks.LogTextSamples",
        "--trainer.callbacks.every_n_epochs=3",
    )
    mine = [cb for cb in c.trainer.callbacks if type(cb).__name__ == "LogTextSamples"]
    assert len(mine) == 1 and mine[0].every_n_epochs == 3


# The application wing, top floor first: each may import the floors below it, never one above, and the two
# packages of one floor not each other. The families table (zoo.tracking.families) is at the bottom, so serving,
# the logger, the callbacks and the command line all read the one table.
WING = (("cli",), ("zoo.app",), ("callbacks", "datamodules"), ("zoo.tracking",))


def imported(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every import statement of ``source``, inside functions too (not strings)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.lineno, node.module or ""))
    return found


def floor_of(name: str) -> tuple[int, str] | None:
    for floor, packages in enumerate(WING):
        for package in packages:
            if name == package or name.startswith(package + "."):
                return floor, package
    return None


def wing_breaches(source: str, package: str) -> list[str]:
    """``line: name`` for each import of ``source`` (a file of ``package``) into a floor above it or a peer."""
    floor = floor_of(package)[0]
    return [
        f"{line}: {name}"
        for line, name in sorted(imported(source))
        if (to := floor_of(name)) is not None and to[1] != package and to[0] <= floor
    ]


def test_the_wing_checker_sees_imports_up_and_across():
    src = "def f():\n    from zoo.app.hooks import x\n    import datamodules\nfrom zoo.tracking import y\nimport cli\n"
    assert wing_breaches(src, "callbacks") == ["2: zoo.app.hooks", "3: datamodules", "5: cli"]
    assert wing_breaches(src, "zoo.app") == ["5: cli"]
    assert wing_breaches("x = 'callbacks.LogTextSamples'\nimport zoo.tracking.runs\n", "zoo.tracking") == []


def test_the_application_wing_imports_one_way():
    bad = {
        str(path.relative_to(ROOT)): hits
        for packages in WING
        for package in packages
        for path in files_of(package)
        if (hits := wing_breaches(path.read_text("utf-8"), package))
    }
    assert not bad, f"the application wing imports upward or across (pass the value down instead): {bad}"


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_imported(source: str, names) -> set[str]:
    """The modules of ``names`` that ``source`` imports, inside functions too: ``from package import module`` is
    that module; ``from package import name`` (or ``import package``) is the package's ``__init__``, which imports
    its files."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(names)
            found |= subs if len(subs) == len(node.names) else {node.module, *subs}
    return {m for m in found if m in names and not m.endswith("__main__")}


def test_no_two_files_import_each_other_round_a_circle():
    """Files of the zoo and its application, imports inside functions included: no circle, so each file can be read
    (and tested) after the ones it imports."""
    files = [p for packages in WING for package in packages for p in files_of(package)]
    files += [p for p in sorted((ROOT / "zoo").rglob("*.py")) if p not in files]
    names = {module_name(p): p for p in files}
    edges = {name: modules_imported(path.read_text("utf-8"), names) - {name} for name, path in names.items()}
    state, circles = {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not circles, f"files that import each other round a circle: {circles}"
