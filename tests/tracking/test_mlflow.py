"""MLflow tracking: the embedded store by default, a real server when asked, and failures that lose nothing."""

from __future__ import annotations

import errno
import math
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, ROOT, cli, free_port, start_mlflow_server, stop_server, terminal
from lightning.pytorch import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from mlflow.tracking import MlflowClient

from zoo.errors import InputError
from zoo.tracking import store_uri
from zoo.watchdog import LINE, MARGIN_S

TINY = str(CONFIGS / "cnn" / "convnet_digits.yaml")


class RaiseAtSetup(Callback):
    """A run that fails before training: its MLflow run exists, no optimizer step was taken."""

    def setup(self, trainer, pl_module, stage) -> None:
        raise RuntimeError("boom")


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    out = []
    for f in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, f.path) if f.is_dir else [f.path]
    return out


def _check_run(client: MlflowClient, c) -> None:
    logger = c.trainer.logger
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["zoo.family"] == "cnn"
    assert run.data.tags["zoo.model"].endswith("ConvNet")
    params = run.data.params
    assert (
        float(params["model.init_args.optimizer.lr"]) == 0.01 and params["model.init_args.net.init_args.width"] == "8"
    )
    metrics = run.data.metrics
    for key in ("train/loss", "val/loss", "val/acc", "grad/norm", "lr/pg1", "lr/pg2"):
        assert key in metrics, sorted(metrics)
    steps = client.get_metric_history(logger.run_id, "train/loss")
    assert len(steps) == c.trainer.global_step // c.trainer.log_every_n_steps
    files = _artifacts(client, logger.run_id)
    assert "config.yaml" in files
    config = yaml.safe_load(Path(client.download_artifacts(logger.run_id, "config.yaml")).read_text())
    assert config["model"]["init_args"]["net"]["class_path"] == "zoo.cnn.ConvNet"
    assert any(f.endswith(".ckpt") and "best" in f for f in files), files


def test_embedded_store_by_default(tmp_path, embedded_store):
    c = cli("fit", "--config", TINY)
    assert c.trainer.logger.tracking_uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert (tmp_path / "mlflow.db").is_file() and (tmp_path / "mlruns").is_dir()
    _check_run(MlflowClient(c.trainer.logger.tracking_uri), c)


@pytest.mark.slow  # ~16 s: several fits into one store; test_embedded_store_by_default checks one run's params
def test_runs_get_unique_readable_names_and_each_hyperparameter_once():
    # seed_everything(0) seeds Python's random before MLflow drew its name: every run was overjoyed-slug-911.
    a, b = (cli("fit", "--config", TINY, "--trainer.max_steps=2", "--trainer.limit_val_batches=1") for _ in range(2))
    client = MlflowClient(a.trainer.logger.tracking_uri)
    runs = [client.get_run(c.trainer.logger.run_id) for c in (a, b)]
    names = [r.info.run_name for r in runs]
    assert names[0] != names[1] and all(n.startswith("cnn-convnet-digits-") for n in names), names
    params = runs[0].data.params
    assert "_instantiator" not in params and params["trainer.logger.init_args.run_name"] == names[0]
    # A value logged twice is a bare or "/"-joined name that repeats the tail of a config's dotted name.
    doubled = [
        (k, other)
        for k in params
        for other in params
        if other != k and other.endswith("." + k.replace("/", ".")) and params[other] == params[k]
    ]
    assert not doubled, doubled
    named = cli(
        "fit",
        "--config",
        TINY,
        "--trainer.max_steps=1",
        "--trainer.limit_val_batches=1",
        "--trainer.logger.init_args.run_name=mine",
    )
    assert client.get_run(named.trainer.logger.run_id).info.run_name == "mine"


def test_learning_rate_logged_follows_warmup_cosine(digits_two_epochs):
    c = digits_two_epochs  # the tiny config's two epochs, every step logged, fitted once for the suite (conftest)
    client = MlflowClient(c.trainer.logger.tracking_uri)
    history = {m.step: m.value for m in client.get_metric_history(c.trainer.logger.run_id, "lr/pg1")}
    total, warmup, base, floor = c.trainer.global_step, 5, 0.01, 0.01
    for step, lr in history.items():
        if step < warmup:
            expected = base * (step + 1) / warmup
        else:
            expected = base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))))
        assert lr == pytest.approx(expected, rel=1e-5), step


@pytest.mark.slow  # the default suite's 10 minutes; CI's slow suite runs it
def test_tracking_server_from_env(mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    c = cli("fit", "--config", TINY)
    assert c.trainer.logger.tracking_uri == mlflow_server
    _check_run(MlflowClient(mlflow_server), c)
    assert not Path("mlflow.db").exists()


def test_unreachable_server_fails_fast_naming_the_uri(monkeypatch, capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    start = time.monotonic()  # in this process: the imports are done, what is timed is parsing, building and failing
    status, out, err = terminal(monkeypatch, capsys, "fit", "--config", TINY)
    elapsed = time.monotonic() - start
    assert status != 0
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and uri in errors[0] and "unreachable" in errors[0], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "Epoch" not in out + err  # failed before training started
    # MLflow's own retries would take minutes; beyond starting up, failing may take seconds.
    assert elapsed < 30, elapsed


@pytest.mark.slow
def test_server_dying_mid_run_keeps_local_checkpoints(tmp_path):
    server, uri = start_mlflow_server(tmp_path)
    try:
        from zoo.tracking import wait_for_server

        wait_for_server(uri)
        env = {"MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
        fit = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "cli.py"),
                "fit",
                "--config",
                TINY,
                "--trainer.max_epochs=6",
                "--model.init_args.net.init_args.width=32",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**__import__("os").environ, **env},
        )
        deadline = time.monotonic() + 120
        while not list(Path("runs").glob("**/last.ckpt")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(Path("runs").glob("**/last.ckpt")), "no checkpoint before the deadline"
    finally:
        stop_server(server, signal.SIGKILL)
    out, _ = fit.communicate(timeout=300)
    import torch

    last = next(Path("runs").glob("**/last.ckpt"))
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["epoch"] == 5, out[-3000:]  # checkpoints kept coming after the server died


def _start_fit(*args: str, **settings: str) -> subprocess.Popen:
    """``python cli.py fit`` on the tiny config in the background, into the working directory's default store;
    ``settings``: further environment variables."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "fit", "--config", TINY, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)]), **settings},
    )


@pytest.mark.slow
def test_runs_started_together_on_a_fresh_store_all_succeed(embedded_store):
    # MLflow creates a sqlite schema without a lock: 2 of 3 such runs crashed ("table experiments already exists").
    fits = [_start_fit("--trainer.max_steps=1", "--trainer.limit_val_batches=1") for _ in range(3)]
    outs = [f.communicate(timeout=600)[0] for f in fits]
    for fit, out in zip(fits, outs):
        assert fit.returncode == 0, out[-3000:]
    client = MlflowClient(store_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3


# A cli.py process each: the slow pass (the README test command's 10 minutes). In the default suite a SIGTERM ends
# the run failed in process (test_a_failed_run_ends_failed_whatever_the_callbacks_do_on_the_way_out) and a Ctrl-C
# ends a cli.py process's run and actors (test_impala.py's test_ctrl_c_in_a_terminal_ends_the_run_and_every_actor).
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_stopped_by_a_signal_ends_killed(embedded_store, sig):
    fit = _start_fit("--trainer.max_epochs=1000")
    deadline = time.monotonic() + 300
    while not list(Path("runs").glob("**/last.ckpt")) and fit.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # training has started: Lightning's SIGTERM handler is in place
    fit.send_signal(sig)
    out, _ = fit.communicate(timeout=300)
    client = MlflowClient(store_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("zoo").experiment_id])
    assert run.info.status == "KILLED", out[-3000:]
    assert fit.returncode != 0  # Lightning ends a SIGTERMed fit with exit status 0


@pytest.mark.slow  # a fit of its own (~30 s on 2 busy cores); zoo.watchdog's own tests are fast
def test_a_fit_stuck_after_sigterm_is_ended_by_the_watchdog_and_its_run_killed(embedded_store):
    """The user's path to ``zoo.watchdog`` (its own test covers native code): ``python cli.py`` starts it, and the
    run it ends is KILLED in MLflow, with one line."""
    fit = _start_fit("--trainer.max_epochs=1000", "--trainer.callbacks+=stuck.StuckAfterAStep", ZOO_STOP_GRACE="1")
    deadline = time.monotonic() + 300
    while not Path("stuck").exists() and fit.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    start = time.monotonic()
    fit.send_signal(signal.SIGTERM)
    out, _ = fit.communicate(timeout=60)
    assert fit.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert time.monotonic() - start < 1 + MARGIN_S
    assert [line for line in out.splitlines() if line.startswith("error:")] == [
        LINE.format(signal="SIGTERM", grace=1.0)
    ], out[-3000:]
    client = MlflowClient(store_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("zoo").experiment_id])
    assert run.info.status == "KILLED"


def test_run_that_raises_ends_failed_without_an_exception_checkpoint(embedded_store):
    with pytest.raises(RuntimeError, match="boom"):
        cli("fit", "--config", TINY, "--trainer.callbacks+=test_mlflow.RaiseAtSetup")
    client = MlflowClient(store_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("zoo").experiment_id])
    assert run.info.status == "FAILED"
    assert not list(Path("runs").rglob("*.ckpt"))  # no step taken: nothing to save (605 MB for ViT-B/32)


class FailAfterAStep(Callback):
    """Training fails after its first optimizer step: the exception checkpoint has weights to save."""

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= 1:
            raise RuntimeError("boom after a step")


class SigtermAfterAStep(Callback):
    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= 1:
            raise SIGTERMException()  # what Lightning's SIGTERM handler raises at the next step


class SavingFails(Callback):
    """Every checkpoint save fails, as on a full disk."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


class RaiseOnException(Callback):
    """A callback whose own clean-up fails: Lightning then skips the loggers' finalize."""

    def on_exception(self, trainer, pl_module, exception) -> None:
        raise RuntimeError("on_exception failed too")


class BadInputAtSetup(Callback):
    def setup(self, trainer, pl_module, stage) -> None:
        raise InputError("bad input at setup: pass a better one")


class FailInEvaluation(Callback):
    def on_validation_batch_end(self, *args) -> None:
        raise RuntimeError("boom in evaluation")

    on_predict_batch_end = on_validation_batch_end


# How a run fails (the stage, test callbacks, what cli.run raises or prints) -> the status it must end with.
FAILURES = {
    "the exception checkpoint fails too": ("fit", ["FailAfterAStep", "SavingFails"], "boom after a step", "FAILED"),
    "a callback's on_exception raises": ("fit", ["FailAfterAStep", "RaiseOnException"], "boom after a step", "FAILED"),
    "bad input in setup, then on_exception raises": (
        "fit",
        ["BadInputAtSetup", "RaiseOnException"],
        "error: bad input at setup: pass a better one",
        "FAILED",
    ),
    "validate fails, then on_exception raises": (
        "validate",
        ["FailInEvaluation", "RaiseOnException"],
        "boom",
        "FAILED",
    ),
    "predict fails, then on_exception raises": ("predict", ["FailInEvaluation", "RaiseOnException"], "boom", "FAILED"),
    "SIGTERM, then on_exception raises": ("fit", ["SigtermAfterAStep", "RaiseOnException"], "", "KILLED"),
}


@pytest.mark.parametrize("case", FAILURES)
def test_a_failed_run_ends_failed_whatever_the_callbacks_do_on_the_way_out(tmp_path, case, monkeypatch, capsys):
    from cli import run

    stage, callbacks, says, status = FAILURES[case]
    name = f"failing-{tmp_path.name}"  # the run, found by name in the store the tests share
    args = [f"--trainer.callbacks+=test_mlflow.{c}" for c in callbacks]
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "cli.py",
            stage,
            "--config",
            TINY,
            "--trainer.max_steps=3",
            f"--trainer.logger.init_args.run_name={name}",
            *args,
        ],
    )
    with warnings.catch_warnings(record=True) as caught, pytest.raises((SystemExit, RuntimeError)) as raised:
        warnings.simplefilter("always")
        run()  # cli.run: a training failure's traceback, or an input's one error line
    if says.startswith("error:"):
        err = capsys.readouterr().err
        assert raised.type is SystemExit and raised.value.code == 1 and says in err.splitlines(), err[-3000:]
    else:  # the run's own exception, or the one it was handling when on_exception raised
        assert raised.type is RuntimeError and says in str(raised.value.__context__ or raised.value)
    client = MlflowClient(store_uri())
    experiment = client.get_experiment_by_name("zoo").experiment_id
    (failed,) = client.search_runs([experiment], f"attributes.run_name = '{name}'")
    assert failed.info.status == status
    if "SavingFails" in callbacks:  # the save's failure is a warning; the run's own exception is the one raised
        assert "on_exception failed" not in str(raised.value) and raised.value.__context__ is None
        said = [str(w.message) for w in caught if "checkpoint was not written" in str(w.message)]
        assert len(said) == 1 and "No space left on device" in said[0], [str(w.message) for w in caught]
        assert not list(Path("runs").rglob("on_exception.ckpt"))


@pytest.mark.slow  # the default suite's 10 minutes; CI's slow suite runs it
def test_a_run_left_open_by_an_uncaught_exception_ends_failed_at_exit(embedded_store):
    # Outside cli.run (a script calling cli.main, a notebook's trainer): the logger's exit hook ends the run.
    code = (
        f"import sys; sys.path[:0] = {[str(ROOT), str(ROOT / 'tests'), str(Path(__file__).parent)]!r}; "
        "from cli import main; "
        f"main(['fit', '--config', {TINY!r}, '--trainer.callbacks+=test_mlflow.FailAfterAStep', "
        "'--trainer.callbacks+=test_mlflow.RaiseOnException'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 1 and "on_exception failed too" in proc.stderr, proc.stderr[-3000:]
    client = MlflowClient(store_uri())
    (failed,) = client.search_runs([client.get_experiment_by_name("zoo").experiment_id])
    assert failed.info.status == "FAILED"


def test_running_runs_of_dead_processes_are_marked_killed_at_the_next_start(embedded_store):
    from zoo.tracking import HOST_TAG, PID_TAG, process_host

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process now
    client = MlflowClient(store_uri())
    experiment = client.create_experiment("zoo")
    here, elsewhere = process_host(), "another-host-" + socket.gethostname()
    # A container with the host's name but a process table of its own (docker --network host).
    other_container = socket.gethostname() + "/pid:[1]"
    runs = {
        name: client.create_run(experiment, tags={PID_TAG: str(pid), HOST_TAG: host}).info.run_id
        for name, pid, host in [
            ("killed", dead.pid, here),
            ("alive", os.getpid(), here),
            ("elsewhere", dead.pid, elsewhere),
            ("other_container", dead.pid, other_container),
        ]
    }
    c = cli("fit", "--config", TINY, "--trainer.max_steps=1", "--trainer.limit_val_batches=1")
    status = {name: client.get_run(run_id).info.status for name, run_id in runs.items()}
    tag = client.get_run(c.trainer.logger.run_id).data.tags[HOST_TAG]
    assert tag == here and (os.name != "posix" or not Path("/proc/self/ns/pid").exists() or "/pid:[" in tag), tag
    assert status == {"killed": "KILLED", "alive": "RUNNING", "elsewhere": "RUNNING", "other_container": "RUNNING"}
