"""MLflow's usage telemetry is off in the zoo's processes (``cli.py``, ``python -m zoo.tracking``, the logger) and
``ZOO_MLFLOW_TELEMETRY=1`` turns it back on (README "MLflow")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

# What MLflow itself reads as "do not send" (a CI or a test run): removed, so that only the zoo's choice decides.
MLFLOW_OWN_SWITCHES = ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS")
PROBE = (
    "import mlflow.telemetry as t, os, sys; "
    "print(os.environ.get('MLFLOW_DISABLE_TELEMETRY'), t.get_telemetry_client() is not None)"
)


def _telemetry(first_import: str, **env: str) -> str:
    """``MLFLOW_DISABLE_TELEMETRY`` and whether MLflow has a telemetry client, in a fresh process that imports
    ``first_import`` first."""
    clean = {k: v for k, v in os.environ.items() if k not in MLFLOW_OWN_SWITCHES}
    code = f"import {first_import}; {PROBE}"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


SLOW = pytest.mark.slow  # one process start in the default suite; CI's slow suite runs the others


@pytest.mark.parametrize(
    "first_import",
    ["cli", pytest.param("zoo.tracking.__main__", marks=SLOW), pytest.param("mlflow, zoo.tracking", marks=SLOW)],
)
def test_mlflow_telemetry_is_off_in_the_zoos_processes(first_import):
    assert _telemetry(first_import) == "true False"  # mlflow imported before the zoo: its client is dropped too


@pytest.mark.slow  # the default suite's 10 minutes; CI's slow suite runs it
def test_zoo_mlflow_telemetry_1_leaves_mlflows_default():
    assert _telemetry("cli", ZOO_MLFLOW_TELEMETRY="1") == "None True"
    # a user's own MLFLOW_DISABLE_TELEMETRY is kept as set
    assert _telemetry("cli", MLFLOW_DISABLE_TELEMETRY="false") == "false True"
