"""Per-phase latency and the slowest requests, kept between two scrapes of the relay's source.

Each phase of each model version is a cumulative histogram, exactly like
one Triton publishes, so the catalog's ``distribution`` kind turns its
bucket deltas into one CloudWatch distribution per window: p99 queue time
across every task is then one statistic (Triton's own summaries cannot be
combined across tasks). Buckets are the R5 series (1, 1.6, 2.5, 4, 6.3 per
decade) from 10 us to 100 s: a value is known within its bucket, about
+-23 %, and CloudWatch receives the bucket's midpoint.

The slowest requests of each model version in the window (by the model's
whole server time) are kept with their trace and span ids: they become
properties of the model's EMF event and one log line each, so a p99 spike
leads to its traces.

Only model versions Triton's repository index lists are measured (``listed``;
anyone in the task can post spans naming models that do not exist), at most
``MAX_MODELS`` of them; the spans of others are counted, never kept. Spans
that came before the index was first read are checked when the window is
taken. Whatever goes wrong inside the window, taking it resets it: one
window's measurements may be lost, never every later one.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from telemetry.logs import get

from ..series import Exposition, LabelSet, model_key
from .spans import PHASES, ModelRequest

log = get("traces")

BOUNDS_MS = (*(round(m * 10.0**e, 6) for e in range(-2, 5) for m in (1.0, 1.6, 2.5, 4.0, 6.3)), 100_000.0)
LE = (*(f"{b:g}" for b in BOUNDS_MS), "+Inf")
SLOWEST_PER_MODEL = 3
MAX_MODELS = 2_000  # model versions tracked; more are counted, not kept (the pipeline caps what it emits anyway)

Listed = frozenset[tuple[str, str]] | None  # (model, version) the repository index lists; None: not read yet


def family(phase: str) -> str:
    """The histogram family of a phase, as the catalog names it."""
    return f"triton_trace_{phase}_ms"


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS_MS) + 1))
    total: float = 0.0
    n: int = 0
    # The pipeline takes a series it sees for the first time as its baseline, so a new histogram is first
    # shown at zero and its observations one scrape later: late for a new model, but none lost.
    shown: bool = False

    def observe(self, ms: float) -> None:
        i = 0
        while i < len(BOUNDS_MS) and ms > BOUNDS_MS[i]:
            i += 1
        self.counts[i] += 1
        self.total += ms
        self.n += 1


@dataclass
class PhaseWindow:
    """Thread-safe: the relay's worker records, the pipeline's scrape takes."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    histograms: dict[tuple[str, str, str], _Histogram] = field(default_factory=dict)
    # per model version: (request ms, arrival, request), a min-heap of the slowest; arrival breaks ties
    slowest: dict[tuple[str, str], list[tuple[float, int, ModelRequest]]] = field(default_factory=dict)
    unchecked: dict[tuple[str, str], int] = field(default_factory=dict)  # recorded before the index was read
    unknown_model: int = 0  # model spans of versions the index does not list: counted, not measured
    models_over_limit: int = 0  # model spans beyond MAX_MODELS versions: counted, not measured
    failures: int = 0  # times the window's state was reset after an exception
    _arrival: itertools.count[int] = field(default_factory=itertools.count)

    def record(self, requests: Iterable[ModelRequest], listed: Listed = None) -> None:
        with self.lock:
            try:
                self._record(requests, listed)
            except Exception:
                self._reset()
                raise

    def _record(self, requests: Iterable[ModelRequest], listed: Listed) -> None:
        for r in requests:
            key = (r.model, r.version)
            if listed is not None and key not in listed:
                self.unknown_model += 1
                continue
            if key not in self.slowest:
                if len(self.slowest) >= MAX_MODELS:
                    self.models_over_limit += 1
                    continue
                self.slowest[key] = []
            if listed is None:
                self.unchecked[key] = self.unchecked.get(key, 0) + 1
            for phase, ms in r.phases.items():
                h = self.histograms.get((r.model, r.version, phase))
                if h is None:
                    h = self.histograms[(r.model, r.version, phase)] = _Histogram()
                h.observe(ms)
            total = r.phases.get("request")
            if total is None:
                continue
            heap = self.slowest[key]
            item = (total, next(self._arrival), r)
            if len(heap) < SLOWEST_PER_MODEL:
                heapq.heappush(heap, item)
            elif item[0] > heap[0][0]:
                heapq.heapreplace(heap, item)

    def take(self, listed: Listed = None) -> tuple[Exposition, dict[str, list[ModelRequest]]]:
        """The cumulative histograms as series, and the window's slowest requests by model entity key (reset).

        Never raises: an exception resets the window (logged with its traceback), and the next scrape
        measures again."""
        with self.lock:
            try:
                return self._take(listed)
            except Exception:
                self.failures += 1
                self._reset()
                log.error("the trace window failed and was reset; its measurements are lost", exc_info=True)
                return Exposition(), {}

    def _take(self, listed: Listed) -> tuple[Exposition, dict[str, list[ModelRequest]]]:
        if listed is not None:
            self._forget_unlisted(listed)
        out = Exposition()
        for (model, version, phase), h in self.histograms.items():
            name = family(phase)
            cumulative = 0
            for le, count in zip(LE, h.counts):
                cumulative += count if h.shown else 0
                out.add(f"{name}_bucket", LabelSet.of(model=model, version=version, le=le), float(cumulative))
            labels = LabelSet.of(model=model, version=version)
            out.add(f"{name}_sum", labels, h.total if h.shown else 0.0)
            out.add(f"{name}_count", labels, float(h.n if h.shown else 0))
            h.shown = True
        slowest = {
            model_key(model, version): [r for _, _, r in sorted(heap, key=lambda item: item[:2], reverse=True)]
            for (model, version), heap in self.slowest.items()
            if heap
        }
        for heap in self.slowest.values():
            heap.clear()
        return out, slowest

    def _forget_unlisted(self, listed: frozenset[tuple[str, str]]) -> None:
        """Drop what was kept of versions the index does not list; the spans never checked are counted now."""
        for key in [k for k in self.slowest if k not in listed]:
            del self.slowest[key]
            self.unknown_model += self.unchecked.get(key, 0)
        for hkey in [k for k in self.histograms if (k[0], k[1]) not in listed]:
            del self.histograms[hkey]
        self.unchecked.clear()

    def _reset(self) -> None:
        self.histograms = {}
        self.slowest = {}
        self.unchecked = {}


__all__ = ["BOUNDS_MS", "LE", "PHASES", "Listed", "PhaseWindow", "family"]
