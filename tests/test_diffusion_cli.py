"""The diffusion family through cli.py: fit, EMA in validation and checkpoints, resume, predict grids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS, cli
from mlflow.tracking import MlflowClient
from PIL import Image

from zoo.diffusion import DiffusionModule
from zoo.diffusion.grid import image_grid

TINY = str(CONFIGS / "diffusion" / "tiny.yaml")


pytestmark = pytest.mark.usefixtures("one_thread")


def _ckpt(path: str) -> dict:
    return torch.load(path, weights_only=True)


def test_tiny_fits_validates_on_ema_and_predicts_from_its_checkpoint():
    c = cli("fit", "--config", TINY)
    val_loss = c.trainer.callback_metrics["val/loss"].item()
    last = c.trainer.checkpoint_callback.last_model_path

    # The checkpoint holds the EMA weights as its state_dict and the training weights beside them.
    ckpt = _ckpt(last)
    assert ckpt["averaging_state"]["n_averaged"].item() == c.trainer.global_step
    ema, current = ckpt["state_dict"], ckpt["current_model_state"]
    assert ema.keys() == current.keys()
    assert not torch.equal(ema["net.conv_out.weight"], current["net.conv_out.weight"])

    # Validation during fit ran on the EMA weights: validating the checkpoint alone gives the same loss.
    v = cli("validate", "--config", TINY, f"--ckpt_path={last}")
    assert v.trainer.callback_metrics["val/loss"].item() == pytest.approx(val_loss, rel=1e-5)

    run = c.trainer.logger.run_id
    client = MlflowClient(c.trainer.logger._tracking_uri)
    grids = [a.path for a in client.list_artifacts(run, "samples")]
    assert grids == ["samples/step_0000010.png", "samples/step_0000020.png"]  # one per validation epoch
    assert client.get_run(run).data.tags["zoo.family"] == "diffusion"

    cli("predict", "--config", TINY, f"--ckpt_path={last}", "--data.init_args.guidance_scale=3",
        "--data.init_args.steps=4", "--data.init_args.seed=5", "--data.init_args.labels=[2, 4]")
    rows = [json.loads(line) for line in Path("predictions.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [2, 4] * 4 and [r["seed"] for r in rows] == [5] * 4 + [6] * 4
    assert sorted(p.name for p in Path("samples").iterdir()) == ["grid_0000.png", "grid_0001.png"]

    # The same grid from the checkpoint alone, through the module's public sample().
    module = DiffusionModule.load_from_checkpoint(last).eval()
    torch.testing.assert_close(module.net.conv_out.weight, ema["net.conv_out.weight"])
    images = module.sample(4, "ddim", steps=4, guidance_scale=3.0, seed=5, labels=[2, 4, 2, 4])
    assert np.array_equal(np.asarray(image_grid(images)), np.asarray(Image.open("samples/grid_0000.png")))


def test_resume_restores_training_weights_and_ema():
    straight = cli("fit", "--config", TINY, "--trainer.default_root_dir=straight")
    first = cli("fit", "--config", TINY, "--trainer.callbacks+=conftest.StopAfterEpochs",
                "--trainer.default_root_dir=first")
    assert first.trainer.global_step * 2 == straight.trainer.global_step
    resumed = cli("fit", "--config", TINY, "--trainer.default_root_dir=resumed",
                  f"--ckpt_path={first.trainer.checkpoint_callback.last_model_path}")
    a = _ckpt(straight.trainer.checkpoint_callback.last_model_path)
    b = _ckpt(resumed.trainer.checkpoint_callback.last_model_path)
    assert a["averaging_state"]["n_averaged"] == b["averaging_state"]["n_averaged"] == straight.trainer.global_step
    for key in ("state_dict", "current_model_state"):  # EMA weights, training weights
        for k in a[key]:
            torch.testing.assert_close(a[key][k], b[key][k], rtol=0, atol=0, msg=f"{key}: {k}")


@pytest.mark.parametrize("name", ["ddpm_unet_shapes.yaml", "dit_s_shapes.yaml"])
def test_shapes_configs_run_a_few_steps(name):
    c = cli("fit", "--config", str(CONFIGS / "diffusion" / name), "--trainer.fast_dev_run=2",
            "--trainer.enable_progress_bar=false", "--trainer.precision=32-true",
            "--data.init_args.images.init_args.batch_size=4", "--data.init_args.images.init_args.num_train=16",
            "--data.init_args.images.init_args.num_val=8", "--data.init_args.images.init_args.num_test=8")
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])


def test_a_short_fit_lowers_the_frechet_distance_of_its_samples():
    # The metric's feature space: a ConvNet the zoo trains on the same 8x8 shapes in a few seconds.
    clf = cli("fit", "--config", str(CONFIGS / "cnn" / "convnet_shapes.yaml"), "--data.init_args.image_size=8",
              "--data.init_args.num_train=2000", "--data.init_args.num_val=256", "--data.init_args.num_test=64",
              "--model.init_args.net.init_args.depth=2", "--model.init_args.warmup_steps=5", "--trainer.max_epochs=1",
              "--test_after_fit=false",
              "--trainer.enable_progress_bar=false", "--trainer.default_root_dir=classifier")
    fd = ["--trainer.callbacks+=callbacks.FrechetDistance",
          f"--trainer.callbacks.classifier={clf.trainer.checkpoint_callback.best_model_path}",
          "--trainer.callbacks.num_samples=256", "--trainer.callbacks.steps=10",
          "--data.init_args.images.init_args.num_val=256"]
    untrained = cli("validate", "--config", TINY, *fd).trainer.callback_metrics["val/fd_classifier"].item()
    trained = cli("fit", "--config", TINY, *fd, "--trainer.max_epochs=10").trainer.callback_metrics["val/fd_classifier"]
    print(f"Frechet distance in the classifier's features: untrained {untrained:.1f}, after 100 steps {trained.item():.1f}")
    assert trained < 0.3 * untrained  # measured here: 80 -> 15
