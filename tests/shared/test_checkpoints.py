"""Checkpoints: validate/test/predict from the same YAML, reload without it, exact resume, clear refusals."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, cli, output
from lightning.pytorch import Callback

from zoo.cnn import ClassifierModule
from zoo.io.weights import UnsafeCheckpointError, load_file

TINY = str(CONFIGS / "cnn" / "convnet_digits.yaml")


@pytest.fixture
def trained(digits_fit):
    """The shared one-epoch digits fit (conftest): its LightningCLI and best checkpoint."""
    return digits_fit.cli, digits_fit.best


def _params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_validate_test_predict_from_the_same_yaml(trained):
    c, best = trained
    v = cli("validate", "--config", TINY, f"--ckpt_path={best}")
    t = cli("test", "--config", TINY, f"--ckpt_path={best}")
    assert v.trainer.callback_metrics["val/acc"] == pytest.approx(
        float(c.trainer.checkpoint_callback.best_model_score), abs=1e-6
    )
    assert 0.0 <= float(t.trainer.callback_metrics["test/acc"]) <= 1.0
    cli("predict", "--config", TINY, f"--ckpt_path={best}")
    rows = output("predictions.csv").read_text().splitlines()
    assert rows[0] == "pred,confidence,target"
    assert len(rows) - 1 == len(t.datamodule.test_set)


def test_load_from_checkpoint_alone_rebuilds_the_same_net(trained):
    c, best = trained
    loaded = ClassifierModule.load_from_checkpoint(best).eval()
    x = torch.randn(5, 1, 8, 8)
    ref = ClassifierModule.load_from_checkpoint(best)  # same weights as the best epoch
    assert type(loaded.net).__name__ == "ConvNet"
    torch.testing.assert_close(loaded(x), ref.eval()(x))
    state = torch.load(best, weights_only=True)  # our own checkpoints hold no pickled code either
    torch.testing.assert_close(loaded.state_dict()["net.head.weight"], state["state_dict"]["net.head.weight"])


def test_resume_to_2n_equals_uninterrupted_2n(digits_two_epochs):
    straight = digits_two_epochs  # the same config's two epochs, fitted once for the suite (conftest)
    # The same 2-epoch run, interrupted after its first epoch (the schedule spans both epochs).
    first = cli(
        "fit",
        "--config",
        TINY,
        "--trainer.max_epochs=2",
        "--trainer.callbacks+=conftest.StopAfterEpochs",
        "--trainer.default_root_dir=first",
    )
    last = first.trainer.checkpoint_callback.last_model_path
    resumed = cli(
        "fit", "--config", TINY, "--trainer.max_epochs=2", "--trainer.default_root_dir=resumed", f"--ckpt_path={last}"
    )
    assert resumed.trainer.global_step == straight.trainer.global_step == 2 * first.trainer.global_step
    a, b = _params(straight.model), _params(resumed.model)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_checkpoint_of_another_shape_names_the_mismatched_keys(trained):
    # Through cli.py, Lightning rebuilds the model from the checkpoint's own hyperparameters; a
    # model configured in Python (or another family's config) meets the checkpoint as it is.
    from lightning.pytorch import Trainer

    from datamodules import DigitsDataModule
    from zoo.cnn import ConvNet

    _, best = trained
    wider = ClassifierModule(ConvNet(num_classes=10, in_channels=1, width=16, depth=2))
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(
        ValueError, match=r"(?s)mismatched keys.*head\.weight: checkpoint \(10, 16\) vs model \(10, 32\)"
    ):
        trainer.validate(wider, DigitsDataModule(), ckpt_path=best)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_crafted_pickle_is_refused_not_executed(tmp_path):
    bad = tmp_path / "evil.ckpt"
    with bad.open("wb") as f:
        pickle.dump({"state_dict": {"w": _Exploit()}}, f)
    with pytest.raises(UnsafeCheckpointError, match="refused"):
        load_file(bad)
    with pytest.raises(UnsafeCheckpointError, match="execute code"):
        ClassifierModule.load_from_checkpoint(bad)
    with pytest.raises(UnsafeCheckpointError, match="execute code"):
        cli("validate", "--config", TINY, f"--ckpt_path={bad}")
    assert not Path("pwned").exists() and not (tmp_path / "pwned").exists()


def test_external_weights_load_weights_only(tmp_path):
    from safetensors.torch import save_file

    from zoo.cnn import TorchvisionNet

    src = TorchvisionNet("resnet18", num_classes=7)
    save_file(src.model.state_dict(), tmp_path / "w.safetensors")
    torch.save(src.model.state_dict(), tmp_path / "w.pth")
    x = torch.randn(2, 3, 32, 32)
    for name in ("w.safetensors", "w.pth"):
        net = TorchvisionNet("resnet18", num_classes=7, weights_path=str(tmp_path / name)).eval()
        torch.testing.assert_close(net(x), src.eval()(x))
    # Another number of classes fine-tunes: the backbone loads, the head is new (issue 13); any other
    # mismatch is still refused, naming the keys.
    other = TorchvisionNet("resnet18", num_classes=3, weights_path=str(tmp_path / "w.pth"))
    assert other.model.fc.weight.shape == (3, 512)
    torch.testing.assert_close(other.model.layer4[1].conv2.weight, src.model.layer4[1].conv2.weight, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"layer1\.2\.conv1\.weight: missing from checkpoint"):
        TorchvisionNet("resnet34", num_classes=7, weights_path=str(tmp_path / "w.pth"))


def test_extract_state_dict_takes_the_nets_keys_from_a_module_checkpoint():
    from zoo.io.weights import extract_state_dict

    w, ema = torch.ones(2), torch.zeros(2)
    ckpt = {"state_dict": {"net.head.weight": w, "critic_target.weight": ema}, "epoch": 3}
    assert extract_state_dict(ckpt, "net.") == {"head.weight": w}  # the module's other state is not the net's
    assert extract_state_dict({"head.weight": w}, "net.") == {"head.weight": w}  # a bare net state dict as it is
    assert extract_state_dict({"model": {"net.a": w}}) == {"net.a": w}


class RaiseAtStep(Callback):
    """Fails the run at setup (``step`` 0), at the start of a training batch once ``step`` optimizer steps are
    done, or, ``in_test``, as a test starts."""

    def __init__(self, step: int = 0, in_test: bool = False) -> None:
        self.step, self.in_test = step, in_test

    def setup(self, trainer, pl_module, stage) -> None:
        if self.step == 0:
            raise RuntimeError("failed at setup")

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError(f"failed at step {trainer.global_step}")

    def on_test_start(self, trainer, pl_module) -> None:
        if self.in_test:
            raise RuntimeError("failed in test")


def test_exception_checkpoint_only_after_an_optimizer_step_in_the_runs_own_folder():
    fail = "--trainer.callbacks+=test_checkpoints.RaiseAtStep"
    with pytest.raises(RuntimeError, match="at setup"):
        cli("fit", "--config", TINY, fail)
    for stage in ("validate", "validate"):  # evaluations train nothing: they shared one runs/on_exception/
        with pytest.raises(RuntimeError, match="at setup"):
            cli(stage, "--config", TINY, fail)
    assert not list(Path("runs").rglob("*.ckpt"))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="at step 3"):
            cli("fit", "--config", TINY, fail, "--trainer.callbacks.init_args.step=3")
    saved = sorted(Path("runs").rglob("on_exception.ckpt"))
    assert len(saved) == 2  # one folder per run: runs/<experiment>/<run>/on_exception/
    assert all(p.parent.name == "on_exception" and p.parents[3] == Path("runs") for p in saved)
    assert [torch.load(p, weights_only=True)["global_step"] for p in saved] == [3, 3]
    with pytest.raises(RuntimeError, match="at step 3"):  # resumed, and failed before its next step
        cli("fit", "--config", TINY, fail, "--trainer.callbacks.init_args.step=3", f"--ckpt_path={saved[0]}")
    with pytest.raises(RuntimeError, match="in test"):  # the test after a finished fit trains nothing
        cli(
            "fit",
            "--config",
            TINY,
            fail,
            "--trainer.callbacks.init_args.step=1000",
            "--trainer.callbacks.init_args.in_test=true",
            "--trainer.max_steps=2",
            "--test_after_fit=true",
        )
    assert sorted(Path("runs").rglob("on_exception.ckpt")) == saved
