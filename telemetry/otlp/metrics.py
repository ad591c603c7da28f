"""OTLP metrics from scraped series: cumulative sums, gauges and explicit-bucket histograms, as protobuf bytes.

Knows series only as a name, a kind, attributes and values; what they
measure is the caller's business. Each cycle the caller hands in every
series of one scrape (:meth:`MetricsEncoder.counter`, :meth:`gauge`,
:meth:`histogram`) and takes the ``Metric`` messages (:meth:`finish`),
serialized, each within the endpoint's limits, ready for
:meth:`telemetry.otlp.exporter.OtlpHttpExporter.submit_encoded`.

Why bytes and not ``opentelemetry.proto`` objects: a 1000-model scrape is
~14,000 points a cycle, and building them as protobuf messages cost ~15x
the EMF encoding of the same scrape. A series' attributes and start time
change rarely, so each series keeps its encoded prefix; a point is that
prefix, the cycle's timestamp and the value. tests/unit/exporter/test_otlp_metrics.py
decodes the output with the real protobuf classes.

Start times (``start_time_unix_nano``) of cumulative series: a scrape gives
no process start, so a series starts when it is first seen; a counter (or a
histogram's count) that goes down restarted after the previous point: its
new start is just after that point. A series not seen for ``keep_cycles``
cycles is forgotten (bounded memory); if it comes back it starts anew.

Limits (CloudWatch's OTLP endpoint): at most ``max_points`` per Metric
message (a family with more is split into several messages of the same
name), ``max_metric_bytes`` per message; a point whose attributes, with the
resource's, exceed ``max_labels`` labels, a value longer than
``max_value_chars`` or ``max_label_bytes`` of names and values is left out
and counted (:attr:`MetricsEncoder.dropped_labels`): cutting labels would
merge distinct series into one and corrupt its sums.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from .signals import varint

MAX_LABELS = 150  # per point, resource + scope + point attributes
MAX_LABEL_BYTES = 40 * 1024  # names and values of one series
MAX_VALUE_CHARS = 1024  # one string attribute value
MAX_POINTS = 1_000  # per request; so per Metric message at most
MAX_METRIC_BYTES = 1 << 20  # one Metric message; the exporter packs requests of up to 5 MB

_D = struct.Struct("<d")
_Q = struct.Struct("<Q")
_VALUE = struct.Struct("<Bd")  # NumberDataPoint.as_double (field 4, fixed64 wire type)
# Metric fields: name 1, description 2, unit 3, gauge 5, sum 7, histogram 9; data_points 1 in each
# Sum: aggregation_temporality 2 (CUMULATIVE = 2), is_monotonic 3
SUM_TAIL = b"\x10\x02\x18\x01"
HISTOGRAM_TAIL = b"\x10\x02"


def _field(tag: int, data: bytes) -> bytes:
    return bytes((tag,)) + varint(len(data)) + data


def key_value(key: str, value: str) -> bytes:
    """A KeyValue with a string AnyValue."""
    return _field(0x0A, key.encode()) + _field(0x12, _field(0x0A, value.encode()))


def attributes(tag: int, labels: Mapping[str, str]) -> bytes:
    """Repeated KeyValue under field ``tag`` (a data point's attributes), sorted by name."""
    return b"".join(_field(tag, key_value(k, labels[k])) for k in sorted(labels))


class HistogramPoint(NamedTuple):
    """One histogram series: upper bounds (``+Inf`` left out), cumulative counts (one more than bounds), sum.

    A named tuple: thousands are made a cycle, and a tuple is made faster than a frozen dataclass."""

    key: str
    bounds: Sequence[float]
    cumulative: Sequence[float]
    sum: float | None


class _Series:
    """A cumulative series' state: its encoded point prefix (attributes and start), last value and sighting."""

    __slots__ = ("head", "last", "seen", "seen_ns")

    def __init__(self, head: bytes, last: float, seen: int, seen_ns: int) -> None:
        self.head = head
        self.last = last
        self.seen = seen
        self.seen_ns = seen_ns


class MetricsEncoder:
    """Scraped series in, serialized ``Metric`` messages out, state kept across cycles for start times."""

    def __init__(
        self,
        resource_labels: int = 0,
        max_labels: int = MAX_LABELS,
        max_points: int = MAX_POINTS,
        max_metric_bytes: int = MAX_METRIC_BYTES,
        keep_cycles: int = 5,
    ) -> None:
        self.resource_labels = resource_labels  # the resource's (and scope's) attributes, counted per point
        self.max_labels = max_labels
        self.max_points = max_points
        self.max_metric_bytes = max_metric_bytes
        self.keep_cycles = keep_cycles
        self.dropped_labels = 0  # points left out over the label limits, cumulative
        self.points = 0  # points encoded, cumulative
        self.cycle = 0
        self.now_ns = 0
        self._time = b""
        self._items: list[tuple[bytes, int]] = []
        self._attrs: dict[tuple[int, str], bytes | None] = {}  # (tag, series key) -> attributes; None: over limits
        self._series: dict[str, dict[str, _Series]] = {}  # metric name -> series key -> state
        self._gauge_heads: dict[str, bytes | None] = {}  # series key -> attributes + time field prefix

    def begin(self, time_ns: int, resource_labels: int | None = None) -> None:
        """Start a cycle whose points are all stamped ``time_ns``."""
        if resource_labels is not None and resource_labels != self.resource_labels:
            self.resource_labels = resource_labels
            self._attrs.clear()  # the limits depend on it
            self._series.clear()
        self.cycle += 1
        self.now_ns = time_ns
        self._time = b"\x19" + _Q.pack(time_ns)  # time_unix_nano, field 3, in both point types
        self._items = []

    def finish(self) -> list[tuple[bytes, int]]:
        """The cycle's Metric messages as (bytes, points); forgets series unseen for ``keep_cycles`` cycles."""
        oldest = self.cycle - self.keep_cycles
        for name, states in list(self._series.items()):
            stale = [k for k, s in states.items() if s.seen <= oldest]
            for k in stale:
                del states[k]
            if not states:
                del self._series[name]
        if len(self._attrs) > 200_000:  # label churn must not grow it for ever
            self._attrs.clear()
            self._gauge_heads.clear()
        items, self._items = self._items, []
        return items

    # --- attributes and limits -----------------------------------------------------------------

    def _attributes(self, tag: int, key: str, labels: Callable[[str], Mapping[str, str]]) -> bytes | None:
        cached = self._attrs.get((tag, key), b"")
        if cached != b"" or (tag, key) in self._attrs:
            return cached
        pairs = labels(key)
        ok = (
            len(pairs) + self.resource_labels <= self.max_labels
            and all(len(v) <= MAX_VALUE_CHARS for v in pairs.values())
            and sum(len(k) + len(v) for k, v in pairs.items()) <= MAX_LABEL_BYTES
        )
        out = attributes(tag, pairs) if ok else None
        self._attrs[(tag, key)] = out
        return out

    # --- the three kinds -------------------------------------------------------------------------

    def counter(
        self, name: str, series: Mapping[str, float], labels: Callable[[str], Mapping[str, str]], help: str = ""
    ) -> None:
        """A cumulative monotonic Sum: one point per finite value, each with its series' start time."""
        states = self._series.setdefault(name, {})
        now, cycle, time_field, pack = self.now_ns, self.cycle, self._time, _VALUE.pack
        points: list[bytes] = []
        append = points.append
        for key, value in series.items():
            s = states.get(key)
            if s is not None and s.last <= value:  # the common case: the same series, grown or not
                s.last, s.seen, s.seen_ns = value, cycle, now
                append(s.head + time_field + pack(0x21, value))
                continue
            if value != value or value in (math.inf, -math.inf):
                continue
            start = now if s is None else s.seen_ns + 1  # first seen, or reset after the previous point
            attrs = self._attributes(0x3A, key, labels)
            if attrs is None:
                self.dropped_labels += 1
                continue
            body = attrs + b"\x11" + _Q.pack(start)
            head = b"\x0a" + varint(len(body) + 18) + body
            states[key] = _Series(head, value, cycle, now)
            append(head + time_field + pack(0x21, value))
        self._metric(name, help, 0x3A, points, SUM_TAIL)

    def gauge(
        self, name: str, series: Mapping[str, float], labels: Callable[[str], Mapping[str, str]], help: str = ""
    ) -> None:
        """A Gauge: one point per finite value (NaN, an empty summary's quantile, is no value)."""
        heads = self._gauge_heads
        time_field, pack = self._time, _VALUE.pack
        points: list[bytes] = []
        append = points.append
        for key, value in series.items():
            if value != value or value in (math.inf, -math.inf):
                continue
            head = heads.get(key)
            if head is None:
                attrs = self._attributes(0x3A, key, labels)
                if attrs is None:
                    self.dropped_labels += 1
                    continue
                head = heads[key] = b"\x0a" + varint(len(attrs) + 18) + attrs
            append(head + time_field + pack(0x21, value))
        self._metric(name, help, 0x2A, points, b"")

    def histogram(
        self,
        name: str,
        series: Iterable[HistogramPoint],
        labels: Callable[[str], Mapping[str, str]],
        help: str = "",
        unit: str = "",
    ) -> int:
        """Cumulative explicit-bucket histograms; returns how many were left out as inconsistent.

        Cumulative bucket counts become per-bucket counts; counts that go
        down from one bound to the next (a torn scrape) leave the point out.
        """
        states = self._series.setdefault(name, {})
        now, cycle = self.now_ns, self.cycle
        points: list[bytes] = []
        bad = 0
        for h in series:
            cum = h.cumulative
            if len(cum) != len(h.bounds) + 1 or not all(map(math.isfinite, cum)):
                bad += 1
                continue
            counts = [int(cum[0])] + [int(b) - int(a) for a, b in itertools.pairwise(cum)]
            if min(counts) < 0:
                bad += 1
                continue
            attrs = self._attributes(0x4A, h.key, labels)
            if attrs is None:
                self.dropped_labels += 1
                continue
            total = int(cum[-1])
            s = states.get(h.key)
            if s is None or total < s.last:
                start = now if s is None else s.seen_ns + 1
                s = states[h.key] = _Series(b"\x11" + _Q.pack(start), total, cycle, now)
            s.last, s.seen, s.seen_ns = total, cycle, now
            body = [attrs, s.head, self._time, b"\x21", _Q.pack(total)]
            if h.sum is not None and math.isfinite(h.sum):
                body += [b"\x29", _D.pack(h.sum)]
            body.append(_field(0x32, struct.pack(f"<{len(counts)}Q", *counts)))
            if h.bounds:
                body.append(_field(0x3A, struct.pack(f"<{len(h.bounds)}d", *h.bounds)))
            points.append(_field(0x0A, b"".join(body)))
        self._metric(name, help, 0x4A, points, HISTOGRAM_TAIL, unit)
        return bad

    # --- Metric messages ------------------------------------------------------------------------

    def _metric(self, name: str, help: str, tag: int, points: list[bytes], tail: bytes, unit: str = "") -> None:
        """Metric messages of ``points`` (serialized data points) under the field ``tag`` (gauge, sum,
        histogram), split to stay within the limits; ``unit`` in UCUM (``s``), or none."""
        if not points:
            return
        self.points += len(points)
        head = _field(0x0A, name.encode()) + (_field(0x12, help.encode()) if help else b"")
        if unit:
            head += _field(0x1A, unit.encode())
        limit = self.max_metric_bytes - len(head) - 16
        start = 0
        while start < len(points):
            end = min(len(points), start + self.max_points)
            chunk = points[start:end]
            size = sum(map(len, chunk))
            while size > limit and len(chunk) > 1:  # large attributes: fewer points per message
                chunk = chunk[: len(chunk) // 2]
                size = sum(map(len, chunk))
            body = b"".join(chunk) + tail
            self._items.append((head + bytes((tag,)) + varint(len(body)) + body, len(chunk)))
            start += len(chunk)
