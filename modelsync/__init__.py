"""Model repository sync: S3 archive -> verified local store -> atomic symlink flip -> Triton load.

``python -m modelsync`` runs the daemon, ``--once`` reconciles once. The
package shares the EMF encoder and sinks (``telemetry``) and reads its
metrics from the catalog's model-sync pack (``catalog``); the exporter never
imports it, and it never imports the exporter.
"""

__version__ = "0.1.0"
