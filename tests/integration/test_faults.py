"""Faults the sidecar survives: the loop keeps its schedule and the numbers stay right.

Loop-level: a real :class:`Runner` (the code ``python -m exporter`` runs) with a
file or TCP sink, against private real Triton servers (``triton_factory``) that
these tests stop, restart, freeze and churn; or ``python -m exporter`` itself
where the process matters (EPIPE, SIGTERM). Loopback fakes only for what a real
Triton cannot do (a silent or dripping ``/metrics``, an EMF agent).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from demo.payloads import triton_metrics
from exporter import __main__ as exporter_main
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.runner import Runner
from exporter.sources import Collected, SourceKind
from exporter.sources.promtext import Parser
from exporter.sources.triton import TritonIndexSource, TritonMetricsSource
from telemetry.sinks import FileSink, Sink, TcpSink
from tests.support.fakes import LOOPBACK, FakeAgent, FakeHttp, closed_port, drip, respond, silent
from tests.support.helpers import (
    CATALOG,
    Capture,
    IndexSource,
    documents,
    metric_names,
    model_doc,
    pipeline_for,
    task_doc,
)
from tests.support.paths import REPO

ROOT = REPO
FAST = {"timeout": 0.3, "connect_timeout": 0.2}


# --- a Runner in a thread, with its batches recorded ---------------------------------------


class Tap:
    """Forwards to the real sink and keeps every batch (one per cycle) with its arrival time."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.batches: list[tuple[float, list[bytes]]] = []

    def send(self, events: list[bytes]) -> None:
        self.batches.append((time.monotonic(), list(events)))
        self.sink.send(events)

    def take_dropped(self) -> int:
        return self.sink.take_dropped()

    def close(self, timeout: float) -> None:
        self.sink.close(timeout)


class Loop:
    def __init__(self, pipeline: Pipeline, sink: Sink, interval: float, **runner: Any) -> None:
        self.tap = Tap(sink)
        self.stop = threading.Event()
        self.runner = Runner(pipeline, self.tap, interval, self.stop, **runner)
        self.log = Capture()
        self.thread = threading.Thread(target=self.runner.run, name="runner", daemon=True)

    def __enter__(self) -> Loop:
        logging.getLogger("exporter").addHandler(self.log)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        logging.getLogger("exporter").removeHandler(self.log)
        assert not self.thread.is_alive(), "the runner did not stop"

    def cycles(self) -> list[list[dict]]:
        return [documents_of(events) for _, events in list(self.tap.batches)]

    def wait(self, predicate: Callable[[list[dict]], bool], timeout: float) -> list[dict]:
        """Wait for a cycle (after the ones already seen) whose documents satisfy ``predicate``."""
        seen = len(self.tap.batches)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batches = list(self.tap.batches)
            for _, events in batches[seen:]:
                docs = documents_of(events)
                if predicate(docs):
                    return docs
            seen = len(batches)
            time.sleep(0.02)
        raise AssertionError(f"no matching cycle within {timeout}s; last: {self.cycles()[-1:]}")

    def crashes(self) -> list[str]:
        return [m for m in self.log.messages(logging.ERROR) if "cycle failed" in m]


def documents_of(events: list[bytes]) -> list[dict]:
    class R:  # helpers.documents validates every line against the EMF specification
        pass

    r = R()
    r.events = events  # type: ignore[attr-defined]
    return documents(r)  # type: ignore[arg-type]


def up(docs: list[dict]) -> float:
    return task_doc(docs)["TritonUp"]


def add_success(docs: list[dict]) -> float | None:
    found = [d for d in docs if d.get("model") == "add" and d.get("version") == "1"]
    return found[0].get("RequestSuccess") if found else None


def starts(loop: Loop) -> list[float]:
    """When each cycle started: its EMF timestamp (taken at the start, before any source is read)."""
    return [task_doc(docs)["_aws"]["Timestamp"] / 1000 for docs in loop.cycles()]


STALL = 5.0  # far above a late cycle on a loaded machine, far below what a stuck source or sink costs


def assert_on_schedule(loop: Loop, interval: float) -> None:
    """No stall: a source or sink stuck without its deadline holds the loop for its 60 s, or for ever.

    Not a measurement of the rate: on a loaded machine one cycle may start late or skip a slot.
    """
    gaps = [b - a for a, b in itertools.pairwise(starts(loop))]
    assert gaps and all(0 < g < interval + STALL for g in gaps), gaps


def no_negative(cycles: list[list[dict]]) -> None:
    for docs in cycles:
        for doc in docs:
            for name in metric_names(doc):
                assert doc[name] >= 0, (name, doc[name], doc.get("model"))


# --- Triton comes and goes -----------------------------------------------------------------


@pytest.mark.triton
def test_triton_not_up_at_start_then_up(triton_factory, tmp_path):
    server = triton_factory(["add"], start=False)
    pipe = pipeline_for(server, **FAST)
    with Loop(pipe, FileSink(str(tmp_path / "emf.log")), 0.5) as loop:
        loop.wait(lambda d: up(d) == 0, 3)
        loop.wait(lambda d: up(d) == 0, 3)  # still trying, on schedule
        server.start()
        loop.wait(lambda d: up(d) == 1, 10)
        server.infer_add(3)
        loop.wait(lambda d: add_success(d) is not None, 5)
        time.sleep(0.6)
    cycles = loop.cycles()
    assert [up(c) for c in cycles].index(1) >= 2
    assert sum(add_success(c) or 0 for c in cycles) == 3  # exactly the traffic sent after it came up
    no_negative(cycles)
    assert not loop.crashes()
    heartbeats = [line for line in (tmp_path / "emf.log").read_bytes().splitlines() if b"ExporterHeartbeat" in line]
    assert len(heartbeats) == len(cycles)  # every cycle reached the file, including the Triton-down ones


@pytest.mark.triton
def test_the_first_record_waits_for_triton_to_listen(triton_factory, tmp_path):
    """Started with Triton (dependsOn START), the sidecar's first scrape waits until Triton listens, which it
    does only once its models are loaded: no record says a starting Triton is down. The same loop without
    the wait (test_triton_not_up_at_start_then_up) records TritonUp 0 first."""
    server = triton_factory(["add"], start=False)
    pipe = pipeline_for(server, **FAST)
    listens = partial(exporter_main.listens, server.metrics_url, 0.2)
    assert not listens()
    with Loop(pipe, FileSink(str(tmp_path / "emf.log")), 0.5, triton_listens=listens, startup_wait=60) as loop:
        time.sleep(2.0)
        assert loop.cycles() == []  # nothing recorded while Triton is not there
        server.start()
        loop.wait(lambda d: up(d) == 1, 15)
    cycles = loop.cycles()
    assert cycles and all(up(c) == 1 for c in cycles)


@pytest.mark.triton
def test_a_triton_that_never_listens_is_reported_down_after_the_wait(triton_factory, tmp_path):
    server = triton_factory(["add"], start=False)
    pipe = pipeline_for(server, **FAST)
    listens = partial(exporter_main.listens, server.metrics_url, 0.2)
    with Loop(pipe, FileSink(str(tmp_path / "emf.log")), 0.5, triton_listens=listens, startup_wait=1.5) as loop:
        loop.wait(lambda d: up(d) == 0, 10)
    assert any("does not listen after 2s" in m for m in loop.log.messages())


class Gate:
    """Wraps a source; when armed, the next collect waits for ``release`` (the test acts meanwhile)."""

    def __init__(self, source) -> None:
        self.source = source
        self.name = source.name
        self.kind = source.kind
        self.armed = False
        self.waiting = threading.Event()
        self.release = threading.Event()

    def collect(self, timeout: float) -> Collected:
        if self.armed:
            self.armed = False
            self.waiting.set()
            self.release.wait(60)
        return self.source.collect(timeout)

    def close(self) -> None:
        self.source.close()


@pytest.mark.triton
def test_triton_restart_between_two_scrapes_in_the_loop(triton_factory, tmp_path):
    server = triton_factory(["add"])
    pipe = pipeline_for(server, **FAST)
    gates = [Gate(s) for s in pipe.sources]  # the sources are read concurrently: hold both
    pipe.sources[:] = gates
    with Loop(pipe, FileSink(str(tmp_path / "emf.log")), 0.5) as loop:
        loop.wait(lambda d: add_success(d) == 0, 5)
        server.infer_add(5)
        loop.wait(lambda d: (add_success(d) or 0) > 0, 5)
        loop.wait(lambda d: add_success(d) == 0, 5)  # all 5 were counted
        for gate in gates:
            gate.armed = True
        assert all(gate.waiting.wait(5) for gate in gates)  # the loop is between two scrapes of a live Triton ...
        server.restart()  # ... which restarts: every counter starts again at 0
        server.infer_add(2)  # 2 < 5: a reset, neither -3 nor +2
        for gate in gates:
            gate.release.set()
        reset = loop.wait(lambda d: task_doc(d)["CounterResets"] > 0, 5)
        start = len(loop.cycles())
        server.infer_add(3)
        # Triton counts a request just after its response: a scrape can see 2 of the 3 and the next the third.
        deadline = time.monotonic() + 5
        while sum(add_success(c) or 0 for c in loop.cycles()[start:]) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    cycles = loop.cycles()
    no_negative(cycles)
    assert up(reset) == 1 and task_doc(reset)["CounterResets"] == 1
    assert "RequestSuccess" not in model_doc(reset, "add")
    assert sum(add_success(c) or 0 for c in cycles[start:]) == 3  # the intervals after the reset are right
    assert sum(add_success(c) or 0 for c in cycles) == 5 + 3
    assert max(add_success(c) or 0 for c in cycles) <= 5  # never inflated
    assert sum(task_doc(c)["CounterResets"] for c in cycles) == 1
    assert not loop.crashes()


@pytest.mark.triton
def test_model_churn_releases_state_of_vanished_series(triton_factory):
    server = triton_factory(["add", "slow", "text"])
    pipe = pipeline_for(server, **FAST)
    pipe.cycle()
    full = pipe.state.size()
    sizes = []
    plan = [
        ("unload", "slow"),
        ("unload", "text"),
        ("load", "slow"),
        ("unload", "add"),
        ("load", "text"),
        ("load", "add"),
        ("unload", "slow"),
        ("unload", "text"),
    ]
    for action, model in plan:
        assert getattr(server, action)(model) == 200
        result = pipe.cycle()
        documents(result)
        sizes.append(pipe.state.size())
        loaded = {v["name"] for v in server.index() if v.get("state") == "READY"}
        emitted = {d["model"] for d in documents(result) if "RequestSuccess" in d}
        assert emitted <= loaded, (action, model, emitted, loaded)
    assert max(sizes) <= full
    assert sizes[-1] < full  # only "add" left loaded: the others' baselines are gone
    server.infer_add(2)
    assert model_doc(documents(pipe.cycle()), "add")["RequestSuccess"] == 2


class StepSource:
    """Triton-shaped /metrics whose model set and counters change every call (synthetic churn)."""

    name = "triton_metrics"

    kind = SourceKind.TRITON

    def __init__(self, models: Callable[[int], list[str]], summaries: bool = True) -> None:
        self.models = models
        self.summaries = summaries
        self.parser = Parser(CATALOG.wanted_samples())
        self.calls = 0

    def collect(self, timeout: float) -> Collected:
        self.calls += 1
        return Collected(
            samples=self.parser.parse(triton_metrics(self.models(self.calls), self.calls, summaries=self.summaries))
        )

    def close(self) -> None:
        pass


def test_synthetic_churn_over_many_cycles_keeps_state_bounded():
    # 40 models live at a time, 5 replaced every cycle: 1,000 distinct names over 200 cycles.
    def live(k: int) -> list[str]:
        return [f"m{i}" for i in range(5 * k, 5 * k + 40)]

    pipe = Pipeline(Settings(nvml="off"), CATALOG, [StepSource(live, summaries=False), IndexSource()])
    sizes = []
    for _ in range(200):
        result = pipe.cycle()
        sizes.append(pipe.state.size())
    assert max(sizes) <= 40 * 13 and sizes[-1] == sizes[1]
    docs = documents(result)
    assert sum(1 for d in docs if d.get("RequestSuccess") == 9) == 35  # the 5 newcomers are baselines


# --- /metrics that hangs -------------------------------------------------------------------


def hung_pipeline(behaviour, **overrides) -> tuple[Pipeline, FakeHttp, FakeHttp]:
    metrics = FakeHttp(behaviour)
    index = FakeHttp(respond(b'[{"name":"a","version":"1","state":"READY"}]', content_type="application/json"))
    settings = replace(Settings(nvml="off", metrics_url=metrics.url + "/metrics", triton_url=index.url), **overrides)
    sources = [
        TritonMetricsSource(
            settings.metrics_url, Parser(CATALOG.wanted_samples()), settings.connect_timeout, settings.max_body_bytes
        ),
        TritonIndexSource(settings.triton_url, settings.connect_timeout, settings.max_body_bytes),
    ]
    return Pipeline(settings, CATALOG, sources), metrics, index


@pytest.mark.parametrize(
    "behaviour, reason",
    [
        (silent, "no answer within 0.4s"),
        (drip(triton_metrics(["a"], 1).encode(), every=0.05), "body not complete within 0.4s"),
    ],
    ids=["silent", "byte-per-tick"],
)
def test_metrics_that_never_answers_or_drips_ends_the_cycle_on_time(behaviour, reason, tmp_path):
    pipe, metrics, index = hung_pipeline(behaviour, timeout=0.4, connect_timeout=0.2)
    try:
        with Loop(pipe, FileSink(str(tmp_path / "emf.log")), 0.6) as loop:
            assert wait_until(lambda: len(loop.tap.batches) >= 4, 60)  # 4 x 60 s without the deadline
        assert_on_schedule(loop, 0.6)
        for docs in loop.cycles():
            task = task_doc(docs)
            assert task["TritonUp"] == 0
            source = {d["source"]: d for d in docs if "SourceUp" in d}
            assert source["triton_metrics"]["SourceUp"] == 0 and source["triton_index"]["SourceUp"] == 1
            # It waited out the 0.4 s deadline and was cut there: not the silent server's 60 s, not for ever.
            assert 350 <= source["triton_metrics"]["SourceDuration"] < STALL * 1000
        assert any(reason in m for m in loop.log.messages(logging.WARNING)), loop.log.messages()
        if behaviour is not silent:
            assert 0 < metrics.bytes_sent < 1000  # it was really dripping, and was cut off
    finally:
        metrics.close()
        index.close()


@pytest.mark.triton
def test_triton_frozen_with_sigstop_then_continued(triton_factory, tmp_path):
    server = triton_factory(["add"])
    pipe = pipeline_for(server, timeout=0.25, connect_timeout=0.2)
    try:
        with Loop(pipe, FileSink(str(tmp_path / "emf.log")), 0.7) as loop:
            loop.wait(lambda d: add_success(d) == 0, 5)
            server.freeze()
            frozen = [loop.wait(lambda d: up(d) == 0, 3) for _ in range(3)]
            server.thaw()
            loop.wait(lambda d: up(d) == 1, 5)
            server.infer_add(4)
            after = loop.wait(lambda d: (add_success(d) or 0) > 0, 5)
            time.sleep(0.1)
        for docs in frozen:
            assert {d["source"]: d["SourceUp"] for d in docs if "SourceUp" in d} == {
                "triton_metrics": 0,
                "triton_index": 0,
            }
        assert add_success(after) == 4
        assert_on_schedule(loop, 0.7)  # the freeze did not stall the schedule
        no_negative(loop.cycles())
        assert not loop.crashes()
    finally:
        server.thaw()


# --- the EMF agent goes away ----------------------------------------------------------------


@pytest.mark.slow
def test_agent_outage_of_12_cycles_loses_no_interval_and_delivers_in_order():
    """Stands in for a 60 s outage at interval 60 (see docs/reliability.md for the arithmetic)."""
    names = [f"model_{i:03d}" for i in range(100)]
    settings = Settings(nvml="off")  # default --buffer-events
    pipe = Pipeline(settings, CATALOG, [StepSource(lambda k: names), IndexSource()])
    port = closed_port()
    sink = TcpSink(LOOPBACK, port, settings.buffer_events, connect_timeout=0.2)
    agent = None
    try:
        with Loop(pipe, sink, 0.2) as loop:
            deadline = time.monotonic() + 10
            while len(loop.tap.batches) < 12 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sink.delivered == 0 and sink.pending() >= 12 * 100
            agent = FakeAgent(port=port)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                sent = sum(len(b) for _, b in loop.tap.batches)
                if len(agent.lines) >= sent and len(loop.tap.batches) >= 16:
                    break
                time.sleep(0.05)
            loop.stop.set()
        sent = [e for _, batch in loop.tap.batches for e in batch]
        assert agent.lines == sent  # every event of every cycle, in order, nothing lost or repeated
        docs = [orjson.loads(line) for line in agent.lines]
        beats = [d for d in docs if "ExporterHeartbeat" in d]
        assert len(beats) == len(loop.tap.batches) >= 16
        stamps = [d["_aws"]["Timestamp"] for d in beats]
        assert stamps == sorted(stamps)
        assert all(b["EventsDropped"] == 0 for b in beats)
        windows = [
            [d for d in docs if d.get("model") == "model_000" and d["_aws"]["Timestamp"] == ts] for ts in stamps[1:]
        ]
        assert all(len(w) == 1 and w[0]["RequestSuccess"] == 9 for w in windows)  # every interval is there
        assert loop.runner.missed == 0
    finally:
        if agent is not None:
            agent.close()


def test_agent_refusing_with_a_small_buffer_counts_drops_in_the_task_event(tmp_path):
    pipe = Pipeline(Settings(nvml="off"), CATALOG, [StepSource(lambda k: [f"m{i}" for i in range(20)]), IndexSource()])
    sink = TcpSink(LOOPBACK, closed_port(), capacity=10, connect_timeout=0.1)
    with Loop(pipe, sink, 0.2) as loop:
        assert wait_until(lambda: len(loop.tap.batches) >= 5, 60)
    cycles = loop.cycles()
    per_cycle = len(loop.tap.batches[0][1])
    assert per_cycle > 10
    dropped = [task_doc(c)["EventsDropped"] for c in cycles]
    assert dropped[0] == 0 and all(d == per_cycle for d in dropped[2:]), dropped  # each full batch evicts one
    assert_on_schedule(loop, 0.2)


def _exporter(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "exporter", "--nvml", "off", *args],
        cwd=ROOT,
        stdout=kw.pop("stdout", subprocess.DEVNULL),
        stderr=subprocess.PIPE,
        **kw,
    )


def test_stdout_closed_by_the_reader_gives_a_clear_message_and_a_clean_exit():
    with (
        FakeHttp(respond(triton_metrics(["a"], 1).encode())) as metrics,
        FakeHttp(respond(b"[]", content_type="application/json")) as index,
    ):
        proc = _exporter(
            "--interval",
            "0.3",
            "--triton-metrics-url",
            metrics.url + "/metrics",
            "--triton-url",
            index.url,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b'{"_aws"')
        proc.stdout.close()  # the reader goes away
        rc = proc.wait(10)
        err = proc.stderr.read().decode()
    assert rc == 1
    assert "Traceback" not in err
    lines = [orjson.loads(line) for line in err.splitlines()]
    assert any("stdout was closed by its reader (EPIPE); stopping" in line["msg"] for line in lines), err
    assert sum("EPIPE" in line["msg"] for line in lines) == 1  # once, not a loop


def wait_until(check, timeout: float) -> bool:
    """Poll ``check`` until true or ``timeout`` seconds pass (a deadline for slow machines, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def own_connections(pid: int) -> list[tuple[int, int]]:
    """(remote port, bytes in the send queue) of each established TCP connection process ``pid`` holds."""
    mine = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target[8:-1])
    found = []
    for row in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        cols = row.split()
        if cols[3] == "01" and cols[9] in mine:
            found.append((int(cols[2].split(":")[1], 16), int(cols[4].split(":")[0], 16)))
    return found


def connected(pid: int, ports: tuple[int, ...]) -> bool:
    """Whether process ``pid`` holds an established TCP connection to one of ``ports``."""
    return any(port in ports for port, _ in own_connections(pid))


def sender_stuck(pid: int, port: int, metrics: FakeHttp) -> bool:
    """The exporter's connection to ``port`` has bytes queued that did not move while it ran 3 more cycles."""

    def queued() -> int:
        return max((q for p, q in own_connections(pid) if p == port), default=0)

    before, cycles = queued(), len(metrics.requests)
    if not before or not wait_until(lambda: len(metrics.requests) >= cycles + 3, 30):
        return False
    return queued() == before


@pytest.mark.triton
def test_sigterm_while_a_cycle_is_stuck_on_frozen_triton_exits_within_2s(triton_factory, tmp_path):
    server = triton_factory(["add"])
    server.freeze()
    try:
        proc = _exporter(
            "--interval",
            "120",
            "--timeout",
            "60",
            "--output",
            f"file:{tmp_path / 'emf.log'}",
            "--triton-metrics-url",
            server.metrics_url,
            "--triton-url",
            server.url,
        )
        assert proc.stderr is not None
        assert b"exporter started" in proc.stderr.readline()
        # Inside the first cycle's requests, which cannot finish for 60 s: connected to the frozen Triton.
        ports = (server.http_port, server.metrics_port)
        assert wait_until(lambda: connected(proc.pid, ports), 30), "the cycle never reached the frozen Triton"
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(90)
        took = time.monotonic() - start
        err = proc.stderr.read().decode()
    finally:
        server.thaw()
        if proc.poll() is None:
            proc.kill()
    assert took < 20, took  # not the 60 s the stuck cycle would take
    assert rc == 0, err
    assert "stopped during a cycle; that cycle's data is dropped" in err
    assert "Traceback" not in err


def test_sigterm_with_a_stuck_agent_exits_within_2s_counting_the_undelivered():
    with (
        FakeHttp(respond(triton_metrics(300, 1).encode())) as metrics,
        FakeHttp(respond(b"[]", content_type="application/json")) as index,
    ):
        agent = FakeAgent(mode="never_read")
        try:
            proc = _exporter(
                "--interval",
                "0.15",
                "--timeout",
                "0.1",
                "--output",
                f"tcp://{LOOPBACK}:{agent.port}",
                "--triton-metrics-url",
                metrics.url + "/metrics",
                "--triton-url",
                index.url,
            )
            # Cycles of ~300 events (~30 KB) until the socket buffers are full and the sender stuck in a send
            # (a fixed sleep was sometimes too short under load: nothing was left undelivered to count).
            assert wait_until(lambda: sender_stuck(proc.pid, agent.port, metrics), 120), "the sender never stuck"
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(60)
            took = time.monotonic() - start
            err = proc.stderr.read().decode()
        finally:
            agent.close()
            if proc.poll() is None:
                proc.kill()
    # A bound against a hang, not a measurement: that close() gives up on a stuck sender within its own
    # timeout is timed in tests/unit/telemetry/test_sinks.py against a send stuck for a minute.
    assert took < 20, took
    assert rc == 0, err
    assert "tcp sink closed with" in err and "events undelivered" in err


# --- clocks ---------------------------------------------------------------------------------


def test_wall_clock_jumps_change_timestamps_but_not_windows():
    mono = iter(range(1000, 10_000, 60))
    walls = iter([1_700_000_000.0, 1_700_000_060.0 + 3600, 1_700_000_120.0 - 3600, 1_700_000_180.0])
    now_mono, now_wall = [0.0], [0.0]

    def clock() -> float:
        return now_mono[0]

    def wall() -> float:
        return now_wall[0]

    pipe = Pipeline(Settings(nvml="off"), CATALOG, [StepSource(lambda k: ["a"]), IndexSource()], clock=clock, wall=wall)
    results = []
    for _ in range(4):
        now_mono[0], now_wall[0] = float(next(mono)), next(walls)
        results.append(pipe.cycle())
    assert [r.elapsed for r in results] == [None, 60.0, 60.0, 60.0]
    assert [r.timestamp_ms for r in results] == [
        1_700_000_000_000,
        1_700_003_660_000,
        1_699_996_520_000,
        1_700_000_180_000,
    ]
    for r in results[1:]:
        docs = documents_with_time(r)
        a = model_doc(docs, "a")
        assert a["RequestSuccess"] == 9 and a["RequestsPerSecond"] == pytest.approx(9 / 60)
        assert all(d["_aws"]["Timestamp"] == r.timestamp_ms for d in docs)


def documents_with_time(result) -> list[dict]:
    from telemetry.emf_validate import validate

    docs = []
    for raw in result.events:
        assert validate(raw, now_ms=result.timestamp_ms) == []
        docs.append(orjson.loads(raw))
    return docs


def test_wall_clock_jumps_during_a_real_loop(tmp_path):
    offsets = itertools.cycle([0.0, 3600.0, -3600.0, 0.0, -1800.0])
    current = [0.0]

    def wall() -> float:
        return time.time() + current[0]

    class Jumping(StepSource):
        def collect(self, timeout: float) -> Collected:
            current[0] = next(offsets)  # NTP steps the clock between two cycles
            return super().collect(timeout)

    pipe = Pipeline(Settings(nvml="off"), CATALOG, [Jumping(lambda k: ["a"]), IndexSource()], wall=wall)
    results = []
    original = pipe.cycle

    def cycle(**kw):
        results.append(original(**kw))
        return results[-1]

    pipe.cycle = cycle  # type: ignore[method-assign]
    with Loop(pipe, FileSink(str(tmp_path / "emf.log")), 0.3):
        assert wait_until(lambda: len(results) >= 6, 60)
    # Windows follow the monotonic clock: the interval (0.3 s, later under load), never the wall clock's
    # steps of an hour or half an hour.
    assert all(0 < r.elapsed < 60 for r in results[1:]), [r.elapsed for r in results]
    stamps = [r.timestamp_ms for r in results]
    assert max(stamps) - min(stamps) > 3_000_000  # the timestamps did follow the wall clock
    for r in results[1:]:
        a = model_doc(documents_with_time(r), "a")
        assert a["RequestsPerSecond"] == pytest.approx(9 / r.elapsed)
        assert a["RequestsPerSecond"] < 60  # not 9 per "-3600 s" or per "3600.3 s"


@pytest.mark.triton
def test_the_exporter_does_not_hold_tritons_graceful_shutdown(triton_factory):
    """An idle keep-alive connection made Triton wait its whole exit timeout before stopping."""
    server = triton_factory(["add"], extra_args=["--exit-timeout-secs=60"])
    pipe = pipeline_for(server, **FAST)
    pipe.cycle()
    pipe.cycle()  # the pipeline stays open, as between two scrapes of the loop
    start = time.monotonic()
    server.stop(timeout=90)
    took = time.monotonic() - start
    log = server.log_text()
    assert "Exit timeout expired" not in log, log[-2000:]  # the cause: Triton did not wait on our connection
    assert took < 20, took  # not the 60 s exit timeout
    pipe.close()


@pytest.mark.triton
def test_frozen_triton_keeps_the_schedule_at_the_default_timeout(triton_factory, tmp_path):
    """Sources are read concurrently: a frozen Triton costs one timeout per cycle, not one per source."""
    server = triton_factory(["add"])
    pipe = pipeline_for(server, timeout=0.5, connect_timeout=1.0)
    try:
        with Loop(pipe, FileSink(str(tmp_path / "emf.log")), 1.0) as loop:
            loop.wait(lambda d: up(d) == 1, 30)
            server.freeze()
            frozen = [loop.wait(lambda d: up(d) == 0, 30) for _ in range(3)]
        assert_on_schedule(loop, 1.0)
        for docs in frozen:
            # Read one after the other, the scrape would enclose both sources' waits (>= their sum).
            durations = [d["SourceDuration"] for d in docs if d.get("source") in ("triton_metrics", "triton_index")]
            assert len(durations) == 2 and min(durations) >= 450, durations  # both waited out the deadline
            assert task_doc(docs)["ScrapeDuration"] < sum(durations), (task_doc(docs)["ScrapeDuration"], durations)
    finally:
        server.thaw()
