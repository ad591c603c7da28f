"""The CloudWatch dashboard body: a title, then one section per module of this package, in :data:`SECTIONS`.

Each section module holds its intro text and its widgets (``SECTION``); to add a widget, add it to its
section's file; to add a section, write a module and list it here. Widgets are built on
:mod:`render.base.widgets`: every metric goes through its one reference checker, and a widget whose
metrics the ``--metrics`` selection leaves out is not drawn. Histogram metrics are CloudWatch
distributions: their graphs use percentile statistics (p50, p95, p99) computed over the events of every task.
"""

from __future__ import annotations

from typing import Any

from ..base.options import Options
from ..base.widgets import GRID_WIDTH, MAX_METRICS_PER_WIDGET, MAX_WIDGETS, Layout, Section, search, text
from . import gpu, llm, logs, models, modelsync, overview, scaling

__all__ = ["GRID_WIDTH", "MAX_METRICS_PER_WIDGET", "MAX_WIDGETS", "SECTIONS", "build", "search"]

SECTIONS: tuple[Section, ...] = (
    overview.SECTION,
    scaling.SECTION,
    models.SECTION,
    gpu.SECTION,
    llm.SECTION,
    logs.SECTION,
    modelsync.SECTION,
)


def build(opts: Options) -> dict[str, Any]:
    """The dashboard body: the JSON ``aws cloudwatch put-dashboard --dashboard-body`` takes."""
    built = [(s, s.widgets(opts)) for s in SECTIONS]
    shown = [(s, placed) for s, placed in built if not s.optional or any(p.widget is not None for p in placed)]
    intro = "\n".join(f"- {s.text}" for s, _ in shown)
    lay = Layout()
    lay.add(
        text(
            f"# Triton Inference Server ({opts.namespace})\n{intro}\n"
            f"\nMetrics are one series across all tasks of the service (no task id dimension): "
            f"one CloudWatch namespace per ECS service."
        ),
        GRID_WIDTH,
        4,
    )
    lay.newline()
    for section, placed in shown:
        lay.section(section.text)
        for p in placed:
            lay.add(p.widget, p.width, p.height)
    if len(lay.widgets) > MAX_WIDGETS:
        raise ValueError(f"{len(lay.widgets)} widgets: CloudWatch allows {MAX_WIDGETS}")
    return {"start": "-PT3H", "periodOverride": "auto", "widgets": lay.widgets}
