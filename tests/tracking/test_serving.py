"""A logged model answers raw inputs as the CLI's predict does: the same numbers through ``mlflow.pyfunc.load_model``,
``zoo.tracking.load`` and ``cli.py predict``; its requirements, signature and input example are logged with it."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from functools import partial
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import CONFIGS, ROOT, cli, output
from mlflow.exceptions import MlflowException
from PIL import Image

from zoo.diffusion.samplers import DDIMSampler
from zoo.tracking import load
from zoo.tracking.models import canonical, model_requirements

IMPORT = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)[\w.]*(?:\s+import\s|\s*$|\s+as\s|,)", re.M)


def _fit(config: str, *args: str):
    """A tiny fit whose MLflow model the tests load: (LightningCLI, runs:/ URI, last checkpoint)."""
    c = cli("fit", "--config", str(CONFIGS / config), "--trainer.max_steps=2", "--trainer.limit_val_batches=1", *args)
    last = str(Path(c.trainer.checkpoint_callback.last_model_path).resolve())
    return c, f"runs:/{c.trainer.logger.run_id}/model", last


def _both(uri: str, tracking_uri: str):
    """The model as MLflow loads it (running its logged code) and as ``zoo.tracking.load`` does (this zoo's)."""
    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.pyfunc.load_model(uri), load(uri, tracking_uri)


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _csv_rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def test_requirements_name_every_distribution_the_logged_code_imports_pinned_at_the_lock():
    """Read independently of ``model_requirements``: each top-level import of zoo/ (a regex, not its AST walk) is
    provided by a required distribution (by the distribution's own file list), pinned as constraints.txt pins it."""
    from importlib.metadata import distribution
    from sys import stdlib_module_names

    required = model_requirements(ROOT / "zoo", ROOT)
    pins = dict(re.fullmatch(r"([\w.-]+)(?:\[[\w,]+\])?==(\S+)", r).groups() for r in required)
    lock = dict(
        (canonical(n), v) for n, v in re.findall(r"^([\w.-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    )
    assert pins == {n: lock[n] for n in pins}, "requirements pinned off the lock"
    provided = set()
    for name in pins:
        for f in distribution(name).files or []:
            top = f.parts[0].removesuffix(".py")
            if not top.endswith((".dist-info", ".data")) and top != "..":
                provided.add(top)
    imported = set()
    for path in (ROOT / "zoo").rglob("*.py"):
        imported |= set(IMPORT.findall(path.read_text()))
    own = {"zoo", "callbacks", "datamodules", "cli"}  # the project's: zoo/ is logged, the application never imported
    missing = imported - set(stdlib_module_names) - own - provided
    assert not missing, f"the logged code imports {missing}, which no requirement provides"
    assert "jsonargparse[signatures]" in " ".join(required) and "fsspec[http]" in " ".join(required)
    for needed in ("torchvision", "tokenizers", "gymnasium", "pillow", "torch", "mlflow"):
        assert needed in pins, needed


@pytest.fixture(scope="module")
def cnn(tmp_path_factory, digits_fit):
    # The suite's one-epoch CNN fit (conftest), by its registered version: its logged model, which no test changes.
    c, uri, last = digits_fit.cli, f"models:/digits/{digits_fit.version.version}", str(digits_fit.last)
    files = tmp_path_factory.mktemp("digits")
    g = torch.Generator().manual_seed(0)
    for i in range(3):
        Image.fromarray((torch.rand(8, 8, generator=g) * 255).byte().numpy()).save(files / f"{i}.png")
    return c, uri, last, files


def test_cnn_answers_image_bytes_with_classes_as_the_cli_predict_does(cnn):
    c, uri, last, files = cnn
    cli("predict", "--ckpt_path", last, f"--data.init_args.paths={files}", "--trainer.logger=false")
    by_cli = _csv_rows(output("predictions.csv"))
    served, local = _both(uri, c.trainer.logger.tracking_uri)
    images = [(files / f"{i}.png").read_bytes() for i in range(3)]
    arrays = [np.asarray(Image.open(files / f"{i}.png")) for i in range(3)]
    answers = [
        served.predict(pd.DataFrame({"image": images})),
        local.predict(pd.DataFrame({"image": images})),
        local.predict({"image": [base64.b64encode(b) for b in images]}),  # JSON's base64, as "inputs" passes it on
        local.predict({"image": arrays}),  # uint8 arrays (Python)
    ]
    for out in answers:
        assert list(out["class"]) == [r["class"] for r in by_cli]
        assert list(out["class_5"]) == [r["class_5"] for r in by_cli]
        np.testing.assert_allclose(out["confidence"], [float(r["confidence"]) for r in by_cli], rtol=1e-5)
    names = c.datamodule.class_names
    assert set(answers[0]["class"]) <= set(names)  # names, not indices
    two = served.predict(pd.DataFrame({"image": images}), params={"top_k": 2})
    assert [k for k in two.columns if k.startswith("class")] == ["class", "class_2"]
    with pytest.raises(MlflowException, match="not an image"):
        served.predict(pd.DataFrame({"image": [b"not an image"]}))


def test_cnn_model_logs_its_signature_example_and_requirements(cnn):
    c, uri, _, _ = cnn
    local = Path(mlflow.artifacts.download_artifacts(uri, tracking_uri=c.trainer.logger.tracking_uri))
    meta = mlflow.models.Model.load(str(local))
    assert meta.signature.inputs.input_names() == ["image"] and meta.signature.params.params[0].name == "top_k"
    example = json.loads((local / "serving_input_example.json").read_text())
    assert set(example) == {"dataframe_split"}
    requirements = (local / "requirements.txt").read_text().split()
    assert requirements[:-2] == model_requirements(ROOT / "zoo", ROOT)
    assert requirements[-2:] == ["-c", "constraints.txt"]
    constraints = (local / "constraints.txt").read_text()
    assert "mlflow-skinny==" in constraints and "stable-baselines3" not in constraints.lower()  # pulled in only


@pytest.mark.slow  # a fit and a CLI predict: tens of seconds
def test_gpt_continues_prompts_with_generation_params_as_the_cli_predict_does():
    c, uri, last = _fit("gpt/gpt_tiny.yaml", "--trainer.limit_val_batches=0")
    prompts = ["ab", "", "the "]
    cli(
        "predict",
        "--config",
        str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
        "--ckpt_path",
        last,
        f"--data.init_args.prompts={json.dumps(prompts)}",
        "--model.init_args.generation.max_new_tokens=6",
        "--model.init_args.generation.temperature=0.9",
        "--model.init_args.generation.top_k=5",
        "--model.init_args.generation.seed=3",
        "--trainer.logger=false",
    )
    by_cli = [json.loads(line)["completion"] for line in output("predictions.jsonl").read_text().splitlines()]
    params = {"max_new_tokens": 6, "temperature": 0.9, "top_k": 5, "seed": 3}
    for model in _both(uri, c.trainer.logger.tracking_uri):
        out = model.predict(pd.DataFrame({"prompt": prompts}), params=params)
        assert list(out["completion"]) == by_cli and list(out["prompt"]) == prompts
    other = model.predict(pd.DataFrame({"prompt": prompts}), params={**params, "seed": 4})
    assert list(other["completion"]) != by_cli  # the seed is the request's
    greedy = model.predict(pd.DataFrame({"prompt": ["ab"]}), params={"temperature": 0.0, "max_new_tokens": 4})
    assert greedy["completion"][0] == c.model.generate(["ab"], max_new_tokens=4, temperature=0)[0]
    penalized = {"temperature": 0.0, "max_new_tokens": 8, "repetition_penalty": 1.5}
    theirs = c.model.generate(["ab"], max_new_tokens=8, temperature=0, repetition_penalty=1.5)[0]
    assert model.predict(pd.DataFrame({"prompt": ["ab"]}), params=penalized)["completion"][0] == theirs
    with pytest.raises(MlflowException, match="temperature"):
        model.predict(pd.DataFrame({"prompt": ["ab"]}), params={"temperature": -1.0})


@pytest.mark.slow  # a fit and a CLI predict: tens of seconds
def test_diffusion_draws_the_pngs_the_cli_predict_draws_for_the_same_labels_and_seeds():
    c, uri, last = _fit("diffusion/tiny.yaml", "--trainer.max_steps=10")  # past a blank net's saturated samples
    cli(
        "predict",
        "--ckpt_path",
        last,
        "--data.init_args.num_samples=4",
        "--data.init_args.batch_size=2",
        "--data.init_args.labels=[1, 3]",
        "--data.init_args.seed=5",
        "--model.init_args.sampler.init_args.steps=3",
        "--trainer.logger=false",
    )
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    by_cli = [np.asarray(Image.open(r["image"])) for r in rows]
    factor = by_cli[0].shape[0] // 8  # the CLI enlarges 8 px samples for viewing, nearest-neighbour
    request = pd.DataFrame({"label": [1, 3, 1, 3], "seed": [5, 5, 6, 6]})  # CLI batch i: seed 5 + i
    for model in _both(uri, c.trainer.logger.tracking_uri):
        out = model.predict(request, params={"steps": 3})
        assert list(out["seed"]) == [5, 5, 6, 6] and list(out["label"]) == [1, 3, 1, 3]
        for png, expected in zip(out["image"], by_cli):
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), expected[::factor, ::factor])
    # The sampler's settings are the request's: 5 steps answer what the module's own sample() draws with 5.
    five = model.predict(request[:2], params={"steps": 5, "guidance_scale": 2.0})
    module = c.model.eval()
    for steps, answer in ((5, five), (3, out)):
        ref = module.sample(2, partial(DDIMSampler, steps=steps), 2.0 if steps == 5 else None, 5, [1, 3])
        pixels = ((ref * 0.5 + 0.5).clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).numpy()
        for png, expected in zip(answer["image"], pixels):
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), expected)
    assert five["image"][0] != out["image"][0]
    with pytest.raises(MlflowException, match="label"):
        model.predict(pd.DataFrame({"label": [99], "seed": [0]}))


@pytest.mark.slow  # a fit and a CLI predict: tens of seconds
def test_clip_embeds_and_classifies_as_the_cli_predict_does(tmp_path):
    c, uri, last = _fit("clip/tiny.yaml")
    g = torch.Generator().manual_seed(0)
    for i in range(2):
        Image.fromarray((torch.rand(32, 32, 3, generator=g) * 255).byte().numpy()).save(tmp_path / f"{i}.png")
    names = "--data.init_args.class_names=[circle, ring]"
    cli("predict", "--ckpt_path", last, f"--data.init_args.paths={tmp_path}", names, "--trainer.logger=false")
    by_cli = _csv_rows(output("predictions.csv"))
    texts = ["a red circle", "a blue ring"]
    text_args = ("--data.init_args.predict=text_embeddings", f"--data.init_args.texts={texts}")
    cli("predict", "--ckpt_path", last, *text_args, "--trainer.logger=false")
    text_emb = np.load(output("predictions.embedding.npy"))
    images = [(tmp_path / f"{i}.png").read_bytes() for i in range(2)]
    for model in _both(uri, c.trainer.logger.tracking_uri):
        out = model.predict(pd.DataFrame({"image": images}), params={"labels": ["circle", "ring"]})
        assert list(out["class"]) == [r["class"] for r in by_cli]
        np.testing.assert_allclose(out["confidence"].astype(float), [float(r["confidence"]) for r in by_cli], rtol=1e-5)
        emb = np.stack(out["image_embedding"])
        np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)  # normalised
        got = model.predict(pd.DataFrame({"text": texts}))
        np.testing.assert_allclose(np.stack(got["text_embedding"]), text_emb, rtol=1e-5, atol=1e-6)
    # A row with only a text and one with only an image: each answers what it has.
    mixed = model.predict(pd.DataFrame({"image": [None, images[0]], "text": [texts[0], None]}))
    assert mixed["image_embedding"][0] is None and mixed["text_embedding"][1] is None
    np.testing.assert_allclose(mixed["text_embedding"][0], text_emb[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mixed["image_embedding"][1], emb[0], rtol=1e-5, atol=1e-6)


def test_rl_answers_observations_with_the_deterministic_actions_of_the_normalised_policy():
    c, uri, _ = _fit("rl/td3_tiny.yaml")  # continuous actions: the normaliser shows in every one
    module = c.model.eval()
    rms = module.obs_rms
    assert float(rms.count) > 1  # statistics to apply
    obs = (np.random.default_rng(0).normal(size=(16, 3)) * 3).astype(np.float32)
    x = np.clip((obs - rms.mean.numpy()) / np.sqrt(rms.var.numpy() + 1e-8), -rms.clip, rms.clip)
    expected = module.net.act(torch.as_tensor(x, dtype=torch.float32)).detach().numpy()
    raw = module.net.act(torch.as_tensor(obs, dtype=torch.float32)).detach().numpy()
    assert not np.allclose(expected, raw, atol=1e-3)
    for model in _both(uri, c.trainer.logger.tracking_uri):
        np.testing.assert_allclose(model.predict(obs), expected, rtol=1e-5, atol=1e-6)
    assert model.metadata.signature.inputs.inputs[0].type == np.dtype(np.float32)
    with pytest.raises(MlflowException, match="shape"):
        model.predict(np.zeros((2, 5), dtype=np.float32))


def test_defining_the_pyfunc_prints_no_warning():
    """MLflow checks a PythonModel's ``predict`` hints when the class is defined, i.e. on every fit that logs a
    model; without a hint it prints an "add type hints" UserWarning that no user can act on."""
    import os
    import subprocess
    import sys

    code = "import warnings; warnings.simplefilter('always', UserWarning); import zoo.tracking.serving"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]


def _logged_byte_gpt(folder: Path) -> tuple[str, str, object]:
    """A tiny byte-level GPT logged to a store of its own: (tracking URI, MLflow's ``models:/<model id>``, module)."""
    from mlflow.tracking import MlflowClient

    from zoo.gpt import GPT, CausalLMModule
    from zoo.io.tokenizers import ByteTokenizer
    from zoo.tracking import log_checkpoint_model

    net = {"vocab_size": 257, "block_size": 16, "n_layer": 1, "n_embd": 16, "n_head": 2}
    torch.manual_seed(0)
    module = CausalLMModule(GPT(**net))
    module.tokenizer = ByteTokenizer()
    hparams = {"_class_path": "zoo.gpt.CausalLMModule", "net": {"class_path": "zoo.gpt.GPT", "init_args": net}}
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": hparams}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, folder / "gpt.ckpt")
    uri = f"sqlite:///{folder / 'store.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("bytes", artifact_location=(folder / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    mlflow.set_tracking_uri(uri)
    log_checkpoint_model(folder / "gpt.ckpt", client, run_id)
    (model,) = mlflow.search_logged_models(experiment_ids=[experiment], output_format="list")
    return uri, model.model_uri, module.eval()


def test_gpt_answers_a_plain_list_of_prompts_in_python_by_mlflows_own_model_uri(tmp_path):
    uri, model_uri, module = _logged_byte_gpt(tmp_path)
    assert re.fullmatch(r"models:/m-[0-9a-f]+", model_uri)  # as MLflow prints a logged model
    greedy = {"temperature": 0.0, "max_new_tokens": 4}
    want = module.generate(["ab", "the "], max_new_tokens=4, temperature=0)
    model = load(model_uri, uri)
    assert list(model.predict(["ab", "the "], params=greedy)["completion"]) == want  # filled into prompt in Python
    assert list(model.predict("ab", params=greedy)["completion"]) == want[:1]
    assert list(model.predict(pd.DataFrame({"prompt": ["ab", "the "]}), params=greedy)["completion"]) == want
    # MLflow's own pyfunc turns a dict of lists of strings into one row of lists: answered row by row all the same
    mlflow_model = mlflow.pyfunc.load_model(model_uri)
    out = mlflow_model.predict({"prompt": ["ab", "the "]}, params=greedy)
    assert list(out["prompt"]) == ["ab", "the "] and list(out["completion"]) == want
    with pytest.raises(Exception, match="not found|does not exist|No Model|m-0+"):
        load("models:/m-00000000000000000000000000000000", uri)
