"""A model-sync rollout timeline: one row per host, its events on a time axis, the build it serves, the bake
window shaded, its failed requests.

    python -m demo.preview rollout --from-bench docs/rollout-timeline.json     # what bench/bench_rollout.py wrote
    python -m demo.preview rollout rollout.json [--out docs/rollout-timeline.png]

:mod:`.rollout_bench` turns the bench's file into this module's :class:`Rollout`, the one the drawing
reads. The JSON accepted here (every other key is an error, so a typo cannot drop data silently)::

    {
      "title": "add: canary rollout of build 9f2c",          optional
      "events": [                                             required, at most 10000
        {"host": "ip-10-0-1-12",                              the host's name (1-200 characters);
                                                              optional for "uploaded" only (then the
                                                              upload is a line across every row)
         "time": 12.5,                                        seconds from the start of the rollout, >= 0
         "event": "canary_installed",                         one of EVENTS below
         "detail": "sha256 9f2c..."}                          optional, shown next to verdicts and rollbacks
      ],
      "failed_requests": [                                    optional, at most 100000
        {"host": "ip-10-0-1-12", "time": 30.0, "count": 2}    failed requests on that host counted in the
      ],                                                      interval ending at "time" (count >= 0); the
                                                              interval starts at the host's previous count
                                                              (at 0 for its first)
      "requests": [                                           optional, at most 200
        {"host": "ip-10-0-1-12", "count": 1180}               the host's requests over the whole rollout
      ]
    }

Events: ``uploaded`` (the archive landed in S3), ``canary_chosen`` (a host took a canary slot),
``canary_installed`` (a canary host installed it), ``serving_new`` (a host's first answer from the new
build: its row turns from the previous build's grey to the new build's green), ``bake_started`` (the
canary's bake window opens), ``verdict_promoted`` / ``verdict_rejected`` (the rollout's verdict: closes
every bake window), ``rolled_back`` (a host went back to the previous build: its row turns grey again),
``installed`` (a non-canary host installed it after promotion). A host is labelled a canary when it has a
``canary_chosen`` or ``canary_installed`` event. At most 200 hosts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import patheffects
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from .text import fit, width

# event: (label, marker, color); serving_new has no marker: its row's band turns green there
EVENTS: dict[str, tuple[str, str, str]] = {
    "uploaded": ("uploaded to S3", "|", "#687078"),
    "canary_chosen": ("chosen as canary", "v", "#1f77b4"),
    "canary_installed": ("canary installed", "^", "#1f77b4"),
    "serving_new": ("serving the new build", "", "#2ca02c"),
    "bake_started": ("bake started", "D", "#ff7f0e"),
    "verdict_promoted": ("verdict: promoted", "*", "#1d8102"),
    "verdict_rejected": ("verdict: rejected", "X", "#d13212"),
    "rolled_back": ("rolled back", "<", "#9467bd"),
    "installed": ("installed (after promotion)", "o", "#17becf"),
}
CANARY = ("canary_chosen", "canary_installed")
VERDICTS = ("verdict_promoted", "verdict_rejected")
MAX_EVENTS, MAX_COUNTS, MAX_HOSTS, MAX_NAME = 10_000, 100_000, 200, 200
BAKE, FAILED, OLD, NEW = "#ff7f0e", "#d13212", "#c5c9cc", "#2ca02c"
DPI = 100
HALO = [patheffects.withStroke(linewidth=2.5, foreground="white")]  # text stays readable over bars and bands


class RolloutError(ValueError):
    """The rollout file does not follow the schema in this module's docstring."""


@dataclass(frozen=True)
class Event:
    host: str  # "" for an upload not tied to a host
    time: float
    event: str
    detail: str = ""


@dataclass
class Rollout:
    title: str
    events: list[Event]
    failed: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # host -> (time, count)
    requests: dict[str, float] = field(default_factory=dict)  # host -> requests over the rollout

    def canaries(self) -> set[str]:
        return {e.host for e in self.events if e.event in CANARY}

    def hosts(self) -> list[str]:
        """Canary hosts first, then every host in the order it first appears in time."""
        first: dict[str, float] = {}
        for e in sorted(self.events, key=lambda e: e.time):
            if e.host:
                first.setdefault(e.host, e.time)
        for host, counts in self.failed.items():
            first.setdefault(host, min((t for t, n in counts if n > 0), default=math.inf))
        for host in self.requests:
            first.setdefault(host, math.inf)
        canary = self.canaries()
        return sorted(first, key=lambda h: (h not in canary, first[h], h))

    def bake_windows(self, host: str, end: float) -> list[tuple[float, float, str]]:
        """(start, end, verdict event or "") of each bake window of the host: from its ``bake_started`` to the
        rollout's next verdict, whichever host logged it (to ``end`` while none came)."""
        verdicts = sorted((e.time, e.event) for e in self.events if e.event in VERDICTS)
        out, last = [], -math.inf
        for e in sorted((e for e in self.events if e.host == host and e.event == "bake_started"), key=lambda e: e.time):
            if e.time < last:
                continue  # inside the window already drawn
            stop, verdict = next(((t, v) for t, v in verdicts if t >= e.time), (end, ""))
            out.append((e.time, stop, verdict))
            last = stop
        return out

    def serving(self, host: str, end: float) -> list[tuple[float, float]]:
        """(start, end) of each span the host served the new build: from ``serving_new`` to ``rolled_back``."""
        out, start = [], None
        for e in sorted((e for e in self.events if e.host == host), key=lambda e: e.time):
            if e.event == "serving_new" and start is None:
                start = e.time
            elif e.event == "rolled_back" and start is not None:
                out.append((start, e.time))
                start = None
        if start is not None:
            out.append((start, end))
        return out

    def failed_total(self, host: str) -> float:
        return sum(n for _, n in self.failed.get(host, []))

    def end(self) -> float:
        return max([e.time for e in self.events] + [t for c in self.failed.values() for t, _ in c])


def _number(value: Any, where: str, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < minimum:
        raise RolloutError(f"{where}: {value!r} is not a number >= {minimum:g}")
    return float(value)


def _host(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME:
        raise RolloutError(f"{where}: host {value!r} is not a name of 1-{MAX_NAME} characters")
    return value


def parse(doc: Any) -> Rollout:
    """The rollout in ``doc`` (the parsed JSON), checked against the schema."""
    if not isinstance(doc, dict):
        raise RolloutError("the file holds no JSON object")
    if extra := set(doc) - {"title", "events", "failed_requests", "requests"}:
        raise RolloutError(f"unknown keys {sorted(extra)} (title, events, failed_requests, requests)")
    raw_events, raw_counts, raw_requests = doc.get("events"), doc.get("failed_requests", []), doc.get("requests", [])
    if not isinstance(raw_events, list) or not raw_events or len(raw_events) > MAX_EVENTS:
        raise RolloutError(f"events: a list of 1-{MAX_EVENTS} events is required")
    if not isinstance(raw_counts, list) or len(raw_counts) > MAX_COUNTS:
        raise RolloutError(f"failed_requests: a list of at most {MAX_COUNTS} counts")
    if not isinstance(raw_requests, list) or len(raw_requests) > MAX_HOSTS:
        raise RolloutError(f"requests: a list of at most {MAX_HOSTS} counts")
    events = []
    for n, e in enumerate(raw_events):
        where = f"events[{n}]"
        if not isinstance(e, dict) or set(e) - {"host", "time", "event", "detail"}:
            raise RolloutError(f"{where}: an object of host, time, event and detail is expected, got {e!r}")
        if e.get("event") not in EVENTS:
            raise RolloutError(f"{where}: event {e.get('event')!r} is not one of {', '.join(EVENTS)}")
        host = "" if e["event"] == "uploaded" and "host" not in e else _host(e.get("host"), where)
        detail = e.get("detail", "")
        if not isinstance(detail, str):
            raise RolloutError(f"{where}: detail {detail!r} is not a string")
        events.append(Event(host, _number(e.get("time"), f"{where}.time"), e["event"], detail[:MAX_NAME]))
    failed: dict[str, list[tuple[float, float]]] = {}
    for n, c in enumerate(raw_counts):
        where = f"failed_requests[{n}]"
        if not isinstance(c, dict) or set(c) != {"host", "time", "count"}:
            raise RolloutError(f"{where}: an object of host, time and count is expected, got {c!r}")
        host = _host(c["host"], where)
        failed.setdefault(host, []).append((_number(c["time"], f"{where}.time"), _number(c["count"], f"{where}.count")))
    requests: dict[str, float] = {}
    for n, c in enumerate(raw_requests):
        where = f"requests[{n}]"
        if not isinstance(c, dict) or set(c) != {"host", "count"}:
            raise RolloutError(f"{where}: an object of host and count is expected, got {c!r}")
        host = _host(c["host"], where)
        if host in requests:
            raise RolloutError(f"{where}: host {host!r} is counted twice")
        requests[host] = _number(c["count"], f"{where}.count")
    rollout = Rollout(str(doc.get("title", "Model-sync rollout"))[:MAX_NAME], events, failed, requests)
    if len(rollout.hosts()) > MAX_HOSTS:
        raise RolloutError(f"{len(rollout.hosts())} hosts: at most {MAX_HOSTS}")
    return rollout


def load(path: Path) -> Rollout:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RolloutError(f"{path}: {exc}") from None
    return parse(doc)


# Layout, in inches: the figure is WIDTH wide; host names on the left, each host's totals on the right. A row is
# ROW high, taller where it has labels above its band (verdicts, rollbacks) or failed requests below it.
WIDTH, LEFT, RIGHT, ROW, TITLE, AXIS, GAP, LEGEND_ROW, HEAD_LINE = 12.0, 1.75, 1.45, 0.5, 0.42, 0.32, 0.22, 0.24, 0.19
LABEL, NOTE, LINE = 8.0, 7.5, 10.0  # points: host names, labels, one label line
LABELLED = (*VERDICTS, "rolled_back")


@dataclass(frozen=True)
class Row:
    host: str
    center: float  # in rows of ROW inches, from the panel's top
    up: float  # room above the band, in rows
    down: float  # room below it


def _rows(rollout: Rollout) -> list[Row]:
    out, y = [], 0.0
    for host in rollout.hosts():
        labels = sum(1 for e in rollout.events if e.host == host and e.event in LABELLED)
        up = max(0.5, (7 + LINE * labels) / (ROW * 72) + 0.1)
        down = 0.75 if any(n > 0 for _, n in rollout.failed.get(host, [])) else 0.5
        out.append(Row(host, y + up, up, down))
        y += up + down
    return out


def _wrap(text: str, room: float, size: float) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and width(f"{line} {word}", size) > room:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return [*lines, line] if line else lines


def _annotate(ax: Axes, text: str, xy: tuple[float, float], **kw: Any) -> None:
    ax.annotate(text, xy, textcoords="offset points", fontsize=NOTE, path_effects=HALO, **kw)


def _panel(ax: Axes, rollout: Rollout, rows: list[Row], end: float, peak: float, last: bool) -> None:
    canaries, plot = rollout.canaries(), (WIDTH - LEFT - RIGHT) * DPI
    ax.set_title(
        fit(rollout.title, (WIDTH - LEFT - 0.2) * DPI, 10.5, True), loc="left", fontsize=10.5, fontweight="bold", pad=12
    )
    totals = bool(rollout.failed or rollout.requests)
    for k, r in enumerate(rows):
        top, bottom = r.center - r.up, r.center + r.down
        ax.axhspan(top, bottom, color="#f7f8f8" if k % 2 else "white", zorder=0)
        ax.add_patch(Rectangle((0, r.center - 0.07), end, 0.14, color=OLD, zorder=2, linewidth=0))
        for start, stop in rollout.serving(r.host, end):
            ax.add_patch(Rectangle((start, r.center - 0.07), stop - start, 0.14, color=NEW, zorder=2, linewidth=0))
        for start, stop, _ in rollout.bake_windows(r.host, end):
            ax.add_patch(
                Rectangle(
                    (start, top + 0.08),
                    stop - start,
                    bottom - top - 0.16,
                    color=BAKE,
                    alpha=0.16,
                    zorder=1,
                    linewidth=0,
                )
            )
        counts = sorted(rollout.failed.get(r.host, []))
        if counts and peak > 0:
            # Rows grow downwards: a bar rises from the row's bottom edge to just under the band at the peak; each
            # count covers the interval from the previous count's time (0 for the first) to its own.
            base, high = bottom - 0.05, r.down - 0.17
            xs, ys = [0.0] + [t for t, _ in counts], [base] + [base - high * n / peak for _, n in counts]
            ax.fill_between(xs, base, ys, step="pre", color=FAILED, alpha=0.5, zorder=3, linewidth=0)
        if totals:
            failed, requests = rollout.failed_total(r.host), rollout.requests.get(r.host)
            text = f"{failed:,.0f}" + (f" of {requests:,.0f}" if requests is not None else "")
            ax.annotate(
                fit(text, (RIGHT - 0.1) * DPI, NOTE),
                (1.0, r.center),
                xycoords=("axes fraction", "data"),
                xytext=(6, 0),
                textcoords="offset points",
                fontsize=NOTE,
                va="center",
                color=FAILED if failed else "#545b64",
                fontweight="bold" if failed else "normal",
            )
    if totals:
        heading = "failed of all requests" if rollout.requests else "failed requests"
        ax.annotate(
            heading,
            (1.0, 1.0),
            xycoords="axes fraction",
            xytext=(6, 2),
            textcoords="offset points",
            fontsize=NOTE,
            color="#545b64",
            va="bottom",
        )
    at = {r.host: r for r in rows}
    line = dict.fromkeys(at, 0)  # the labels above each row's band, one line each, in time order
    for e in sorted(rollout.events, key=lambda e: e.time):
        label, marker, color = EVENTS[e.event]
        if not e.host:
            ax.axvline(e.time, color=color, linestyle="--", linewidth=0.9, zorder=2)
            _annotate(
                ax,
                "uploaded",
                (e.time, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 2),
                color=color,
                ha="center",
            )
            continue
        if not marker:
            continue  # serving_new: the row's band turns green
        y = at[e.host].center
        ax.plot(
            [e.time],
            [y],
            marker=marker,
            color=color,
            markersize=12 if marker == "*" else 7.5,
            zorder=5,
            linestyle="none",
            markeredgecolor="white",
            markeredgewidth=0.6,
        )
        if e.event in VERDICTS:  # the verdict across every row: what the other hosts did after it
            ax.axvline(e.time, color=color, linestyle=":", linewidth=1.0, alpha=0.7, zorder=1)
        if e.event in LABELLED:
            text = f"{label.removeprefix('verdict: ')} at {e.time:.1f} s" + (f": {e.detail}" if e.detail else "")
            left = e.time > 0.55 * end  # late on the axis: the label runs leftwards, inside the panel
            room = (e.time / end if left else 1 - e.time / end) * plot - 12
            _annotate(
                ax,
                fit(text, room, NOTE),
                (e.time, y),
                xytext=(-7 if left else 7, 6 + LINE * line[e.host]),
                color=color,
                ha="right" if left else "left",
                va="bottom",
                zorder=6,
            )
            line[e.host] += 1
    ax.set_yticks([r.center for r in rows], [_row_label(r.host, r.host in canaries) for r in rows], fontsize=LABEL)
    ax.set_ylim(rows[-1].center + rows[-1].down if rows else 1.0, 0)
    ax.set_xlim(-0.01 * end, end)
    if last:
        ax.set_xlabel("seconds from the upload", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#eaeded", linewidth=0.6, zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _row_label(host: str, canary: bool) -> str:
    return fit(host + ("  (canary)" if canary else ""), (LEFT - 0.15) * DPI, LABEL)


def _intervals(counts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, end) of each count's interval: from the previous count's time (0 for the first) to its own."""
    times = sorted(t for t, _ in counts)
    return list(zip([0.0, *times[:-1]], times, strict=True))


def _legend(rollouts: Sequence[Rollout], peak: float) -> list[Any]:
    kinds = {e.event for r in rollouts for e in r.events}
    handles: list[Any] = [Patch(color=OLD, label="serving the previous build")]
    if "serving_new" in kinds:
        handles.append(Patch(color=NEW, label="serving the new build"))
    if "bake_started" in kinds:
        handles.append(Patch(color=BAKE, alpha=0.3, label="bake window (to the verdict)"))
    if peak > 0:
        steps = {round(t - before, 6) for r in rollouts for c in r.failed.values() for before, t in _intervals(c)}
        per = f"per {steps.pop():g} s" if len(steps) == 1 else "per interval"
        handles.append(Patch(color=FAILED, alpha=0.5, label=f"failed requests {per} (tallest bar: {peak:,.0f})"))
    for k, (label, marker, color) in EVENTS.items():
        if k in kinds and marker:
            handles.append(
                Line2D(
                    [],
                    [],
                    marker=marker,
                    color=color,
                    linestyle="--" if k == "uploaded" else "none",
                    markersize=7,
                    label=label,
                )
            )
    return handles


def draw(*rollouts: Rollout, heading: Sequence[str] = ()) -> Figure:
    """One panel per rollout, on one time axis (so they compare), ``heading`` paragraphs above, one legend below."""
    if not rollouts:
        raise RolloutError("nothing to draw")
    end = max(r.end() for r in rollouts) * 1.03 + 1.0
    peak = max((n for r in rollouts for c in r.failed.values() for _, n in c), default=0.0)
    head = [line for text in heading for line in _wrap(text, (WIDTH - 0.5) * DPI, 8.5)]
    handles, ncol = _legend(rollouts, peak), 4
    legend = LEGEND_ROW * math.ceil(len(handles) / ncol) + 0.15
    panels = [_rows(r) for r in rollouts]
    sizes = [ROW * (rows[-1].center + rows[-1].down) for rows in panels]
    top = 0.2 + HEAD_LINE * len(head) + (0.1 if head else 0)
    height = top + sum(TITLE + h + AXIS for h in sizes) + GAP * (len(sizes) - 1) + 0.2 + legend
    fig = plt.figure(figsize=(WIDTH, height), dpi=DPI)
    for k, line in enumerate(head):
        fig.text(
            0.25 / WIDTH,
            1 - (0.2 + HEAD_LINE * (k + 0.5)) / height,
            line,
            fontsize=8.5,
            va="center",
            color="#16191f" if k == 0 else "#545b64",
            fontweight="bold" if k == 0 else "normal",
        )
    y = top
    for k, (r, rows, h) in enumerate(zip(rollouts, panels, sizes, strict=True)):
        y += TITLE
        ax = fig.add_axes((LEFT / WIDTH, 1 - (y + h) / height, (WIDTH - LEFT - RIGHT) / WIDTH, h / height))
        _panel(ax, r, rows, end, peak, last=k == len(rollouts) - 1)
        y += h + AXIS + GAP
    fig.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(LEFT / WIDTH, 0.1 / height),
        ncol=ncol,
        fontsize=NOTE,
        frameon=False,
        borderaxespad=0,
        handletextpad=0.5,
        columnspacing=1.5,
    )
    return fig


def save(fig: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
