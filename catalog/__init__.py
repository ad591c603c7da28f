"""The metric catalog: every series the exporter can emit, defined once, as data.

Definitions live in TOML files with one schema (docs/metrics.md): the
built-in Triton core pack (``core.toml``: Triton's own families, NVML, the
exporter's own metrics), the built-in LLM pack (``llm.toml``: vLLM and
TensorRT-LLM backend families), and any file the user passes with
``--catalog``. :func:`build` reads and validates them once at start; the
resulting :class:`Catalog` is passed to everything that needs it (the
/metrics reader, the delta state, the transform, the EMF encoder, render,
cost, docs). Nothing derived from a catalog lives at module level.

Model sync's metrics are a pack of their own (``modelsync.toml``, scope
``modelsync``, kind ``supplied``), read with :func:`modelsync_catalog`: the
model-sync daemon encodes its events from it and render, docs and ``cost``
derive from it. It is never part of the exporter's catalog (:func:`build`
refuses a ``modelsync`` metric there), so the exporter does not emit them.

A metric is computed from *series*: samples a source produced, keyed by
name and labels. Triton's series keep their Prometheus names
(``nv_inference_count``, ``vllm:prompt_tokens_total``); the NVML source
names its series ``nvml_*`` in SI units. Where two families can supply one
quantity (Triton's DCGM ``nv_gpu_utilization`` and NVML; vLLM's and
Triton's time to first token), a metric lists both inputs and the first one
present for an entity wins, so one GPU or model is one line on a dashboard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

from telemetry.emf import CLOUDWATCH_UNITS, MAX_METRIC_NAME_LENGTH

from .load import CatalogError, read, read_paths
from .model import (
    BASE_DIMENSIONS,
    COUNTER_KINDS,
    EVENT_KEYS,
    HISTOGRAM_KINDS,
    Combine,
    Dimension,
    Family,
    Input,
    Kind,
    Metric,
    Scope,
)

__all__ = [
    "BASE_DIMENSIONS", "BUILTIN_PACKS", "CLOUDWATCH_UNITS", "COUNTER_KINDS", "EVENT_KEYS", "HISTOGRAM_KINDS",
    "MAX_METRIC_NAME_LENGTH", "MODELSYNC_PACK",
    "Catalog", "CatalogError", "Combine", "Dimension", "Family", "Input", "Kind", "Metric",
    "Scope", "build", "modelsync_catalog", "parse_selection",
]  # fmt: skip

BUILTIN_PACKS = ("core", "llm", "traces")
MODELSYNC_PACK = "modelsync"
"""Model sync's metrics: read on its own (:func:`modelsync_catalog`), never with the exporter's packs."""


class Catalog:
    """The validated definitions, and the selection of them that is emitted.

    ``metrics`` is what the exporter emits (every definition, minus what the
    ``--metrics`` selection leaves out), in definition order. ``computed``
    adds the totals that selected breakdowns need to decide whether a zero
    carries information.
    """

    def __init__(
        self,
        definitions: Sequence[Metric],
        families: Mapping[str, Family],
        selected: Iterable[str] | None = None,
        files: Sequence[str] = (),
        selection: str = "",
        dimensions: Mapping[str, Dimension] | None = None,
    ) -> None:
        self.defined: tuple[Metric, ...] = tuple(definitions)
        self.families: Mapping[str, Family] = dict(families)
        self.dimensions: Mapping[str, Dimension] = dict(dimensions or {})
        self.files = tuple(files)
        self.selection = selection
        keep = None if selected is None else set(selected)
        self.metrics: tuple[Metric, ...] = tuple(m for m in self.defined if keep is None or m.name in keep)
        self._definitions = {m.name: m for m in self.defined}
        self._selected = {m.name: m for m in self.metrics}
        needed = {m.breakdown_of for m in self.metrics if m.breakdown_of}
        self.computed: tuple[Metric, ...] = tuple(
            m for m in self.defined if m.name in self._selected or m.name in needed
        )

    def get(self, name: str) -> Metric | None:
        """The metric if it is emitted (defined and selected)."""
        return self._selected.get(name)

    def emits(self, name: str) -> bool:
        return name in self._selected

    def definition(self, name: str) -> Metric | None:
        """The definition, selected or not."""
        return self._definitions.get(name)

    def select(self, selection: str) -> Catalog:
        """The same definitions with another ``--metrics`` selection."""
        chosen = parse_selection(selection, [m.name for m in self.defined]) if selection.strip() else None
        return Catalog(self.defined, self.families, chosen, self.files, selection, self.dimensions)

    def wanted_samples(self, source: str = "triton") -> frozenset[str]:
        """Sample names the /metrics reader must keep (everything else is skipped unread)."""
        out: set[str] = set()
        for m in self.computed:
            for i in m.all_inputs():
                if self.families[i.family].source == source:
                    out.update(_samples_read(m, i))
        return frozenset(out)

    def sample_selects(self, source: str = "triton") -> dict[str, tuple[str, frozenset[str]]]:
        """Wanted samples of which only some values of one label are read: sample -> (label, values).

        Every reader of ``nv_inference_request_summary_us`` selects one ``quantile`` (0.5, 0.95, 0.99), so the
        other two quantiles Triton prints need not be kept: at 1000 models that is 2,000 series per summary
        the parser neither stores nor interns labels for (bench/bench_pipeline.py). A sample that any metric
        reads whole, or through two different labels, is not listed.
        """
        found: dict[str, set[tuple[str, str] | None]] = {}
        for m in self.computed:
            for i in m.all_inputs():
                if self.families[i.family].source == source:
                    for sample in _samples_read(m, i):
                        found.setdefault(sample, set()).add(i.where)
        out: dict[str, tuple[str, frozenset[str]]] = {}
        for sample, wheres in found.items():
            labels = {w[0] for w in wheres if w is not None}
            if None not in wheres and len(labels) == 1:
                out[sample] = (labels.pop(), frozenset(w[1] for w in wheres if w is not None))
        return out

    def counter_samples(self) -> frozenset[str]:
        """Samples whose values are cumulative and go through the delta state."""
        out: set[str] = set()
        for m in self.computed:
            if m.kind in COUNTER_KINDS:
                for i in (*m.inputs, *m.denominators):
                    out.update(_samples_read(m, i))
            if m.guard is not None:
                out.add(m.guard.sample)
        return frozenset(out)


def _samples_read(metric: Metric, inp: Input) -> tuple[str, ...]:
    if metric.kind in HISTOGRAM_KINDS:
        return (f"{inp.sample}_bucket", f"{inp.sample}_sum")
    return (inp.sample,)


def builtin_files(packs: Sequence[str] = BUILTIN_PACKS) -> list[tuple[str, str]]:
    # The packs sit next to this file (the wheel installs unpacked: its C scanner could not load from a zip);
    # importlib.resources would add zipfile, tempfile, shutil, bz2 and lzma to every start for nothing.
    root = Path(__file__).resolve().parent
    out = []
    for pack in packs:
        if pack not in (*BUILTIN_PACKS, MODELSYNC_PACK):
            raise CatalogError(f"unknown built-in pack {pack!r}; one of {', '.join(BUILTIN_PACKS)}")
        out.append((f"{pack}.toml (built in)", (root / f"{pack}.toml").read_text(encoding="utf-8")))
    return out


def build(paths: Sequence[Path | str] = (), selection: str = "", packs: Sequence[str] = BUILTIN_PACKS) -> Catalog:
    """The catalog from the built-in packs and the user's files, validated, with a selection applied.

    Raises CatalogError with a one-line message naming the file, the entry and the problem.
    """
    if MODELSYNC_PACK in packs:
        raise CatalogError(f"the {MODELSYNC_PACK} pack is read on its own: modelsync_catalog()")
    builtins = builtin_files(packs)
    loaded = read([*builtins, *read_paths(paths)], builtin=len(builtins))
    for m in loaded.metrics.values():
        if m.scope is Scope.MODELSYNC:
            raise CatalogError(f"{m.origin}: metric {m.name!r}: scope modelsync is only for the model-sync pack")
    return Catalog(
        list(loaded.metrics.values()), loaded.families, files=loaded.files, dimensions=loaded.dimensions
    ).select(selection)


def modelsync_catalog() -> Catalog:
    """Model sync's metrics (``modelsync.toml``): what the model-sync daemon emits, every one of them."""
    loaded = read(builtin_files((MODELSYNC_PACK,)), builtin=1)
    for m in loaded.metrics.values():
        if m.scope is not Scope.MODELSYNC:
            raise CatalogError(f"{m.origin}: metric {m.name!r}: the model-sync pack holds scope modelsync only")
    return Catalog(list(loaded.metrics.values()), loaded.families, files=loaded.files, dimensions=loaded.dimensions)


def parse_selection(text: str, names: Sequence[str]) -> list[str]:
    """Apply ``--metrics`` patterns (comma-separated globs over EMF names) to ``names``.

    Terms apply left to right: ``Pattern`` or ``+Pattern`` adds the names it
    matches, ``-Pattern`` removes them. The start is every metric when the
    first term removes, none when it adds: ``-RequestFailure*,-Compute*`` is
    "all but", ``Gpu*,ModelReady`` is "only". A pattern that matches no
    metric is an error (a typo would otherwise silently change the bill).
    """
    terms = [t.strip() for t in text.split(",")]
    if not terms or any(not t or t in "+-" for t in terms):
        raise CatalogError(f"--metrics {text!r}: empty pattern (use comma-separated globs, '-' to exclude)")
    chosen: dict[str, None] = dict.fromkeys(names) if terms[0].startswith("-") else {}
    for term in terms:
        exclude = term.startswith("-")
        pattern = term[1:] if term[0] in "+-" else term
        matched = [n for n in names if fnmatchcase(n, pattern)]
        if not matched:
            raise CatalogError(
                f"--metrics: pattern {pattern!r} matches no metric in the catalog "
                "(python -m exporter catalog lists them)"
            )
        for n in matched:
            if exclude:
                chosen.pop(n, None)
            else:
                chosen[n] = None
    return [n for n in names if n in chosen]
