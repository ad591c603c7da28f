"""Small shared helpers for tests: run the real pipeline, read its events back."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import orjson

from catalog import build
from exporter.__main__ import build_sources
from exporter.config import Settings
from exporter.pipeline import CycleResult, Pipeline
from exporter.series import model_key
from exporter.sources import Collected, SourceKind
from exporter.sources.modelconfig import parse_config
from exporter.sources.promtext import Parser
from exporter.sources.triton import parse_index
from telemetry.emf_validate import validate

ECS_TASK = {  # what the ECS task metadata endpoint (v4) answers at /task, trimmed
    "Cluster": "arn:aws:ecs:us-east-1:111122223333:cluster/inference",
    "TaskARN": "arn:aws:ecs:us-east-1:111122223333:task/inference/0123456789abcdef",
    "Family": "triton",
    "Revision": "7",
    "AvailabilityZone": "us-east-1b",
    "LaunchType": "EC2",
    "Containers": [{"Name": "triton-server"}],
}


CATALOG = build()  # the built-in catalog, as the sidecar builds it with default settings


def pipeline_for(server, **overrides) -> Pipeline:
    """A Pipeline with the real Triton sources pointed at a demo.triton.TritonServer."""
    settings = replace(
        Settings(triton_url=server.url, metrics_url=server.metrics_url, nvml="off", timeout=5.0), **overrides
    )
    return Pipeline(settings, CATALOG, build_sources(settings, CATALOG))


def documents(result: CycleResult) -> list[dict]:
    """Decode the cycle's EMF lines, asserting every one is valid EMF."""
    docs = []
    for raw in result.events:
        errors = validate(raw)
        assert not errors, (errors, raw[:300])
        docs.append(orjson.loads(raw))
    return docs


def model_doc(docs: list[dict], model: str, version: str = "1") -> dict:
    found = [d for d in docs if d.get("model") == model and d.get("version") == version]
    assert len(found) == 1, f"expected one event for {model}:{version}, got {len(found)}"
    return found[0]


def task_doc(docs: list[dict]) -> dict:
    found = [d for d in docs if "ExporterHeartbeat" in d]
    assert len(found) == 1
    return found[0]


def metric_names(doc: dict) -> set[str]:
    return {m["Name"] for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}


class TextSource:
    """A Triton /metrics source that serves fixed texts in turn (for golden and fault tests)."""

    name = "triton_metrics"

    kind = SourceKind.TRITON

    def __init__(self, *texts: str, selects: bool = True) -> None:
        """``selects``: skip the series no metric reads, as the sidecar does without an OTLP output."""
        self.texts = list(texts)
        self.parser = Parser(CATALOG.wanted_samples(), selects=CATALOG.sample_selects() if selects else None)
        self.calls = 0

    def collect(self, timeout: float) -> Collected:
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        return Collected(samples=self.parser.parse(text))

    def close(self) -> None:
        pass


class IndexSource:
    name = "triton_index"
    kind = SourceKind.TRITON

    def __init__(self, body: bytes = b"[]", configs: dict[str, bytes] | None = None, server_version: str = "") -> None:
        """``configs``: "model/version" -> the body Triton's model config API answers for it."""
        self.body = body
        self.configs = {model_key(*k.rsplit("/", 1)): parse_config(v) for k, v in (configs or {}).items()}
        self.server_version = server_version

    def collect(self, timeout: float) -> Collected:
        return Collected(index=parse_index(self.body), configs=dict(self.configs), server_version=self.server_version)

    def close(self) -> None:
        pass


class FixedSource:
    """A Triton source answering from a callable: any object with name, kind, collect(timeout), close()."""

    kind = SourceKind.TRITON

    def __init__(self, name: str, collect: Callable[[], Collected]) -> None:
        self.name = name
        self._collect = collect

    def collect(self, timeout: float) -> Collected:
        return self._collect()

    def close(self) -> None:
        pass


class Capture(logging.Handler):
    """Keeps the exporter's log records for assertions (attach to a logger, remove after)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]

    @classmethod
    @contextlib.contextmanager
    def on(cls, name: str, level: int = logging.INFO) -> Iterator[Capture]:
        """A Capture on logger ``name`` set to ``level`` (whatever an earlier test's logs.setup() left on it),
        removed and the logger's level restored after."""
        capture = cls()
        logger = logging.getLogger(name)
        old = logger.level
        logger.addHandler(capture)
        logger.setLevel(level)
        try:
            yield capture
        finally:
            logger.removeHandler(capture)
            logger.setLevel(old)


def success_count(server, model: str) -> float:
    """``nv_inference_request_success`` of ``model`` (all versions) as Triton's own /metrics shows it now."""
    total = 0.0
    prefix = f'nv_inference_request_success{{model="{model}",'
    for line in server.metrics_text().splitlines():
        if line.startswith(prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_counted(server, model: str, total: float, timeout: float = 10.0) -> None:
    """Wait until Triton counts ``total`` successes of ``model``: it counts a request after answering it, so a
    scrape right after the last answer may miss it (seen: 4 of 5 in a cold full run)."""
    deadline = time.monotonic() + timeout
    while (seen := success_count(server, model)) < total:
        if time.monotonic() > deadline:
            raise AssertionError(f"Triton counts {seen:g} successes of {model}, not {total:g}, after {timeout:g}s")
        time.sleep(0.02)
