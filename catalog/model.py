"""What a catalog is made of: families (what a source serves) and metrics (what the exporter emits).

Plain frozen data. :mod:`catalog.load` builds these from the TOML
files and validates them; :class:`catalog.Catalog` holds the result
and answers the questions the rest of the exporter asks of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from telemetry.emf import HIGH_RESOLUTION, STANDARD_RESOLUTION


class Scope(StrEnum):
    """What one EMF event describes; fixes the event's base dimensions."""

    MODEL = "model"  # one model version: dimensions model, version
    GPU = "gpu"  # one GPU: dimension gpu (index); uuid is a property
    TASK = "task"  # the Triton server of this task: no dimensions
    SOURCE = "source"  # one scrape source: dimension source
    MODELSYNC = "modelsync"  # one model-sync event (attempt, model, host): no base dimensions; see EVENT_KEYS


BASE_DIMENSIONS: dict[Scope, tuple[str, ...]] = {
    Scope.MODEL: ("model", "version"),
    Scope.GPU: ("gpu",),
    Scope.TASK: (),
    Scope.SOURCE: ("source",),
    Scope.MODELSYNC: (),
}

EVENT_KEYS: dict[Scope, tuple[str, ...]] = {
    Scope.MODELSYNC: ("model", "result"),
}
"""Keys an event of the scope may carry beyond its base dimensions; a rollup may use them.

A model-sync event is keyed by what happened (the model, the result of an
attempt), not by an entity the exporter scrapes: every dimension set is a
rollup over these keys, and the empty set (the base) is one series across
the whole service.
"""


class Kind(StrEnum):
    """How a value is computed from its inputs over one window."""

    GAUGE = "gauge"  # last value (combined across GPU instances)
    DELTA = "delta"  # counter increase over the window
    RATE = "rate"  # counter increase / elapsed seconds (monotonic clock)
    RATIO = "ratio"  # delta(numerators) / delta(denominators), only when the denominator > 0
    GAUGE_RATIO = "gauge_ratio"  # gauge / gauge, only when the denominator > 0
    QUANTILE = "quantile"  # a summary quantile, only when the summary's guard counter grew in the window
    DISTRIBUTION = "distribution"  # a histogram's bucket deltas as one EMF Values/Counts object
    PERCENTILE = "percentile"  # a per-task percentile interpolated from the window's bucket deltas
    STATE = "state"  # from the repository index
    SELF = "self"  # the exporter's own bookkeeping
    SUPPLIED = "supplied"  # the emitting program supplies the value itself (model sync); no inputs


FAST_INTERVALS = tuple(n for n in range(1, 60) if 60 % n == 0)
"""The values a metric's own ``interval`` may take: the divisors of 60 below it, so that a minute holds a
whole number of its values (an alarm's period must be a multiple of it too: render checks)."""

COUNTER_KINDS = frozenset({Kind.DELTA, Kind.RATE, Kind.RATIO, Kind.DISTRIBUTION, Kind.PERCENTILE})
HISTOGRAM_KINDS = frozenset({Kind.DISTRIBUTION, Kind.PERCENTILE})


class Combine(StrEnum):
    """How series of one entity are merged (a model on several GPUs has one series per gpu_uuid)."""

    SUM = "sum"
    MAX = "max"


FAMILY_TYPES = ("counter", "gauge", "summary", "histogram", "untyped")


_TRITON_RELEASE = re.compile(r"Triton (\d{2})\.(\d{2})")


@dataclass(frozen=True)
class Family:
    """A family a source serves: its Prometheus type and the labels it carries.

    ``labels`` lists what the family is known to carry (Triton may add more:
    ``gpu_uuid`` on per-model series of GPU instances, ``namespace``, metric
    tags); it is what a metric's ``split`` is checked against. Histograms and
    summaries carry ``le`` / ``quantile`` on top.
    """

    name: str
    type: str
    labels: tuple[str, ...] = ()
    # "triton": read from /metrics; "nvml": the NVML source; "traces": the trace relay; "outputs": the exporter's
    # own outputs (the OTLP metrics output's counts)
    source: str = "triton"
    help: str = ""
    requires: str = ""  # what must be on for Triton to serve it (a Triton flag, a backend); cost reads it
    since: str = ""  # the first releases that publish it ("Triton 24.11", "vLLM backend r24.09"); docs' version table

    def triton_release(self, decoupled: bool) -> tuple[int, int] | None:
        """The first Triton release that prints the family for a model of this kind, from ``since``.

        ``since`` is read as clauses separated by ``;``; a clause's ``Triton YY.MM`` applies to every model,
        or only to decoupled ones when the clause says ``(decoupled models)``. The earliest applicable one
        wins: "Triton 24.11 (decoupled models); Triton 26.01 (every model)" is 24.11 for a decoupled model
        and 26.01 for the others. None when ``since`` names no Triton release (a backend's own).
        """
        found = []
        for clause in self.since.split(";"):
            m = _TRITON_RELEASE.search(clause)
            if m is not None and (decoupled or "(decoupled models)" not in clause):
                found.append((int(m.group(1)), int(m.group(2))))
        return min(found, default=None)

    def samples(self) -> tuple[str, ...]:
        """The sample names this family prints."""
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.type == "summary":
            return (self.name, f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


@dataclass(frozen=True)
class Dimension:
    """A dimension whose values a pack declares once, each with its meaning (model sync's ``result``)."""

    name: str
    help: str
    values: tuple[tuple[str, str], ...]  # (value, meaning), in the pack's order

    def names(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.values)


@dataclass(frozen=True)
class Input:
    """One source series a metric reads.

    ``sample`` is the sample name (``x``, ``x_sum``, ``x_count``); for the
    histogram kinds it is the histogram family, whose ``_bucket`` and ``_sum``
    samples are read. ``where`` selects one value of a splitting label
    (``("reason", "BACKEND")``). ``scale`` multiplies values (and bucket
    bounds and sums of histograms). ``decoupled`` (histogram kinds only) reads
    the input only for model versions whose configuration (Triton's model
    config API) says they are decoupled (True) or not (False); a version
    whose configuration is not known yet gets neither.
    """

    sample: str
    family: str
    scale: float = 1.0
    where: tuple[str, str] | None = None
    decoupled: bool | None = None

    def describe(self) -> str:
        s = self.sample + (f"{{{self.where[0]}={self.where[1]}}}" if self.where else "")
        if self.decoupled is not None:
            s += " (decoupled models)" if self.decoupled else " (non-decoupled models)"
        return s + (f" x {self.scale:g}" if self.scale != 1 else "")


@dataclass(frozen=True)
class Metric:
    """One emitted metric: its EMF name, unit, dimensions and computation."""

    name: str
    scope: Scope
    unit: str
    kind: Kind
    help: str
    inputs: tuple[Input, ...] = ()
    denominators: tuple[Input, ...] = ()
    guard: Input | None = None  # QUANTILE: emitted only when this counter grew in the window
    quantile: float | None = None  # PERCENTILE
    combine: Combine = Combine.SUM
    rollups: tuple[tuple[str, ...], ...] = ()  # extra dimension sets, each a billed metric
    breakdown_of: str | None = None  # zeros left out while this total is zero (cost)
    origin: str = ""  # the catalog file that defined it (for errors and docs)
    source: str = "triton"  # where the value comes from: triton, nvml, traces, index, exporter, modelsync
    event: str = ""  # scope modelsync: the event that carries it (attempt, model, host)
    resolution: int = STANDARD_RESOLUTION  # EMF StorageResolution: 60 (standard) or 1 (high resolution)
    across: Combine | None = None  # scope task: each model's (or GPU's) value, then combined over the task's
    interval: int | None = None  # seconds between its values; None: the exporter's --interval

    @property
    def high_resolution(self) -> bool:
        return self.resolution == HIGH_RESOLUTION

    def period(self, interval: float) -> float:
        """Seconds between this metric's values when the exporter's full cycle is ``interval``: its own
        ``interval`` where that is shorter (a fast metric), else the full cycle's."""
        return interval if self.interval is None else min(float(self.interval), interval)

    @property
    def dimension_sets(self) -> tuple[tuple[str, ...], ...]:
        return (BASE_DIMENSIONS[self.scope], *self.rollups)

    def all_inputs(self) -> tuple[Input, ...]:
        return (*self.inputs, *self.denominators, *((self.guard,) if self.guard else ()))

    def describe_inputs(self) -> str:
        """The computation as a formula: ``a | b`` first present, ``a + b`` summed, ``x / y`` a ratio."""

        def group(inputs: tuple[Input, ...], sep: str) -> str:
            text = sep.join(i.describe() for i in inputs)
            return f"({text})" if len(inputs) > 1 else text

        if self.kind is Kind.RATIO:
            return f"delta {group(self.inputs, ' + ')} / delta {group(self.denominators, ' + ')}"
        if self.kind is Kind.GAUGE_RATIO:
            return f"{group(self.inputs, ' | ')} / {group(self.denominators, ' | ')} (pairwise, first present)"
        if self.kind is Kind.QUANTILE and self.guard:
            return f"{group(self.inputs, ' | ')} when delta {self.guard.describe()} > 0"
        if self.kind is Kind.PERCENTILE:
            return f"histogram_quantile({self.quantile:g}, delta {group(self.inputs, ' | ')})"
        if self.kind is Kind.DISTRIBUTION:
            return f"bucket deltas of {group(self.inputs, ' | ')}"
        if self.inputs:
            prefix = {Kind.DELTA: "delta ", Kind.RATE: "rate "}.get(self.kind, "")
            return prefix + group(self.inputs, " | ")
        return self.source

    def describe(self) -> str:
        """:meth:`describe_inputs`, and ``across`` (``sum over the task's models of ...``) when set."""
        text = self.describe_inputs()
        return f"{self.across} over the task's models of {text}" if self.across else text
