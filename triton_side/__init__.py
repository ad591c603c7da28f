"""The Triton container's own commands: the start-up self-check and the deep health probe.

A separate deployable from the sidecar: standard library only, Python 3.8+,
copied into the Triton image as one folder (``COPY triton_side/ /opt/triton-health/``)
and run there as plain scripts (``python3 /opt/triton-health/health.py``). The
sidecar's wheel carries it too, for ``python -m exporter health``.
"""
