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


def absolute(name: str, here: str) -> str:
    """``name`` as Python resolves it in a file of package ``here``: one leading dot is ``here``, each further dot
    climbs one package (``..x`` in ``zoo.gpt.formats`` is ``zoo.gpt.x``)."""
    level = len(name) - len(name.lstrip("."))
    if not level:
        return name
    packages = here.split(".") if here else []
    if level > len(packages):
        raise ValueError(f"{name!r} climbs above {here!r}")
    return ".".join([*packages[: len(packages) - level + 1], *([name[level:]] if name[level:] else [])])


def imports(source: str, here: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, module, names taken from it)`` for every import of ``source``, a file of package ``here``, inside
    functions too: ``import a.b`` is ``("a.b", ())``, ``from a import b, c`` is ``("a", ("b", "c"))``, a relative
    import (``from ..a import b``, ``from . import b``) is resolved against ``here``, and ``importlib.import_module``
    or ``__import__`` of a literal name is that module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = absolute("." * node.level + (node.module or ""), here)
            found.append((node.lineno, module, tuple(a.name for a in node.names)))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, absolute(node.args[0].value, here), ()))
    return found


def dotted(source: str) -> list[tuple[int, str]]:
    """``(line, string)`` for every string of ``source`` that is a whole dotted path (a class path, not a sentence)."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value)
    ]


def named(source: str, here: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` for every import of ``source`` (a file of package ``here``), by statement, relative or by
    ``importlib``; ``from a import b`` names ``a.b``, so ``from zoo import app`` is seen as ``zoo.app``."""
    found = []
    for line, module, taken in imports(source, here):
        found += [(line, f"{module}.{name}") for name in taken] or [(line, module)]
    return found


def references(source: str, here: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` for every import in ``source`` (inside functions, relative, by ``importlib`` too) and
    every string that is a dotted path: a class path a caller would import is an import in disguise."""
    return sorted(set(named(source, here) + dotted(source)))


def owner(name: str) -> str | None:
    """The package of the graph that ``name`` lies in: a family, a shared part, "application", or None (outside)."""
    for package in (*FAMILIES, *SHARED):
        if name == package or name.startswith(package + "."):
            return package
    if any(name == a or name.startswith(a + ".") for a in APPLICATION):
        return "application"
    return None


def reaches(source: str, package: str, here: str | None = None) -> list[str]:
    """``line: name`` for each reference of ``source`` (a file of ``package``, lying in package ``here``, by default
    ``package`` itself) into the application or another family."""
    return [
        f"{line}: {name}"
        for line, name in references(source, here or package)
        if (to := owner(name)) not in (None, package, *SHARED) and (to == "application" or package in FAMILIES)
    ]


def package_of(path) -> str:
    """The package a file lies in, which its relative imports start from."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1])


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
            for line, name in references(source, package_of(path)):
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
        "3: callbacks.X",
        "4: datamodules.text",
        "5: cli",
        "6: callbacks.LogTextSamples",
        "7: zoo.tracking.local_weights",
        "8: zoo.cnn.ClassifierModule",
    ]
    assert reaches("from zoo.io import tokenizers\nimport callbacks_extra\nx = 'zoo.gpt.GPT'\n", "zoo.gpt") == []
    assert reaches("x = 'zoo.gpt.GPT'\n", "zoo.io") == []  # a shared part may name the families' classes


def test_the_checker_sees_relative_imports_importlib_and_names_taken_from_a_package():
    """The ways round the statement ``import zoo.app`` a reader might miss: each is planted and each is seen."""
    src = (
        "from ...app import hooks\n"  # relative, from zoo/gpt/formats: zoo.app.hooks
        "from ... import tracking\n"  # relative, naming the package: zoo.tracking
        "from zoo import app\n"  # absolute, the package taken as a name: zoo.app
        "def f():\n    importlib.import_module('zoo.cnn.module')\n"  # by importlib, inside a function
        "    __import__('callbacks')\n"
        "    importlib.import_module('...io.tokenizers', __package__)\n"  # relative by importlib: a shared part
        "from .. import gpt\nfrom .hf import load\n"  # its own family
    )
    assert reaches(src, "zoo.gpt", here="zoo.gpt.formats") == [
        "1: zoo.app.hooks",
        "2: zoo.tracking",
        "3: zoo.app",
        "5: zoo.cnn.module",
        "6: callbacks",
    ]
    with pytest.raises(ValueError, match="climbs above"):
        imports("from .... import x\n", "zoo.gpt.formats")


def test_no_family_or_shared_part_reaches_into_the_application_or_another_family():
    bad = {
        str(path.relative_to(ROOT)): hits
        for package in (*FAMILIES, *SHARED)
        for path in files_of(package)
        if (hits := reaches(path.read_text("utf-8"), package, package_of(path)))
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


def imported(source: str, here: str) -> list[tuple[int, str]]:
    """``(line, module)`` for every import of ``source`` (a file of package ``here``), inside functions, relative and by
    ``importlib`` too (not strings)."""
    return named(source, here)


def floor_of(name: str) -> tuple[int, str] | None:
    for floor, packages in enumerate(WING):
        for package in packages:
            if name == package or name.startswith(package + "."):
                return floor, package
    return None


def wing_breaches(source: str, package: str, here: str | None = None) -> list[str]:
    """``line: name`` for each import of ``source`` (a file of ``package``, lying in package ``here``, by default
    ``package`` itself) into a floor above it or a peer."""
    floor = floor_of(package)[0]
    return [
        f"{line}: {name}"
        for line, name in sorted(imported(source, here or package))
        if (to := floor_of(name)) is not None and to[1] != package and to[0] <= floor
    ]


def test_the_wing_checker_sees_imports_up_and_across():
    src = "def f():\n    from zoo.app.hooks import x\n    import datamodules\nfrom zoo.tracking import y\nimport cli\n"
    assert wing_breaches(src, "callbacks") == ["2: zoo.app.hooks.x", "3: datamodules", "5: cli"]
    assert wing_breaches(src, "zoo.app") == ["5: cli"]
    assert wing_breaches("x = 'callbacks.LogTextSamples'\nimport zoo.tracking.runs\n", "zoo.tracking") == []
    up = (
        "from ..app import hooks\n"  # relative
        "from .. import app\n"  # relative, the package as a name
        "from zoo import app\n"  # absolute, the package as a name
        "importlib.import_module('zoo.app.sizes')\n"  # by importlib
        "__import__('cli')\n"
        "from . import runs\n"  # its own floor
    )
    assert wing_breaches(up, "zoo.tracking") == [
        "1: zoo.app.hooks",
        "2: zoo.app",
        "3: zoo.app",
        "4: zoo.app.sizes",
        "5: cli",
    ]


def test_the_application_wing_imports_one_way():
    bad = {
        str(path.relative_to(ROOT)): hits
        for packages in WING
        for package in packages
        for path in files_of(package)
        if (hits := wing_breaches(path.read_text("utf-8"), package, package_of(path)))
    }
    assert not bad, f"the application wing imports upward or across (pass the value down instead): {bad}"


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_imported(source: str, names, here: str = "") -> set[str]:
    """The modules of ``names`` that ``source`` (a file of package ``here``) imports, inside functions, relative and by
    ``importlib`` too: ``from package import module`` is that module; ``from package import name`` (or ``import
    package``) is the package's ``__init__``, which imports its files."""
    found = set()
    for _, module, taken in imports(source, here):
        subs = {f"{module}.{n}" for n in taken} & set(names)
        found |= subs if taken and len(subs) == len(taken) else {module, *subs}
    return {m for m in found if m in names and not m.endswith("__main__")}


def test_no_two_files_import_each_other_round_a_circle():
    """Files of the zoo and its application, imports inside functions included: no circle, so each file can be read
    (and tested) after the ones it imports."""
    files = [p for packages in WING for package in packages for p in files_of(package)]
    files += [p for p in sorted((ROOT / "zoo").rglob("*.py")) if p not in files]
    names = {module_name(p): p for p in files}
    edges = {n: modules_imported(p.read_text("utf-8"), names, package_of(p)) - {n} for n, p in names.items()}
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


# zoo/gpt in three rooms (issue 54): the model (zoo/gpt/*.py), what comes from outside (zoo/gpt/formats: it loads
# into and exports the model, so the model's loaders may call it) and post-training (zoo/gpt/tune: built on both).
# Neither the model nor the formats imports tune: a converter has no business with an objective, and a new method
# lands in tune without touching them. The facade (zoo/gpt/__init__.py and __main__.py) gathers the rooms for users;
# no room imports it (it imports tune).
ROOMS = {"model": {"model", "formats"}, "formats": {"model", "formats"}, "tune": {"model", "formats", "tune"}}
FACADE = ("zoo.gpt", "zoo.gpt.__main__")


def room_of(module: str) -> str | None:
    if module in FACADE:
        return "facade"
    for room in ("tune", "formats"):
        if module == f"zoo.gpt.{room}" or module.startswith(f"zoo.gpt.{room}."):
            return room
    return "model" if module.startswith("zoo.gpt.") else None


def facade_exports() -> dict[str, str]:
    """name -> the module ``zoo/gpt/__init__.py`` takes it from (``DPOModule`` -> ``zoo.gpt.tune.dpo``)."""
    tree = ast.parse((ROOT / "zoo/gpt/__init__.py").read_text("utf-8"))
    return {a.asname or a.name: n.module for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}


def gpt_module_of(name: str, modules, exports) -> str | None:
    """The module of zoo.gpt that the dotted ``name`` lies in (its longest prefix among ``modules``); a name taken
    from the facade (``zoo.gpt.DPOModule``) lies where the facade takes it from."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in modules:
            return exports.get(parts[i], prefix) if prefix == "zoo.gpt" and i < len(parts) else prefix
    return None


def room_breaches(source: str, module: str, modules, exports) -> list[str]:
    """``line: name (room)`` for each import of ``source`` (the file of ``module``), relative and by ``importlib``
    too, and each class-path string, into a room of zoo.gpt that ``module``'s room may not reach."""
    here = module if (ROOT / module.replace(".", "/")).is_dir() else module.rpartition(".")[0]
    allowed = ROOMS[room_of(module)]
    return [
        f"{line}: {name} ({to})"
        for line, name in sorted(set(named(source, here) + dotted(source)))
        if (target := gpt_module_of(name, modules, exports)) and (to := room_of(target)) not in allowed
    ]


def gpt_modules() -> dict[str, object]:
    return {module_name(p): p for p in files_of("zoo.gpt")}


def test_the_room_checker_sees_tune_imported_every_way():
    modules, exports = gpt_modules(), facade_exports()
    planted = (
        "import zoo.gpt.tune.grpo\n"  # absolute
        "from zoo.gpt.tune.rewards import ExactMatch\n"
        "from zoo.gpt import tune\n"  # the room taken as a name
        "from zoo.gpt import DPOModule\n"  # through the facade
        "import zoo.gpt\n"  # the facade itself
        "def f():\n    from .tune import dpo\n"  # relative, inside a function
        "    from . import tune\n"
        "    importlib.import_module('zoo.gpt.tune.rollout')\n"  # by importlib
        "    __import__('zoo.gpt.tune')\n"
        "    importlib.import_module('.tune.losses', __package__)\n"
        "REWARD = 'zoo.gpt.tune.rewards.ExactMatch'\n"  # a class path: an import in disguise
    )
    hits = room_breaches(planted, "zoo.gpt.gpt", modules, exports)
    assert [h.split(":")[0] for h in hits] == [str(n) for n in (1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12)], hits
    assert hits[3] == "4: zoo.gpt.DPOModule (tune)" and hits[4] == "5: zoo.gpt (facade)"
    formats = "from ..tune import losses\nfrom ...gpt.tune import grpo\nimportlib.import_module('zoo.gpt.tune')\n"
    assert len(room_breaches(formats, "zoo.gpt.formats.hf", modules, exports)) == 3  # formats never import tune
    assert len(room_breaches(formats, "zoo.gpt.formats", modules, exports)) == 3  # nor does its __init__
    fine = (
        "from zoo.gpt.gpt import GPT\nfrom ..gpt import GPT\nfrom .hf import load\nfrom ..formats import llama\n"
        "from zoo.gpt import GPT\nnet = 'zoo.gpt.GPT'\nimport torch\nfrom zoo.io import tokenizers\n"
    )
    assert room_breaches(fine, "zoo.gpt.formats.phi3", modules, exports) == []
    assert room_breaches(fine.replace("from .hf", "from .formats.hf"), "zoo.gpt.module", modules, exports) == []
    tune = "from ..formats.hf import load\nfrom ..module import CausalLMModule\nfrom .losses import dpo_loss\n"
    assert room_breaches(tune, "zoo.gpt.tune.dpo", modules, exports) == []


def test_the_gpt_model_and_formats_never_import_tune():
    modules, exports = gpt_modules(), facade_exports()
    assert {room_of(m) for m in modules} == {"model", "formats", "tune", "facade"}
    bad = {
        str(path.relative_to(ROOT)): hits
        for module, path in modules.items()
        if room_of(module) != "facade" and (hits := room_breaches(path.read_text("utf-8"), module, modules, exports))
    }
    assert not bad, f"zoo.gpt's rooms import the wrong way (the model and formats never import tune): {bad}"
