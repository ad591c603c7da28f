"""Triton → CloudWatch EMF sidecar.

Pipeline, one module per concern:

    sources/ (triton, nvml, ecs)  →  catalog + transform  →  emf  →  sinks

``python -m exporter`` runs the loop, ``--once`` prints one window,
``health`` is the stdlib-only probe for the Triton container.
"""

__version__ = "0.1.0"
