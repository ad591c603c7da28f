"""A task's start, measured as a whole: ``TimeToServe`` and its phases, once per task start.

The model-sync daemon is a container of its own in the Triton task, with ``python -m modelsync`` as its
entrypoint, so a start is counted from **this process's start** as the kernel recorded it (``/proc/self/stat``,
in 10 ms ticks): the container's start give or take the runtime's few milliseconds, the interpreter's start and
the imports included. It ends at the **first moment every model the first complete sync installed is READY in
Triton**. In the ECS task Triton starts only once this daemon is healthy (after that sync) and loads the links at
its own start, so from the end of the first complete sync the daemon asks Triton, every :data:`READY_POLL`
seconds, whether each of those models is READY, for at most :data:`READY_DEADLINE` seconds; past it, one line
names the models that never became READY, and no ``TimeToServe`` is reported.

The phases are wall-clock intervals of the start, never sums over models: installs may run at once, and a sum of
per-model times would exceed the wall clock. Each phase is the **union of its intervals**; where phases overlap
(one model downloading while another is verified), each still counts its own union, so the phases may add up to
more than ``TimeToServe``:

==============  ==================================================================================================
``wait``        ``Store.claim``: waiting while another task of the instance downloads and extracts the same archive
``list``        the S3 listing of each pass until the first complete sync
``download``    the HEAD, the free-space checks and the pinned, hashed GETs (an attempt's ``download`` phase; a
                zip that streams is placed from the same read, unzip.py)
``verify``      the sha256 and the archive's or the manifest's checks (``verify``)
``place``       what is left of the extraction, the commit to the store, the link flip (``extract``, ``swap``)
``load``        the daemon's own Triton load calls (none in the ECS task: Triton is not running yet)
``first_ready`` from the end of the first complete sync to every synced model READY: in the ECS task the wait
                for the health check to pass, Triton's start and its loads
==============  ==================================================================================================

``outside_phases_s`` is the time no phase covers: the interpreter's start and imports, the set-up and the
recovery, the waits between the passes of a first sync that had to be retried.

Reported once, by the daemon whose start it is: one JSON log line (``task start: serving N models after T s``)
and one EMF ``start`` event (catalog/modelsync.toml). A daemon restarted inside a running task (its status file
says the first sync is done) reports nothing: its start is not the task's. ``--once`` reports nothing either.

:class:`Startup` is the arithmetic, fed by hooks (``S3.observe`` and ``Store.observe``, modelsync/spans.py;
``Recorder.watchers``, every attempt with its phases' intervals);
:class:`StartWatch` wires it to the daemon's parts, polls Triton and reports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import SyncError
from .metrics import START_METRICS, Attempt

if TYPE_CHECKING:
    from .reconcile import Report, Syncer

PHASES = ("wait", "list", "download", "verify", "place", "load", "first_ready")
PHASE_METRICS = dict(zip(PHASES, START_METRICS[1:], strict=True))  # phase -> Start<Phase>Time
ATTEMPT_PHASES = {"download": "download", "verify": "verify", "extract": "place", "swap": "place", "load": "load"}
READY_POLL = 0.25  # seconds between two readiness checks of the models not READY yet
READY_DEADLINE = 1800.0  # seconds after the first sync: past it, the start is reported as never served
_IMPORTED = time.perf_counter()  # the fallback start where /proc cannot tell the process's own


def merged(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals' union as disjoint, sorted intervals (empty and reversed ones dropped)."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the intervals' union: overlapping time counted once."""
    return float(sum(end - start for start, end in merged(spans)))


def process_age(proc: Path = Path("/proc")) -> float | None:
    """Seconds since this process started, from the kernel's record of it; None where /proc cannot say."""
    try:
        stat = (proc / "self" / "stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime (the name may hold spaces)
        uptime = float((proc / "uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Served:
    """One task start, measured: what the JSON line and the EMF event say."""

    time_to_serve: float  # seconds, from the process's start to every synced model READY
    first_sync: float  # seconds, from the process's start to the end of the first complete sync
    phases: dict[str, float]  # phase -> seconds: the union of its intervals
    outside: float  # seconds no phase covers
    models: tuple[str, ...]
    bytes_downloaded: int
    reused: bool  # every artifact installed came from the shared store: no byte downloaded, nothing extracted


class Startup:
    """The start's intervals and totals, fed by hooks until the first complete sync; thread-safe.

    ``began``: the process's start on ``clock`` (``time.perf_counter``, which the attempts' phases use)."""

    def __init__(self, began: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.began = began
        self.clock = clock
        self.synced_at: float | None = None
        self.models: tuple[str, ...] = ()
        self.bytes_downloaded = 0
        self.linked = 0  # installs that linked a directory of the store
        self.extracted = 0  # installs that extracted or placed files themselves
        self._spans: dict[str, list[tuple[float, float]]] = {p: [] for p in PHASES}
        self._lock = threading.Lock()

    # --- the hooks ---------------------------------------------------------------------------

    def observe(self, phase: str, start: float, end: float) -> None:
        """An interval of ``phase`` (an :data:`modelsync.spans.Observe`: the store's wait, S3's list); ignored after
        the first sync."""
        with self._lock:
            if self.synced_at is None and phase in self._spans:
                self._spans[phase].append((max(start, self.began), end))

    def attempt(self, a: Attempt) -> None:
        """A recorded attempt (``Recorder.watchers``): its phases' intervals, its bytes, whether it linked."""
        with self._lock:
            if self.synced_at is not None:
                return
            for name, start, end in a.spans:
                phase = ATTEMPT_PHASES.get(name)
                if phase is not None:
                    self._spans[phase].append((max(start, self.began), end))
            self.bytes_downloaded += a.bytes_downloaded
            self.linked += int(a.reused)
            self.extracted += int(any(name == "extract" for name, _, _ in a.spans))

    def first_sync(self, models: Iterable[str], at: float) -> None:
        """The first complete sync ended at ``at`` with ``models`` installed; nothing more is taken after it."""
        with self._lock:
            if self.synced_at is None:
                self.synced_at, self.models = max(at, self.began), tuple(sorted(models))

    # --- the figures -------------------------------------------------------------------------

    def served(self, at: float) -> Served:
        """The start as it stands with every synced model READY at ``at``."""
        with self._lock:
            synced = self.synced_at if self.synced_at is not None else at
            at = max(at, synced)
            spans = {p: [(s, min(e, at)) for s, e in v] for p, v in self._spans.items()}
            spans["first_ready"] = [(synced, at)]
            phases = {p: round(covered(spans[p]), 3) for p in PHASES}
            everything = covered(s for v in spans.values() for s in v)
            return Served(
                time_to_serve=round(at - self.began, 3),
                first_sync=round(synced - self.began, 3),
                phases=phases,
                outside=round(max(0.0, at - self.began - everything), 3),
                models=self.models,
                bytes_downloaded=self.bytes_downloaded,
                reused=self.linked > 0 and self.bytes_downloaded == 0 and self.extracted == 0,
            )


def metric_values(s: Served) -> dict[str, float]:
    """The ``start`` event's values (catalog/modelsync.toml): every phase, 0 included, one value per start."""
    return {"TimeToServe": s.time_to_serve, **{PHASE_METRICS[p]: s.phases[p] for p in PHASES}}


def fields(s: Served, host: str, since: str) -> dict[str, object]:
    return {
        "time_to_serve_s": s.time_to_serve,
        "first_sync_s": s.first_sync,
        "phases": dict(s.phases),
        "outside_phases_s": s.outside,
        "models": list(s.models),
        "bytes_downloaded": s.bytes_downloaded,
        "reused": s.reused,
        "since": since,
        "host": host,
    }


class StartWatch:
    """Measures this daemon's start: hooks in before the first pass (:meth:`attach`), told of every full pass
    (:meth:`after_pass`); from the first complete sync on, a thread polls Triton until every synced model is
    READY (or the deadline passes, or the daemon stops) and reports once."""

    def __init__(
        self,
        syncer: Syncer,
        startup: Startup,
        log: logging.Logger,
        stop: threading.Event,
        since: str,
        deadline: float = READY_DEADLINE,
        poll: float = READY_POLL,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.syncer = syncer
        self.startup = startup
        self.log = log
        self.stop = stop
        self.since = since
        self.deadline = deadline
        self.poll = poll
        self.wall = wall
        self.thread: threading.Thread | None = None

    @classmethod
    def attach(
        cls,
        syncer: Syncer,
        log: logging.Logger,
        stop: threading.Event,
        deadline: float = READY_DEADLINE,
        poll: float = READY_POLL,
    ) -> StartWatch | None:
        """Hook a new :class:`Startup` into the syncer's S3, store and recorder; None when this daemon's start is
        not a task start (its status file says the repository's first sync is done: a restart in the task)."""
        if not syncer.before_first_sync:
            log.info("not measuring this start: the repository's first sync was done by an earlier run in this task")
            return None
        age = process_age()
        now = time.perf_counter()
        since = "process start" if age is not None else "daemon import (no /proc)"
        startup = Startup(now - age if age is not None else _IMPORTED)
        syncer.s3.observe = startup.observe
        syncer.store.observe = startup.observe
        syncer.recorder.watchers.append(startup.attempt)
        return cls(syncer, startup, log, stop, since, deadline, poll)

    def detach(self) -> None:
        self.syncer.s3.observe = None
        self.syncer.store.observe = None
        with contextlib.suppress(ValueError):
            self.syncer.recorder.watchers.remove(self.startup.attempt)

    def after_pass(self, report: Report) -> None:
        """After a full pass: when it completed the first sync, note what it installed and start waiting."""
        first = self.syncer.status.first_sync
        if self.thread is not None or first is None:
            return
        models = [m for m, o in report.outcomes.items() if o.serving and not o.gone]
        self.startup.first_sync(models, self.startup.clock() - max(0.0, self.wall() - first))
        self.detach()
        self.thread = threading.Thread(target=self._watch, name="task-start", daemon=True)
        self.thread.start()

    def _ready(self, name: str) -> bool:
        """Triton serves what is installed under ``name`` (each model of a bundle); a name nothing is installed
        under any more (removed since) is not waited for."""
        for installer in (self.syncer.models, self.syncer.bundles):
            current = installer.current(name)
            if current is not None:
                try:
                    return installer.ready(current)
                except SyncError:  # Triton not started yet, or restarting
                    return False
        return True

    def _watch(self) -> None:
        try:
            self.watch()
        except Exception:  # the measurement must never take the daemon down
            self.log.exception("measuring the task's start failed")

    def watch(self) -> Served | None:
        """Poll until every synced model is READY; report the start (returned), or say why it is not."""
        startup = self.startup
        assert startup.synced_at is not None
        waiting = list(startup.models)
        deadline = startup.synced_at + self.deadline
        while True:
            waiting = [m for m in waiting if not self._ready(m)]
            now = startup.clock()
            if not waiting:
                return self._report(startup.served(now))
            if now >= deadline:
                self._never(waiting, now)
                return None
            if self.stop.wait(self.poll):
                self.log.info(
                    "task start: stopped %.1f s after the first sync, before every synced model was READY",
                    now - startup.synced_at,
                    extra={"fields": {"not_ready": waiting[:50]}},
                )
                return None

    def _report(self, s: Served) -> Served:
        host = self.syncer.settings.host
        self.log.info(
            "task start: serving %d models after %.1f s",
            len(s.models),
            s.time_to_serve,
            extra={"fields": fields(s, host, self.since)},
        )
        props: dict[str, object] = {
            "models": len(s.models),
            "bytes_downloaded": s.bytes_downloaded,
            "reused": s.reused,
            "first_sync_s": s.first_sync,
            "outside_phases_s": s.outside,
        }
        self.syncer.recorder.start(metric_values(s), props)
        return s

    def _never(self, waiting: list[str], now: float) -> None:
        startup = self.startup
        said = fields(startup.served(now), self.syncer.settings.host, self.since)
        del said["time_to_serve_s"]  # not served: the phases so far, and how long it waited
        self.log.warning(
            "task start: %d of %d synced models never became READY within %g s of the first sync (%s); "
            "no TimeToServe reported",
            len(waiting),
            len(startup.models),
            self.deadline,
            ", ".join(waiting[:10]) + (", ..." if len(waiting) > 10 else ""),
            extra={"fields": {**said, "waited_s": round(now - startup.began, 3), "not_ready": waiting}},
        )
