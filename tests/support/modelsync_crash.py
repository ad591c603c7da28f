"""Run one modelsync reconcile that dies (``os._exit``) right before the link flip.

Used by tests/integration/modelsync/test_modelsync_daemon.py as a subprocess: the real settings
parser and the real parts, with the faulty file system of tests/support/msync.py,
so the process stops after the extraction was committed to the store and
the temporary link was made, exactly where a power cut would hurt most.

    python tests/support/modelsync_crash.py [modelsync settings...]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from modelsync.__main__ import LOGGER, build
from modelsync.settings import load
from telemetry import logs
from tests.support.msync import FaultFileSystem

if __name__ == "__main__":
    settings = load(sys.argv[1:], os.environ)
    app = build(settings, fs=FaultFileSystem(crash_before_flip=True), log=logs.setup("info", name=LOGGER))
    app.syncer.recover()
    app.syncer.reconcile_all()
    sys.exit(3)  # not reached when the flip was attempted
