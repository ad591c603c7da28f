"""Model repository sync: S3 archive -> verified local store -> atomic symlink flip -> Triton load.

``python -m modelsync`` runs the daemon, ``--once`` reconciles once. The
package shares the exporter's EMF encoder and sinks; the exporter never
imports it, except the dashboard renderer reading :mod:`modelsync.metrics`
(which imports nothing heavy).
"""

__version__ = "0.1.0"
