"""OpenTelemetry's GenAI server metrics, read from the catalog's own latency histograms (``--otlp-semconv genai``;
exporter/otlp_output.py sends them, exporter/coverage.py says why a model gets none; docs/otlp.md).

The spec: OpenTelemetry semantic conventions, docs/gen-ai/gen-ai-metrics.md, "Generative AI model server
metrics" (:data:`SPEC`); status Development. Three histograms in seconds; ``gen_ai.operation.name`` and
``gen_ai.provider.name`` required, ``gen_ai.request.model`` conditionally required. Nothing here names a
Triton family: each GenAI metric reads the inputs of catalog distribution metrics (``TimeToFirstToken``...),
in the catalog's order (the first a model version has wins, as for EMF), and the factor to seconds comes
from that metric's unit and the input's scale. A user catalog that moves a family moves it here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING

from .model import Input, Kind
from .otlp import DECOUPLED

if TYPE_CHECKING:
    from . import Catalog

SPEC = "OpenTelemetry semantic conventions v1.41.0 (gen_ai.provider.name since v1.37.0)"
PROVIDER = "triton"  # gen_ai.provider.name: no registered value fits a self-hosted server; Triton names itself so
OPERATION = "chat"  # gen_ai.operation.name unless the model's configuration declares its own
OPERATION_PARAMETER = "gen_ai.operation.name"  # a string parameter in the model's config.pbtxt; "none": no GenAI
NONE = "none"
VERSION_ATTRIBUTE = "triton.model.version"  # the spec has no model version attribute: ours, namespaced
LLM_BACKENDS = frozenset({"vllm", "tensorrtllm"})  # generative whether they stream or not
UNIT = "s"
_SECONDS = {"Seconds": Fraction(1), "Milliseconds": Fraction(1, 1000), "Microseconds": Fraction(1, 1_000_000)}


@dataclass(frozen=True)
class GenAiMetric:
    """One server metric of the spec: its name, the spec's description, and the catalog metrics it reads."""

    name: str
    description: str
    sources: tuple[str, ...]  # catalog distribution metrics (EMF names), in order: the first present wins


METRICS = (
    GenAiMetric(
        "gen_ai.server.time_to_first_token",
        "Time to generate first token for successful responses.",
        ("TimeToFirstToken",),
    ),
    GenAiMetric(
        "gen_ai.server.time_per_output_token",
        "Time per output token generated after the first token for successful responses.",
        ("InterTokenLatency",),
    ),
    GenAiMetric(
        "gen_ai.server.request.duration",
        "Generative AI server request duration such as time-to-last byte or last output token.",
        ("EndToEndLatency", "RequestLatency"),
    ),
)


@dataclass(frozen=True)
class Source:
    """One histogram a GenAI metric reads: the catalog input, the metric it belongs to, raw value x factor = s."""

    input: Input
    metric: str
    factor: Fraction


@dataclass(frozen=True)
class Planned:
    """A GenAI metric and its sources in the given catalog (none when no source metric is selected)."""

    metric: GenAiMetric
    sources: tuple[Source, ...]


def plan(catalog: Catalog) -> tuple[Planned, ...]:
    """Every GenAI metric with the inputs of its selected source metrics (distributions in a unit of time)."""
    by_name = {m.name: m for m in catalog.metrics}
    out = []
    for g in METRICS:
        sources = []
        for name in g.sources:
            m = by_name.get(name)
            if m is None or m.kind is not Kind.DISTRIBUTION or m.unit not in _SECONDS:
                continue  # not selected, or a user catalog made it something else
            for inp in m.inputs:
                factor = Fraction(str(inp.scale)) * _SECONDS[m.unit]
                sources.append(Source(inp, m.name, factor))
        out.append(Planned(g, tuple(sources)))
    return tuple(out)


def operation(declared: str | None, decoupled: bool, backend: str) -> str | None:
    """``gen_ai.operation.name`` of a model version, None for a model that is not generative.

    Declared in the model's configuration (a ``gen_ai.operation.name`` string parameter; ``none`` opts out),
    else ``chat`` for a streaming (decoupled) model or a vLLM or TensorRT-LLM model: the OpenAI-style chat
    API is what LLMs behind Triton serve most, and Triton's APIs do not say which API a client used.
    """
    if declared is not None and declared.strip():
        value = declared.strip()
        return None if value.lower() == NONE else value
    return OPERATION if decoupled or backend in LLM_BACKENDS else None


def attributes(labels: Mapping[str, str], operation: str) -> dict[str, str]:
    """A GenAI point's attributes from its source series' labels: the spec's three, the model version, and the
    series' other labels (``decoupled`` left out: the operation says it). The OTLP output sends these; ``cost``
    prices them."""
    out = {k: v for k, v in labels.items() if k not in ("model", "version", DECOUPLED)}
    out.update(
        {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": labels.get("model", ""),
            VERSION_ATTRIBUTE: labels.get("version", ""),
        }
    )
    return out


def seconds(value: float, factor: Fraction) -> float:
    """A sum in seconds: one correctly rounded operation (x / 1000, not x * 0.001)."""
    if factor == 1:
        return value
    if factor.numerator == 1:
        return value / factor.denominator
    return value * factor.numerator / factor.denominator


def bound_seconds(bound: float, factor: Fraction) -> float:
    """A bucket bound in seconds, exactly as written: 100 ms -> 0.1, 2.5 ms -> 0.0025 (the nearest doubles)."""
    if factor == 1:
        return bound
    return float(Decimal(repr(bound)) * factor.numerator / factor.denominator)
