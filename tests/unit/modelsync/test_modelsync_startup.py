"""modelsync/startup.py: a task's start as wall-clock unions of its phases' intervals, reused, the READY deadline."""

from __future__ import annotations

import io
import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from modelsync.errors import TritonUnavailable
from modelsync.fsio import LocalFileSystem
from modelsync.health import Status
from modelsync.metrics import START_METRICS, Attempt, Recorder
from modelsync.reconcile import Outcome, Report
from modelsync.s3 import S3
from modelsync.spans import spanned
from modelsync.startup import PHASES, Startup, StartWatch, covered, merged, metric_values, process_age
from modelsync.store import Store
from telemetry.emf_validate import validate
from telemetry.sinks import StreamSink


def attempt(model: str, *spans: tuple[str, float, float], downloaded: int = 0, reused: bool = False) -> Attempt:
    a = Attempt(model, "ok", bytes_downloaded=downloaded, reused=reused)
    a.spans.extend(spans)
    return a


def test_the_union_of_intervals_counts_overlapping_time_once() -> None:
    assert merged([(5, 6), (1, 3), (2, 4), (4, 4.5), (7, 7), (9, 8)]) == [(1, 4.5), (5, 6)]
    assert covered([(1, 3), (2, 4), (10, 11)]) == pytest.approx(4.0)
    assert covered([]) == 0.0


def test_phases_are_wall_clock_unions_not_sums_over_models() -> None:
    """Two models downloaded at once (1-5 and 2-6 s): the download took 5 s of the start, not 8; extract and swap are
    one phase, place; the phases overlap (b verifies while a extracts) and each keeps its own union."""
    s = Startup(began=0.0)
    s.observe("list", 0.5, 1.0)
    s.attempt(attempt("a", ("download", 1, 5), ("verify", 5, 5.5), ("extract", 5.5, 7), ("swap", 7, 7.1)))
    s.attempt(attempt("b", ("download", 2, 6), ("verify", 6, 6.5), ("extract", 6.5, 7.5), ("swap", 7.5, 7.6)))
    s.observe("wait", 1.0, 2.0)
    s.first_sync(["b", "a"], at=8.0)
    s.observe("list", 9.0, 10.0)  # after the first sync: not the start's
    s.attempt(attempt("c", ("download", 9, 10), ("load", 10, 11)))
    served = s.served(at=12.0)
    assert served.time_to_serve == 12.0 and served.first_sync == 8.0
    assert served.phases == {
        "wait": 1.0,
        "list": 0.5,
        "download": 5.0,
        "verify": 1.0,
        "place": 2.1,
        "load": 0.0,
        "first_ready": 4.0,
    }
    assert sum(served.phases.values()) > 0  # and each phase at most the whole
    assert all(v <= served.time_to_serve for v in served.phases.values())
    # covered by some phase: 0.5-7.6 and 8-12; outside: 0-0.5 (the process's start) and 7.6-8 (the pass's end)
    assert served.outside == pytest.approx(0.9)
    assert served.models == ("a", "b")


def test_intervals_before_the_process_start_are_clipped() -> None:
    s = Startup(began=10.0)
    s.observe("list", 9.0, 11.0)
    s.first_sync([], at=11.0)
    served = s.served(at=11.0)
    assert served.phases["list"] == 1.0 and served.time_to_serve == 1.0 and served.phases["first_ready"] == 0.0


def test_reused_only_when_every_install_linked_the_store_without_a_byte() -> None:
    linked = attempt("a", ("download", 0, 0.1), ("swap", 0.1, 0.2), reused=True)
    s = Startup(0.0)
    s.attempt(linked)
    s.attempt(attempt("b", ("download", 0, 0.1), ("swap", 0.1, 0.2), reused=True))
    s.first_sync(["a", "b"], 1.0)
    assert s.served(1.0).reused is True and s.served(1.0).bytes_downloaded == 0
    s = Startup(0.0)
    s.attempt(linked)
    s.attempt(attempt("b", ("download", 0, 1), ("extract", 1, 2), ("swap", 2, 2.1), downloaded=1000))
    assert s.served(3.0).reused is False and s.served(3.0).bytes_downloaded == 1000
    s = Startup(0.0)  # nothing installed in this start: nothing came from the store either
    assert s.served(1.0).reused is False


def test_every_start_metric_has_a_value_one_per_start() -> None:
    s = Startup(0.0)
    s.first_sync(["a"], 2.0)
    values = metric_values(s.served(3.0))
    assert list(values) == list(START_METRICS) and len(PHASES) == len(START_METRICS) - 1
    assert values["TimeToServe"] == 3.0 and values["StartFirstReadyTime"] == 1.0 and values["StartWaitTime"] == 0.0


def test_spanned_tells_the_interval_whatever_the_block_does() -> None:
    seen: list[tuple[str, float, float]] = []
    with pytest.raises(RuntimeError), spanned(lambda *a: seen.append(a), "list"):
        raise RuntimeError("S3 down")
    assert len(seen) == 1 and seen[0][0] == "list" and seen[0][2] >= seen[0][1]
    with spanned(None, "list"):
        pass  # no measurement under way: nothing to tell


def test_the_store_claim_and_the_listing_are_observed(tmp_path: Path) -> None:
    seen: list[tuple[str, float, float]] = []
    store = Store(tmp_path / "repo", tmp_path / "store", LocalFileSystem())
    store.open()
    try:
        store.observe = lambda *a: seen.append(a)
        with store.claim("a" * 64):
            pass
    finally:
        store.close()

    class Down:
        def get_paginator(self, name: str) -> Any:
            raise OSError("no route")

    s3 = S3(Down(), "bucket", "")
    s3.observe = lambda *a: seen.append(a)
    with pytest.raises(Exception, match="cannot list"):
        s3.list()
    assert [p for p, _, _ in seen] == ["wait", "list"]


def test_process_age_from_the_kernels_record(tmp_path: Path) -> None:
    import os

    tick = os.sysconf("SC_CLK_TCK")
    (tmp_path / "self").mkdir()
    fields = ["S", *["0"] * 18, str(50 * tick)]  # state, ..., starttime (field 22): 50 s after boot
    (tmp_path / "self" / "stat").write_text(f"1234 (python -m (x) y) {' '.join(fields)} 0 0\n")
    (tmp_path / "uptime").write_text("62.50 100.00\n")
    assert process_age(tmp_path) == pytest.approx(12.5)
    assert process_age(tmp_path / "missing") is None
    age = process_age()  # this very process: started before this test, not before the machine
    assert age is not None and 0.0 < age < 7 * 24 * 3600


# --- the watch: READY polled after the first sync, reported once -----------------------------------------------


class FakeInstaller:
    def __init__(self, names: set[str], ready_after: dict[str, int]) -> None:
        self.names = names
        self.ready_after = ready_after  # model -> polls before it answers READY (-1: never; -2: Triton down)
        self.polls: dict[str, int] = {}

    def current(self, name: str) -> Any:
        return SimpleNamespace(name=name) if name in self.names else None

    def ready(self, current: Any) -> bool:
        n = self.polls[current.name] = self.polls.get(current.name, 0) + 1
        after = self.ready_after.get(current.name, 0)
        if after == -2:
            raise TritonUnavailable("Triton at http://localhost:8000 unreachable: connection refused")
        return after >= 0 and n > after


def fake_syncer(buf: io.BytesIO, models: FakeInstaller, first_sync: float | None = None) -> Any:
    return SimpleNamespace(
        before_first_sync=first_sync is None,
        status=Status(first_sync=first_sync),
        s3=SimpleNamespace(observe=None),
        store=SimpleNamespace(observe=None),
        recorder=Recorder("Triton", StreamSink(buf), "host-1"),
        settings=SimpleNamespace(host="host-1"),
        models=models,
        bundles=FakeInstaller(set(), {}),
    )


def report(*served: str) -> Report:
    r = Report()
    for m in served:
        r.outcomes[m] = Outcome(m, False, "installed; Triton is not running yet", serving="a" * 64)
    r.outcomes["refused"] = Outcome.refused("refused", "unsafe", "")  # nothing installed: not waited for
    return r


def fields_of(caplog: pytest.LogCaptureFixture, level: int) -> list[tuple[str, dict[str, Any]]]:
    return [(r.getMessage(), getattr(r, "fields", {})) for r in caplog.records if r.levelno == level]


def test_the_start_is_reported_once_when_every_synced_model_is_ready(caplog: pytest.LogCaptureFixture) -> None:
    buf = io.BytesIO()
    syncer = fake_syncer(buf, FakeInstaller({"a", "b"}, {"a": 0, "b": 3}))
    log = logging.getLogger("modelsync.test-start")
    watch = StartWatch.attach(syncer, log, threading.Event(), poll=0.01)
    assert watch is not None and syncer.s3.observe == watch.startup.observe
    assert syncer.store.observe == watch.startup.observe and syncer.recorder.watchers == [watch.startup.attempt]
    syncer.recorder.attempt(attempt("a", ("download", watch.startup.began + 0.01, watch.startup.began + 0.02)))
    watch.after_pass(report("a"))  # no first sync yet: nothing happens
    assert watch.thread is None
    syncer.status.first_sync = watch.wall()
    with caplog.at_level(logging.INFO, logger=log.name):
        watch.after_pass(report("a", "b"))
        assert watch.thread is not None
        watch.thread.join(10)
        watch.after_pass(report("a", "b"))  # later passes: nothing more
    assert syncer.s3.observe is None and syncer.store.observe is None and syncer.recorder.watchers == []
    assert syncer.models.polls == {"a": 1, "b": 4}  # a READY model is not asked again
    ((msg, f),) = [x for x in fields_of(caplog, logging.INFO) if x[0].startswith("task start")]
    assert msg == f"task start: serving 2 models after {f['time_to_serve_s']:.1f} s"
    assert f["models"] == ["a", "b"] and f["since"] == "process start" and f["host"] == "host-1"
    assert set(f["phases"]) == set(PHASES) and f["phases"]["download"] == pytest.approx(0.01, abs=1e-3)
    assert f["phases"]["first_ready"] >= 0.03 and f["time_to_serve_s"] >= f["first_sync_s"] > 0
    assert f["reused"] is False and f["bytes_downloaded"] == 0
    json.dumps(f)  # one JSON line
    lines = buf.getvalue().splitlines()
    start = [json.loads(line) for line in lines if b"TimeToServe" in line]
    assert len(start) == 1 and all(validate(line) == [] for line in lines)
    assert (
        start[0]["TimeToServe"] == f["time_to_serve_s"]
        and start[0]["StartFirstReadyTime"] == f["phases"]["first_ready"]
    )
    assert start[0]["host"] == "host-1" and start[0]["models"] == 2 and start[0]["reused"] is False


def test_a_model_never_ready_is_named_past_the_deadline_and_no_time_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    buf = io.BytesIO()
    syncer = fake_syncer(buf, FakeInstaller({"a", "stuck", "down"}, {"stuck": -1, "down": -2}))
    log = logging.getLogger("modelsync.test-deadline")
    watch = StartWatch.attach(syncer, log, threading.Event(), deadline=0.1, poll=0.01)
    assert watch is not None
    syncer.status.first_sync = watch.wall()
    watch.startup.first_sync(["a", "down", "stuck"], watch.startup.clock())
    with caplog.at_level(logging.INFO, logger=log.name):
        assert watch.watch() is None
    ((msg, f),) = fields_of(caplog, logging.WARNING)
    assert msg == (
        "task start: 2 of 3 synced models never became READY within 0.1 s of the first sync (down, stuck); "
        "no TimeToServe reported"
    )
    assert f["not_ready"] == ["down", "stuck"] and "time_to_serve_s" not in f and f["waited_s"] >= 0.1
    assert f["phases"]["first_ready"] >= 0.1
    assert b"TimeToServe" not in buf.getvalue()


def test_a_stop_before_ready_reports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    buf = io.BytesIO()
    stop = threading.Event()
    syncer = fake_syncer(buf, FakeInstaller({"a"}, {"a": -1}))
    log = logging.getLogger("modelsync.test-stop")
    watch = StartWatch.attach(syncer, log, stop, poll=0.01)
    assert watch is not None
    watch.startup.first_sync(["a"], watch.startup.clock())
    stop.set()
    with caplog.at_level(logging.INFO, logger=log.name):
        assert watch.watch() is None
    assert any("stopped" in m and f["not_ready"] == ["a"] for m, f in fields_of(caplog, logging.INFO))
    assert b"TimeToServe" not in buf.getvalue()


def test_a_restart_inside_the_task_is_not_a_task_start(caplog: pytest.LogCaptureFixture) -> None:
    syncer = fake_syncer(io.BytesIO(), FakeInstaller(set(), {}), first_sync=1.0)
    with caplog.at_level(logging.INFO):
        assert StartWatch.attach(syncer, logging.getLogger("modelsync.test-restart"), threading.Event()) is None
    assert syncer.s3.observe is None and syncer.recorder.watchers == []
    assert "earlier run in this task" in caplog.text
