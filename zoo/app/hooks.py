"""What ``cli.py``'s LightningCLI hooks do, one named step each: the config checked and completed before anything is
built, the trainer wired once it is, each run's own folder, and what fit reports at its end."""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info

from callbacks import ResumesItsOptimizer, TrainsSomething, WiseFT
from zoo.app.parser import EXCEPTION_DIR
from zoo.app.pretrained import Opened, data_folder, net_from_init_weights
from zoo.app.stored_config import SUBCOMMANDS_WITH_A_MODEL
from zoo.errors import InputError
from zoo.io.checkpoint import WeightsOnlyCheckpointIO, WeightsOnlyLoading, reconcile
from zoo.io.weights import is_remote
from zoo.tracking import (
    default_run_name,
    is_mlflow_uri,
    local_weights,
    mlflow_loggers,
    nest_under_training_run,
    new_run_dir,
    resolve_checkpoint,
    training_run,
)
from zoo.tracking.families import family_of
from zoo.tracking.models import ranked_metrics
from zoo.tracking.report import EVALUATED_TAG, PARENT_TAG, log_report_card


def check_seed(cfg: Any) -> None:
    """``seed_everything``: true, false or a seed numpy takes (Lightning seeds numpy with it, and raises a bare
    ValueError, after the parse, for one outside 0 to 2**32 - 1)."""
    seed = cfg.get("seed_everything")
    if not isinstance(seed, bool) and isinstance(seed, int) and not 0 <= seed <= SEED_MAX:
        raise InputError(
            f"seed_everything={seed} is not a seed numpy takes: pass --seed_everything=<a whole number from 0 to "
            f"{SEED_MAX}>, true for a random one, or false for none"
        )


SEED_MAX = 2**32 - 1


def prepare_config(cfg: Any, subcommand: str | None, stated: Any = None) -> Opened | None:
    """The parsed config (``cfg``, the subcommand's), checked and completed before any class is built; ``stated``:
    what the user's config states of it (``zoo.app.parser``). Returns the ``init_weights`` source as read, for
    ``hand_over`` to give the parts built from the config."""
    if subcommand == "fit":
        refuse_training_nothing(cfg)
    refuse_counts_below_one(cfg)
    prepare_checkpoint(cfg, subcommand)
    tag_parent_model(cfg)
    if opened := net_from_init_weights(cfg, subcommand, family_of, stated):  # init_weights as typed: models:/...
        rank_zero_info(opened.line)
        data_folder(cfg, opened)
    resolve_init_weights(cfg)
    resolve_draft(cfg)
    drop_unusable_callbacks(cfg)
    name_the_run(cfg)
    bf16_on_cpu(cfg)
    return opened


def refuse_training_nothing(cfg: Any) -> None:
    # Lightning accepts these and exits 0 having trained nothing: refused before any run or data.
    for key in ("max_steps", "max_epochs", "limit_train_batches"):
        if cfg.trainer.get(key) == 0:
            raise InputError(
                f"trainer.{key}=0 trains nothing: pass --trainer.{key}=<1 or more> (-1 or unset: "
                f"no limit), or run validate/test/predict to use a model without training it"
            )


def refuse_counts_below_one(cfg: Any) -> None:
    # Lightning accepts these at 0 and fails mid-fit dividing by them (a ZeroDivisionError naming no setting).
    for key in ("accumulate_grad_batches", "check_val_every_n_epoch"):
        value = cfg.trainer.get(key)
        if value is not None and value < 1:
            raise InputError(f"trainer.{key}={value} must be 1 or more: pass --trainer.{key}=<a whole number >= 1>")


def build_trainer(instantiate: Callable[[], Trainer], trainer_cfg: Any) -> Trainer:
    """``instantiate()``, the Trainer, with its constructor's refusal of a setting (``devices='abc'``,
    ``accelerator='foo'``, ``num_nodes=0``: a bare TypeError or ValueError) as one line naming the setting."""
    try:
        return instantiate()
    except (TypeError, ValueError) as err:
        raise InputError(trainer_refusal(err, trainer_cfg)) from err


def trainer_refusal(err: BaseException, trainer_cfg: Any) -> str:
    """``err``'s message after the first Trainer setting it names (its key and the value given), and the fix."""
    message = " ".join(str(err).split())
    settings = inspect.signature(Trainer.__init__).parameters
    named = [w for w in re.findall(r"\w+", message) if w in settings and w != "self"]
    if not named:
        return f"the Trainer refused its settings: {message} (the trainer.* values in the config or flags)"
    key = named[0]
    return (
        f"trainer.{key}={trainer_cfg.get(key)!r}: {message} Pass another --trainer.{key} "
        f"(python cli.py fit --help lists the trainer's options)"
    )


def zoo_logger(cfg: Any) -> Any:
    """The config of the trainer's ``ZooMLFlowLogger``, if that is its logger."""
    logger = cfg.trainer.get("logger")
    return logger if str(getattr(logger, "class_path", "")).endswith("ZooMLFlowLogger") else None


def prepare_checkpoint(cfg: Any, subcommand: str | None) -> None:
    """``--ckpt_path``: read weights-only, its evaluation nested under its training run, a registry URI downloaded,
    a sharded folder checked before torch unpickles it, and the config reconciled with its weight shapes."""
    if not cfg.get("ckpt_path"):
        return
    if cfg.get("weights_only") is None:
        # Lightning unpickles a resumed checkpoint fully by default; the zoo never runs code from a file.
        cfg.weights_only = True
    if (logger := zoo_logger(cfg)) and subcommand in SUBCOMMANDS_WITH_A_MODEL:
        nest_under_training_run(logger.init_args, training_run(str(cfg.ckpt_path)), subcommand, str(cfg.ckpt_path))
    if is_mlflow_uri(cfg.ckpt_path):  # models:/<name>/<version>, models:/<name>@<alias>, runs:/<id>/...
        cfg.ckpt_path = resolve_checkpoint(cfg.ckpt_path)
    path = Path(cfg.ckpt_path)
    if path.is_dir():
        from zoo.train.parallel import check_sharded_checkpoint

        if not (path / ".metadata").is_file():  # what torch.distributed.checkpoint writes first
            raise InputError(
                f"--ckpt_path {cfg.ckpt_path} is a folder but not a sharded checkpoint (it has no "
                f".metadata): pass a checkpoint file (runs/<experiment>/<run>/checkpoints/last.ckpt)"
            )
        check_sharded_checkpoint(cfg.ckpt_path)  # torch unpickles a sharded folder unrestricted: check it first
    if path.is_file() and _model_class_path(cfg):  # the config wins, but never over weight shapes
        for line in reconcile(cfg.ckpt_path, cfg.model.as_dict()):
            rank_zero_info(line)


def _model_class_path(cfg: Any) -> str | None:
    """The model class the config names; None for the checkpoint's own (``zoo.app.stored_config``)."""
    return (cfg.get("model") or {}).get("class_path")


def tag_parent_model(cfg: Any) -> None:
    """The model a fit starts from (``init_weights`` as typed: ``models:/...`` before it is downloaded) as the run's
    ``zoo.parent_model`` tag, which its registered versions carry and the report card follows."""
    init_args = cfg.model.get("init_args") if cfg.get("model") else None
    weights = init_args.get("init_weights") if init_args else None
    logger = zoo_logger(cfg)
    if weights and logger is not None and not cfg.get("ckpt_path"):
        tags = logger.init_args.get("tags") or {}
        logger.init_args.tags = {**tags, PARENT_TAG: str(weights)}


def resolve_init_weights(cfg: Any) -> None:
    """``model.init_args.init_weights`` naming an MLflow model, downloaded: a module reads local files and URLs only.
    Not with a checkpoint, whose weights replace them (the module never reads them then)."""
    init_args = cfg.model.get("init_args") if cfg.get("model") else None
    weights = init_args.get("init_weights") if init_args else None
    if is_mlflow_uri(weights) and not cfg.get("ckpt_path"):
        init_args.init_weights = local_weights(weights)


def resolve_draft(cfg: Any) -> None:
    """``model.init_args.generation.draft`` (speculative decoding's draft model) naming an MLflow model: a local
    checkpoint, as ``--ckpt_path`` gets one; the module reads it weights-only and checks what it names."""
    init_args = cfg.model.get("init_args") if cfg.get("model") else None
    generation = init_args.get("generation") if init_args else None
    draft = generation.get("draft") if hasattr(generation, "get") else None
    if is_mlflow_uri(draft):
        generation.draft = resolve_checkpoint(draft)


def drop_unusable_callbacks(cfg: Any) -> None:
    # Lightning raises on a LearningRateMonitor without a logger and on a progress bar callback with
    # enable_progress_bar=false; a run that switches either off loses that default callback instead.
    dropped = []
    if cfg.trainer.get("logger") in (False, None):
        dropped.append("LearningRateMonitor")
    if cfg.trainer.get("enable_progress_bar") is False:
        dropped.append("ProgressBar")
    if cfg.trainer.get("enable_model_summary") is False:
        dropped.append("ModelSummary")
    if dropped and cfg.trainer.get("callbacks"):
        cfg.trainer.callbacks = [
            c for c in cfg.trainer.callbacks if not str(c.get("class_path", "")).endswith(tuple(dropped))
        ]


def name_the_run(cfg: Any) -> None:
    if not _model_class_path(cfg):  # the checkpoint's own model (zoo.app.stored_config): the logger names it
        return
    if (logger := zoo_logger(cfg)) and not logger.init_args.get("run_name"):
        net = cfg.model.init_args.get("net")
        logger.init_args.run_name = default_run_name(
            cfg.model.class_path, getattr(net, "class_path", None), cfg.get("data") and cfg.data.class_path
        )


def bf16_on_cpu(cfg: Any) -> None:
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and str(cfg.trainer.get("precision")) in ("16-mixed", "16"):
        # fp16 matmuls are an order of magnitude slower than fp32 on CPUs; bf16 is faster.
        warnings.warn("precision 16-mixed on a CPU runs as bf16-mixed", stacklevel=1)
        cfg.trainer.precision = "bf16-mixed"


def wire(trainer: Trainer, model: LightningModule, subcommand: str | None, ckpt_path: str | None) -> None:
    """Once built: checkpoints read weights-only, a checkpoint's weights not loaded over by ``init_weights``, a fit
    that trains nothing refused, and the family's own callbacks (``zoo.tracking.families``)."""
    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:  # --ckpt_path and "best" read weights-only, by load_file
        strategy.checkpoint_io = WeightsOnlyCheckpointIO()
    if ckpt_path and (is_remote(ckpt_path) or Path(ckpt_path).exists()) and isinstance(model, WeightsOnlyLoading):
        model.skip_init_weights()  # restored after setup: the checkpoint holds the fine-tuned weights
    if subcommand == "fit":
        trainer.callbacks += [TrainsSomething(), ResumesItsOptimizer()]
    add_family_callbacks(trainer.callbacks, family_of(model).callbacks)


def add_family_callbacks(callbacks: list, paths: tuple[str, ...]) -> None:
    """Each class in ``paths`` (the application's own, from the families table) unless ``callbacks`` has one of
    its class; before the checkpoints, which run last."""
    for path in paths:
        module, name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        if not any(isinstance(c, cls) for c in callbacks):
            at = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
            callbacks.insert(at, cls())


def evaluation_folder(trainer: Trainer, subcommand: str) -> None:
    # validate/test/predict write no checkpoint, so the checkpoint callback's folder differing from the
    # one stored in the loaded checkpoint (it always does: each run has its own) tells the user nothing.
    warnings.filterwarnings("ignore", message=r"The dirpath has changed from")
    new_run_dir(trainer, subcommand)  # where predictions and figures go (zoo.tracking.run_dir)


def fit_folders(trainer: Trainer) -> None:
    # Lightning resumes fit from the newest OnExceptionCheckpoint or last.ckpt it can find; a folder per
    # run keeps one run's checkpoints from being picked up by the next, unrelated run.
    loggers = mlflow_loggers(trainer)
    if loggers and not trainer.is_global_zero:
        return  # the checkpoint callbacks take rank 0's folder when they set up
    run_dir = new_run_dir(trainer, "run")  # any other logger, or none: a folder of its own all the same
    for cb in trainer.callbacks:
        if isinstance(cb, OnExceptionCheckpoint) and cb.dirpath == EXCEPTION_DIR:
            cb.dirpath = str(run_dir / "on_exception")
        # Without a logger Lightning's default is <root>/checkpoints, shared by every such run, and its
        # last.ckpt would be resumed by the next run as if it were this one's.
        if not loggers and isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
            cb.dirpath = str(run_dir / "checkpoints")


def after_fit(trainer: Trainer, model: LightningModule, datamodule: LightningDataModule | None, test: bool) -> None:
    """A WiSE-FT sweep, ``--test_after_fit``, then (rank 0) where the run, its MLflow model and its checkpoints are.
    The run's model is WiSE-FT's chosen weights when it ran, else the best checkpoint."""
    ckpt = trainer.checkpoint_callback
    table = metrics_table(trainer.callback_metrics, getattr(ckpt, "monitor", None)) or [  # fit's, before a test's
        f"Final metrics: none logged (every {trainer.log_every_n_steps} steps, --trainer.log_every_n_steps; this fit "
        f"took {trainer.global_step})"
    ]
    wise = next((cb for cb in trainer.callbacks if isinstance(cb, WiseFT)), None)
    chosen = wise.sweep(trainer, model, datamodule) if wise is not None and trainer.state.status == "finished" else None
    if test:
        paths = (ckpt.best_model_path, ckpt.last_model_path) if ckpt is not None else None
        trainer.test(model, datamodule=datamodule, ckpt_path=chosen or ("best" if paths and paths[0] else None))
        if paths:  # restoring the best checkpoint restores the callback's state as it was then (no last.ckpt yet)
            ckpt.best_model_path, ckpt.last_model_path = paths
    if trainer.is_global_zero:
        print("\n".join(table + wise_table(wise) + fit_report(trainer, chosen) + stage_report(trainer)))


def after_evaluation(trainer: Trainer) -> None:
    """(rank 0) The run tagged with the data it scored, then the report card of the stage this evaluation is nested
    under, when its lineage has stages."""
    if not trainer.is_global_zero:
        return
    data = evaluated_data(trainer.datamodule, trainer.state.fn)
    for lg in mlflow_loggers(trainer):
        lg.experiment.set_tag(lg.run_id, EVALUATED_TAG, data)
    if lines := stage_report(trainer):
        print("\n".join(lines))


def evaluated_data(datamodule: LightningDataModule | None, fn: str) -> str:
    """What an evaluation scored: the file the data module names for ``fn`` (``scored_file``), else its class."""
    scored = getattr(datamodule, "scored_file", None)
    return (scored(fn) if callable(scored) else None) or type(datamodule).__name__


def stage_report(trainer: Trainer) -> list[str]:
    """The report card of the run's lineage (``zoo.tracking.report``), printed and logged as ``report.md``."""
    current = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    for lg in mlflow_loggers(trainer):
        text = log_report_card(lg.experiment, lg.run_id, current)
        if text is not None:
            return ["Report card (report.md):", text]
    return []


def wise_table(wise: WiseFT | None) -> list[str]:
    if wise is None or wise.table is None:
        return []
    names = list(wise.table)
    rows = ["WiSE-FT:   " + "  ".join(f"{n:>12}" for n in names)]
    for i, alpha in enumerate(wise.table["alpha"]):
        mark = "  <- chosen" if alpha == wise.chosen_alpha else ""
        rows.append("           " + "  ".join(f"{wise.table[n][i]:>12.6g}" for n in names) + mark)
    return rows


def metrics_table(metrics: dict[str, Any], monitor: str | None = None) -> list[str]:
    """The last logged values a run is judged by, in a short table: ``monitor`` first, then the evaluation metrics,
    then the training loss (not gradient norms or learning rates), printed whatever the progress bar setting."""
    keys = ranked_metrics(metrics, monitor)
    if not keys:
        return []
    width = max(map(len, keys))
    return ["Final metrics:"] + [f"  {k:<{width}}  {float(metrics[k]):.6g}" for k in keys]


def best_line(ckpt: Checkpoint) -> str:
    """The best checkpoint, or why there is none: the last checkpoint is then the model."""
    if ckpt.best_model_path:
        return f"Best checkpoint: {ckpt.best_model_path}"
    if getattr(ckpt, "monitor", None) is None:
        return "No validation: the last checkpoint is the model"
    return f"No best checkpoint ({ckpt.monitor} was never logged: no validation ran): the last checkpoint is the model"


def fit_report(trainer: Trainer, model_path: str | None = None) -> list[str]:
    """Where the run and its checkpoints are, and its MLflow model: ``model_path`` (WiSE-FT's), else the best."""
    ckpt, lines = trainer.checkpoint_callback, []
    for lg in mlflow_loggers(trainer):
        uri, experiment = lg.experiment.tracking_uri, lg.experiment.get_experiment(lg.experiment_id).name
        lines += [
            f"MLflow run:  {lg.run_id} (experiment {experiment!r}) at {uri}",
            # The run's own page: MLflow's home opens on its GenAI view, not on training runs.
            f"  open it:   mlflow ui --backend-store-uri {uri}, then "
            f"http://127.0.0.1:5000/#/experiments/{lg.experiment_id}/runs/{lg.run_id}"
            if uri.startswith("sqlite")
            else f"  open it:   {uri}/#/experiments/{lg.experiment_id}/runs/{lg.run_id}",
        ]
    model_path = model_path or (ckpt.best_model_path or ckpt.last_model_path if ckpt is not None else None)
    if model_path:
        # The MLflow model: the best weights (those the run reports) or WiSE-FT's, pickle-free, registered if asked; a
        # LoRA checkpoint without its base takes it from this run's own init_weights.
        base = getattr(trainer.lightning_module, "hparams", {}).get("init_weights")
        lines += [
            f"MLflow model: {lg.log_trained_model(model_path, ckpt.monitor, base)}"
            for lg in mlflow_loggers(trainer)
            if getattr(lg, "logs_model", False)
        ]
    if ckpt is not None:
        lines += [best_line(ckpt), f"Last checkpoint: {ckpt.last_model_path or '-'}"]
    if model_path and ckpt is not None and model_path not in (ckpt.best_model_path, ckpt.last_model_path):
        lines.append(f"WiSE-FT checkpoint: {model_path}")
    return lines
