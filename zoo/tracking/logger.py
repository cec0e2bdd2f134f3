"""MLflow tracking for every run: the logger the CLI gives by default and the config saver.

MLflow 3.17 refuses its old ``./mlruns`` file store, and Lightning's ``MLFlowLogger`` defaults to
it, so the zoo's logger defaults to MLflow's embedded store ``sqlite:///mlflow.db`` (artifacts in
``./mlruns``), or to ``MLFLOW_TRACKING_URI`` when set.
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from zoo.tracking.families import family_of
from zoo.tracking.runs import STAGE_TAG, mlflow_loggers, net_class_name
from zoo.tracking.store import DEFAULT_TRACKING_URI, check_store_folder, known_store, store_lock

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# MLflow retries an unreachable server with exponential backoff for minutes by default; a run that
# cannot reach its server should say so in seconds, before training starts.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per downloaded model in every log


class TrackingServerUnreachable(ConnectionError):
    """The configured MLflow tracking server did not answer."""


def check_reachable(tracking_uri: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the URI, when an http(s) tracking server cannot be reached."""
    url = urlparse(tracking_uri)
    if url.scheme not in ("http", "https"):
        return
    import requests

    health = f"{tracking_uri.rstrip('/')}/health"
    try:
        requests.get(health, timeout=timeout).raise_for_status()
    except requests.RequestException as err:
        raise TrackingServerUnreachable(
            f"MLflow tracking server {tracking_uri} is unreachable ({type(err).__name__}). Start it "
            f"(mlflow server --host {url.hostname} --port {url.port or 80}), fix MLFLOW_TRACKING_URI or "
            f"trainer.logger.init_args.tracking_uri, or unset them to log to {DEFAULT_TRACKING_URI}."
        ) from err


class ZooMLFlowLogger(MLFlowLogger):
    """``MLFlowLogger`` with the zoo's defaults: embedded store, async metrics, best checkpoint logged."""

    def __init__(
        self,
        experiment_name: str = "zoo",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        log_model: Literal[True, False, "all"] = True,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool = False,
        check_server: bool = True,
        registered_model_name: str | None = None,
        stage: str | None = None,
    ) -> None:
        """
        Args:
            experiment_name: MLflow experiment the run goes to.
            run_name: MLflow run name; None: cli.py names it <family>-<model>-<data>-<time>-<4 hex>.
            tracking_uri: where runs go; None means $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db.
            tags: extra run tags (the zoo adds family and model class itself).
            log_model: True logs the checkpoints (best and last) as artifacts and the best as an MLflow model
                (``runs:/<id>/model``) at the end of fit.
            prefix: prefix for every metric key.
            artifact_location: artifact root of a newly created experiment.
            run_id: resume logging into this existing run.
            synchronous: False logs metrics in a background thread (~30 ms a call synchronously here).
            check_server: check an http(s) server answers before training starts.
            registered_model_name: register the MLflow model logged at the end of fit under this name.
            stage: this run's stage (``base``, ``sft``, ``dpo``, ...): tagged ``zoo.pipeline_stage`` on the run and the
                versions it registers; the run then prints and logs the report card of its lineage
                (``zoo.tracking.report``).
        """
        tracking_uri = store_uri(tracking_uri)
        check_store_folder(tracking_uri)
        if check_server:
            check_reachable(tracking_uri)
        # MLflow's client opens the store, creating or migrating its schema, right here
        with store_lock(tracking_uri), known_store(tracking_uri):
            super().__init__(
                experiment_name=experiment_name,
                run_name=run_name,
                tracking_uri=tracking_uri,
                # Where the run's process lives, so that a later start can tell a killed run from a live one.
                tags={
                    **(tags or {}),
                    **({STAGE_TAG: stage} if stage else {}),
                    PID_TAG: str(os.getpid()),
                    HOST_TAG: process_host(),
                },
                log_model=log_model,
                prefix=prefix,
                artifact_location=artifact_location,
                run_id=run_id,
                synchronous=synchronous,
            )
        self.tracking_uri, self.experiment_name = tracking_uri, experiment_name
        self.checkpoint_dir: str | None = None  # where the checkpoints this run logs are, for the warning below
        self.registered_model_name, self.logs_model = registered_model_name, bool(log_model)
        self.stage = stage
        self.opened = False  # whether the run (and its experiment, if new) was created, under the store's lock
        self.saved_by = None  # the checkpoint callback whose checkpoints the run logs

    def log_trained_model(self, ckpt_path: str, monitor: str | None = None, init_weights: str | None = None) -> str:
        """Log ``ckpt_path``'s module as this run's MLflow model (``zoo.tracking.models``) with the run's metrics
        (``monitor`` first), registered if asked; says where. ``init_weights``: the run's own, the base of a LoRA
        checkpoint that left it out."""
        from zoo.tracking.models import log_checkpoint_model

        return log_checkpoint_model(
            ckpt_path,
            self.experiment,
            self.run_id,
            self.registered_model_name,
            monitor=monitor,
            init_weights=init_weights,
        )

    @property
    @rank_zero_experiment
    def experiment(self) -> MlflowClient:
        if self.opened:
            return super().experiment
        from mlflow.tracking import MlflowClient

        mark_dead_runs_killed(MlflowClient(self.tracking_uri))
        with store_lock(self.tracking_uri):  # two runs that both find no experiment would both create it
            client = super().experiment
        self.opened = True  # before experiment_id, which reads this property
        if EXPERIMENT_KIND not in client.get_experiment(self.experiment_id).tags:
            # MLflow's UI opens an experiment of no kind on its GenAI (traces) view; these are training runs.
            client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND, "custom_model_development")
        _open_runs.add(self)
        _end_open_runs_at_exit()
        return client

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        self.checkpoint_dir, self.saved_by = checkpoint_callback.dirpath, checkpoint_callback
        super().after_save_checkpoint(checkpoint_callback)

    def log_sharded_checkpoints(self) -> None:
        """Log the run's best and last checkpoints that are sharded folders (FSDP2), each consolidated into one file
        where Lightning logs a checkpoint file (``last/last.ckpt``): Lightning logs files only, and passes folders
        over in silence."""
        from zoo.train.parallel import consolidate

        for folder in dict.fromkeys(p for p in (self.saved_by.best_model_path, self.saved_by.last_model_path) if p):
            if Path(folder).is_dir():
                with tempfile.TemporaryDirectory() as tmp:
                    file = consolidate(folder, Path(tmp, Path(folder).name))
                    self.experiment.log_artifact(self.run_id, str(file), Path(folder).stem)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        self.end(status, sys.exc_info()[1])

    def end(self, status: str, error: BaseException | None = None) -> None:
        """End the run: ``finalize`` with the exception it ends with (None when it succeeds)."""
        from mlflow.exceptions import MlflowException

        _open_runs.discard(self)
        if status == "failed" and stopped_from_outside(error):
            # Lightning finalizes every way a run stops early as "failed": SIGTERM (its handler raises
            # SIGTERMException) and Ctrl-C were stopped from outside, which MLflow calls KILLED.
            status = "KILLED"
        try:
            # set_terminated, inside, drains the async queue of this run before closing it
            # (MlflowClient.set_terminated -> store.shut_down_async_logging); a separate
            # mlflow.flush_async_logging() would only add its 0.5 s poll.
            if self.logs_model and self.saved_by is not None and status == "success":  # a failed run's may be partial
                self.log_sharded_checkpoints()
                self.saved_by = None  # logged: a test after fit finalizes again, with nothing new to upload
            super().finalize(status)
        except (MlflowException, OSError) as err:
            # Training is over and its checkpoints are on local disk: report, do not crash the run.
            where = f" Local checkpoints are in {self.checkpoint_dir}." if self.checkpoint_dir else ""
            rank_zero_warn(
                f"MLflow at {self.tracking_uri} failed while closing run {self.run_id}: "
                f"{str(err).splitlines()[0][:300]}. Metrics or checkpoint artifacts may be missing from "
                f"the run.{where}"
            )


# The runs this process opened and has not ended. Lightning ends a failed run only after every callback's
# on_exception, so a callback that raises there (a checkpoint on a full disk) left the run RUNNING.
_open_runs: weakref.WeakSet[ZooMLFlowLogger] = weakref.WeakSet()


def stopped_from_outside(error: BaseException | None) -> bool:
    """Whether ``error``, or an exception it was raised while handling, is Ctrl-C or SIGTERM (MLflow's KILLED)."""
    while error is not None:
        if isinstance(error, (SIGTERMException, KeyboardInterrupt)):
            return True
        error = error.__cause__ or error.__context__
    return False


def end_open_runs(error: BaseException | None) -> list[str]:
    """End every run this process opened and Lightning did not finalize, as it ends a failed one: FAILED, or
    KILLED when ``error`` comes from Ctrl-C or SIGTERM. Returns their ids. ``cli.run`` calls it when a command
    fails, and an exit hook when the process leaves with runs still open."""
    ended = []
    for logger in list(_open_runs):
        ended.append(logger.run_id)
        logger.end("failed", error)
    return ended


@functools.cache  # one hook per process, installed when its first run opens
def _end_open_runs_at_exit() -> None:
    # Registered after MLflow's own exit hooks, so it runs before them (atexit runs last in, first out): the
    # store and its async logging are still there. sys.last_value is the exception that ended the process, if any.
    atexit.register(lambda: end_open_runs(getattr(sys, "last_value", None)) if _open_runs else None)


PID_TAG, HOST_TAG = "zoo.pid", "zoo.host"
EXPERIMENT_KIND = "mlflow.experimentKind"  # the UI's view of an experiment: "custom_model_development" is training


def mark_dead_runs_killed(client: MlflowClient) -> list[str]:
    """End as KILLED the runs still RUNNING whose process, on this host, is gone (kill -9, the OOM killer, a
    power loss: no handler ran); returns their ids. A process on another host cannot be checked, so its runs
    stay; a pid the system has since given to another process keeps its run RUNNING (the safe side)."""
    from mlflow.exceptions import MlflowException

    host, killed = process_host(), []
    try:
        experiments = [e.experiment_id for e in client.search_experiments()]
        where = f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'"
        for run in client.search_runs(experiments, where, max_results=1000) if experiments else []:
            pid = run.data.tags.get(PID_TAG, "")
            if pid.isdigit() and not _process_alive(int(pid)):
                client.set_terminated(run.info.run_id, "KILLED")
                killed.append(run.info.run_id)
    except MlflowException as err:  # housekeeping of other runs: never the reason this one fails
        rank_zero_warn(f"Could not check {client.tracking_uri} for killed runs: {str(err).splitlines()[0][:300]}")
    return killed


def process_host() -> str:
    """Where this process's pid means something: the host name, and on Linux its pid namespace. Containers
    sharing the host's name (``--network host``) but not its process table must not judge each other's runs."""
    try:
        return f"{socket.gethostname()}/{os.readlink('/proc/self/ns/pid')}"  # e.g. "node1/pid:[4026531836]"
    except OSError:  # no /proc (macOS, Windows)
        return socket.gethostname()


def _process_alive(pid: int) -> bool:
    if os.name == "nt":  # Windows' os.kill terminates the process for any signal but the console events
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True
    return True


def store_uri(tracking_uri: str | None = None) -> str:
    """The store a logger given ``tracking_uri`` writes to: it, else $MLFLOW_TRACKING_URI, else ./mlflow.db."""
    tracking_uri = tracking_uri or os.getenv("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if tracking_uri == DEFAULT_TRACKING_URI:
        # MLflow caches one store per URI string for the life of the process, so a relative path
        # would keep pointing at the first working directory it was opened from.
        tracking_uri = f"sqlite:///{Path('mlflow.db').resolve()}"
    return tracking_uri


def nest_under_training_run(logger_args: Any, parent_run_id: str | None, stage: str, source: str) -> bool:
    """Make an evaluation's logger (its ``init_args``) open a child run of the training run ``parent_run_id``.

    A child rather than the training run itself: validate's metrics at step 0 would otherwise join the
    training curves, two predicts would overwrite each other's files, and the finished training run is not
    reopened. MLflow nests a run under the run named by its ``mlflow.parentRunId`` tag, within one experiment,
    so the child goes to the parent's experiment. Returns whether the parent was found in the logger's store.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if parent_run_id is None or logger_args.get("run_id"):
        return False
    uri = store_uri(logger_args.get("tracking_uri"))
    with known_store(uri):
        client = MlflowClient(uri)
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException:  # the checkpoint's run lives in another store
        return False
    logger_args.experiment_name = client.get_experiment(parent.info.experiment_id).name
    logger_args.tags = {
        **(logger_args.get("tags") or {}),
        "mlflow.parentRunId": parent_run_id,
        "zoo.checkpoint": source,
    }
    if not logger_args.get("run_name"):
        logger_args.run_name = f"{parent.info.run_name}-{stage}-{time.strftime('%H%M%S')}"
    return True


class LogConfigToMLflow(SaveConfigCallback):
    """Logs the resolved config as ``config.yaml`` to the MLflow run, plus family and model tags.

    The stock saver writes into ``trainer.log_dir``, which ``MLFlowLogger`` does not have.
    """

    def __init__(
        self,
        parser,
        config,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = False,
    ) -> None:
        super().__init__(parser, config, config_filename, overwrite, multifile, save_to_log_dir=False)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        text = self.parser.dump(self.config, skip_none=False)
        text = _with_stored_parts(text, pl_module, trainer.datamodule)
        tags = {
            "zoo.family": family_of(pl_module).name,
            "zoo.module": type(pl_module).__qualname__,
            "zoo.model": net_class_name(pl_module),
            "zoo.stage": getattr(stage, "value", stage),  # "fit", not "TrainerFn.FITTING"
        }
        for lg in mlflow_loggers(trainer):
            client, run_id = lg.experiment, lg.run_id
            client.log_text(run_id, text, self.config_filename)
            for k, v in tags.items():
                client.set_tag(run_id, k, v)
            flat = _flatten(yaml.safe_load(text))
            lg.log_hyperparams({k: v for k, v in flat.items() if not k.startswith("trainer.callbacks")})


def _with_stored_parts(text: str, module: LightningModule, datamodule: Any) -> str:
    """The config with the model and data a ``--ckpt_path`` carried (built by ``zoo.io.build``, so not in the parsed
    config) filled in from what they record, as a parsed config would show them."""
    config = yaml.safe_load(text) or {}
    filled = False
    for key, part in (("model", module), ("data", datamodule)):
        hparams = dict(getattr(part, "hparams", None) or {})
        if not (config.get(key) or {}).get("class_path") and hparams.get("_class_path"):
            hparams.pop("_instantiator", None)
            config[key], filled = {"class_path": hparams.pop("_class_path"), "init_args": hparams}, True
    return yaml.safe_dump(config, sort_keys=False) if filled else text


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def wait_for_server(tracking_uri: str, timeout: float = 60.0) -> None:
    """Block until an MLflow server answers /health (used by tests and benches that start one)."""
    url = urlparse(tracking_uri)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((url.hostname, url.port), timeout=1):
                pass
            check_reachable(tracking_uri, timeout=2)
            return
        except (OSError, TrackingServerUnreachable):
            time.sleep(0.3)
    raise TimeoutError(f"MLflow server at {tracking_uri} did not start within {timeout:.0f}s")
