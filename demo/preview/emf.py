"""EMF documents as CloudWatch stores them: one datapoint per (metric, dimension set) and document.

CloudWatch extracts from each EMF document one datapoint for every metric of
every directive and every dimension set of that directive, the dimension
values read from the document's properties. A value is a number (one
sample), a list of numbers (one sample each) or a distribution (``Values``
and ``Counts``, with ``Min``, ``Max``, ``Count`` and ``Sum``). :func:`statistic`
computes CloudWatch's statistics over a period's datapoints; one the
dashboard does not use raises :class:`Unsupported`, the preview's one error
for a form it does not implement.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

Dims = tuple[tuple[str, str], ...]
"""Dimension name/value pairs, sorted by name: one metric's identity besides its namespace and name."""


class EmfError(ValueError):
    """A document that CloudWatch would reject: the preview never guesses what it meant."""


class Unsupported(ValueError):
    """A statistic, expression, query or widget the preview does not implement: refused, never drawn wrong."""


@dataclass(frozen=True)
class MetricKey:
    namespace: str
    name: str
    dims: Dims

    def dim_names(self) -> frozenset[str]:
        return frozenset(k for k, _ in self.dims)

    def value(self, dim: str) -> str:
        return dict(self.dims)[dim]


@dataclass(frozen=True)
class Datapoint:
    """One metric's value in one document: its samples as (value, count) pairs and their totals."""

    time: float  # seconds since the epoch (the document's _aws.Timestamp)
    values: tuple[float, ...]
    counts: tuple[float, ...]
    total: float  # Sum
    count: float  # SampleCount
    minimum: float
    maximum: float


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EmfError(f"{where}: {value!r} is not a finite number")
    return float(value)


def datapoint(value: Any, time: float, where: str) -> Datapoint:
    """The datapoint of one metric value, in any of the three forms EMF allows."""
    if isinstance(value, dict):
        values = [_number(v, where) for v in value.get("Values", [])]
        counts = [_number(c, where) for c in value.get("Counts", [1.0] * len(values))]
        if len(values) != len(counts):
            raise EmfError(f"{where}: {len(values)} Values and {len(counts)} Counts")
        try:
            total, count = _number(value["Sum"], where), _number(value["Count"], where)
            low, high = _number(value["Min"], where), _number(value["Max"], where)
        except KeyError as exc:
            raise EmfError(f"{where}: a distribution without {exc.args[0]}") from None
        return Datapoint(time, tuple(values), tuple(counts), total, count, low, high)
    samples = [_number(v, where) for v in value] if isinstance(value, list) else [_number(value, where)]
    if not samples:
        raise EmfError(f"{where}: no value")
    return Datapoint(
        time, tuple(samples), (1.0,) * len(samples), sum(samples), len(samples), min(samples), max(samples)
    )


@dataclass
class Store:
    """Every datapoint of a set of EMF documents, by metric."""

    points: dict[MetricKey, list[Datapoint]] = field(default_factory=dict)

    def add(self, doc: dict[str, Any]) -> None:
        meta = doc.get("_aws")
        if not isinstance(meta, dict) or "CloudWatchMetrics" not in meta:
            raise EmfError("not an EMF document: no _aws.CloudWatchMetrics")
        time = _number(meta.get("Timestamp"), "_aws.Timestamp") / 1000.0
        for directive in meta["CloudWatchMetrics"]:
            namespace = directive["Namespace"]
            for metric in directive["Metrics"]:
                name = metric["Name"]
                if name not in doc:
                    raise EmfError(f"metric {name} has no value in the document")
                point = datapoint(doc[name], time, name)
                for dim_set in directive["Dimensions"]:
                    try:
                        dims = tuple(sorted((d, str(doc[d])) for d in dim_set))
                    except KeyError as exc:
                        raise EmfError(f"metric {name}: dimension {exc.args[0]} is not in the document") from None
                    self.points.setdefault(MetricKey(namespace, name, dims), []).append(point)

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> Store:
        """EMF lines (one document a line); other lines (log lines in the same stream) are skipped."""
        store = cls()
        for line in lines:
            if line.startswith('{"_aws"'):
                store.add(json.loads(line))
        return store

    def metrics(self, namespace: str, name: str, dim_names: frozenset[str]) -> Iterator[MetricKey]:
        """The metrics of exactly this dimension schema (SEARCH's ``{ns,dims}``, Metrics Insights' SCHEMA)."""
        for key in sorted(self.points, key=lambda k: k.dims):
            if key.namespace == namespace and key.name == name and key.dim_names() == dim_names:
                yield key

    def times(self) -> list[float]:
        return sorted({p.time for points in self.points.values() for p in points})


_PERCENTILE = re.compile(r"p(\d{1,2}(?:\.\d+)?|100)")


def statistic(points: list[Datapoint], stat: str) -> float | None:
    """CloudWatch's ``stat`` over the datapoints of one period (None: no datapoint).

    Percentiles are the nearest rank over every sample (a distribution's
    values weighted by their counts), as CloudWatch computes them from EMF
    distributions; a percentile of plain numbers ranks the numbers.
    """
    if not points:
        return None
    if stat == "Sum":
        return sum(p.total for p in points)
    if stat == "SampleCount":
        return sum(p.count for p in points)
    if stat == "Average":
        count = sum(p.count for p in points)
        return sum(p.total for p in points) / count if count else None
    if stat == "Minimum":
        return min(p.minimum for p in points)
    if stat == "Maximum":
        return max(p.maximum for p in points)
    m = _PERCENTILE.fullmatch(stat)
    if m is None:
        raise Unsupported(
            f"statistic {stat!r}: the preview computes Sum, SampleCount, Average, Minimum, Maximum and pNN"
        )
    return percentile([(v, c) for p in points for v, c in zip(p.values, p.counts)], float(m.group(1)))


def percentile(samples: list[tuple[float, float]], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile of (value, count) samples."""
    samples = sorted(s for s in samples if s[1] > 0)
    total = sum(c for _, c in samples)
    if not total:
        return None
    rank = max(p / 100.0 * total, min(c for _, c in samples) * 1e-9)
    seen = 0.0
    for value, count in samples:
        seen += count
        if seen >= rank - 1e-9:
            return value
    return samples[-1][0]
