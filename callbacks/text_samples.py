"""Logs a few generations to MLflow at each validation, so a run shows what the model writes as it learns."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch import Callback

from zoo.tracking import mlflow_loggers


class LogTextSamples(Callback):
    """After every ``every_n_epochs``-th validation, continue prompts with ``pl_module.generate``.

    The text goes to each MLflow run as ``samples/step_<global step>.txt`` and is printed. Prompts come
    from here, else from the datamodule's ``prompts``. Every rank generates, the same text from the same
    seed: under FSDP2 each forward gathers the sharded weights from all ranks, so rank 0 alone would wait for
    the others forever. Rank 0 logs.
    """

    def __init__(
        self,
        prompts: list[str] | None = None,
        max_new_tokens: int = 200,
        temperature: float = 0.8,
        top_k: int | None = 50,
        every_n_epochs: int = 1,
        seed: int = 0,
        print_samples: bool = False,
    ) -> None:
        """
        Args:
            prompts: texts to continue; None = the datamodule's ``prompts``.
            max_new_tokens: tokens generated per prompt.
            temperature: sampling temperature (0 = greedy).
            top_k: sample among the k most likely tokens only; None = all.
            every_n_epochs: log after every n-th validation.
            seed: sampling seed, the same at every validation so samples compare across the run.
            print_samples: also print them to the console.
        """
        self.prompts, self.max_new_tokens = prompts, max_new_tokens
        self.temperature, self.top_k, self.every_n_epochs = temperature, top_k, every_n_epochs
        self.seed, self.print_samples = seed, print_samples

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        if getattr(pl_module, "tokenizer", None) is None or not (mlflow_loggers(trainer) or self.print_samples):
            return  # the same on every rank: each builds the configured loggers
        prompts = self.prompts or list(getattr(trainer.datamodule, "prompts", None) or ["\n"])
        outs = pl_module.generate(prompts, self.max_new_tokens, self.temperature, self.top_k, seed=self.seed)
        if not trainer.is_global_zero:
            return
        text = "\n\n".join(f"=== {p!r}\n{p}{o}" for p, o in zip(prompts, outs))
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_text(lg.run_id, text, f"samples/step_{trainer.global_step:07d}.txt")
        if self.print_samples:
            print(f"\n[step {trainer.global_step}]\n{text}\n")
