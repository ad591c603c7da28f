"""The OTLP names of what only the exporter knows: a ``self`` or ``state`` metric goes out as a gauge named
``triton_exporter_<snake_case>`` (exporter/otlp_output.py sends it; the render's PromQL alarms query it)."""

from __future__ import annotations

import re

SELF_PREFIX = "triton_exporter_"


def snake(name: str) -> str:
    """``ModelReady`` -> ``model_ready``, ``GpuUtilization`` -> ``gpu_utilization``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def own_name(metric: str) -> str:
    """``ModelReady`` -> ``triton_exporter_model_ready``."""
    return SELF_PREFIX + snake(metric)
