"""Regressions found by the fault suite (docs/reliability.md), fixed in the pipeline."""

from __future__ import annotations

import threading
import time
import types

import pytest

from demo.payloads import triton_metrics
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.sources import Collected, SourceKind
from exporter.sources.promtext import Parser
from tests.support.helpers import CATALOG, IndexSource, TextSource, documents, model_doc, task_doc


@pytest.mark.parametrize(
    "line",
    [
        'nv_inference_pending_request_count{version="1"} 0',  # model label missing
        "nv_inference_pending_request_count 0",  # no labels at all
        "nv_gpu_utilization 0.5",  # GPU family without gpu_uuid
    ],
)
def test_series_without_its_entity_label_is_skipped_not_fatal(line):
    body = triton_metrics(["a"], 1, gpus=["GPU-1"])
    family = line.split("{")[0].split(" ")[0]
    body = body.replace(f"# TYPE {family} gauge\n", f"# TYPE {family} gauge\n{line}\n")
    pipe = Pipeline(Settings(nvml="off"), CATALOG, [TextSource(body), IndexSource()])
    docs = documents(pipe.cycle())
    assert model_doc(docs, "a")["PendingRequests"] == 0
    assert len([d for d in docs if "ExporterHeartbeat" in d]) == 1  # no second "task" event from it
    assert task_doc(docs)["TritonUp"] == 1  # the cycle is not lost to the odd series
    assert [d["gpu"] for d in docs if "gpu" in d] == ["0"]


def test_body_ending_in_a_type_line_without_newline():
    exp = Parser(["nv_inference_count"]).parse("# TYPE nv_inference_count counter")
    assert exp.samples.get("nv_inference_count", {}) == {} and exp.malformed == 0
    exp = Parser(["nv_inference_count"]).parse('# TYPE nv_inference_count counter\nnv_inference_count{a="b"} 3')
    assert list(exp.samples["nv_inference_count"].values()) == [3.0]


def test_label_cache_tracks_the_live_set_under_churn():
    parser = Parser(["nv_inference_count"], min_cache=100)
    for round_ in range(30):
        names = [f"m{round_}_{i}" for i in range(50)]  # 50 new models every scrape, none repeat
        parser.parse(triton_metrics(names, 1))
        assert len(parser._cache) <= 2 * 100 + 2 * 50 + 1  # bounded by the live set, not max_cache


def test_tcp_sink_backoff_is_not_cut_short_by_new_events(monkeypatch):
    """Found in review: send() woke the sender out of its backoff, so it reconnected every cycle."""
    from telemetry.sinks import tcp as sinks

    attempts: list[float] = []

    def refuse(addr, timeout=None):
        attempts.append(time.monotonic())
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(sinks.socket, "create_connection", refuse)
    monkeypatch.setattr(sinks, "BACKOFF_START", 60.0)  # one refusal: a minute before the next attempt
    sink = sinks.TcpSink("127.0.0.1", 9, capacity=1000)
    try:
        sink.send([b'{"_aws":{}}'])
        deadline = time.monotonic() + 15
        while not sink.backing_off and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sink.backing_off and len(attempts) == 1  # refused once, now waiting out its backoff
        for _ in range(20):
            sink.send([b'{"_aws":{}}'])  # new batches while it backs off
            time.sleep(0.02)
        # A send that woke the sender would have it reconnect at once; give it a second to (wrongly) do so.
        deadline = time.monotonic() + 1.0
        while len(attempts) == 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(attempts) == 1, len(attempts)  # not one attempt per batch
        assert sink.backing_off
    finally:
        sink.close(5)
    assert not sink.thread.is_alive()  # close() does wake it


def test_events_dropped_survive_a_failed_cycle():
    from exporter.runner import Runner

    class FlakyPipeline:
        def __init__(self) -> None:
            self.calls: list[int] = []

        def cycle(self, events_dropped: int = 0):
            self.calls.append(events_dropped)
            if len(self.calls) == 1:
                raise RuntimeError("bug in one cycle")
            return type("R", (), {"events": []})()

        def close(self) -> None:
            pass

    class CountingSink:
        def __init__(self) -> None:
            self.drops = [7, 0, 0]

        def take_dropped(self) -> int:
            return self.drops.pop(0) if self.drops else 0

        def send(self, events) -> None:
            pass

        def close(self, timeout: float) -> None:
            pass

    pipe = FlakyPipeline()
    runner = Runner(pipe, CountingSink(), interval=0.01)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        runner._cycle()
    runner._cycle()
    assert pipe.calls == [7, 7]  # the 7 drops of the failed cycle are reported by the next one
    runner._cycle()
    assert pipe.calls[-1] == 0


class StuckPipeline:
    """Its first cycle blocks until released; records every thread inside ``cycle`` and ``close``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.closed = threading.Event()
        self.closed_beside_a_cycle = False
        self.close_thread = ""

    def cycle(self, events_dropped: int = 0):
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.calls += 1
            first = self.calls == 1
        try:
            self.entered.set()
            if first:
                self.release.wait(10)
            return types.SimpleNamespace(events=[])
        finally:
            with self.lock:
                self.active -= 1

    def close(self) -> None:
        with self.lock:
            self.closed_beside_a_cycle |= self.active > 0
        self.close_thread = threading.current_thread().name
        self.closed.set()


class NullSink:
    def take_dropped(self) -> int:
        return 0

    def send(self, events) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


def test_a_cycle_abandoned_at_shutdown_never_runs_beside_another_cycle_or_close(monkeypatch):
    """Pipeline state is not thread-safe: after a stop abandons a stuck cycle, no second worker may start."""
    from exporter import runner as runner_module
    from exporter.runner import Runner, RunnerStopped

    monkeypatch.setattr(runner_module, "STOP_GRACE", 0.05)
    pipe, stop = StuckPipeline(), threading.Event()
    runner = Runner(pipe, NullSink(), interval=0.05, stop=stop)  # type: ignore[arg-type]
    first = threading.Thread(target=runner.run, daemon=True)
    first.start()
    assert pipe.entered.wait(5)
    stop.set()
    first.join(5)
    assert not first.is_alive()  # the run ended within the grace, its cycle still running
    assert not pipe.closed.is_set()  # and the pipeline was not closed beside that cycle
    stop.clear()  # whatever comes next, no thread joins the stuck one in the pipeline
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    try:
        with pytest.raises(RunnerStopped):
            runner.run()
        with pytest.raises(RunnerStopped):
            runner._cycle()
    finally:
        timer.cancel()
        pipe.release.set()
    assert pipe.closed.wait(5)  # closed once the abandoned cycle returned, by the worker that ran it
    assert pipe.close_thread == "cycle" and not pipe.closed_beside_a_cycle
    assert pipe.max_active == 1 and pipe.calls == 1


def test_a_runner_runs_once():
    from exporter.runner import Runner, RunnerStopped

    pipe, stop = StuckPipeline(), threading.Event()
    pipe.calls = 1  # no cycle blocks
    runner = Runner(pipe, NullSink(), interval=0.05, stop=stop)  # type: ignore[arg-type]
    threading.Timer(0.2, stop.set).start()
    runner.run()
    assert runner.cycles >= 1 and pipe.closed.is_set() and pipe.close_thread != "cycle"
    with pytest.raises(RunnerStopped):
        runner.run()


def test_series_printed_twice_are_counted_in_duplicate_series():
    """Exposition.duplicates was counted and never reported: it is the DuplicateSeries self-metric."""
    body = triton_metrics(["a", "b"], 1)
    line = 'nv_inference_count{model="a",version="1"} 12\n'
    assert line in body
    twice = body.replace(line, line + line)
    docs = documents(Pipeline(Settings(nvml="off"), CATALOG, [TextSource(twice), IndexSource()]).cycle())
    assert task_doc(docs)["DuplicateSeries"] == 1
    docs = documents(Pipeline(Settings(nvml="off"), CATALOG, [TextSource(body), IndexSource()]).cycle())
    assert task_doc(docs)["DuplicateSeries"] == 0


def test_events_cut_down_to_fit_are_counted_in_events_oversize():
    """Every event cut down to fit is counted in the task event's EventsOversize, the task event included."""

    class Metadata:  # task identity so large that every event carrying it must drop its properties
        name, kind = "ecs_metadata", SourceKind.METADATA

        def __init__(self, size: int) -> None:
            self.size = size

        def collect(self, timeout: float) -> Collected:
            return Collected(properties={"ecs_task_arn": "arn:" + "y" * self.size})

        def close(self) -> None:
            pass

    def run(size: int) -> dict:
        sources = [TextSource(triton_metrics(["a", "b"], 1)), IndexSource(), Metadata(size)]
        return task_doc(documents(Pipeline(Settings(nvml="off"), CATALOG, sources).cycle()))

    small = run(100)
    assert small["EventsOversize"] == 0 and "truncated" not in small
    big = run(300 * 1024)
    # models a and b, the three source events, and the task event itself: six events lost their properties
    assert big["EventsOversize"] == 6 and big["truncated"] is True
