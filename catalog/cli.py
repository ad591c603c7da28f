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

from . import BUILTIN_PACKS, Catalog, build


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
        metavar="PATH",
        shown="",
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
        shown="",
    ),
    Option(
        "llm_metrics",
        "--llm-metrics",
        ("EXPORTER_LLM_METRICS",),
        choice("on", "off"),
        "the built-in LLM pack (vLLM, TensorRT-LLM families); costs nothing where they are absent",
        metavar="on|off",
        shown="on",
    ),
)
FIELDS = frozenset(o.field for o in OPTIONS)


def packs(llm: str) -> tuple[str, ...]:
    return BUILTIN_PACKS if llm == "on" else tuple(p for p in BUILTIN_PACKS if p != "llm")


def from_values(values: Mapping[str, Any]) -> Catalog:
    """The catalog that :func:`telemetry.settings.read` values of :data:`OPTIONS` describe; raises CatalogError."""
    return build(values.get("catalog_files", ()), values.get("metrics", ""), packs(values.get("llm_metrics", "on")))
