"""Triton's repository API in explicit model-control mode: load, unload, readiness.

What the server does (seen on Triton 2.51):

- ``POST /v2/repository/models/<m>/load`` blocks until the model loaded or
  failed. Loading a model that is already READY reloads it in the
  background and swaps only on success: the old version keeps answering,
  and if the new one fails the old one stays loaded.
- ``.../unload`` returns before the unload is done: poll the index.
- Two simultaneous loads of one model can load it twice: one load call at a
  time (a lock around every load and unload call of this client).
- Names travel verbatim in the path; Triton does not decode ``%XX``, so the
  store only accepts names that need no escaping.
"""

from __future__ import annotations

import threading
import time

from triton_http import AdminKey, Client, RequestFailed, Response, admin_headers, refusal_hint

from .errors import LoadFailed, TritonUnavailable

CONNECT_TIMEOUT = 2.0
SHORT_TIMEOUT = 10.0
MAX_BODY = 64 * 1024 * 1024  # an answer's bytes at most: the index of thousands of models takes a few MB


class Triton:
    """``admin_key``: sent with every call where Triton restricts its repository API (triton_http/admin.py)."""

    def __init__(
        self, url: str, load_timeout: float, http: Client | None = None, admin_key: AdminKey | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.load_timeout = load_timeout
        self.admin_key = admin_key
        self.http = http or Client(CONNECT_TIMEOUT, MAX_BODY, headers=admin_headers(admin_key))
        self._lock = threading.Lock()

    def _call(self, method: str, path: str, timeout: float) -> Response:
        try:
            return self.http.request(method, self.url + path, timeout, {} if method == "POST" else None)
        except RequestFailed as exc:
            raise TritonUnavailable(f"Triton at {self.url} unreachable: {exc.reason}") from None

    def live(self) -> bool:
        try:
            return self._call("GET", "/v2/health/live", SHORT_TIMEOUT).status == 200
        except TritonUnavailable:
            return False

    def ready(self, model: str, version: str = "") -> bool:
        """True when Triton would answer inference for ``model`` (that ``version`` of it, if given) now."""
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
        return self._call("GET", path, SHORT_TIMEOUT).status == 200

    def index(self) -> list[dict[str, object]]:
        r = self._call("POST", "/v2/repository/index", SHORT_TIMEOUT)
        if r.status != 200:
            hint = refusal_hint(r.status, r.body, self.admin_key)
            raise TritonUnavailable(f"POST /v2/repository/index answered {r.status}{hint}")
        try:
            body = r.json()
        except ValueError:
            raise TritonUnavailable(f"POST /v2/repository/index answered non-JSON ({r.body[:60]!r})") from None
        return [row for row in body if isinstance(row, dict)] if isinstance(body, list) else []

    def load(self, model: str) -> None:
        """Load (or reload) ``model`` and confirm it is READY; LoadFailed carries Triton's reason."""
        with self._lock:
            r = self._call("POST", f"/v2/repository/models/{model}/load", self.load_timeout)
        if r.status != 200:
            raise LoadFailed(
                f"Triton refused to load {model}: {_reason(r)}{refusal_hint(r.status, r.body, self.admin_key)}"
            )
        deadline = time.monotonic() + SHORT_TIMEOUT
        while not self.ready(model):
            if time.monotonic() > deadline:
                raise LoadFailed(f"Triton accepted the load of {model} but the model is not READY")
            time.sleep(0.1)

    def unload(self, model: str, wait: float = 60.0) -> None:
        """Unload and wait until no version of ``model`` is READY or UNLOADING (unload returns early)."""
        with self._lock:
            r = self._call("POST", f"/v2/repository/models/{model}/unload", SHORT_TIMEOUT)
        if r.status != 200:
            raise LoadFailed(
                f"Triton refused to unload {model}: {_reason(r)}{refusal_hint(r.status, r.body, self.admin_key)}"
            )
        deadline = time.monotonic() + wait
        while any(v.get("name") == model and v.get("state") in ("READY", "UNLOADING") for v in self.index()):
            if time.monotonic() > deadline:
                raise LoadFailed(f"{model} still not unloaded after {wait:g}s")
            time.sleep(0.1)


def _reason(r: Response) -> str:
    """Triton's ``{"error": "..."}`` message, or the status and the start of whatever else it answered."""
    try:
        body = r.json()
    except ValueError:
        return f"HTTP {r.status}: {r.body[:2000].decode('utf-8', 'replace')}"
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return f"HTTP {r.status}: {str(body)[:2000]}"
