"""Triton → CloudWatch EMF sidecar.

Pipeline, one module per concern:

    sources/ (triton, nvml, ecs)  →  catalog + transform  →  emf  →  sinks

``python -m exporter`` runs the loop, ``--once`` prints one window,
``health`` is the stdlib-only probe for the Triton container.

``__version__`` has one source, the package metadata (``[project].version``
in pyproject.toml), read on first use so that importing the package stays
cheap.
"""

from __future__ import annotations


def __getattr__(name: str) -> str:
    if name == "__version__":
        from telemetry import DISTRIBUTION, distribution_version

        value = distribution_version(DISTRIBUTION)
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
