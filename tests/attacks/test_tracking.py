"""Registries and tracking servers that lie: a version whose source names a folder outside its store (the MLflow path
traversal CVEs' shapes: ``file://`` sources, ``..``, ``#`` fragments, encoded dots), a store whose files were swapped
after they were logged (symlinks, a pyfunc that gained a ``data`` key, changed requirements), and hostile tracking
servers (an in-process ``http.server`` on 127.0.0.1 in a thread: ``../`` in listings, sizes that lie, a slow drip,
redirects and artifact hosts elsewhere that would receive the tracking token, ids reused to poison the cache). Each
row is one payload, replayed through every loader it reaches; ``harness`` says what must hold."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import torch
from builders import GPT_HPARAMS, tiny_state
from harness import HANG, Accepted, Payload, Refused, cases, replay, warm_up
from loaders import command

TOKEN = "corpus-secret-token"


@pytest.fixture(scope="module", autouse=True)
def _warm():
    warm_up()
    import mlflow.store.artifact.http_artifact_repo  # noqa: F401

    import zoo.tracking.code  # noqa: F401


SERVERS: list = []  # every hostile server started, shut down after the module's tests


@pytest.fixture(scope="module", autouse=True)
def _servers():
    yield
    for server in SERVERS:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _token(monkeypatch):
    """The tracking token a user has set: it may go to the tracking server's own host, nowhere else."""
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    # MLflow retries a failed request with backoff (seconds each): a refusal is the same after one try.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    # A stream must keep its minimum rate after 1 s (60 by default): a drip is refused well inside its deadline.
    monkeypatch.setenv("ZOO_DOWNLOAD_TIMEOUT", "1")


# -- a hostile tracking server ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Target:
    """What a tracking payload hands the loaders: a URI in a store, and checks on what the servers saw."""

    uri: str
    store: str
    after: Callable[[], None] = lambda: None


@functools.cache
def model_files() -> dict[str, bytes]:
    """A zoo model folder's files as a store lists them under ``model/``."""
    from safetensors.torch import save

    spec = {"class_path": GPT_HPARAMS["_class_path"], "init_args": {"net": GPT_HPARAMS["net"]}, "checkpoint": {}}
    weights = save({k: v.clone().contiguous() for k, v in tiny_state().items()})
    return {
        "model/MLmodel": b"flavors: {}\n",
        "model/artifacts/module.json": json.dumps(spec).encode(),
        "model/artifacts/weights.safetensors": weights,
    }


class Server(http.server.ThreadingHTTPServer):
    """The MLflow REST calls a download makes, answered as ``behave`` says: a version of ``run`` whose source is
    ``model/`` under the run's artifacts (``artifact_root``, on this server unless told), its files listed and
    served; every Authorization header seen is kept, and the bytes each file sent."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", run: str | None = None, **behave) -> None:
        super().__init__((host, 0), Handler)
        self.run = run or uuid.uuid4().hex
        self.behave, self.auth, self.sent = behave, [], {}
        self.files = dict(behave.get("files") or model_files())
        threading.Thread(target=self.serve_forever, daemon=True).start()
        SERVERS.append(self)

    @property
    def uri(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_port}"

    @property
    def root(self) -> str:
        return self.behave.get("artifact_root") or f"mlflow-artifacts:/0/{self.run}/artifacts"


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args) -> None:
        pass

    def answer(self, code: int, body: bytes, kind: str = "application/json", **headers) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        s, url = self.server, urlparse(self.path)
        s.auth.append((url.path, self.headers.get("Authorization")))
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if hook := s.behave.get("hook"):
            if hook(self, url.path, query):
                return
        if url.path == "/api/2.0/mlflow/model-versions/get":
            mv = {
                "name": query.get("name"),
                "version": query.get("version"),
                "run_id": s.run,
                "status": "READY",
                "source": s.behave.get("source", "ROOT/model").replace("ROOT", s.root).replace("RUN", s.run),
                "creation_timestamp": 0,
                "last_updated_timestamp": 0,
            }
            return self.answer(200, json.dumps({"model_version": mv}).encode())
        if url.path == "/api/2.0/mlflow/runs/get":
            info = {
                "run_id": s.run,
                "run_uuid": s.run,
                "experiment_id": "0",
                "artifact_uri": s.root,
                "status": "FINISHED",
                "lifecycle_stage": "active",
                "start_time": 0,
            }
            return self.answer(200, json.dumps({"run": {"info": info, "data": {}, "inputs": {}}}).encode())
        prefix = "/api/2.0/mlflow-artifacts/artifacts"
        if url.path == prefix:
            return self.answer(200, json.dumps({"files": self.listing(query.get("path", ""))}).encode())
        if url.path.startswith(prefix + "/"):
            return self.file(url.path.removeprefix(prefix + "/").split("/artifacts/", 1)[-1])
        self.answer(404, b'{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such thing"}')

    def listing(self, path: str) -> list[dict]:
        inner = path.split("/artifacts", 1)[-1].strip("/")
        children = {}
        for name, data in self.server.files.items():
            if inner and not name.startswith(inner + "/"):
                continue
            rest = name.removeprefix(inner + "/") if inner else name
            head, _, tail = rest.partition("/")
            children[head] = {"path": head, "is_dir": bool(tail), **({} if tail else {"file_size": str(len(data))})}
        listed = list(children.values())
        return self.server.behave.get("listing", lambda entries, p: entries)(listed, inner)

    def file(self, name: str) -> None:
        data = self.server.files.get(name)
        if data is None:
            return self.answer(404, b'{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such file"}')
        serve = self.server.behave.get("serve")
        if serve is not None:
            return serve(self, name, data)
        self.answer(200, data, "application/octet-stream")
        self.server.sent[name] = len(data)


def serve_large(handler: Handler, name: str, data: bytes) -> None:
    """64 MB for whatever the listing said: counted as sent until the client stops reading."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.end_headers()
    sent = 0
    try:
        for _ in range(64):
            handler.wfile.write(bytes(2**20))
            sent += 2**20
            handler.server.sent[name] = sent
    except OSError:  # the client closed: it stopped reading
        pass


def drip(handler: Handler, name: str, data: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    try:
        for byte in data:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(0.2)
    except OSError:
        pass


def hostile(**behave):
    """A server behaving as told; the target a download of ``models:/tiny/1`` from it, checked after."""

    def make(folder, outside):
        server = Server(
            **{k: (v.replace("OUTSIDE", str(outside)) if isinstance(v, str) else v) for k, v in behave.items()}
        )
        return Target("models:/tiny/1", server.uri, after=lambda: check_server(server))

    return make


@functools.cache
def logged_files() -> dict[str, bytes]:
    """A zoo model folder as log_checkpoint_model leaves it, what `verify` reads: the MLmodel (the code loader, the
    recorded code sha256), the pyfunc file and the zoo's code, with the spec and weights."""
    import tempfile

    import yaml

    from zoo.tracking.code import CODE_KEY, CODE_LOADER, PYFUNC, bundle_code, installed_code_sha256

    pyfunc = {
        "loader_module": CODE_LOADER,
        "code": "code",
        "model_code_path": f"model/{PYFUNC}",
        "python_version": "3.11",
    }
    mlmodel = {"flavors": {"python_function": pyfunc}, "metadata": {CODE_KEY: installed_code_sha256()}}
    files = {**model_files(), "model/MLmodel": yaml.safe_dump(mlmodel).encode()}
    files["model/pyfunc.py"] = (Path(__file__).resolve().parents[2] / "zoo" / "tracking" / PYFUNC).read_bytes()
    files["model/requirements.txt"] = b"torch\n"
    files["model/python_env.yaml"] = b"python: 3.11\n"
    with tempfile.TemporaryDirectory() as tmp:
        code = bundle_code(Path(tmp))
        files |= {
            f"model/code/{p.relative_to(code).as_posix()}": p.read_bytes() for p in code.rglob("*") if p.is_file()
        }
    return files


def tampered(edit: Callable[[dict, Path], None]):
    """A server whose model's files were changed after they were logged: ``edit(files, outside)``."""

    def make(folder, outside):
        files = dict(logged_files())
        edit(files, outside)
        server = Server(files=files)
        return Target("models:/tiny/1", server.uri)

    return make


def pyfunc_data_key(files: dict, outside: Path) -> None:
    """The issue's VA: MLmodel's python_function gains a data key and an extra pyfunc file under artifacts/."""
    import yaml

    meta = yaml.safe_load(files["model/MLmodel"])
    meta["flavors"]["python_function"]["data"] = "artifacts/evil"
    files["model/MLmodel"] = yaml.safe_dump(meta).encode()
    files["model/artifacts/evil/pyfunc.py"] = f"open({str(outside / 'MARKER')!r}, 'w')\n".encode()


def requirements_changed(files: dict, outside: Path) -> None:
    """The issue's VB: requirements.txt (what --env-manager virtualenv installs) names another package."""
    files["model/requirements.txt"] = b"evil-package==6.6.6\n"


def python_env_changed(files: dict, outside: Path) -> None:
    """The issue's VC: python_env.yaml (the environment serving builds) changed."""
    files["model/python_env.yaml"] = b"python: 3.11\nbuild_dependencies: [evil-package]\n"


def spec_dev_zero(folder, outside):
    """A local model folder (module.json + weights.safetensors) whose module.json is a link to /dev/zero."""
    model = folder / "model" / "artifacts"
    model.mkdir(parents=True)
    (model / "weights.safetensors").write_bytes(model_files()["model/artifacts/weights.safetensors"])
    (model / "module.json").symlink_to("/dev/zero")
    return Target(str(folder / "model"), "")


def check_server(server: Server) -> None:
    bound = server.behave.get("max_sent")
    if bound is not None and max(server.sent.values(), default=0) > bound:
        raise Accepted(f"the server sent {max(server.sent.values()):,} bytes of a file it listed smaller: not stopped")


def foreign_artifacts(folder, outside):
    """The run's artifacts on another host (127.0.0.2): the files are served there, and it must get no token."""
    foreign = Server("127.0.0.2")
    server = Server(
        run=foreign.run, artifact_root=f"{foreign.uri}/api/2.0/mlflow-artifacts/artifacts/0/{foreign.run}/artifacts"
    )
    return Target("models:/tiny/1", server.uri, after=lambda: no_token(foreign))


def redirected(folder, outside):
    """Every file answered with a redirect to another host (127.0.0.2), which serves it."""
    foreign = Server("127.0.0.2")

    def hook(handler, path, query):
        if "/mlflow-artifacts/artifacts/" in path:
            handler.send_response(302)
            handler.send_header("Location", f"{foreign.uri}{path}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return True
        return False

    server = Server(run=foreign.run, hook=hook)
    return Target("models:/tiny/1", server.uri, after=lambda: no_token(foreign))


def no_token(foreign: Server) -> None:
    leaked = [path for path, auth in foreign.auth if auth and TOKEN in auth]
    if leaked:
        raise Accepted(f"the tracking token went to {foreign.uri}, a host the server named: {leaked[0]}")


def poisoned_cache(folder, outside):
    """A hostile server reuses a victim's run id and source; its files must never answer the victim's URI."""
    run = uuid.uuid4().hex
    files = dict(model_files())
    from safetensors.torch import load, save

    files["model/artifacts/weights.safetensors"] = save(
        {k: torch.full_like(v, 7.0) for k, v in load(files["model/artifacts/weights.safetensors"]).items()}
    )
    attacker, victim = Server(run=run, files=files), Server(run=run)
    return Target("models:/tiny/1", victim.uri, after=lambda: None), attacker


def error_page(handler, path, query):
    handler.answer(500, b"<html><body>Internal Server Error" + b"x" * 10_000 + b"</body></html>", "text/html")
    return True


def redirect_loop(handler, path, query):
    handler.send_response(302)
    handler.send_header("Location", path + "?" + "&".join(f"{k}={v}" for k, v in query.items()))
    handler.send_header("Content-Length", "0")
    handler.end_headers()
    return True


def content_disposition(handler, name, data):
    """CVE-2024-0520's shape: a file name for the client to write to, in the response."""
    handler.answer(
        200,
        data,
        "application/octet-stream",
        Content_Disposition='attachment; filename="../../../../tmp/corpus-cd.txt"',
    )


# -- loaders ------------------------------------------------------------------------------------------------------


def checked(fn):
    def load(t):
        if isinstance(t, tuple):  # a poisoning attacker: its load comes first, then the victim's
            t, attacker = t
            from zoo.tracking.models import load_model

            try:
                load_model(t.uri, attacker.uri)
            except Exception:  # the attacker's own load may be refused; the victim's must not be poisoned
                pass
            module = fn(t)
            if isinstance(module, torch.nn.Module) and any(bool((p == 7.0).all()) for p in module.parameters()):
                raise Accepted("the victim's URI loaded the attacker's weights from the cache")
            return module
        try:
            return fn(t)
        finally:
            t.after()

    return load


def _load_model(t):
    from zoo.tracking.models import load_model

    return load_model(t.uri, t.store)


def _resolve_checkpoint(t):
    from zoo.tracking.models import resolve_checkpoint

    return resolve_checkpoint(t.uri, t.store)


def _local_weights(t):
    from zoo.tracking.models import local_weights

    os.environ["MLFLOW_TRACKING_URI"] = t.store
    return local_weights(t.uri)


def _verify(t):
    from zoo.tracking.code import verify

    if not verify(t.uri, t.store):
        raise Refused(f"{t.uri}: verify says its files differ from what was logged")
    return True


def _cli(t):
    os.environ["MLFLOW_TRACKING_URI"] = t.store
    command("validate", f"--ckpt_path={t.uri}", "--trainer.logger=false")


def _weights_not_swapped(t):
    """load_model, and its weights the ones logged (not the 7.0s a tampered store holds)."""
    module = _load_model(t)
    if any(bool((p == 7.0).all()) for p in module.parameters()):
        raise Accepted(f"{t.uri} loaded weights that are not the ones logged")
    return module


LOADERS = {
    name: checked(fn)
    for name, fn in {
        "load_model": _load_model,
        "resolve_checkpoint": _resolve_checkpoint,
        "local_weights": _local_weights,
        "verify": _verify,
        "cli": _cli,
        "weights_not_swapped": _weights_not_swapped,
    }.items()
}
READERS = ("load_model", "resolve_checkpoint", "local_weights")
SERVED = ("load_model", "local_weights")

# fmt: off
PAYLOADS = [
    # a version's source naming a folder outside its store: the MLflow path traversal CVEs' shapes
    Payload("mlflow-source-file-outside", "CVE-2023-1177 (a version's source names a local folder)", hostile(source="file://OUTSIDE/model"), (*READERS, "cli")),
    Payload("mlflow-source-plain-path", "CVE-2023-1177 (a source that is a bare path)", hostile(source="OUTSIDE/model"), READERS),
    Payload("mlflow-source-dotdot", "CVE-2023-2780 (the 1177 fix bypassed with ..)", hostile(source="ROOT/../../../../../../OUTSIDE/model"), READERS),
    Payload("mlflow-source-fragment", "CVE-2024-1558 / CVE-2023-6909 (# fragment in a source)", hostile(source="ROOT/model#/../../../../../OUTSIDE/model"), READERS),
    Payload("mlflow-source-encoded-dots", "CVE-2024-1560 / CVE-2023-6831 (URL-encoded ..)", hostile(source="ROOT/%2E%2E/%2E%2E/%2E%2E/%2E%2E/%2E%2E/OUTSIDE/model"), READERS),
    Payload("mlflow-source-runs-dotdot", "CVE-2023-2780 shape in a runs:/ source", hostile(source="runs:/RUN/../../../OUTSIDE/model"), READERS),
    Payload("mlflow-source-other-run", "a version pointing at another run's artifacts", hostile(source="mlflow-artifacts:/0/someone-else/artifacts/model"), READERS),
    # a model whose files changed after they were logged: what verify and serving trust
    Payload("mlflow-pyfunc-data-key", "issue 52 VA: MLmodel gains python_function.data", tampered(pyfunc_data_key), ("verify",)),
    Payload("mlflow-requirements-changed", "issue 52 VB: requirements.txt changed", tampered(requirements_changed), ("verify",)),
    Payload("mlflow-python-env-changed", "issue 52 VC: python_env.yaml changed", tampered(python_env_changed), ("verify",)),
    Payload("model-folder-spec-dev-zero", "symlinks in model folders: module.json linked to /dev/zero", spec_dev_zero, ("load_model",), isolate=True, deadline=HANG),
    # hostile tracking servers
    Payload("server-listing-dotdot", "CVE-2023-1177 class: ../ in a server's listing", hostile(listing=lambda e, p: [*e, {"path": "../../evil", "is_dir": False, "file_size": "1"}]), SERVED),
    Payload("server-listing-absolute", "CVE-2023-1177 class: an absolute path in a listing", hostile(listing=lambda e, p: [*e, {"path": "/etc/passwd", "is_dir": False, "file_size": "1"}]), SERVED),
    Payload("server-listing-no-size", "a listing without sizes: no bound can hold", hostile(listing=lambda e, p: [{k: v for k, v in x.items() if k != "file_size"} for x in e]), SERVED),
    Payload("server-listing-huge", "a listing past the download bound", hostile(listing=lambda e, p: [{**x, "file_size": str(10**13)} if not x["is_dir"] else x for x in e]), SERVED),
    Payload("server-code-listing-bomb", "a code/ listing of 6,000 files for verify", tampered(lambda files, outside: files.update({f"model/code/x/{i}.py": b"" for i in range(6000)})), ("verify",)),
    Payload("server-lying-size", "issue 52: a file listed small, sent large (300 MB written before the refusal)", hostile(listing=lambda e, p: [{**x, "file_size": "10"} if not x["is_dir"] else x for x in e], serve=serve_large, max_sent=16 * 2**20), ("load_model",)),
    Payload("server-slow-drip", "slowloris-style drip (CWE-400): one byte per 0.2 s", hostile(serve=drip), ("load_model",), isolate=True, deadline=HANG + 2),
    Payload("server-local-artifact-root", "CVE-2023-1177 class: a server naming a folder of this machine", hostile(artifact_root="file://OUTSIDE"), SERVED),
    Payload("server-foreign-artifact-host", "issue 52: the token sent to a host the server names (CWE-522): fetched without it", foreign_artifacts, SERVED, refuse=False),
    Payload("server-redirect-foreign-host", "the token sent along a redirect to another host (CWE-601)", redirected, SERVED, refuse=False),
    Payload("server-cache-poisoning", "issue 52: one server's ids answer another's URI (cache poisoning)", poisoned_cache, ("load_model",), refuse=False),
    Payload("server-error-page", "a server answering HTML 500s", hostile(hook=error_page), ("load_model", "cli")),
    Payload("server-redirect-loop", "a redirect loop (CWE-835)", hostile(hook=redirect_loop), SERVED),
    Payload("server-content-disposition", "CVE-2024-0520: a file name chosen by the server", hostile(serve=content_disposition), SERVED, refuse=False),
]
# fmt: on


@pytest.mark.parametrize(("payload", "loader"), cases(PAYLOADS, LOADERS))
def test_a_registry_or_server_payload_runs_nothing_and_is_refused_in_one_line(payload, loader, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))  # a cache of its own: nothing one payload left
    replay(payload, LOADERS[loader], tmp_path)
