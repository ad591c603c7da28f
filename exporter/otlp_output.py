"""The OTLP metrics output (``--output otlp+https://monitoring.REGION.amazonaws.com/v1/metrics``): Triton's own
families, in OTLP's model, beside EMF (docs/otlp.md).

EMF carries what the transform computed over a window (deltas, rates,
averages, distributions); this output carries the scrape itself, so PromQL
does the maths at query time and runbooks written against Triton's
``/metrics`` work unchanged:

- which families: those some selected catalog metric reads (the same
  ``--metrics`` selection as EMF), after the ``--max-models`` cap; plus what
  only the exporter knows, the catalog's ``self`` and ``state`` metrics
  (``ModelReady`` from the repository index, ``TritonUp``...) as gauges named
  ``triton_exporter_<snake_case>``;
- names: the family's own (``nv_inference_request_success``); labels: the
  series' own (``model``, ``version``, ``gpu_uuid``, ``reason``), the ECS
  task as resource attributes;
- counters: cumulative monotonic sums; histograms: explicit-bucket
  histograms on Triton's ``le`` bounds; gauges: gauges; summaries (not
  among the endpoint's types): their quantiles as a gauge of the family's
  name keeping the ``quantile`` label, their ``_sum``/``_count`` as
  cumulative sums, which is how ``/metrics`` spells them;
- with ``--otlp-semconv genai``, also OpenTelemetry's GenAI server metrics
  (``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token``,
  ``gen_ai.server.request.duration``, :mod:`catalog.genai`): the same
  histograms per generative model version, in seconds, under the spec's
  names and attributes.

Each cycle the scrape is encoded once (:mod:`telemetry.otlp.metrics`) and
queued on every OTLP output's exporter (:mod:`telemetry.otlp.exporter`):
the cycle never waits on the network. What each output sent and dropped
comes back into the next cycle as the ``exporter_otlp_points_*_total``
series (catalog source ``outputs``), so EMF's ``OtlpPointsSent`` and
``OtlpPointsDropped`` report it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from fractions import Fraction

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from catalog import Catalog, Scope
from catalog import genai as semconv
from catalog.otlp import DECOUPLED, SCOPE_NAME, plan
from telemetry.logs import Conditions, get
from telemetry.otlp.endpoint import Endpoint
from telemetry.otlp.exporter import ExportOptions, OtlpHttpExporter
from telemetry.otlp.metrics import HistogramPoint, MetricsEncoder
from telemetry.otlp.resource import ecs_resource
from telemetry.otlp.signals import METRICS

from . import __version__
from .pipeline import Scrape
from .series import EMPTY, Exposition, LabelSet, Series
from .sources import ModelConfig

log = get("otlp_metrics")

SENT = "exporter_otlp_points_sent_total"  # label output
DROPPED = "exporter_otlp_points_dropped_total"  # labels output, reason
SCOPE_LABELS = 2  # the scope's name and version, counted as labels (CloudWatch: @instrumentation.*)
# 8 MB of serialized metrics held while an endpoint is away: several cycles at 1000 models (docs/otlp.md)
OPTIONS = ExportOptions(capacity_bytes=8 << 20)


class OtlpMetricsOutput:
    """Encodes each cycle's scrape once and queues it on every OTLP metrics endpoint."""

    def __init__(
        self,
        catalog: Catalog,
        endpoints: Sequence[Endpoint],
        container: str = "",
        exporters: Sequence[OtlpHttpExporter[Metric]] | None = None,
        options: ExportOptions = OPTIONS,
        genai: bool = False,
    ) -> None:
        self.plan = plan(catalog)
        self.container = container
        self.exporters = (
            list(exporters)
            if exporters is not None
            else [OtlpHttpExporter(METRICS, endpoint, options) for endpoint in endpoints]
        )
        self.encoder = MetricsEncoder()
        self.scope = InstrumentationScope(name=SCOPE_NAME, version=__version__)
        self.conditions = Conditions(log)
        self.histogram_points_left_out = 0  # cumulative: torn or without +Inf, never sent (reason "inconsistent")
        self._resource_props: dict[str, object] | None = None
        self._resource = Resource()
        self._resource_count = 0
        # bucket series key (+ the model's kind, for the by_kind families) -> (series key without le, bound)
        self._histograms: dict[str, tuple[str, float]] = {}
        self._groups: dict[str, LabelSet] = {}  # series key without le -> its LabelSet
        self._sum_key: dict[str, str] = {}  # a group with the decoupled label -> its _sum sample's series key
        self._own_labels: dict[str, LabelSet] = {}
        self.genai = _GenAi(catalog) if genai else None

    # --- each cycle --------------------------------------------------------------------------

    def export(self, scrape: Scrape) -> None:
        """Encode the scrape and queue it on every exporter (never waits on the network)."""
        items = self.encode(scrape)
        for exporter in self.exporters:
            exporter.submit_encoded(self._resource, self.scope, items)

    def encode(self, scrape: Scrape) -> list[tuple[bytes, int]]:
        """The scrape as serialized Metric messages with their point counts."""
        self._update_resource(scrape.properties)
        enc = self.encoder
        enc.begin(scrape.timestamp_ms * 1_000_000, self._resource_count)
        labels = scrape.labels
        label_map = _Labels(labels)
        samples = scrape.samples
        genai = self.genai
        histograms: dict[str, list[HistogramPoint]] = {}  # the GenAI sources' points, by family
        left_out = 0  # histogram points not sent: no +Inf bucket, or cumulative counts that go down
        for fam in self.plan.families:
            name = fam.name
            kind = fam.type
            if kind == "histogram":
                buckets = samples.get(f"{name}_bucket")
                if buckets:
                    configs = scrape.configs if name in self.plan.by_kind else None
                    points, bad = self._histogram(
                        name, fam.help, buckets, samples.get(f"{name}_sum", {}), labels, configs
                    )
                    left_out += bad
                    if genai is not None and name in genai.families:
                        histograms[name] = points
                else:  # read for its _sum/_count alone: sent as what /metrics calls them
                    for suffix in ("_sum", "_count"):
                        if f"{name}{suffix}" in samples:
                            enc.counter(f"{name}{suffix}", samples[f"{name}{suffix}"], label_map)
                continue
            series = samples.get(name)
            if series:
                if kind == "counter":
                    enc.counter(name, series, label_map, fam.help)
                else:  # gauge, untyped, and a summary's quantiles (the quantile label kept)
                    enc.gauge(name, series, label_map, fam.help)
            if kind == "summary":
                for suffix in ("_sum", "_count"):
                    if f"{name}{suffix}" in samples:
                        enc.counter(f"{name}{suffix}", samples[f"{name}{suffix}"], label_map)
        if genai is not None:
            left_out += genai.encode(enc, histograms, self._groups, scrape.configs)
        self._own(scrape)
        self.histogram_points_left_out += left_out
        # A torn scrape's histograms are left out, never guessed; as for EMF's distributions, the log says so.
        self.conditions.set(
            "inconsistent histograms",
            f"OTLP: leaving out {left_out} histogram points whose bucket counts go down or lack +Inf"
            if left_out
            else None,
        )
        return enc.finish()

    def _histogram(
        self,
        name: str,
        help: str,
        buckets: Series,
        sums: Series,
        labels: Mapping[str, LabelSet],
        configs: Mapping[str, ModelConfig] | None,
    ) -> tuple[list[HistogramPoint], int]:
        """One family's histogram points, and how many were left out as inconsistent.

        Each series keeps its own bounds (two models' buckets may differ: a model config sets its own). With
        ``configs`` (a by_kind family) each point also carries ``decoupled="true"|"false"`` from its model's
        configuration, so a PromQL query can take time to first token from decoupled models only; a version
        whose configuration is not read yet is sent without it."""
        known = self._histograms
        groups: dict[str, list[tuple[float, float]]] = {}
        for key, value in buckets.items():
            kind = ""
            if configs is not None and (config := configs.get(labels[key].entity_key)) is not None:
                kind = "true" if config.decoupled else "false"
            where = known.get(key + kind)
            if where is None:
                where = known[key + kind] = self._bucket_of(labels[key], kind)
            group, bound = where
            groups.setdefault(group, []).append((bound, value))
        points = []
        bad = 0
        for group, pairs in groups.items():
            pairs.sort()
            if pairs[-1][0] != float("inf"):  # no +Inf bucket: no count, nothing guessed
                bad += 1
                continue
            total = sums.get(self._sum_key.get(group, group))
            points.append(HistogramPoint(group, [b for b, _ in pairs[:-1]], [c for _, c in pairs], total))
        bad += self.encoder.histogram(name, points, lambda k: self._groups[k].labels, help)
        if len(known) > 100_000:  # series churn must not grow it for ever
            known.clear()
        return points, bad

    def _bucket_of(self, ls: LabelSet, kind: str) -> tuple[str, float]:
        pairs = tuple(sorted((k, v) for k, v in ls.labels.items() if k != "le"))
        group = LabelSet(pairs)
        if kind:
            base = group.key  # the _sum sample's series key
            group = LabelSet(tuple(sorted((*(p for p in pairs if p[0] != DECOUPLED), (DECOUPLED, kind)))))
            self._sum_key[group.key] = base
        self._groups.setdefault(group.key, group)
        try:
            bound = float(ls.labels.get("le", "nan"))
        except ValueError:
            bound = float("nan")
        return group.key, bound

    def _own(self, scrape: Scrape) -> None:
        """The selected self and state metrics as gauges, keyed by canonical label keys."""
        own_labels = self._own_labels
        for emf_name, scope, name in self.plan.own:
            column = scrape.given.get(emf_name)
            if not column:
                continue
            series: dict[str, float] = {}
            by_key: dict[str, LabelSet] = {}
            for key, value in column.items():
                ls = own_labels.get(f"{scope}\x1d{key}")
                if ls is None:
                    ls = self._own_labelset(scope, key, scrape)
                    if ls is None:
                        continue
                    own_labels[f"{scope}\x1d{key}"] = ls
                series[ls.key] = value
                by_key[ls.key] = ls
            self.encoder.gauge(name, series, _Labels(by_key))
        if len(own_labels) > 20_000:
            own_labels.clear()

    @staticmethod
    def _own_labelset(scope: Scope, key: str, scrape: Scrape) -> LabelSet | None:
        if scope is Scope.TASK:
            return EMPTY
        if scope is Scope.SOURCE:
            return LabelSet.of(source=key)
        known = scrape.labels.get(key)
        if known is not None:
            return known
        v = scrape.index_keys.get(key)
        return LabelSet.of(model=v.model, version=v.version) if v is not None else None

    def _update_resource(self, properties: Mapping[str, object]) -> None:
        props = {k: v for k, v in properties.items() if k.startswith(("ecs_", "availability_zone"))}
        if props == self._resource_props:
            return
        self._resource_props = props
        attrs = ecs_resource(props, self.container, ())
        self._resource = Resource(
            attributes=[KeyValue(key=k, value=AnyValue(string_value=str(v))) for k, v in attrs.items()]
        )
        self._resource_count = len(attrs) + SCOPE_LABELS

    # --- what the outputs did ------------------------------------------------------------------

    def series(self) -> Exposition:
        """Each output's cumulative counts as the ``exporter_otlp_points_*_total`` series."""
        out = Exposition()
        labels_dropped = self.encoder.dropped_labels
        for exporter in self.exporters:
            s = exporter.stats()
            output = str(exporter.endpoint)
            out.add(SENT, LabelSet.of(output=output), float(s.delivered))
            drops = {"labels": labels_dropped, "inconsistent": self.histogram_points_left_out, **s.dropped_by_reason()}
            for reason, n in drops.items():
                out.add(DROPPED, LabelSet.of(output=output, reason=reason), float(n))
        return out

    def close(self, timeout: float) -> None:
        """Deliver what each exporter can within ``timeout`` overall."""
        deadline = time.monotonic() + timeout
        for exporter in self.exporters:
            exporter.close(max(0.0, deadline - time.monotonic()))


class _GenAi:
    """OpenTelemetry's GenAI server metrics (:mod:`catalog.genai`) from the histograms the output just built.

    Per model version whose configuration is read and that is generative (:func:`catalog.genai.operation`),
    the first source histogram it has (the catalog's order, as EMF's distributions), its bounds and sum
    converted to seconds exactly and its counts unchanged; attributes (:func:`catalog.genai.attributes`)
    ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model`` (the model),
    ``triton.model.version``, and the series' other labels but ``decoupled``. A model none of whose sources
    has a series gets no point: never zeros (the coverage line says why).
    """

    def __init__(self, catalog: Catalog) -> None:
        self.plan = semconv.plan(catalog)
        self.families = frozenset(s.input.sample for p in self.plan for s in p.sources)
        self._keys: dict[tuple[str, str], str] = {}  # (source series key, operation) -> the GenAI series key
        self._attrs: dict[str, dict[str, str]] = {}  # GenAI series key -> its attributes
        self._bounds: dict[tuple[tuple[float, ...], tuple[int, int]], list[float]] = {}
        # id of a configuration -> (it, its operation): held, so the id stays its own (no dataclass hash a point)
        self._operations: dict[int, tuple[ModelConfig, str | None]] = {}
        for p in self.plan:
            if not p.sources:
                log.warning(
                    "--otlp-semconv genai: %s is not sent: none of %s is selected (--metrics)",
                    p.metric.name,
                    ", ".join(p.metric.sources),
                )

    def operation(self, config: ModelConfig) -> str | None:
        got = self._operations.get(id(config))
        if got is not None and got[0] is config:
            return got[1]
        if len(self._operations) > 10_000:
            self._operations.clear()
        declared = config.parameter(semconv.OPERATION_PARAMETER)
        op = semconv.operation(declared, config.decoupled, config.backend)
        self._operations[id(config)] = (config, op)
        return op

    def encode(
        self,
        encoder: MetricsEncoder,
        histograms: Mapping[str, Sequence[HistogramPoint]],
        groups: Mapping[str, LabelSet],
        configs: Mapping[str, ModelConfig],
    ) -> int:
        """Every GenAI metric's points into ``encoder``; returns how many were left out as inconsistent."""
        bad = 0
        for planned in self.plan:
            taken: set[str] = set()  # entities a source already gave: the first present wins
            points: list[HistogramPoint] = []
            for source in planned.sources:
                found: set[str] = set()
                want = source.input.decoupled
                factor = source.factor
                exact = factor == 1  # already seconds (vLLM's): bounds and sum as they are
                scale = (factor.numerator, factor.denominator)  # hashed in C, unlike a Fraction
                for h in histograms.get(source.input.sample, ()):
                    ls = groups[h.key]
                    ent = ls.entity_key
                    config = configs.get(ent)
                    if ent in taken or config is None or (want is not None and config.decoupled is not want):
                        continue
                    op = self.operation(config)
                    if op is None:
                        continue
                    found.add(ent)
                    key = self._keys.get((h.key, op)) or self._key(h.key, ls, op)
                    if exact:
                        points.append(HistogramPoint(key, h.bounds, h.cumulative, h.sum))
                        continue
                    total = None if h.sum is None else semconv.seconds(h.sum, factor)
                    bounds = self._bounds.get((tuple(h.bounds), scale)) or self._seconds(h.bounds, factor, scale)
                    points.append(HistogramPoint(key, bounds, h.cumulative, total))
                taken |= found
            bad += encoder.histogram(
                planned.metric.name, points, self._attrs.__getitem__, planned.metric.description, semconv.UNIT
            )
        if len(self._keys) > 20_000:  # series churn must not grow them for ever
            self._keys.clear()
            self._attrs.clear()
        return bad

    def _key(self, key: str, ls: LabelSet, op: str) -> str:
        got = self._keys.get((key, op))
        if got is None:
            got = self._keys[(key, op)] = f"{op}\x1d{key}"
            self._attrs[got] = semconv.attributes(ls.labels, op)
        return got

    def _seconds(self, bounds: Sequence[float], factor: Fraction, scale: tuple[int, int]) -> list[float]:
        """The bounds in seconds, converted once per distinct set of bounds."""
        if len(self._bounds) > 1_000:
            self._bounds.clear()
        got = self._bounds[(tuple(bounds), scale)] = [semconv.bound_seconds(b, factor) for b in bounds]
        return got


class _Labels:
    """Series key -> its labels, for the encoder (called once per new series)."""

    __slots__ = ("labels",)

    def __init__(self, labels: Mapping[str, LabelSet]) -> None:
        self.labels = labels

    def __call__(self, key: str) -> Mapping[str, str]:
        return self.labels[key].labels
