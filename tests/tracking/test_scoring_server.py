"""A logged model behind MLflow's real scoring server (``mlflow models serve --env-manager local``): requests in each of
MLflow's documented JSON formats get the answers ``zoo.tracking.load(...).predict`` gives in-process; a bad request
gets MLflow's 400 naming the expected input. The CNN in the default suite (one server for this module); every other
family in the slow tests, one server each."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import CONFIGS, cli, free_port, stop_server
from PIL import Image

from zoo.tracking import load


def _model(config: str, *args: str) -> tuple[Path, object]:
    """A tiny fit's MLflow model folder (downloaded) and the model as ``zoo.tracking.load`` gives it."""
    c = cli("fit", "--config", str(CONFIGS / config), "--trainer.max_steps=2", "--trainer.limit_val_batches=1", *args)
    uri, store = f"runs:/{c.trainer.logger.run_id}/model", c.trainer.logger.tracking_uri
    return Path(mlflow.artifacts.download_artifacts(uri, tracking_uri=store)), load(uri, store)


def _serve(model_dir: Path, home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", str(model_dir), "--env-manager", "local"]
    cmd += ["-h", "127.0.0.1", "-p", str(port)]
    log = open(home / "serve.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=home, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"mlflow models serve did not start:\n{(home / 'serve.log').read_text()[-3000:]}")


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{url}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def served_cnn(tmp_path_factory):
    home = tmp_path_factory.mktemp("serve_cnn")
    model_dir, local = _model("cnn/convnet_digits.yaml")
    proc, url = _serve(model_dir, home)
    try:
        yield url, local
    finally:
        stop_server(proc)


def _pngs(n: int, side: int, channels: int = 1) -> list[bytes]:
    import io

    g, out = torch.Generator().manual_seed(1), []
    for _ in range(n):
        pixels = (torch.rand(side, side, channels, generator=g) * 255).byte().numpy()
        buf = io.BytesIO()
        Image.fromarray(pixels[..., 0] if channels == 1 else pixels).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def test_the_scoring_server_answers_image_bytes_in_every_json_format_as_in_process(served_cnn):
    url, local = served_cnn
    images = _pngs(3, 8)
    b64 = [base64.b64encode(b).decode() for b in images]
    expected = local.predict(pd.DataFrame({"image": images}), params={"top_k": 2})
    requests = {
        "dataframe_split": {"dataframe_split": {"columns": ["image"], "data": [[b] for b in b64]}},
        "dataframe_records": {"dataframe_records": [{"image": b} for b in b64]},
        "inputs": {"inputs": {"image": b64}},
        "instances": {"instances": [{"image": b} for b in b64]},
    }
    for name, body in requests.items():
        status, answer = _post(url, {**body, "params": {"top_k": 2}})
        assert status == 200, (name, answer)
        got = pd.DataFrame(answer["predictions"])
        assert list(got.columns) == list(expected.columns), name
        assert list(got["class"]) == list(expected["class"]) and list(got["class_2"]) == list(expected["class_2"])
        np.testing.assert_allclose(got["confidence"], expected["confidence"], rtol=1e-6, err_msg=name)


def test_the_scoring_server_refuses_a_bad_request_naming_the_expected_input(served_cnn):
    url, _ = served_cnn
    status, answer = _post(url, {"inputs": {"pixels": [[0.5] * 64]}})  # the old float tensors, under another name
    assert status == 400 and "image" in answer["message"], answer
    status, answer = _post(url, {"inputs": {"image": ["bm90IGFuIGltYWdl"]}})  # base64 of "not an image"
    assert status == 400 and "not an image" in answer["message"], answer
    status, answer = _post(url, {"inputs": {"image": _b64(_pngs(1, 8))}, "params": {"top_k": "two"}})
    assert status == 400 and "top_k" in answer["message"], answer


def _b64(images: list[bytes]) -> list[str]:
    return [base64.b64encode(b).decode() for b in images]


@pytest.mark.slow  # a fit and a server per family
@pytest.mark.parametrize("family", ["gpt", "diffusion", "clip", "rl"])
def test_every_family_is_served_as_it_answers_in_process(family, tmp_path):
    config, body, params = {
        "gpt": ("gpt/gpt_tiny.yaml", {"inputs": {"prompt": ["ab", ""]}}, {"max_new_tokens": 5, "seed": 2}),
        "diffusion": ("diffusion/tiny.yaml", {"dataframe_split": {"columns": ["label", "seed"], "data": [[1, 4]]}}, {}),
        "clip": ("clip/tiny.yaml", {"instances": [{"image": _b64(_pngs(1, 32, 3))[0], "text": "a red ring"}]}, {}),
        "rl": ("rl/ppo_tiny.yaml", {"inputs": [[0.01, -0.2, 0.03, 0.4], [0.1, 0.2, -0.3, -0.4]]}, {}),  # float64
    }[family]
    model_dir, local = _model(config)
    proc, url = _serve(model_dir, tmp_path)
    try:
        status, answer = _post(url, {**body, "params": params} if params else body)
        bad_status, bad = _post(url, {"inputs": {"nothing": [1]}} if family != "rl" else {"inputs": [[1.0, 2.0]]})
        chats = _chats(url, local, params) if family == "gpt" else None
    finally:
        stop_server(proc)
    for got, want in chats or []:
        assert got == want
    assert status == 200, answer
    if family == "rl":
        expected = local.predict(np.asarray(body["inputs"], dtype=np.float32))
        assert answer["predictions"] == expected.tolist()
    else:
        inputs = {
            "gpt": pd.DataFrame({"prompt": ["ab", ""]}),
            "diffusion": pd.DataFrame({"label": [1], "seed": [4]}),
            "clip": pd.DataFrame({"image": _pngs(1, 32, 3), "text": ["a red ring"]}),
        }[family]
        expected = local.predict(inputs, params=params or None)
        got = pd.DataFrame(answer["predictions"])
        for column in expected.columns:
            want = [base64.encodebytes(v).decode() if isinstance(v, bytes) else v for v in expected[column]]
            if isinstance(want[0], (np.ndarray, float)):
                np.testing.assert_allclose(np.stack(got[column]), np.stack(want), rtol=1e-5, atol=1e-6)
            else:
                assert list(got[column]) == want, column
    assert bad_status == 400, bad


def _chats(url: str, local, params: dict) -> list[tuple[object, object]]:
    """(served, in-process) answers to chat messages: MLflow's unified chat request ``{"messages": [...]}`` (params
    beside it, the answer unwrapped) and two rows of a ``messages`` column (as records: MLflow reads a dict of columns
    holding lists as one row)."""
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ab"}]
    status, one = _post(url, {"messages": chat, **params})
    assert status == 200, one
    status, two = _post(url, {"inputs": [{"messages": chat}, {"messages": chat[1:]}], "params": params})
    assert status == 200, two
    status, bad = _post(url, {"inputs": [{"messages": chat}, {"messages": [{"role": "user"}]}]})  # no content
    assert status == 400 and "messages of row 1: message 0 has no 'content'" in bad["message"], bad
    want_one = local.predict({"messages": chat}, params=params).to_dict("records")
    want_two = local.predict(pd.DataFrame({"messages": [chat, chat[1:]]}), params=params).to_dict("records")
    return [(one, want_one), (two["predictions"], want_two)]
