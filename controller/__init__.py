"""The fleet's one controller (``python -m controller``, one per cluster, its own task role).

Hosts report, the controller decides: an exporter with ``--gpu-fault-action drain`` sends one SQS message per
GPU that turns unhealthy; the controller checks the report against ECS (:mod:`.verify`), decides within
fleet-wide bounds which instance drains and when (:mod:`.drains`), acts through ECS and Auto Scaling
(:mod:`.fleet`), and keeps what it decided in a small JSON state (:mod:`.state`) so a restart resumes. Its
metrics (:mod:`.metrics`) and JSON log lines say what it decided and on what evidence (docs/controller.md).

Stopping it stops decisions only: hosts keep serving, and nothing is lost (unread reports wait in the queue).
"""

from __future__ import annotations

from telemetry import DISTRIBUTION  # the same distribution as the exporter: one version for the image


def __getattr__(name: str) -> str:
    if name == "__version__":  # from the package metadata, read on first use (never a copy here)
        from telemetry import distribution_version

        value = distribution_version(DISTRIBUTION)
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
