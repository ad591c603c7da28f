"""Counter baselines: cumulative counters in, per-window deltas out.

Rules (the awsemf exporter's explicit delta cache, made stricter):
- The first time a series is seen it is a baseline, never a delta.
- A series absent from a scrape (its source failed, the model went away)
  leaves the state: memory stays bounded under model churn, and the next
  sighting is a new baseline (a failed scrape may hide a Triton restart).
- A counter that goes down, or turns NaN/Inf, marks its whole entity (one
  model version, one GPU) as reset for this window: none of that entity's
  deltas are emitted, so an average never mixes pre- and post-restart
  counts, and the next window is normal again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import sub

from .series import LabelSet, Series


@dataclass
class Window:
    """Deltas of one scrape interval. ``elapsed`` is None on the first (baseline) scrape."""

    elapsed: float | None
    deltas: dict[str, Series] = field(default_factory=dict)
    reset_entities: set[str] = field(default_factory=set)


class DeltaState:
    def __init__(self, counters: frozenset[str]) -> None:
        self.counters = counters
        self.prev: dict[str, Series] = {}
        self.prev_time: float | None = None

    def size(self) -> int:
        """Number of series baselines held (the soak test watches this)."""
        return sum(len(s) for s in self.prev.values())

    def update(self, samples: dict[str, Series], labels: dict[str, LabelSet], now: float) -> Window:
        """Advance to a new scrape taken at monotonic time ``now``."""
        elapsed = None if self.prev_time is None else now - self.prev_time
        window = Window(elapsed if elapsed and elapsed > 0 else None)
        current = {name: samples[name] for name in self.counters if name in samples}
        if window.elapsed is not None:
            for name, cur in current.items():
                prev = self.prev.get(name)
                if prev:
                    window.deltas[name] = self._deltas(cur, prev, labels, window.reset_entities)
        if window.reset_entities:
            resets = window.reset_entities
            for name, d in window.deltas.items():
                window.deltas[name] = {k: v for k, v in d.items() if labels[k].entity_key not in resets}
        self.prev = current
        self.prev_time = now
        return window

    @staticmethod
    def _deltas(cur: Series, prev: Series, labels: dict[str, LabelSet], resets: set[str]) -> Series:
        if cur.keys() == prev.keys() and list(cur) == list(prev):
            # Same series in the same order (the normal case): subtract in C.
            d = dict(zip(cur, map(sub, cur.values(), prev.values()), strict=True))
            if d and min(d.values()) >= 0 and not any(map(math.isnan, d.values())) and math.isfinite(sum(d.values())):
                return d
        d = {}
        for key, value in cur.items():
            before = prev.get(key)
            if before is None:
                continue  # new series: baseline
            delta = value - before
            if delta >= 0 and math.isfinite(delta):
                d[key] = delta
            else:
                resets.add(labels[key].entity_key)
        return d
