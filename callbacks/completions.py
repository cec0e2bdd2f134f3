"""Logs the completions a validation scored as an MLflow table, so a run shows what the policy answers as it learns."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch import Callback

from zoo.tracking import mlflow_loggers


class LogCompletions(Callback):
    """After each validation, the module's ``completion_samples`` (rows of prompt, completion, answer, reward:
    ``zoo.gpt.GRPOModule`` keeps a few greedy replies to held-out prompts) go to each MLflow run as the table
    ``completions/step_<global step>.json`` (``MlflowClient.log_table``), and are printed with ``print_samples``.
    Rank 0 logs its own rows."""

    def __init__(self, print_samples: bool = False) -> None:
        """
        Args:
            print_samples: also print the rows to the console.
        """
        self.print_samples = print_samples

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        rows = list(getattr(pl_module, "completion_samples", None) or [])
        if trainer.sanity_checking or not rows or not trainer.is_global_zero:
            return
        table = {key: [row[key] for row in rows] for key in rows[0]}
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_table(lg.run_id, table, f"completions/step_{trainer.global_step:07d}.json")
        if self.print_samples:
            for row in rows:
                print(f"[step {trainer.global_step}] {row}")
