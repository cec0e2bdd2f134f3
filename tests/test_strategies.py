"""DDP and FSDP2 on 2 CPU processes (gloo), in subprocesses: DDP relaunches its own script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from conftest import CONFIGS, ROOT
from mlflow.tracking import MlflowClient

from zoo.cnn import ClassifierModule
from zoo.layers.parallel import consolidate

TINY = str(CONFIGS / "cnn" / "convnet_digits.yaml")
SCRIPT = str(ROOT / "tests" / "scripts" / "fit_and_dump.py")


def _run(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, SCRIPT, "fit", "--config", TINY, *args, "--trainer.accelerator=cpu"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_ddp_two_processes_identical_weights_one_run():
    _run("--config", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.max_epochs=1")
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    assert r0["state"].keys() == r1["state"].keys()
    for k in r0["state"]:
        torch.testing.assert_close(r0["state"][k], r1["state"][k], rtol=0, atol=0, msg=k)
    client = MlflowClient("sqlite:///mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].data.tags["zoo.family"] == "cnn"


def test_fsdp2_two_processes_train_checkpoint_consolidate_reload(tmp_path):
    _run("--config", str(CONFIGS / "trainer" / "fsdp.yaml"), "--trainer.max_epochs=1")
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    torch.testing.assert_close(r0["out"], r1["out"])
    last = Path(r0["last"])
    assert last.is_dir(), "FSDP2 checkpoints are sharded directories"
    single = consolidate(last, tmp_path / "consolidated.ckpt")
    module = ClassifierModule.load_from_checkpoint(single).eval()
    with torch.no_grad():
        torch.testing.assert_close(module(r0["x"]), r0["out"], rtol=1e-5, atol=1e-5)
    for k, v in r0["state"].items():
        torch.testing.assert_close(module.state_dict()[k], v, msg=k)
