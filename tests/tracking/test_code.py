"""The code a registered model carries (issue 37 item 6): its hash is recorded at registration, ``verify`` compares
the stored code with the installed zoo's, and the zoo's own loaders never import it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import ROOT, register_tiny_gpt

from zoo.tracking.code import CODE_TAG, code_sha256, installed_code_sha256


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A tiny GPT registered twice in a store of its own: as logged (version 1) and with a bundled file edited after
    registration to write a marker when imported (version 2). Returns (client, marker)."""
    tmp = tmp_path_factory.mktemp("code")
    client = register_tiny_gpt(tmp)
    run_id = client.get_model_version("tiny", "1").run_id
    model = client.get_logged_model(client.get_model_version("tiny", "1").source.removeprefix("models:/"))
    edited, marker = tmp / "edited", tmp / "imported"
    shutil.copytree(urlparse(model.artifact_location).path, edited)
    planted = f"\nopen({str(marker)!r}, 'w').close()  # planted\n"
    for name in ("code/zoo/__init__.py", "code/zoo/tracking/serving.py", "pyfunc.py"):
        with open(edited / name, "a") as f:
            f.write(planted)
    client.log_artifacts(run_id, str(edited), "edited")
    client.create_model_version("tiny", f"{client.get_run(run_id).info.artifact_uri}/edited", run_id)
    for name, edit in TAMPERED.items():  # versions 3, 4, ...
        folder = tmp / name
        shutil.copytree(urlparse(model.artifact_location).path, folder)
        edit(folder)
        client.log_artifacts(run_id, str(folder), name)
        client.create_model_version("tiny", f"{client.get_run(run_id).info.artifact_uri}/{name}", run_id)
    return client, marker


def _flip(path: Path, old: str, new: str) -> None:
    """One same-length change: a hash of names and sizes alone would not see it."""
    text = path.read_text()
    assert len(old) == len(new) and text.count(old) >= 1
    path.write_text(text.replace(old, new, 1))


def _rehash(folder: Path) -> None:
    """Code changed and the recorded hash rewritten to match it, as a careful attacker would."""
    _flip(folder / "code" / "zoo" / "errors.py", "class", "klass")
    mlmodel = folder / "MLmodel"
    recorded = mlmodel.read_text().split("zoo_code_sha256: ")[1].split()[0]
    mlmodel.write_text(mlmodel.read_text().replace(recorded, code_sha256(folder / "code", folder / "pyfunc.py")))


# Stored models whose code is not the installed zoo's, each in another way.
TAMPERED = {
    "flipped-code": lambda f: _flip(f / "code" / "zoo" / "errors.py", "class", "klass"),
    "flipped-pyfunc": lambda f: _flip(f / "pyfunc.py", "import", "IMPORT"),
    "added-pyc": lambda f: (f / "code" / "zoo" / "sitecustomize.pyc").write_bytes(b"\0" * 16),
    "rehashed": _rehash,
    "other-loader": lambda f: _flip(
        f / "MLmodel", "mlflow.pyfunc.loaders.code_model", "mlflow.pyfunc.loaders.code_mode1"
    ),
}


def verify(uri: str, store: str) -> subprocess.CompletedProcess:
    """``python -m zoo.tracking verify <uri>``, in this process (each subprocess imports torch and MLflow again)."""
    import contextlib
    import io

    from zoo.tracking.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setenv("MLFLOW_TRACKING_URI", store)
        try:
            main(["verify", uri])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
            print(exit_.code if isinstance(exit_.code, str) else "", file=err)  # sys.exit("error: ...") prints it
    return subprocess.CompletedProcess(["verify", uri], code, out.getvalue(), err.getvalue())


def test_the_code_hash_is_recorded_at_registration(registered):
    client, _ = registered
    from mlflow.models import Model

    version = client.get_model_version("tiny", "1")
    model = client.get_logged_model(version.source.removeprefix("models:/"))
    installed = installed_code_sha256()
    assert version.tags[CODE_TAG] == model.tags[CODE_TAG] == installed
    assert Model.load(urlparse(model.artifact_location).path).metadata["zoo_code_sha256"] == installed


def test_verify_passes_the_code_as_logged_and_fails_an_edited_file(registered):
    client, marker = registered
    run_id = client.get_model_version("tiny", "1").run_id
    for uri in ("models:/tiny/1", f"runs:/{run_id}/model"):
        proc = verify(uri, client.tracking_uri)
        assert proc.returncode == 0 and "match" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    for uri in ("models:/tiny/2", f"runs:/{run_id}/edited"):
        proc = verify(uri, client.tracking_uri)
        assert proc.returncode == 1 and "differ" in proc.stdout, proc.stdout + proc.stderr[-2000:]
        # its recorded hash is the registration's: only the stored code tells the edit
        assert f"recorded at registration: {installed_code_sha256()}" in proc.stdout
    assert not marker.exists()  # verify reads the code as bytes


@pytest.mark.parametrize("name", sorted(TAMPERED))
def test_verify_fails_every_other_code(registered, name):
    client, _ = registered
    version = 3 + list(TAMPERED).index(name)
    run_id = client.get_model_version("tiny", str(version)).run_id
    for uri in (f"models:/tiny/{version}", f"runs:/{run_id}/{name}"):
        proc = verify(uri, client.tracking_uri)
        assert proc.returncode == 1 and "differ" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_verify_of_a_missing_model_is_one_error_line(registered):
    client, _ = registered
    proc = verify("models:/tiny/99", client.tracking_uri)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "models:/tiny/99" in errors[0], proc.stderr[-2000:]


def test_the_zoos_loaders_never_import_a_models_bundled_code(registered, tmp_path, monkeypatch):
    """The edited version's code would write the marker if anything imported it; the loaders fetch none of it."""
    from zoo.tracking import load, load_model, resolve_checkpoint

    client, marker = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    before = set(sys.modules)
    for uri in ("models:/tiny/2", f"runs:/{client.get_model_version('tiny', '2').run_id}/edited"):
        load_model(uri)
        load(uri)
        resolve_checkpoint(uri)
    assert not marker.exists()
    cache = tmp_path / "cache"
    assert not list(cache.rglob("code")) and not list(cache.rglob("*.py"))
    new = {m for m in set(sys.modules) - before if str(getattr(sys.modules[m], "__file__", "")).startswith("/tmp")}
    assert not new, new
    assert Path(sys.modules["zoo"].__file__).resolve().is_relative_to(ROOT)
