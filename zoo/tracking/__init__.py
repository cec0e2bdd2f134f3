"""The bottom floor of the application wing: everything MLflow, serving, and the families table; it imports no other
part of the application (``cli.py``, ``zoo.app``, ``callbacks/``, ``datamodules/`` import it), and no family imports it.

- ``families``: what the application knows of each family, one table (read by serving, the logger, the callbacks and
  the command line);
- ``logger``: ``ZooMLFlowLogger`` (the default logger), the config saver, ending the runs a failure left open;
- ``store``: the lock on a sqlite run store;
- ``runs``: this run's folder, names inside it, its default name, artifacts;
- ``models``: zoo modules as MLflow models (packaging, registry, ``models:/``/``runs:/`` resolution);
- ``downloads``: what a ``models:/``/``runs:/`` URI names, fetched into the model cache, bounded and checked;
- ``manifest``: the sha256 of every file of a logged model, recorded in the tracking store, and the folder checked
  against it;
- ``serving``: the prediction interface of each family (raw inputs in, answers out), its signature and input example;
- ``pyfunc``: the MLflow pyfunc a logged model loads with.

``python -m zoo.tracking log-model <ckpt>`` logs a checkpoint as an MLflow model (``__main__``). MLflow's usage
telemetry is off in every process that imports this package, unless ``ZOO_MLFLOW_TELEMETRY=1`` (``telemetry``).
"""

from zoo.io.checkpoint import build_module
from zoo.tracking.logger import (
    HOST_TAG,
    PID_TAG,
    LogConfigToMLflow,
    TrackingServerUnreachable,
    ZooMLFlowLogger,
    end_open_runs,
    mark_dead_runs_killed,
    nest_under_training_run,
    process_host,
    store_uri,
    wait_for_server,
)
from zoo.tracking.models import (
    is_mlflow_uri,
    load,
    load_model,
    local_weights,
    log_checkpoint_model,
    resolve_checkpoint,
    training_run,
)
from zoo.tracking.runs import (
    default_run_name,
    in_run_dir,
    log_figure,
    log_file,
    log_json_artifact,
    mlflow_loggers,
    new_run_dir,
    run_dir,
)
from zoo.tracking.store import store_lock
from zoo.tracking.telemetry import TELEMETRY_ENV, mlflow_telemetry_off_unless_asked

# Here, not in each module that imports MLflow (in its functions): every zoo process imports this package first.
mlflow_telemetry_off_unless_asked()

__all__ = [
    "TELEMETRY_ENV",
    "HOST_TAG",
    "PID_TAG",
    "LogConfigToMLflow",
    "TrackingServerUnreachable",
    "ZooMLFlowLogger",
    "build_module",
    "default_run_name",
    "end_open_runs",
    "in_run_dir",
    "is_mlflow_uri",
    "load",
    "load_model",
    "local_weights",
    "log_checkpoint_model",
    "log_figure",
    "log_file",
    "log_json_artifact",
    "mark_dead_runs_killed",
    "mlflow_loggers",
    "nest_under_training_run",
    "new_run_dir",
    "process_host",
    "resolve_checkpoint",
    "run_dir",
    "store_lock",
    "store_uri",
    "training_run",
    "wait_for_server",
]
