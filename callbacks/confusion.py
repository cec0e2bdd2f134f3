"""Logs a classifier's test confusion matrix to MLflow: a figure and its JSON."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from zoo.tracking import log_figure, log_json_artifact, mlflow_loggers


class LogConfusionMatrix(Callback):
    """After each test, ``test/confusion_matrix.json`` and ``.png`` from the module's ``confusion_matrix`` (a dict
    of the (K, K) counts, rows true class, columns predicted, and the class names), when it has one."""

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        result = getattr(pl_module, "confusion_matrix", None)
        if result is None:
            return
        log_json_artifact(trainer, result, "test/confusion_matrix.json")
        if trainer.is_global_zero and mlflow_loggers(trainer):
            from torchmetrics.utilities.plot import plot_confusion_matrix

            matrix = torch.tensor(result["confusion_matrix"])
            fig, _ = plot_confusion_matrix(matrix, labels=result["class_names"])
            fig.set_size_inches(max(4.0, 0.45 * len(matrix) + 2), max(4.0, 0.45 * len(matrix) + 2))
            log_figure(trainer, fig, "test/confusion_matrix.png")
