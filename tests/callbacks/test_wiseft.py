"""callbacks.WiseFT through cli.py: the sweep's table and plot in MLflow, its ends equal to the start's and the
fine-tuned weights' own scores, and the registered (and tested) weights the interpolation at the chosen alpha."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, cli
from lightning.pytorch import Trainer
from mlflow.tracking import MlflowClient
from safetensors.torch import save_file

from callbacks import WiseFT
from datamodules import CaptionDataModule
from zoo.adapt.wise import interpolate
from zoo.clip import ContrastiveModule
from zoo.errors import InputError
from zoo.io.weights import extract_state_dict, load_file
from zoo.tracking import load_model

WISE = str(CONFIGS / "clip" / "wiseft_tiny.yaml")
DIGITS, PIECE = str(CONFIGS / "cnn" / "convnet_digits.yaml"), str(CONFIGS / "trainer" / "wiseft.yaml")

pytestmark = pytest.mark.usefixtures("one_thread")


def wise_of(trainer) -> WiseFT:
    return next(cb for cb in trainer.callbacks if isinstance(cb, WiseFT))


def scores(module, datamodule) -> float:
    """Zero-shot accuracy by a plain Trainer of its own: not the sweep's code path."""
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    return trainer.validate(module, datamodule=datamodule, verbose=False)[0]["val/zeroshot_acc"]


@pytest.mark.slow  # a cli.py fit into MLflow (~15 s): the default suite keeps under 10 minutes
def test_clip_sweep_logs_table_and_plot_and_registers_the_chosen_point(tmp_path):
    from cli import main

    start = tmp_path / "start.safetensors"
    fresh = main(["--config", WISE, "--seed_everything=1"], run=False).model.net  # not the fine-tune's own init
    save_file({k: v.contiguous() for k, v in fresh.state_dict().items()}, start)

    c = cli(
        "fit",
        "--config",
        WISE,
        f"--model.init_args.init_weights={start}",
        "--trainer.logger.init_args.registered_model_name=wise",
    )
    wise, run_id = wise_of(c.trainer), c.trainer.logger.run_id
    client = MlflowClient(c.trainer.logger.tracking_uri)
    assert {a.path for a in client.list_artifacts(run_id, "wiseft")} == {"wiseft/table.json", "wiseft/scores.png"}
    table = json.loads(Path(client.download_artifacts(run_id, "wiseft/table.json", str(tmp_path))).read_text())
    assert table["columns"] == ["alpha", "val/zeroshot_acc", "val/source/zeroshot_acc"]
    rows = {r[0]: r[1:] for r in table["data"]}
    assert sorted(rows) == [0.0, 0.5, 1.0] and client.get_run(run_id).data.params["wiseft/alpha"] == str(
        wise.chosen_alpha
    )

    # The ends, scored apart from the sweep: the start's weights and the fit's last checkpoint, on both tasks.
    last = c.trainer.checkpoint_callback.last_model_path
    source = CaptionDataModule(**{k: v for k, v in wise.source.hparams.items() if not k.startswith("_")})
    for alpha, weights in ((0.0, extract_state_dict(load_file(start))), (1.0, None)):
        module = ContrastiveModule.load_from_checkpoint(last)
        if weights is not None:
            module.net.load_state_dict(weights)
        assert rows[alpha] == [scores(module, c.datamodule), scores(module, source)], alpha

    # What registers is theta(chosen alpha), tensor for tensor, with the chosen point's scores.
    registered = load_model("models:/wise/1").state_dict()
    tuned = load_file(last)["state_dict"]
    expected = interpolate({f"net.{k}": v for k, v in load_file(start).items()}, tuned, wise.chosen_alpha)
    assert registered.keys() == expected.keys()
    assert all(torch.equal(registered[k], expected[k]) for k in expected)
    target, kept = rows[wise.chosen_alpha]
    version = client.get_model_version("wise", "1")
    assert float(version.tags["val/zeroshot_acc"]) == target and float(version.tags["val/source/zeroshot_acc"]) == kept


@pytest.mark.filterwarnings("ignore:Resuming with another learning-rate schedule")
@pytest.mark.slow  # a cli.py fit into MLflow (~15 s): the default suite keeps under 10 minutes
def test_cnn_sweep_on_its_family_metric_is_tested_and_resumes_with_its_start():
    first = cli("fit", "--config", DIGITS, "--config", PIECE, "--trainer.max_epochs=1", "--test_after_fit=true")
    wise = wise_of(first.trainer)
    assert first.trainer.ckpt_path == wise.chosen_path and "test/acc" in first.trainer.callback_metrics
    assert list(wise.table) == ["alpha", "val/acc"] and len(wise.table["alpha"]) == 5
    client, run_id = MlflowClient(first.trainer.logger.tracking_uri), first.trainer.logger.run_id
    history = client.get_metric_history(run_id, "val/acc")
    fitted = min((m for m in history if m.step == first.trainer.global_step), key=lambda m: m.timestamp)
    assert wise.table["val/acc"][-1] == fitted.value  # alpha 1: the fit's last score
    assert max(wise.table["val/acc"]) == wise.table["val/acc"][wise.table["alpha"].index(wise.chosen_alpha)]
    last = first.trainer.checkpoint_callback.last_model_path
    ends = json.dumps({"class_path": "callbacks.WiseFT", "init_args": {"alphas": [0, 1]}})
    again = cli(
        "fit", "--config", DIGITS, f"--trainer.callbacks+={ends}", "--trainer.max_epochs=2", f"--ckpt_path={last}"
    )
    resumed = wise_of(again.trainer)
    assert resumed._start.keys() == wise._start.keys()
    assert all(torch.equal(resumed._start[k], wise._start[k]) for k in wise._start)  # the first fit's start


def test_alphas_without_both_ends_are_refused():
    with pytest.raises(InputError, match=r"hold 0 \(the start\) and 1"):
        WiseFT(alphas=(0.5, 1.0))


def test_a_resume_without_the_start_is_refused():
    from types import SimpleNamespace

    with pytest.raises(InputError, match="resumes at step 5 from a checkpoint written without WiseFT"):
        WiseFT().on_train_start(SimpleNamespace(global_step=5), torch.nn.Linear(2, 2))
