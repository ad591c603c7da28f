"""The model cardinality cap (``--max-models``): the EMF bill stays bounded whatever Triton loads.

Versions already being emitted keep their place; new ones fill free places
in name order, so a model does not flicker in and out as others come and go.
Dropped versions are counted (``SeriesDropped``) and logged by the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from .promtext import Exposition, LabelSet, Series, model_key
from .sources import VersionState


@dataclass
class Capped:
    samples: dict[str, Series]
    index: list[VersionState] | None
    dropped_series: int = 0
    dropped_models: int = 0


class ModelCap:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.allowed: set[str] = set()
        # sample -> (its series keys last cycle, their model entities): Triton prints the same series
        # cycle after cycle, and comparing key sets is a C-level loop where mapping keys is a Python one.
        self._entities: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    def entities(self, exp: Exposition) -> set[str]:
        """Every model version (entity key) with a series in the exposition."""
        labels = exp.labels
        out: set[str] = set()
        seen: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        for name, series in exp.samples.items():
            cached = self._entities.get(name)
            if cached is None or cached[0] != series.keys():
                keys = frozenset(series)
                cached = (keys, frozenset(labels[k].entity_key for k in keys if labels[k].entity[0] == "model"))
            seen[name] = cached
            out |= cached[1]
        self._entities = seen  # vanished samples leave the cache
        return out

    def apply(self, exp: Exposition, index: list[VersionState] | None,
              index_keys: dict[str, VersionState]) -> Capped:
        """The samples and index rows of the model versions within the cap."""
        labels = exp.labels
        entities = self.entities(exp) | index_keys.keys()
        if len(entities) <= self.limit:
            self.allowed.clear()
            return Capped(exp.samples, index)
        keep = {e for e in self.allowed if e in entities}
        for e in sorted(entities - keep, key=lambda k: _sort_key(k, labels, index_keys)):
            if len(keep) >= self.limit:
                break
            keep.add(e)
        self.allowed = keep
        dropped_series = 0
        samples: dict[str, Series] = {}
        for name, series in exp.samples.items():
            kept = {k: v for k, v in series.items()
                    if labels[k].entity[0] != "model" or labels[k].entity_key in keep}
            dropped_series += len(series) - len(kept)
            samples[name] = kept
        if index is not None:
            index = [v for v in index if model_key(v.model, v.version) in keep]
        return Capped(samples, index, dropped_series, len(entities) - len(keep))


def _sort_key(key: str, labels: dict[str, LabelSet], index_keys: dict[str, VersionState]) -> tuple[str, str]:
    ls = labels.get(key)
    if ls is not None:
        return ls.entity[1], ls.entity[2]
    v = index_keys[key]
    return v.model, v.version
