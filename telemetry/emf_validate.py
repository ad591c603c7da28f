"""An independent checker for EMF documents: the specification's rules, as code.

Used by the tests on every document the exporter and model sync emit, and available to
users (``python -m exporter validate FILE``) for EMF from anywhere. CloudWatch
itself never reports invalid EMF to the sender (the document is just stored
as a log line), so this is the only place such a bug shows up early.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable
from typing import Any

import orjson

from .emf import (
    CLOUDWATCH_UNITS,
    MAX_DIMENSION_VALUE_LENGTH,
    MAX_DIMENSIONS_PER_SET,
    MAX_EVENT_BYTES,
    MAX_METRICS_PER_DIRECTIVE,
    MAX_NAMESPACE_LENGTH,
)

UNITS = frozenset(CLOUDWATCH_UNITS)
MAX_VALUES_PER_METRIC = 100
MAX_NAME_LENGTH = 1024
MAX_DIMENSION_NAME_LENGTH = 250
NAMESPACE_RE = re.compile(r"^[a-zA-Z0-9._#:/-]+$")
MAX_PAST_MS = 14 * 24 * 3600 * 1000
MAX_FUTURE_MS = 2 * 3600 * 1000


def validate(document: bytes | str | dict[str, Any], now_ms: int | None = None) -> list[str]:
    """Return every rule the document breaks (empty list: valid)."""
    errors: list[str] = []
    if isinstance(document, bytes | str):
        raw = document.encode() if isinstance(document, str) else document
        if len(raw) > MAX_EVENT_BYTES:
            errors.append(f"event is {len(raw)} bytes, over {MAX_EVENT_BYTES}")
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return [f"not JSON: {exc}"]
    if not isinstance(document, dict):
        return ["root is not a JSON object"]
    aws = document.get("_aws")
    if not isinstance(aws, dict):
        return ["missing _aws object at the root"]
    ts = aws.get("Timestamp")
    if not isinstance(ts, int) or isinstance(ts, bool):
        errors.append("_aws.Timestamp must be an integer (ms since epoch)")
    else:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if ts < now - MAX_PAST_MS or ts > now + MAX_FUTURE_MS:
            errors.append(f"_aws.Timestamp {ts} is outside CloudWatch's accepted range")
    directives = aws.get("CloudWatchMetrics")
    if not isinstance(directives, list) or not directives:
        errors.append("_aws.CloudWatchMetrics must be a non-empty array")
        return errors
    resolution: dict[str, int] = {}
    for i, d in enumerate(directives):
        errors += _directive(document, d, f"CloudWatchMetrics[{i}]", resolution)
    return errors


def _directive(doc: dict[str, Any], d: Any, where: str, resolution: dict[str, int]) -> list[str]:
    if not isinstance(d, dict):
        return [f"{where} is not an object"]
    errors: list[str] = []
    ns = d.get("Namespace")
    if not isinstance(ns, str) or not 1 <= len(ns) <= MAX_NAMESPACE_LENGTH or not NAMESPACE_RE.match(ns):
        errors.append(f"{where}.Namespace must be 1-{MAX_NAMESPACE_LENGTH} characters of [a-zA-Z0-9._#:/-]")
    elif ns.startswith("AWS/"):
        errors.append(f"{where}.Namespace must not start with AWS/")
    dims = d.get("Dimensions")
    if not isinstance(dims, list):
        errors.append(f"{where}.Dimensions must be an array of arrays")
        dims = []
    for j, dset in enumerate(dims):
        errors += _dimension_set(doc, dset, f"{where}.Dimensions[{j}]")
    metrics = d.get("Metrics")
    if not isinstance(metrics, list):
        return [*errors, f"{where}.Metrics must be an array"]
    if len(metrics) > MAX_METRICS_PER_DIRECTIVE:
        errors.append(f"{where} has {len(metrics)} metrics, over {MAX_METRICS_PER_DIRECTIVE}")
    seen: set[str] = set()
    for k, m in enumerate(metrics):
        errors += _metric(doc, m, f"{where}.Metrics[{k}]", seen, resolution)
    return errors


def _dimension_set(doc: dict[str, Any], dset: Any, where: str) -> list[str]:
    if not isinstance(dset, list) or not all(isinstance(k, str) for k in dset):
        return [f"{where} must be an array of strings"]
    errors = []
    if len(dset) > MAX_DIMENSIONS_PER_SET:
        errors.append(f"{where} has {len(dset)} keys, over {MAX_DIMENSIONS_PER_SET}")
    if len(set(dset)) != len(dset):
        errors.append(f"{where} repeats a key")
    for key in dset:
        if not key.strip() or len(key) > MAX_DIMENSION_NAME_LENGTH or not key.isascii() or key.startswith(":"):
            errors.append(f"{where}: bad dimension name {key!r}")
        value = doc.get(key)
        if not isinstance(value, str):
            errors.append(f"{where}: dimension {key!r} has no string value at the root")
        elif not value.strip() or len(value) > MAX_DIMENSION_VALUE_LENGTH or not value.isascii():
            errors.append(f"{where}: dimension {key!r} value must be 1-{MAX_DIMENSION_VALUE_LENGTH} ASCII chars")
        elif not value.isprintable():
            errors.append(f"{where}: dimension {key!r} value has control characters")
    return errors


def _metric(doc: dict[str, Any], m: Any, where: str, seen: set[str], resolution: dict[str, int]) -> list[str]:
    if not isinstance(m, dict):
        return [f"{where} is not an object"]
    errors = []
    name = m.get("Name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
        return [f"{where}.Name must be a non-empty string of at most {MAX_NAME_LENGTH} chars"]
    if name in seen:
        errors.append(f"{where}: metric {name} defined twice in one directive")
    seen.add(name)
    unit = m.get("Unit")
    if unit is not None and unit not in UNITS:
        errors.append(f"{where}: unit {unit!r} is not a CloudWatch unit")
    res = m.get("StorageResolution", 60)
    if res not in (1, 60) or isinstance(res, bool):
        errors.append(f"{where}: StorageResolution must be 1 or 60")
    elif resolution.setdefault(name, res) != res:
        errors.append(f"{where}: {name} has two storage resolutions in one event")
    value = doc.get(name)
    if isinstance(value, dict):
        return errors + _distribution(value, f"{where}: {name}")
    values: Iterable[Any] = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not 1 <= len(value) <= MAX_VALUES_PER_METRIC:
        errors.append(f"{where}: {name} array must hold 1-{MAX_VALUES_PER_METRIC} values")
    for v in values:
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            errors.append(f"{where}: {name} value {v!r} is not a finite number")
            break
    return errors


DISTRIBUTION_KEYS = frozenset({"Values", "Counts", "Max", "Min", "Count", "Sum"})


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _distribution(value: dict[str, Any], where: str) -> list[str]:
    """A distribution value object: ``{"Values", "Counts", "Max", "Min", "Count", "Sum"}``.

    CloudWatch treats it as a set of samples (sample count = sum of Counts)
    and computes percentiles from it; the rules are those of the shape the
    OpenTelemetry awsemf exporter sends for histograms.
    """
    missing = sorted(DISTRIBUTION_KEYS - value.keys())
    extra = sorted(value.keys() - DISTRIBUTION_KEYS)
    if missing or extra:
        return [
            f"{where}: distribution needs exactly {sorted(DISTRIBUTION_KEYS)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {extra}" if extra else "")
        ]
    values, counts = value["Values"], value["Counts"]
    if not isinstance(values, list) or not isinstance(counts, list):
        return [f"{where}: Values and Counts must be arrays"]
    errors = []
    if len(values) != len(counts):
        errors.append(f"{where}: {len(values)} Values but {len(counts)} Counts")
    if not 1 <= len(values) <= MAX_VALUES_PER_METRIC:
        errors.append(f"{where}: distribution must hold 1-{MAX_VALUES_PER_METRIC} value/count pairs")
    if not all(_number(v) for v in values):
        errors.append(f"{where}: Values must be finite numbers")
    if not all(_number(c) and c > 0 for c in counts):
        errors.append(f"{where}: Counts must be finite numbers > 0")
    stats = {k: value[k] for k in ("Max", "Min", "Count", "Sum")}
    bad = [k for k, v in stats.items() if not _number(v)]
    if bad:
        return [*errors, f"{where}: {', '.join(bad)} must be finite numbers"]
    if stats["Min"] > stats["Max"]:
        errors.append(f"{where}: Min {stats['Min']} > Max {stats['Max']}")
    if all(_number(c) for c in counts) and not math.isclose(stats["Count"], sum(counts), rel_tol=1e-9, abs_tol=1e-9):
        errors.append(f"{where}: Count {stats['Count']} is not the sum of Counts ({sum(counts)})")
    return errors
