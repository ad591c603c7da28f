"""The OTLP names and labels of what only the exporter knows (exporter/otlp_output.py sends them; the render's
PromQL alarms query them):

- a ``self`` or ``state`` metric goes out as a gauge named ``triton_exporter_<snake_case>``;
- a family some metric reads for decoupled models only, or for the others only (Triton's first-response
  histogram: time to first token, or the whole request), carries ``decoupled="true"|"false"`` from the
  model's configuration, which /metrics does not say.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import Catalog

SELF_PREFIX = "triton_exporter_"
DECOUPLED = "decoupled"


def by_kind(catalog: Catalog) -> frozenset[str]:
    """Families a selected metric reads with ``decoupled`` set: their OTLP points carry the ``decoupled`` label."""
    return frozenset(i.family for m in catalog.metrics for i in m.all_inputs() if i.decoupled is not None)


def snake(name: str) -> str:
    """``ModelReady`` -> ``model_ready``, ``GpuUtilization`` -> ``gpu_utilization``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def own_name(metric: str) -> str:
    """``ModelReady`` -> ``triton_exporter_model_ready``."""
    return SELF_PREFIX + snake(metric)
