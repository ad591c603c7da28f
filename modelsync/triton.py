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

import requests

from .errors import LoadFailed, TritonUnavailable

CONNECT_TIMEOUT = 2.0
SHORT_TIMEOUT = 10.0


class Triton:
    def __init__(self, url: str, load_timeout: float, session: requests.Session | None = None) -> None:
        self.url = url.rstrip("/")
        self.load_timeout = load_timeout
        self.session = session or requests.Session()
        self._lock = threading.Lock()

    def _post(self, path: str, timeout: float, body: object | None = None) -> requests.Response:
        try:
            return self.session.post(
                self.url + path,
                json=body if body is not None else {},
                timeout=(CONNECT_TIMEOUT, timeout),
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise TritonUnavailable(f"Triton at {self.url} unreachable: {type(exc).__name__}: {exc}") from exc

    def live(self) -> bool:
        try:
            r = self.session.get(self.url + "/v2/health/live", timeout=(CONNECT_TIMEOUT, SHORT_TIMEOUT))
        except requests.RequestException:
            return False
        return r.status_code == 200

    def ready(self, model: str) -> bool:
        """True when Triton would answer inference for ``model`` now."""
        try:
            r = self.session.get(f"{self.url}/v2/models/{model}/ready", timeout=(CONNECT_TIMEOUT, SHORT_TIMEOUT))
        except requests.RequestException as exc:
            raise TritonUnavailable(f"Triton at {self.url} unreachable: {type(exc).__name__}: {exc}") from exc
        return r.status_code == 200

    def index(self) -> list[dict[str, object]]:
        r = self._post("/v2/repository/index", SHORT_TIMEOUT)
        if r.status_code != 200:
            raise TritonUnavailable(f"POST /v2/repository/index answered {r.status_code}")
        body = r.json()
        return body if isinstance(body, list) else []

    def load(self, model: str) -> None:
        """Load (or reload) ``model`` and confirm it is READY; LoadFailed carries Triton's reason."""
        with self._lock:
            r = self._post(f"/v2/repository/models/{model}/load", self.load_timeout)
        if r.status_code != 200:
            raise LoadFailed(f"Triton refused to load {model}: {_reason(r)}")
        deadline = time.monotonic() + SHORT_TIMEOUT
        while not self.ready(model):
            if time.monotonic() > deadline:
                raise LoadFailed(f"Triton accepted the load of {model} but the model is not READY")
            time.sleep(0.1)

    def unload(self, model: str, wait: float = 60.0) -> None:
        """Unload and wait until no version of ``model`` is READY or UNLOADING (unload returns early)."""
        with self._lock:
            r = self._post(f"/v2/repository/models/{model}/unload", SHORT_TIMEOUT)
        if r.status_code != 200:
            raise LoadFailed(f"Triton refused to unload {model}: {_reason(r)}")
        deadline = time.monotonic() + wait
        while any(v.get("name") == model and v.get("state") in ("READY", "UNLOADING") for v in self.index()):
            if time.monotonic() > deadline:
                raise LoadFailed(f"{model} still not unloaded after {wait:g}s")
            time.sleep(0.1)


def _reason(r: requests.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return f"HTTP {r.status_code}: {r.text[:2000]}"
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return f"HTTP {r.status_code}: {str(body)[:2000]}"
