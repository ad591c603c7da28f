"""The output layer: how telemetry is encoded, sent, logged and configured, knowing nothing of Triton.

- :mod:`telemetry.emf`: the CloudWatch EMF encoder (metrics as name, unit, dimension sets);
- :mod:`telemetry.emf_validate`: an independent checker of EMF documents;
- :mod:`telemetry.sinks`: the transports (stdout, TCP, UDP, file) behind one ``Sink`` protocol;
- :mod:`telemetry.logs`: JSON log lines on stderr;
- :mod:`telemetry.settings`: one table of options that builds argparse and reads the environment.

The exporter, model sync and the metric catalog build on it; it imports none of them.
"""

from __future__ import annotations

DISTRIBUTION = "triton-emf-exporter"  # the one installed distribution all packages of this repository ship in


def distribution_version(distribution: str) -> str:
    """The installed distribution's version (``[project].version``): the one source of a package's version."""
    from importlib.metadata import PackageNotFoundError, version  # read on first use: importing stays cheap

    try:
        return version(distribution)
    except PackageNotFoundError:  # a source tree that was never installed (pip install -e . fixes it)
        return "0+unknown"
