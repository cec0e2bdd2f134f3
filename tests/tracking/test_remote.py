"""A hostile tracking server, faked in this process (issue 52 item 2): its artifacts on another host get no
credential, its redirects carry none away, its ids reused never answer another server's URI from the cache, its
lying sizes stop the writing at the listed size, and its drip is refused within the deadline.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from zoo.tracking.downloads import DownloadRefused, download
from zoo.tracking.remote import TIMEOUT_ENV, TRUSTED_HOSTS_ENV

ENDPOINT = "/api/2.0/mlflow-artifacts/artifacts"
RUN = uuid.uuid4().hex
MODEL = {
    "model/MLmodel": b"flavors: {}\n",
    "model/artifacts/module.json": b"{}",
    "model/artifacts/weights.safetensors": b"W" * 64,
}


class Fake(http.server.ThreadingHTTPServer):
    """A tracking server and artifact host in one: ``runs/get`` answers ``artifact_uri`` for any run id, the
    artifact endpoints serve ``files`` (listed at ``sizes`` where given), ``behave`` maps a path to what its GET does
    instead (a redirect, 401, a drip, an endless stream). Every request's path and Authorization header is kept."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_port}"
        self.artifact_uri = f"mlflow-artifacts:/0/{RUN}/artifacts"
        self.files, self.sizes, self.behave, self.seen, self.listed_extra = dict(MODEL), {}, {}, [], []
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.shutdown()
        self.server_close()


class Handler(http.server.BaseHTTPRequestHandler):
    server: Fake
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def answer(self, status: int, body: bytes = b"", **headers) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # search_logged_models: none, the run's own artifacts are where the model lies
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        self.answer(200, b'{"models": []}')

    def do_GET(self):
        url, server = urlsplit(self.path), self.server
        server.seen.append((url.path, self.headers.get("Authorization")))
        if url.path == "/api/2.0/mlflow/runs/get":
            info = {"run_id": RUN, "experiment_id": "0", "artifact_uri": server.artifact_uri, "status": "FINISHED"}
            return self.answer(200, json.dumps({"run": {"info": {**info, "lifecycle_stage": "active"}}}).encode())
        if url.path == ENDPOINT:
            folder = f"{parse_qs(url.query)['path'][0].removeprefix(f'0/{RUN}/artifacts/')}/"
            names = {p.removeprefix(folder).split("/")[0] for p in server.files if p.startswith(folder)}
            listed = [
                {"path": n, "is_dir": True}
                if f"{folder}{n}" not in server.files
                else {
                    "path": n,
                    "is_dir": False,
                    "file_size": server.sizes.get(f"{folder}{n}", len(server.files[f"{folder}{n}"])),
                }
                for n in sorted(names)
            ]
            listed += server.listed_extra
            return self.answer(200, json.dumps({"files": listed}).encode())
        path = url.path.removeprefix(f"{ENDPOINT}/0/{RUN}/artifacts/")
        behaviour = server.behave.get(path)
        if callable(behaviour):
            return behaviour(self)
        if path in server.files:
            return self.answer(200, server.files[path])
        self.answer(404)


def drip(handler: Handler) -> None:
    """The listed size announced, then a byte every 0.1 s."""
    handler.send_response(200)
    handler.send_header("Content-Length", "64")
    handler.end_headers()
    with contextlib.suppress(OSError):
        for _ in range(64):
            handler.wfile.write(b"W")
            handler.wfile.flush()
            time.sleep(0.1)


def endless(handler: Handler) -> None:
    """Far more than listed (32 MB), as fast as the socket takes it, until the client hangs up."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(32 << 20))
    handler.end_headers()
    with contextlib.suppress(OSError):
        for _ in range(32):
            handler.wfile.write(b"X" * (1 << 20))


def silent(handler: Handler) -> None:
    """Headers, then nothing for 5 s."""
    handler.send_response(200)
    handler.send_header("Content-Length", "64")
    handler.end_headers()
    handler.wfile.flush()
    time.sleep(5)


@pytest.fixture
def servers(monkeypatch, tmp_path):
    """Two fake servers (a tracking server and another host), the tracking token set, this test's own cache."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "s3cret")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", TRUSTED_HOSTS_ENV):
        monkeypatch.delenv(name, raising=False)
    made = Fake(), Fake()
    yield made
    for server in made:
        server.close()


def authorizations(server: Fake) -> set:
    return {auth for _, auth in server.seen}


def weights(folder: Path) -> bytes:
    return (folder / "artifacts" / "weights.safetensors").read_bytes()


def test_an_artifact_host_the_server_names_gets_no_credential(servers, monkeypatch):
    """The tracking server says the run's artifacts live on another host: that host is asked without the token,
    unless the user trusts it by name; the tracking server itself gets it."""
    tracking, other = servers
    for root in (
        f"{other.url}{ENDPOINT}/0/{RUN}/artifacts",
        f"mlflow-artifacts://127.0.0.1:{other.server_port}/0/{RUN}/artifacts",
    ):
        tracking.artifact_uri, other.seen[:] = root, []
        folder = download(f"runs:/{RUN}/model", tracking.url)
        assert weights(folder) == MODEL["model/artifacts/weights.safetensors"]
        assert other.seen and authorizations(other) == {None}, other.seen
        assert authorizations(tracking) == {"Bearer s3cret"}, tracking.seen
        shutil.rmtree(folder.parent.parent)
    monkeypatch.setenv(TRUSTED_HOSTS_ENV, f"https://elsewhere.example, {other.url}/")
    download(f"runs:/{RUN}/model", tracking.url)
    assert authorizations(other) == {None, "Bearer s3cret"}


def test_a_host_that_wants_credentials_says_which_setting_trusts_it(servers, monkeypatch):
    tracking, other = servers
    tracking.artifact_uri = f"{other.url}{ENDPOINT}/0/{RUN}/artifacts"
    other.behave["model/MLmodel"] = lambda handler: handler.answer(401)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "me")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw")
    with pytest.raises(DownloadRefused, match=rf"answered 401 .* list {other.url} in \${TRUSTED_HOSTS_ENV}") as err:
        download(f"runs:/{RUN}/model", tracking.url)
    assert "\n" not in str(err.value) and authorizations(other) == {None}
    monkeypatch.setenv(TRUSTED_HOSTS_ENV, other.url)  # trusted: it got the credentials, so its 401 is its answer
    with pytest.raises(DownloadRefused, match=rf"{other.url}/.*MLmodel answered 401: check the server"):
        download(f"runs:/{RUN}/model", tracking.url)
    assert authorizations(other) == {None, "Basic bWU6cHc="}
    monkeypatch.setenv(TRUSTED_HOSTS_ENV, "other.example")
    with pytest.raises(DownloadRefused, match=rf"\${TRUSTED_HOSTS_ENV} lists 'other.example', not an origin"):
        download(f"runs:/{RUN}/model", tracking.url)


def test_a_redirect_to_another_host_carries_no_credential(servers):
    """The tracking server's own artifacts (credentials sent) redirect to another host: asked without them."""
    tracking, other = servers
    target = f"{other.url}{ENDPOINT}/0/{RUN}/artifacts/model/artifacts/weights.safetensors"
    tracking.behave["model/artifacts/weights.safetensors"] = lambda handler: handler.answer(302, Location=target)
    folder = download(f"runs:/{RUN}/model", tracking.url)
    assert weights(folder) == MODEL["model/artifacts/weights.safetensors"]
    assert authorizations(tracking) == {"Bearer s3cret"} and authorizations(other) == {None}, other.seen


def test_one_servers_files_never_answer_another_servers_uri(servers):
    """A hostile server reusing the victim's run id, loaded first: the victim's own URI still gets its own files,
    and an entry whose record names another store is not read."""
    hostile, victim = servers
    hostile.files["model/artifacts/weights.safetensors"] = b"POISONED" * 8
    uri = f"runs:/{RUN}/model"
    assert weights(download(uri, hostile.url)) == b"POISONED" * 8
    mine = download(uri, victim.url)
    assert weights(mine) == MODEL["model/artifacts/weights.safetensors"]
    assert weights(download(uri, hostile.url.replace("127.0.0.1", "127.0.0.1:80", 0))) == b"POISONED" * 8
    record = mine.parent.parent / ".source"
    assert json.loads(record.read_text())["store"] == f"http://127.0.0.1:{victim.server_port}"
    # An entry recorded as another store's, or cut short, is fetched again.
    record.write_text(record.read_text().replace(str(victim.server_port), str(hostile.server_port)))
    (mine / "artifacts" / "weights.safetensors").write_bytes(b"POISONED" * 8)
    assert weights(download(uri, victim.url)) == MODEL["model/artifacts/weights.safetensors"]
    (mine / "artifacts" / "weights.safetensors").write_bytes(b"W")
    assert weights(download(uri, victim.url)) == MODEL["model/artifacts/weights.safetensors"]


def test_a_file_larger_than_listed_stops_at_the_listed_size(servers, monkeypatch):
    """Listed as 10 bytes, sent as 32 MB: nothing past byte 10 is written, the partial file is removed."""
    tracking, _ = servers
    tracking.sizes["model/artifacts/weights.safetensors"] = 10
    tracking.behave["model/artifacts/weights.safetensors"] = endless
    written, unlink = [], Path.unlink

    def measured(self, *args, **kwargs):
        if self.exists():
            written.append((self.name, self.stat().st_size))
        return unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", measured)
    start = time.monotonic()
    with pytest.raises(DownloadRefused, match=r"weights.safetensors runs past the 10 bytes the store listed"):
        download(f"runs:/{RUN}/model", tracking.url)
    assert [name for name, _ in written] == ["weights.safetensors"] and written[0][1] <= 10, written
    assert time.monotonic() - start < 5
    cache = Path(os.environ["ZOO_CACHE_DIR"])
    assert not [p for p in cache.rglob("*") if p.is_file()]


def test_a_drip_is_refused_within_its_deadline(servers, monkeypatch):
    """A byte every 0.1 s (the whole file would take 6.4 s), with a 1 s timeout: refused after about a second."""
    tracking, _ = servers
    tracking.behave["model/artifacts/weights.safetensors"] = drip
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    start = time.monotonic()
    with pytest.raises(DownloadRefused, match=r"weights.safetensors arrives slower than 64 KiB/s after 1 s"):
        download(f"runs:/{RUN}/model", tracking.url)
    assert time.monotonic() - start < 3


def test_a_listed_path_that_leaves_its_folder_or_a_broken_listing_is_one_line(servers):
    tracking, _ = servers
    uri = f"runs:/{RUN}/model"
    for extra, said in (
        ({"path": "../../evil", "is_dir": False, "file_size": 1}, "leaves its folder"),
        ({"path": "/etc/passwd", "is_dir": False, "file_size": 1}, "leaves its folder"),
        ({"is_dir": False}, "is not MLflow's"),
        ({"path": "x", "is_dir": False, "file_size": "ten"}, "is not MLflow's"),
    ):
        tracking.listed_extra[:] = [extra]
        with pytest.raises(DownloadRefused, match=rf"^{uri}: .*{said}") as err:
            download(uri, tracking.url)
        assert "\n" not in str(err.value)
    assert not [p for p in Path(os.environ["ZOO_CACHE_DIR"]).rglob("*") if p.is_file()]


def test_a_file_shorter_than_listed_or_a_silent_server_is_one_line(servers, monkeypatch):
    """Fewer bytes than listed is refused; a server that goes quiet is refused after the timeout, not after MLflow's
    two minutes a read."""
    tracking, _ = servers
    uri = f"runs:/{RUN}/model"
    tracking.behave["model/artifacts/weights.safetensors"] = lambda handler: handler.answer(200, b"W" * 10)
    with pytest.raises(DownloadRefused, match=r"weights.safetensors ended at 10 bytes where the store listed 64"):
        download(uri, tracking.url)
    tracking.behave["model/artifacts/weights.safetensors"] = silent
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    start = time.monotonic()
    with pytest.raises(DownloadRefused, match=r"reading model/artifacts/weights.safetensors failed \(\w*Timeout"):
        download(uri, tracking.url)
    assert time.monotonic() - start < 3
    assert not [p for p in Path(os.environ["ZOO_CACHE_DIR"]).rglob("*") if p.is_file()]
