"""The Prometheus data model every source fills and every stage reads: label sets, series, an exposition.

Kept apart from the text parser (as client_python keeps ``samples.py`` apart
from its parser) because NVML, the trace window and the tests build
expositions without parsing text. A package of its own so that the layer
test sees it as the node below ``sources``, ``traces`` and the pipeline
(tests/repo/test_layers.py: no cycle between packages). Series are keyed by a canonical string of
their sorted label pairs, so the hot dict operations stay in C and two
spellings of one label block are one series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter


class LabelSet:
    """One series' labels, with what the transform needs precomputed.

    ``key`` is a canonical string of the sorted pairs: series are keyed by
    it everywhere (a str caches its hash, so the hot dict operations stay in
    C), and two spellings of one label block are one series. It is spelt as
    Triton writes a block (``name="value"``, sorted by name but ``le`` and
    ``quantile`` last, escaped), so Triton's blocks are their own keys and the
    parser keeps one string for both (45,000 blocks at 1000 LLM models). ``entity`` says
    what the series describes: ``("model", name, version)``, ``("gpu", uuid)``
    or ``("task",)``.
    """

    __slots__ = ("entity", "entity_key", "key", "labels")

    def __init__(self, pairs: tuple[tuple[str, str], ...] = (), key: str | None = None) -> None:
        """``key``: when the caller knows it (the parser, of a block spelt as its key), it is not built again."""
        self.labels = dict(pairs)
        self.key = _key(pairs) if key is None else key
        model = self.labels.get("model")
        if model is not None:
            version = self.labels.get("version", "")
            self.entity: tuple[str, ...] = ("model", model, version)
            self.entity_key = model_key(model, version)
        elif "gpu_uuid" in self.labels:
            self.entity = ("gpu", self.labels["gpu_uuid"])
            self.entity_key = _key((("gpu_uuid", self.labels["gpu_uuid"]),))
        else:
            self.entity = ("task",)
            self.entity_key = ""

    def share_entity(self, entity: LabelSet) -> None:
        """Take ``entity``'s (the label set of this one's entity) tuple and key instead of equal copies: a
        parser holds tens of thousands of label sets over a few thousand entities."""
        self.entity = entity.entity
        self.entity_key = entity.key

    @classmethod
    def of(cls, **labels: str) -> LabelSet:
        return cls(tuple(sorted(labels.items())))

    def get(self, name: str) -> str | None:
        return self.labels.get(name)

    def __repr__(self) -> str:
        return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items())) + "}"


_LAST = frozenset(("le", "quantile"))  # a histogram's or summary's own label: clients write it last
_name = itemgetter(0)


def _written_order(pair: tuple[str, str]) -> tuple[bool, str]:
    return pair[0] in _LAST, pair[0]


def _key(pairs: tuple[tuple[str, str], ...]) -> str:
    if not _LAST.isdisjoint(map(_name, pairs)):
        pairs = tuple(sorted(pairs, key=_written_order))
    key = ",".join([f'{name}="{value}"' for name, value in pairs])
    if "\\" in key or "\n" in key or key.count('"') != 2 * len(pairs):  # a value to escape (names are identifiers)
        key = ",".join([f'{name}="{_escape(value)}"' for name, value in pairs])
    return key


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def model_key(model: str, version: str) -> str:
    """The entity key of a model version, as series labelled model/version get it."""
    key = f'model="{model}",version="{version}"'  # every label set of a model builds one: kept quick
    if "\\" in key or "\n" in key or key.count('"') != 4:
        return _key((("model", model), ("version", version)))
    return key


EMPTY = LabelSet(())


Series = dict[str, float]
"""Values of one sample name keyed by :attr:`LabelSet.key`."""


@dataclass
class Exposition:
    """Samples of the wanted names: ``samples[name][labelset.key] = value``.

    ``labels`` maps every key used to its :class:`LabelSet`. A repeated
    series keeps its last value and counts as a duplicate.
    """

    samples: dict[str, Series] = field(default_factory=dict)
    labels: dict[str, LabelSet] = field(default_factory=dict)
    malformed: int = 0
    duplicates: int = 0
    examples: list[str] = field(default_factory=list)
    # Every model version (entity key) the samples can name, and maybe more: the parser's label cache
    # keeps model versions seen in earlier bodies. The cardinality cap's cheap first test.
    models: set[str] = field(default_factory=set)

    def count(self) -> int:
        return sum(len(v) for v in self.samples.values())

    def add(self, name: str, labels: LabelSet, value: float) -> None:
        """Add one sample (used by sources that do not parse text, like NVML)."""
        self.labels.setdefault(labels.key, labels)
        self.samples.setdefault(name, {})[labels.key] = value
        if labels.entity[0] == "model":
            self.models.add(labels.entity_key)

    def merge(self, other: Exposition) -> None:
        """Take another source's samples (sources use disjoint series names)."""
        if other.samples:
            # Keys are content-derived, so sharing one table (the parser's) across sources is safe.
            if self.labels:
                self.labels.update(other.labels)
            else:
                self.labels = other.labels
            self.samples.update(other.samples)
        self.malformed += other.malformed
        self.duplicates += other.duplicates
        if other.models:
            self.models = other.models if not self.models else self.models | other.models
        self.examples += other.examples
