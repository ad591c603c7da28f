"""The daemon's status file, and the container health check that reads it.

    python -m modelsync.health [settings]   exit 0: healthy; 1: not (one line on stderr says why)

In the Triton task, Triton starts only when this container is HEALTHY
(``dependsOn``), so healthy means: this repository has completed its first
sync (every model in S3 installed, or refused for a reason that retrying
cannot fix), and the daemon is alive (its heartbeat is recent). A first
sync that cannot finish (S3 unreachable, disk full) keeps the check failing,
Triton does not start, and the task's ``startTimeout`` ends it: a task never
serves an empty or partial repository because of a sync that did not run.

The file lives in the repository's state directory (beside the repository,
on the task's volume), so a daemon restarted inside the same task finds the
first sync already done and does not hold Triton back again. It is written
atomically; the check reads settings from the same flags and variables as
the daemon, so the task definition passes none.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .fsio import LocalFileSystem, write_json
from .store import state_dir

STATUS = "status.json"
HEARTBEAT_EVERY = 5.0  # seconds between heartbeats of a running daemon
STALE_AFTER = 60.0  # a heartbeat older than this: the daemon is not running (or stuck)
_WRITING = threading.Lock()  # the loop and the heartbeat thread write one file (one temporary name per process)


@dataclass
class Status:
    pid: int = 0
    started: float = 0.0
    heartbeat: float = 0.0
    first_sync: float | None = None  # when this repository's first complete sync ended
    last_reconcile: float | None = None
    note: str = ""  # why the first sync is not complete yet

    @classmethod
    def read(cls, repository: Path) -> Status | None:
        try:
            data = json.loads((state_dir(repository) / STATUS).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        try:
            return cls(**known)
        except TypeError:
            return None

    def write(self, repository: Path) -> None:
        with _WRITING:
            write_json(LocalFileSystem(), state_dir(repository) / STATUS, asdict(self))


def problem(status: Status | None, now: float) -> str | None:
    """Why the daemon is not healthy, or None."""
    if status is None:
        return "no status file yet: the daemon has not started"
    if now - status.heartbeat > STALE_AFTER:
        return f"no heartbeat for {now - status.heartbeat:.0f}s: the daemon is not running"
    if status.first_sync is None:
        return "first sync not complete" + (f": {status.note}" if status.note else "")
    return None


HELP = (
    "The model-sync container's health check: exit 0 when this repository's first sync is complete and the "
    "daemon's heartbeat is recent, 1 (one line on stderr) when not, 2 for an invalid setting. It reads the "
    "daemon's own settings (the same flags and variables) to find the repository; --once and the others it does "
    "not use are accepted and ignored."
)


def main(argv: Sequence[str] | None = None) -> int:
    from .settings import ConfigError, load  # the settings parser is the daemon's own

    try:
        settings = load(
            list(sys.argv[1:] if argv is None else argv),
            os.environ,
            prog="python -m modelsync.health",
            description=HELP,
        )
    except ConfigError as exc:  # exit 2 as every command (ECS counts any non-zero as unhealthy)
        sys.stderr.write(f"unhealthy: invalid setting: {exc}\n")
        return 2
    why = problem(Status.read(settings.repository), time.time())
    if why:
        sys.stderr.write(f"unhealthy: {why}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
