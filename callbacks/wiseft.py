"""WiSE-FT after a fine-tune (Wortsman et al. 2022, ``zoo.adapt.wise``): the line between the weights the fit started
from and those it ended with, scored on the target task and on a source task, logged, and the chosen point kept.

When training starts (after ``init_weights`` loaded, before the first step) the callback copies to the CPU what can
change: the trainable parameters and the buffers (a locked tower or a LoRA base costs nothing). Checkpoints carry the
copy, so a resumed fit knows its start. After fit ``cli.py`` calls ``sweep`` (``zoo.app.hooks.after_fit``): for each
alpha the module's own validation (``trainer.validate``, loggers muted) scores the fit's data (the target) and the
``source`` DataModule's held-out split (for CLIP: zero-shot accuracy on the task it was pretrained for). To MLflow go
``wiseft/table.json`` (alpha and both scores), ``wiseft/scores.png``, the param ``wiseft/alpha``, and the chosen
point's metrics at the last step, source ones as ``val/source/...`` (the registered model's metrics are a run's last
values). The chosen weights stay in the module and are written beside the run's checkpoints as
``wiseft-alpha=<alpha>.ckpt``: the checkpoint the run then tests and registers.
"""

from __future__ import annotations

import contextlib
import time
from argparse import ArgumentError
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from zoo.adapt.wise import Choice, check_same, choose_alpha, interpolated, lora_factors_kept
from zoo.errors import InputError
from zoo.tracking import log_figure, mlflow_loggers
from zoo.tracking.families import family_of


class WiseFT(Callback):
    """Interpolates the start and the fine-tuned weights after fit, scores each point, keeps the chosen one."""

    def __init__(
        self,
        alphas: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0),
        metric: str | None = None,
        source: dict[str, Any] | None = None,
        source_metric: str | None = None,
        choose: Choice = "target",
        keep_source: float = 0.9,
        mode: Literal["max", "min"] | None = None,
    ) -> None:
        """
        Args:
            alphas: the points theta(alpha) = (1 - alpha) theta_start + alpha theta_fine-tuned to score, each in
                [0, 1]; 0 (the start) and 1 (the fine-tuned weights) always among them.
            metric: the validation metric the target task is scored by (CLIP: val/zeroshot_acc); None: the one the
                family's best checkpoint is chosen by (``zoo.tracking.families``).
            source: the source task: a DataModule's ``{class_path, init_args}`` (in Python, a DataModule) whose
                held-out split the module validates on as on its own data (CLIP: the captions it was pretrained on,
                for zero-shot accuracy); None: the target alone.
            source_metric: the validation metric of the source task; None: ``metric``.
            choose: target: the best target score among the points keeping ``keep_source`` of the start's source
                score; mean: the best mean of both scores (the paper's); without a source, the best target score.
            keep_source: the share of the start's source score a point must keep (choose=target).
            mode: max or min, whether higher or lower scores are better; None: the family's mode for its own metric,
                else max.
        """
        alphas = tuple(sorted(float(a) for a in alphas))
        if not all(0.0 <= a <= 1.0 for a in alphas) or 0.0 not in alphas or 1.0 not in alphas:
            raise InputError(
                f"callbacks.WiseFT: alphas {list(alphas)} must lie in [0, 1] and hold 0 (the start) and 1 (the "
                f"fine-tuned weights), which every point is compared with: pass e.g. alphas=[0, 0.5, 1]"
            )
        if not 0.0 < keep_source <= 1.0:
            raise InputError(f"callbacks.WiseFT: keep_source={keep_source} must be a share in (0, 1]")
        self.source = source if isinstance(source, LightningDataModule | None) else datamodule_from(source)
        self.alphas, self.metric, self.source_metric = alphas, metric, source_metric
        self.choose, self.keep_source, self.mode = choose, keep_source, mode
        self._start: dict[str, Tensor] | None = None  # on the CPU
        self.table: dict[str, list[float]] | None = None  # the sweep's scores, a column each
        self.chosen_alpha: float | None = None
        self.chosen_path: str | None = None  # the checkpoint of the chosen weights

    # -- the start --------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._start is not None:  # restored with the checkpoint this fit resumes from
            return
        if trainer.global_step > 0:
            raise InputError(
                f"callbacks.WiseFT: this fit resumes at step {trainer.global_step} from a checkpoint written without "
                f"WiseFT, so the weights the fine-tune started from are unknown: fit from the start with WiseFT"
            )
        live = changing_tensors(pl_module)
        sharded = [n for n, t in live.items() if hasattr(t, "to_local")]
        if sharded:
            raise InputError(f"callbacks.WiseFT does not run on sharded weights (FSDP2: {sharded[0]}): use DDP")
        self._start = {n: t.detach().to("cpu", copy=True) for n, t in live.items()}
        lora_factors_kept(self._start)  # refuse adapters it cannot interpolate now, not after the fit

    def state_dict(self) -> dict:
        return {"start": self._start} if self._start is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._start = state_dict.get("start")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # The first validation of the fit names a metric the sweep could not read, not the end of a long fit.
        metric = self._metric(pl_module)
        if trainer.state.fn == "fit" and not trainer.sanity_checking and metric not in trainer.callback_metrics:
            raise InputError(
                f"callbacks.WiseFT: metric {metric!r} is not among the validation metrics "
                f"({', '.join(sorted(k for k in trainer.callback_metrics if k.startswith('val/')))}): pass "
                f"init_args.metric=<one of them>"
            )

    def _metric(self, pl_module: LightningModule) -> str:
        metric = self.metric or family_of(pl_module).monitor
        if metric is None:
            raise InputError("callbacks.WiseFT: this module's family names no metric: pass init_args.metric")
        return metric

    def _mode(self, pl_module: LightningModule) -> str:
        family = family_of(pl_module)
        return self.mode or (family.monitor_mode if self._metric(pl_module) == family.monitor else "max")

    # -- after fit ----------------------------------------------------------------------------------------------

    def sweep(self, trainer: Trainer, pl_module: LightningModule, datamodule: LightningDataModule | None) -> str | None:
        """Score every alpha, log the table and plot, keep the chosen weights in ``pl_module`` and write them as a
        checkpoint beside the run's; returns its path (None without a checkpoint folder)."""
        if self._start is None:
            return None  # fit never trained (it failed before its first step)
        live = changing_tensors(pl_module)
        check_same(self._start, live)
        tuned = {n: t.detach().to("cpu", copy=True) for n, t in live.items()}
        metric = self._metric(pl_module)
        source_metric = self.source_metric or metric
        rows = [self._score(trainer, pl_module, datamodule, tuned, a, metric, source_metric) for a in self.alphas]
        target = [r[0][metric] for r in rows]
        source = [r[1][source_metric] for r in rows] if self.source is not None else None
        k = choose_alpha(self.alphas, target, source, self.choose, self.keep_source, self._mode(pl_module))
        self.chosen_alpha = self.alphas[k]
        self.table = {"alpha": list(self.alphas), metric: target}
        if source is not None:
            self.table[source_name(source_metric)] = source
        self._assign(pl_module, tuned, self.chosen_alpha)
        del tuned
        self._log(trainer, rows[k])
        self.chosen_path = self._save(trainer)
        return self.chosen_path

    def _score(self, trainer, pl_module, datamodule, tuned, alpha, metric, source_metric) -> tuple[dict, dict]:
        """(target metrics, source metrics) of theta(alpha). The source first: validating sets the module up with
        its data (CLIP takes the data's tokenizer), so the fit's own data is the last it sees."""
        self._assign(pl_module, tuned, alpha)
        source = validate(trainer, pl_module, self.source) if self.source is not None else {}
        if self.source is not None and source_metric not in source:
            raise InputError(
                f"callbacks.WiseFT: source_metric {source_metric!r} is not among the source task's validation "
                f"metrics ({', '.join(sorted(source))}): pass init_args.source_metric=<one of them>"
            )
        target = validate(trainer, pl_module, datamodule)
        rank_zero_info(f"WiSE-FT alpha={alpha:g}: {metric}={target[metric]:.4f}" + _source_line(source, source_metric))
        return target, source

    def _assign(self, pl_module: LightningModule, tuned: dict[str, Tensor], alpha: float) -> None:
        live = changing_tensors(pl_module)
        with torch.no_grad():
            for name, t in interpolated(self._start, tuned, alpha):
                live[name].copy_(t)

    def _log(self, trainer: Trainer, chosen: tuple[dict, dict]) -> None:
        if not trainer.is_global_zero or not mlflow_loggers(trainer):
            return
        from mlflow.entities import Metric

        target, source = chosen
        scores = {**target, **{source_name(k): v for k, v in source.items()}}
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, trainer.global_step) for k, v in scores.items()]
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_table(lg.run_id, self.table, "wiseft/table.json")
            lg.experiment.log_param(lg.run_id, "wiseft/alpha", self.chosen_alpha)
            # Synchronously: the fit's logger has closed its queue, and registering reads these next.
            lg.experiment.log_batch(lg.run_id, metrics=metrics)
        log_figure(trainer, plot(self.table, self.chosen_alpha), "wiseft/scores.png")

    def _save(self, trainer: Trainer) -> str | None:
        ckpt = trainer.checkpoint_callback
        folder = getattr(ckpt, "dirpath", None)
        if not folder:
            return None
        path = str(Path(folder) / f"wiseft-alpha={self.chosen_alpha:g}.ckpt")
        trainer.save_checkpoint(path, weights_only=True)  # a model to use, not a state to resume
        return path


def datamodule_from(config: dict[str, Any]) -> LightningDataModule:
    """The DataModule ``config`` names, built by a parser of its own. Typed as a DataModule, LightningCLI's parser
    would build it, and record the run's own ``data`` config as its hyperparameters: a CaptionDataModule reads its
    sizes from them, so the source task would have been the target's held-out split."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "source", required=True)
    try:
        return parser.instantiate(parser.parse_object({"source": config})).source
    except (ArgumentError, ValueError, TypeError) as err:
        lines = [line.strip() for line in str(err).splitlines()]
        why = next((lines[i + 1] for i, line in enumerate(lines[:-1]) if "Problem with given" in line), lines[-1])
        raise InputError(f"callbacks.WiseFT: source {config.get('class_path')!r} cannot be built: {why}") from err


def changing_tensors(module: torch.nn.Module) -> dict[str, Tensor]:
    """The module's state-dict tensors a fit can change, by their checkpoint names: trainable parameters, buffers."""
    buffers = {id(b) for b in module.buffers()}
    state = module.state_dict(keep_vars=True)
    return {n: t for n, t in state.items() if isinstance(t, Tensor) and (t.requires_grad or id(t) in buffers)}


def source_name(metric: str) -> str:
    """``val/zeroshot_acc`` scored on the source task: ``val/source/zeroshot_acc``."""
    stage, _, rest = metric.partition("/")
    return f"{stage}/source/{rest}" if rest else f"source/{metric}"


def validate(trainer: Trainer, module: LightningModule, datamodule: LightningDataModule | None) -> dict[str, float]:
    """The module's validation metrics on ``datamodule``, nothing logged (a sweep's points are not the run's curve)."""
    with _muted(trainer):
        results = trainer.validate(module, datamodule=datamodule, verbose=False)
    return {k: float(v) for k, v in (results[0] if results else {}).items()}


@contextlib.contextmanager
def _muted(trainer: Trainer):
    loggers = trainer.loggers
    trainer.loggers = []
    try:
        yield
    finally:
        trainer.loggers = loggers


def _source_line(source: dict, metric: str) -> str:
    return f", source {metric}={source[metric]:.4f}" if source else ""


def plot(table: dict[str, list[float]], chosen: float):
    """Each score against alpha, the chosen alpha marked: a matplotlib figure (no pyplot state)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0, 3.5), layout="constrained")
    ax = fig.subplots()
    for name, values in table.items():
        if name != "alpha":
            ax.plot(table["alpha"], values, marker="o", label=name)
    ax.axvline(chosen, color="grey", linestyle="--", label=f"chosen alpha={chosen:g}")
    ax.set_xlabel("alpha (0: start, 1: fine-tuned)")
    ax.set_ylabel("score")
    ax.set_title("WiSE-FT")
    ax.legend(fontsize="small")
    return fig
