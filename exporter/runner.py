"""The schedule: a fixed-rate loop, the ``--once`` debugging view, clean shutdown.

Fixed rate on the monotonic clock: cycle k starts at ``start + k*interval``
whatever the previous cycle cost, so the series does not drift, and a wall
clock jump (NTP) changes neither the schedule nor the windows. A cycle runs
in a worker thread so that SIGTERM is honoured within 2 s even while a
source is stuck in a network call: the main thread waits for the worker
briefly, flushes what was produced and leaves.

Several cadences (the pipeline's ``periods``: the full cycle's, then the fast
metrics' own ``interval``): each keeps its own fixed-rate grid from the same
start, and one scrape serves every cadence due at that instant, so at a
full cycle the fast metrics come with the rest. A cadence whose slot passed
while another scrape ran is served at the next scrape, then back on its grid.

Pipeline state is not thread-safe, so one worker thread, started once,
is the only thread that runs ``Pipeline.cycle``, and the main thread hands it
the next cycle only after the previous one finished. A cycle still running
at shutdown is abandoned, never joined by a second worker: the runner then
runs no further cycle, and the pipeline is closed by that same worker once
the cycle returns (or by the process exit).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from typing import TextIO

from telemetry.logs import get
from telemetry.sinks import Sink, SinkClosed

from .pipeline import CycleResult, Pipeline
from .sources import SourceKind
from .summary import render_summary

log = get("runner")

STOP_GRACE = 1.5  # seconds a running cycle may still finish after SIGTERM
SINK_GRACE = 0.4  # seconds left for the sink to deliver its buffer


_EPSILON = 1e-9  # seconds: two cadences whose slots fall at the same instant are served by one scrape


class _Job:
    def __init__(self, dropped: int, due: frozenset[float] | None) -> None:
        self.dropped = dropped
        self.due = due  # the cadences this scrape serves; None: the pipeline's only cadence
        self.done = threading.Event()
        self.result: CycleResult | BaseException | None = None


class TritonUnreachable(Exception):
    """``--once`` could not read Triton; the message names the URL and the error."""


class RunnerStopped(RuntimeError):
    """This runner runs no further cycle: its run ended (sink and pipeline closed), or a cycle it
    abandoned at shutdown may still be running on its worker."""


class Runner:
    def __init__(
        self,
        pipeline: Pipeline,
        sink: Sink,
        interval: float,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        triton_listens: Callable[[], bool] | None = None,
        startup_wait: float = 0.0,
        triton_address: str = "",
        wait: Callable[[float], object] | None = None,
    ) -> None:
        """``wait(seconds)`` sleeps until the next slot (default: ``stop.wait``; a bench passes a virtual clock's)."""
        self.pipeline = pipeline
        self.triton_listens = triton_listens
        self.startup_wait = startup_wait
        self.triton_address = triton_address  # what triton_listens connects to, for the log lines
        self.sink = sink
        self.interval = interval
        # The pipeline's cadences: its full cycle's first, then the fast metrics' (one without them has one).
        self._pipeline_periods: tuple[float, ...] = getattr(pipeline, "periods", (interval,))
        # What this runner schedules: ``interval``, then the fast cadences shorter than it (a shorter --interval,
        # as in --once or a test, serves every metric at each full cycle).
        self.periods: tuple[float, ...] = (interval, *(p for p in self._pipeline_periods[1:] if p < interval))
        self.stop = stop or threading.Event()
        self.wait = wait or self.stop.wait
        self.clock = clock
        self.cycles = 0
        self.missed = 0
        self._dropped_carry = 0  # EventsDropped not yet reported (a failed cycle must not lose it)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()  # None: no more cycles, the worker ends
        self._worker: threading.Thread | None = None
        self._abandoned = False  # a cycle was left running at shutdown
        self._ran = False

    def _cycle(self, due: frozenset[float] | None = None) -> CycleResult | None:
        """Run one cycle on the worker thread; None when stopped before it finished (the cycle is abandoned).

        ``due``: the cadences this scrape serves (None: the only one). Only a full cycle reports EventsDropped,
        so only a full cycle takes the sink's count.
        """
        if self._abandoned:
            raise RunnerStopped("a cycle abandoned at shutdown may still be running; this runner runs no other")
        full = due is None or self.periods[0] in due
        dropped = self._dropped_carry + (self.sink.take_dropped() if full else 0)
        self._dropped_carry = dropped  # kept for the next cycle unless this one reports it
        job = _Job(dropped if full else 0, None if due is None else self._for_pipeline(due))
        if self._worker is None:  # the worker never ends on its own: it hands every exception over
            self._worker = threading.Thread(target=self._work, name="cycle", daemon=True)
            self._worker.start()
        self._jobs.put(job)
        while not job.done.wait(0.05):
            if self.stop.is_set():
                job.done.wait(STOP_GRACE)
                break
        if not job.done.is_set():
            log.warning("stopped during a cycle; that cycle's data is dropped")
            self._abandoned = True  # the worker is still in it (daemon): no second worker, no further cycle
            return None
        if isinstance(job.result, BaseException):
            raise job.result
        if full:
            self._dropped_carry = 0
        return job.result

    def _for_pipeline(self, due: frozenset[float]) -> frozenset[float]:
        """The pipeline's cadences a scrape serves: at a full cycle, its full cycle's and every fast cadence this
        runner does not schedule itself, with the scheduled ones that are due; between, the fast ones due."""
        if self.periods[0] not in due:
            return due
        scheduled = set(self.periods[1:])
        return frozenset(p for i, p in enumerate(self._pipeline_periods) if i == 0 or p not in scheduled or p in due)

    def _work(self) -> None:
        """One long-lived worker: a fresh thread per cycle would get a fresh malloc arena each time."""
        while True:
            job = self._jobs.get()
            if job is None:
                if self._abandoned:  # the abandoned cycle has returned: close on this thread, never beside it
                    self.pipeline.close()
                return
            try:
                if job.due is None:
                    job.result = self.pipeline.cycle(events_dropped=job.dropped)
                else:
                    job.result = self.pipeline.cycle(events_dropped=job.dropped, due=job.due)
            except BaseException as exc:  # handed to the main thread
                job.result = exc
            job.done.set()

    def _wait_for_triton(self) -> None:
        """Hold the first scrape until Triton listens (or ``startup_wait`` passed): started beside Triton, the
        sidecar would otherwise report it down while it loads its models, which is not a fault."""
        if self.triton_listens is None or self.startup_wait <= 0:
            return
        began = self.clock()
        where = {"url": self.triton_address} if self.triton_address else {}
        waiting = False
        while not self.stop.is_set():
            if self.triton_listens():
                waited = round(self.clock() - began, 1)
                log.info(
                    f"Triton answered after {waited:g}s; first scrape" if waiting else "Triton listens; first scrape",
                    extra={"fields": {**where, "waited_s": waited}},
                )
                return
            if self.clock() - began >= self.startup_wait:
                log.warning(
                    "Triton does not listen after %.0fs; scraping anyway (it is reported down)",
                    self.startup_wait,
                    extra={"fields": {**where, "waited_s": round(self.clock() - began, 1)}},
                )
                return
            if not waiting:  # said once: a silent sidecar for up to --startup-wait looks hung
                waiting = True
                log.info(
                    "waiting up to %.0fs for Triton to listen%s before the first scrape (--startup-wait; Triton "
                    "opens its ports once its models are loaded)",
                    self.startup_wait,
                    f" on {self.triton_address}" if self.triton_address else "",
                    extra={"fields": {**where, "startup_wait_s": self.startup_wait}},
                )
            self.stop.wait(1.0)

    def run(self) -> None:
        """Loop until ``stop`` is set. Raises SinkClosed if the output goes away for good.

        A runner runs once: a second call raises RunnerStopped.
        """
        if self._ran:
            raise RunnerStopped("this runner already ran: its sink and pipeline are closed")
        self._ran = True
        fields: dict[str, object] = {"interval_s": self.interval}
        if len(self.periods) > 1:
            fields["fast_intervals_s"] = list(self.periods[1:])
        log.info("exporter started", extra={"fields": fields})
        try:
            self._wait_for_triton()
            start = self.clock()
            slots = [0] * len(self.periods)  # per cadence, the index of its next scheduled scrape
            while not self.stop.is_set():
                at = min(n * p for n, p in zip(slots, self.periods, strict=True))
                self.wait(max(0.0, start + at - self.clock()))
                if self.stop.is_set():
                    break
                due = frozenset(p for n, p in zip(slots, self.periods, strict=True) if n * p <= at + _EPSILON)
                try:
                    result = self._cycle(due if len(self.periods) > 1 else None)
                except SinkClosed:
                    raise
                except Exception:  # a bug in one cycle must not end the sidecar
                    log.exception("cycle failed; continuing on schedule")
                    result = None
                if result is not None:
                    self.cycles += 1
                    self.sink.send(result.events)
                    result = None  # not held through the wait and the next cycle's peak (megabytes at 1000 models)
                if self.stop.is_set() or self._abandoned:
                    break
                elapsed = self.clock() - start
                for i, period in enumerate(self.periods):
                    if period not in due:
                        continue
                    nxt = max(slots[i] + 1, math.ceil(elapsed / period))
                    skipped = nxt - slots[i] - 1
                    if skipped:
                        if i == 0:
                            self.missed += skipped
                        log.warning(
                            "cycle overran the interval; %d scheduled scrapes skipped", skipped,
                            extra={"fields": {"interval_s": period}},
                        )  # fmt: skip
                    slots[i] = nxt
        finally:
            self.sink.close(SINK_GRACE)
            if not self._abandoned:
                self.pipeline.close()
            if self._worker is not None:
                self._jobs.put(None)  # the worker ends; after an abandoned cycle, once it returns, closing the pipeline
            log.info("exporter stopped", extra={"fields": {"cycles": self.cycles}})


def run_once(
    pipeline: Pipeline, sink: Sink, interval: float, stderr: TextIO, sleep: Callable[[float], None] = time.sleep
) -> CycleResult:
    """Scrape twice ``interval`` apart, send the window's events, write the summary table."""
    try:
        first = pipeline.cycle()
        _require_triton(first)
        del first  # the baseline window: not held through the second cycle's peak
        sleep(interval)
        second = pipeline.cycle()
        _require_triton(second)
        sink.send(second.events)
        stderr.write(render_summary(second))
        stderr.flush()
        return second
    finally:
        sink.close(SINK_GRACE)
        pipeline.close()


def _require_triton(result: CycleResult) -> None:
    failed = [s for s in result.statuses if s.kind is SourceKind.TRITON and not s.up]
    if failed:
        raise TritonUnreachable("; ".join(s.error for s in failed))
