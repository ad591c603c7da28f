"""Cadences: the fast metrics every 10 s at high resolution, the rest every --interval, no count twice.

The pipeline keeps one set of counter baselines per cadence, so a counter read every 10 s for a fast ratio
and every 60 s for the minute's totals gives each its own window's delta; the runner serves each cadence
on its own fixed-rate grid, one scrape for every cadence due at an instant.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from catalog import CatalogError
from catalog.load import read
from exporter.config import Settings
from exporter.pipeline import Pipeline, cadences
from exporter.runner import Runner
from exporter.sources import Collected
from telemetry.emf import Encoder, Event
from tests.support.fakes import FakeHttp, Request, head
from tests.support.helpers import CATALOG, IndexSource, TextSource, documents
from tests.support.paths import REPO

NOW = float(int(time.time()) // 60 * 60)  # EMF timestamps must be near the present to validate
INDEX = b'[{"name":"a","version":"1","state":"READY"},{"name":"b","version":"1","state":"READY"}]'


def text(t: int) -> str:
    """Triton's counters at second ``t``: model a serves 10 requests/s, each waited t ms; b 5/s; a backlog."""
    a_ok, b_ok = 10 * t, 5 * t
    a_queue = sum(10 * s * 1000 for s in range(t))  # every request of second s waited s ms
    return f"""# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="a",version="1"}} {a_ok}
nv_inference_request_success{{model="b",version="1"}} {b_ok}
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="a",version="1"}} {a_queue}
nv_inference_queue_duration_us{{model="b",version="1"}} {b_ok * 100}
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="a",version="1"}} {t}
nv_inference_pending_request_count{{model="b",version="1"}} 2
"""


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def pipeline(settings: Settings | None = None, catalog=CATALOG) -> tuple[Pipeline, Clock, TextSource, IndexSource]:
    clock = Clock()
    metrics = TextSource(*(text(s) for s in range(0, 400, 10)))
    index = CountingIndex(INDEX)
    p = Pipeline(settings or Settings(nvml="off"), catalog, [metrics, index], clock=clock, wall=lambda: NOW + clock.t)
    return p, clock, metrics, index


class CountingIndex(IndexSource):
    def __init__(self, body: bytes) -> None:
        super().__init__(body)
        self.calls = 0

    def collect(self, timeout: float) -> Collected:
        self.calls += 1
        return super().collect(timeout)


def values(docs: list[dict], name: str, **dims: str) -> list[float]:
    return [d[name] for d in docs if name in d and all(d.get(k) == v for k, v in dims.items())]


def resolutions(doc: dict) -> dict[str, int]:
    return {m["Name"]: m.get("StorageResolution", 60) for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}


def test_the_catalog_puts_the_scaling_signals_on_a_10_second_cadence() -> None:
    p, *_ = pipeline()
    assert p.periods == (60.0, 10.0)
    fast = {m.name for m in p.cadences[1].catalog.metrics}
    assert fast == {
        "TaskPendingRequests",
        "TaskQueueLatencyMax",
        "TaskRequestsWaiting",
        "TaskRequestsServed",  # the excess's denominator and shed load (issue 37, docs/scaling.md)
        "TaskRequestsRejected",
    }
    assert all(m.high_resolution for m in p.cadences[1].catalog.metrics)
    assert not any(m.interval for m in p.cadences[0].catalog.metrics)
    # A fast interval at or above the full cycle's merges into it: one cadence.
    assert [c.period for c in cadences(CATALOG, 5.0)] == [5.0]


def test_fast_and_full_windows_each_count_every_request_once() -> None:
    p, clock, _, index = pipeline()
    per_tick = []
    for tick in range(13):  # 0 .. 120 s, one scrape every 10 s; full cycles at 0, 60, 120
        clock.t = 10.0 * tick
        due = {10.0} | ({60.0} if tick % 6 == 0 else set())
        result = p.cycle(due=due)
        assert result.full is (tick % 6 == 0)
        per_tick.append(documents(result))
    assert index.calls == 3  # the repository index only at full cycles
    full = [per_tick[0], per_tick[6], per_tick[12]]
    # The minute's totals are the minute's: 600 and 300 requests, as without any fast metric.
    assert [values(d, "RequestSuccess", model="a") for d in full] == [[], [600.0], [600.0]]
    assert [values(d, "RequestSuccess", model="b") for d in full] == [[], [300.0], [300.0]]
    assert values(full[1], "QueueLatencyAvg", model="a") == [29500.0]  # the minute's average wait: 0..59 ms
    # The fast ratio is each 10 s window's own: model a's requests of seconds 10k..10k+9 waited 10k+4.5 ms on
    # average; b's always 100 us; the task's value is the worst model's.
    fast = [values(d, "TaskQueueLatencyMax") for d in per_tick]
    assert fast[0] == [] and [v for [v] in fast[1:]] == [1000.0 * (10 * k + 4.5) for k in range(12)]
    # The backlog, every model of the task summed: a's t requests and b's 2.
    assert [v for [v] in (values(d, "TaskPendingRequests") for d in per_tick)] == [10 * k + 2 for k in range(13)]


def test_scrapes_between_full_cycles_carry_only_the_fast_metrics_at_high_resolution() -> None:
    p, clock, *_ = pipeline()
    p.cycle(due={60.0, 10.0})
    clock.t = 10.0
    between = documents(p.cycle(due={10.0}))
    assert len(between) == 1  # the task's event; no model, GPU or source events
    (doc,) = between
    assert set(resolutions(doc)) == {"TaskPendingRequests", "TaskQueueLatencyMax", "TaskRequestsServed"}
    assert set(resolutions(doc).values()) == {1}
    assert [k for k in doc if k[0].islower() and k != "_aws"] == ["exporter_version"]  # no other property
    for t in range(20, 70, 10):
        clock.t = float(t)
        full = p.cycle(due={10.0} | ({60.0} if t == 60 else set()))
    docs = documents(full)
    (task,) = [d for d in docs if "ExporterHeartbeat" in d]
    res = resolutions(task)
    assert res["TaskPendingRequests"] == 1 and res["ExporterHeartbeat"] == 60  # the rest stays standard
    assert all(v == 60 for d in docs if "model" in d for v in resolutions(d).values())


def test_the_minutes_numbers_are_those_of_a_pipeline_without_fast_metrics() -> None:
    """Triton restarts at 25 s: the fast windows see it (no value at 30 s, then the new window's); the full
    cycles give exactly what a pipeline without any fast metric gives from the same scrapes."""
    bodies = [text(0), text(10), text(20), text(5), text(15), text(25), text(35), text(45), text(55), text(65)]
    bodies += [text(t) for t in range(75, 200, 10)]
    clock = Clock()
    p = Pipeline(
        Settings(nvml="off"),
        CATALOG,
        [TextSource(*bodies), IndexSource(INDEX)],
        clock=clock,
        wall=lambda: NOW + clock.t,
    )
    plain_clock = Clock()
    plain = Pipeline(
        Settings(nvml="off"),
        CATALOG.select("-Task*"),
        [TextSource(*bodies[::6]), IndexSource(INDEX)],
        clock=plain_clock,
        wall=lambda: NOW + plain_clock.t,
    )
    docs, minutes = [], []
    for tick in range(19):
        clock.t = plain_clock.t = 10.0 * tick
        docs.append(documents(p.cycle(due={10.0} | ({60.0} if tick % 6 == 0 else set()))))
        if tick % 6 == 0:
            minutes.append(documents(plain.cycle()))
    fast = [values(d, "TaskQueueLatencyMax") for d in docs]
    assert fast[3] == [] and fast[4] == [1000.0 * 9.5]  # reset: no value, then the new window's
    for with_fast, without in zip(docs[::6], minutes, strict=True):
        strip = [{k: v for k, v in d.items() if not k.startswith("Task") and k != "_aws"} for d in with_fast]
        assert strip == [{k: v for k, v in d.items() if k != "_aws"} for d in without]
    assert values(docs[12], "RequestSuccess", model="a") == [600.0]


IDLE = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="a",version="1"} 120
nv_inference_request_success{model="b",version="1"} 40
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="a",version="1"} 9000
nv_inference_queue_duration_us{model="b",version="1"} 4000
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="a",version="1"} 0
nv_inference_pending_request_count{model="b",version="1"} 0
"""


def test_an_idle_task_reports_its_backlog_at_zero_every_fast_cycle_and_no_queue_time() -> None:
    """The scale-in sum (docs/scaling.md) has a datapoint on an idle service because the backlog is always
    there: Triton's gauge reads 0 for every loaded model, and 0 is emitted, not left out, every 10 s; the
    queue time, with no request completed, is absent."""
    clock = Clock()
    p = Pipeline(
        Settings(nvml="off"), CATALOG, [TextSource(IDLE), IndexSource(INDEX)], clock=clock, wall=lambda: NOW + clock.t
    )
    for tick in range(13):
        clock.t = 10.0 * tick
        docs = documents(p.cycle(due={10.0} | ({60.0} if tick % 6 == 0 else set())))
        assert values(docs, "TaskPendingRequests") == [0.0], tick
        assert values(docs, "TaskQueueLatencyMax") == [], tick
        (task,) = [d for d in docs if "TaskPendingRequests" in d]
        assert resolutions(task)["TaskPendingRequests"] == 1


def test_the_cardinality_cap_holds_between_full_cycles() -> None:
    p, clock, *_ = pipeline(Settings(nvml="off", max_models=1))
    p.cycle(due={60.0, 10.0})
    clock.t = 10.0
    (doc,) = documents(p.cycle(due={10.0}))
    assert doc["TaskPendingRequests"] == 10.0  # model a only (the cap keeps the first by name): b's 2 left out


CORE = [("core.toml", (REPO / "catalog" / "core.toml").read_text())]


def user_metric(**keys: str) -> None:
    """Read core.toml and a user file with one metric of these keys (TOML values, as written)."""
    entry = {"name": '"X"', "scope": '"model"', "unit": '"Count"', "kind": '"gauge"', "help": '"x"'}
    entry |= {"inputs": '["nv_inference_pending_request_count"]'} | keys
    read([*CORE, ("user.toml", "[[metric]]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items()))], 1)


def test_catalog_keys_are_validated() -> None:
    user_metric(interval="10", resolution="1")
    user_metric(scope='"task"', across='"sum"')  # a model-labelled family, one value per task
    for keys, message in (
        ({"interval": "7"}, "divides 60"),
        ({"interval": "60"}, "divides 60"),
        ({"interval": '"10"'}, "divides 60"),
        ({"resolution": "10"}, "resolution must be 1"),
        ({"resolution": "true"}, "resolution must be 1"),
        ({"across": '"sum"'}, "across is for scope task"),
        ({"scope": '"task"', "across": '"max"', "inputs": '["nv_cpu_utilization"]'}, "per-model or per-GPU"),
        (
            {
                "scope": '"task"',
                "across": '"sum"',
                "kind": '"ratio"',
                "inputs": '["nv_inference_queue_duration_us"]',
                "denominators": '["nv_inference_request_success"]',
            },
            "takes kinds",
        ),
        ({"name": '"ExporterHeartbeat"', "override": "true", "scope": '"task"', "kind": '"self"', "inputs": "[]",
          "interval": "10"}, "computed from source series"),
    ):  # fmt: skip
        with pytest.raises(CatalogError, match=message):
            user_metric(**keys)


def test_the_encoder_marks_each_high_resolution_metric_and_the_global_switch_marks_all() -> None:
    fast, slow = CATALOG.get("TaskPendingRequests"), CATALOG.get("TritonUp")
    assert fast is not None and slow is not None
    event = Event("task", {}, {"TaskPendingRequests": 3.0, "TritonUp": 1.0}, {})
    [doc] = documents_of(Encoder("Triton", [fast, slow]).encode(event, int(NOW * 1000)))
    assert resolutions(doc) == {"TaskPendingRequests": 1, "TritonUp": 60}
    [doc] = documents_of(Encoder("Triton", [fast, slow], storage_resolution=1).encode(event, int(NOW * 1000)))
    assert resolutions(doc) == {"TaskPendingRequests": 1, "TritonUp": 1}


def documents_of(lines: list[bytes]) -> list[dict]:
    from tests.support.helpers import documents as decode

    return decode(type("R", (), {"events": lines})())  # type: ignore[arg-type]


# --- the runner's schedule -------------------------------------------------------------------------


class Recorder:
    """A pipeline stand-in that records which cadences each scrape served, at which (virtual) time."""

    def __init__(self, clock: Clock, periods: tuple[float, ...], cost: float = 0.0) -> None:
        self.clock, self.periods, self.cost = clock, periods, cost
        self.calls: list[tuple[float, frozenset[float], int]] = []

    def cycle(self, events_dropped: int = 0, due: frozenset[float] | None = None):
        self.calls.append((self.clock.t, frozenset(due or ()), events_dropped))
        self.clock.t += self.cost
        return type("R", (), {"events": []})()

    def close(self) -> None:
        pass


class Sink:
    def __init__(self) -> None:
        self.dropped = 7

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n

    def send(self, events: list[bytes]) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


def run(periods: tuple[float, ...], until: float, cost: float = 0.0) -> Recorder:
    return run_with(periods, periods[0], until, cost)


def run_with(periods: tuple[float, ...], interval: float, until: float, cost: float = 0.0) -> Recorder:
    """A runner at ``interval`` over a pipeline stand-in of these cadences, on a virtual clock until ``until``."""
    clock, stop = Clock(), threading.Event()
    rec = Recorder(clock, periods, cost)

    def wait(seconds: float) -> None:
        clock.t += seconds
        if clock.t >= until:
            stop.set()

    Runner(rec, Sink(), interval, stop, clock=clock, wait=wait).run()  # type: ignore[arg-type]
    return rec


def test_one_scrape_serves_every_cadence_due_and_each_keeps_its_grid() -> None:
    rec = run((60.0, 10.0), until=125.0)
    assert [(t, sorted(d)) for t, d, _ in rec.calls] == [
        (t, [10.0, 60.0] if t % 60 == 0 else [10.0]) for t in [float(10 * k) for k in range(13)]
    ]
    # Only full cycles take the sink's dropped count (EventsDropped is a full cycle's metric).
    assert [n for _, d, n in rec.calls if 60.0 in d] == [7, 0, 0]
    assert [n for _, d, n in rec.calls if 60.0 not in d] == [0] * 10


def test_a_cadence_whose_slot_passed_during_another_scrape_runs_next_then_regains_its_grid() -> None:
    rec = run((60.0, 10.0), until=130.0, cost=12.0)  # each scrape takes 12 s: fast slots are skipped
    times = [t for t, _, _ in rec.calls]
    fulls = [t for t, d, _ in rec.calls if 60.0 in d]
    assert fulls[:2] == [0.0, 60.0]  # the full cycle keeps its grid
    assert all(b - a >= 12.0 for a, b in itertools.pairwise(times))  # one scrape at a time


def test_the_runners_interval_rules_and_fast_cadences_not_shorter_ride_with_each_cycle() -> None:
    """A runner at 5 s (--once, a test) over a pipeline built for 60 s and 10 s: one cadence, every metric each
    cycle. At 30 s: its full cycles serve the pipeline's full cadence, the 10 s one on its own grid too."""
    clock, stop = Clock(), threading.Event()
    rec = Recorder(clock, (60.0, 10.0))
    assert Runner(rec, Sink(), 5.0, stop, clock=clock).periods == (5.0,)  # type: ignore[arg-type]
    rec = run_with((60.0, 10.0), 30.0, until=35.0)
    assert [(t, sorted(d)) for t, d, _ in rec.calls] == [(0.0, [10.0, 60.0]), (10.0, [10.0]), (20.0, [10.0]),
                                                         (30.0, [10.0, 60.0])]  # fmt: skip


def test_a_single_cadence_pipeline_is_called_as_before() -> None:
    rec = run((60.0,), until=130.0)
    assert [(t, d) for t, d, _ in rec.calls] == [(0.0, frozenset()), (60.0, frozenset()), (120.0, frozenset())]


# --- the exporter as the shipped deployment runs it ---------------------------------------------------------

ROOT = REPO


def shipped_exporter_environment() -> dict[str, str]:
    """The exporter's environment in deploy/task-definition.json; tests/deploy/test_stack.py holds the stack's
    containers to it and tests/deploy/test_terraform.py the module's to the stack's."""
    td = json.loads((ROOT / "deploy" / "task-definition.json").read_text())
    (exporter,) = [c for c in td["containerDefinitions"] if c["name"] == "exporter"]
    return {e["name"]: e["value"] for e in exporter["environment"]}


def test_the_exporter_as_the_task_definition_runs_it_writes_the_fast_signals(tmp_path: Path) -> None:
    """`python -m exporter` with the shipped environment (its URLs and output pointed here) writes, between full
    cycles, an event of the scaling signals alone, at high resolution, 10 s after the full cycle's."""
    scrapes = [0]

    def triton(server: FakeHttp, conn: socket.socket, req: Request) -> None:
        if req.path == "/metrics":  # requests keep completing: 10 s of model a's and b's per scrape
            scrapes[0] += 1
            body, ctype = text(10 * scrapes[0]).encode(), "text/plain; version=0.0.4"
        elif req.method == "POST":  # the repository index
            body, ctype = INDEX, "application/json"
        elif req.path == "/v2":
            body, ctype = b'{"name":"triton","version":"2.51.0"}', "application/json"
        else:
            body, ctype = b'{"name":"a","max_batch_size":8}', "application/json"
        server.send(conn, head(200, ctype, len(body)) + body)

    env = shipped_exporter_environment()
    assert env["EXPORTER_INTERVAL"] == "60" and "EXPORTER_STORAGE_RESOLUTION" not in env
    out = tmp_path / "emf.jsonl"
    with FakeHttp(triton) as server:
        env |= {
            "TRITON_URL": server.url,
            "TRITON_METRICS_URL": server.url + "/metrics",
            "AWS_EMF_NAMESPACE": "Triton",  # the task definition's ${Namespace} placeholder
            "EXPORTER_OUTPUT": f"file:{out}",  # its tcp:// agent is not here
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter"],
            cwd=ROOT,
            env={"PATH": os.environ.get("PATH", ""), **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline, fast = time.monotonic() + 60, None
            while fast is None and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)  # polling the file the exporter appends to: the event is the fast scrape's line
                lines = out.read_bytes().splitlines() if out.exists() else []
                fast = next((orjson.loads(x) for x in lines if b"ExporterHeartbeat" not in x and b"Task" in x), None)
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=10)
    assert fast is not None, err.decode()[-2000:]
    assert resolutions(fast) == {"TaskPendingRequests": 1, "TaskQueueLatencyMax": 1, "TaskRequestsServed": 1}
    full = next(orjson.loads(x) for x in out.read_bytes().splitlines() if b"ExporterHeartbeat" in x)
    assert resolutions(full)["ExporterHeartbeat"] == 60 and resolutions(full)["TaskPendingRequests"] == 1
    # The fast scrape's slot is 10 s after the full one's: not with it (0 s), not at the next full one (60 s).
    # Wide on the late side: a loaded machine may start a slot late, never early.
    assert 9_000 <= fast["_aws"]["Timestamp"] - full["_aws"]["Timestamp"] < 25_000
