"""What every rendered output stands on: metric references and dashboard widgets.

:func:`emitted` is the one reference checker ("is this metric emitted with
these dimensions"): every metric a dashboard widget, an alarm or a rule
names goes through it, against the catalog that emits the metric (the
exporter's, with its ``--metrics`` selection, or model sync's pack), so a
renamed metric breaks the render instead of leaving a widget that silently
shows nothing or an alarm that never fires (:func:`sent` does the same for the
families and names the OTLP output sends, which PromQL alarms query). A metric the selection leaves
out is ``None``: the row helpers pass ``None`` on, :func:`graph` drops the
rows and a widget left with no rows is dropped by :class:`Layout`.

Per-model and per-GPU graphs use SEARCH on the dimension schema, so models
and GPUs that appear later show up without editing the dashboard; fleet
totals use Metrics Insights (one aggregated series, up to 10,000 metrics
scanned) or the catalog's rollup dimension sets.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from catalog import Catalog, Kind, Scope
from catalog.otlp import DECOUPLED, by_kind, own_name

from .options import MAX_LOG_GROUPS_PER_QUERY, Options

GRID_WIDTH = 24
MAX_WIDGETS = 500
MAX_METRICS_PER_WIDGET = 500
MAX_ALARMS_PER_WIDGET = 100
PERIOD = 60  # the exporter's default interval; one datapoint per entity and minute

Widget = dict[str, Any]
Row = list[Any]


def emitted(catalog: Catalog, name: str, dims: tuple[str, ...], optional: bool = False) -> str | None:
    """The metric name, after checking ``catalog`` defines it with exactly these dimension names.

    None when the selection leaves it out; a KeyError when no catalog file
    defines it at all, unless ``optional``: a metric of an optional built-in
    pack (LLM), absent when the pack is off.
    """
    metric = catalog.definition(name)
    if metric is None and optional:
        return None
    if metric is None:
        raise KeyError(f"render references {name!r}, which is not in the catalog ({', '.join(catalog.files)})")
    if tuple(dims) not in metric.dimension_sets:
        raise KeyError(f"{name} is not emitted with dimensions {list(dims)}; the catalog has {metric.dimension_sets}")
    return name if catalog.emits(name) else None


# The point labels of the exporter's own gauges on OTLP, by scope (exporter/otlp_output.py).
OWN_LABELS: dict[Scope, tuple[str, ...]] = {Scope.MODEL: ("model", "version"), Scope.SOURCE: ("source",)}


def sent(catalog: Catalog, name: str, labels: tuple[str, ...], optional: bool = False) -> str | None:
    """The OTLP metric name of a family or an exporter-computed metric, after checking its labels.

    :func:`emitted`'s counterpart for what the OTLP output sends (exporter/otlp_output.py): ``name`` is a
    catalog family (``nv_inference_request_failure``), sent under its own name when some selected metric
    reads it, or a ``self``/``state`` metric (``ModelReady``), sent as ``triton_exporter_<snake_case>``
    when selected. Every label must be one the family carries (``le`` and ``quantile`` included for
    histograms and summaries; the resource's ``@resource.*`` are not point labels). None when the
    selection sends none of it; a KeyError when the catalog knows no such family or metric, unless
    ``optional`` (a family of an optional built-in pack).
    """
    family = catalog.families.get(name)
    if family is not None:
        carried = (*family.labels, *{"histogram": ("le",), "summary": ("quantile",)}.get(family.type, ()))
        if name in by_kind(catalog):
            carried = (*carried, DECOUPLED)  # added from the model's configuration
        if set(labels) - set(carried):
            raise KeyError(f"{name} carries no label(s) {sorted(set(labels) - set(carried))}; it has {carried}")
        read = any(i.family == name for m in catalog.metrics for i in m.all_inputs())
        return name if read else None
    metric = catalog.definition(name)
    if metric is not None and metric.kind in (Kind.SELF, Kind.STATE):
        carried = OWN_LABELS.get(metric.scope, ())
        if set(labels) - set(carried):
            raise KeyError(f"{own_name(name)} carries no label(s) {sorted(set(labels) - set(carried))}")
        return own_name(name) if catalog.emits(name) else None
    if optional:
        return None
    raise KeyError(f"render references {name!r}, which is no family or own metric of the catalog")


def search_expression(namespace: str, metric: str, dims: tuple[str, ...], stat: str) -> str:
    """The SEARCH text for a metric already checked by :func:`emitted`."""
    schema = ",".join([f'"{namespace}"', *dims])
    return f"SEARCH('{{{schema}}} MetricName=\"{metric}\"', '{stat}', {PERIOD})"


def search(
    opts: Options,
    name: str,
    dims: tuple[str, ...],
    stat: str,
    optional: bool = False,
    catalog: Catalog | None = None,
) -> str | None:
    """SEARCH over one metric's dimension schema (``catalog``: the exporter's unless given)."""
    metric = emitted(catalog or opts.catalog, name, dims, optional)
    return None if metric is None else search_expression(opts.namespace, metric, dims, stat)


def insights(opts: Options, func: str, name: str, dims: tuple[str, ...]) -> str | None:
    """A Metrics Insights query: one series aggregated over the dimension schema."""
    metric = emitted(opts.catalog, name, dims)
    if metric is None:
        return None
    schema = ", ".join([f'"{opts.namespace}"', *dims])
    return f"SELECT {func}({metric}) FROM SCHEMA({schema})"


def per_second(expression: str | None) -> str | None:
    """A per-period Sum as a per-second rate (the period is the graph's, PERIOD seconds)."""
    return None if expression is None else f"{expression}/{PERIOD}"


@dataclass
class Layout:
    """Packs widgets left to right on the 24-column grid; ``section`` starts a new row."""

    widgets: list[Widget] = field(default_factory=list)
    x: int = 0
    y: int = 0
    row_height: int = 0

    def add(self, widget: Widget | None, width: int, height: int) -> None:
        if widget is None:  # everything it would show is left out by the selection
            return
        if self.x + width > GRID_WIDTH:
            self.newline()
        self.widgets.append({**widget, "x": self.x, "y": self.y, "width": width, "height": height})
        self.x += width
        self.row_height = max(self.row_height, height)

    def newline(self) -> None:
        self.y += self.row_height
        self.x, self.row_height = 0, 0

    def section(self, markdown: str) -> None:
        if self.x:
            self.newline()
        self.add(text(markdown), GRID_WIDTH, 1)
        self.newline()


@dataclass(frozen=True)
class Placed:
    """A widget with its size on the grid (None: the selection left out everything it would show)."""

    widget: Widget | None
    width: int = 8
    height: int = 6


def text(markdown: str) -> Widget:
    return {"type": "text", "properties": {"markdown": markdown}}


def graph(
    opts: Options,
    title: str,
    metrics: list[Row | None],
    *,
    stat: str = "Average",
    view: str = "timeSeries",
    unit_label: str = "",
    annotations: list[dict[str, Any]] | None = None,
) -> Widget | None:
    """A metric widget of the rows the selection keeps; None when it keeps none.

    An expression row that refers to the id of a dropped row is dropped too.
    """
    rows = [r for r in metrics if r is not None]
    ids = {o["id"] for r in rows for o in r if isinstance(o, dict) and "id" in o}
    rows = [r for r in rows if not row_refs(r) - ids]
    if not [r for r in rows if not hidden(r)]:
        return None
    props: dict[str, Any] = {
        "title": title,
        "region": opts.region,
        "view": view,
        "stacked": False,
        "period": PERIOD,
        "stat": stat,
        "metrics": rows,
    }
    if unit_label:
        props["yAxis"] = {"left": {"label": unit_label, "showUnits": False}}
    if annotations:
        props["annotations"] = {"horizontal": annotations}
    return {"type": "metric", "properties": props}


_ID = re.compile(r"\b([a-z][a-zA-Z0-9_]*)\b")


def row_refs(row: Row) -> set[str]:
    """Row ids an expression row uses (``ok/PERIOD(ok)`` uses ``ok``); SEARCH, SELECT and INSIGHT_RULE_METRIC
    use none."""
    opt = row[-1] if row and isinstance(row[-1], dict) else {}
    expr = opt.get("expression", "")
    if not expr or "SEARCH(" in expr or "SELECT " in expr or "INSIGHT_RULE_METRIC(" in expr:
        return set()
    return set(_ID.findall(expr.replace("PERIOD", "")))


def hidden(row: Row) -> bool:
    return bool(row) and isinstance(row[-1], dict) and row[-1].get("visible") is False


def expr(expression: str | None, label: str, id_: str, **extra: Any) -> Row | None:
    """An expression row; no label lets SEARCH name each series by its dimension values."""
    if expression is None:
        return None
    return [{"expression": expression, **({"label": label} if label else {}), "id": id_, **extra}]


def row(opts: Options, name: str, options: dict[str, Any], catalog: Catalog | None = None) -> Row | None:
    """A metric row of the empty dimension set: one series across all tasks (``catalog``: the exporter's
    unless given)."""
    metric = emitted(catalog or opts.catalog, name, ())
    return None if metric is None else [opts.namespace, metric, options]


def logs(opts: Options, title: str, groups: list[str], query: str) -> Widget:
    """A Logs Insights table over 1-50 log groups."""
    if not 1 <= len(groups) <= MAX_LOG_GROUPS_PER_QUERY:
        raise ValueError(f"a Logs Insights query takes 1-{MAX_LOG_GROUPS_PER_QUERY} log groups, got {len(groups)}")
    sources = " | ".join(f"SOURCE '{g}'" for g in groups)
    return {
        "type": "log",
        "properties": {"title": title, "region": opts.region, "view": "table", "query": f"{sources} | {query}"},
    }


@dataclass(frozen=True)
class Section:
    """One dashboard section: its line in the intro and header, and the widgets it places in order.

    ``optional``: the section (header and intro line) is left out when the selection keeps none of its
    widgets (the LLM section when the LLM pack is off).
    """

    text: str
    widgets: Callable[[Options], list[Placed]]
    optional: bool = False
