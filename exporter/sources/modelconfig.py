"""Each loaded model version's configuration and Triton's version, read only when they can have changed.

What it reads (seen on a real Triton 2.51): ``GET /v2/models/{m}/versions/{v}/config``
answers the full configuration as JSON; a decoupled model carries
``"model_transaction_policy": {"decoupled": true}``, other models carry no such
key. ``GET /v2`` answers ``{"name": "triton", "version": "2.51.0", ...}``.

Cost: a version's configuration is read once, when the index first shows it
READY, and kept while it stays READY; a version that leaves READY (unloaded,
reloading, failed) is read again when it comes back, and a failed index read
forgets everything (a restart may hide behind it, as for counters). Reads are
bounded per cycle (:data:`MAX_READS_PER_CYCLE`, and half the cycle's timeout):
at start with 1000 models the configurations arrive over a few cycles; in a
steady state a cycle reads nothing. A read that fails is retried after
:data:`RETRY_AFTER` seconds and never stops the index.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from urllib.parse import quote

import orjson

from telemetry.logs import Conditions, get
from triton_http import Client, redact

from ..series import model_key
from . import ModelConfig, SourceError, VersionState
from .fetch import fetch

MAX_READS_PER_CYCLE = 200
RETRY_AFTER = 60.0
MAX_DISTINCT = 10_000  # distinct configurations interned before the table starts over
log = get("modelconfig")
_interned: dict[ModelConfig, ModelConfig] = {}


def parse_config(body: bytes) -> ModelConfig:
    """The parts of a config the exporter uses; raises ValueError on anything that is not a config object."""
    data = orjson.loads(body)
    if not isinstance(data, dict):
        raise ValueError("answered JSON that is not an object")
    policy = data.get("model_transaction_policy")
    decoupled = isinstance(policy, dict) and policy.get("decoupled") is True
    cache = data.get("response_cache")
    params = data.get("parameters")
    pairs: list[tuple[str, str]] = []
    if isinstance(params, dict):
        for key, value in params.items():
            text = value.get("string_value") if isinstance(value, dict) else None
            if isinstance(key, str) and isinstance(text, str):
                pairs.append((key, text))
    backend = _text(data.get("backend"))
    config = ModelConfig(
        decoupled=decoupled,
        backend=backend,
        platform=_text(data.get("platform")),
        response_cache=isinstance(cache, dict) and cache.get("enable") is True,
        parameters=tuple(sorted(pairs)),
        llm_api=backend == "python" and _is_llm_api(data),
    )
    # Most versions read alike (the few fields kept here): one shared object each, not one per version.
    if len(_interned) >= MAX_DISTINCT:
        _interned.clear()
    return _interned.setdefault(config, config)


def _is_llm_api(data: dict[str, object]) -> bool:
    """TensorRT-LLM's LLM-API model as upstream ships it (triton_backend/all_models/llmapi/tensorrt_llm): a
    Python model taking ``text_input`` and ``sampling_param_*`` inputs and answering ``text_output``. Its
    settings live in a model.yaml the config API does not show, so the inputs are what identifies it."""
    inputs = data.get("input")
    outputs = data.get("output")
    names = {i.get("name") for i in inputs if isinstance(i, dict)} if isinstance(inputs, list) else set()
    out = {o.get("name") for o in outputs if isinstance(o, dict)} if isinstance(outputs, list) else set()
    return (
        "text_input" in names
        and "text_output" in out
        and any(isinstance(n, str) and n.startswith("sampling_param_") for n in names)
    )


def parse_version(body: bytes) -> str:
    data = orjson.loads(body)
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, str) or not version:
        raise ValueError("answered no version")
    return version


class ModelConfigs:
    """The configurations of the READY versions the index lists, and the server's version, kept up to date."""

    def __init__(
        self,
        triton_url: str,
        http: Client,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = triton_url.rstrip("/")
        self.http = http
        self.clock = clock
        self.known: dict[str, ModelConfig] = {}  # entity key -> configuration
        self.failed: dict[str, tuple[float, str]] = {}  # entity key -> (retry after this clock time, why)
        self.server_version = ""
        self.reads = 0  # configuration reads so far (tests and the benchmark count them)
        self.conditions = Conditions(log)

    def forget(self) -> None:
        """The index could not be read: Triton may have restarted, so nothing known can be trusted."""
        self.known.clear()
        self.failed.clear()
        self.server_version = ""

    def refresh(self, index: Sequence[VersionState], timeout: float) -> dict[str, ModelConfig]:
        """Configurations of the index's READY versions: those known, plus what half of ``timeout`` (the time
        the source has left) allows to read."""
        start = self.clock()
        deadline = start + timeout / 2
        ready = {model_key(v.model, v.version): v for v in index if v.state == "READY"}
        for key in [k for k in self.known if k not in ready]:
            del self.known[key]  # unloaded or reloading: read again when it is back
        for key in [k for k in self.failed if k not in ready]:
            del self.failed[key]
        if not self.server_version and self.clock() < deadline:
            try:
                self.server_version = parse_version(self._get("/v2", deadline))
            except (SourceError, ValueError) as exc:
                log.debug("server metadata: %s", exc)
        reads = 0
        for key, v in ready.items():
            if key in self.known:
                continue
            retry = self.failed.get(key)
            if retry is not None and retry[0] > start:
                continue
            if reads >= MAX_READS_PER_CYCLE or self.clock() >= deadline:
                break  # the rest next cycle
            reads += 1
            path = f"/v2/models/{quote(v.model, safe='')}/versions/{quote(v.version, safe='')}/config"
            try:
                self.known[key] = parse_config(self._get(path, deadline))
                self.failed.pop(key, None)
            except (SourceError, ValueError) as exc:
                self.failed[key] = (self.clock() + RETRY_AFTER, f"{v.model!r} version {v.version}: {exc}")
        self.reads += reads
        self.conditions.set(
            "model configuration",
            f"cannot read the configuration of {len(self.failed)} model versions (first: "
            f"{next(iter(self.failed.values()))[1]}); their first-response metrics and coverage wait for it"
            if self.failed
            else None,
        )
        return dict(self.known)

    def _get(self, path: str, deadline: float) -> bytes:
        left = max(deadline - self.clock(), 0.05)
        resp = fetch(self.http, "GET", self.base + path, left)
        if resp.status != 200:
            raise SourceError(f"{redact(path)}: answered HTTP {resp.status}")
        return resp.body


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
