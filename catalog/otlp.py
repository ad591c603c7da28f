"""What the OTLP metrics output sends, and the names and labels only the exporter knows (exporter/otlp_output.py
sends them; the render's PromQL alarms query them; ``cost`` prices them):

- a ``self`` or ``state`` metric goes out as a gauge named ``triton_exporter_<snake_case>``;
- a family some metric reads for decoupled models only, or for the others only (Triton's first-response
  histogram: time to first token, or the whole request), carries ``decoupled="true"|"false"`` from the
  model's configuration, which /metrics does not say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .model import Family, Kind, Scope

if TYPE_CHECKING:
    from . import Catalog

SELF_PREFIX = "triton_exporter_"
DECOUPLED = "decoupled"
SCOPE_NAME = "triton-exporter"  # the instrumentation scope of every OTLP metric the exporter sends
# --otlp-semconv's values (the sidecar, ``cost``, the deploy forms' OtlpSemconv): conventions sent beside the scrape
SEMCONVS = ("off", "genai")


@dataclass(frozen=True)
class Plan:
    """What goes out: families (in catalog order) and the exporter's own metrics (EMF name, scope, OTLP name)."""

    families: tuple[Family, ...]
    own: tuple[tuple[str, Scope, str], ...]
    by_kind: frozenset[str] = frozenset()  # families some input reads for decoupled models only, or the others only


def plan(catalog: Catalog) -> Plan:
    """The families some selected metric reads, the selected ``self``/``state`` metrics, and the families whose
    meaning depends on the model being decoupled (Triton's first-response histogram: time to first token, or
    the whole request). The OTLP output sends this; ``cost`` prices it."""
    families: dict[str, Family] = {}
    own = []
    for m in catalog.metrics:
        if m.kind in (Kind.SELF, Kind.STATE):
            own.append((m.name, m.scope, own_name(m.name)))
        for i in m.all_inputs():
            families.setdefault(i.family, catalog.families[i.family])
    return Plan(tuple(families.values()), tuple(own), by_kind(catalog))


def by_kind(catalog: Catalog) -> frozenset[str]:
    """Families a selected metric reads with ``decoupled`` set: their OTLP points carry the ``decoupled`` label."""
    return frozenset(i.family for m in catalog.metrics for i in m.all_inputs() if i.decoupled is not None)


def snake(name: str) -> str:
    """``ModelReady`` -> ``model_ready``, ``GpuUtilization`` -> ``gpu_utilization``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def own_name(metric: str) -> str:
    """``ModelReady`` -> ``triton_exporter_model_ready``."""
    return SELF_PREFIX + snake(metric)
