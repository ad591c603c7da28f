"""Triton's two sources: the Prometheus ``/metrics`` text and the repository index.

Facts this relies on (seen on a real Triton 2.51 server, tested in tests/integration/test_triton_real.py):
the index is ``POST /v2/repository/index`` (GET answers 405); labels are
``model``/``version``; the metrics port answers 200 to any path, so a wrong
``--triton-metrics-url`` path is caught by finding no Triton series, not by status.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import orjson

from triton_http import AdminKey, Client, TextReader, admin_headers, redact, refusal_hint

from ..series import Exposition
from . import Collected, SourceError, SourceKind, VersionState
from .fetch import fetch
from .modelconfig import ModelConfigs
from .promtext import Parser

try:  # /metrics straight into a str (the C scanner's module: exporter/sources/_scan.c)
    from . import _scan

    read_text: TextReader | None = _scan.read_ascii
except ImportError:  # pragma: no cover - depends on the build
    read_text = None


class TritonMetricsSource:
    name = "triton_metrics"
    kind = SourceKind.TRITON

    def __init__(
        self,
        url: str,
        parser: Parser,
        connect_timeout: float,
        max_bytes: int,
        http: Client | None = None,
    ) -> None:
        self.url = url
        self.shown = redact(url)  # for messages: never the credentials
        self.parser = parser
        self.http = http or Client(connect_timeout, max_bytes)

    def collect(self, timeout: float) -> Collected:
        # Read as a str when it can be (Triton's body is ASCII): bytes and their decoded text held together
        # were the process's peak at 1000 LLM models (a 10 MB body).
        resp = fetch(self.http, "GET", self.url, timeout, text=read_text)
        if resp.status != 200:
            raise SourceError(f"{self.shown}: answered HTTP {resp.status}")
        text = resp.text
        if text is None:  # not ASCII, sent chunked, or no C scanner: decoded, the bytes let go before the parse
            size = len(resp.body)
            text = resp.body.decode("utf-8", errors="replace")
        else:
            size = len(text)
        html = "html" in resp.content_type.lower()
        del resp
        if html or text[:512].lstrip(" \t\n\r\x0b\x0c")[:1] == "<":
            raise SourceError(f"{self.shown}: answered an HTML page, not Prometheus text")
        if "nv_" not in text:
            raise SourceError(f"{self.shown}: no Triton (nv_*) series in {size} bytes; wrong URL?")
        exposition: Exposition = self.parser.parse(text)
        return Collected(samples=exposition)

    def close(self) -> None:
        pass  # the client holds no connection between calls

    def narrowed(self, wanted: Iterable[str], selects: Mapping[str, tuple[str, frozenset[str]]]) -> TritonMetricsSource:
        """The same endpoint and client with a parser of ``wanted`` alone: a scrape between full cycles scans
        only the fast metrics' families of the body."""
        return TritonMetricsSource(
            self.url, Parser(wanted, selects=selects), self.http.connect_timeout, self.http.max_bytes, self.http
        )


class TritonIndexSource:
    name = "triton_index"
    kind = SourceKind.TRITON

    def __init__(
        self,
        triton_url: str,
        connect_timeout: float,
        max_bytes: int,
        http: Client | None = None,
        admin_key: AdminKey | None = None,
    ) -> None:
        self.url = triton_url.rstrip("/") + "/v2/repository/index"
        self.shown = redact(self.url)  # for messages: never the credentials
        # The index and the model configurations are restricted APIs where Triton runs with the admin key.
        self.admin_key = admin_key
        self.http = http or Client(connect_timeout, max_bytes, headers=admin_headers(admin_key))
        self._last: tuple[bytes, list[VersionState]] | None = None  # the index rarely changes
        self._listed: frozenset[tuple[str, str]] | None = None
        # READY versions' configurations and the server's version, read only when they can have changed
        self.configs = ModelConfigs(triton_url, self.http)

    def collect(self, timeout: float) -> Collected:
        start = time.monotonic()
        try:
            resp = fetch(self.http, "POST", self.url, timeout, {})
            if resp.status != 200:
                hint = refusal_hint(resp.status, resp.body, self.admin_key)
                raise SourceError(f"{self.shown}: answered HTTP {resp.status}{hint}")
            if self._last is None or self._last[0] != resp.body:
                self._last = (resp.body, parse_index(resp.body, self.shown))
                self._listed = frozenset((v.model, v.version) for v in self._last[1] if v.version)
        except SourceError:
            self.configs.forget()  # a failed read may hide a restart
            raise
        index = list(self._last[1])
        configs = self.configs.refresh(index, timeout - (time.monotonic() - start))  # within this call's timeout
        return Collected(index=index, configs=configs, server_version=self.configs.server_version)

    def listed(self) -> frozenset[tuple[str, str]] | None:
        """(model, version) of every version the last index read lists; None before one was read.

        The trace relay measures only these (anyone in the task can post spans naming other models)."""
        return self._listed

    def close(self) -> None:
        pass  # the client holds no connection between calls


def parse_index(body: bytes, url: str = "index") -> list[VersionState]:
    """Rows of the index; rows that are not objects with a string name are skipped."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        snippet = body[:60].decode("utf-8", errors="replace").replace("\n", " ")
        raise SourceError(f"{url}: answered non-JSON ({snippet!r})") from None
    if not isinstance(data, list):
        raise SourceError(f"{url}: answered JSON that is not a list")
    out = []
    for row in data:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            continue
        out.append(
            VersionState(
                model=row["name"],
                version=_text(row.get("version")),
                state=_text(row.get("state")),
                reason=_text(row.get("reason")),
            )
        )
    return out


def _text(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))
