"""The recorder that writes modelsync's metrics as EMF, from the model-sync pack of the catalog.

The metrics are catalog data (``catalog/modelsync.toml``, read with
:func:`catalog.modelsync_catalog`): name, unit, which event carries it,
dimension sets, help, and the ``result`` dimension's values with their
meaning. The EMF encoder here, the rendered dashboard section and alarms,
docs/modelsync.md's tables and ``cost`` all read the pack, so a renamed
metric breaks the render instead of leaving an empty widget. The result
names of :class:`modelsync.errors.Result` are checked against the pack when
this module is imported.

Five kinds of event, each one EMF document:

- ``attempt``: one per sync attempt of one model (dimensions ``model`` and
  ``result``), with the phase durations it reached;
- ``model``: one per model per reconcile, ``ModelInSync`` 0/1, carrying the
  ``ModelArtifact`` property (the sha256 Triton serves from this host) so
  Logs Insights can count distinct builds of a model across hosts;
- ``host``: one per reconcile, the host's totals (``RolloutsInFlight`` with safe rollouts on);
- ``rollout``: one per decision of a safe rollout (dimension ``model``), from the host that made it, with
  the verdict, the artifacts and the evidence as properties (modelsync/rollout.py).
- ``start``: one per task start, ``TimeToServe`` and its phases (modelsync/startup.py).

Every dimension set starts with the empty one: a service-wide series per
metric (what the alarm reads); the host is a property, never a dimension
(it would make one billed metric per host).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from catalog import EVENT_KEYS, Catalog, Metric, Scope, modelsync_catalog
from telemetry.emf import Encoder, Event, clip, dimensions_for
from telemetry.sinks import Sink

from .errors import Result

ROLLOUT_METRICS = ("RolloutsStarted", "RolloutsPromoted", "RolloutsRejected", "RolloutRollbacks", "RolloutEvidenceWait")
PHASES = ("download", "verify", "extract", "swap", "load")
# The start event's (modelsync/startup.py): the whole, then its phases in startup.PHASES' order.
START_METRICS = ("TimeToServe", "StartWaitTime", "StartListTime", "StartDownloadTime", "StartVerifyTime",
                 "StartPlaceTime", "StartLoadTime", "StartFirstReadyTime")  # fmt: skip
KEYS = EVENT_KEYS[Scope.MODELSYNC]  # model, result: what an event may carry as dimensions


def check_pack(pack: Catalog) -> None:
    """Refuse a pack that disagrees with this module: the result names, a phase or an event without its metric."""
    declared = pack.dimensions["result"].names() if "result" in pack.dimensions else ()
    if declared != tuple(r.value for r in Result):
        raise ValueError(
            f"modelsync/errors.py Result {[r.value for r in Result]} differs from the result values the "
            f"model-sync pack declares {list(declared)}"
        )
    wanted = {
        *(f"Sync{p.title()}Time" for p in PHASES),
        "SyncAttempts", "SyncFailures", "SyncUploadToReady", "SyncBytesDownloaded",
        "ModelInSync", "ModelsInSync", "ModelsOutOfSync", "SecondsSinceLastSuccess", "RolloutsInFlight",
        *ROLLOUT_METRICS, *START_METRICS,
    }  # fmt: skip
    missing = sorted(wanted - {m.name for m in pack.metrics})
    if missing:
        raise ValueError(f"the model-sync pack does not define {', '.join(missing)}, which modelsync emits")


PACK: Catalog = modelsync_catalog()
check_pack(PACK)
METRICS: tuple[Metric, ...] = PACK.metrics
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


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
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # (phase, start, end): perf_counter s

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block into ``phases[name]`` (a phase may be entered more than once: the times add up) and
        keep its interval in ``spans`` (modelsync/startup.py measures a task's start from them)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.phases[name] = self.phases.get(name, 0.0) + end - start
            self.spans.append((name, start, end))


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
        self.encoder = Encoder(namespace, METRICS, storage_resolution)
        self.sink = sink
        self.host = host
        self.wall = wall
        self.watchers: list[Callable[[Attempt], None]] = []  # told of every attempt recorded (startup.py)
        self._lock = threading.Lock()

    def _send(self, event: Event) -> None:
        line = self.encoder.encode(event, int(self.wall() * 1000))
        with self._lock:  # models install in parallel (reconcile.Syncer._each): one line at a time
            self.sink.send(line)

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
        dims = dimensions_for(KEYS, {"model": a.model, "result": a.result}, props)
        values: dict[str, float] = {"SyncAttempts": 1.0, "SyncFailures": 0.0 if a.result == "ok" else 1.0}
        for phase, seconds in a.phases.items():
            values[f"Sync{phase.title()}Time"] = round(seconds * 1000.0, 3)
        if a.bytes_downloaded:
            values["SyncBytesDownloaded"] = float(a.bytes_downloaded)
        if a.upload_to_ready is not None:
            values["SyncUploadToReady"] = round(max(0.0, a.upload_to_ready), 3)
        self._send(Event(Scope.MODELSYNC, dims, values, props))
        for watcher in self.watchers:
            watcher(a)

    def model_state(self, s: ModelState) -> None:
        props: dict[str, object] = {
            "host": self.host,
            "ModelArtifact": s.serving,
            "sha256": s.expected,
            "s3_version_id": s.version_id,
        }
        if s.reason:
            props["reason"] = clip(s.reason)
        dims = dimensions_for(("model",), {"model": s.model}, props)
        self._send(Event(Scope.MODELSYNC, dims, {"ModelInSync": 1.0 if s.in_sync else 0.0}, props))

    def host_state(
        self,
        in_sync: int | None,
        out_of_sync: int | None,
        since_success: float | None,
        in_flight: int | None = None,
        **props: object,
    ) -> None:
        """Counts are None when S3 could not be listed: no number rather than a wrong one. ``in_flight``: the
        rollouts this host knows of (None: safe rollouts are off)."""
        values: dict[str, float] = {}
        if in_sync is not None and out_of_sync is not None:
            values = {"ModelsInSync": float(in_sync), "ModelsOutOfSync": float(out_of_sync)}
        if since_success is not None:
            values["SecondsSinceLastSuccess"] = round(max(0.0, since_success), 3)
        if in_flight is not None:
            values["RolloutsInFlight"] = float(in_flight)
        self._send(Event(Scope.MODELSYNC, {}, values, {"host": self.host, **props}))

    def rollout(self, model: str, values: dict[str, float], props: dict[str, object]) -> None:
        """One decision of a rollout (``values``: some of :data:`ROLLOUT_METRICS`); ``props`` carry the verdict,
        the artifacts and the evidence."""
        unknown = set(values) - set(ROLLOUT_METRICS)
        if unknown:
            raise ValueError(f"not rollout metrics: {sorted(unknown)}")
        dims = dimensions_for(("model",), {"model": model}, props)
        self._send(Event(Scope.MODELSYNC, dims, values, {"host": self.host, **props}))

    def start(self, values: dict[str, float], props: dict[str, object]) -> None:
        """A task's start, once (modelsync/startup.py): ``values`` are some of :data:`START_METRICS`."""
        unknown = set(values) - set(START_METRICS)
        if unknown:
            raise ValueError(f"not start metrics: {sorted(unknown)}")
        self._send(Event(Scope.MODELSYNC, {}, values, {"host": self.host, **props}))
