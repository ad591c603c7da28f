"""Every metric modelsync emits, defined once, and the recorder that writes them as EMF.

:data:`METRICS` is the whole table (name, unit, which event carries it,
dimension sets, help). The EMF encoder, the rendered dashboard section and
alarm (``exporter/render/modelsync.py``) and the tests all read it, so a
renamed metric breaks the render instead of leaving an empty widget.

Three kinds of event, each one EMF document:

- ``attempt``: one per sync attempt of one model (dimensions ``model`` and
  ``result``), with the phase durations it reached;
- ``model``: one per model per reconcile, ``ModelInSync`` 0/1, carrying the
  ``ModelArtifact`` property (the sha256 Triton serves from this host) so
  Logs Insights can count distinct builds of a model across hosts;
- ``host``: one per reconcile, the host's totals.

Every dimension set starts with the empty one: a service-wide series per
metric (what the alarm reads); the host is a property, never a dimension
(it would make one billed metric per host).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from catalog import Kind, Metric, Scope
from telemetry.emf import Encoder, Event, clip, safe_dimension_value
from telemetry.sinks import Sink

ATTEMPT, MODEL, HOST = "attempt", "model", "host"
PHASES = ("download", "verify", "extract", "swap", "load")
SOURCE = "modelsync"


@dataclass(frozen=True)
class MetricRow:
    name: str
    unit: str
    event: str  # attempt | model | host: which event carries it
    dimension_sets: tuple[tuple[str, ...], ...]
    help: str


_ALL, _MODEL, _RESULT, _MODEL_RESULT = (), ("model",), ("result",), ("model", "result")

METRICS: tuple[MetricRow, ...] = (
    MetricRow(
        "SyncAttempts",
        "Count",
        ATTEMPT,
        (_ALL, _RESULT, _MODEL_RESULT),
        "1 per sync attempt of a model, by result: ok, hash_mismatch, missing_hash, download_error, "
        "disk_full, unsafe_archive, load_failed, rolled_back.",
    ),
    MetricRow(
        "SyncFailures",
        "Count",
        ATTEMPT,
        (_ALL, _MODEL),
        "1 per attempt that did not end ok, 0 for one that did; the sync-failure alarm reads it.",
    ),
    *(
        MetricRow(
            f"Sync{p.title()}Time",
            "Milliseconds",
            ATTEMPT,
            (_ALL, _MODEL),
            f"Duration of the {p} phase of an attempt (emitted only for the phases the attempt reached).",
        )
        for p in PHASES
    ),
    MetricRow(
        "SyncUploadToReady",
        "Seconds",
        ATTEMPT,
        (_ALL, _MODEL),
        "From the archive's S3 LastModified to the model READY in Triton (successful attempts).",
    ),
    MetricRow("SyncBytesDownloaded", "Bytes", ATTEMPT, (_ALL, _MODEL), "Archive bytes read from S3 by the attempt."),
    MetricRow(
        "ModelInSync",
        "Count",
        MODEL,
        (_ALL, _MODEL),
        "1 when the installed archive is the one in S3 and Triton reports the model READY, else 0; once "
        "per model per reconcile, with the ModelArtifact property (the sha256 served).",
    ),
    MetricRow("ModelsInSync", "Count", HOST, (_ALL,), "Models of the bucket prefix in sync on this host."),
    MetricRow(
        "ModelsOutOfSync",
        "Count",
        HOST,
        (_ALL,),
        "Models not in sync on this host: failed, not READY, or removed from S3 but kept.",
    ),
    MetricRow(
        "SecondsSinceLastSuccess",
        "Seconds",
        HOST,
        (_ALL,),
        "Since the last reconcile that left every model in sync (absent until the first one).",
    ),
)
BY_NAME: dict[str, MetricRow] = {m.name: m for m in METRICS}


def catalog_metrics() -> list[Metric]:
    """The table as the encoder's metric objects (base scope: no dimensions, the rest as rollups)."""
    out = []
    for row in METRICS:
        if row.dimension_sets[0] != ():
            raise ValueError(f"{row.name}: the first dimension set must be the empty one")
        out.append(
            Metric(row.name, Scope.TASK, row.unit, Kind.SELF, row.help, rollups=row.dimension_sets[1:], source=SOURCE)
        )
    return out


@dataclass
class Attempt:
    """What one sync attempt of one model did; becomes one ``attempt`` event."""

    model: str
    result: str
    reason: str = ""
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    bytes_downloaded: int = 0
    sha256: str = ""  # the archive attempted (expected hash, or the computed one when unverified)
    version_id: str = ""
    etag: str = ""
    key: str = ""
    serving: str = ""  # sha256 on disk (and in Triton) after the attempt
    upload_to_ready: float | None = None
    reused: bool = False  # linked a directory another repository of the store had extracted: no download


@dataclass
class ModelState:
    """One model at the end of a reconcile; becomes one ``model`` event."""

    model: str
    in_sync: bool
    serving: str = ""  # installed sha256, "" when nothing is installed
    expected: str = ""  # sha256 of the archive in S3 ("" when unknown or removed)
    version_id: str = ""
    reason: str = ""


class Recorder:
    """Builds the events and hands the encoded lines to the exporter's sink."""

    def __init__(
        self, namespace: str, sink: Sink, host: str, storage_resolution: int = 60, wall: Callable[[], float] = time.time
    ) -> None:
        self.encoder = Encoder(namespace, catalog_metrics(), storage_resolution)
        self.sink = sink
        self.host = host
        self.wall = wall

    def _send(self, event: Event) -> None:
        self.sink.send(self.encoder.encode(event, int(self.wall() * 1000)))

    def _model_dims(self, model: str, props: dict[str, object]) -> dict[str, str]:
        safe = safe_dimension_value(model)
        if safe.changed:
            props["model_original"] = clip(model, 4096)
        return {"model": safe.value}

    def attempt(self, a: Attempt) -> None:
        props: dict[str, object] = {
            "host": self.host,
            "sha256": a.sha256,
            "s3_version_id": a.version_id,
            "etag": a.etag,
            "key": a.key,
            "ModelArtifact": a.serving,
        }
        if a.reason:
            props["reason"] = clip(a.reason)
        if a.reused:
            props["reused"] = True
        dims = {**self._model_dims(a.model, props), "result": a.result}
        values: dict[str, float] = {"SyncAttempts": 1.0, "SyncFailures": 0.0 if a.result == "ok" else 1.0}
        for phase, seconds in a.phases.items():
            values[f"Sync{phase.title()}Time"] = round(seconds * 1000.0, 3)
        if a.bytes_downloaded:
            values["SyncBytesDownloaded"] = float(a.bytes_downloaded)
        if a.upload_to_ready is not None:
            values["SyncUploadToReady"] = round(max(0.0, a.upload_to_ready), 3)
        self._send(Event(Scope.TASK, dims, values, props))

    def model_state(self, s: ModelState) -> None:
        props: dict[str, object] = {
            "host": self.host,
            "ModelArtifact": s.serving,
            "sha256": s.expected,
            "s3_version_id": s.version_id,
        }
        if s.reason:
            props["reason"] = clip(s.reason)
        self._send(
            Event(Scope.TASK, self._model_dims(s.model, props), {"ModelInSync": 1.0 if s.in_sync else 0.0}, props)
        )

    def host_state(
        self, in_sync: int | None, out_of_sync: int | None, since_success: float | None, **props: object
    ) -> None:
        """Counts are None when S3 could not be listed: no number rather than a wrong one."""
        values: dict[str, float] = {}
        if in_sync is not None and out_of_sync is not None:
            values = {"ModelsInSync": float(in_sync), "ModelsOutOfSync": float(out_of_sync)}
        if since_success is not None:
            values["SecondsSinceLastSuccess"] = round(max(0.0, since_success), 3)
        self._send(Event(Scope.TASK, {}, values, {"host": self.host, **props}))
