"""After fit, through cli.py: a registered model used by name on new files without the training config, its
evaluations and predictions in a child run of the training run, nothing in the working directory; num_classes
from the data; a 1000-class ResNet fine-tuned to 5 classes."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS, cli
from mlflow.tracking import MlflowClient

CNN = str(CONFIGS / "cnn" / "convnet_digits.yaml")
CLIP = str(CONFIGS / "clip" / "tiny.yaml")


def _files_outside_run_folders(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] not in ("runs", "mlruns", "data")
    }


def _rows(c, name: str = "predictions.csv") -> list[dict]:
    """The predictions a cli.py run wrote into its own run folder."""
    lg = c.trainer.logger
    path = Path(c.trainer.default_root_dir, lg.experiment_id, lg.run_id, name)
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _register(c, name: str) -> MlflowClient:
    client = MlflowClient(c.trainer.logger.tracking_uri)
    version = client.search_model_versions(f"name='{name}'")[0]
    client.set_registered_model_alias(name, "champion", version.version)
    return client


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory) -> Path:
    """Five of the digits as 8-bit PNG files, outside any working directory."""
    from PIL import Image
    from sklearn.datasets import load_digits

    folder = tmp_path_factory.mktemp("new_digits")
    digits = load_digits()
    for i in range(5):
        Image.fromarray((digits.images[i] * 255 / 16).round().astype(np.uint8)).save(
            folder / f"{i}_{digits.target[i]}.png"
        )
    return folder


def test_cnn_registered_model_predicts_new_files_without_the_config(tmp_path, digits_files, digits_fit, monkeypatch):
    # The suite's one-epoch CNN fit (conftest), registered as digits@champion; predictions go to its store.
    fit, client, best = digits_fit.cli, digits_fit.client, str(digits_fit.best)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", digits_fit.tracking_uri)
    assert fit.model.net.num_classes == 10  # from the data: the config states none
    before = _files_outside_run_folders(tmp_path)

    by_name = cli("predict", "--ckpt_path", "models:/digits@champion", f"--data.init_args.paths={digits_files}")
    by_file = cli("predict", "--ckpt_path", best, f"--data.init_args.paths={digits_files}")
    rows = _rows(by_name)
    assert [Path(r["path"]).name for r in rows] == sorted(p.name for p in digits_files.iterdir())
    assert rows == _rows(by_file)
    assert set(rows[0]) >= {"path", "class", "confidence", "class_2", "confidence_5"}

    # The same probabilities as the checkpoint's module on the files read as the training data was.
    from datamodules import DigitsDataModule
    from zoo.cnn import ClassifierModule

    dm = DigitsDataModule()
    dm.setup()
    (mean,), (std,) = dm.normalization
    images = (
        torch.stack(
            [torch.from_numpy(np.asarray(__import__("PIL.Image").Image.open(r["path"]), np.float32)) for r in rows]
        )[:, None]
        / 255
    )
    module = ClassifierModule.load_from_checkpoint(best).eval()
    probs = module((images - mean) / std).softmax(-1)
    np.testing.assert_allclose([float(r["confidence"]) for r in rows], probs.max(-1).values.detach(), rtol=1e-4)
    assert [r["class"] for r in rows] == [str(k) for k in probs.argmax(-1).tolist()]

    # Both predictions are child runs of the training run, holding their predictions as artifacts.
    for c in (by_name, by_file):
        run = client.get_run(c.trainer.logger.run_id)
        assert run.data.tags["mlflow.parentRunId"] == fit.trainer.logger.run_id
        assert run.info.experiment_id == fit.trainer.logger.experiment_id
        assert [a.path for a in client.list_artifacts(run.info.run_id, "predictions")] == [
            "predictions/predictions.csv"
        ]
    assert _files_outside_run_folders(tmp_path) == before  # nothing written to the working directory


def test_validate_and_test_take_the_checkpoints_own_data_and_log_a_confusion_figure(digits_fit):
    fit, best = digits_fit.cli, str(digits_fit.best)  # the suite's one-epoch fit of the CNN config (conftest)
    alone = cli("test", "--ckpt_path", best)
    with_config = cli("test", "--config", CNN, "--ckpt_path", best)
    assert float(alone.trainer.callback_metrics["test/acc"]) == float(with_config.trainer.callback_metrics["test/acc"])
    client = MlflowClient(alone.trainer.logger.tracking_uri)
    files = {a.path for a in client.list_artifacts(alone.trainer.logger.run_id, "test")}
    assert {"test/confusion_matrix.png", "test/confusion_matrix.json"} <= files
    matrix = json.loads(
        Path(client.download_artifacts(alone.trainer.logger.run_id, "test/confusion_matrix.json")).read_text()
    )
    assert matrix["class_names"] == [str(d) for d in range(10)] and len(matrix["confusion_matrix"]) == 10
    v = cli("validate", "--ckpt_path", best)
    assert float(v.trainer.callback_metrics["val/acc"]) == pytest.approx(
        float(fit.trainer.checkpoint_callback.best_model_score)
    )


def test_missing_model_or_data_is_named(tmp_path):
    with pytest.raises(SystemExit, match="needs a model: pass --ckpt_path"):
        cli("predict")
    ckpt = tmp_path / "python.ckpt"  # a checkpoint written from Python: a class path, but no data recorded
    from zoo.cnn import ClassifierModule, ConvNet

    module = ClassifierModule(ConvNet(num_classes=3, width=4, depth=1))
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": {
                "_class_path": "zoo.cnn.ClassifierModule",
                "net": {"class_path": "zoo.cnn.ConvNet", "init_args": {"num_classes": 3, "width": 4, "depth": 1}},
            },
        },
        ckpt,
    )
    with pytest.raises(SystemExit, match="needs data and .* records none: pass --data"):
        cli("validate", "--ckpt_path", str(ckpt))


def test_a_stated_num_classes_that_disagrees_with_the_data_is_an_error():
    with pytest.raises(ValueError, match="num_classes=6 but the data has 10 classes"):
        cli("fit", "--config", CNN, "--model.init_args.net.init_args.num_classes=6", "--trainer.max_steps=1")


@pytest.fixture
def five_class_folder(tmp_path_factory) -> Path:
    from PIL import Image

    root = tmp_path_factory.mktemp("five")
    g = torch.Generator().manual_seed(0)
    for k in range(5):
        (root / "train" / f"class{k}").mkdir(parents=True)
        for i in range(3):
            pixels = (torch.rand(16, 16, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(root / "train" / f"class{k}" / f"{i}.png")
    return root


def test_a_1000_class_resnet_checkpoint_fine_tunes_to_5_classes(tmp_path, five_class_folder, caplog):
    from zoo.cnn import ResNet

    pretrained = ResNet(18, num_classes=1000, stem="cifar")
    for m in pretrained.modules():  # batch-norm statistics that a frozen backbone must keep
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
    torch.save(pretrained.state_dict(), tmp_path / "imagenet.pth")
    config = {
        "model": {
            "class_path": "zoo.cnn.ClassifierModule",
            "init_args": {
                "net": {"class_path": "zoo.cnn.ResNet", "init_args": {"depth": 18, "stem": "cifar"}},
                "init_weights": str(tmp_path / "imagenet.pth"),
                "freeze_backbone": True,
            },
        },
        "data": {
            "class_path": "datamodules.ImageFolderDataModule",
            "init_args": {"root": str(five_class_folder), "image_size": 16, "batch_size": 4, "val_fraction": 0.2},
        },
        "trainer": {"max_steps": 2, "logger": False, "enable_progress_bar": False},
    }
    (tmp_path / "finetune.yaml").write_text(json.dumps(config))
    with caplog.at_level(logging.INFO):
        c = cli("fit", "--config", str(tmp_path / "finetune.yaml"))
    net = c.model.net
    assert net.fc.weight.shape == (5, 512) and net.num_classes == 5
    assert "replaced the classifier head, fc.weight: (1000, 512) in the weights, (5, 512) here" in caplog.text
    for key, value in pretrained.state_dict().items():
        if not key.startswith("fc."):  # the backbone, batch-norm statistics included, is the pretrained one
            torch.testing.assert_close(net.state_dict()[key], value, rtol=0, atol=0, msg=key)
    trained = torch.load(c.trainer.checkpoint_callback.last_model_path, weights_only=True)
    assert trained["hyper_parameters"]["net"]["init_args"]["num_classes"] == 5  # the checkpoint rebuilds 5 classes
    assert trained["inputs"]["class_names"] == [f"class{k}" for k in range(5)]


@pytest.mark.usefixtures("one_thread")
def test_clip_registered_model_zero_shot_and_embeddings_without_the_config(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("clip_images")
    for i, colour in enumerate([(200, 30, 0), (0, 200, 30), (30, 0, 200)]):
        Image.new("RGB", (40, 40), colour).save(folder / f"{i}.png")
    names = tmp_path_factory.mktemp("names") / "classes.txt"
    names.write_text("circle\nring\nsquare\n")
    fit = cli(
        "fit",
        "--config",
        CLIP,
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=1",
        "--trainer.logger.init_args.registered_model_name=clip13",
    )
    _register(fit, "clip13")
    last = fit.trainer.checkpoint_callback.last_model_path

    by_name = cli(
        "predict",
        "--ckpt_path",
        "models:/clip13@champion",
        f"--data.init_args.paths={folder}",
        f"--data.init_args.class_names={names}",
    )
    rows = _rows(by_name)
    assert [Path(r["path"]).name for r in rows] == ["0.png", "1.png", "2.png"]
    assert {r["class"] for r in rows} <= {"circle", "ring", "square"} and set(rows[0]) >= {"confidence", "class_3"}
    # The training config's own predict path (the data tokenises, the shapes templates) gives the same numbers.
    with_config = cli(
        "predict",
        "--config",
        CLIP,
        "--ckpt_path",
        last,
        f"--data.init_args.predict_path={folder}",
        "--data.init_args.class_names=[circle, ring, square]",
    )
    for a, b in zip(rows, _rows(with_config)):
        assert a["class"] == b["class"] and float(a["confidence"]) == pytest.approx(float(b["confidence"]), rel=1e-5)
    assert (
        MlflowClient(fit.trainer.logger.tracking_uri)
        .get_run(by_name.trainer.logger.run_id)
        .data.tags["mlflow.parentRunId"]
        == fit.trainer.logger.run_id
    )

    texts = ["a small red circle in the center", "a large blue ring on the left"]
    emb = cli(
        "predict",
        "--ckpt_path",
        "models:/clip13@champion",
        "--data.init_args.predict=text_embeddings",
        f"--data.init_args.texts={json.dumps(texts)}",
    )
    assert [r["text"] for r in _rows(emb)] == texts
    lg = emb.trainer.logger
    vectors = np.load(Path(emb.trainer.default_root_dir, lg.experiment_id, lg.run_id, "predictions.embedding.npy"))
    from zoo.clip import ContrastiveModule

    module = ContrastiveModule.load_from_checkpoint(last).eval()
    np.testing.assert_allclose(vectors, module.embed_texts(texts).numpy(), rtol=1e-5, atol=1e-6)
    assert not [p for p in Path(os.getcwd()).iterdir() if p.is_file()]  # outputs went to the run folders


def test_clip_weights_into_towers_of_another_embedding_size_replace_the_projections(tmp_path, caplog):
    from zoo.clip import CLIP, TextTransformer, VisionTransformer
    from zoo.clip.hf import load_hf_clip_into

    def net(embed_dim: int) -> CLIP:
        return CLIP(
            VisionTransformer(image_size=16, patch_size=4, width=32, layers=1, heads=2, embed_dim=embed_dim),
            TextTransformer(vocab_size=257, context_length=8, width=32, layers=1, heads=2, embed_dim=embed_dim),
        )

    pretrained = net(32)
    torch.save(pretrained.state_dict(), tmp_path / "clip.pth")
    fresh = net(16)
    with caplog.at_level(logging.INFO):
        load_hf_clip_into(fresh, tmp_path / "clip.pth")
    for tower in ("image_encoder", "text_encoder"):
        assert f"{tower}.proj.weight: (32, 32) in the weights, (16, 32) here" in caplog.text
    for key, value in pretrained.state_dict().items():
        if not key.endswith("encoder.proj.weight"):
            torch.testing.assert_close(fresh.state_dict()[key], value, rtol=0, atol=0, msg=key)
    with pytest.raises(ValueError, match="mismatched keys"):  # anything but the projections must still fit
        load_hf_clip_into(
            CLIP(
                VisionTransformer(image_size=16, patch_size=4, width=16, layers=1, heads=2, embed_dim=32),
                TextTransformer(vocab_size=257, context_length=8, width=32, layers=1, heads=2, embed_dim=32),
            ),
            tmp_path / "clip.pth",
        )


def test_image_samples_are_enlarged_and_logged_per_step_from_the_fits_first(tmp_path):
    from types import SimpleNamespace

    from callbacks import LogImageSamples
    from zoo.tracking import ZooMLFlowLogger

    logger = ZooMLFlowLogger(experiment_name="samples")
    module = SimpleNamespace(
        sample=lambda n, sampler, guidance, seed: torch.linspace(-1, 1, n * 3 * 16 * 16).view(n, 3, 16, 16)
    )
    callback = LogImageSamples(num_samples=16)
    for step in (0, 5, 10):
        trainer = SimpleNamespace(
            sanity_checking=False, current_epoch=0, is_global_zero=True, global_step=step, loggers=[logger]
        )
        if step == 0:  # the fit's start: the step the MLflow UI's card opens on
            callback.on_train_start(trainer, module)
        else:
            callback.on_validation_batch_end(trainer, module, None, None, 0)
    callback.on_train_start(SimpleNamespace(**{**vars(trainer), "global_step": 7}), module)  # a resume: nothing
    client = MlflowClient(logger.tracking_uri)
    grid = client.download_artifacts(logger.run_id, "samples/step_0000010.png", str(tmp_path))
    from PIL import Image

    assert min(Image.open(grid).size) >= 512  # a 4 x 4 grid of 16-pixel images is 74 pixels across unenlarged
    keyed = [a.path for a in client.list_artifacts(logger.run_id, "images")]
    assert sorted(p.split("+")[2] for p in keyed if p.startswith("images/samples+step+") and p.endswith(".png")) == [
        "0",
        "10",
        "5",
    ], keyed
