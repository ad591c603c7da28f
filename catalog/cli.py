"""The catalog settings every command shares: ``--catalog``, ``--metrics``, ``--llm-metrics``.

One table (:data:`OPTIONS`, read by :mod:`telemetry.settings`): the daemon
(``python -m exporter``) and the ``catalog``, ``cost`` and ``render``
commands add these rows to their own, so what a selection emits, costs and
draws is one command away, and a bad value (``EXPORTER_LLM_METRICS=yes``) is
refused by all of them with exit 2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from telemetry.settings import Option, choice

from . import BUILTIN_PACKS, Catalog, Metric, build


def _path(text: str) -> str:
    if not text.strip():
        raise ValueError("needs a catalog file path")
    return text


def _selection(text: str) -> str:
    if not text.strip():
        raise ValueError("needs comma-separated patterns, e.g. -RequestFailure*,-Compute*")
    return text.strip()


OPTIONS: tuple[Option, ...] = (
    Option(
        "catalog_files",
        "--catalog",
        ("EXPORTER_CATALOG",),
        _path,
        "a catalog file (TOML, docs/metrics.md) adding, replacing or dropping metrics; repeatable; the variable "
        f"takes paths separated by {os.pathsep!r}",
        repeatable=True,
        metavar="FILE",
        shown="none",
    ),
    Option(
        "metrics",
        "--metrics",
        ("EXPORTER_METRICS",),
        _selection,
        "which metrics to emit: comma-separated globs over EMF names, '-' excludes, left to right "
        "(e.g. -RequestFailure*,-Compute*)",
        dash_value=True,
        metavar="PATTERNS",
        shown="every metric of the catalog",
    ),
    Option(
        "llm_metrics",
        "--llm-metrics",
        ("EXPORTER_LLM_METRICS",),
        choice("on", "off"),
        "the built-in LLM pack (vLLM, TensorRT-LLM families); costs nothing where they are absent",
        shown="on",
    ),
)
FIELDS = frozenset(o.field for o in OPTIONS)


def packs(llm: str) -> tuple[str, ...]:
    return BUILTIN_PACKS if llm == "on" else tuple(p for p in BUILTIN_PACKS if p != "llm")


def from_values(values: Mapping[str, Any]) -> Catalog:
    """The catalog that :func:`telemetry.settings.read` values of :data:`OPTIONS` describe; raises CatalogError."""
    return build(values.get("catalog_files", ()), values.get("metrics", ""), packs(values.get("llm_metrics", "on")))


def builtin_of(values: Mapping[str, Any]) -> Catalog:
    """The built-in packs the values select, without the ``--catalog`` files: what those files change."""
    return build((), "", packs(values.get("llm_metrics", "on")))


def listing(catalog: Catalog, builtin: Catalog, everything: bool = False) -> str:
    """``python -m exporter catalog``'s table: a header row, one metric a row, and a count.

    With ``--catalog`` files, a header says what they add, replace and drop, and the table lists the selected
    metrics they define (``everything``: every selected metric, as without files).
    """
    files = [f for f in catalog.files if f not in builtin.files]
    out: list[str] = []
    rows: list[Metric] = list(catalog.metrics)
    if files:
        theirs = [m for m in catalog.defined if m.origin in files]
        replaced = [m.name for m in theirs if builtin.definition(m.name) is not None]
        dropped = [m.name for m in builtin.defined if catalog.definition(m.name) is None]
        out.append(
            f"{', '.join(files)}: adds {len(theirs) - len(replaced)}, replaces {len(replaced)} and drops "
            f"{len(dropped)} of the {len(builtin.defined)} built-in metrics\n"
        )
        if replaced:
            out.append(f"replaces: {', '.join(replaced)}\n")
        if dropped:
            out.append(f"drops: {', '.join(dropped)}\n")
        if not everything:
            rows = [m for m in rows if m.origin in files]
            out.append("listed: the selected metrics these files add or replace (--all: every selected metric)\n")
    table = [("metric", "unit", "kind", "dimensions", "computed from")]
    for m in rows:
        dims = " | ".join(",".join(d) or "(none)" for d in m.dimension_sets)
        table.append((m.name, m.unit, str(m.kind), f"[{dims}]", m.describe_inputs()))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]  # the last column is not padded
    for *cells, last in table:
        out.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + f"  {last}\n")
    shown = f"{len(rows)} listed; " if len(rows) != len(catalog.metrics) else ""
    out.append(f"{shown}{len(catalog.metrics)} of {len(catalog.defined)} metrics selected\n")
    return "".join(out)
