"""One cycle: sources → delta state → catalog transform → EMF events.

Pure of I/O except through the sources it is given, so tests drive it with
fixture sources and a fake clock, and the runner drives it on a schedule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import __version__
from .catalog import CATALOG, Scope, counter_series
from .config import Settings
from .emf import Encoder, Event, clip, dimensions_for
from .logs import Conditions, get
from .promtext import Exposition, LabelSet, model_key
from .sources import Collected, GpuInfo, Source, SourceError, VersionState
from .state import DeltaState
from .transform import Column, evaluate

log = get("pipeline")


@dataclass
class SourceStatus:
    name: str
    up: bool
    duration_ms: float
    error: str = ""


@dataclass
class CycleResult:
    events: list[bytes]
    entities: list[Event]
    statuses: list[SourceStatus]
    elapsed: float | None
    series_kept: int = 0
    series_dropped: int = 0
    parse_errors: int = 0
    resets: int = 0
    index: list[VersionState] | None = None
    timestamp_ms: int = 0


class ModelCap:
    """Bounds model versions per cycle (``--max-models``): the EMF bill stays bounded.

    Versions already being emitted keep their place; new ones fill free
    places in name order. Dropped versions are counted and logged.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.allowed: set[str] = set()

    def apply(
        self, exp: Exposition, index: list[VersionState] | None, index_keys: dict[str, VersionState]
    ) -> tuple[dict[str, dict[str, float]], list[VersionState] | None, int, int]:
        success = exp.samples.get("nv_inference_request_success", {})
        if len(success) + len(index_keys) <= self.limit or len(success.keys() | index_keys.keys()) <= self.limit:
            # Every loaded model version has a success counter; the index has the rest.
            self.allowed.clear()
            return exp.samples, index, 0, 0
        labels = exp.labels
        entities = {labels[k].entity_key for s in exp.samples.values() for k in s if labels[k].entity[0] == "model"}
        entities |= set(index_keys)
        if len(entities) <= self.limit:
            self.allowed.clear()
            return exp.samples, index, 0, 0
        keep = {e for e in self.allowed if e in entities}
        for e in sorted(entities - keep, key=lambda k: _sort_key(k, labels, index_keys)):
            if len(keep) >= self.limit:
                break
            keep.add(e)
        self.allowed = keep
        dropped_series = 0
        samples: dict[str, dict[str, float]] = {}
        for name, series in exp.samples.items():
            kept = {k: v for k, v in series.items()
                    if labels[k].entity[0] != "model" or labels[k].entity_key in keep}
            dropped_series += len(series) - len(kept)
            samples[name] = kept
        if index is not None:
            index = [v for v in index if model_key(v.model, v.version) in keep]
        return samples, index, dropped_series, len(entities) - len(keep)


def _run_all(func: Callable[[Source], tuple[Collected | None, SourceStatus]],
             sources: Sequence[Source]) -> list[tuple[Collected | None, SourceStatus]]:
    """``func`` on every source at once; results in source order.

    The first source (Triton's /metrics, the one that allocates megabytes)
    runs in the calling thread: glibc gives each new thread its own malloc
    arena, and parsing in a fresh thread every cycle measured ~2-4 MB more RSS
    at 1000 models. The others run in daemon threads, not a ThreadPoolExecutor:
    the executor's workers are joined at interpreter exit, so a source stuck in
    a network call would hold a SIGTERM exit for up to its timeout. Every
    source call is bounded by its own timeout, so the joins end.
    """
    results: list[tuple[Collected | None, SourceStatus] | None] = [None] * len(sources)

    def run(i: int) -> None:
        results[i] = func(sources[i])

    threads = [threading.Thread(target=run, args=(i,), name=f"source-{sources[i].name}", daemon=True)
               for i in range(1, len(sources))]
    for t in threads:
        t.start()
    if sources:
        run(0)
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def _transpose(columns: dict[str, Column]) -> dict[tuple[Scope, str], dict[str, float]]:
    """Metric columns -> one values dict per entity.

    Columns computed from the same series list share one key order; those are
    transposed with zip in C, the rest (index-only models, idle models without
    quantiles) key by key.
    """
    by_entity: dict[tuple[Scope, str], dict[str, float]] = {}
    for scope in Scope:
        groups: dict[tuple[str, ...], list[tuple[str, Column]]] = {}
        for m in CATALOG:
            col = columns.get(m.name)
            if m.scope is scope and col:
                groups.setdefault(tuple(col), []).append((m.name, col))
        for order, cols in sorted(groups.items(), key=lambda g: -len(g[1])):
            names = [n for n, _ in cols]
            for key, row in zip(order, zip(*(c.values() for _, c in cols))):
                values = by_entity.get((scope, key))
                if values is None:
                    by_entity[(scope, key)] = dict(zip(names, row))
                else:
                    values.update(zip(names, row))
    return by_entity


def _only_tritons_gpus(got: Collected) -> None:
    """Keep NVML's view to the GPUs Triton reports, when it reports any.

    In ECS the sidecar sees every GPU of the instance (NVIDIA_VISIBLE_DEVICES=all)
    while Triton sees only its task's: without this, two tasks on one host would
    both report each other's GPUs and summed metrics (XID, ECC) would double.
    """
    exp = got.samples
    triton = {
        exp.labels[k].entity[1] for name, s in exp.samples.items() if name.startswith("nv_gpu_") for k in s
        if exp.labels[k].entity[0] == "gpu"
    }
    if not triton:
        return
    for name in [n for n in exp.samples if n.startswith("nvml_")]:
        exp.samples[name] = {k: v for k, v in exp.samples[name].items() if exp.labels[k].entity[-1] in triton}
    for uuid in [u for u in got.gpus if u not in triton]:
        del got.gpus[uuid]


def _sort_key(key: str, labels: dict[str, LabelSet], index_keys: dict[str, VersionState]) -> tuple[str, str]:
    ls = labels.get(key)
    if ls is not None:
        return ls.entity[1], ls.entity[2]
    v = index_keys[key]
    return v.model, v.version


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        sources: Sequence[Source],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.sources = list(sources)
        self.clock = clock
        self.wall = wall
        self.state = DeltaState(counter_series())
        self.encoder = Encoder(settings.namespace, CATALOG, settings.storage_resolution)
        self.cap = ModelCap(settings.max_models)
        self.conditions = Conditions(log)
        self.gpu_order: dict[str, int] = {}

    def close(self) -> None:
        for source in self.sources:
            try:
                source.close()
            except Exception:  # closing must not hide the reason we are stopping
                log.debug("closing %s failed", source.name, exc_info=True)

    # --- collection -----------------------------------------------------------------------

    def collect(self) -> tuple[Collected, list[SourceStatus]]:
        """Read every source at once: a cycle costs the slowest source, not the sum of them.

        (Sequentially, a frozen Triton cost two full timeouts, one per Triton
        source, and at --timeout = interval/2 that skipped scheduled scrapes.)
        """
        results = _run_all(self._collect_one, self.sources)
        merged = Collected()
        statuses = []
        for source, (got, status) in zip(self.sources, results, strict=True):
            statuses.append(status)
            self.conditions.set(f"source {source.name}", status.error or None, source=source.name)
            if got is None:
                continue
            merged.samples.merge(got.samples)
            if got.index is not None:
                merged.index = got.index
            merged.gpus.update(got.gpus)
            merged.properties.update(got.properties)
        _only_tritons_gpus(merged)
        return merged, statuses

    def _collect_one(self, source: Source) -> tuple[Collected | None, SourceStatus]:
        start = self.clock()
        got, error = None, ""
        try:
            got = source.collect(self.settings.timeout)
        except SourceError as exc:
            error = str(exc)
        except Exception as exc:  # a bug in one source must not stop the others
            error = f"internal error in source {source.name}: {type(exc).__name__}: {exc}"
            log.error(error, exc_info=True)
        duration = (self.clock() - start) * 1000.0
        return got, SourceStatus(source.name, not error, duration, error)

    # --- one cycle ------------------------------------------------------------------------

    def cycle(self, events_dropped: int = 0) -> CycleResult:
        started = self.clock()
        timestamp_ms = int(self.wall() * 1000)
        got, statuses = self.collect()
        scrape_ms = (self.clock() - started) * 1000.0
        exp = got.samples
        # Logged when the count changes, not every cycle; ParseErrors carries it every cycle.
        self.conditions.set("malformed /metrics lines",
                            f"skipping {exp.malformed} malformed /metrics lines per scrape" if exp.malformed else None,
                            examples=exp.examples)
        index_keys = {} if got.index is None else {model_key(v.model, v.version): v for v in got.index}
        samples, index, dropped_series, dropped_models = self.cap.apply(exp, got.index, index_keys)
        self.conditions.set(
            "cardinality cap",
            f"{dropped_models} model versions over --max-models={self.cap.limit} are not emitted"
            if dropped_models else None,
        )
        if index is not got.index:
            index_keys = {k: v for k, v in index_keys.items() if k in self.cap.allowed}
        window = self.state.update(samples, exp.labels, started)
        if window.reset_entities:
            log.info("counters went down for %d entities (restart or reload): new baseline",
                     len(window.reset_entities))
        kept = sum(len(s) for s in samples.values())
        given = self._given(index, index_keys, statuses, scrape_ms, kept, dropped_series, exp.malformed,
                            len(window.reset_entities), events_dropped)
        columns = evaluate(CATALOG, samples, window, exp.labels, given)
        entities = self._events(columns, exp.labels, index_keys, got.gpus, samples, got.properties)
        events = [doc for e in entities for doc in self.encoder.encode(e, timestamp_ms)]
        return CycleResult(
            events=events, entities=entities, statuses=statuses, elapsed=window.elapsed,
            series_kept=kept, series_dropped=dropped_series,
            parse_errors=exp.malformed, resets=len(window.reset_entities), index=index,
            timestamp_ms=timestamp_ms,
        )

    def _given(
        self, index: list[VersionState] | None, index_keys: dict[str, VersionState],
        statuses: list[SourceStatus], scrape_ms: float, kept: int, dropped: int, malformed: int, resets: int,
        events_dropped: int,
    ) -> dict[str, Column]:
        up = {s.name: s.up for s in statuses}
        task: dict[str, float] = {
            "TritonUp": 1.0 if up.get("triton_metrics", False) and up.get("triton_index", False) else 0.0,
            "ScrapeDuration": scrape_ms,
            "SeriesKept": float(kept),
            "SeriesDropped": float(dropped),
            "ParseErrors": float(malformed),
            "CounterResets": float(resets),
            "EventsDropped": float(events_dropped),
            "ExporterHeartbeat": 1.0,
        }
        given: dict[str, Column] = {name: {"": value} for name, value in task.items()}
        if index is not None:
            counted = [v for v in index if not v.unloaded_on_purpose]
            ready = sum(v.state == "READY" for v in counted)
            failed = sum(v.state == "UNAVAILABLE" for v in counted)
            given["ModelsReady"] = {"": float(ready)}
            given["ModelsNotReady"] = {"": float(len(counted) - ready)}
            if ready + failed:
                given["ModelLoadSuccessRate"] = {"": 100.0 * ready / (ready + failed)}
            given["ModelReady"] = {
                k: 1.0 if v.state == "READY" else 0.0 for k, v in index_keys.items() if not v.unloaded_on_purpose
            }
        given["SourceUp"] = {s.name: 1.0 if s.up else 0.0 for s in statuses}
        given["SourceDuration"] = {s.name: s.duration_ms for s in statuses}
        return given

    def _events(
        self, columns: dict[str, Column], labels: dict[str, LabelSet], index_keys: dict[str, VersionState],
        gpus: dict[str, GpuInfo], samples: dict[str, dict[str, float]], properties: dict[str, object],
    ) -> list[Event]:
        by_entity = _transpose(columns)
        common = {"exporter_version": __version__, **properties}
        gpu_index = self._gpu_indexes(gpus, samples, labels)
        events = []
        misplaced = 0
        for (scope, key), values in by_entity.items():
            props: dict[str, object]
            ls = labels.get(key)
            kind = ls.entity[0] if ls is not None else None
            if scope is Scope.MODEL:
                v = index_keys.get(key)
                if kind == "model":
                    model, version = ls.entity[1], ls.entity[2]  # type: ignore[union-attr]
                elif v is not None:
                    model, version = v.model, v.version
                else:  # a per-model series printed without its model label
                    misplaced += 1
                    continue
                props = dict(properties)  # task identity: Logs Insights can tell tasks apart
                if v is not None:
                    props["state"] = v.state
                    if v.reason:
                        props["reason"] = clip(v.reason)
                dims = dimensions_for(scope, {"model": model, "version": version}, props)
            elif scope is Scope.GPU:
                if kind != "gpu":  # a per-GPU series without gpu_uuid
                    misplaced += 1
                    continue
                uuid = ls.entity[1]  # type: ignore[union-attr]
                info = gpus.get(uuid)
                props = {**common, "gpu_uuid": uuid, **(info.properties if info else {})}
                dims = dimensions_for(scope, {"gpu": str(gpu_index.get(uuid, uuid))}, props)
            elif scope is Scope.SOURCE:
                props = dict(common)
                dims = dimensions_for(scope, {"source": key}, props)
            else:
                if key != "":  # a task-wide series that carries a model or gpu label
                    misplaced += 1
                    continue
                props = dict(common)
                dims = {}
            events.append(Event(scope, dims, values, props))
        self.conditions.set(
            "misplaced series",
            f"ignoring {misplaced} entities whose series lack the model/gpu_uuid label their metric needs"
            if misplaced else None,
        )
        return events

    def _gpu_indexes(
        self, gpus: dict[str, GpuInfo], samples: dict[str, dict[str, float]], labels: dict[str, LabelSet]
    ) -> dict[str, int]:
        """``gpu`` dimension: NVML's index for the uuid when NVML knows it, else Triton's listing order."""
        out = {uuid: info.index for uuid, info in gpus.items() if info.index is not None}
        for key in samples.get("nv_gpu_utilization", {}) or samples.get("nv_gpu_memory_total_bytes", {}):
            uuid = labels[key].entity[1] if labels[key].entity[0] == "gpu" else None
            if uuid is not None and uuid not in self.gpu_order:
                self.gpu_order[uuid] = len(self.gpu_order)
        for uuid, i in self.gpu_order.items():
            out.setdefault(uuid, i)
        return out
