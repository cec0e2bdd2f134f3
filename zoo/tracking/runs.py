"""This run's files and names: the run's folder (checkpoints, predictions, samples), names inside it, the run's
default name, and artifacts logged to every MLflow logger of a trainer."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger

from zoo.io.files import check_output_name

# A run's pipeline stage (``--trainer.logger.init_args.stage``) and the model it started from (zoo.tracking.report).
STAGE_TAG = "zoo.pipeline_stage"
PARENT_TAG = "zoo.parent_model"


def default_run_name(model_class: str, net_class: str | None, data_class: str | None) -> str:
    """``<family>-<model>-<data>-<YYYYmmdd-HHMMSS>-<4 hex>``: readable, and unique across runs.

    MLflow draws its own names from Python's ``random``, which ``seed_everything`` has just seeded, so every
    seeded run got the same name; ``uuid4`` reads ``os.urandom``, which no seed touches.
    """
    parts = model_class.split(".")
    family = parts[1] if parts[0] == "zoo" and len(parts) > 2 else parts[-1].lower()
    model = (net_class or model_class).rsplit(".", 1)[-1].lower()
    data = (data_class or "nodata").rsplit(".", 1)[-1].removesuffix("DataModule").lower() or "data"
    return f"{family}-{model}-{data}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def mlflow_loggers(trainer: Trainer) -> list[MLFlowLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)]


def log_json_artifact(trainer: Trainer, obj: dict, artifact_file: str) -> None:
    """Log ``obj`` as a JSON artifact to every MLflow logger of the trainer (rank 0 only)."""
    if not trainer.is_global_zero:
        return
    for lg in mlflow_loggers(trainer):
        lg.experiment.log_dict(lg.run_id, obj, artifact_file)


def log_figure(trainer: Trainer, figure, artifact_file: str) -> None:
    """Log a matplotlib figure as an image artifact to every MLflow logger of the trainer (rank 0), then close it."""
    import matplotlib.pyplot as plt

    if trainer.is_global_zero:
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_figure(lg.run_id, figure, artifact_file)
    plt.close(figure)


RUN_DIR_ENV = "ZOO_RUN_DIR"  # the folder of a run without an MLflow logger, passed to the ranks Lightning launches


def run_dir(trainer: Trainer) -> Path:
    """The folder of this run's files (checkpoints, predictions, samples): ``<root>/<experiment id>/<run id>``
    with an MLflow logger (rank 0), else the folder rank 0 chose and passed on in $ZOO_RUN_DIR (``cli.py``)."""
    loggers = mlflow_loggers(trainer)
    if loggers and trainer.is_global_zero:
        return Path(trainer.default_root_dir, loggers[0].experiment_id, loggers[0].run_id)
    return Path(os.environ.get(RUN_DIR_ENV) or Path(trainer.default_root_dir, "run-unnamed"))


def in_run_dir(trainer: Trainer, name: str | Path, key: str) -> Path:
    """The place called ``name`` inside this run's folder (``run_dir``); refuses a name that leaves it."""
    return run_dir(trainer) / os.path.normpath(check_output_name(key, str(name)))


def new_run_dir(trainer: Trainer, stage: str) -> Path:
    """Rank 0: this run's folder, a fresh ``<root>/<stage>-<time>-<hex>`` without an MLflow logger, passed on to
    the ranks Lightning launches later through $ZOO_RUN_DIR. Other ranks: the folder rank 0 passed on."""
    if not trainer.is_global_zero:
        return run_dir(trainer)
    if mlflow_loggers(trainer):
        path = run_dir(trainer)
    else:
        path = Path(trainer.default_root_dir, f"{stage}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}")
    os.environ[RUN_DIR_ENV] = str(path)
    return path


def log_file(trainer: Trainer, path: str | Path, artifact_path: str | None = None) -> None:
    """Log a file this run wrote as an artifact of every MLflow run of the trainer (rank 0 only)."""
    if trainer.is_global_zero:
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_artifact(lg.run_id, str(path), artifact_path)


def net_class_name(pl_module: LightningModule) -> str:
    net = getattr(pl_module, "net", pl_module)
    return f"{type(net).__module__}.{type(net).__qualname__}"
