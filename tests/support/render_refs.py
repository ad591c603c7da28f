"""What a dashboard or alarm reads: (namespace, metric name, dimension names) triples.

Parses the rendered JSON itself (metric rows with ``"."`` repeats, SEARCH
schemas, Metrics Insights ``SCHEMA(...)`` clauses, alarm MetricName /
Dimensions), so the agreement test checks the files users import, not the
Python that produced them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

Ref = tuple[str, str, frozenset[str]]

_SEARCH = re.compile(r"SEARCH\(\s*'\{(?P<schema>[^}]*)\}\s+(?P<rest>[^']*)'")
_METRIC_NAME = re.compile(r'MetricName\s*=\s*"(?P<name>[^"]+)"')
_INSIGHTS = re.compile(r"SELECT\s+\w+\((?P<name>[^)]+)\)\s+FROM\s+SCHEMA\((?P<schema>[^)]*)\)", re.IGNORECASE)


def _unquote(term: str) -> str:
    term = term.strip()
    return term[1:-1] if len(term) >= 2 and term[0] == term[-1] == '"' else term


def expression_refs(expression: str) -> list[Ref]:
    """Metrics named by SEARCH or Metrics Insights inside one expression."""
    out: list[Ref] = []
    for m in _SEARCH.finditer(expression):
        ns, *dims = [_unquote(t) for t in m.group("schema").split(",")]
        names = _METRIC_NAME.findall(m.group("rest"))
        if len(names) != 1:
            raise ValueError(f'SEARCH without exactly one MetricName="...": {expression}')
        out.append((ns, names[0], frozenset(dims)))
    for m in _INSIGHTS.finditer(expression):
        ns, *dims = [_unquote(t) for t in m.group("schema").split(",")]
        out.append((ns, _unquote(m.group("name")), frozenset(dims)))
    return out


def metric_rows(rows: list[list[Any]]) -> list[list[Any]]:
    """Rows with ``"."`` cells replaced by the cell above, options dict removed (CloudWatch's own rule)."""
    out: list[list[Any]] = []
    prev: list[Any] = []
    for row in rows:
        cells = [c for c in row if not isinstance(c, dict)]
        if cells:
            cells = [prev[i] if c == "." and i < len(prev) else c for i, c in enumerate(cells)]
            prev = cells
        out.append(cells)
    return out


def dashboard_refs(body: dict[str, Any]) -> list[Ref]:
    out: list[Ref] = []
    for widget in body["widgets"]:
        if widget.get("type") != "metric":
            continue
        rows = widget["properties"]["metrics"]
        for row, cells in zip(rows, metric_rows(rows), strict=True):
            if cells:
                ns, name, *pairs = cells
                out.append((ns, name, frozenset(pairs[0::2])))
            for opt in (c for c in row if isinstance(c, dict)):
                if "expression" in opt:
                    out += expression_refs(opt["expression"])
    return out


def alarm_refs(alarm: dict[str, Any]) -> list[Ref]:
    if "MetricName" in alarm:
        return [(alarm["Namespace"], alarm["MetricName"], frozenset(d["Name"] for d in alarm.get("Dimensions", [])))]
    out: list[Ref] = []
    for q in alarm.get("Metrics", []):
        if "MetricStat" in q:
            m = q["MetricStat"]["Metric"]
            out.append((m["Namespace"], m["MetricName"], frozenset(d["Name"] for d in m.get("Dimensions", []))))
        if "Expression" in q:
            out += expression_refs(q["Expression"])
    return out


def emitted(documents: Iterable[bytes | str | dict[str, Any]]) -> set[Ref]:
    """Every (namespace, metric, dimension set) the EMF documents' ``_aws`` directives declare."""
    import orjson

    out: set[Ref] = set()
    for doc in documents:
        obj = doc if isinstance(doc, dict) else orjson.loads(doc)
        for directive in obj["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                for dims in directive["Dimensions"]:
                    out.add((directive["Namespace"], metric["Name"], frozenset(dims)))
    return out
