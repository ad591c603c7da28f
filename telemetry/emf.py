"""CloudWatch Embedded Metric Format documents, valid by construction.

The encoder knows metrics only as a name, a unit and dimension sets
(:class:`MetricSpec`); what an event describes (a model version, a GPU, a
sync attempt) is its caller's business. EMF carries one value per root
key, so two entities cannot share an event. Every limit of the format is a
named constant here and enforced on the way out; :mod:`telemetry.emf_validate`
checks the result independently and the tests run every emitted document
through it.

Serialised with orjson: the aws-embedded-metrics library (3.5) was ~7x slower for
the same documents (1000 model events: 112 ms against 16 ms) and its agent sink blocks. Its
``Unit`` enum is the reference list of units (:data:`CLOUDWATCH_UNITS`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import orjson

# CloudWatch's units, as the aws-embedded-metrics library's Unit enum lists them. Importing that
# library costs ~23 MB of RSS (its package __init__ pulls in its whole logger stack), so the list is
# kept here and tests/unit/telemetry/test_emf.py proves it equals the library's enum, which stays the reference.
CLOUDWATCH_UNITS = (
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
    "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
    "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
    "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None",
)  # fmt: skip

MAX_METRIC_NAME_LENGTH = 255  # CloudWatch's limit for a metric name
# --- limits of the format (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html)
MAX_METRICS_PER_DIRECTIVE = 100
MAX_DIMENSIONS_PER_SET = 30
MAX_DIMENSION_VALUE_LENGTH = 1024
MAX_NAMESPACE_LENGTH = 255
MAX_EVENT_BYTES = 256 * 1024  # PutLogEvents takes 1 MB; 256 KB (the older limit) is safe on every agent and region
# --- our own bounds
MAX_PROPERTY_LENGTH = 4096  # a load-failure reason can be a long traceback
HASH_CHARS = 8


@dataclass(frozen=True)
class SafeValue:
    value: str
    changed: bool


_SAFE_CACHE: dict[str, SafeValue] = {}


def safe_dimension_value(raw: str) -> SafeValue:
    """Make a label value usable as a CloudWatch dimension value, deterministically.

    Printable ASCII passes unchanged. Anything else (non-ASCII, control
    characters, empty, over 1024 characters) is replaced by ``_`` and a
    short hash of the original is appended, so ``modèle`` and ``mod_le``
    stay two dimension values. The original is kept as an event property.
    """
    cached = _SAFE_CACHE.get(raw)
    if cached is not None:
        return cached
    ok = raw.isascii() and raw.isprintable() and raw.strip() != "" and len(raw) <= MAX_DIMENSION_VALUE_LENGTH
    if ok:
        result = SafeValue(raw, False)
    else:
        digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
        cleaned = "".join(c if c.isascii() and c.isprintable() else "_" for c in raw).strip()
        keep = MAX_DIMENSION_VALUE_LENGTH - HASH_CHARS - 1
        result = SafeValue(f"{cleaned[:keep]}~{digest}" if cleaned else f"_~{digest}", True)
    if len(_SAFE_CACHE) > 20_000:  # well above --max-models; churn of new names must not grow it
        _SAFE_CACHE.clear()
    _SAFE_CACHE[raw] = result
    return result


def clip(text: str, limit: int = MAX_PROPERTY_LENGTH) -> str:
    return text if len(text) <= limit else text[: limit - 15] + "...[truncated]"


HIGH_RESOLUTION = 1  # StorageResolution: CloudWatch keeps the metric at 1-second resolution
STANDARD_RESOLUTION = 60


class MetricSpec(Protocol):
    """What the encoder needs of a metric (a catalog's ``Metric`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def unit(self) -> str: ...
    @property
    def dimension_sets(self) -> tuple[tuple[str, ...], ...]: ...
    @property
    def resolution(self) -> int:
        """StorageResolution: 1 (high resolution) or 60."""
        ...


NO_DISTRIBUTIONS: Mapping[str, dict[str, Any]] = MappingProxyType({})  # shared: most events have none


@dataclass
class Event:
    """One entity's event before encoding: dimensions, metric values, properties.

    ``distributions`` holds histogram metrics as EMF value objects
    (``{"Values", "Counts", "Min", "Max", "Count", "Sum"}``, built by the
    transform); CloudWatch computes percentile statistics from them across
    every event it receives.
    """

    scope: str  # what the event describes (the caller's vocabulary: a catalog scope); the encoder ignores it
    dimensions: dict[str, str]
    values: dict[str, float]
    properties: dict[str, object]
    distributions: Mapping[str, dict[str, Any]] = field(default_factory=lambda: NO_DISTRIBUTIONS)


class Encoder:
    """Turns :class:`Event` objects into EMF JSON lines (bytes, no newline)."""

    def __init__(
        self, namespace: str, metrics: Iterable[MetricSpec], storage_resolution: int = STANDARD_RESOLUTION
    ) -> None:
        """``storage_resolution`` 1 makes every metric high resolution; 60 leaves each metric's own."""
        if not 1 <= len(namespace) <= MAX_NAMESPACE_LENGTH or not namespace.isascii():
            raise ValueError(f"namespace must be 1-{MAX_NAMESPACE_LENGTH} ASCII characters: {namespace!r}")
        if namespace.startswith("AWS/"):
            raise ValueError("namespace must not start with 'AWS/' (reserved for AWS services)")
        if storage_resolution not in (HIGH_RESOLUTION, STANDARD_RESOLUTION):
            raise ValueError("storage resolution must be 1 or 60")
        self.namespace = namespace
        self.metrics = {m.name: m for m in metrics}
        self.resolution = storage_resolution
        for m in self.metrics.values():
            if m.resolution not in (HIGH_RESOLUTION, STANDARD_RESOLUTION):
                raise ValueError(f"metric {m.name}: storage resolution must be 1 or 60")
        self._directive_json: dict[tuple[str, ...], bytes] = {}  # the directives repeat: serialised once

    def directives(self, names: tuple[str, ...]) -> list[dict[str, object]]:
        """Directive list for an event carrying exactly these metrics (``_join`` caches its JSON)."""
        groups: dict[tuple[tuple[str, ...], ...], list[dict[str, object]]] = {}
        for name in names:
            m = self.metrics[name]
            spec: dict[str, object] = {"Name": name, "Unit": m.unit}
            if HIGH_RESOLUTION in (self.resolution, m.resolution):
                spec["StorageResolution"] = HIGH_RESOLUTION
            groups.setdefault(m.dimension_sets, []).append(spec)
        out: list[dict[str, object]] = []
        for dims, specs in groups.items():
            for i in range(0, len(specs), MAX_METRICS_PER_DIRECTIVE):
                out.append(
                    {
                        "Namespace": self.namespace,
                        "Dimensions": [list(d) for d in dims],
                        "Metrics": specs[i : i + MAX_METRICS_PER_DIRECTIVE],
                    }
                )
        return out

    def encode(self, event: Event, timestamp_ms: int) -> list[bytes]:
        """One or more JSON documents for the event (more only if it would exceed MAX_EVENT_BYTES)."""
        return self.encode_counted(event, timestamp_ms)[0]

    def encode_all(self, events: Iterable[Event], timestamp_ms: int) -> tuple[list[bytes], int]:
        """Every event's documents, and how many of the events had to be cut down to fit MAX_EVENT_BYTES."""
        out: list[bytes] = []
        cut = 0
        for event in events:
            docs, oversize = self.encode_counted(event, timestamp_ms)
            out += docs
            cut += oversize
        return out, cut

    def encode_counted(self, event: Event, timestamp_ms: int) -> tuple[list[bytes], bool]:
        """The event's documents, and whether it had to lose its properties (or be split) to fit."""
        values: Mapping[str, object] = event.values
        if not (event.values.keys() <= self.metrics.keys() and math.isfinite(sum(event.values.values()))):
            # Never taken by the pipeline (the transform drops non-finite values); kept as the guard.
            values = {k: v for k, v in event.values.items() if k in self.metrics and _finite(v)}
        if event.distributions:
            values = {**values, **{k: d for k, d in event.distributions.items() if k in self.metrics}}
        if not values:
            return [], False
        data = self._join(tuple(values), {**event.properties, **event.dimensions, **values}, timestamp_ms)
        if len(data) <= MAX_EVENT_BYTES:
            return [data], False
        return self._cut_down(event, values, timestamp_ms), True

    def _cut_down(self, event: Event, values: Mapping[str, object], timestamp_ms: int) -> list[bytes]:
        """The event without its properties, split in halves of its metrics until each half fits."""
        if not values:
            return []
        names = tuple(values)
        data = self._join(names, {"truncated": True, **event.dimensions, **values}, timestamp_ms)
        if len(data) <= MAX_EVENT_BYTES:
            return [data]
        half = len(names) // 2  # only reachable with absurd dimension sets; split until it fits
        if half == 0:
            return []
        first = {k: values[k] for k in names[:half]}
        rest = {k: values[k] for k in names[half:]}
        return self._cut_down(event, first, timestamp_ms) + self._cut_down(event, rest, timestamp_ms)

    def _join(self, names: tuple[str, ...], root: dict[str, object], ts: int) -> bytes:
        """``{"_aws":{...}, **root}``: the directive JSON repeats across events, so it is serialised once.

        ``_aws`` stays the first key (Fluent Bit's EMF routing matches lines starting with it).
        """
        directives = self._directive_json.get(names)
        if directives is None:
            directives = orjson.dumps(self.directives(names))
            if len(self._directive_json) > 10_000:
                self._directive_json.clear()
            self._directive_json[names] = directives
        body = orjson.dumps(root)
        sep = b"," if len(body) > 2 else b""
        # Joining also right-sizes the result: orjson's own bytes keep their growth buffer
        # (measured: ~16 KB held per 2 KB document, megabytes of RSS at 1000 events a cycle).
        return b"".join(
            (b'{"_aws":{"Timestamp":', str(ts).encode(), b',"CloudWatchMetrics":', directives, b"}", sep, body[1:])
        )


def dimensions_for(names: Sequence[str], raw: Mapping[str, str], properties: dict[str, object]) -> dict[str, str]:
    """Safe values of the dimensions ``names`` for an event; originals that had to change go into properties."""
    out: dict[str, str] = {}
    for name in names:
        safe = safe_dimension_value(raw.get(name, ""))
        out[name] = safe.value
        if safe.changed:
            properties[f"{name}_original"] = clip(raw.get(name, ""), MAX_DIMENSION_VALUE_LENGTH * 4)
    return out


def _finite(v: float) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
