"""The CLIP family through cli.py: fit with zero-shot and retrieval in MLflow, predict from the checkpoint."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS, cli, output
from mlflow.tracking import MlflowClient

from zoo.clip import ContrastiveModule

TINY = str(CONFIGS / "clip" / "tiny.yaml")
METRICS = ["val/loss", "val/zeroshot_acc", "val/zeroshot_acc_top5", "val/recall_1", "val/logit_scale"] + [
    f"val/{d}_recall_{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)
]


pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(path: str = "predictions.csv") -> list[dict]:
    return list(csv.DictReader(output(path).read_text().splitlines()))


def test_tiny_fits_into_mlflow_then_predicts_from_its_checkpoint(tmp_path):
    c = cli("fit", "--config", TINY)
    for key in METRICS:
        assert torch.isfinite(c.trainer.callback_metrics[key]), key
    client = MlflowClient(c.trainer.logger.tracking_uri)
    run = client.get_run(c.trainer.logger.run_id).data
    assert run.tags["zoo.family"] == "clip" and "val/zeroshot_acc" in run.metrics and "val/t2i_recall_10" in run.metrics
    last = c.trainer.checkpoint_callback.last_model_path
    num_val = c.datamodule.hparams.num_val

    # Zero-shot on the held-out split against classes named on the command line.
    cli("predict", "--config", TINY, "--ckpt_path", last, "--data.init_args.class_names=[circle, ring]")
    rows = _rows()
    assert len(rows) == num_val and {r["class"] for r in rows} <= {"circle", "ring"}
    assert all(0.5 <= float(r["confidence"]) <= 1.0 for r in rows)

    # ... and on a folder of image files.
    from PIL import Image

    for i in range(3):
        Image.new("RGB", (40, 40), (200, 30 * i, 0)).save(tmp_path / f"{i}.png")
    cli("predict", "--config", TINY, "--ckpt_path", last, f"--data.init_args.predict_path={tmp_path}")
    rows = _rows()
    assert [Path(r["path"]).name for r in rows] == ["0.png", "1.png", "2.png"]
    assert all(r["class"] in c.datamodule.class_names for r in rows)

    # Image embeddings: an array of unit vectors, a row per image, beside the CSV naming the rows.
    cli("predict", "--config", TINY, "--ckpt_path", last, "--data.init_args.predict=image_embeddings")
    table = np.load(output("predictions.embedding.npy"))
    assert table.shape == (num_val, 32) and len(_rows()) == num_val
    np.testing.assert_allclose(np.linalg.norm(table, axis=1), 1.0, atol=1e-4)

    # Text embeddings equal what the checkpoint alone computes (net and tokenizer from the file).
    texts = ["a small red circle in the center", "a large blue ring on the left"]
    cli(
        "predict",
        "--config",
        TINY,
        "--ckpt_path",
        last,
        "--data.init_args.predict=text_embeddings",
        f"--data.init_args.texts={json.dumps(texts)}",
    )
    rows = _rows()
    assert [r["text"] for r in rows] == texts
    module = ContrastiveModule.load_from_checkpoint(last).eval()
    torch.testing.assert_close(
        module.embed_texts(texts), torch.from_numpy(np.load(output("predictions.embedding.npy")))
    )


@pytest.mark.slow  # 300 steps, ~65 s: CI's slow suite runs it
def test_short_cpu_fit_on_shapes_is_far_above_chance():
    # Measured (seed 0, 300 steps, about a minute): zero-shot 0.34 against a chance of 1/6, recall@1 0.69
    # (i2t 0.68, t2i 0.70) against a chance of 0.004 (500 held-out pairs; some captions repeat).
    c = cli("fit", "--config", str(CONFIGS / "clip" / "convnet_shapes.yaml"))
    m = c.trainer.callback_metrics
    assert m["val/zeroshot_acc"] > 0.25
    assert m["val/recall_1"] > 0.45 and m["val/i2t_recall_1"] > 0.4 and m["val/t2i_recall_1"] > 0.4


@pytest.fixture
def hf_clip_folder(tmp_path) -> Path:
    """A tiny random Hugging Face CLIP with a BPE tokenizer.json of its own vocabulary, as save_pretrained writes."""
    transformers = pytest.importorskip("transformers")
    from zoo.io.tokenizers import BPETokenizer

    folder = tmp_path / "hf_clip"
    captions = [
        f"a {c} {s} on a {b} background"
        for c in ("red", "blue", "green")
        for s in ("cat", "dog")
        for b in ("dark", "light")
    ]
    tok = BPETokenizer.train(captions * 5, vocab_size=300)
    tok.save(folder)
    torch.manual_seed(0)
    eos = tok.eos_id
    config = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=tok.vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=24,
            eos_token_id=eos,
            bos_token_id=eos,
            pad_token_id=eos,
        ),
        vision_config=dict(
            image_size=16,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=16,
    )
    transformers.CLIPModel(config).save_pretrained(folder)
    return folder


@pytest.fixture
def caption_csv(tmp_path) -> Path:
    from PIL import Image

    rows = ["image,caption"]
    for i in range(8):
        Image.new("RGB", (24, 20), (30 * i, 100, 255 - 30 * i)).save(tmp_path / f"{i}.png")
        rows.append(f"{i}.png,a {('red', 'blue')[i % 2]} {('cat', 'dog')[i // 4]} on a dark background")
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    return tmp_path / "pairs.csv"


def test_finetune_preset_starts_from_hf_weights_and_tokenizer_on_a_csv(hf_clip_folder, caption_csv):
    import yaml

    from zoo.clip.hf import hf_to_zoo, zoo_yaml
    from zoo.io.weights import load_file

    net = yaml.safe_load(zoo_yaml(hf_clip_folder))["net"]
    args = [  # the preset's net is the folder's (zoo.app.pretrained): no net block
        "--config",
        str(CONFIGS / "clip" / "finetune_csv.yaml"),
        f"--model.init_args.init_weights={hf_clip_folder}",
        f"--data.init_args.pretrained_tokenizer={hf_clip_folder}",
        f"--data.init_args.path={caption_csv}",
        "--data.init_args.image_size=16",
        "--data.init_args.context_length=24",
        "--data.init_args.val_fraction=0.5",
        "--data.init_args.batch_size=4",
        "--data.init_args.num_workers=0",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
    ]
    c = cli("validate", *args)
    expected = hf_to_zoo(load_file(hf_clip_folder / "model.safetensors"))
    for k, v in c.model.net.state_dict().items():
        torch.testing.assert_close(v, expected[k], msg=k)
    assert c.model.tokenizer.vocab_size == net["init_args"]["text_encoder"]["init_args"]["vocab_size"]
    assert torch.isfinite(c.trainer.callback_metrics["val/recall_1"])
    c = cli("fit", *args, "--trainer.fast_dev_run=2")
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])


@pytest.mark.slow
def test_ddp_and_fsdp2_on_two_processes_evaluate_the_same_gathered_pairs():
    from conftest import run_cli

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    metrics = []
    for piece in ("ddp.yaml", "fsdp.yaml"):
        proc = run_cli(
            "fit",
            "--config",
            TINY,
            "--config",
            str(CONFIGS / "trainer" / piece),
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
            env={"OMP_NUM_THREADS": "1"},
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        experiments = [e.experiment_id for e in client.search_experiments()]
        run = client.search_runs(experiments, order_by=["attributes.start_time DESC"])[0]
        metrics.append(run.data.metrics)
    ddp, fsdp = metrics
    # The loss saw both ranks' 32 pairs: a batch of 64, so it starts near ln 64, not ln 32.
    assert abs(ddp["val/loss"] - math.log(64)) < 0.3
    for key in ("val/loss", "val/recall_1", "val/zeroshot_acc"):
        assert ddp[key] == pytest.approx(fsdp[key], abs=1e-3), key
