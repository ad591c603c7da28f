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
    """The installed distribution's version (``[project].version``): the one source of a package's version.

    Read from the first ``<name>-<version>.dist-info/METADATA`` on ``sys.path``, where importlib.metadata
    looks first, without importing importlib.metadata: its imports (zipfile, email, csv, tempfile) were a
    fifth of the sidecar's start-up. Anything else (an egg, a zip) is left to importlib.metadata.
    """
    import os
    import sys

    prefix = distribution.replace("-", "_").replace(".", "_").lower() + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.lower().startswith(prefix) and name.endswith(".dist-info"):
                found = _metadata_version(os.path.join(entry or ".", name, "METADATA"))
                if found:
                    return found
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:  # a source tree that was never installed (pip install -e . fixes it)
        return "0+unknown"


def _metadata_version(path: str) -> str:
    """The ``Version:`` header of a METADATA file (headers end at the first blank line); "" when absent."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break
                if line.startswith("Version:"):
                    return line[len("Version:") :].strip()
    except (OSError, UnicodeDecodeError):
        pass
    return ""
