"""One cycle: sources → delta state → catalog transform → EMF events. Orchestration only.

Pure of I/O except through the sources it is given, so tests drive it with
fixture sources and a fake clock, and the runner drives it on a schedule.

Cadences: a metric whose catalog entry sets ``interval`` (the leading scaling
signals, docs/scaling.md) is computed every ``interval`` seconds; the rest at
the full cycle (``--interval``). Each cadence keeps its own counter baselines,
so a counter read every 10 s for a fast ratio and every 60 s for the minute's
totals gives each its own window's delta: nothing is counted twice and the
minute's numbers are what they would be without the fast metrics. A full
cycle reads every source and computes every cadence that is due; the scrapes
between full cycles (:meth:`Pipeline.cycle` with ``due`` naming only fast
cadences) read only the sources the fast metrics need and emit only those
metrics, without properties.
The pieces it orchestrates live in their own modules: the cardinality cap
(:mod:`exporter.cap`), the GPU join (:mod:`exporter.gpus`), the exporter's
own values (:mod:`exporter.selfmetrics`), the computation
(:mod:`exporter.transform`) and the encoding (:mod:`telemetry.emf`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from catalog import BASE_DIMENSIONS, Catalog, Scope
from telemetry.emf import NO_DISTRIBUTIONS, Encoder, Event, clip, dimensions_for
from telemetry.logs import Conditions, get

from . import __version__
from .cap import ModelCap
from .config import Settings
from .coverage import Coverage, ModelCoverage
from .gpus import GpuIndex, gpu_samples, gpu_uuids, keep_tritons_gpus
from .selfmetrics import Bookkeeping, SourceStatus, exporter_values, index_values
from .series import Exposition, LabelSet, Series, model_key
from .sources import Collected, GpuInfo, ModelConfig, Narrowable, Source, SourceError, SourceKind, VersionState
from .state import DeltaState, Window
from .transform import Column, Result, Transform

log = get("pipeline")


@dataclass
class Scrape:
    """One cycle's scrape, as the pipeline has it after the cardinality cap."""

    samples: Mapping[str, Series]
    labels: Mapping[str, LabelSet]
    given: Mapping[str, Mapping[str, float]]  # the exporter's own values (self and state metrics) by entity key
    index_keys: Mapping[str, VersionState]
    properties: Mapping[str, object]
    timestamp_ms: int
    configs: Mapping[str, ModelConfig] = field(default_factory=dict)  # READY versions' configurations by entity key


class ScrapeOutput(Protocol):
    """An output fed the scrape itself each cycle, beside EMF (the OTLP metrics output)."""

    def export(self, scrape: Scrape) -> None:
        """Take the cycle's scrape; never waits on the network."""
        ...

    def series(self) -> Exposition:
        """The output's own cumulative counts, read into the next cycle (catalog source ``outputs``)."""
        ...

    def close(self, timeout: float) -> None: ...


__all__ = ["CycleResult", "Pipeline", "Scrape", "ScrapeOutput", "SourceStatus"]

# The source that serves each family source of the catalog (catalog/load.py FAMILY_SOURCES): what a scrape between
# full cycles reads for the fast metrics. "outputs" are the exporter's own output counts, not a source.
SOURCE_FOR_FAMILIES = {"triton": "triton_metrics", "nvml": "nvml", "traces": "traces"}
_MODEL_DIMS_LIMIT = 20_000  # model versions whose dimensions are remembered (well above --max-models)
_NO_ORIGINALS: dict[str, object] = {}  # shared by every model whose names needed no change (never written)


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
    coverage: Mapping[str, ModelCoverage] = field(default_factory=dict)  # entity key -> what it cannot produce
    full: bool = True  # a full cycle; False: a scrape between full cycles, for the fast metrics only


@dataclass
class Cadence:
    """The metrics computed every ``period`` seconds, with their own counter baselines and transform."""

    period: float
    catalog: Catalog  # the same definitions, these metrics selected
    state: DeltaState
    transform: Transform
    reads: frozenset[str]  # the family sources their inputs come from (triton, nvml, traces, outputs)


def cadences(catalog: Catalog, interval: float, breakdown_zeros: bool = False) -> list[Cadence]:
    """The full cycle's cadence first (every metric without a shorter ``interval``), then the faster ones."""
    groups: dict[float, list[str]] = {interval: []}
    for m in catalog.metrics:
        groups.setdefault(m.period(interval), []).append(m.name)
    out = []
    for period in sorted(groups, key=lambda p: (p != interval, -p)):
        sub = Catalog(catalog.defined, catalog.families, groups[period], catalog.files, catalog.selection,
                      catalog.dimensions)  # fmt: skip
        reads = frozenset(catalog.families[i.family].source for m in sub.computed for i in m.all_inputs())
        out.append(Cadence(period, sub, DeltaState(sub.counter_samples()), Transform(sub, breakdown_zeros), reads))
    return out


def _merge_results(into: Result, other: Result) -> None:
    into.values.update(other.values)
    into.distributions.update(other.distributions)
    into.inconsistent_histograms += other.inconsistent_histograms


def _run_all(
    func: Callable[[Source], tuple[Collected | None, SourceStatus]], sources: Sequence[Source]
) -> list[tuple[Collected | None, SourceStatus]]:
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

    threads = [
        threading.Thread(target=run, args=(i,), name=f"source-{sources[i].name}", daemon=True)
        for i in range(1, len(sources))
    ]
    for t in threads:
        t.start()
    if sources:
        run(0)
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def _transpose(catalog: Catalog, result: Result) -> dict[tuple[Scope, str], dict[str, float]]:
    """Metric columns -> one values dict per entity.

    Columns computed from the same series list share one key order; those are
    transposed with zip in C, the rest (index-only models, idle models without
    quantiles) key by key.
    """
    by_entity: dict[tuple[Scope, str], dict[str, float]] = {}
    columns = result.values
    for scope in Scope:
        groups: dict[tuple[str, ...], list[tuple[str, Column]]] = {}
        for m in catalog.metrics:
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


def _distributions(catalog: Catalog, result: Result) -> dict[tuple[Scope, str], dict[str, Any]]:
    """Distribution metrics per entity (only entities that have one)."""
    out: dict[tuple[Scope, str], dict[str, Any]] = {}
    for name, dists in result.distributions.items():
        metric = catalog.get(name)
        assert metric is not None
        for key, dist in dists.items():
            out.setdefault((metric.scope, key), {})[name] = dist
    return out


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        sources: Sequence[Source],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        outputs: Sequence[ScrapeOutput] = (),
    ) -> None:
        self.settings = settings
        self.outputs = list(outputs)
        self.catalog = catalog
        self.sources = list(sources)
        self.clock = clock
        self.wall = wall
        self.cadences = cadences(catalog, settings.interval, breakdown_zeros=settings.breakdown_zeros == "emit")
        self.periods: tuple[float, ...] = tuple(c.period for c in self.cadences)  # the full cycle's first
        self.state = self.cadences[0].state  # the full cycle's baselines (CounterResets, the soak's size)
        self.transform = self.cadences[0].transform
        self.encoder = Encoder(settings.namespace, catalog.metrics, settings.storage_resolution)
        # What the last full cycle learnt that a scrape between full cycles reuses (it reads neither the index
        # nor, unless a fast metric needs them, the GPU sources).
        self._gpus: dict[str, GpuInfo] = {}
        self._triton_gpus: list[str] = []
        self._configs: Mapping[str, ModelConfig] = {}
        self._narrowed: dict[frozenset[float], list[Source]] = {}  # the sources of each set of fast cadences
        self.cap = ModelCap(settings.max_models)
        self.conditions = Conditions(log)
        self.gpu_index = GpuIndex()
        # (model, version) -> its dimensions and the originals of values made safe: the same every cycle
        self._model_dims: dict[tuple[str, str], tuple[dict[str, str], dict[str, object]]] = {}
        self.coverage = Coverage(catalog, genai=settings.otlp_semconv == "genai" and bool(settings.otlp_outputs))
        self.gpu_samples = sorted(gpu_samples(catalog))  # sorted: the gpu dimension must not depend on set order

    def baselines(self) -> int:
        """Counter baselines held by every cadence (the soak test watches this)."""
        return sum(c.state.size() for c in self.cadences)

    def close(self, outputs_timeout: float = 0.3) -> None:
        """Close the sources, and the scrape outputs within ``outputs_timeout`` seconds (what they hold is lost)."""
        for output in self.outputs:
            try:
                output.close(outputs_timeout)
            except Exception:
                log.debug("closing an output failed", exc_info=True)
        for source in self.sources:
            try:
                source.close()
            except Exception:  # closing must not hide the reason we are stopping
                log.debug("closing %s failed", source.name, exc_info=True)

    # --- collection -----------------------------------------------------------------------

    def collect(self, sources: Sequence[Source] | None = None) -> tuple[Collected, list[SourceStatus], list[str]]:
        """Read every source (or those given) at once: a cycle costs the slowest source, not the sum of them.

        (Sequentially, a frozen Triton cost two full timeouts, one per Triton
        source, and at --timeout = interval/2 that skipped scheduled scrapes.)
        Returns the merged result, each source's status and the GPUs Triton reports.
        """
        sources = self.sources if sources is None else sources
        results = _run_all(self._collect_one, sources)
        merged = Collected()
        statuses = []
        triton_gpus: list[str] = []
        gpu_sources: list[Collected] = []
        for source, (got, status) in zip(sources, results, strict=True):
            statuses.append(status)
            self.conditions.set(f"source {source.name}", status.error or None, source=source.name)
            if got is None:
                continue
            if source.kind is SourceKind.GPU:
                gpu_sources.append(got)  # joined once Triton's GPUs are known
                continue
            if source.kind is SourceKind.TRITON:
                triton_gpus += gpu_uuids(got.samples, self.gpu_samples)
            _merge(merged, got)
        for got in gpu_sources:
            keep_tritons_gpus(got, triton_gpus if sources is self.sources else self._triton_gpus)
            _merge(merged, got)
        return merged, statuses, triton_gpus

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
        return got, SourceStatus(source.name, source.kind, not error, duration, error)

    # --- one cycle ------------------------------------------------------------------------

    def cycle(self, events_dropped: int = 0, due: Collection[float] | None = None) -> CycleResult:
        """One scrape: a full cycle when ``due`` is None or holds the full cycle's period (``periods[0]``), with
        the fast cadences of ``due``; else a scrape for the fast cadences of ``due`` alone."""
        if due is not None and self.periods[0] not in due:
            return self._fast_cycle([c for c in self.cadences if c.period in due])
        fast = [c for c in self.cadences[1:] if due is None or c.period in due]
        started = self.clock()
        timestamp_ms = int(self.wall() * 1000)
        got, statuses, triton_gpus = self.collect()
        scrape_ms = (self.clock() - started) * 1000.0
        for output in self.outputs:  # what the outputs did up to the last cycle, as series the catalog may read
            got.samples.merge(output.series())
        exp = got.samples
        # Logged when the count changes, not every cycle; ParseErrors carries it every cycle.
        self.conditions.set(
            "malformed /metrics lines",
            f"skipping {exp.malformed} malformed /metrics lines per scrape" if exp.malformed else None,
            examples=exp.examples,
        )
        coverage = self.coverage.update(got.configs, got.server_version, exp.samples, exp.labels)
        index_keys = {} if got.index is None else {model_key(v.model, v.version): v for v in got.index}
        capped = self.cap.apply(exp, got.index, index_keys)
        self.conditions.set(
            "cardinality cap",
            f"{capped.dropped_models} model versions over --max-models={self.cap.limit} are not emitted"
            if capped.dropped_models
            else None,
        )
        if capped.index is not got.index:
            index_keys = {k: v for k, v in index_keys.items() if k in self.cap.allowed}
        main = self.cadences[0]
        window = main.state.update(capped.samples, exp.labels, started)
        if window.reset_entities:
            log.info("counters went down for %d entities (restart or reload): new baseline", len(window.reset_entities))
        book = Bookkeeping(
            scrape_ms,
            sum(len(s) for s in capped.samples.values()),
            capped.dropped_series,
            exp.malformed,
            exp.duplicates,
            len(window.reset_entities),
            events_dropped,
        )
        given = {**exporter_values(book, statuses), **index_values(capped.index, index_keys)}
        result = main.transform.evaluate(capped.samples, window, exp.labels, given, got.configs)
        for cadence in fast:
            _merge_results(result, self._evaluate(cadence, capped.samples, exp.labels, started, got.configs)[0])
        self._gpus, self._triton_gpus, self._configs = got.gpus, triton_gpus, got.configs
        self.conditions.set(
            "inconsistent histograms",
            f"leaving out {result.inconsistent_histograms} histogram distributions whose bucket counts went down"
            if result.inconsistent_histograms
            else None,
        )
        entities = self._events(result, exp.labels, index_keys, got.gpus, triton_gpus, got.properties, got.models)
        events = self._encode(entities, timestamp_ms)
        if self.outputs:
            scrape = Scrape(capped.samples, exp.labels, given, index_keys, got.properties, timestamp_ms, got.configs)
            for output in self.outputs:
                try:
                    output.export(scrape)
                except Exception as exc:  # an output's bug must not cost the cycle its EMF
                    log.error("output failed: %s: %s", type(exc).__name__, exc, exc_info=True)
        return CycleResult(
            events=events,
            entities=entities,
            statuses=statuses,
            elapsed=window.elapsed,
            series_kept=book.series_kept,
            series_dropped=book.series_dropped,
            parse_errors=exp.malformed,
            resets=book.resets,
            index=capped.index,
            timestamp_ms=timestamp_ms,
            coverage=coverage,
        )

    def _evaluate(
        self,
        cadence: Cadence,
        samples: dict[str, Series],
        labels: dict[str, LabelSet],
        started: float,
        configs: Mapping[str, ModelConfig],
    ) -> tuple[Result, Window]:
        """One fast cadence's values over its own window (its own baselines)."""
        window = cadence.state.update(samples, labels, started)
        return cadence.transform.evaluate(samples, window, labels, {}, configs), window

    def _fast_sources(self, due: list[Cadence], names: set[str]) -> list[Source]:
        """The sources a scrape for ``due`` reads, narrowed to those cadences' series where a source can be."""
        key = frozenset(c.period for c in due)
        cached = self._narrowed.get(key)
        if cached is None:
            computed = [m.name for c in due for m in c.catalog.metrics]
            sub = self.catalog.select(",".join(computed)) if computed else self.catalog
            cached = self._narrowed[key] = [
                s.narrowed(sub.wanted_samples(), sub.sample_selects()) if isinstance(s, Narrowable) else s
                for s in self.sources
                if s.name in names
            ]
        return cached

    def _fast_cycle(self, due: list[Cadence]) -> CycleResult:
        """A scrape between full cycles: only the sources the due cadences read, only their metrics.

        The model versions are those the cardinality cap lets through (:meth:`ModelCap.keep`); the GPUs,
        their numbering and the model configurations are the last full cycle's. No properties but the
        exporter's version: the full cycle's events carry them once a minute.
        """
        started = self.clock()
        timestamp_ms = int(self.wall() * 1000)
        reads = frozenset().union(*(c.reads for c in due))
        names = {SOURCE_FOR_FAMILIES[r] for r in reads if r in SOURCE_FOR_FAMILIES}
        got, statuses, _ = self.collect(self._fast_sources(due, names))
        if "outputs" in reads:
            for output in self.outputs:
                got.samples.merge(output.series())
        exp = got.samples
        samples = self.cap.keep(exp)
        result, elapsed = Result(), None
        for cadence in due:
            values, window = self._evaluate(cadence, samples, exp.labels, started, self._configs)
            _merge_results(result, values)
            elapsed = window.elapsed if elapsed is None else elapsed
        entities = self._events(result, exp.labels, {}, self._gpus, self._triton_gpus, {}, {})
        # Not reported: these events carry no properties, so only an absurd dimension set could cut one down.
        events, _ = self.encoder.encode_all(entities, timestamp_ms)
        return CycleResult(
            events=events,
            entities=entities,
            statuses=statuses,
            elapsed=elapsed,
            series_kept=sum(len(s) for s in samples.values()),
            parse_errors=exp.malformed,
            timestamp_ms=timestamp_ms,
            full=False,
        )

    def _encode(self, entities: list[Event], timestamp_ms: int) -> list[bytes]:
        """Every event's EMF lines; the task event last, so it can count this cycle's oversize events."""
        task = [e for e in entities if e.scope is Scope.TASK]
        events, oversize = self.encoder.encode_all((e for e in entities if e.scope is not Scope.TASK), timestamp_ms)
        for e in task:
            if "EventsOversize" not in e.values:
                events += self.encoder.encode(e, timestamp_ms)
                continue
            e.values["EventsOversize"] = float(oversize)
            docs, cut = self.encoder.encode_counted(e, timestamp_ms)
            if cut:  # the task event itself had to be cut down: its own count includes it
                e.values["EventsOversize"] += 1
                docs = self.encoder.encode(e, timestamp_ms)
            events += docs
        return events

    def _events(
        self,
        result: Result,
        labels: dict[str, LabelSet],
        index_keys: dict[str, VersionState],
        gpus: dict[str, GpuInfo],
        triton_gpus: list[str],
        properties: dict[str, object],
        models: dict[str, dict[str, object]],
    ) -> list[Event]:
        by_entity = _transpose(self.catalog, result)
        dists = _distributions(self.catalog, result)
        for entity in dists.keys() - by_entity.keys():
            by_entity[entity] = {}  # an entity with only distributions (no other metric this window)
        common = {"exporter_version": __version__, **properties}
        gpu_index = self.gpu_index.indexes(gpus, triton_gpus)
        events = []
        misplaced = 0
        for (scope, key), values in by_entity.items():
            props: dict[str, object]
            ls = labels.get(key)
            kind = ls.entity[0] if ls is not None else None
            if scope is Scope.MODEL:
                v = index_keys.get(key)
                if ls is not None and kind == "model":
                    model, version = ls.entity[1], ls.entity[2]
                elif v is not None:
                    model, version = v.model, v.version
                else:  # a per-model series printed without its model label
                    misplaced += 1
                    continue
                props = {**properties, **models.get(key, {})}  # task identity, and what a source says of it
                if v is not None:
                    props["state"] = v.state
                    if v.reason:
                        props["reason"] = clip(v.reason)
                named = self._model_dims.get((model, version))
                if named is None:
                    if len(self._model_dims) > _MODEL_DIMS_LIMIT:
                        self._model_dims.clear()  # model churn: forget, do not grow without bound
                    originals: dict[str, object] = {}
                    safe = dimensions_for(BASE_DIMENSIONS[scope], {"model": model, "version": version}, originals)
                    named = self._model_dims[(model, version)] = (safe, originals or _NO_ORIGINALS)
                dims = named[0]  # shared by this model's events, never changed
                if named[1]:
                    props.update(named[1])
            elif scope is Scope.GPU:
                if ls is None or kind != "gpu":  # a per-GPU series without gpu_uuid
                    misplaced += 1
                    continue
                uuid = ls.entity[1]
                info = gpus.get(uuid)
                props = {**common, "gpu_uuid": uuid, **(info.properties if info else {})}
                dims = dimensions_for(BASE_DIMENSIONS[scope], {"gpu": str(gpu_index.get(uuid, uuid))}, props)
            elif scope is Scope.SOURCE:
                props = dict(common)
                dims = dimensions_for(BASE_DIMENSIONS[scope], {"source": key}, props)
            else:
                if key != "":  # a task-wide series that carries a model or gpu label
                    misplaced += 1
                    continue
                props = dict(common)
                dims = {}
            events.append(Event(scope, dims, values, props, dists.get((scope, key), NO_DISTRIBUTIONS)))
        self.conditions.set(
            "misplaced series",
            f"ignoring {misplaced} entities whose series lack the model/gpu_uuid label their metric needs"
            if misplaced
            else None,
        )
        return events


def _merge(into: Collected, got: Collected) -> None:
    into.samples.merge(got.samples)
    if got.index is not None:
        into.index = got.index
    into.gpus.update(got.gpus)
    into.models.update(got.models)
    into.configs.update(got.configs)
    into.server_version = got.server_version or into.server_version
    into.properties.update(got.properties)
