"""The code a registered model carries (issue 37 item 6) and every other file MLflow reads of it (issue 52 item 1): the
code's hash and a manifest of every file are recorded at registration in the tracking store, ``verify`` compares the
stored folder with the manifest and the stored code with the installed zoo's, and the zoo's own loaders refuse a folder
that differs from its manifest and never import the model's code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import ROOT, register_tiny_gpt

from zoo.tracking.code import CODE_TAG, code_sha256, installed_code_sha256
from zoo.tracking.downloads import DownloadRefused
from zoo.tracking.manifest import MANIFEST_TAG, encode, folder_manifest
from zoo.tracking.store import process_tracking_uri


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A tiny GPT registered many times in a store of its own: as logged (version 1); with a bundled file edited to
    write a marker when imported, logged so (version 2); each ``TAMPERED`` code, logged so (versions 3, ...); each of
    ``TAMPERINGS`` made in the artifact store after logging (the next versions); VA's model registered again as
    ``mlflow.register_model`` would, without the zoo's tags (``UNTAGGED``); a copy registered by hand from the run's
    files, which has no manifest (``BY_HAND``). Returns (client, marker)."""
    tmp = tmp_path_factory.mktemp("code")
    client = register_tiny_gpt(tmp)
    run_id = client.get_model_version("tiny", "1").run_id
    model = client.get_logged_model(client.get_model_version("tiny", "1").source.removeprefix("models:/"))
    logged = Path(urlparse(model.artifact_location).path)
    edited, marker = tmp / "edited", tmp / "imported"
    shutil.copytree(logged, edited)
    planted = f"\nopen({str(marker)!r}, 'w').close()  # planted\n"
    for name in ("code/zoo/__init__.py", "code/zoo/tracking/serving.py", "pyfunc.py"):
        with open(edited / name, "a") as f:
            f.write(planted)
    relog(client, run_id, "edited", edited)
    for name, edit in TAMPERED.items():  # code other than the installed zoo's, logged so (its manifest says so)
        shutil.copytree(logged, tmp / name)
        edit(tmp / name)
        relog(client, run_id, name, tmp / name)
    manifest = model.tags[MANIFEST_TAG]
    for name, edit in TAMPERINGS.items():  # logged as version 1 was, then edited where the store keeps the files
        edit(Path(urlparse(relog(client, run_id, name, logged, manifest).artifact_location).path))
    va = client.search_logged_models([model.experiment_id], "name = 'va-data-key'")[0]
    with process_tracking_uri(client.tracking_uri):  # as mlflow.register_model registers it: no zoo tags
        client.create_model_version("tiny", f"models:/{va.model_id}", run_id, model_id=va.model_id)
    client.log_artifacts(run_id, str(logged), "by-hand")
    client.create_model_version("tiny", f"{client.get_run(run_id).info.artifact_uri}/by-hand", run_id)
    return client, marker


def relog(client, run_id: str, name: str, folder: Path, manifest: str | None = None):
    """``folder`` as the run's logged model ``name``, registered as the next version of ``tiny``, both tagged with
    ``manifest`` (by default the folder's own, as ``log_checkpoint_model`` records it); returns the logged model."""
    from mlflow.entities import LoggedModelStatus

    manifest = manifest or encode(folder_manifest(folder))
    experiment = client.get_run(run_id).info.experiment_id
    model = client.create_logged_model(experiment, name, run_id, {MANIFEST_TAG: manifest}, model_type="zoo")
    client.log_model_artifacts(model.model_id, str(folder))
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    tags = {MANIFEST_TAG: manifest}
    with process_tracking_uri(client.tracking_uri):  # MLflow resolves a models:/ source against the process's store
        client.create_model_version("tiny", f"models:/{model.model_id}", run_id, tags, model_id=model.model_id)
    return model


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


def _data_key(folder: Path) -> None:
    """VA: the MLmodel's python_function flavor gains a ``data`` key and a pyfunc file lands under ``artifacts/``."""
    mlmodel = folder / "MLmodel"
    mlmodel.write_text(mlmodel.read_text().replace("  python_function:\n", "  python_function:\n    data: artifacts\n"))
    (folder / "artifacts" / "pyfunc.py").write_text("import os  # what mlflow.pyfunc.load_model would run\n")


# What MLflow reads of a stored model beside its code, edited after logging (issue 52's VA, VB, VC), and the files each
# must be named by.
TAMPERINGS = {
    "va-data-key": _data_key,
    "vb-requirements": lambda f: _flip(f / "requirements.txt", "pillow==", "pillo2=="),
    "vc-environment": lambda f: (
        _flip(f / "python_env.yaml", "pip==", "pip<="),
        _flip(f / "conda.yaml", "- pip", "-pip "),
    ),
}
UNTAGGED = 3 + len(TAMPERED) + len(TAMPERINGS)
BY_HAND = UNTAGGED + 1
NAMED = {
    "va-data-key": ["MLmodel changed", "artifacts/pyfunc.py added"],
    "vb-requirements": ["requirements.txt changed"],
    "vc-environment": ["conda.yaml changed", "python_env.yaml changed"],
}


def verify(uri: str, store: str) -> subprocess.CompletedProcess:
    """``python -m zoo.tracking verify <uri>``, in this process (each subprocess imports torch and MLflow again)."""
    return zoo_tracking(["verify", uri], store)


def zoo_tracking(argv: list[str], store: str) -> subprocess.CompletedProcess:
    """``python -m zoo.tracking <argv>``, in this process."""
    import contextlib
    import io

    from zoo.tracking.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setenv("MLFLOW_TRACKING_URI", store)
        try:
            main(argv)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
            print(exit_.code if isinstance(exit_.code, str) else "", file=err)  # sys.exit("error: ...") prints it
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


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
    """The edited version's code would write the marker if anything imported it; the loaders hash it (against its
    manifest) but keep none of it."""
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


def version_of(name: str) -> int:
    return 3 + len(TAMPERED) + list(TAMPERINGS).index(name)


def test_the_manifest_of_every_file_is_recorded_in_the_tracking_store(registered):
    """The logged model and its version carry the sha256 of each file of the folder as logged: MLmodel, requirements
    and environment files, artifacts and code alike."""
    client, _ = registered
    version = client.get_model_version("tiny", "1")
    model = client.get_logged_model(version.source.removeprefix("models:/"))
    assert version.tags[MANIFEST_TAG] == model.tags[MANIFEST_TAG]
    stored = folder_manifest(Path(urlparse(model.artifact_location).path))
    assert encode(stored) == model.tags[MANIFEST_TAG]
    wanted = {"MLmodel", "requirements.txt", "python_env.yaml", "conda.yaml", "pyfunc.py", "artifacts/module.json"}
    assert wanted | {"artifacts/weights.safetensors", "code/zoo/tracking/manifest.py"} <= set(stored)


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_verify_names_each_file_edited_after_logging(registered, name):
    """VA, VB, VC: the code is still the installed zoo's, so only the manifest tells."""
    client, _ = registered
    version = version_of(name)
    for uri in (f"models:/tiny/{version}", f"runs:/{client.get_model_version('tiny', '1').run_id}/{name}"):
        proc = verify(uri, client.tracking_uri)
        named = [line.removeprefix("differ: ") for line in proc.stdout.splitlines() if line.startswith("differ: ")]
        assert proc.returncode == 1 and named[:-1] == NAMED[name], proc.stdout + proc.stderr[-2000:]
        assert f"bundled code sha256 {installed_code_sha256()}" in proc.stdout and "match" not in proc.stdout


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_the_zoos_loaders_refuse_a_folder_edited_after_logging(registered, name, tmp_path, monkeypatch):
    """One line naming the first file that differs; nothing is kept in the cache."""
    from zoo.tracking import load, load_model, resolve_checkpoint

    client, _ = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    run_id = client.get_model_version("tiny", "1").run_id
    # The three readers share one download: each once, and the run's URI through one.
    readers = [(f"models:/tiny/{version_of(name)}", read) for read in (load_model, load, resolve_checkpoint)]
    for uri, read in [*readers, (f"runs:/{run_id}/{name}", load_model)]:
        with pytest.raises(DownloadRefused) as err:
            read(uri)
        message = str(err.value)
        assert message.startswith(f"{uri}: its files differ from the manifest recorded when it was logged: ")
        assert f": {NAMED[name][0]}" in message and "\n" not in message, message
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_a_file_of_a_logged_model_is_checked_against_its_manifest(registered, tmp_path, monkeypatch):
    """``runs:/<id>/<model>/<file>``: the file as logged loads, the file edited after logging does not."""
    from zoo.tracking import local_weights

    client, _ = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    run_id = client.get_model_version("tiny", "1").run_id
    assert Path(local_weights(f"runs:/{run_id}/model/artifacts/weights.safetensors")).is_file()
    with pytest.raises(DownloadRefused, match=r"manifest recorded when it was logged: requirements\.txt changed"):
        local_weights(f"runs:/{run_id}/vb-requirements/requirements.txt")


def test_verify_refuses_a_model_with_no_manifest_as_unverifiable(registered, tmp_path, monkeypatch):
    """Registered by hand from the run's files: verify cannot tell what was logged; the loaders, which read only JSON
    and safetensors of it, load it."""
    from zoo.tracking import load_model

    client, _ = registered
    last = BY_HAND
    run_id = client.get_model_version("tiny", "1").run_id
    for uri in (f"models:/tiny/{last}", f"runs:/{run_id}/by-hand"):
        proc = verify(uri, client.tracking_uri)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 1 and len(errors) == 1 and not proc.stdout, proc.stdout + proc.stderr[-2000:]
        assert f"{uri}: unverifiable" in errors[0] and "python -m zoo.tracking log-model" in errors[0]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    load_model(f"models:/tiny/{last}")


def test_a_version_registered_without_the_zoos_tags_is_checked_against_its_logged_models(registered, tmp_path):
    """Registered from a zoo logged model by MLflow's own ``register_model``: the logged model's manifest holds."""
    client, _ = registered
    uri = f"models:/tiny/{UNTAGGED}"
    proc = verify(uri, client.tracking_uri)
    assert proc.returncode == 1 and f"differ: {NAMED['va-data-key'][0]}" in proc.stdout, proc.stdout + proc.stderr
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
        proc = zoo_tracking(["export-policy", uri, str(tmp_path / "policy.pt2")], client.tracking_uri)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"error: {uri}: its files differ from the manifest" in errors[0] and NAMED["va-data-key"][0] in errors[0]


@pytest.mark.slow  # a model logged and registered (15 s); the default suite meets it in test_serving's order
def test_a_model_mlflow_loaded_from_a_local_store_still_loads_and_only_mlflows_note_is_let_pass(tmp_path, monkeypatch):
    """``mlflow.pyfunc.load_model("models:/...")`` on a store of this machine writes ``registered_model_meta`` into the
    store's folder of the model (MLflow hands out that folder, not a copy): the zoo's loaders then still load it; the
    same name anywhere else in the folder is still a file added after logging."""
    import mlflow

    from zoo.tracking import load

    client = register_tiny_gpt(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    mlflow.set_tracking_uri(client.tracking_uri)
    mlflow.pyfunc.load_model("models:/tiny/1")
    model = client.get_logged_model(client.get_model_version("tiny", "1").source.removeprefix("models:/"))
    logged = Path(urlparse(model.artifact_location).path)
    assert (logged / "registered_model_meta").is_file()  # MLflow's own write, in the store itself
    assert load("models:/tiny/1") is not None
    shutil.rmtree(tmp_path / "cache")
    (logged / "artifacts" / "registered_model_meta").write_text("model_name: tiny\n")
    with pytest.raises(DownloadRefused, match="artifacts/registered_model_meta added"):
        load("models:/tiny/1")
