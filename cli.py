"""The zoo's one command line: ``python cli.py {fit,validate,test,predict} --config <yaml>``.

Any family is chosen by ``class_path`` in YAML (subclass mode for model and data). Every run gets,
unless its config replaces them: the MLflow logger, checkpoints (last + best on the module's
metric), learning-rate, grad-norm and precision monitors, a checkpoint on exception, and a seed.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import os
import re
import signal
import sys
import warnings
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from zoo.layers.checkpoint import WeightsOnlyCheckpointIO, WeightsOnlyLoading, reconcile
from zoo.layers.compat import CheckpointHyperparametersLeftToCaller
from zoo.layers.errors import InputError
from zoo.layers.parallel import num_nodes_from_env
from zoo.layers.weights import is_remote
from zoo.registry import (SUBCOMMANDS_WITH_A_MODEL, is_mlflow_uri, resolve_checkpoint, training_run,
                          with_checkpoint_config)
from zoo.tracking import (LogConfigToMLflow, default_run_name, end_open_runs, mlflow_loggers, nest_under_training_run,
                          new_run_dir)

EXCEPTION_DIR = "runs/on_exception"  # moved into the run's own folder at fit start (evaluations write none)
DEFAULT_CALLBACKS = [
    {"class_path": "callbacks.MonitoredCheckpoint"},
    {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "step"}},
    {"class_path": "callbacks.GradNormMonitor"},
    {"class_path": "callbacks.PrecisionMonitor"},
    {"class_path": "callbacks.CheckpointOnException", "init_args": {"dirpath": EXCEPTION_DIR}},
    {"class_path": "callbacks.WritePredictions"},
    {"class_path": "callbacks.ProgressBar"},
    {"class_path": "callbacks.ModelSummary"},
]

TRAINER_DEFAULTS = {
    "default_root_dir": "runs",
    "logger": {"class_path": "zoo.tracking.ZooMLFlowLogger"},
    # LogConfigToMLflow logs every hyperparameter once, under the config's dotted name; Lightning's own
    # logging would add the module's and data's hparams again under their bare names (and `_instantiator`).
    "enable_autolog_hparams": False,
}


VERBOSE_ENV = "ZOO_VERBOSE"  # set (or pass --verbose) to see the full traceback of a bad-input error


def quiet_uninformative_messages() -> None:
    """Silence, by exact message, what Lightning and torch print on every run that no user can act on."""
    # Lightning announces its resume-from-OnExceptionCheckpoint search on every fit.
    warnings.filterwarnings("ignore", message=r".*\.fit\(ckpt_path=None\)` was called without a model")
    warnings.filterwarnings("ignore", message=r".*\.fit\(ckpt_path=\"last\"\) is set, but there is no last checkpoint")
    # Lightning 2.6's own _pytree helper builds the LeafSpec that torch 2.14 deprecates.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
    noise = (
        "💡 Tip: For seamless cloud logging",  # an advertisement for Lightning's hosted logger
        "Loading `train_dataloader` to estimate number of stepping batches",  # the schedules' horizon
        "Trainer already configured with model summary callbacks",  # callbacks.ModelSummary is the default
    )
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(lambda record: not str(record.msg).startswith(noise))
    # Said when OnExceptionCheckpoint saves a full checkpoint (optimizer state included); reads as if a file
    # were being loaded unsafely.
    logging.getLogger("lightning.pytorch.trainer.connectors.checkpoint_connector").addFilter(
        lambda record: not str(record.msg).startswith("`weights_only` was not set, defaulting to `False`"))


quiet_uninformative_messages()


def stored_config_allowlist():
    """What a checkpoint's or registered model's stored config may name: the zoo's modules and parts, and the
    DataModules of ``datamodules`` (the application's, so named here)."""
    import datamodules
    from zoo.layers.trust import zoo_allowlist

    classes = (getattr(datamodules, name) for name in datamodules.__all__)
    data = [c for c in classes if isinstance(c, type) and issubclass(c, LightningDataModule)]
    return zoo_allowlist(data, env_modules=["datamodules.gym_envs"])


_PARSER_KEY = re.compile(r'Parser key "([^"]+)":\s*(.*)')
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)':\s*(.*)")
_UNKNOWN_OPTION = re.compile(r"Option '([^']+)' is not accepted|Group '([^']+)' does not accept option '([^']+)'")
_UNION_NOISE = ("Does not validate against any of the Union subtypes", "Subtypes:", "Errors:", "Given value",
                "Expected a <class 'NoneType'>")


def _leaves(message: str):
    """(where, reason) for each reason in jsonargparse's nested message: where is the key's full path and the class
    that refused it (``model.init_args.net.init_args.widht (zoo.cnn.ConvNet)``)."""
    path: list[tuple[int, str]] = []  # (indent, key or "class:<path>") of the enclosing blocks
    for raw in message.splitlines():
        indent, line = len(raw) - len(raw.lstrip()), raw.strip().removeprefix("- ")
        while path and path[-1][0] >= indent:
            path.pop()
        if not line or line.startswith(_UNION_NOISE):
            continue
        if m := _PARSER_KEY.match(line) or _CLASS_PATH.match(line):
            path.append((indent, m[1] if m.re is _PARSER_KEY else "class:" + m[1]))
            line = m[2]
        if not line:
            continue
        keys, owner = [], None
        for _, part in path:
            owner = part.removeprefix("class:") if part.startswith("class:") else owner
            keys.append("init_args" if part.startswith("class:") else part)
        if unknown := _UNKNOWN_OPTION.search(line):
            keys += [unknown[2], unknown[3]] if unknown[2] else [unknown[1]]
            line += close_names(owner, unknown[1]) if unknown[1] else ""
        key = ".".join(keys).removesuffix(".init_args")  # the class itself was refused (not found)
        yield (f"{key} ({owner})" if owner and key else key or owner or ""), line


def parser_error_line(message: str) -> str:
    """jsonargparse's error for a bad config value, which nests one block per subclass level (a misspelt
    ``net.init_args.widht`` is 11 lines of union alternatives), as one line: the key's full path, the class that
    refused it, the reason (each alternative's, for a value no type of a union accepts), and the accepted names
    closest to a misspelt one."""
    leaves = list(_leaves(message))
    if not leaves:
        return " ".join(message.split())
    where = leaves[0][0]
    reasons = " or ".join(dict.fromkeys(reason for w, reason in leaves if w == where))
    return f"{where}: {reasons}" if where else reasons


def close_names(class_path: str | None, name: str) -> str:
    """"; did you mean 'width'?" from the init arguments of ``class_path``, which the parser has already imported
    (nothing is imported here)."""
    module, _, attr = (class_path or "").rpartition(".")
    cls = getattr(sys.modules.get(module), attr, None)
    if cls is None:
        return ""
    try:
        names = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    except (TypeError, ValueError):
        return ""
    near = difflib.get_close_matches(name, names, n=3)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


class ZooArgumentParser(LightningArgumentParser):
    """Lightning's parser whose errors are one ``error:`` line and a hint, instead of the full usage (60 lines of
    options) before jsonargparse's nested message; ``--verbose`` keeps jsonargparse's own output."""

    def error(self, message: str, ex: Exception | None = None):
        from jsonargparse._common import debug_mode_active

        if not self.exit_on_error or debug_mode_active() or os.environ.get(VERBOSE_ENV):
            super().error(message, ex)  # a subcommand's parser raises to its parent, which prints
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        line = parser_error_line(message)
        if message.startswith("unrecognized arguments:"):  # a misspelt flag: the closest the parser knows
            flags = [f for f in message.split(":", 1)[1].split() if f.startswith("--")]
            near = [difflib.get_close_matches(f.split("=")[0], list(parser._option_string_actions), n=1) for f in flags]
            line += "".join(f"; did you mean {n[0]}?" for n in near if n)
        sys.stderr.write(f"error: {line}\n"
                         f"(the options: {prog} --help; the whole message: rerun with --verbose)\n")
        sys.exit(2)


class TrainsSomething(Callback):
    """Fails a fit that would train on no batch (a dataset smaller than one batch when the last partial batch is
    dropped, an empty split): Lightning would print "No training batches" as info and exit 0, having trained
    nothing, and a script going on to register or deploy the model could not tell."""

    def on_fit_start(self, trainer, pl_module) -> None:
        # The zoo's modules size their schedules from estimated_stepping_batches, which builds the training loader
        # by now; Lightning's own count is inf until then, and 0 after it skipped a fit with no batches.
        self.on_fit_end(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.num_training_batches == 0:
            raise InputError(
                "fit has no training batches: the training split is empty or smaller than one batch (some DataModules "
                "drop the last partial batch). Give more data, or a smaller --data.init_args.batch_size"
            )


class ZooCLI(CheckpointHyperparametersLeftToCaller, LightningCLI):
    def parse_arguments(self, parser, args) -> None:
        if args is None:  # changed in place: the ranks Lightning launches re-run this command line
            sys.argv[1:] = with_checkpoint_config(sys.argv[1:], stored_config_allowlist())
        elif isinstance(args, list):
            args = with_checkpoint_config(args, stored_config_allowlist())
        super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--test_after_fit", type=bool, default=False,
            help="After fit, test the best checkpoint on the test split, logging into the same run.",
        )
        # A parser default rather than LightningCLI's persistent trainer_defaults callbacks, so that a
        # config's trainer.callbacks replaces the list and --trainer.callbacks+=... appends to it.
        parser.set_defaults({"trainer.callbacks": DEFAULT_CALLBACKS})
        if nodes := num_nodes_from_env():  # torchrun or srun: the node count needs no flag (a config's or flag's wins)
            parser.set_defaults({"trainer.num_nodes": nodes})

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        if self.subcommand == "fit":
            # Lightning accepts these and exits 0 having trained nothing: refused before any run or data.
            for key in ("max_steps", "max_epochs", "limit_train_batches"):
                if cfg.trainer.get(key) == 0:
                    raise InputError(f"trainer.{key}=0 trains nothing: pass --trainer.{key}=<1 or more> (-1 or unset: "
                                     f"no limit), or run validate/test/predict to use a model without training it")
        if cfg.get("ckpt_path") and cfg.get("weights_only") is None:
            # Lightning unpickles a resumed checkpoint fully by default; the zoo never runs code from a file.
            cfg.weights_only = True
        logger = cfg.trainer.get("logger")
        is_zoo_logger = str(getattr(logger, "class_path", "")).endswith("ZooMLFlowLogger")
        if cfg.get("ckpt_path") and is_zoo_logger and self.subcommand in SUBCOMMANDS_WITH_A_MODEL:
            nest_under_training_run(logger.init_args, training_run(str(cfg.ckpt_path)), self.subcommand, str(cfg.ckpt_path))
        if is_mlflow_uri(cfg.get("ckpt_path")):  # models:/<name>/<version>, models:/<name>@<alias>, runs:/<id>/...
            cfg.ckpt_path = resolve_checkpoint(cfg.ckpt_path)
        if cfg.get("ckpt_path") and Path(cfg.ckpt_path).is_dir():
            from zoo.layers.parallel import check_sharded_checkpoint

            if not (Path(cfg.ckpt_path) / ".metadata").is_file():  # what torch.distributed.checkpoint writes first
                raise InputError(f"--ckpt_path {cfg.ckpt_path} is a folder but not a sharded checkpoint (it has no "
                                 f".metadata): pass a checkpoint file (runs/<experiment>/<run>/checkpoints/last.ckpt)")

            check_sharded_checkpoint(cfg.ckpt_path)  # torch unpickles a sharded folder unrestricted: check it first
        if cfg.get("ckpt_path") and Path(cfg.ckpt_path).is_file():  # the config wins, but never over weight shapes
            for line in reconcile(cfg.ckpt_path, cfg.model.as_dict()):
                rank_zero_info(line)
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
                c for c in cfg.trainer.callbacks
                if not str(c.get("class_path", "")).endswith(tuple(dropped))
            ]
        if is_zoo_logger and not logger.init_args.get("run_name"):
            net = cfg.model.init_args.get("net")
            logger.init_args.run_name = default_run_name(
                cfg.model.class_path, getattr(net, "class_path", None), cfg.get("data") and cfg.data.class_path
            )
        accelerator = str(cfg.trainer.get("accelerator", "auto"))
        on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
        if on_cpu and str(cfg.trainer.get("precision")) in ("16-mixed", "16"):
            # fp16 matmuls are an order of magnitude slower than fp32 on CPUs; bf16 is faster.
            warnings.warn("precision 16-mixed on a CPU runs as bf16-mixed", stacklevel=1)
            cfg.trainer.precision = "bf16-mixed"

    def after_instantiate_classes(self) -> None:
        strategy = self.trainer.strategy
        if type(strategy.checkpoint_io) is TorchCheckpointIO:  # --ckpt_path and "best" read weights-only, by load_file
            strategy.checkpoint_io = WeightsOnlyCheckpointIO()
        ckpt = (self.config[self.subcommand] if self.subcommand else self.config).get("ckpt_path")
        if ckpt and (is_remote(ckpt) or Path(ckpt).exists()) and isinstance(self.model, WeightsOnlyLoading):
            self.model.skip_init_weights()  # restored after setup: the checkpoint holds the fine-tuned weights
        # The family's own callbacks (sample logging), which the module names by class path so that zoo/ never
        # imports callbacks/: each unless the trainer has one of its class; before the checkpoints, which run last.
        callbacks = self.trainer.callbacks
        if self.subcommand == "fit":
            callbacks.append(TrainsSomething())
        for path in getattr(self.model, "default_callbacks", ()):
            module, name = path.rsplit(".", 1)
            cls = getattr(importlib.import_module(module), name)
            if not any(isinstance(c, cls) for c in callbacks):
                at = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
                callbacks.insert(at, cls())

    def before_validate(self) -> None:
        # validate/test/predict write no checkpoint, so the checkpoint callback's folder differing from the
        # one stored in the loaded checkpoint (it always does: each run has its own) tells the user nothing.
        warnings.filterwarnings("ignore", message=r"The dirpath has changed from")
        new_run_dir(self.trainer, self.subcommand)  # where predictions and figures go (zoo.tracking.run_dir)

    before_test = before_predict = before_validate

    def before_fit(self) -> None:
        # Lightning resumes fit from the newest OnExceptionCheckpoint or last.ckpt it can find; a folder per
        # run keeps one run's checkpoints from being picked up by the next, unrelated run.
        loggers = mlflow_loggers(self.trainer)
        if loggers and not self.trainer.is_global_zero:
            return  # the checkpoint callbacks take rank 0's folder when they set up
        run_dir = new_run_dir(self.trainer, "run")  # any other logger, or none: a folder of its own all the same
        for cb in self.trainer.callbacks:
            if isinstance(cb, OnExceptionCheckpoint) and cb.dirpath == EXCEPTION_DIR:
                cb.dirpath = str(run_dir / "on_exception")
            # Without a logger Lightning's default is <root>/checkpoints, shared by every such run, and its
            # last.ckpt would be resumed by the next run as if it were this one's.
            if not loggers and isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                cb.dirpath = str(run_dir / "checkpoints")

    def after_fit(self) -> None:
        trainer = self.trainer
        if self.config.fit.test_after_fit:
            ckpt = trainer.checkpoint_callback
            paths = (ckpt.best_model_path, ckpt.last_model_path) if ckpt is not None else None
            trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if paths and paths[0] else None)
            if paths:  # restoring the best checkpoint restores the callback's state as it was then (no last.ckpt yet)
                ckpt.best_model_path, ckpt.last_model_path = paths
        if not trainer.is_global_zero:
            return
        ckpt = trainer.checkpoint_callback
        lines = []
        for lg in mlflow_loggers(trainer):
            uri, experiment = lg.experiment.tracking_uri, lg.experiment.get_experiment(lg.experiment_id).name
            lines += [
                f"MLflow run:  {lg.run_id} (experiment {experiment!r}) at {uri}",
                f"  open it:   mlflow ui --backend-store-uri {uri}"
                if uri.startswith("sqlite")
                else f"  open it:   {uri}/#/experiments/{lg.experiment_id}/runs/{lg.run_id}",
            ]
        if ckpt is not None and (ckpt.best_model_path or ckpt.last_model_path):
            # The MLflow model: the best weights (those the run reports), pickle-free, registered if asked.
            lines += [f"MLflow model: {lg.log_trained_model(ckpt.best_model_path or ckpt.last_model_path)}"
                      for lg in mlflow_loggers(trainer) if getattr(lg, "logs_model", False)]
        if ckpt is not None:
            lines += [f"Best checkpoint: {ckpt.best_model_path or '-'}", f"Last checkpoint: {ckpt.last_model_path or '-'}"]
        print("\n".join(lines))


def main(args: list[str] | None = None, run: bool = True) -> ZooCLI:
    return ZooCLI(
        LightningModule,
        LightningDataModule,
        parser_class=ZooArgumentParser,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=LogConfigToMLflow,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=0,
        auto_configure_optimizers=False,
        args=args,
        run=run,
    )


def bad_input(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain that names a missing input (a file, a refused file, an environment's
    optional package such as Box2D) and its fix, if any."""
    from gymnasium.error import DependencyNotInstalled
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from zoo.layers.weights import CheckpointError
    from zoo.tracking import TrackingServerUnreachable

    while err is not None:
        # MisconfigurationException: Lightning's own one-line refusal of a Trainer setting (max_epochs=-5, devices=0)
        if isinstance(err, (FileNotFoundError, NotADirectoryError, CheckpointError, InputError, DependencyNotInstalled,
                            TrackingServerUnreachable, MisconfigurationException)):
            return err
        # models:/<name>@<alias> or a version that the registry does not have: the message names it
        if getattr(err, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
            return err
        err = err.__cause__ or err.__context__
    return None


def one_line(err: BaseException) -> str:
    """``err``'s message; for one raised in a DataLoader worker, which torch re-raises with the worker's traceback as
    its message, the original message only."""
    text = str(err)
    if "Original Traceback" in text:
        text = text.rstrip().splitlines()[-1].split(": ", 1)[-1]  # "zoo.layers.errors.InputError: <message>"
    return " ".join(text.split()) if "\n" in text else text


def install_hint(err: BaseException) -> str:
    """The zoo's own extra for an environment package gymnasium says is missing (its wheels need no compiler)."""
    from gymnasium.error import DependencyNotInstalled

    if isinstance(err, DependencyNotInstalled):
        return '; or install the zoo\'s rl extra, which has Box2D and MuJoCo wheels: pip install -e ".[rl]"'
    return ""


def run() -> None:
    """``main()`` for a person at a terminal: a missing dataset or file is one line and its fix."""
    if "--verbose" in sys.argv:
        sys.argv.remove("--verbose")
        os.environ[VERBOSE_ENV] = "1"
    try:
        main()
    except SIGTERMException as err:  # Lightning stops at the next step and exits 0; a job script must see the kill
        end_open_runs(err)
        sys.exit(128 + signal.SIGTERM)
    except Exception as err:
        end_open_runs(err)  # Lightning ends a failed run, unless a callback raised on the way out or it failed outside
        cause = bad_input(err)
        if cause is None or os.environ.get(VERBOSE_ENV):
            raise
        print(f"error: {one_line(cause)}{install_hint(cause)}\n(the full traceback: rerun with --verbose or "
              f"{VERBOSE_ENV}=1)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run()
    # Close a DDP/FSDP process group before the interpreter exits: left to exit-time destructors, gloo's
    # threads can abort a finished run ("terminate called without an active exception").
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
