"""Resume is exact where the README says so, and says why where it cannot be.

Exact: a Ctrl-C mid-epoch between batches, or a kill -9 after a mid-epoch ``last.ckpt``, then
``fit --ckpt_path`` gives the weights of the run never stopped (the loader restarts at the first batch not
trained); a Ctrl-C inside a step gives exact weights, while BatchNorm's running statistics have seen the
interrupted batch once more. Not exact, and warned: resuming with a larger ``max_epochs`` rebuilds the
schedule for the new total, whose learning rates the resumed steps then follow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, ROOT, cli, output
from lightning.pytorch import Callback
from mlflow import MlflowClient

TINY = str(CONFIGS / "cnn" / "convnet_digits.yaml")
CLIP_TINY = str(CONFIGS / "clip" / "tiny.yaml")


class InterruptAt(Callback):
    """A Ctrl-C when ``step`` optimizer steps are done: at the end of that batch, or in the next one, before its
    forward pass or before its backward pass."""

    def __init__(self, step: int = 1, where: str = "batch_end") -> None:
        self.step, self.where = step, where

    def _maybe(self, trainer, where: str) -> None:
        if self.where == where and trainer.global_step == self.step:
            raise KeyboardInterrupt

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._maybe(trainer, "batch_end")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._maybe(trainer, "batch_start")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._maybe(trainer, "backward")


class HangAt(Callback):
    """Stands in for a long step: once ``step`` optimizer steps are done, say so in ``marker`` and wait to be killed."""

    def __init__(self, step: int = 1, marker: str = "hanging") -> None:
        self.step, self.marker = step, marker

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            Path(self.marker).touch()
            time.sleep(600)


def _params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _lr_history(c) -> dict[int, float]:
    client = MlflowClient(c.trainer.logger.tracking_uri)
    return {m.step: m.value for m in client.get_metric_history(c.trainer.logger.run_id, "lr/pg1")}


MUON = ["--model.init_args.optimizer.muon={}"]  # Muon's momentum buffers, AdamW's moments, one schedule


@pytest.mark.parametrize(
    ("config", "where", "extra"),
    [
        (TINY, "batch_end", []),
        # the default suite keeps one cut point mid-epoch, and test_checkpoints.py's resume at an epoch's end
        pytest.param(TINY, "batch_start", [], marks=pytest.mark.slow),
        pytest.param(TINY, "backward", [], marks=pytest.mark.slow),
        pytest.param(CLIP_TINY, "batch_start", [], marks=pytest.mark.slow),  # its last partial batch dropped
        pytest.param(TINY, "batch_end", MUON, marks=pytest.mark.slow),
    ],
    ids=["cnn-batch_end", "cnn-batch_start", "cnn-backward", "clip-batch_start", "cnn-muon-batch_end"],
)
def test_ctrl_c_mid_epoch_then_resume_equals_the_run_never_interrupted(config, where, extra, request):
    config = [config, *extra]
    if config == [TINY]:  # the tiny CNN's two epochs, fitted once for the suite (conftest)
        straight = request.getfixturevalue("digits_two_epochs")
    else:
        straight = cli("fit", "--config", *config, "--trainer.max_epochs=2", "--trainer.default_root_dir=straight")
    assert (type(straight.trainer.optimizers[0]).__name__ == "MuonAdamW") == bool(extra)
    per_epoch = straight.trainer.num_training_batches
    step = per_epoch + per_epoch // 2  # the middle of the second epoch
    interrupt = {"class_path": "test_resume.InterruptAt", "init_args": {"step": step, "where": where}}
    with pytest.raises(SystemExit):  # Lightning's graceful shutdown on KeyboardInterrupt
        cli("fit", "--config", *config, "--trainer.max_epochs=2", f"--trainer.callbacks+={json.dumps(interrupt)}")
    saved = output("on_exception.ckpt")
    assert torch.load(saved, weights_only=True)["global_step"] == step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = cli(
            "fit",
            "--config",
            *config,
            "--trainer.max_epochs=2",
            "--trainer.default_root_dir=resumed",
            f"--ckpt_path={saved}",
        )
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "not resumable" in m or "learning-rate schedule" in m], said
    assert resumed.trainer.global_step == straight.trainer.global_step == 2 * per_epoch
    a, b = _params(straight.model), _params(resumed.model)
    if where == "backward":
        # The interrupted forward pass had already moved the BatchNorm running statistics once with its
        # batch, which the resumed run trains on again: the weights are exact, those buffers are not.
        a = {k: v for k, v in a.items() if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


@pytest.mark.slow  # the default suite's 10 minutes; CI's slow suite runs it
def test_kill_9_mid_epoch_then_resume_from_last_ckpt_equals_the_run_never_killed():
    # Its own uninterrupted run, not the suite's shared one: compared with it, exactly, this resume differed once.
    straight = cli("fit", "--config", TINY, "--trainer.max_epochs=2", "--trainer.default_root_dir=straight")
    per_epoch = straight.trainer.num_training_batches
    saved_at = per_epoch + 5  # last.ckpt written mid-epoch, then a few more steps before the kill
    callbacks = [
        {"class_path": "callbacks.MonitoredCheckpoint", "init_args": {"every_n_train_steps": saved_at}},
        {"class_path": "test_resume.HangAt", "init_args": {"step": saved_at + 3}},
    ]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}{os.pathsep}{Path(__file__).parent}"}
    args = ["fit", "--config", TINY, "--trainer.max_epochs=2", f"--trainer.callbacks={json.dumps(callbacks)}"]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 300
        while not Path("hanging").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it hung"
            time.sleep(0.5)
    finally:
        proc.kill()  # SIGKILL: no handler runs, nothing is saved
        proc.wait()
    (last,) = Path("runs").rglob("last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == saved_at
    resumed = cli(
        "fit", "--config", TINY, "--trainer.max_epochs=2", "--trainer.default_root_dir=resumed", f"--ckpt_path={last}"
    )
    a, b = _params(straight.model), _params(resumed.model)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


@pytest.mark.slow  # the default suite's 10 minutes; CI's slow suite runs it
def test_extending_max_epochs_on_resume_rebuilds_the_schedule_and_warns(digits_two_epochs):
    log = "--trainer.log_every_n_steps=1"
    straight = digits_two_epochs  # logged every step too
    first = cli("fit", "--config", TINY, "--trainer.max_epochs=1", log, "--trainer.default_root_dir=first")
    steps = first.trainer.global_step
    with pytest.warns(UserWarning, match=rf"total_steps {steps} -> {2 * steps}.*at step {steps}.*will not equal"):
        resumed = cli(
            "fit",
            "--config",
            TINY,
            "--trainer.max_epochs=2",
            log,
            "--trainer.default_root_dir=resumed",
            f"--ckpt_path={first.trainer.checkpoint_callback.last_model_path}",
        )
    # From the resumed step on, the learning rate is the two-epoch schedule's, step for step ...
    want, got = _lr_history(straight), _lr_history(resumed)
    assert sorted(got) == [s for s in sorted(want) if s >= steps] and len(got) == steps
    for s, lr in got.items():
        assert lr == pytest.approx(want[s], rel=1e-6), s
    # ... but the first epoch decayed over one epoch, not two: the weights differ, as the warning says.
    a, b = _params(straight.model), _params(resumed.model)
    assert any(not torch.equal(a[k], b[k]) for k in a)
