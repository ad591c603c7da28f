"""A model-sync rollout timeline: one row per host, its events on a time axis, the bake window shaded.

    python -m demo.preview rollout rollout.json [--out docs/rollout-timeline.png]

The JSON accepted (every other key is an error, so a typo cannot drop data silently)::

    {
      "title": "add: canary rollout of build 9f2c",          optional
      "events": [                                             required, at most 10000
        {"host": "ip-10-0-1-12",                              the host's name (1-200 characters);
                                                              optional for "uploaded" only (then the
                                                              upload is a line across every row)
         "time": 12.5,                                        seconds from the start of the rollout, >= 0
         "event": "canary_installed",                         one of EVENTS below
         "detail": "sha256 9f2c..."}                          optional, shown next to verdicts
      ],
      "failed_requests": [                                    optional, at most 100000
        {"host": "ip-10-0-1-12", "time": 30.0, "count": 2}    failed requests on that host counted in the
      ]                                                       interval ending at "time" (count >= 0)
    }

Events: ``uploaded`` (the archive landed in S3), ``canary_installed`` (a canary host installed
it), ``serving_new`` (a host serves the new build), ``bake_started`` (the canary's bake window
opens), ``verdict_promoted`` / ``verdict_rejected`` (the bake's verdict: closes the window),
``rolled_back`` (a host went back to the previous build), ``installed`` (a non-canary host
installed it after promotion). A host's bake window is shaded from its ``bake_started`` to its
next verdict (to the end of the axis while no verdict came). At most 200 hosts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

# event: (label, marker, color)
EVENTS: dict[str, tuple[str, str, str]] = {
    "uploaded": ("uploaded to S3", "|", "#687078"),
    "canary_installed": ("canary installed", "^", "#1f77b4"),
    "serving_new": ("serving the new build", "s", "#2ca02c"),
    "bake_started": ("bake started", "D", "#ff7f0e"),
    "verdict_promoted": ("verdict: promoted", "*", "#1d8102"),
    "verdict_rejected": ("verdict: rejected", "X", "#d13212"),
    "rolled_back": ("rolled back", "<", "#9467bd"),
    "installed": ("installed (after promotion)", "o", "#17becf"),
}
VERDICTS = ("verdict_promoted", "verdict_rejected")
MAX_EVENTS, MAX_COUNTS, MAX_HOSTS, MAX_NAME = 10_000, 100_000, 200, 200
BAKE, FAILED = "#ff7f0e", "#d13212"


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

    def hosts(self) -> list[str]:
        """Canary hosts first, then every host in the order it first appears in time."""
        first: dict[str, float] = {}
        for e in sorted(self.events, key=lambda e: e.time):
            if e.host:
                first.setdefault(e.host, e.time)
        for host, counts in self.failed.items():
            first.setdefault(host, min((t for t, _ in counts), default=math.inf))
        canary = {e.host for e in self.events if e.event == "canary_installed"}
        return sorted(first, key=lambda h: (h not in canary, first[h], h))

    def bake_windows(self, host: str, end: float) -> list[tuple[float, float, str]]:
        """(start, end, verdict event or "") of each bake window of the host."""
        out, start = [], None
        for e in sorted((e for e in self.events if e.host == host), key=lambda e: e.time):
            if e.event == "bake_started" and start is None:
                start = e.time
            elif e.event in VERDICTS and start is not None:
                out.append((start, e.time, e.event))
                start = None
        if start is not None:
            out.append((start, end, ""))
        return out


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
    if extra := set(doc) - {"title", "events", "failed_requests"}:
        raise RolloutError(f"unknown keys {sorted(extra)} (title, events, failed_requests)")
    raw_events, raw_counts = doc.get("events"), doc.get("failed_requests", [])
    if not isinstance(raw_events, list) or not raw_events or len(raw_events) > MAX_EVENTS:
        raise RolloutError(f"events: a list of 1-{MAX_EVENTS} events is required")
    if not isinstance(raw_counts, list) or len(raw_counts) > MAX_COUNTS:
        raise RolloutError(f"failed_requests: a list of at most {MAX_COUNTS} counts")
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
    rollout = Rollout(str(doc.get("title", "Model-sync rollout"))[:MAX_NAME], events, failed)
    if len(rollout.hosts()) > MAX_HOSTS:
        raise RolloutError(f"{len(rollout.hosts())} hosts: at most {MAX_HOSTS}")
    return rollout


def load(path: Path) -> Rollout:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RolloutError(f"{path}: {exc}") from None
    return parse(doc)


def draw(rollout: Rollout) -> Figure:
    hosts = rollout.hosts()
    times = [e.time for e in rollout.events] + [t for c in rollout.failed.values() for t, _ in c]
    end = max(times) * 1.04 + 1.0
    height = 2.0 + 0.55 * max(1, len(hosts))
    fig, ax = plt.subplots(figsize=(12, height), dpi=100)
    fig.subplots_adjust(left=0.16, right=0.97, top=1 - 0.55 / height, bottom=1.15 / height)
    ax.set_title(rollout.title, loc="left", fontsize=11, fontweight="bold", pad=14)
    row = {h: i for i, h in enumerate(hosts)}
    peak = max((n for c in rollout.failed.values() for _, n in c), default=0.0)
    for host, i in row.items():
        ax.axhspan(i - 0.5, i + 0.5, color="#f7f8f8" if i % 2 else "white", zorder=0)
        for start, stop, _ in rollout.bake_windows(host, end):
            ax.add_patch(Rectangle((start, i - 0.4), stop - start, 0.8, color=BAKE, alpha=0.18, zorder=1, linewidth=0))
        counts = sorted(rollout.failed.get(host, []))
        if counts and peak > 0:
            # Rows grow downwards (the first host on top): a bar rises from the row's bottom edge, i + 0.42.
            xs = [t for t, _ in counts]
            ys = [i + 0.42 - 0.38 * n / peak for _, n in counts]
            ax.fill_between(xs, i + 0.42, ys, step="pre", color=FAILED, alpha=0.45, zorder=2, linewidth=0)
            top_t, top_n = max(counts, key=lambda c: c[1])
            if top_n > 0:
                ax.annotate(
                    f"{top_n:g} failed",
                    (top_t, i + 0.42 - 0.38 * top_n / peak),
                    xytext=(2, 1),
                    textcoords="offset points",
                    fontsize=7,
                    color="#d13212",
                )
    for e in sorted(rollout.events, key=lambda e: e.time):
        label, marker, color = EVENTS[e.event]
        if not e.host:
            ax.axvline(e.time, color=color, linestyle="--", linewidth=0.9, zorder=2)
            ax.annotate(
                "uploaded",
                (e.time, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 2),
                textcoords="offset points",
                fontsize=7,
                color=color,
                ha="center",
            )
            continue
        y = row[e.host]
        ax.plot(
            [e.time],
            [y],
            marker=marker,
            color=color,
            markersize=11 if marker == "*" else 7.5,
            zorder=4,
            linestyle="none",
            markeredgecolor="white",
            markeredgewidth=0.6,
        )
        if e.event in VERDICTS or e.event == "rolled_back":
            text = label.removeprefix("verdict: ") + (f" ({e.detail})" if e.detail else "")
            below = e.event == "rolled_back"  # a verdict's label above its marker, a rollback's below: both fit
            ax.annotate(
                text,
                (e.time, y),
                xytext=(6, -7 if below else 6),
                textcoords="offset points",
                fontsize=7.5,
                color=color,
                va="top" if below else "bottom",
            )
    ax.set_yticks(range(len(hosts)), [h if len(h) <= 28 else h[:27] + "…" for h in hosts], fontsize=8)
    ax.set_ylim(len(hosts) - 0.5, -0.5)
    ax.set_xlim(0, end)
    ax.set_xlabel("seconds from the start of the rollout", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#eaeded", linewidth=0.6, zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    present = [k for k in EVENTS if any(e.event == k for e in rollout.events)]
    handles: list[Any] = [
        Line2D(
            [],
            [],
            marker=EVENTS[k][1],
            color=EVENTS[k][2],
            linestyle="--" if k == "uploaded" else "none",
            markersize=7,
            label=EVENTS[k][0],
        )
        for k in present
    ]
    if any(e.event == "bake_started" for e in rollout.events):
        handles.append(Patch(color=BAKE, alpha=0.3, label="bake window"))
    if peak > 0:
        handles.append(Patch(color=FAILED, alpha=0.45, label="failed requests (per interval)"))
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0, -0.45 / (0.55 * max(1, len(hosts)))),  # under the x-axis label, whatever the height
        ncol=min(len(handles), 6),
        fontsize=7.5,
        frameon=False,
        borderaxespad=0.2,
        handletextpad=0.4,
        columnspacing=1.2,
    )
    return fig


def save(fig: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
