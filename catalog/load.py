"""Catalog files (TOML) in, validated :class:`Metric` and :class:`Family` objects out.

One schema for the built-in packs and the user's ``--catalog`` files
(documented in docs/metrics.md). Files are read in order: families of every
file first (so a user file may use a built-in family and vice versa), then
metrics file by file, where a later file may replace an earlier metric
(``override = true``) or remove it (``drop = [...]``).

The model-sync pack (``modelsync.toml``) uses the same schema with two
additions: scope ``modelsync`` (events keyed by what happened: no base
dimensions, rollups over the keys ``model`` and ``result``, each metric
naming the ``event`` that carries it) with kind ``supplied`` (the daemon
supplies the value; no inputs), and ``[dimensions.NAME]`` tables that
declare a dimension's allowed values once, each with its meaning
(``values = { ok = "..." }``): model sync's result names.

Every problem is a :class:`CatalogError` whose one-line message names the
file, the entry and what is wrong; the entry point turns it into exit 2.
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry.emf import CLOUDWATCH_UNITS, HIGH_RESOLUTION, MAX_METRIC_NAME_LENGTH, STANDARD_RESOLUTION

from .model import (
    BASE_DIMENSIONS,
    EVENT_KEYS,
    FAMILY_TYPES,
    FAST_INTERVALS,
    HISTOGRAM_KINDS,
    Combine,
    Dimension,
    Family,
    Input,
    Kind,
    Metric,
    Scope,
)


class CatalogError(ValueError):
    """A catalog file is invalid; the message is one line naming the file, the entry and the problem."""


# A catalog file is a boundary: read only if it is a regular file (a FIFO would hang the start, /dev/zero
# fill the memory), of at most MAX_CATALOG_BYTES, nested at most MAX_TOML_DEPTH deep (tomllib recurses).
MAX_CATALOG_BYTES = 1024 * 1024  # the built-in core.toml is under 64 KiB
MAX_TOML_DEPTH = 32  # arrays and inline tables inside each other; the built-in packs nest 3 deep


FAMILY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Upper-case first: dimension and property keys share the EMF root with metric names and are lower case.
METRIC_NAME = re.compile(r"[A-Z][A-Za-z0-9_.\-]*")


# /metrics, the NVML source, the trace relay, the exporter's own outputs (what the OTLP metrics output sent)
FAMILY_SOURCES = ("triton", "nvml", "traces", "outputs")
FAMILY_KEYS = {"type", "labels", "source", "help", "requires", "since", "override"}
METRIC_KEYS = {
    "name",
    "scope",
    "unit",
    "kind",
    "help",
    "inputs",
    "denominators",
    "guard",
    "quantile",
    "combine",
    "rollups",
    "breakdown_of",
    "event",
    "resolution",
    "interval",
    "across",
    "override",
}
DIMENSION_KEYS = {"help", "values"}
MODELSYNC_EVENTS = ("attempt", "model", "host", "rollout", "start")
"""The events model sync writes (modelsync/metrics.py): one per attempt, per model and reconcile, per reconcile,
per rollout decision, per task start."""
INPUT_KEYS = {"family", "sample", "split", "select", "scale", "cumulative", "decoupled"}
SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass
class _Where:
    """Where an entry came from, for messages."""

    file: str
    entry: str

    def error(self, problem: str) -> CatalogError:
        return CatalogError(f"{self.file}: {self.entry}: {problem}")


@dataclass
class Loaded:
    """The result of reading catalog files: every definition after overrides and drops, in order."""

    metrics: dict[str, Metric] = field(default_factory=dict)
    families: dict[str, Family] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    dimensions: dict[str, Dimension] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # metric -> where a drop removed it ("my.toml: line 3")


def read(files: Sequence[tuple[str, str]], builtin: int = 0) -> Loaded:
    """Build the catalog from (display name, TOML text) pairs, in order; the first ``builtin`` are built-in packs.

    Kinds ``self`` and ``state`` are values the exporter computes itself
    (exporter/selfmetrics.py, which a test holds to the built-in packs'
    list): only a built-in pack defines them; a user file may override or
    drop one, never invent one that nothing would compute.
    """
    docs = [(name, _parse(name, text)) for name, text in files]
    out = Loaded(files=[name for name, _ in files])
    for name, doc in docs:
        for fam_name, raw in _table(doc.get("families", {}), _Where(name, "[families]")).items():
            _add_family(out.families, name, fam_name, raw)
        for dim_name, raw in _table(doc.get("dimensions", {}), _Where(name, "[dimensions]")).items():
            _add_dimension(out.dimensions, name, dim_name, raw)
    for position, (name, doc) in enumerate(docs):
        entries = doc.get("metric", [])
        if not isinstance(entries, list):
            raise CatalogError(f"{name}: 'metric' must be an array of tables ([[metric]])")
        seen: set[str] = set()
        for n, raw in enumerate(entries, 1):
            where = _Where(name, f"metric #{n}")
            raw = _table(raw, where)
            metric_name = raw.get("name")
            if isinstance(metric_name, str):
                where.entry = f"metric {metric_name!r}"
            metric = _metric(raw, out.families, where)
            if metric.name in seen:
                raise where.error("duplicate EMF name in this file")
            seen.add(metric.name)
            earlier = out.metrics.get(metric.name)
            if (
                metric.kind in (Kind.STATE, Kind.SELF)
                and position >= builtin
                and getattr(earlier, "kind", None) != metric.kind
            ):
                raise where.error(
                    f"kind {metric.kind} is only for the exporter's own metrics, which the built-in packs define "
                    "(a catalog file may override or drop one)"
                )
            if raw.get("override") is True:
                if earlier is None:
                    raise where.error("override = true, but no earlier file defines this metric")
            elif earlier is not None:
                raise where.error(
                    f"duplicate EMF name (already defined in {earlier.origin}); set override = true to replace it"
                )
            out.metrics[metric.name] = metric
        drop = doc.get("drop", [])
        if not isinstance(drop, list) or not all(isinstance(d, str) for d in drop):
            raise CatalogError(f"{name}: drop must be a list of metric names")
        for d in drop:
            if out.metrics.pop(d, None) is None:
                raise CatalogError(f"{name}: drop: no metric named {d!r} to drop")
            out.dropped[d] = _drop_line(name, files[position][1], d)
    _check_references(out)
    return out


def _drop_line(file: str, text: str, metric: str) -> str:
    """``file: line N``, the line of the ``drop`` array that names ``metric`` (tomllib keeps no positions)."""
    key = re.search(r"""(?m)^[ \t]*["']?drop["']?[ \t]*=""", text)
    if key is None:
        return f"{file}: drop"
    found = re.compile(r"""["']""" + re.escape(metric) + r"""["']""").search(text, key.start())
    return f"{file}: line {text.count(chr(10), 0, found.start() if found else key.start()) + 1}"


def read_paths(paths: Sequence[Path | str]) -> list[tuple[str, str]]:
    """(name, text) of each catalog file; CatalogError when one is not a regular UTF-8 file within the limit."""
    out = []
    for p in paths:
        try:
            data = _read_regular(Path(p), MAX_CATALOG_BYTES)
        except OSError as exc:
            raise CatalogError(f"{p}: cannot read catalog file: {exc.strerror or exc}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CatalogError(f"{p}: catalog file is not UTF-8: {exc.reason}") from None
        if _nesting(text) > MAX_TOML_DEPTH:
            raise CatalogError(f"{p}: arrays or tables nested deeper than {MAX_TOML_DEPTH} levels")
        out.append((str(p), text))
    return out


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; CatalogError for anything else, never a hang."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once, without a writer
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        raise CatalogError(
            f"{path}: not a regular file (a {_KINDS.get(kind, 'special file')}); a catalog is a TOML file"
        )
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CatalogError(f"{path}: catalog file larger than {limit} bytes")
    return data


_KINDS = {
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
}


# Strings and comments, where brackets are text, and the brackets themselves (tomllib recurses per level).
_TOML_TOKENS = re.compile(
    r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]', re.DOTALL
)


def _nesting(text: str) -> int:
    """How deep arrays and tables nest in TOML ``text`` (brackets in strings and comments not counted)."""
    depth = deepest = 0
    for m in _TOML_TOKENS.finditer(text):
        c = m.group()
        if c in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif c in ("]", "}"):
            depth -= 1
    return deepest


# --- pieces -----------------------------------------------------------------------------------


def _parse(name: str, text: str) -> dict[str, Any]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{name}: not valid TOML: {exc}") from None
    except RecursionError:  # a stack shallower than the bound: refused all the same
        raise CatalogError(f"{name}: arrays or tables nested too deeply") from None
    unknown = set(doc) - {"families", "dimensions", "metric", "drop"}
    if unknown:
        raise CatalogError(
            f"{name}: unknown top-level key(s) {sorted(unknown)}; expected families, dimensions, metric, drop"
        )
    return doc


def _table(value: Any, where: _Where) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.error("must be a table")
    return value


def _add_family(families: dict[str, Family], file: str, name: str, raw: Any) -> None:
    where = _Where(file, f"family {name!r}")
    raw = _table(raw, where)
    _no_unknown(raw, FAMILY_KEYS, where)
    if not FAMILY_NAME.fullmatch(name):
        raise where.error("not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)")
    ftype = raw.get("type")
    if ftype not in FAMILY_TYPES:
        raise where.error(f"type must be one of {', '.join(FAMILY_TYPES)}, got {ftype!r}")
    labels = raw.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) and LABEL_NAME.fullmatch(x) for x in labels):
        raise where.error("labels must be a list of label names")
    if len(set(labels)) != len(labels):
        raise where.error("labels repeat a name")
    reserved = {"histogram": "le", "summary": "quantile"}.get(ftype)
    if reserved in labels:
        raise where.error(f"a {ftype} carries {reserved!r} by itself; do not list it")
    source = raw.get("source", "triton")
    if source not in FAMILY_SOURCES:
        raise where.error(f"source must be one of {', '.join(FAMILY_SOURCES)}, got {source!r}")
    help_text = raw.get("help", "")
    if not isinstance(help_text, str):
        raise where.error("help must be a string")
    requires = raw.get("requires", "")
    if not isinstance(requires, str) or not re.fullmatch(r"[a-z0-9_]*", requires):
        raise where.error("requires must be a lower-case word (a feature such as summary_latencies or vllm)")
    since = raw.get("since", "")
    if not isinstance(since, str):
        raise where.error('since must be a string (the first releases that publish it, e.g. "Triton 24.11")')
    family = Family(name, ftype, tuple(labels), source, help_text, requires, since.strip())
    earlier = families.get(name)
    if earlier is not None and earlier != family and raw.get("override") is not True:
        raise where.error("declared differently in an earlier file; set override = true to replace it")
    families[name] = family


def _add_dimension(dimensions: dict[str, Dimension], file: str, name: str, raw: Any) -> None:
    where = _Where(file, f"dimension {name!r}")
    raw = _table(raw, where)
    _no_unknown(raw, DIMENSION_KEYS, where)
    if not LABEL_NAME.fullmatch(name) or name != name.lower():
        raise where.error("a dimension name is a lower-case word ([a-z_][a-z0-9_]*)")
    help_text = raw.get("help", "")
    if not isinstance(help_text, str) or not help_text.strip():
        raise where.error("help must be a non-empty string")
    values = _table(raw.get("values"), _Where(file, f"dimension {name!r}: values"))
    if not values:
        raise where.error("values must declare at least one value")
    for value, meaning in values.items():
        if not LABEL_NAME.fullmatch(value):
            raise where.error(f"value {value!r} is not a word ([a-zA-Z_][a-zA-Z0-9_]*)")
        if not isinstance(meaning, str) or not meaning.strip():
            raise where.error(f"value {value!r}: its meaning must be a non-empty string")
    if name in dimensions:
        raise where.error("declared already in an earlier file")
    dimensions[name] = Dimension(name, help_text.strip(), tuple((v, m.strip()) for v, m in values.items()))


def _no_unknown(raw: Mapping[str, Any], allowed: set[str], where: _Where) -> None:
    unknown = set(raw) - allowed
    if unknown:
        raise where.error(f"unknown key(s) {sorted(unknown)}; expected {', '.join(sorted(allowed))}")


def _enum(raw: Mapping[str, Any], key: str, enum: type[Any], where: _Where, default: Any = None) -> Any:
    value = raw.get(key, default)
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(e.value for e in enum)
        raise where.error(f"unknown {key} {value!r}; one of {choices}") from None


def _metric(raw: dict[str, Any], families: Mapping[str, Family], where: _Where) -> Metric:
    _no_unknown(raw, METRIC_KEYS, where)
    for key in ("name", "scope", "unit", "kind", "help"):
        if key not in raw:
            raise where.error(f"missing {key}")
    name = raw["name"]
    if not isinstance(name, str) or not name:
        raise where.error("name must be a non-empty string")
    if len(name) > MAX_METRIC_NAME_LENGTH:
        raise where.error(f"name is {len(name)} characters; CloudWatch allows {MAX_METRIC_NAME_LENGTH}")
    if not METRIC_NAME.fullmatch(name):
        raise where.error(
            "name must start with an upper-case letter and hold only letters, digits, _ . - "
            "(dimension and property keys are lower case and share the EMF root)"
        )
    scope = _enum(raw, "scope", Scope, where)
    kind = _enum(raw, "kind", Kind, where)
    unit = raw["unit"]
    if unit not in CLOUDWATCH_UNITS:
        raise where.error(f"unit {unit!r} is not a CloudWatch unit (one of {', '.join(CLOUDWATCH_UNITS)})")
    help_text = raw["help"]
    if not isinstance(help_text, str) or not help_text.strip():
        raise where.error("help must be a non-empty string")
    combine = _enum(raw, "combine", Combine, where, "sum")
    if kind in (Kind.STATE, Kind.SELF) and (raw.get("inputs") or raw.get("denominators")):
        raise where.error(f"kind {kind} takes no inputs (the exporter computes it)")
    if kind is Kind.SUPPLIED and (raw.get("inputs") or raw.get("denominators") or "guard" in raw):
        raise where.error("kind supplied takes no inputs (the emitting program supplies the value)")
    if (scope is Scope.MODELSYNC) != (kind is Kind.SUPPLIED):
        raise where.error("scope modelsync and kind supplied go together (model sync supplies its own values)")
    event = raw.get("event", "")
    if scope is Scope.MODELSYNC and event not in MODELSYNC_EVENTS:
        raise where.error(f"scope modelsync needs event, one of {', '.join(MODELSYNC_EVENTS)}; got {event!r}")
    if scope is not Scope.MODELSYNC and "event" in raw:
        raise where.error("event is only for scope modelsync")
    across = _across(raw, scope, kind, where)
    inputs = _inputs(raw.get("inputs", []), "inputs", kind, scope, families, where, across is not None)
    denominators = _inputs(
        raw.get("denominators", []), "denominators", kind, scope, families, where, across is not None
    )
    guard = None
    if "guard" in raw:
        if kind is not Kind.QUANTILE:
            raise where.error("guard is only for kind quantile")
        guard = _inputs([raw["guard"]], "guard", Kind.DELTA, scope, families, where, across is not None)[0]
    if not inputs and kind not in (Kind.STATE, Kind.SELF, Kind.SUPPLIED):
        raise where.error("needs inputs")
    if scope is Scope.SOURCE and kind is not Kind.SELF:
        raise where.error("scope source is only for the exporter's own per-source metrics")
    if kind in (Kind.RATIO, Kind.GAUGE_RATIO):
        if not denominators:
            raise where.error(f"a {kind} needs denominators")
        if kind is Kind.GAUGE_RATIO and len(denominators) != len(inputs):
            raise where.error("a gauge_ratio pairs inputs with denominators: give as many of each")
    elif denominators:
        raise where.error(f"denominators are only for ratio and gauge_ratio, not {kind}")
    if kind is Kind.QUANTILE and guard is None:
        raise where.error("a quantile needs a guard counter (emitted only when it grew in the window)")
    quantile = raw.get("quantile")
    if kind is Kind.PERCENTILE:
        if not isinstance(quantile, int | float) or isinstance(quantile, bool) or not 0 < quantile < 1:
            raise where.error("a percentile needs quantile, a number between 0 and 1 (0.95 for p95)")
        quantile = float(quantile)
    elif quantile is not None:
        raise where.error("quantile is only for kind percentile (a summary quantile is selected with split)")
    if kind in HISTOGRAM_KINDS and combine is not Combine.SUM:
        raise where.error("histogram buckets add up across GPU instances: combine must be sum")
    rollups = _rollups(raw.get("rollups", []), scope, where)
    breakdown = raw.get("breakdown_of")
    if breakdown is not None and (not isinstance(breakdown, str) or breakdown == name):
        raise where.error("breakdown_of must name another metric (its total)")
    source = {Kind.STATE: "index", Kind.SELF: "exporter", Kind.SUPPLIED: "modelsync"}.get(kind) or families[
        inputs[0].family
    ].source
    resolution, interval = _cadence(raw, kind, where)
    return Metric(
        name,
        scope,
        unit,
        kind,
        help_text.strip(),
        inputs,
        denominators,
        guard,
        quantile,
        combine,
        rollups,
        breakdown,
        where.file,
        source,
        event,
        resolution=resolution,
        interval=interval,
        across=across,
    )


# What ``across`` may combine: a sum of counts (backlogs, deltas, rates); a maximum of anything a model has one
# value of (a ratio's or a quantile's average cannot be summed, and a distribution is already the service's).
_ACROSS_SUM = (Kind.GAUGE, Kind.DELTA, Kind.RATE)
_ACROSS_MAX = (Kind.GAUGE, Kind.GAUGE_RATIO, Kind.DELTA, Kind.RATE, Kind.RATIO, Kind.QUANTILE, Kind.PERCENTILE)


def _across(raw: Mapping[str, Any], scope: Scope, kind: Kind, where: _Where) -> Combine | None:
    """``across``: a task's one value from each of its models' (or GPUs'): their sum or their maximum."""
    if "across" not in raw:
        return None
    across: Combine = _enum(raw, "across", Combine, where)
    if scope is not Scope.TASK:
        raise where.error("across is for scope task (one value per task from each model's or GPU's)")
    allowed = _ACROSS_SUM if across is Combine.SUM else _ACROSS_MAX
    if kind not in allowed:
        raise where.error(f"across = {across!r} takes kinds {', '.join(allowed)}, not {kind}")
    return across


def _cadence(raw: Mapping[str, Any], kind: Kind, where: _Where) -> tuple[int, int | None]:
    """``resolution`` (EMF StorageResolution) and ``interval`` (the metric's own cadence), validated.

    A fast interval is for values computed from source series each window: the exporter's own bookkeeping,
    the index's states and model sync's values keep their program's cadence.
    """
    resolution = raw.get("resolution", STANDARD_RESOLUTION)
    if resolution not in (HIGH_RESOLUTION, STANDARD_RESOLUTION) or isinstance(resolution, bool):
        raise where.error(f"resolution must be {HIGH_RESOLUTION} (high resolution) or {STANDARD_RESOLUTION}")
    interval = raw.get("interval")
    if interval is None:
        return resolution, None
    if not isinstance(interval, int) or isinstance(interval, bool) or interval not in FAST_INTERVALS:
        raise where.error(
            f"interval must be a whole number of seconds that divides 60 and is below it "
            f"({', '.join(map(str, FAST_INTERVALS))}), got {interval!r}"
        )
    if kind in (Kind.STATE, Kind.SELF, Kind.SUPPLIED):
        raise where.error(f"interval is for metrics computed from source series, not kind {kind}")
    return resolution, interval


def _inputs(
    raw: Any, key: str, kind: Kind, scope: Scope, families: Mapping[str, Family], where: _Where, across: bool = False
) -> tuple[Input, ...]:
    if not isinstance(raw, list):
        raise where.error(f"{key} must be a list")
    return tuple(_input(item, key, kind, scope, families, where, across) for item in raw)


def _input(
    item: Any, key: str, kind: Kind, scope: Scope, families: Mapping[str, Family], where: _Where, across: bool
) -> Input:
    spec: dict[str, Any] = {"family": item} if isinstance(item, str) else _table(item, where)
    _no_unknown(spec, INPUT_KEYS, _Where(where.file, f"{where.entry}: {key}"))
    name = spec.get("family")
    if not isinstance(name, str):
        raise where.error(f'{key}: each input needs family = "name"')
    sample = spec.get("sample")
    family = families.get(name)
    if family is None and sample is None:
        for suffix in SUFFIXES:  # "x_sum" written as one name
            parent = families.get(name.removesuffix(suffix)) if name.endswith(suffix) else None
            if parent is not None and parent.type in ("histogram", "summary"):
                family, sample = parent, suffix[1:]
                break
    if family is None:
        raise where.error(f"{key}: unknown family {name!r} (declare it under [families] with its type and labels)")
    if sample is not None:
        if sample not in ("sum", "count") or family.type not in ("histogram", "summary"):
            raise where.error(f"{key}: sample {sample!r}: only 'sum' or 'count' of a histogram or summary")
        sample_name = f"{family.name}_{sample}"
        ftype = "counter"  # _sum and _count are cumulative
    else:
        sample_name, ftype = family.name, family.type
    cumulative = spec.get("cumulative", False)
    if not isinstance(cumulative, bool):
        raise where.error(f"{key}: cumulative must be true or false")
    if cumulative:
        if family.type != "gauge" or sample is not None:
            raise where.error(f"{key}: cumulative is for a gauge family that only grows, not {ftype} {family.name!r}")
        if kind not in (Kind.DELTA, Kind.RATE, Kind.RATIO):
            raise where.error(f"{key}: cumulative is for kinds delta, rate and ratio, not {kind}")
        ftype = "counter"  # a count the source types as a gauge (TensorRT-LLM's iteration_counter)
    allowed = _TYPES_FOR.get(kind, ())
    if ftype not in allowed:
        hint = ' (use sample = "sum" or "count", or kind distribution/percentile)' if ftype == "histogram" else ""
        raise where.error(f"{key}: kind {kind} cannot read {ftype} family {family.name!r}{hint}")
    _check_scope(scope, family, where, across)
    where_label = None
    if ("split" in spec) != ("select" in spec):
        raise where.error(f'{key}: split and select go together (split = "label", select = "value")')
    if "split" in spec:
        label, value = spec["split"], spec["select"]
        if not isinstance(label, str) or not isinstance(value, str):
            raise where.error(f"{key}: split and select must be strings")
        labels = (*family.labels, *(("quantile",) if family.type == "summary" else ()))
        if label not in labels:
            raise where.error(
                f"{key}: family {family.name!r} has no label {label!r} to split on "
                f"(its labels: {', '.join(labels) or 'none'})"
            )
        where_label = (label, value)
    elif kind is Kind.QUANTILE and key == "inputs":
        raise where.error(f'{key}: a quantile selects one: split = "quantile", select = "0.95"')
    scale = spec.get("scale", 1.0)
    if not isinstance(scale, int | float) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise where.error(f"{key}: scale must be a positive number")
    decoupled = spec.get("decoupled")
    if decoupled is not None:
        if not isinstance(decoupled, bool):
            raise where.error(f"{key}: decoupled must be true or false")
        if kind not in HISTOGRAM_KINDS or scope is not Scope.MODEL:
            raise where.error(f"{key}: decoupled is only for the inputs of model-scope distributions and percentiles")
    return Input(sample_name, family.name, float(scale), where_label, decoupled)


_GAUGES = ("gauge", "untyped")
_COUNTERS = ("counter", "untyped")
_TYPES_FOR: dict[Kind, tuple[str, ...]] = {
    Kind.GAUGE: _GAUGES,
    Kind.GAUGE_RATIO: _GAUGES,
    Kind.DELTA: _COUNTERS,
    Kind.RATE: _COUNTERS,
    Kind.RATIO: _COUNTERS,
    Kind.QUANTILE: ("summary",),
    Kind.DISTRIBUTION: ("histogram",),
    Kind.PERCENTILE: ("histogram",),
}


def _check_scope(scope: Scope, family: Family, where: _Where, across: bool = False) -> None:
    labels = set(family.labels)
    if across:  # scope task, one value from each model's or each GPU's
        if not labels & {"model", "gpu_uuid"}:
            raise where.error(f"across combines per-model or per-GPU values; {family.name!r} has neither label")
        return
    if scope is Scope.MODEL and not {"model", "version"} <= labels:
        raise where.error(
            f"scope model needs a family labelled model and version; {family.name!r} has "
            f"{sorted(labels) or 'no labels'} (use scope task for a family without them)"
        )
    if scope is Scope.GPU and "gpu_uuid" not in labels:
        raise where.error(f"scope gpu needs a family labelled gpu_uuid; {family.name!r} is not")
    if scope is Scope.TASK and labels & {"model", "gpu_uuid"}:
        raise where.error(f"scope task cannot read {family.name!r}: it is labelled per model or GPU")


def _rollups(raw: Any, scope: Scope, where: _Where) -> tuple[tuple[str, ...], ...]:
    base = BASE_DIMENSIONS[scope]
    keys = (*base, *EVENT_KEYS.get(scope, ()))
    if not isinstance(raw, list) or not all(isinstance(r, list) and all(isinstance(d, str) for d in r) for r in raw):
        raise where.error('rollups must be a list of dimension lists, e.g. [["model"], []]')
    out: list[tuple[str, ...]] = []
    for r in raw:
        dims = tuple(r)
        if not set(dims) <= set(keys) or len(set(dims)) != len(dims):
            raise where.error(f"rollup {list(dims)} must be a subset of the scope's dimensions {list(keys)}")
        if dims == base or dims in out:
            raise where.error(f"rollup {list(dims)} repeats a dimension set")
        out.append(dims)
    return tuple(out)


def _check_references(out: Loaded) -> None:
    combine: dict[tuple[str, tuple[str, str] | None], tuple[Combine, str]] = {}
    for m in out.metrics.values():
        where = _Where(m.origin, f"metric {m.name!r}")
        for keys in m.rollups:
            undeclared = [
                k for k in keys if k in EVENT_KEYS.get(m.scope, ()) and k != "model" and k not in out.dimensions
            ]
            if undeclared:
                raise where.error(f"rollup {list(keys)}: declare the values of {undeclared[0]!r} under [dimensions]")
        if m.breakdown_of is not None:
            total = out.metrics.get(m.breakdown_of)
            if total is None and m.breakdown_of in out.dropped:  # the file that dropped it is to blame
                parts: dict[str, list[str]] = {}  # origin -> the breakdowns of the dropped total it defines
                for p in out.metrics.values():
                    if p.breakdown_of == m.breakdown_of:
                        parts.setdefault(p.origin, []).append(p.name)
                raise CatalogError(
                    f"{out.dropped[m.breakdown_of]}: drop {m.breakdown_of!r}: it is the total (breakdown_of) of "
                    + "; ".join(f"{', '.join(names)} ({origin})" for origin, names in parts.items())
                    + ": drop those too, or keep it"
                )
            if total is None:
                raise where.error(f"breakdown_of {m.breakdown_of!r}: no such metric")
            if total.scope is not m.scope:
                raise where.error(f"breakdown_of {m.breakdown_of!r}: a total of another scope ({total.scope})")
        for i in (*m.inputs, *m.denominators):  # a guard only asks "did it grow?"
            sample = i.sample if m.kind not in HISTOGRAM_KINDS else f"{i.sample}_bucket"
            other = combine.setdefault((sample, i.where), (m.combine, m.name))
            if other[0] is not m.combine:
                shown = i.describe().split(" x ")[0]
                raise where.error(
                    f"combines {shown!r} by {m.combine} but {other[1]!r} combines it by {other[0]}; "
                    "one series is merged across GPU instances one way"
                )
