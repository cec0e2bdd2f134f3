"""The README's two commands, CI and the lock agree: what a newcomer runs is what CI runs and what is locked."""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

README = (ROOT / "README.md").read_text()


def first_screen_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_ci_runs_the_readme_commands_as_written_the_first_on_a_base_install():
    setup, tests = first_screen_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"SETUP_COMMAND='{setup}'" in ci and f"TEST_COMMAND='{tests}'" in ci
    # both in the script's own shell (command 1 activates the venv command 2 installs into), command 1 first
    run_setup, run_tests = ci.index('eval "$SETUP_COMMAND"'), ci.index('eval "$TEST_COMMAND"')
    assert run_setup < ci.index('pip install -q -c constraints.txt -e ".[test]"') < run_tests  # extras after it
    assert "-m venv" in setup and "-e ." in setup and "[" not in setup.split("-e .")[1]  # no extras: a base install
    assert "mktemp -d" in ci and "git ls-files" in ci and "check_isolation.py" in ci  # a fresh copy, isolated
    assert "python -m pytest -m slow" in ci  # then the long runs: serving and DDP/FSDP2 of every family
    for command in (setup, tests):
        assert "pip install -c constraints.txt" in command, command


def test_what_the_readme_commands_leave_in_the_checkout_is_ignored_by_git():
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    for made in (".venv/", "mlflow.db", "mlflow.db.lock", "runs/", "data/"):
        assert made in ignored, f"{made} (made by the README's first command) is not in .gitignore"


def test_lock_pins_every_declared_requirement_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [Requirement(r) for r in project["dependencies"]]
    declared += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    pins = locked()
    for req in declared:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is declared in pyproject.toml but not locked: run `bash .ci/lock`"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}: run `bash .ci/lock`"
        )
