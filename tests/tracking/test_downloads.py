"""Downloads from a tracking store are bounded: what a store lists is data, never an instruction (issue 37 item 5).

A hostile store lists a huge file, sends more than it listed, points a version at a folder of this machine or lists a
path that leaves its folder: each is one line naming the URI, and nothing lands in the model cache.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import register_tiny_gpt
from mlflow.entities import FileInfo
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

from zoo.tracking.downloads import MAX_DOWNLOAD_ENV, DownloadRefused
from zoo.tracking.models import load_model, local_weights, process_tracking_uri, resolve_checkpoint, tracking_uri


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """This test's own model cache (the session's is shared), empty."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def cached_files(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file()]


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A tiny GPT logged and registered in a store of its own: (client, version, name)."""
    tmp = tmp_path_factory.mktemp("downloads")
    client = register_tiny_gpt(tmp)
    return client, client.get_model_version("tiny", "1"), "tiny"


@pytest.fixture
def store(registered, monkeypatch):
    client, version, name = registered
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    return registered


def local_path(location: str) -> str:
    return urlparse(location).path if location.startswith("file:") else location


def uris(version) -> list[str]:
    return [f"models:/{version.name}/{version.version}", f"runs:/{version.run_id}/model"]


def test_only_the_files_the_loaders_read_are_fetched(store, cache):
    """MLmodel, module.json and weights.safetensors: not the code, requirements or environment files."""
    _, version, _ = store
    for uri in uris(version):
        load_model(uri)
        resolve_checkpoint(uri)
    names = {p.name for p in cached_files(cache)}
    assert names == {"MLmodel", "module.json", "weights.safetensors", ".downloaded", ".source", "model.ckpt"}, names


def test_a_listing_over_the_size_limit_is_refused_before_anything_lands(store, cache, monkeypatch):
    _, version, _ = store
    monkeypatch.setenv(MAX_DOWNLOAD_ENV, "4096")  # the tiny GPT's weights are ~17 kB
    for uri in uris(version):
        for read in (load_model, resolve_checkpoint, local_weights):
            with pytest.raises(DownloadRefused, match=rf"^{uri}: .* over the 4,096 bytes .*\${MAX_DOWNLOAD_ENV}"):
                read(uri)
    assert not cached_files(cache) and not list(cache.rglob(".partial-*"))
    monkeypatch.setenv(MAX_DOWNLOAD_ENV, "lots")
    with pytest.raises(DownloadRefused, match="not a positive number"):
        load_model(uris(version)[0])


def test_a_file_larger_than_its_listing_is_refused_as_it_lands(store, cache, monkeypatch):
    """A store that lists a small size and sends more: each file is measured as it arrives, and the partial
    download is removed."""
    _, version, _ = store
    listed = LocalArtifactRepository.list_artifacts

    def lying(self, path=None):
        return [FileInfo(f.path, f.is_dir, None if f.is_dir else 10) for f in listed(self, path)]

    monkeypatch.setattr(LocalArtifactRepository, "list_artifacts", lying)
    for uri in uris(version):
        with pytest.raises(DownloadRefused, match=rf"^{uri}: .* runs past the 10 bytes the store listed"):
            load_model(uri)
    assert not cached_files(cache) and not list(cache.rglob(".partial-*"))


def test_a_version_whose_source_is_a_folder_of_this_machine_is_refused(store, cache, tmp_path):
    """The registry chooses a version's source; a folder of this machine outside the store's artifacts (here a
    valid zoo model, as an attacker would leave one) is refused in one line and nothing is copied."""
    client, version, name = store
    model = client.get_logged_model(version.source.removeprefix("models:/"))
    outside = tmp_path / "outside"
    shutil.copytree(local_path(model.artifact_location), outside)
    other_run = client.create_run(client.get_run(version.run_id).info.experiment_id).info.run_id
    hostile = [
        (f"file://{outside}", version.run_id),
        (str(outside), version.run_id),
        (str(outside), None),
        (f"{client.get_run(version.run_id).info.artifact_uri}/../../{other_run}/artifacts", version.run_id),
        (version.source, other_run),  # another run's logged model
        (f"runs:/{other_run}/model", version.run_id),
    ]
    for source, run_id in hostile:
        with process_tracking_uri(client.tracking_uri):  # MLflow looks a models:/ source up in the process's store
            v = client.create_model_version(name, source, run_id)
        with pytest.raises(DownloadRefused) as refused:
            load_model(f"models:/{name}/{v.version}")
        message = str(refused.value)
        assert message.startswith(f"models:/{name}/{v.version}: its source ") and "\n" not in message, message
        assert "not in the artifacts of its run" in message or "a model of another run" in message, message
    assert not cached_files(cache) and not list(cache.rglob(".partial-*"))


def test_a_listed_path_that_leaves_its_folder_is_one_line(store, cache, monkeypatch):
    _, version, _ = store
    for uri in (f"runs:/{version.run_id}/../../etc", f"runs:/{version.run_id}/model/../../x"):
        with pytest.raises(DownloadRefused, match=r"leaves its folder"):
            load_model(uri)
    listed = LocalArtifactRepository.list_artifacts

    def escaping(self, path=None):
        return [*listed(self, path), FileInfo(f"{path}/../../evil" if path else "../evil", False, 1)]

    monkeypatch.setattr(LocalArtifactRepository, "list_artifacts", escaping)
    for uri in uris(version):
        with pytest.raises(DownloadRefused, match=rf"^{uri}: the store lists .*evil.* leaves its folder"):
            load_model(uri)
    assert not cached_files(cache)


def test_the_cli_says_a_refused_download_in_one_line(store, cache, monkeypatch, capsys):
    """What MLflow refuses or lacks (a path with .., a missing run or version) is one error: line, not a traceback."""
    import cli

    _, version, name = store
    for uri in (f"runs:/{version.run_id}/../x", f"runs:/{uuid.uuid4().hex}/model", f"models:/{name}/99"):
        monkeypatch.setattr(sys, "argv", ["cli.py", "validate", f"--ckpt_path={uri}", "--trainer.logger=false"])
        with pytest.raises(SystemExit) as exit_info:
            cli.run()
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert exit_info.value.code == 1 and len(errors) == 1 and uri in errors[0], err[-2000:]
        assert "Traceback" not in err


def test_a_model_its_loader_refuses_is_removed_from_the_cache(store, cache, tmp_path, monkeypatch):
    """Weights that are not safetensors: the loader refuses them, and the download does not stay behind."""
    client, version, name = store
    from zoo.tracking.models import tracking_uri as store_uri

    assert store_uri() == client.tracking_uri == tracking_uri()
    model = client.get_logged_model(version.source.removeprefix("models:/"))
    folder = tmp_path / "model"
    shutil.copytree(local_path(model.artifact_location), folder)
    (folder / "artifacts" / "weights.safetensors").write_bytes(b"not safetensors" * 10)
    client.log_artifacts(version.run_id, str(folder), "broken")
    with pytest.raises(Exception, match="safetensors|header|not a"):
        load_model(f"runs:/{version.run_id}/broken")
    assert not cached_files(cache)


def test_a_tracking_server_names_no_folder_of_this_machine():
    """A server chooses its runs' artifact locations: one on this machine's disk is refused, its artifact store's
    (mlflow-artifacts:/, s3://) is what it serves."""
    from zoo.tracking.downloads import served

    uri = "models:/m/1"
    for local in ("/home/me/.ssh", "file:///home/me", "C:\\Users\\me"):
        with pytest.raises(DownloadRefused, match=rf"^{uri}: the tracking server .* folder of this machine"):
            served([("mlflow-artifacts:/1/models/m-1/artifacts", ""), (local, "model")], "https://mlflow.example", uri)
        assert served([(local, "model")], "sqlite:///mlflow.db", uri) == [(local, "model")]  # a store of your own
    found = [("mlflow-artifacts:/1/models/m-1/artifacts", ""), ("s3://bucket/1/abc/artifacts", "model")]
    assert served(found, "http://127.0.0.1:5000", uri) == found
