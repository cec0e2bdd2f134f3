"""A tracking server's artifacts over HTTP, read by the zoo itself: credentials only where the user sent them, every
stream bounded in bytes and in time.

MLflow's HTTP artifact repository reads the tracking credentials (``MLFLOW_TRACKING_TOKEN``, ``_USERNAME`` /
``_PASSWORD``, its auth plugins, a client certificate) from the environment for whatever host an artifact location
names, and a location is what the server says it is. Here the credentials go to the tracking server's own origin
(scheme, host and port of the tracking URI) and to the origins the user lists in ``$ZOO_TRUSTED_ARTIFACT_HOSTS``;
any other host, a redirect's target included, is asked without them. A host that then wants credentials answers 401
or 403, which is one line naming the setting: a user whose artifacts live on a host of their own trusts it by name,
and a server cannot pick one for them. Asking without credentials rather than refusing keeps a server whose
artifacts sit on an open host working; what a hostile server gains is that this machine, not the server, sends a
plain GET to a host it names (one inside this network, say), bounded like every download and read as data only.

Bounds, as ``copy_bounded`` enforces them while bytes arrive: a file stops at its listed size (more is refused, and
nothing past the size is written), a listing at ``LISTING_BYTES``; after ``$ZOO_DOWNLOAD_TIMEOUT`` seconds (60) a
stream must have averaged ``MIN_RATE`` since then, so a server dripping a byte a second is refused within the
timeout (plus one socket read, itself bounded by the timeout) instead of holding the process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import posixpath
import time
from urllib.parse import urljoin, urlsplit, urlunsplit

from zoo.io.weights import CheckpointError

TRUSTED_HOSTS_ENV = "ZOO_TRUSTED_ARTIFACT_HOSTS"
TIMEOUT_ENV = "ZOO_DOWNLOAD_TIMEOUT"
TIMEOUT = 60
# 0.5 Mbit/s: slower than any link a model is fetched over, faster than any drip that means to hang.
MIN_RATE = 64 * 1024
CHUNK = 1 << 20
# A listing of a model folder is a few hundred bytes; MLflow's JSON for 10,000 files is about 1 MB.
LISTING_BYTES = 8 << 20
MAX_REDIRECTS = 3
ENDPOINT = "/mlflow-artifacts/artifacts"
HTTP_SCHEMES = ("http", "https", "mlflow-artifacts")
DEFAULT_PORTS = {"http": 80, "https": 443}


class DownloadRefused(CheckpointError):
    """A model or file in a tracking store that the zoo will not download (outside the store's own artifacts, over the
    size limit, a path that leaves its folder, missing, too slow); the message names the URI and what to do. Defined
    here, below ``zoo.tracking.downloads``, which raises it too."""


def download_timeout() -> int:
    """Seconds a stream may take before it must keep ``MIN_RATE``: $ZOO_DOWNLOAD_TIMEOUT, else 60."""
    return positive_setting(TIMEOUT_ENV, TIMEOUT, "seconds")


def positive_setting(env: str, default: int, unit: str) -> int:
    """The positive whole number ``$env`` holds, else ``default``; anything else is a one-line refusal."""
    value = os.getenv(env)
    if not value:
        return default
    if not value.isdigit() or int(value) <= 0:
        raise DownloadRefused(f"${env}={value!r} is not a positive number of {unit}: set it to one")
    return int(value)


def origin(url: str) -> str:
    """``scheme://host:port`` of an http(s) URL, the port spelled out; '' for anything else."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port that is not a number
        return ""
    return f"{scheme}://{parts.hostname.lower()}:{port}" if scheme in DEFAULT_PORTS and parts.hostname else ""


def trusted_origins(store: str) -> frozenset[str]:
    """The origins the tracking credentials may go to: the tracking server's own, and those the user lists in
    $ZOO_TRUSTED_ARTIFACT_HOSTS (comma-separated ``https://host[:port]``)."""
    found = {origin(store)} - {""}
    for entry in filter(None, (e.strip() for e in os.getenv(TRUSTED_HOSTS_ENV, "").split(","))):
        parts = urlsplit(entry)
        if not origin(entry) or parts.path.strip("/") or parts.query or parts.username:
            raise DownloadRefused(
                f"${TRUSTED_HOSTS_ENV} lists {entry!r}, not an origin: write each as https://host[:port], "
                "comma-separated"
            )
        found.add(origin(entry))
    return frozenset(found)


def safe_url(url: str) -> str:
    """``url`` as a message may show it: no user, password or query (a presigned URL's query is a credential)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def copy_bounded(src, out, cap: int, uri: str, what: str, bound: str = "the store listed") -> int:
    """Bytes from ``src`` (a ``read1`` stream) written to ``out``, at most ``cap`` (``bound`` says whose number it
    is): one byte more is refused before it is written, and so is a stream below ``MIN_RATE`` after the timeout.
    Returns the count."""
    import urllib3

    grace, start, got = download_timeout(), time.monotonic(), 0
    while True:
        try:
            chunk = src.read1(min(CHUNK, cap + 1 - got))
        except (OSError, urllib3.exceptions.HTTPError) as err:  # a socket read past its timeout, a cut connection
            raise DownloadRefused(f"{uri}: reading {what} failed ({type(err).__name__}): check the server") from err
        if not chunk:
            return got
        if got + len(chunk) > cap:
            raise DownloadRefused(f"{uri}: {what} runs past the {cap:,} bytes {bound}: refused")
        out.write(chunk)
        got += len(chunk)
        late = time.monotonic() - start - grace
        if late > 0 and got < late * MIN_RATE:
            raise DownloadRefused(
                f"{uri}: {what} arrives slower than {MIN_RATE // 1024} KiB/s after {grace} s ({got:,} bytes): "
                f"refused; raise ${TIMEOUT_ENV} for a slow link"
            )


class HttpArtifacts:
    """An MLflow artifact location over HTTP (``http(s)://.../mlflow-artifacts/artifacts/...`` or
    ``mlflow-artifacts:``), listed and read like MLflow's ``HttpArtifactRepository``, with the credentials and
    bounds above."""

    def __init__(self, root: str, store: str, uri: str):
        from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

        url = MlflowArtifactsRepository.resolve_uri(root, store) if root.startswith("mlflow-artifacts:") else root
        base, found, tail = url.partition(ENDPOINT)
        if not found or not origin(url):
            raise DownloadRefused(f"{uri}: the artifact location {safe_url(url)} is not an MLflow artifact server's")
        self.base, self.root, self.url, self.uri = base, tail.strip("/"), url.rstrip("/"), uri
        self.trusted, self.store = trusted_origins(store), store

    def list_artifacts(self, path: str | None = None) -> list:
        from mlflow.entities import FileInfo

        def entry(f: dict) -> FileInfo:  # each checked to lie inside its folder by downloads.listing
            name, size = str(f["path"]), int(f["file_size"]) if "file_size" in f else None
            return FileInfo(posixpath.join(path, name) if path else name, bool(f["is_dir"]), size)

        inside = posixpath.join(self.root, path) if path else self.root
        with self.get(f"{self.base}{ENDPOINT}", {"path": inside}) as response:
            body = io.BytesIO()
            what = f"the listing of {path or 'its folder'}"
            copy_bounded(response.raw, body, LISTING_BYTES, self.uri, what, "a listing may take")
        try:
            files = [entry(f) for f in json.loads(body.getvalue()).get("files", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as err:  # the server's JSON: any mistake is one line
            raise DownloadRefused(f"{self.uri}: the server's listing of {path!r} is not MLflow's ({err!r})") from err
        if len(files) == 1 and path and not files[0].is_dir and files[0].path == f"{path}/{posixpath.basename(path)}":
            return []  # MLflow's answer for a file: it lists itself
        return sorted(files, key=lambda f: f.path)

    @contextlib.contextmanager
    def open(self, path: str):
        """The file at ``path`` as a ``read1`` stream of its bytes as sent (no content decoding)."""
        with self.get(f"{self.url}/{path}") as response:
            yield response.raw

    @contextlib.contextmanager
    def get(self, url: str, params: dict | None = None):
        """A streamed 200 answer to GET ``url``, following at most ``MAX_REDIRECTS`` redirects, each hop with the
        credentials only when its origin is trusted."""
        for _ in range(MAX_REDIRECTS + 1):
            response = self.request(url, params)
            if response.status_code not in (301, 302, 303, 307, 308):
                break
            url, params = urljoin(response.url, response.headers.get("Location", "")), None
            response.close()
        else:
            raise DownloadRefused(f"{self.uri}: the server redirected over {MAX_REDIRECTS} times: refused")
        try:
            if response.status_code in (401, 403) and origin(url) not in self.trusted:
                raise DownloadRefused(
                    f"{self.uri}: {safe_url(url)} answered {response.status_code} to a request without "
                    f"credentials: the tracking server {safe_url(self.store)} placed its artifacts there, and the "
                    f"tracking credentials go only to its own host; list {origin(url)} in ${TRUSTED_HOSTS_ENV} "
                    "if that host is yours"
                )
            if response.status_code != 200:
                raise DownloadRefused(f"{self.uri}: {safe_url(url)} answered {response.status_code}: check the server")
            yield response
        finally:
            response.close()

    def request(self, url: str, params: dict | None):
        """One GET, not redirected: through MLflow (its credentials, retries, TLS settings) to a trusted origin,
        plain to any other."""
        import requests
        from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_TIMEOUT
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import http_request

        timeout = min(MLFLOW_HTTP_REQUEST_TIMEOUT.get(), download_timeout())
        options = {"params": params, "stream": True, "allow_redirects": False, "timeout": timeout}
        identity = {"Accept-Encoding": "identity"}  # the bytes counted are the bytes written
        if origin(url) in self.trusted:
            return http_request(get_default_host_creds(url), "", "GET", extra_headers=identity, **options)
        try:
            return requests.get(url, headers=identity, **options)
        except requests.RequestException as err:
            raise DownloadRefused(f"{self.uri}: {safe_url(url)} could not be read ({type(err).__name__})") from err
