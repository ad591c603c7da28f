"""Catalog-driven transform: one window of series in, metric values per entity out.

Computed column-wise (one dict comprehension per metric across all
entities) rather than entity by entity: at 1000 models that keeps the
Python-level work per value to a few dict operations.

Entities are keyed by :attr:`LabelSet.entity_key`: a model version, a GPU
uuid, or ``""`` for the task. Series of one entity that differ in other
labels (a model on two GPUs has one series per ``gpu_uuid``) are combined
as the catalog says (sum, or max for quantiles).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from operator import itemgetter

from .catalog import CATALOG, SPLIT_LABELS, Combine, Input, Kind, Metric
from .promtext import LabelSet, Series
from .state import Window

Column = dict[str, float]  # entity_key -> value
ColumnKey = tuple[str, str | None]  # (series, split value or None for the total)


_COMBINE: dict[str, Combine] = {}
_SPLIT_VALUES: dict[str, set[str] | None] = {}  # series -> split values the catalog selects (None: all)
_GAUGE_SERIES: set[str] = set()

for _m in CATALOG:
    for _i in (*_m.inputs, *_m.denominators):
        if _m.combine is Combine.MAX:
            _COMBINE[_i.series] = Combine.MAX
        if _m.kind in (Kind.GAUGE, Kind.GAUGE_RATIO, Kind.QUANTILE):
            _GAUGE_SERIES.add(_i.series)
        if _m.kind is Kind.HISTOGRAM_QUANTILE:
            _SPLIT_VALUES[_i.series] = None
        elif _i.where is not None:
            selected = _SPLIT_VALUES.setdefault(_i.series, set())
            if selected is not None:
                selected.add(_i.where)
_TOTAL_UNUSED = {
    s for s in SPLIT_LABELS
    if not any(i.series == s and i.where is None for m in CATALOG for i in (*m.inputs, *m.denominators))
}


class _SplitPlan:
    """How one split family's series map to entities, cached while Triton prints the same series.

    With it, building a family's columns is a few C-level calls instead of a
    Python loop over every sample (the failure family alone has 4 samples
    per model).
    """

    def __init__(self, keys: list[str], parts: dict[str, tuple[list[str], itemgetter]], total_ok: bool) -> None:
        self.keys = keys
        self.parts = parts
        self.total_ok = total_ok  # every entity has every split value once: totals are sums of the parts


_PLANS: dict[str, _SplitPlan | None] = {}


def _plan(name: str, split: str, values: Series, labels: Mapping[str, LabelSet]) -> _SplitPlan | None:
    """A plan when each (entity, split value) occurs once; None means use the general loop."""
    keys = list(values)
    selected = _SPLIT_VALUES.get(name)
    want_total = name not in _TOTAL_UNUSED
    positions: dict[str, tuple[list[str], list[int]]] = {}
    seen: set[tuple[str, str]] = set()
    for i, key in enumerate(keys):
        ls = labels[key]
        sv = ls.labels.get(split)
        if sv is None or (ls.entity_key, sv) in seen or (ls.entity_key != ls.key and "gpu_uuid" in ls.labels):
            return None
        seen.add((ls.entity_key, sv))
        if want_total or selected is None or sv in selected:
            ents, pos = positions.setdefault(sv, ([], []))
            ents.append(ls.entity_key)
            pos.append(i)
    first = next(iter(positions.values()), ([], []))[0]
    total_ok = all(ents == first for ents, _ in positions.values())
    if want_total and not total_ok:
        return None
    parts = {sv: (ents, itemgetter(*pos)) for sv, (ents, pos) in positions.items() if len(pos) > 1}
    if len(parts) != len(positions):
        return None  # single-series groups: the general loop is simpler than itemgetter's scalar case
    return _SplitPlan(keys, parts, total_ok)


def columns(series: Mapping[str, Series], labels: Mapping[str, LabelSet]) -> dict[ColumnKey, Column]:
    """Aggregate series per entity; split families also get one column per selected split value."""
    out: dict[ColumnKey, Column] = {}
    for name, values in series.items():
        split = SPLIT_LABELS.get(name)
        if split is None and all(labels[k].entity_key == k for k in values):
            out[(name, None)] = values  # one series per entity already (the common case)
            continue
        if split is not None and _columns_planned(name, split, values, labels, out):
            continue
        use_max = _COMBINE.get(name) is Combine.MAX
        selected = _SPLIT_VALUES.get(name)
        want_total = name not in _TOTAL_UNUSED
        total: Column = {}
        parts: dict[str, Column] = {}
        for key, value in values.items():
            ls = labels[key]
            ent = ls.entity_key
            if want_total:
                old = total.get(ent)
                total[ent] = value if old is None else (max(old, value) if use_max else old + value)
            if split is not None:
                sv = ls.labels.get(split)
                if sv is not None and (selected is None or sv in selected):
                    part = parts.get(sv)
                    if part is None:
                        part = parts[sv] = {}
                    old = part.get(ent)
                    part[ent] = value if old is None else (max(old, value) if use_max else old + value)
        if want_total:
            out[(name, None)] = total
        for sv, col in parts.items():
            out[(name, sv)] = col
    return out


def _columns_planned(
    name: str, split: str, values: Series, labels: Mapping[str, LabelSet], out: dict[ColumnKey, Column]
) -> bool:
    plan = _PLANS.get(name)
    if plan is None or plan.keys != list(values):
        if len(_PLANS) > 64:
            _PLANS.clear()
        plan = _PLANS[name] = _plan(name, split, values, labels)
    if plan is None:
        return False
    vals = list(values.values())
    selected = _SPLIT_VALUES.get(name)
    picked = {sv: (ents, get(vals)) for sv, (ents, get) in plan.parts.items()}
    for sv, (ents, got) in picked.items():
        if selected is None or sv in selected:
            out[(name, sv)] = dict(zip(ents, got))
    if name not in _TOTAL_UNUSED and picked:
        ents = next(iter(picked.values()))[0]
        out[(name, None)] = dict(zip(ents, map(sum, zip(*(got for _, got in picked.values())))))
    return True


def finite(col: Column) -> Column:
    """Drop NaN and infinities (a summary with no observations reports NaN)."""
    if math.isfinite(sum(col.values())):
        return col
    return {k: v for k, v in col.items() if math.isfinite(v)}


def _first_present(inputs: Iterable[Input], cols: Mapping[ColumnKey, Column]) -> Column:
    out: Column = {}
    for inp in reversed(tuple(inputs)):  # earlier inputs win: applied last
        col = cols.get((inp.series, inp.where))
        if col:
            out.update(col if inp.scale == 1 else {k: v * inp.scale for k, v in col.items()})
    return out


def _summed(inputs: Iterable[Input], cols: Mapping[ColumnKey, Column]) -> Column:
    present = [(inp, c) for inp in inputs if (c := cols.get((inp.series, inp.where)))]
    if not present:
        return {}
    if all(inp.scale == 1 for inp, _ in present):
        first = present[0][1]
        if len(present) == 1:
            return first
        order = list(first)
        if all(list(c) == order for _, c in present):
            # Same entities in every input (the normal case): add column-wise in C.
            return dict(zip(first, map(sum, zip(*(c.values() for _, c in present))), strict=True))
    out: Column = {}
    for inp, col in present:
        for k, v in col.items():
            out[k] = out.get(k, 0.0) + v * inp.scale
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over (upper bound, cumulative count) pairs.

    Linear interpolation inside the bucket; a rank in the +Inf bucket
    returns the highest finite bound. None when the window saw nothing.
    """
    buckets = sorted(buckets)
    if not buckets or buckets[-1][0] != math.inf:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == math.inf:
                return prev_bound if len(buckets) > 1 else None
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return None


def compute(
    metric: Metric,
    gauges: Mapping[ColumnKey, Column],
    deltas: Mapping[ColumnKey, Column],
    elapsed: float | None,
    given: Mapping[str, Column],
) -> Column:
    """Values of one catalog metric for every entity that has them."""
    kind = metric.kind
    if kind in (Kind.STATE, Kind.SELF):
        return dict(given.get(metric.name, {}))
    if kind is Kind.GAUGE:
        return _first_present(metric.inputs, gauges)
    if kind is Kind.GAUGE_RATIO:
        out: Column = {}
        for num, den in reversed(tuple(zip(metric.inputs, metric.denominators, strict=True))):
            n, d = _first_present((num,), gauges), _first_present((den,), gauges)
            out.update({k: v / d[k] for k, v in n.items() if d.get(k, 0) > 0})
        return out
    if elapsed is None:  # baseline scrape: no counter-based value exists yet
        return {}
    if kind is Kind.DELTA:
        return _first_present(metric.inputs, deltas)
    if kind is Kind.RATE:
        return {k: v / elapsed for k, v in _first_present(metric.inputs, deltas).items()}
    if kind is Kind.RATIO:
        num, den = _summed(metric.inputs, deltas), _summed(metric.denominators, deltas)
        return {k: v / den[k] for k, v in num.items() if den.get(k, 0) > 0}
    if kind is Kind.QUANTILE:
        assert metric.guard is not None
        guard = _first_present((metric.guard,), deltas)
        vals = _first_present(metric.inputs, gauges)
        return {k: v for k, v in vals.items() if guard.get(k, 0) > 0}
    if kind is Kind.HISTOGRAM_QUANTILE:
        series = metric.inputs[0].series
        per_entity: dict[str, list[tuple[float, float]]] = {}
        for (name, le), col in deltas.items():
            if name == series and le is not None:
                bound = _bound(le)
                if bound is not None:
                    for k, v in col.items():
                        per_entity.setdefault(k, []).append((bound, v))
        assert metric.quantile is not None
        out = {}
        for k, buckets in per_entity.items():
            value = histogram_quantile(metric.quantile, buckets)
            if value is not None:
                out[k] = value
        return out
    raise ValueError(f"unknown kind {kind}")  # pragma: no cover - the enum is closed


def _bound(le: str) -> float | None:
    try:
        return float(le)
    except ValueError:
        return None


def evaluate(
    metrics: Iterable[Metric],
    samples: Mapping[str, Series],
    window: Window,
    labels: Mapping[str, LabelSet],
    given: Mapping[str, Column],
) -> dict[str, Column]:
    """Every metric's column, without NaN or infinities."""
    gauges = {name: finite(s) for name, s in samples.items() if name in _GAUGE_SERIES}
    gcols = columns(gauges, labels)
    dcols = columns(window.deltas, labels)
    out: dict[str, Column] = {}
    for metric in metrics:
        col = compute(metric, gcols, dcols, window.elapsed, given)
        if col:
            out[metric.name] = finite(col)
    return out
