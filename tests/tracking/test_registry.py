"""MLflow models of zoo modules: fit -> registered model -> loaded back by name, weights-only, same outputs."""

from __future__ import annotations

import os
import pickle
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, cli
from mlflow.tracking import MlflowClient

from zoo.cnn import ClassifierModule
from zoo.diffusion import FlowEulerSampler
from zoo.io.trust import UntrustedConfigError
from zoo.io.weights import UnsafeCheckpointError
from zoo.tracking import build_module, load_model
from zoo.tracking.downloads import DownloadRefused

TINY = str(CONFIGS / "cnn" / "convnet_digits.yaml")


@pytest.fixture
def registered(digits_fit):
    """The shared one-epoch digits fit (conftest), registered as ``digits`` version 1 with alias ``champion``."""
    return digits_fit.cli, digits_fit.client, digits_fit.version, digits_fit.best


def test_fit_registers_a_logged_model_with_the_runs_evaluation_metrics(registered):
    """An MLflow 3 logged model: on the run's outputs, its version carries its id, and the metrics a model is chosen
    by are linked to it, the monitored one first, with no gradient norms, learning rates or epoch counters."""
    c, client, version, _ = registered
    run = client.get_run(c.trainer.logger.run_id)
    # The SQL registry keeps the link as the version's source (models:/<model_id>), which the UI follows.
    assert version.run_id == run.info.run_id and version.source.startswith("models:/m-"), version.source
    model_id = version.source.removeprefix("models:/")
    assert [o.model_id for o in run.outputs.model_outputs] == [model_id]
    model = client.get_logged_model(model_id)
    assert model.name == "model" and model.source_run_id == run.info.run_id and str(model.status) == "READY"
    keys = [m.key for m in model.metrics]
    assert keys[0] == "val/acc" and {"val/loss", "train/loss"} <= set(keys), keys
    assert not [k for k in keys if k.startswith(("grad", "lr")) or k == "epoch"], keys
    linked = {m.key: m.value for m in model.metrics}
    assert linked["val/acc"] == pytest.approx(run.data.metrics["val/acc"])
    assert float(version.tags["val/acc"]) == linked["val/acc"] and not any(k.startswith("grad") for k in version.tags)
    files = {f.path for f in client.list_logged_model_artifacts(model.model_id)}
    assert {"MLmodel", "artifacts"} <= files and not any(f.endswith(".pkl") for f in files), files
    code = {f.path for f in client.list_logged_model_artifacts(model.model_id, "code/zoo")}
    assert "code/zoo/tracking" in code and not any("__pycache__" in f for f in code), code
    assert run.data.tags["zoo.stage"] == "fit"
    # A staged run: its versions carry the stage; its report card (one column) is logged with it.
    assert version.tags["zoo.pipeline_stage"] == "base" and "zoo.parent_model" not in version.tags
    card = Path(client.download_artifacts(run.info.run_id, "report.md")).read_text().splitlines()
    assert card[0] == "| metric | base |" and any(line.startswith("| val/acc | 0.") for line in card), card
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.parametrize("uri", ["models:/digits/{v}", "models:/digits@champion", "runs:/{run}/model"])
def test_load_by_name_gives_the_checkpoints_outputs(registered, uri):
    c, client, version, best = registered
    uri = uri.format(v=version.version, run=version.run_id)
    x = torch.randn(4, 1, 8, 8)
    ref = ClassifierModule.load_from_checkpoint(best).eval()
    loaded = load_model(uri, client.tracking_uri)
    torch.testing.assert_close(loaded(x), ref(x), rtol=0, atol=0)


def test_validate_from_a_registered_model_equals_the_checkpoint(registered, monkeypatch):
    c, client, version, best = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    by_path = cli("validate", "--config", TINY, f"--ckpt_path={best}", "--trainer.logger=false")
    by_name = cli("validate", "--config", TINY, "--ckpt_path=models:/digits@champion", "--trainer.logger=false")
    assert float(by_name.trainer.callback_metrics["val/acc"]) == float(by_path.trainer.callback_metrics["val/acc"])


def test_a_nested_test_names_its_data_and_fills_the_training_runs_card(registered, monkeypatch):
    """``cli.py test`` of a staged run's model: the evaluation is tagged with the data it scored, and the training
    run's own report.md gains the evaluation's rows (``zoo.tracking.report``)."""
    c, client, version, _ = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    evaluation = cli("test", "--config", TINY, "--ckpt_path=models:/digits/1")
    run = client.get_run(evaluation.trainer.logger.run_id)
    assert run.data.tags["mlflow.parentRunId"] == version.run_id
    assert run.data.tags["zoo.evaluated_on"] == "DigitsDataModule"  # it names no file: its class
    card = Path(client.download_artifacts(version.run_id, "report.md")).read_text().splitlines()
    assert card[0] == "| metric | base |" and any(line.startswith("| val/acc | 0.") for line in card), card
    row = next(line for line in card if line.startswith("| test/acc on DigitsDataModule | "))
    assert row.split("|")[2].strip() == f"{float(evaluation.trainer.callback_metrics['test/acc']):.4g}", row


def test_init_weights_named_by_the_registry_are_downloaded_before_the_module_is_built(registered, monkeypatch):
    """cli.py turns ``models:/`` into the local weights file: the module starts from the registered net."""
    c, client, version, best = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    by_path = cli("validate", "--config", TINY, f"--ckpt_path={best}", "--trainer.logger=false")
    by_name = cli(
        "validate", "--config", TINY, "--model.init_args.init_weights=models:/digits@champion", "--trainer.logger=false"
    )
    assert Path(by_name.model.hparams.init_weights).is_file()  # what the module was given: a local file
    assert float(by_name.trainer.callback_metrics["val/acc"]) == float(by_path.trainer.callback_metrics["val/acc"])


def test_log_model_from_a_checkpoint_adds_a_version_and_keeps_the_first(registered, digits_fit, monkeypatch, capsys):
    from zoo.tracking.__main__ import main as tracking  # ``python -m zoo.tracking``, in this process

    c, client, version, best = registered
    last = digits_fit.last
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    capsys.readouterr()
    tracking(["log-model", str(last), "--registered_model_name=digits"])
    out = capsys.readouterr().out
    assert f"runs:/{version.run_id}/model-last-" in out and "models:/digits/" in out, out
    new = out.strip().rsplit("/", 1)[-1]
    x = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(
        load_model(f"models:/digits/{new}", client.tracking_uri)(x),
        ClassifierModule.load_from_checkpoint(last).eval()(x),
    )
    torch.testing.assert_close(
        load_model(f"models:/digits/{version.version}", client.tracking_uri)(x),
        ClassifierModule.load_from_checkpoint(best).eval()(x),
    )


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_crafted_pickle_in_a_registered_model_is_refused(registered, tmp_path, monkeypatch):
    c, client, version, _ = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    import mlflow

    model = client.get_logged_model(version.source.removeprefix("models:/"))
    # The registered model's folder (MLmodel, artifacts/), as an attacker would copy it to change it.
    evil = Path(mlflow.artifacts.download_artifacts(artifact_uri=model.artifact_location, dst_path=str(tmp_path)))
    for name in ("python_model.pkl", "evil.ckpt"):  # MLflow's pickled-model file name; a checkpoint by name
        (evil / "artifacts" / name).write_bytes(pickle.dumps({"state_dict": {"w": _Exploit()}}))
    client.log_artifacts(version.run_id, str(evil), "model")  # beside the real weights
    client.log_artifacts(version.run_id, str(evil), "copy")  # run files that are no logged model: no manifest
    v = client.create_model_version(
        "digits", f"{client.get_run(version.run_id).info.artifact_uri}/model", version.run_id
    )
    load_model(f"models:/digits/{v.version}", client.tracking_uri)  # reads JSON and safetensors, nothing else
    # runs:/<run>/model names the run's logged model, whose manifest never held it
    with pytest.raises(DownloadRefused, match="manifest recorded when it was logged: artifacts/evil.ckpt added"):
        load_model(f"runs:/{version.run_id}/model/artifacts/evil.ckpt", client.tracking_uri)
    with pytest.raises(UnsafeCheckpointError, match="refused"):
        load_model(f"runs:/{version.run_id}/copy/artifacts/evil.ckpt", client.tracking_uri)
    with pytest.raises(Exception, match="(?s)Weights only load failed|refused"):
        cli(
            "validate",
            "--config",
            TINY,
            f"--ckpt_path=runs:/{version.run_id}/copy/artifacts/evil.ckpt",
            "--trainer.logger=false",
        )
    with pytest.raises(UntrustedConfigError, match="model class_path is 'os.system'"):  # only the zoo's classes
        build_module({"class_path": "os.system", "init_args": {"command": "touch pwned"}})
    assert not Path("pwned").exists() and not list(Path(os.getcwd()).parent.rglob("pwned"))


def test_init_weights_take_a_registered_model(tmp_path, monkeypatch):
    """A GPT (tied head) logged and registered from a checkpoint starts another module's training by name."""
    from zoo.errors import InputError
    from zoo.gpt import GPT, CausalLMModule
    from zoo.tracking import local_weights, log_checkpoint_model

    def net():
        return GPT(vocab_size=17, block_size=8, n_layer=1, n_embd=16, n_head=2)

    uri = f"sqlite:///{tmp_path / 'reg.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    trained = CausalLMModule(net())
    ckpt = tmp_path / "gpt.ckpt"
    torch.save(
        {"state_dict": trained.state_dict(), "hyper_parameters": {"_class_path": "zoo.gpt.CausalLMModule"}}, ckpt
    )
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("init")).info.run_id
    assert log_checkpoint_model(ckpt, client, run_id, "tiny-gpt").endswith("models:/tiny-gpt/1")
    client.set_registered_model_alias("tiny-gpt", "base", "1")
    for name in ("models:/tiny-gpt/1", "models:/tiny-gpt@base", f"runs:/{run_id}/model"):
        # The module reads files: the application (cli.py, or this helper) resolves the registry's names first.
        with pytest.raises(InputError, match=r"MLflow URI.*zoo\.tracking\.local_weights"):
            CausalLMModule(net(), init_weights=name).setup("fit")
        fresh = CausalLMModule(net(), init_weights=local_weights(name))
        fresh.setup("fit")
        for k, v in trained.net.state_dict().items():
            torch.testing.assert_close(fresh.net.state_dict()[k], v, rtol=0, atol=0, msg=f"{name} {k}")


@pytest.mark.parametrize("config", ["gpt/gpt_tiny.yaml", "diffusion/tiny.yaml", "clip/tiny.yaml", "rl/ppo_tiny.yaml"])
def test_every_family_logs_a_model_that_rebuilds_its_module(config):
    """Net, tokenizer and buffers (RL's observation normaliser) travel in the MLflow model's weights and hparams."""
    c = cli("fit", "--config", str(CONFIGS / config), "--trainer.max_steps=2", "--trainer.limit_val_batches=1")
    ck = c.trainer.checkpoint_callback
    saved = torch.load(ck.best_model_path or ck.last_model_path, weights_only=True)["state_dict"]
    loaded = load_model(f"runs:/{c.trainer.logger.run_id}/model", c.trainer.logger.tracking_uri)
    assert type(loaded) is type(c.model)
    if hasattr(c.model, "tokenizer"):  # GPT, CLIP: the tokenizer travels with the model
        assert loaded.tokenizer is not None and loaded.tokenizer.to_dict() == c.model.tokenizer.to_dict()
    assert loaded.state_dict().keys() == saved.keys()
    for k, v in saved.items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0, msg=k)


@pytest.mark.slow
def test_registered_on_a_tracking_server_and_loaded_by_name(mlflow_server, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    c = cli(
        "fit",
        "--config",
        TINY,
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=1",
        "--trainer.logger.init_args.registered_model_name=digits-on-server",
    )
    client = MlflowClient(mlflow_server)
    version = client.search_model_versions("name='digits-on-server'")[0]
    client.set_registered_model_alias("digits-on-server", "champion", version.version)
    ck = c.trainer.checkpoint_callback
    best = ck.best_model_path or ck.last_model_path  # max_steps ends fit before any validation
    x = torch.randn(4, 1, 8, 8)
    ref = ClassifierModule.load_from_checkpoint(best).eval()(x)
    for uri in (f"models:/digits-on-server/{version.version}", "models:/digits-on-server@champion"):
        torch.testing.assert_close(load_model(uri)(x), ref, rtol=0, atol=0)

    # predict on new files by name alone (no config), into a child run on the server holding the CSV
    from PIL import Image

    files = tmp_path_factory.mktemp("server_files")
    for i in range(3):
        Image.fromarray((torch.rand(8, 8) * 255).to(torch.uint8).numpy()).save(files / f"{i}.png")
    by_name = cli("predict", "--ckpt_path", "models:/digits-on-server@champion", f"--data.init_args.paths={files}")
    by_file = cli("predict", "--ckpt_path", best, f"--data.init_args.paths={files}")
    run = client.get_run(by_name.trainer.logger.run_id)
    assert run.data.tags["mlflow.parentRunId"] == c.trainer.logger.run_id
    csvs = [
        Path(
            client.download_artifacts(
                p.trainer.logger.run_id, "predictions/predictions.csv", str(tmp_path_factory.mktemp("dl"))
            )
        ).read_text()
        for p in (by_name, by_file)
    ]
    assert csvs[0] == csvs[1] and len(csvs[0].splitlines()) == 4


def test_the_process_wide_tracking_uri_is_put_back_as_it_was(monkeypatch, tmp_path):
    """Registering and downloading set MLflow's process-wide URI for the call (MLflow looks logged models up there);
    afterwards it and $MLFLOW_TRACKING_URI are as before, set or not, or later runs would go to another store."""
    import mlflow

    from zoo.tracking.models import process_tracking_uri

    other = f"sqlite:///{tmp_path / 'other.db'}"
    for env, global_uri in ((None, None), ("sqlite:///env.db", None), (None, "sqlite:///global.db")):
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        if env:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", env)
        mlflow.set_tracking_uri(global_uri)  # which sets the variable too (for subprocesses)
        variable = os.environ.get("MLFLOW_TRACKING_URI")
        with process_tracking_uri(other):
            assert mlflow.get_tracking_uri() == other
        assert os.environ.get("MLFLOW_TRACKING_URI") == variable
        assert mlflow.get_tracking_uri() == (global_uri or env or mlflow.get_tracking_uri())
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///later.db")  # a later change of the variable counts
        assert mlflow.get_tracking_uri() == (global_uri or "sqlite:///later.db")
    mlflow.set_tracking_uri(None)


def test_two_registered_models_resolve_to_their_own_checkpoints(tmp_path, monkeypatch):
    """``--ckpt_path models:/...`` converts each downloaded model to a checkpoint of its own (a shared one gave the
    second model the first's class and weights)."""
    from zoo.gpt import GPT, CausalLMModule
    from zoo.tracking import log_checkpoint_model
    from zoo.tracking.models import resolve_checkpoint

    uri = f"sqlite:///{tmp_path / 'two.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("two")).info.run_id
    for name, vocab in (("first", 11), ("second", 13)):
        module = CausalLMModule(GPT(vocab_size=vocab, block_size=8, n_layer=1, n_embd=16, n_head=2))
        ckpt = tmp_path / f"{name}.ckpt"
        torch.save(
            {"state_dict": module.state_dict(), "hyper_parameters": {"_class_path": "zoo.gpt.CausalLMModule"}}, ckpt
        )
        log_checkpoint_model(ckpt, client, run_id, name)
    for name, vocab in (("first", 11), ("second", 13)):
        state = torch.load(resolve_checkpoint(f"models:/{name}/1", uri), weights_only=True)["state_dict"]
        assert state["net.tok_emb.weight"].shape[0] == vocab, name


def test_a_latent_diffusion_model_requires_diffusers_and_answers_with_decoded_images():
    """Its autoencoder is built from a class path, which no import of the logged code names: its requirements list
    diffusers all the same, and its pyfunc answers with the decoded 16-pixel RGB images, not the 8x8 latents."""
    import io

    import mlflow
    import pandas as pd
    from PIL import Image

    from zoo.tracking import load
    from zoo.tracking.models import process_tracking_uri

    latent = str(CONFIGS / "diffusion" / "latent_tiny.yaml")
    c = cli("fit", "--config", latent, "--trainer.max_steps=1", "--trainer.limit_val_batches=1")
    uri, store = f"runs:/{c.trainer.logger.run_id}/model", c.trainer.logger.tracking_uri
    # Read as MLflow reads it (the zoo's own downloads fetch only what its loaders read).
    with process_tracking_uri(store):
        got = mlflow.artifacts.download_artifacts(f"{uri}/requirements.txt", tracking_uri=store)
    requirements = Path(got).read_text().splitlines()
    assert any(r.startswith("diffusers==") for r in requirements), requirements
    answer = load(uri, store).predict(pd.DataFrame({"label": [1, 2], "seed": [0, 0]}), params={"steps": 2})
    images = [Image.open(io.BytesIO(png)) for png in answer["image"]]
    assert [(im.size, im.mode) for im in images] == [((16, 16), "RGB")] * 2
    want = c.model.eval().sample(2, partial(FlowEulerSampler, steps=2), seed=0, labels=[1, 2]) * 0.5 + 0.5
    got = torch.stack([torch.tensor(list(im.getdata())).T.reshape(3, 16, 16) for im in images]) / 255
    torch.testing.assert_close(got, want, atol=1 / 255 + 1e-6, rtol=0)


def test_a_registered_version_shows_on_its_logged_model_as_mlflows_register_model_shows_it(registered):
    """The logged model's page reads the ``mlflow.modelVersions`` tag to say "Registered" and link the version;
    the zoo's registration leaves the same tag that ``mlflow.register_model`` leaves on a model it registers."""
    import json

    import mlflow
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    from zoo.tracking.models import process_tracking_uri

    _, client, version, _ = registered
    model_id = version.source.removeprefix("models:/")
    zoo_tag = json.loads(client.get_logged_model(model_id).tags[MLFLOW_MODEL_VERSIONS])
    assert {"name": version.name, "version": int(version.version)} in zoo_tag
    with process_tracking_uri(client.tracking_uri):  # MLflow's own, on the same logged model, under another name
        theirs = mlflow.register_model(f"models:/{model_id}", f"{version.name}-by-mlflow")
    after = json.loads(client.get_logged_model(model_id).tags[MLFLOW_MODEL_VERSIONS])
    assert after == [*zoo_tag, {"name": theirs.name, "version": theirs.version}]  # the same shape, appended
