"""The dashboard body drawn with matplotlib: every widget where CloudWatch's grid puts it, with the run's data.

:func:`draw` follows the JSON, whatever it holds: text widgets as plain text (markdown marks
dropped), metric widgets as line charts with their legend, axis labels and horizontal annotations
(``timeSeries``) or as big numbers (``singleValue``), alarm widgets as one box per alarm with the
state the run puts it in (:mod:`.alarms`), log widgets as the table their query gives
(:mod:`.logsinsights`). A widget with nothing to show says why (:func:`no_data_reason`), and a
widget type, view or property the preview does not implement raises
:class:`~demo.preview.emf.Unsupported` before anything is drawn.

A series' values in neighbouring periods are joined by a line; a value with no neighbour (a sync
attempt, a refused archive: one period of a sparse series) is a point on its own, never a slope
drawn to a value minutes away. :func:`top` is the dashboard's first screen (status, alarms, the
first row of graphs) and one GPU panel, re-flowed onto half the grid's width so that it stays
legible where a page shows it narrow (the README).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from . import logsinsights
from .alarms import AlarmState, alarm_props, evaluate_alarm
from .emf import Unsupported
from .metricmath import Data, Line, Series, evaluate, search_terms
from .text import DPI, PT, fit, number, plain, width, wrap

GRID_WIDTH = 24
TOP_COLUMNS = 12  # the first screen's grid: half the dashboard's width, legible at a README's width
TOP_GPU_PANEL = "GPU utilization %"  # the GPU panel the first screen adds, by the start of its title
JOIN = 1.5  # two values at most this many periods apart are neighbours, joined by a line
SPARSE = 3  # a series of this many values or fewer is drawn as points (joined where they are neighbours)
POINT, DOT = 5.0, 2.2  # marker sizes (pt): a value drawn as a point; a value on a line of many
COL_PX = 80  # one grid column
ROW_PX = 44  # one grid row (CloudWatch's rows are about half a column high)
GAP_PX = 8

PAGE = "#f2f3f3"
BORDER = "#d5dbdb"
INK = "#16191f"
MUTED = "#687078"
COLORS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]  # CloudWatch's graph palette (matplotlib's tab10)
STATE_COLORS = {"ALARM": "#d13212", "OK": "#1d8102", "INSUFFICIENT_DATA": "#879596"}

METRIC_KEYS = {"title", "region", "view", "stacked", "period", "stat", "metrics", "yAxis", "annotations", "legend"}
ALARM_KEYS = {"title", "alarms", "sortBy", "states"}
LOG_KEYS = {"title", "region", "view", "query"}


@dataclass(frozen=True)
class Box:
    """A widget's rectangle in pixels from the top left of the dashboard."""

    x: float
    y: float
    w: float
    h: float

    @classmethod
    def of(cls, widget: dict[str, Any], top: float) -> Box:
        return cls(
            widget["x"] * COL_PX + GAP_PX / 2,
            widget["y"] * ROW_PX + GAP_PX / 2 + top,
            widget["width"] * COL_PX - GAP_PX,
            widget["height"] * ROW_PX - GAP_PX,
        )


@dataclass
class Canvas:
    """The figure in pixels from the top left; cards, swatches and boxes go on one overlay in those pixels (one
    axes per graph only: axes are what makes a big figure slow)."""

    fig: Figure
    width: float
    height: float

    def __post_init__(self) -> None:
        self.overlay = self.fig.add_axes((0, 0, 1, 1), zorder=-1)
        self.overlay.set_xlim(0, self.width)
        self.overlay.set_ylim(self.height, 0)
        self.overlay.set_axis_off()

    def rect(self, x: float, y: float, w: float, h: float, **kw: Any) -> None:
        self.overlay.add_patch(Rectangle((x, y), w, h, **kw))

    def axes(self, x: float, y: float, w: float, h: float, **kw: Any) -> Axes:
        """Axes at a pixel rectangle (top-left origin)."""
        return self.fig.add_axes((x / self.width, 1 - (y + h) / self.height, w / self.width, h / self.height), **kw)

    def text(self, x: float, y: float, s: str, **kw: Any) -> None:
        """Plain text at a pixel position (a ``$`` is a dollar sign, never the start of mathtext)."""
        self.fig.text(x / self.width, 1 - y / self.height, s.replace("$", r"\$"), **kw)


def widget_metrics(props: dict[str, Any]) -> list[str]:
    """The metric names a metric widget reads (for saying why it has no data)."""
    names = []
    for row in props.get("metrics", []):
        opts = row[-1] if row and isinstance(row[-1], dict) else {}
        expression = str(opts.get("expression", ""))
        if "expression" not in opts and len(row) >= 2:
            names.append(str(row[1]))
        for m in re.finditer(r"SEARCH\('([^']*)'", expression):
            names.append(search_terms(m.group(1))[2])
        names += re.findall(r"SELECT\s+\w+\((\w+)\)", expression)
        names += [f"rule:{n}" for n in re.findall(r"INSIGHT_RULE_METRIC\('([^']+)'", expression)]
    return names


Reason = Callable[[list[str]], str]


def no_data_reason(scope_of: Callable[[str], str | None]) -> Reason:
    """Why a widget reading these metrics has no data in the demo, from each metric's catalog scope."""

    def reason(names: list[str]) -> str:
        scopes = {scope_of(n) for n in names if not n.startswith("rule:")}
        if "gpu" in scopes:
            return "no data in the demo (needs a GPU: NVML)"
        if "modelsync" in scopes or any(n.startswith("rule:") for n in names):
            return "no data: model sync emitted none of it in this run"
        return "no data in the demo run"

    return reason


# --- the widgets -------------------------------------------------------------------------------


def _frame(canvas: Canvas, box: Box, title: str | None) -> float:
    """The widget's white card and title; returns the y (px) where its content starts."""
    canvas.overlay.add_patch(
        FancyBboxPatch(
            (box.x, box.y),
            box.w,
            box.h,
            boxstyle="round,pad=0,rounding_size=3",
            facecolor="white",
            edgecolor=BORDER,
            linewidth=0.8,
        )
    )
    if not title:
        return box.y + 6
    canvas.text(
        box.x + 10, box.y + 8, fit(title, box.w - 20, 9.5, True), fontsize=9.5, fontweight="bold", color=INK, va="top"
    )
    return box.y + 30


def draw_text(canvas: Canvas, box: Box, props: dict[str, Any]) -> None:
    _frame(canvas, box, None)
    lines = plain(str(props.get("markdown", "")))
    y = box.y + 8
    for line, heading in lines:
        size = 13.0 if heading else 8.5
        step = size * PT * 1.35
        room = int((box.y + box.h - y - 4) / step)
        if room <= 0:
            break
        for part in wrap(line, box.w - 24, size, room, heading):
            canvas.text(
                box.x + 12, y, part, fontsize=size, color=INK, va="top", fontweight="bold" if heading else "normal"
            )
            y += step


LEGEND_PT = 7.0


def _legend_columns(box: Box, entries: list[tuple[str, str, bool]]) -> tuple[int, float]:
    """How many legend entries go side by side, and each one's width (px): wide enough for the longest label."""
    longest = max(width(label if has_data else f"{label} (no data)", LEGEND_PT) for label, _, has_data in entries)
    cell = min(box.w - 20, max(90.0, longest + 24))
    cols = max(1, int((box.w - 20) // cell))
    return cols, (box.w - 20) / cols


def _legend(canvas: Canvas, box: Box, entries: list[tuple[str, str, bool]], top: float) -> None:
    """Color swatch and label per series, in columns below the graph; what does not fit is counted."""
    if not entries:
        return
    size = LEGEND_PT
    cols, cell = _legend_columns(box, entries)
    rows = max(1, int((box.y + box.h - top - 4) // 13))
    shown = entries if len(entries) <= rows * cols else entries[: rows * cols - 1]
    for i, (label, color, has_data) in enumerate(shown):
        x = box.x + 12 + (i % cols) * cell
        y = top + (i // cols) * 13
        canvas.rect(x, y + 3, 10, 4, color=color if has_data else "#c8ced3")
        text = label if has_data else f"{label} (no data)"
        canvas.text(x + 14, y, fit(text, cell - 18, size), fontsize=size, va="top", color=INK if has_data else MUTED)
    if len(shown) < len(entries):
        i = len(shown)
        canvas.text(
            box.x + 12 + (i % cols) * cell,
            top + (i // cols) * 13,
            f"+{len(entries) - i} more",
            fontsize=size,
            va="top",
            color=MUTED,
        )


def _time_axis(ax: Axes, data: Data, span: tuple[float, float]) -> None:
    origin = data.clock.origin

    def label(x: float, _: int) -> str:
        return datetime.fromtimestamp(origin + x, UTC).strftime("%H:%M:%S")

    ax.xaxis.set_major_formatter(FuncFormatter(label))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 3, 6, 10]))
    ax.set_xlim(*span)


def draw_graph(canvas: Canvas, box: Box, props: dict[str, Any], data: Data, reason: Reason, note: str = "") -> None:
    top = _frame(canvas, box, str(props.get("title", "")))
    if note:  # where the values come from, when not from the run's own processes alone
        canvas.text(
            box.x + 10, top - 8, fit(note, box.w - 20, 7.0), fontsize=7.0, color=MUTED, style="italic", va="top"
        )
        top += 8
    lines = evaluate(props, data)
    visible = [ln for ln in lines if ln.visible]
    drawn = [(ln, s) for ln in visible for s in ln.series if s.points]
    if props.get("view", "timeSeries") == "singleValue":
        _single_values(canvas, box, top, visible, reason, widget_metrics(props))
        return
    entries: list[tuple[str, str, bool]] = []
    color_of: dict[int, str] = {}
    for n, (_, s) in enumerate(drawn):
        color_of[id(s)] = COLORS[n % len(COLORS)]
        entries.append((s.label, color_of[id(s)], True))
    if drawn:
        entries += [(ln.label, "", False) for ln in visible if len(ln.series) == 1 and not ln.series[0].points]
    legend_rows = 0 if not entries else min(3, 1 + (len(entries) - 1) // _legend_columns(box, entries)[0])
    bottom = box.y + box.h - 6 - legend_rows * 13 - (4 if legend_rows else 0)
    y_axes = props.get("yAxis", {})
    left_label = str(y_axes.get("left", {}).get("label", ""))
    right = [(ln, s) for ln, s in drawn if ln.axis == "right"]
    pad_left = 46 + (12 if left_label else 0)
    pad_right = 40 if right else 12
    plot = Box(box.x + pad_left, top + 2, box.w - pad_left - pad_right, bottom - top - 20)
    ax = canvas.axes(plot.x, plot.y, plot.w, plot.h)
    ax.set_facecolor("white")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(BORDER)
    ax.tick_params(labelsize=7, colors=MUTED, length=2)
    ax.grid(axis="y", color="#eaeded", linewidth=0.6)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: number(v)))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
    span = _span(data)
    starts = [x - data.clock.origin for _, s in drawn for x in s.points]
    if starts:  # a longer period's first bucket can start before the run's first window: show it whole
        pad = 0.03 * (span[1] - span[0])
        span = (min(span[0], min(starts) - pad), max(span[1], max(starts) + pad))
    _time_axis(ax, data, span)
    if left_label:
        ax.set_ylabel(left_label, fontsize=7, color=MUTED, labelpad=2)
    ax2 = ax.twinx() if right else None
    for ln, s in drawn:
        target = ax2 if (ax2 is not None and ln.axis == "right") else ax
        _plot(target, s, data, color_of[id(s)])
    if ax2 is not None:
        ax2.tick_params(labelsize=7, colors=MUTED, length=2)
        ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: number(v)))
        ax2.yaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
        for side in ("top", "left"):
            ax2.spines[side].set_visible(False)
        ax2.spines["right"].set_color(BORDER)
        right_label = str(y_axes.get("right", {}).get("label", ""))
        if right_label:
            ax2.set_ylabel(right_label, fontsize=7, color=MUTED)
    _annotations(ax, ax2, props.get("annotations", {}))
    for a, axis in ((ax, "left"), (ax2, "right")):
        if a is not None:
            values = [v for ln, s in drawn if (ln.axis == "right") == (axis == "right") for v in s.points.values()]
            marks = [
                float(h["value"])
                for h in props.get("annotations", {}).get("horizontal", [])
                if (h.get("yAxis", "left") == "right") == (axis == "right")
            ]
            a.set_ylim(*_y_range(values + marks))
    if not drawn:
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            reason(widget_metrics(props)),
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=8.5,
            color=MUTED,
            style="italic",
            wrap=True,
        )
    _legend(canvas, box, entries, bottom + 2)


def runs(xs: list[float], gap: float) -> list[list[float]]:
    """Sorted times cut where two neighbours are more than ``gap`` apart: each run is drawn as one line, and a
    run of one time is a point on its own."""
    out: list[list[float]] = []
    for x in xs:
        if out and x - out[-1][-1] <= gap:
            out[-1].append(x)
        else:
            out.append([x])
    return out


def _plot(ax: Axes, s: Series, data: Data, color: str) -> None:
    """A series: values in neighbouring periods joined by a line (each value at its period's start, as CloudWatch
    draws it), a value with no neighbour a point of its own (a period is at least one window of the run: the
    exporter writes once a window); a series of a few values is drawn as points, joined where neighbours."""
    gap = JOIN * max(s.step, data.clock.window)
    joined: tuple[list[float], list[float]] = ([], [])
    alone: tuple[list[float], list[float]] = ([], [])
    for run in runs(sorted(s.points), gap):
        if len(run) == 1:
            alone[0].append(run[0] - data.clock.origin)
            alone[1].append(s.points[run[0]])
            continue
        if joined[0]:  # a break in the line
            joined[0].append(float("nan"))
            joined[1].append(float("nan"))
        joined[0].extend(x - data.clock.origin for x in run)
        joined[1].extend(s.points[x] for x in run)
    if joined[0]:
        ax.plot(*joined, color=color, linewidth=1.3, marker="o", markersize=POINT if len(s.points) <= SPARSE else DOT)
    if alone[0]:
        ax.plot(*alone, color=color, linestyle="none", marker="o", markersize=POINT)


def _y_range(values: list[float]) -> tuple[float, float]:
    """From 0 (or the lowest value below it) to a little above the highest value or annotation."""
    if not values:
        return (0.0, 1.0)
    low, high = min(0.0, min(values)), max(values)
    if high <= low:
        high = low + 1.0
    return (low - 0.04 * (high - low) if low < 0 else 0.0, high + 0.08 * (high - low))


def _span(data: Data) -> tuple[float, float]:
    """The time axis, seconds from the clock's origin: from the first period with data (model sync starts
    before the exporter's first window) to the start of the last exporter window."""
    times = data.store.times()
    if not times:
        return (0.0, data.clock.window)
    first = min(0.0, data.clock.bucket(times[0], data.clock.base) - data.clock.origin)
    last = max(data.clock.bucket(times[-1], data.clock.base) - data.clock.origin, first + data.clock.window)
    pad = 0.03 * (last - first)
    return (first - pad, last + pad)


def _annotations(ax: Axes, ax2: Axes | None, annotations: dict[str, Any]) -> None:
    if set(annotations) - {"horizontal"}:
        raise Unsupported(f"annotations {sorted(set(annotations) - {'horizontal'})}: the preview draws horizontal ones")
    for a in annotations.get("horizontal", []):
        if set(a) - {"value", "label", "yAxis", "color"}:
            raise Unsupported(f"annotation {a}: the preview draws value, label, yAxis and color")
        target = ax2 if (a.get("yAxis") == "right" and ax2 is not None) else ax
        color = a.get("color", "#d13212")
        target.axhline(float(a["value"]), color=color, linewidth=0.9, linestyle="--")
        target.annotate(
            str(a.get("label", "")),
            (1.0, float(a["value"])),
            xycoords=("axes fraction", "data"),
            xytext=(-2, 2),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=6.5,
            color=color,
        )


def _single_values(canvas: Canvas, box: Box, top: float, lines: list[Line], reason: Reason, metrics: list[str]) -> None:
    cells: list[tuple[str, Series | None]] = [(ln.label, s) for ln in lines for s in ln.series]
    cells = cells or [(ln.label, None) for ln in lines]
    cols = max(1, len(cells))
    cell_w = (box.w - 20) / cols
    for i, (label, series) in enumerate(cells):
        x = box.x + 10 + i * cell_w
        for j, part in enumerate(wrap(label, cell_w - 8, 7.5, 2)):
            canvas.text(x, top + 2 + j * 11, part, fontsize=7.5, color=MUTED, va="top")
        if series is not None and series.points:
            value = series.points[max(series.points)]
            canvas.text(x, top + 30, number(value), fontsize=22, color=INK, va="top")
        else:
            canvas.text(
                x, top + 34, fit(reason(metrics), cell_w - 8, 7.5), fontsize=7.5, color=MUTED, va="top", style="italic"
            )


def draw_alarms(canvas: Canvas, box: Box, props: dict[str, Any], states: list[AlarmState]) -> None:
    top = _frame(canvas, box, str(props.get("title", "Alarms")))
    n = len(states)
    if not n:
        canvas.text(box.x + 12, top, "no alarms", fontsize=8, color=MUTED, va="top")
        return
    room = box.y + box.h - top - 6
    rows = max(1, min(n, int(room // 30)))
    cols = -(-n // rows)
    rows = -(-n // cols)
    cell_w = (box.w - 16) / cols
    cell_h = min(36.0, room / rows)
    for i, state in enumerate(states):
        x = box.x + 8 + (i % cols) * cell_w
        y = top + (i // cols) * cell_h
        color = STATE_COLORS.get(state.state, MUTED)
        canvas.rect(x + 2, y + 2, cell_w - 4, cell_h - 4, facecolor=color, alpha=0.09, edgecolor=color, linewidth=0.8)
        canvas.rect(x + 2, y + 2, 5, cell_h - 4, color=color)
        canvas.text(
            x + 12,
            y + 5,
            fit(state.short_name, cell_w - 20, 7.5, True),
            fontsize=7.5,
            color=INK,
            va="top",
            fontweight="bold",
        )
        if cell_h >= 28:
            detail = state.state.replace("_", " ") + (f": {state.detail}" if state.detail else "")
            canvas.text(x + 12, y + 17, fit(detail, cell_w - 20, 6.5), fontsize=6.5, color=color, va="top")


def columns(names: list[str], cells: list[list[str]], room: float, size: float) -> list[float]:
    """Column widths (px): each its natural width when all fit; else each its header (at least 150 px) first,
    and what is left to the long ones in proportion."""
    natural = [
        min(room * 0.6, max([width(n, size, True)] + [width(row[i], size) for row in cells[:50]])) + 10
        for i, n in enumerate(names)
    ]
    if sum(natural) <= room:
        return [n * room / sum(natural) for n in natural]
    least = [min(n, max(width(h, size, True) + 10, 150.0)) for n, h in zip(natural, names)]
    spare = max(0.0, room - sum(least))
    extra = [n - m for n, m in zip(natural, least)]
    total = sum(extra) or 1.0
    return [m + spare * e / total for m, e in zip(least, extra)]


def filters(query: str) -> list[str]:
    """The query's ``filter`` commands and the log groups it reads: what its lines must be."""
    groups, commands = logsinsights.sources(query)
    where = ", ".join(groups)
    return [f"{where}: {c}" for c in commands if c.lower().startswith("filter ")] or [where]


def draw_logs(canvas: Canvas, box: Box, props: dict[str, Any], data: Data) -> None:
    top = _frame(canvas, box, str(props.get("title", "")))
    query = str(props.get("query", ""))
    groups, _ = logsinsights.sources(query)
    result = logsinsights.run(query, [e for g in groups for e in data.logs.get(g, [])])
    size, step = 6.5, 11.5
    if not result.rows:
        middle = (top + box.y + box.h) / 2
        canvas.text(
            box.x + box.w / 2,
            middle,
            "no log lines of the demo run match this query",
            fontsize=8.5,
            color=MUTED,
            style="italic",
            ha="center",
            va="center",
        )
        # What it looks for, so the reader sees why the demo has none (a GPU fault, say, needs a GPU).
        for n, clause in enumerate(filters(query)[:3]):
            canvas.text(
                box.x + box.w / 2,
                middle + 16 + 12 * n,
                fit(clause, box.w - 24, 7.5),
                fontsize=7.5,
                color=MUTED,
                ha="center",
                va="center",
            )
        return
    cells = [[result.cell(r, c).split("\n")[0] for c in result.columns] for r in result.rows]
    room = box.w - 24
    col_w = columns(result.columns, cells, room, size)
    x_of = [box.x + 12 + sum(col_w[:i]) for i in range(len(col_w))]
    for i, column in enumerate(result.columns):
        canvas.text(
            x_of[i], top, fit(column, col_w[i] - 8, size, True), fontsize=size, fontweight="bold", color=MUTED, va="top"
        )
    rows = max(1, int((box.y + box.h - top - step - 16) // step))
    for j, row in enumerate(cells[:rows]):
        y = top + step * (j + 1) + 2
        for i, cell in enumerate(row):
            canvas.text(x_of[i], y, fit(cell, col_w[i] - 8, size), fontsize=size, color=INK, va="top")
    if len(cells) > rows:
        canvas.text(
            box.x + 12, box.y + box.h - 14, f"{len(cells)} rows; {rows} shown", fontsize=size, color=MUTED, va="top"
        )


# --- the whole dashboard ------------------------------------------------------------------------


def check(body: dict[str, Any], columns: int = GRID_WIDTH) -> None:
    """Refuse, before drawing anything, what the preview does not implement."""
    for n, w in enumerate(body.get("widgets", [])):
        kind, props = w.get("type"), w.get("properties", {})
        where = f"widget {n} ({props.get('title') or kind})"
        if not all(isinstance(w.get(k), int) for k in ("x", "y", "width", "height")):
            raise Unsupported(f"{where}: no x, y, width and height")
        if w["x"] + w["width"] > columns:
            raise Unsupported(f"{where}: wider than the {columns}-column grid")
        allowed = {"text": {"markdown", "background"}, "metric": METRIC_KEYS, "alarm": ALARM_KEYS, "log": LOG_KEYS}
        if kind not in allowed:
            raise Unsupported(f"{where}: widget type {kind!r} is not drawn by the preview")
        if set(props) - allowed[kind]:
            raise Unsupported(f"{where}: properties {sorted(set(props) - allowed[kind])} are not drawn by the preview")
        if kind == "metric":
            if props.get("view", "timeSeries") not in ("timeSeries", "singleValue"):
                raise Unsupported(f"{where}: view {props.get('view')!r} (the preview draws timeSeries, singleValue)")
            if props.get("stacked"):
                raise Unsupported(f"{where}: stacked graphs are not drawn by the preview")
        if kind == "log" and props.get("view", "table") != "table":
            raise Unsupported(f"{where}: log view {props.get('view')!r} (the preview draws tables)")


def draw(
    body: dict[str, Any],
    data: Data,
    alarms: dict[str, dict[str, Any]],
    reason: Reason,
    heading: Iterable[str] = (),
    columns: int = GRID_WIDTH,
    note: Reason | None = None,
) -> Figure:
    """The figure of a dashboard body (``dashboards/triton.json``) over the run's ``data``.

    ``alarms``: alarm definitions by name (PutMetricAlarm's shape, alarms/cli/). ``heading``: lines
    above the grid saying where the data came from. ``columns``: the grid's width (:func:`top`'s is
    narrower). ``note``: a line under a graph's title, from the metrics it reads ("" for none): where
    its values come from when that is not the run itself.
    """
    check(body, columns)
    widgets = body["widgets"]
    rows = max((w["y"] + w["height"] for w in widgets), default=1)
    page = columns * COL_PX
    lines = [
        (line, 12.0 if not i else 9.0)
        for i, text in enumerate(heading)
        for line in wrap(text, page - 16, 12.0 if not i else 9.0, 4, not i)
    ]
    top = 10 + sum(size * PT * 1.4 for _, size in lines) + 6
    height = rows * ROW_PX + top
    fig = plt.figure(figsize=(page / DPI, height / DPI), dpi=DPI, facecolor=PAGE)
    canvas = Canvas(fig, page, height)
    y = 10.0
    for line, size in lines:
        canvas.text(GAP_PX, y, line, fontsize=size, color=INK, va="top", fontweight="bold" if size > 10 else "normal")
        y += size * PT * 1.4
    for w in widgets:
        box, props = Box.of(w, top), w["properties"]
        if w["type"] == "text":
            draw_text(canvas, box, props)
        elif w["type"] == "metric":
            draw_graph(canvas, box, props, data, reason, note(widget_metrics(props)) if note else "")
        elif w["type"] == "alarm":
            names = [str(arn).rsplit(":alarm:", 1)[-1] for arn in props.get("alarms", [])]
            states = []
            for name in names:
                state = evaluate_alarm(name, alarms.get(name), data)
                if state.no_data:
                    why = reason(widget_metrics(alarm_props(alarms[name])))
                    state = dataclasses.replace(state, detail=why.replace("no data in the demo", "no data"))
                states.append(state)
            draw_alarms(canvas, box, props, states)
        else:
            draw_logs(canvas, box, props, data)
    return fig


def first_screen(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The widgets a reader sees first: the graphs, numbers and alarms above the dashboard's second section (its
    first full-width text widget below a widget that is not text); the text widgets above them are left out."""
    out: list[dict[str, Any]] = []
    for w in sorted(body["widgets"], key=lambda w: (w["y"], w["x"])):
        if w["type"] != "text":
            out.append(w)
        elif out and w["width"] >= GRID_WIDTH:
            break
    return out


def top(body: dict[str, Any], gpu_panel: str = TOP_GPU_PANEL, columns: int = TOP_COLUMNS) -> dict[str, Any]:
    """The first screen (:func:`first_screen`) and then the graph whose title starts with ``gpu_panel``,
    re-flowed onto a grid of ``columns``: a widget of the first screen half the dashboard's width or more takes
    a whole row, a narrower one half a row, the GPU graph half a row; each keeps its height."""
    gpu = [
        w
        for w in body["widgets"]
        if w["type"] == "metric" and str(w["properties"].get("title", "")).startswith(gpu_panel)
    ]
    if not gpu:
        raise Unsupported(f"the dashboard has no graph titled {gpu_panel!r}… for its first screen")
    placed: list[dict[str, Any]] = []
    x = y = row = 0
    for w in [*first_screen(body), gpu[0]]:
        span = columns if w["width"] * 2 >= GRID_WIDTH and w is not gpu[0] else columns // 2
        if x + span > columns:
            x, y, row = 0, y + row, 0
        placed.append({**w, "x": x, "y": y, "width": span})
        x, row = x + span, max(row, w["height"])
    return {**body, "widgets": placed}


def save(fig: Figure, path: Path, scale: float = 1.0) -> None:
    """The figure as a PNG; ``scale`` 2 doubles its pixels (sharp where a page shows it at half its size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI * scale, facecolor=fig.get_facecolor(), metadata={"Software": None})
    plt.close(fig)
