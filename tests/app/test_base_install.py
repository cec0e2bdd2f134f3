"""The base install (``pip install -c constraints.txt -e .``, no extras) runs everything that needs no extra: with
every extra's packages hidden, each family fits through cli.py (its model logged to MLflow too), and each feature that
needs an extra refuses in one ``error:`` line naming the feature and the extra's install line.

One process hides them all (a ``sitecustomize`` that makes their imports fail, as on a machine without them) and runs
the fits and the refusals in turn: the imports are paid once. Hiding all at once hides each: a family that fits with
none of them fits without any one, and each refusal names its own extra."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib

import pytest
from conftest import CONFIGS, ROOT
from packaging.requirements import Requirement

# What the blocker hides: every installed distribution that pyproject.toml's dependencies do not bring (the
# extras' packages and everything they pull in), by its metadata and by its top-level modules. A venv's own tools stay.
KEPT = {"pip", "setuptools", "wheel"}
BLOCKER = """import importlib.metadata as md, re, sys

HIDDEN_DISTS, HIDDEN_MODULES = {dists!r}, {modules!r}
for name in HIDDEN_MODULES:
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError, as where it is not installed
_discover = md.Distribution.discover.__func__


def discover(cls, **kwargs):  # importlib.metadata (availability checks such as torchmetrics') does not see them
    for dist in _discover(cls, **kwargs):
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() not in HIDDEN_DISTS:
            yield dist


md.Distribution.discover = classmethod(discover)
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_install() -> set[str]:
    """The distributions ``pip install -e .`` installs: pyproject's dependencies and theirs, markers evaluated."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [r for r in map(Requirement, project["dependencies"]) if not r.marker or r.marker.evaluate({"extra": ""})]
    found, seen = set(), set()
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if (name, *sorted(req.extras)) in seen:
            continue
        seen.add((name, *sorted(req.extras)))  # jsonargparse, and again as jsonargparse[signatures]
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a dependency of a dependency this platform does not take
        found.add(name)
        for line in dist.requires or []:
            sub = Requirement(line)
            if not sub.marker or any(sub.marker.evaluate({"extra": e}) for e in req.extras or [""]):
                todo.append(sub)
    return found


def hidden() -> tuple[list[str], list[str]]:
    """What this venv has beyond a base install: its distributions and the top-level modules only they provide."""
    keep = base_install() | KEPT | {"zoo"}
    dists = {canonical(d.metadata["Name"]) for d in importlib.metadata.distributions()} - keep
    providers = importlib.metadata.packages_distributions()
    modules = {m for m, ds in providers.items() if m.isidentifier() and all(canonical(d) in dists for d in ds)}
    assert {"lm_eval", "peft", "diffusers", "timm", "transformers", "trl", "torch_fidelity"} <= modules
    return sorted(dists), sorted(modules)


SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
# Two fits log their model to MLflow (its requirements are read from the zoo's code, the same for every family); the
# others skip the logger, for time.
QUIET = [*SHORT, "--trainer.logger=false"]
FITS = {
    "cnn": [str(CONFIGS / "cnn" / "convnet_digits.yaml"), *SHORT],
    "gpt": [str(CONFIGS / "gpt" / "gpt_tiny.yaml"), *SHORT],
    "diffusion": [str(CONFIGS / "diffusion" / "tiny.yaml"), *QUIET],
    "clip": [str(CONFIGS / "clip" / "tiny.yaml"), *QUIET],
    "rl": [str(CONFIGS / "rl" / "ppo_tiny.yaml"), "--model.init_args.total_env_steps=256", "--trainer.logger=false"],
}
INSTALL = 'pip install -c constraints.txt -e ".[{}]"'
# Each feature's command line and the line it must refuse with (the feature, what it needs, the install line).
REFUSALS = {
    "adapt": (
        ["fit", "--config", FITS["cnn"][0], "--model.init_args.adapt.lora.r=4"],
        "error: adapt.lora (LoRA adapters) needs PEFT, which is not installed: " + INSTALL.format("adapt"),
    ),
    "latent": (
        ["fit", "--config", str(CONFIGS / "diffusion" / "latent_tiny.yaml")],
        "error: the config's diffusers.AutoencoderKL needs diffusers, which is not installed: "
        + INSTALL.format("latent"),
    ),
    "timm": (
        ["fit", "--config", str(CONFIGS / "cnn" / "timm_vit_shapes.yaml")],
        "error: zoo.cnn.TimmNet needs timm, which is not installed: " + INSTALL.format("timm"),
    ),
    "fid": (
        [
            "fit",
            "--config",
            FITS["diffusion"][0],
            "--trainer.callbacks+=callbacks.FrechetInceptionDistance",
            "--trainer.callbacks.weights=inception.pth",
        ],
        "error: callbacks.FrechetInceptionDistance (its Inception-v3) needs torch-fidelity, which is not installed: "
        + INSTALL.format("fid"),
    ),
    "rl": (
        ["fit", "--config", str(CONFIGS / "rl" / "ppo_lunarlander.yaml")],
        "; or install the zoo's rl extra, which has Box2D and MuJoCo wheels: " + INSTALL.format("rl"),
    ),
}
LM_EVAL = "error: python -m zoo.gpt lm-eval needs lm-eval, which is not installed: " + INSTALL.format("eval")

# In the hidden process: each fit, then each refusal through cli.run (what a terminal runs), then lm-eval's command
# and the stored-config allowlist asked for a class of lm-eval's module; a marker line after each.
SCRIPT = """
import json, sys, time
from cli import main, run

fits, refusals, hidden = (json.loads(a) for a in sys.argv[1:4])
for family, args in fits.items():
    t = time.perf_counter()
    c = main(["fit", "--config", *args])
    print(f"TIME {family} {time.perf_counter() - t:.1f}", file=sys.stderr, flush=True)
    assert c.trainer.global_step > 0 and (c.trainer.logger is None or c.trainer.logger.run_id), family
    print(f"FITTED {family}", flush=True)
for feature, argv in refusals.items():
    print(f"REFUSAL {feature}", file=sys.stderr, flush=True)
    sys.argv = ["cli.py", *argv]
    try:
        run()
    except SystemExit as err:
        print(f"EXIT {feature} {err.code}", flush=True)
print("REFUSAL lm-eval", file=sys.stderr, flush=True)
from zoo.gpt.__main__ import main as gpt_main
sys.argv = ["python -m zoo.gpt", "lm-eval", "missing.ckpt", "--tasks", "arc_easy"]
try:
    gpt_main()
except SystemExit as err:
    print(err.code, file=sys.stderr, flush=True)
from zoo.errors import MissingExtra
from zoo.io.trust import zoo_allowlist
try:
    zoo_allowlist().modules.get("zoo.gpt.lm_eval.ZooLM")
except MissingExtra as err:
    print(f"ALLOWLIST {err}", flush=True)
print("MODULES " + " ".join(sorted(m for m in sys.modules if m.split(".")[0] in hidden and sys.modules[m])))
"""


# ~40 s of one process that fits every family: the slow pass (the README test command's 10 minutes); the mutants'
# base family runs it. CI's README command 1 fits the main job in a real base install.
@pytest.mark.slow
def test_without_any_extra_every_family_fits_and_each_feature_refuses_in_one_line(tmp_path):
    import json

    hide = tmp_path / "hide"
    hide.mkdir()
    dists, modules = hidden()
    (hide / "sitecustomize.py").write_text(BLOCKER.format(dists=dists, modules=modules))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])}
    env.pop("ZOO_VERBOSE", None)
    argv = [json.dumps(FITS), json.dumps({k: v[0] for k, v in REFUSALS.items()}), json.dumps(modules)]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout.splitlines()
    for family in FITS:
        assert f"FITTED {family}" in out, (family, proc.stderr[-3000:])
    # Each refusal: exit status 1 (2: the parser's), one error line (its own), no traceback.
    sections = proc.stderr.split("REFUSAL ")[1:]
    said = {s.split("\n", 1)[0]: s.split("\n", 1)[1] for s in sections}
    for feature, (_, expected) in REFUSALS.items():
        assert f"EXIT {feature} 1" in out or f"EXIT {feature} 2" in out, (feature, said.get(feature))
        errors = [line for line in said[feature].splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in said[feature], said[feature]
        assert errors[0] == expected if expected.startswith("error:") else errors[0].endswith(expected), errors[0]
    assert said["lm-eval"].strip() == LM_EVAL
    allowlist = next(line for line in out if line.startswith("ALLOWLIST "))
    assert allowlist == "ALLOWLIST lm-eval tasks (zoo.gpt.lm_eval, python -m zoo.gpt lm-eval) needs lm-eval, " + (
        "which is not installed: " + INSTALL.format("eval")
    )
    assert out[-1] == "MODULES ", out[-1]  # nothing of a hidden package was imported, by any path
