"""MLflow's usage telemetry, off in the zoo's processes unless ``ZOO_MLFLOW_TELEMETRY=1`` asks for it.

MLflow 3 sends usage records (what was called, a random installation id) to its telemetry host from every process
that imports it, unless ``MLFLOW_DISABLE_TELEMETRY`` or ``DO_NOT_TRACK`` says no. A training run should open no
connection that nothing on screen mentions, so the zoo says no by default; ``ZOO_MLFLOW_TELEMETRY=1`` leaves MLflow's
own default, and a ``MLFLOW_DISABLE_TELEMETRY`` the user set is kept as set. The environment is changed, so the
processes a run starts (DataLoader workers, ranks, ``mlflow server``) inherit the choice.
"""

from __future__ import annotations

import os
import sys

TELEMETRY_ENV = "ZOO_MLFLOW_TELEMETRY"  # "1": let MLflow send its usage telemetry (its own default)


def mlflow_telemetry_off_unless_asked() -> None:
    """Switch MLflow's telemetry off, before MLflow is imported (it starts its client on import), unless
    ``ZOO_MLFLOW_TELEMETRY=1``; when MLflow was imported first, its client is set again from the environment."""
    if os.environ.get(TELEMETRY_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if "mlflow.telemetry" in sys.modules:
        from mlflow.telemetry import set_telemetry_client

        set_telemetry_client()  # re-reads MLFLOW_DISABLE_TELEMETRY: no client when it is off
