"""A graph widget's ``metrics`` rows, evaluated over EMF datapoints as CloudWatch would.

Implemented, because dashboards/triton.json uses them, and nothing else:

- metric rows ``[namespace, name, dim, value, ..., {stat, label, id, visible, yAxis, period}]``;
- expression rows ``[{expression, label, id, visible, yAxis, period}]`` whose expression is
  - ``SEARCH('{"ns",dim,...} MetricName="Name"', 'Stat', period)``: every metric of exactly that
    dimension schema, one series each, labelled by its dimension values;
  - ``SELECT FUNC(Name) FROM SCHEMA("ns", dim, ...)`` (Metrics Insights, FUNC one of AVG, SUM,
    MIN, MAX, COUNT): one series over every such metric; with ``GROUP BY``, ``ORDER BY FUNC()``
    and ``LIMIT`` (the alarms' form) one series per group; no WHERE;
  - ``INSIGHT_RULE_METRIC('rule', 'UniqueContributors')``: a Contributor Insights rule (JSON
    log format, ``$.key`` keys, ``IsPresent`` filters) over the log events of its groups;
  - metric math over those and row ids: ``+ - * /``, parentheses, numbers, ``PERIOD(id)``; between two
    series a value one of them lacks at a period is 0, and a division by zero drops the period, as the
    CloudWatch User Guide's "Basic arithmetic functions" say.

Anything else raises :class:`~demo.preview.emf.Unsupported`: a new kind of widget must be taught
here, never drawn empty. Statistics are :func:`~demo.preview.emf.statistic`'s.

**Time.** The demo runs the exporter with short windows; :class:`Clock` makes one window stand for
one dashboard period of ``base`` seconds (render's PERIOD, the exporter's default interval): a
period of P seconds in the dashboard is P * window / base seconds of the demo, and ``PERIOD(id)``
returns that. The generator writes a per-second rate as ``SEARCH(..., P)/P`` (metric math has no
PERIOD of a SEARCH); a number that divides a SEARCH of the same period is read as that period, so
rates come out per second of the demo.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .emf import Datapoint, MetricKey, Store, Unsupported, statistic
from .logsinsights import LogEvent

ROW_OPTIONS = {"id", "stat", "label", "visible", "yAxis", "period", "color"}
EXPRESSION_OPTIONS = {"expression", "label", "id", "visible", "yAxis", "period", "color"}
INSIGHTS_FUNCTIONS = {"SUM": "Sum", "AVG": "Average", "MIN": "Minimum", "MAX": "Maximum", "COUNT": "SampleCount"}


@dataclass(frozen=True)
class Clock:
    """Period buckets of the demo run: one exporter ``window`` (seconds) stands for ``base`` dashboard seconds."""

    origin: float  # the first bucket's start, seconds since the epoch
    window: float
    base: float = 60.0

    def seconds(self, period: float) -> float:
        return period * self.window / self.base

    def bucket(self, time: float, period: float) -> float:
        width = self.seconds(period)
        return self.origin + math.floor((time - self.origin) / width + 1e-9) * width

    @classmethod
    def around(cls, times: Iterable[float], window: float, base: float = 60.0) -> Clock:
        """Buckets centred on the windows: the first starts half a window before the first timestamp."""
        first = min(times, default=0.0)
        return cls(first - window / 2, window, base)


@dataclass
class Series:
    label: str
    points: dict[float, float] = field(default_factory=dict)  # bucket start -> value
    step: float = 0.0  # seconds of the run between two of its periods (0: not known); the drawing joins neighbours


Value = float | Series | list[Series]


def _diff(value: Value) -> Value:
    if isinstance(value, list):
        return [s for s in (_diff(v) for v in value) if isinstance(s, Series)]
    if not isinstance(value, Series):
        raise Unsupported("DIFF of a number: the preview takes DIFF of a series")
    times = sorted(value.points)
    return Series(value.label, {t: value.points[t] - value.points[p] for p, t in itertools.pairwise(times)}, value.step)


@dataclass
class Line:
    """One row's result: its series (a SEARCH gives several), whether it is drawn, and on which axis."""

    id: str
    label: str
    series: list[Series]
    visible: bool = True
    axis: str = "left"


@dataclass
class Data:
    """What the widgets read: EMF datapoints, log events by group, Contributor Insights rules by name."""

    store: Store
    clock: Clock
    logs: Mapping[str, list[LogEvent]] = field(default_factory=dict)
    rules: Mapping[str, dict[str, Any]] = field(default_factory=dict)


# --- the expression language ---------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<str>'[^']*')|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[-+*/(),]))"
)


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Ref:
    id: str


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Node | str, ...]


@dataclass(frozen=True)
class BinOp:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Neg:
    operand: Node


Node = Num | Ref | Call | BinOp | Neg
FUNCTIONS = {"SEARCH": 3, "PERIOD": 1, "INSIGHT_RULE_METRIC": 2, "DIFF": 1}


def tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise Unsupported(f"expression {text!r}: cannot read {text[pos:]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise Unsupported(f"expression {self.text!r}: expected {value or 'more'} at token {self.i}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.sum()
        if self.peek() is not None:
            raise Unsupported(f"expression {self.text!r}: unexpected {self.peek()}")
        return node

    def sum(self) -> Node:
        node = self.product()
        while (tok := self.peek()) is not None and tok[1] in "+-":
            self.take()
            node = BinOp(tok[1], node, self.product())
        return node

    def product(self) -> Node:
        node = self.unary()
        while (tok := self.peek()) is not None and tok[1] in "*/":
            self.take()
            node = BinOp(tok[1], node, self.unary())
        return node

    def unary(self) -> Node:
        if (tok := self.peek()) is not None and tok[1] == "-":
            self.take()
            return Neg(self.unary())
        return self.atom()

    def atom(self) -> Node:
        kind, value = self.take()
        if kind == "num":
            return Num(float(value))
        if value == "(":
            node = self.sum()
            self.take(")")
            return node
        if kind != "name":
            raise Unsupported(f"expression {self.text!r}: unexpected {value!r}")
        nxt = self.peek()
        if nxt is None or nxt[1] != "(":
            return Ref(value)
        if value not in FUNCTIONS:
            raise Unsupported(f"expression {self.text!r}: function {value} is not implemented by the preview")
        self.take("(")
        args: list[Node | str] = []
        while True:
            tok = self.peek()
            if tok is not None and tok[0] == "str":
                self.take()
                args.append(tok[1][1:-1])
            else:
                args.append(self.sum())
            if self.take()[1] == ")":
                break
        if len(args) != FUNCTIONS[value]:
            raise Unsupported(f"expression {self.text!r}: {value} with {len(args)} arguments")
        return Call(value, tuple(args))


def parse(text: str) -> Node:
    return _Parser(text).parse()


_SEARCH = re.compile(r'\{(?P<schema>[^{}]*)\}\s+MetricName="(?P<name>[^"]+)"')
_SELECT = re.compile(
    r"SELECT\s+(?P<func>[A-Z]+)\((?P<name>[A-Za-z0-9_.:-]+)\)\s+FROM\s+SCHEMA\((?P<schema>[^()]*)\)"
    r"(?:\s+GROUP\s+BY\s+(?P<group>[A-Za-z0-9_]+(?:\s*,\s*[A-Za-z0-9_]+)*))?"
    r"(?:\s+ORDER\s+BY\s+(?P<ofunc>[A-Z]+)\(\)\s*(?P<order>ASC|DESC)?)?"
    r"(?:\s+LIMIT\s+(?P<limit>\d+))?",
    re.I,
)


def _schema(text: str, where: str) -> tuple[str, frozenset[str]]:
    parts = [p.strip() for p in text.split(",")]
    names = [p[1:-1] if len(p) > 1 and p[0] == p[-1] == '"' else p for p in parts]
    if not names[0] or any(not re.fullmatch(r"[A-Za-z0-9_.:/-]+", n) for n in names):
        raise Unsupported(f"{where}: schema {text!r} is not a namespace and dimension names")
    return names[0], frozenset(names[1:])


def search_terms(text: str) -> tuple[str, frozenset[str], str]:
    """(namespace, dimension names, metric name) of the one SEARCH form the preview reads."""
    m = _SEARCH.fullmatch(text.strip())
    if m is None:
        raise Unsupported(
            f'SEARCH {text!r}: the preview reads only \'{{"ns",dim,...}} MetricName="Name"\' '
            "(exact schema, one metric name)"
        )
    namespace, dims = _schema(m.group("schema"), f"SEARCH {text!r}")
    return namespace, dims, m.group("name")


# --- evaluation ----------------------------------------------------------------------------------


@dataclass
class _Row:
    id: str
    options: dict[str, Any]
    metric: MetricKey | None = None  # a metric row
    expression: str | None = None  # an expression row


def _rows(props: dict[str, Any]) -> list[_Row]:
    rows: list[_Row] = []
    for n, raw in enumerate(props.get("metrics", [])):
        if not isinstance(raw, list) or not raw:
            raise Unsupported(f"metrics row {n}: {raw!r} is not a row")
        options = raw[-1] if isinstance(raw[-1], dict) else {}
        body = raw[:-1] if isinstance(raw[-1], dict) else raw
        if "expression" in options:
            if body or set(options) - EXPRESSION_OPTIONS:
                raise Unsupported(f"metrics row {n}: expression row with {sorted(set(options) - EXPRESSION_OPTIONS)}")
            rows.append(_Row(str(options.get("id", f"e{n + 1}")), options, expression=str(options["expression"])))
            continue
        if set(options) - ROW_OPTIONS:
            raise Unsupported(f"metrics row {n}: options {sorted(set(options) - ROW_OPTIONS)} are not implemented")
        if len(body) < 2 or len(body) % 2 or not all(isinstance(x, str) for x in body) or "." in body:
            raise Unsupported(f"metrics row {n}: {raw!r} is not [namespace, name, dim, value, ..., {{options}}]")
        dims = tuple(sorted(zip(body[2::2], body[3::2])))
        rows.append(_Row(str(options.get("id", f"m{n + 1}")), options, metric=MetricKey(body[0], body[1], dims)))
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise Unsupported(f"duplicate row ids in {ids}")
    return rows


class Evaluator:
    """The rows of one metric widget."""

    def __init__(self, props: dict[str, Any], data: Data) -> None:
        self.props = props
        self.data = data
        self.rows = {r.id: r for r in _rows(props)}
        self.memo: dict[str, Value] = {}
        self.busy: set[str] = set()

    def period(self, row: _Row) -> float:
        return float(row.options.get("period", self.props.get("period", 300)))

    def lines(self) -> list[Line]:
        out = []
        for row in self.rows.values():
            value = self.value(row.id)
            label = str(row.options.get("label", row.metric.name if row.metric else row.id))
            if isinstance(value, float):
                raise Unsupported(f"row {row.id}: {row.expression!r} is a number, not a time series")
            if isinstance(value, Series):
                series = [Series(label, value.points, value.step)]
            else:
                prefix = str(row.options.get("label", ""))
                series = [Series(f"{prefix} {s.label}".strip(), s.points, s.step) for s in value]
            axis = str(row.options.get("yAxis", "left"))
            out.append(Line(row.id, label, series, row.options.get("visible", True) is not False, axis))
        return out

    def value(self, id_: str) -> Value:
        if id_ in self.memo:
            return self.memo[id_]
        if id_ not in self.rows:
            raise Unsupported(f"expression refers to {id_!r}, which is no row of the widget")
        if id_ in self.busy:
            raise Unsupported(f"row {id_} refers to itself")
        self.busy.add(id_)
        row = self.rows[id_]
        if row.metric is not None:
            stat = str(row.options.get("stat", self.props.get("stat", "Average")))
            result: Value = self.metric(row.metric, stat, self.period(row), row.metric.name)
        else:
            result = self.expression(row)
        self.busy.discard(id_)
        self.memo[id_] = result
        return result

    def bucketed(self, points: Iterable[Datapoint], period: float) -> dict[float, list[Datapoint]]:
        out: dict[float, list[Datapoint]] = {}
        for p in points:
            out.setdefault(self.data.clock.bucket(p.time, period), []).append(p)
        return out

    def metric(self, key: MetricKey, stat: str, period: float, label: str) -> Series:
        series = Series(label, step=self.data.clock.seconds(period))
        for start, points in sorted(self.bucketed(self.data.store.points.get(key, []), period).items()):
            value = statistic(points, stat)
            if value is not None:
                series.points[start] = value
        return series

    def expression(self, row: _Row) -> Value:
        text = (row.expression or "").strip()
        if text.upper().startswith("SELECT "):
            return self.insights_query(text, self.period(row))
        return self.node(parse(text), row)

    def node(self, node: Node, row: _Row) -> Value:
        if isinstance(node, Num):
            return node.value
        if isinstance(node, Ref):
            return self.value(node.id)
        if isinstance(node, Neg):
            return _apply(lambda a, b: a * b, self.node(node.operand, row), -1.0)
        if isinstance(node, BinOp):
            right = node.right
            left = node.left
            if (
                node.op == "/"
                and isinstance(right, Num)
                and isinstance(left, Call)
                and left.name == "SEARCH"
                and float(_arg(left, 2)) == right.value
            ):  # SEARCH(..., P)/P: per second (module docstring)
                right = Num(self.data.clock.seconds(right.value))
            ops: dict[str, Callable[[float, float], float | None]] = {
                "+": lambda a, b: a + b,
                "-": lambda a, b: a - b,
                "*": lambda a, b: a * b,
                "/": lambda a, b: a / b if b else None,
            }
            return _apply(ops[node.op], self.node(node.left, row), self.node(right, row))
        if node.name == "SEARCH":
            return self.search(str(_arg(node, 0)), str(_arg(node, 1)), float(_arg(node, 2)))
        if node.name == "DIFF":  # each value minus the one before it; the first has none ("Metric math functions")
            arg = node.args[0]
            if isinstance(arg, str):
                raise Unsupported(f"DIFF({arg!r}): the preview takes DIFF of a series")
            return _diff(self.node(arg, row))
        if node.name == "PERIOD":
            target = node.args[0]
            if not isinstance(target, Ref) or target.id not in self.rows:
                raise Unsupported(f"PERIOD({target}): the preview takes the period of a row id")
            return self.data.clock.seconds(self.period(self.rows[target.id]))
        return self.insight_rule(str(_arg(node, 0)), str(_arg(node, 1)), self.period(row))

    def search(self, text: str, stat: str, period: float) -> list[Series]:
        namespace, dims, name = search_terms(text)
        out = []
        for key in self.data.store.metrics(namespace, name, dims):
            label = " ".join(v for _, v in key.dims)
            series = self.metric(key, stat, period, label)
            if series.points:
                out.append(series)
        return out

    def insights_query(self, text: str, period: float) -> Value:
        """A Metrics Insights query: one series, or one per group with GROUP BY (the alarms use it)."""
        m = _SELECT.fullmatch(text.strip())
        func = m.group("func").upper() if m else ""
        if m is None or func not in INSIGHTS_FUNCTIONS:
            raise Unsupported(
                f"Metrics Insights {text!r}: the preview reads only SELECT AVG|SUM|MIN|MAX|COUNT(Name) "
                "FROM SCHEMA(...) [GROUP BY ...] [ORDER BY FUNC() ASC|DESC] [LIMIT n] (no WHERE)"
            )
        namespace, dims = _schema(m.group("schema"), f"Metrics Insights {text!r}")
        keys = list(self.data.store.metrics(namespace, m.group("name"), dims))
        stat = INSIGHTS_FUNCTIONS[func]
        if not m.group("group"):
            return self._aggregate(m.group("name"), [p for k in keys for p in self.data.store.points[k]], stat, period)
        by = [g.strip() for g in m.group("group").split(",")]
        if set(by) - dims:
            raise Unsupported(f"Metrics Insights {text!r}: GROUP BY a key outside the SCHEMA")
        groups: dict[tuple[str, ...], list[Datapoint]] = {}
        for k in keys:
            groups.setdefault(tuple(k.value(d) for d in by), []).extend(self.data.store.points[k])
        grouped = sorted(groups.items())
        if m.group("ofunc"):
            order = INSIGHTS_FUNCTIONS.get(m.group("ofunc").upper())
            if order is None:
                raise Unsupported(f"Metrics Insights {text!r}: ORDER BY {m.group('ofunc')}()")
            descending = (m.group("order") or "ASC").upper() == "DESC"
            grouped.sort(key=lambda g: statistic(g[1], order) or 0.0, reverse=descending)
        if m.group("limit"):
            grouped = grouped[: int(m.group("limit"))]
        return [self._aggregate(" ".join(g), points, stat, period) for g, points in grouped]

    def _aggregate(self, label: str, points: list[Datapoint], stat: str, period: float) -> Series:
        series = Series(label, step=self.data.clock.seconds(period))
        for start, bucket in sorted(self.bucketed(points, period).items()):
            value = statistic(bucket, stat)
            if value is not None:
                series.points[start] = value
        return series

    def insight_rule(self, name: str, metric: str, period: float) -> Series:
        """A Contributor Insights rule's UniqueContributors: distinct key tuples of the matching events."""
        if metric != "UniqueContributors":
            raise Unsupported(f"INSIGHT_RULE_METRIC({name!r}, {metric!r}): the preview computes UniqueContributors")
        if name not in self.data.rules:
            raise Unsupported(f"INSIGHT_RULE_METRIC: no rule {name!r} (alarms/cli/insight-rule-*.json)")
        rule = self.data.rules[name]
        contribution = rule.get("Contribution", {})
        if rule.get("LogFormat") != "JSON" or set(contribution) - {"Keys", "Filters"}:
            raise Unsupported(f"rule {name}: the preview reads JSON rules with Keys and Filters only")
        keys = [_json_path(k, name) for k in contribution.get("Keys", [])]
        filters = []
        for f in contribution.get("Filters", []):
            if set(f) != {"Match", "IsPresent"}:
                raise Unsupported(f"rule {name}: filter {f}: the preview implements Match with IsPresent only")
            filters.append((_json_path(f["Match"], name), bool(f["IsPresent"])))
        buckets: dict[float, set[tuple[str, ...]]] = {}
        for group in rule.get("LogGroupNames", []):
            for event in self.data.logs.get(group, []):
                doc = event.json()
                if doc is None or any((path in doc) != present for path, present in filters):
                    continue
                if all(k in doc for k in keys):
                    start = self.data.clock.bucket(event.time, period)
                    buckets.setdefault(start, set()).add(tuple(json.dumps(doc[k]) for k in keys))
        return Series(
            name,
            {start: float(len(found)) for start, found in sorted(buckets.items())},
            self.data.clock.seconds(period),
        )


def _json_path(path: str, rule: str) -> str:
    if not re.fullmatch(r"\$\.[A-Za-z0-9_]+", path):
        raise Unsupported(f"rule {rule}: key {path!r}: the preview reads top-level $.field keys only")
    return path[2:]


def _arg(call: Call, n: int) -> str | float:
    arg = call.args[n]
    if isinstance(arg, str):
        return arg
    if isinstance(arg, Num):
        return arg.value
    raise Unsupported(f"{call.name}: argument {n + 1} must be a literal")


def _pointwise(op: Callable[[float, float], float | None], a: Series, b: Series | float) -> Series:
    """``a op b`` at each period: between two series at every period either has a value, the other's missing
    value taken as 0 (the User Guide's "Basic arithmetic functions": "Missing values in a time series are
    treated as 0"); a division by zero drops the period."""
    out = Series(a.label, step=max(a.step, b.step if isinstance(b, Series) else 0.0))
    if isinstance(b, float):
        pairs = [(t, x, b) for t, x in a.points.items()]
    else:
        times = sorted(a.points.keys() | b.points.keys())
        pairs = [(t, a.points.get(t, 0.0), b.points.get(t, 0.0)) for t in times]
    for t, x, y in pairs:
        if (v := op(x, y)) is not None:
            out.points[t] = v
    return out


def _apply(op: Callable[[float, float], float | None], a: Value, b: Value) -> Value:
    """Metric math's broadcasting, for the shapes the preview meets: number, one series, SEARCH's array."""
    if isinstance(a, float) and isinstance(b, float):
        result = op(a, b)
        if result is None:
            raise Unsupported("division by zero in a constant expression")
        return result
    if isinstance(a, list) and isinstance(b, float):
        return [_pointwise(op, s, b) for s in a]
    if isinstance(a, float) and isinstance(b, list):
        return [_pointwise(lambda x, y: op(y, x), s, a) for s in b]
    if isinstance(a, Series) and isinstance(b, Series | float):
        return _pointwise(op, a, b)
    if isinstance(a, float) and isinstance(b, Series):
        return _pointwise(lambda x, y: op(y, x), b, a)
    raise Unsupported("metric math between two arrays of series (or an array and a series) is not implemented")


def evaluate(props: dict[str, Any], data: Data) -> list[Line]:
    """Every row of a metric widget, hidden rows included (``Line.visible``)."""
    return Evaluator(props, data).lines()
