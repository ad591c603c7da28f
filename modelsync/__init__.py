"""Model repository sync: S3 archive -> verified local store -> atomic symlink flip -> Triton load.

``python -m modelsync`` runs the daemon, ``--once`` reconciles once. The
package shares the EMF encoder and sinks (``telemetry``) and reads its
metrics from the catalog's model-sync pack (``catalog``); the exporter never
imports it, and it never imports the exporter.
"""

from __future__ import annotations

from telemetry import DISTRIBUTION  # the same distribution as the exporter: one version for the image


def __getattr__(name: str) -> str:
    if name == "__version__":  # from the package metadata, read on first use (a copy here went stale)
        from telemetry import distribution_version

        value = distribution_version(DISTRIBUTION)
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
