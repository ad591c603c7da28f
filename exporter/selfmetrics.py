"""The values the exporter knows itself: its own bookkeeping and the repository index's model states.

These are the catalog's ``self`` and ``state`` metrics (the catalog's
loader lists their names and refuses others of those kinds); the transform
copies them from here instead of computing them from series.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .sources import SourceKind, VersionState
from .transform import Column


@dataclass
class SourceStatus:
    name: str
    kind: SourceKind
    up: bool
    duration_ms: float
    error: str = ""


@dataclass
class Bookkeeping:
    """What one cycle counted about itself."""

    scrape_ms: float
    series_kept: int
    series_dropped: int
    parse_errors: int
    duplicates: int
    resets: int
    events_dropped: int


def exporter_values(book: Bookkeeping, statuses: Sequence[SourceStatus]) -> dict[str, Column]:
    """The ``self`` metrics; EventsOversize is filled in once the cycle's events are encoded."""
    triton = [s for s in statuses if s.kind is SourceKind.TRITON]
    task: dict[str, float] = {
        "TritonUp": 1.0 if triton and all(s.up for s in triton) else 0.0,
        "ScrapeDuration": book.scrape_ms,
        "SeriesKept": float(book.series_kept),
        "SeriesDropped": float(book.series_dropped),
        "ParseErrors": float(book.parse_errors),
        "DuplicateSeries": float(book.duplicates),
        "CounterResets": float(book.resets),
        "EventsDropped": float(book.events_dropped),
        "EventsOversize": 0.0,
        "ExporterHeartbeat": 1.0,
    }
    given: dict[str, Column] = {name: {"": value} for name, value in task.items()}
    given["SourceUp"] = {s.name: 1.0 if s.up else 0.0 for s in statuses}
    given["SourceDuration"] = {s.name: s.duration_ms for s in statuses}
    return given


def index_values(index: list[VersionState] | None, index_keys: dict[str, VersionState]) -> dict[str, Column]:
    """The ``state`` metrics, from the repository index (nothing when the index did not answer)."""
    if index is None:
        return {}
    counted = [v for v in index if not v.unloaded_on_purpose]
    ready = sum(v.state == "READY" for v in counted)
    failed = sum(v.state == "UNAVAILABLE" for v in counted)
    given: dict[str, Column] = {
        "ModelsReady": {"": float(ready)},
        "ModelsNotReady": {"": float(len(counted) - ready)},
        "ModelReady": {
            k: 1.0 if v.state == "READY" else 0.0 for k, v in index_keys.items() if not v.unloaded_on_purpose
        },
    }
    if ready + failed:
        given["ModelLoadSuccessRate"] = {"": 100.0 * ready / (ready + failed)}
    return given
