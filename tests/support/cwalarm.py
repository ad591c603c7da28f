"""CloudWatch's metric alarm evaluation, as AWS documents it, for what cannot run here: an alarm over EMF.

Used by bench/bench_scaling.py to evaluate the rendered scaling alarms over the events the real exporter
wrote, and checked against AWS's own examples in tests/support/tests/test_cwalarm.py. What it follows (the CloudWatch
User Guide, "Using Amazon CloudWatch alarms" and "Publish custom metrics"; "Using metric math"):

- Storage: a high-resolution metric (``StorageResolution`` 1) keeps each value at its second; a standard one
  is aggregated to the minute, so a 10-second period over it sees data in one period of six.
- Periods are aligned to the clock (``[k*P, (k+1)*P)``); a period's datapoint is the statistic of every value
  stored in it, over every task that wrote one (Average, Sum, Minimum, Maximum, SampleCount; ``pNN`` on the
  raw values, nearest rank).
- An alarm is evaluated every 10 s when its period is under a minute, else every minute, over the periods that
  ended by then, with the values that have arrived by then (``arrival``: the EMF line's timestamp plus the
  ingestion delay the caller models).
- It retrieves more periods than ``EvaluationPeriods`` (the evaluation range; AWS's example retrieves 5 for
  3, so N + 2 here). With at least N real datapoints in the range, the most recent N real ones are evaluated
  (missing periods skipped: the missing-data setting is not used). With none, ``missing`` gives
  INSUFFICIENT_DATA, ``ignore`` keeps the state, ``breaching`` ALARM, ``notBreaching`` OK. With some but fewer
  than N, every real one is used and the rest filled: ``breaching``/``notBreaching`` fill with that; with
  ``missing`` and ``ignore`` AWS's tables give OK when a real datapoint is not breaching and the state cannot
  reach ALARM, else INSUFFICIENT_DATA (``missing``) or the current state (``ignore``), which is what is
  implemented. ALARM when at least ``DatapointsToAlarm`` of the N evaluated datapoints breach, else OK.
- Metric math (the scale-in's sum), from "Metric math syntax and functions", "Basic arithmetic functions":
  "Missing values in a time series are treated as 0. If the value of a data point causes a function to
  attempt to divide by zero, the data point is dropped." So a missing input counts as 0 when another input
  has a value at that period; no input with a value: no datapoint (there is no timestamp to compute at).
  ``DIFF(id)`` ("Metric math syntax and functions": the difference between each value and the preceding one)
  is the value at this period minus the one at the period before; with either missing it is missing, so 0 in
  the arithmetic around it.

Not modelled: percentile low-sample handling (``EvaluateLowSampleCountPercentile``), anomaly detection,
Metrics Insights queries, and the two AWS tables' one disagreeing row (a later revision of the first table
adds "X - - - -" as ALARM under ``missing``; the earlier one and the prose give the rule above).
"""

from __future__ import annotations

import ast
import math
import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OK, ALARM, INSUFFICIENT = "OK", "ALARM", "INSUFFICIENT_DATA"
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanThreshold": operator.gt,
    "GreaterThanOrEqualToThreshold": operator.ge,
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
}
MISSING_TREATMENTS = ("missing", "ignore", "breaching", "notBreaching")

Key = tuple[str, str, frozenset[tuple[str, str]]]  # namespace, metric name, dimensions


@dataclass(frozen=True)
class Value:
    timestamp: float  # seconds since the epoch, as stored (high resolution: the second; standard: the minute)
    value: float
    arrival: float  # when CloudWatch has it


@dataclass
class Store:
    """Metric values as CloudWatch keeps them, from EMF documents."""

    values: dict[Key, list[Value]] = field(default_factory=lambda: defaultdict(list))

    def add(self, key: Key, timestamp: float, value: float, arrival: float, high_resolution: bool) -> None:
        stored = math.floor(timestamp) if high_resolution else math.floor(timestamp / 60) * 60
        self.values[key].append(Value(float(stored), value, arrival))

    def add_emf(self, doc: Mapping[str, Any], ingestion_delay: float) -> None:
        """Every value of one EMF document under each of its dimension sets (a distribution is not taken)."""
        ts = doc["_aws"]["Timestamp"] / 1000.0
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for m in directive["Metrics"]:
                value = doc.get(m["Name"])
                if not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                high = m.get("StorageResolution", 60) == 1
                for dims in directive["Dimensions"]:
                    key = (directive["Namespace"], m["Name"], frozenset((d, str(doc[d])) for d in dims))
                    self.add(key, ts, float(value), ts + ingestion_delay, high)

    def datapoint(self, key: Key, stat: str, start: float, period: float, now: float) -> float | None:
        """The statistic of the values stored in ``[start, start + period)`` that arrived by ``now``."""
        got = [v.value for v in self.values.get(key, ()) if start <= v.timestamp < start + period and v.arrival <= now]
        return statistic(stat, got)


def statistic(stat: str, values: Sequence[float]) -> float | None:
    if not values:
        return None
    if stat == "Average":
        return sum(values) / len(values)
    if stat == "Sum":
        return float(sum(values))
    if stat == "Minimum":
        return min(values)
    if stat == "Maximum":
        return max(values)
    if stat == "SampleCount":
        return float(len(values))
    if stat.startswith("p"):
        q = float(stat[1:]) / 100.0
        ordered = sorted(values)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
    raise ValueError(f"statistic {stat!r} is not modelled")


@dataclass(frozen=True)
class Query:
    """One metric of an alarm: ``Dimensions`` as a mapping, ``period`` in seconds."""

    id: str
    namespace: str
    metric: str
    dimensions: frozenset[tuple[str, str]]
    stat: str
    period: int

    @property
    def key(self) -> Key:
        return (self.namespace, self.metric, self.dimensions)


@dataclass
class Alarm:
    """A metric alarm (one metric) or a metric-math alarm (``expression`` over ``queries``)."""

    name: str
    queries: tuple[Query, ...]
    period: int
    evaluation_periods: int
    datapoints_to_alarm: int
    threshold: float
    comparison: str
    treat_missing: str = "missing"
    expression: str | None = None  # metric math over the queries' ids; None: the one query
    evaluation_range: int | None = None  # periods retrieved; None: evaluation_periods + 2
    state: str = INSUFFICIENT
    transitions: list[tuple[float, str, str]] = field(default_factory=list)  # (time, new state, reason)

    def __post_init__(self) -> None:
        if self.comparison not in COMPARISONS:
            raise ValueError(f"comparison {self.comparison!r} is not modelled")
        if self.treat_missing not in MISSING_TREATMENTS:
            raise ValueError(f"TreatMissingData {self.treat_missing!r}")
        if not 1 <= self.datapoints_to_alarm <= self.evaluation_periods:
            raise ValueError("need 1 <= DatapointsToAlarm <= EvaluationPeriods")
        if self.period not in (10, 30) and self.period % 60:
            raise ValueError(f"period {self.period}: CloudWatch takes 10, 30 or a multiple of 60")

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> Alarm:
        """From a PutMetricAlarm body (the rendered ``alarms/cli`` files)."""
        common = {
            "name": body["AlarmName"],
            "evaluation_periods": int(body["EvaluationPeriods"]),
            "datapoints_to_alarm": int(body.get("DatapointsToAlarm", body["EvaluationPeriods"])),
            "threshold": float(body["Threshold"]),
            "comparison": body["ComparisonOperator"],
            "treat_missing": body.get("TreatMissingData", "missing"),
        }
        if "MetricName" in body:
            dims = frozenset((d["Name"], d["Value"]) for d in body.get("Dimensions", []))
            q = Query("m1", body["Namespace"], body["MetricName"], dims, body["Statistic"], int(body["Period"]))
            return cls(queries=(q,), period=q.period, **common)
        queries, expression = [], None
        for m in body["Metrics"]:
            if "Expression" in m:
                if expression is not None:
                    raise ValueError("one expression per alarm is modelled")
                expression = m["Expression"]
                continue
            stat = m["MetricStat"]
            metric = stat["Metric"]
            dims = frozenset((d["Name"], d["Value"]) for d in metric.get("Dimensions", []))
            queries.append(
                Query(m["Id"], metric["Namespace"], metric["MetricName"], dims, stat["Stat"], int(stat["Period"]))
            )
        periods = {q.period for q in queries}
        if len(periods) != 1:
            raise ValueError("every metric of a metric-math alarm uses the same period")
        return cls(queries=tuple(queries), period=periods.pop(), expression=expression, **common)

    @property
    def evaluation_interval(self) -> int:
        """Seconds between evaluations: 10 for a high-resolution alarm, else 60."""
        return 10 if self.period < 60 else 60

    def value(self, store: Store, start: float, now: float) -> float | None:
        """The alarm's datapoint for the period starting at ``start`` (None: missing)."""
        values = {q.id: store.datapoint(q.key, q.stat, start, self.period, now) for q in self.queries}
        if self.expression is None:
            return values[self.queries[0].id]
        if all(v is None for v in values.values()):
            return None
        filled = {k: 0.0 if v is None else v for k, v in values.items()}
        if "DIFF(" in self.expression:
            before = {q.id: store.datapoint(q.key, q.stat, start - self.period, self.period, now) for q in self.queries}
            for k, v in values.items():
                filled[f"DIFF:{k}"] = 0.0 if v is None or before[k] is None else v - before[k]  # type: ignore[operator]
        return math_expression(self.expression, filled)

    def evaluate(self, store: Store, now: float) -> str:
        """One evaluation at ``now``; records and returns the state."""
        last = math.floor(now / self.period) * self.period - self.period  # the latest period that has ended
        span = self.evaluation_range or self.evaluation_periods + 2
        points = [self.value(store, last - i * self.period, now) for i in range(span)]  # newest first
        new, reason = self._decide(points)
        if new != self.state:
            self.transitions.append((now, new, reason))
            self.state = new
        return new

    def _decide(self, points: Sequence[float | None]) -> tuple[str, str]:
        n, m = self.evaluation_periods, self.datapoints_to_alarm
        breach = COMPARISONS[self.comparison]
        real = [p for p in points if p is not None]
        if len(real) >= n:
            chosen = real[:n]
            hits = sum(breach(p, self.threshold) for p in chosen)
            return (ALARM if hits >= m else OK), f"{hits} of the {n} most recent datapoints breaching: {chosen}"
        fill = n - len(real)
        hits = sum(breach(p, self.threshold) for p in real)
        if self.treat_missing in ("breaching", "notBreaching"):
            total = hits + (fill if self.treat_missing == "breaching" else 0)
            return (ALARM if total >= m else OK), f"{len(real)} datapoints, {fill} missing as {self.treat_missing}"
        if not real:
            return (INSUFFICIENT if self.treat_missing == "missing" else self.state), "no datapoints"
        if hits >= m:
            return ALARM, f"{hits} breaching of {len(real)} datapoints"
        if hits < len(real):  # a real datapoint within the threshold, and too few breaching to alarm
            return OK, f"{len(real) - hits} datapoints within the threshold"
        return (INSUFFICIENT if self.treat_missing == "missing" else self.state), "too few datapoints to decide"

    def run(self, store: Store, start: float, end: float, offset: float = 0.0) -> list[tuple[float, str, str]]:
        """Evaluate every ``evaluation_interval`` from ``start`` to ``end`` (at multiples of it, plus ``offset``);
        returns the transitions (time, state, reason)."""
        step = self.evaluation_interval
        t = math.ceil((start - offset) / step) * step + offset
        while t <= end:
            self.evaluate(store, t)
            t += step
        return self.transitions

    def first(self, state: str, after: float = -math.inf) -> float | None:
        """When the alarm first went to ``state`` after ``after`` (None: never)."""
        return next((t for t, s, _ in self.transitions if s == state and t > after), None)


_OPS: dict[type[ast.AST], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def math_expression(expression: str, values: Mapping[str, float]) -> float | None:
    """``+ - * /``, numbers, ids and ``DIFF(id)`` (its value given as ``DIFF:id``); None when a division by zero
    drops the datapoint."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ZeroDivisionError
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            return values[node.id]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "DIFF"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Name)
        ):
            return values[f"DIFF:{node.args[0].id}"]
        raise ValueError(f"expression {expression!r}: only + - * /, numbers and metric ids are modelled")

    try:
        return ev(ast.parse(expression, mode="eval"))
    except ZeroDivisionError:
        return None


def store_of(documents: Iterable[Mapping[str, Any]], ingestion_delay: float) -> Store:
    store = Store()
    for doc in documents:
        store.add_emf(doc, ingestion_delay)
    return store
