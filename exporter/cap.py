"""The model cardinality cap (``--max-models``): the EMF bill stays bounded whatever Triton loads.

Versions already being emitted keep their place; new ones fill free places
in name order, so a model does not flicker in and out as others come and go.
Dropped versions are counted (``SeriesDropped``) and logged by the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from .series import Exposition, LabelSet, Series, model_key
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

    def apply(self, exp: Exposition, index: list[VersionState] | None, index_keys: dict[str, VersionState]) -> Capped:
        """The samples and index rows of the model versions within the cap."""
        if len(exp.models) <= self.limit and len(exp.models | index_keys.keys()) <= self.limit:
            self.allowed.clear()  # cannot be over the cap (exp.models is a superset): no need to count
            return Capped(exp.samples, index)
        labels = exp.labels
        entities = {labels[k].entity_key for s in exp.samples.values() for k in s if labels[k].entity[0] == "model"}
        entities |= index_keys.keys()
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
            kept = {k: v for k, v in series.items() if labels[k].entity[0] != "model" or labels[k].entity_key in keep}
            dropped_series += len(series) - len(kept)
            samples[name] = kept
        if index is not None:
            index = [v for v in index if model_key(v.model, v.version) in keep]
        return Capped(samples, index, dropped_series, len(entities) - len(keep))

    def keep(self, exp: Exposition) -> dict[str, Series]:
        """The samples within the cap, choosing as :meth:`apply` would but remembering nothing.

        For the scrapes between full cycles (fast metrics), which see no repository index: the versions the
        last full cycle kept keep their places, so the fast and the full events name the same versions, and
        a scrape between full cycles never emits more than ``limit`` of them either.
        """
        if len(exp.models) <= self.limit:
            return exp.samples
        labels = exp.labels
        entities = {labels[k].entity_key for s in exp.samples.values() for k in s if labels[k].entity[0] == "model"}
        if len(entities) <= self.limit:
            return exp.samples
        keep = {e for e in self.allowed if e in entities}
        for e in sorted(entities - keep, key=lambda k: _sort_key(k, labels, {})):
            if len(keep) >= self.limit:
                break
            keep.add(e)
        return {
            name: {k: v for k, v in series.items() if labels[k].entity[0] != "model" or labels[k].entity_key in keep}
            for name, series in exp.samples.items()
        }


def _sort_key(key: str, labels: dict[str, LabelSet], index_keys: dict[str, VersionState]) -> tuple[str, str]:
    ls = labels.get(key)
    if ls is not None:
        return ls.entity[1], ls.entity[2]
    v = index_keys[key]
    return v.model, v.version
