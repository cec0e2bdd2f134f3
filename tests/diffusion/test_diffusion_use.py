"""A trained diffusion model on new requests through cli.py: N samples of given classes as PNGs and one grid."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from conftest import CONFIGS, cli, fit_in_folder, output
from mlflow.tracking import MlflowClient
from PIL import Image

from zoo.diffusion import DiffusionModule
from zoo.diffusion.samplers import DDIMSampler

TINY = str(CONFIGS / "diffusion" / "tiny.yaml")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One epoch of the tiny config, fitted once for the file in a folder of its own (each test fitted its own
    before), with the predict settings its checkpoint records: 3 samples of class 2, a 2-step sampler."""
    return fit_in_folder(
        tmp_path_factory.mktemp("diffusion_tiny"),
        "--config",
        TINY,
        "--trainer.max_epochs=1",
        "--data.init_args.num_samples=3",
        "--data.init_args.labels=[2]",
        "--model.init_args.sampler.init_args.steps=2",
    )


def test_predict_writes_a_readable_png_per_sample_and_a_grid(fitted):
    last = str(fitted.last)  # the command line's settings win over the checkpoint's
    classes = fitted.cli.datamodule.class_names
    p = cli(
        "predict",
        "--config",
        TINY,
        f"--ckpt_path={last}",
        "--data.init_args.num_samples=5",
        "--data.init_args.labels=[1, 3]",
        "--model.init_args.sampler.init_args.steps=3",
        "--data.init_args.seed=7",
    )
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [1, 3, 1, 3, 1]
    names = [f"{i:04d}_{classes[k]}.png" for i, k in enumerate([1, 3, 1, 3, 1])]
    assert [Path(r["image"]).name for r in rows] == names
    assert sorted(f.name for f in output("grid.png").parent.iterdir()) == sorted([*names, "grid.png"])
    logged = MlflowClient(p.trainer.logger.tracking_uri).list_artifacts(p.trainer.logger.run_id, "images")
    assert sorted(a.path for a in logged) == sorted(f"images/{n}" for n in [*names, "grid.png"])

    # 8 px samples enlarged 16 times with nearest neighbours: every 16th pixel is the sample itself
    module = DiffusionModule.load_from_checkpoint(last).eval()
    first = module.sample(4, partial(DDIMSampler, steps=3), seed=7, labels=[1, 3, 1, 3])  # batch 0 (batch_size 4)
    expected = ((first[0] * 0.5 + 0.5).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    png = np.asarray(Image.open(output("grid.png").parent / names[0]))
    assert png.shape == (128, 128, 3)
    assert np.array_equal(png[::16, ::16], expected)
    assert np.array_equal(png[15::16, 15::16], expected)  # blocks, not interpolation

    grid = Image.open(output("grid.png"))  # 3 x 2 tiles of 8 px with 1 px borders, enlarged 16 times
    assert grid.size == ((3 * 9 + 1) * 16, (2 * 9 + 1) * 16)
    tile = np.asarray(grid)[16 : 16 + 128, 16 : 16 + 128]
    assert np.array_equal(tile, png)


def test_a_checkpoint_alone_samples_with_the_data_it_was_trained_on(fitted):
    """predict without --config: the checkpoint records the DiffusionDataModule's arguments, the image data
    as its config (class names, normalisation); the model's its sampler."""
    fit = fitted.cli
    p = cli("predict", "--ckpt_path", str(fitted.last))
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    name = fit.datamodule.class_names[2]
    assert [Path(r["image"]).name for r in rows] == [f"{i:04d}_{name}.png" for i in range(3)]
    assert len(p.model.objective.sampler(p.model.sampler, None).timesteps()) == 2  # the checkpoint's sampler
    # A sampling setting on the command line wins over the checkpoint's: it is no weight.
    p = cli(
        "predict",
        "--ckpt_path",
        str(fitted.last),
        "--model.init_args.sampler.init_args.steps=3",
        "--model.init_args.guidance_scale=2",
    )
    assert len(p.model.objective.sampler(p.model.sampler, None).timesteps()) == 3 and p.model.guidance_scale == 2


def test_a_datamodule_built_in_python_records_no_objects():
    """The image DataModule object is left out of the hyperparameters: pickled, it would make every checkpoint
    unreadable weights-only."""
    from datamodules import DiffusionDataModule, ShapesDataModule

    dm = DiffusionDataModule(ShapesDataModule(image_size=8), num_samples=3)
    assert "images" not in dm.hparams
    assert dm.hparams["num_samples"] == 3
