"""Benchmark: how soon each scaling policy reacts to a sustained load step, and whether it fires without one.

    .venv/bin/python bench/bench_scaling.py [--tasks 2] [--trials 5] [--ingestion-delay 5] [--seed 1]

What runs (docs/scaling.md, "Proof"):
- a scripted Triton per task: an HTTP server answering ``/metrics`` (Triton's families and shapes), the
  repository index and the model config, from a queueing simulation, not a real Triton with a slow model
  (minutes of wall clock per run on a shared 2-core machine, and no GPU for a DCGM utilization): Poisson
  arrivals at the task's share of the load, one model instance with Triton's dynamic batcher (a batch of up
  to 16 takes 4 ms + 1.5 ms per request: 571 requests/s at most), its pending count, queue and request
  duration counters and the GPU's busy fraction over the last 2 s (Triton's DCGM refresh);
- the exporter as the shipped task definition configures it (deploy/task-definition.json's environment, the
  URLs pointed at the scripted Triton): its real sources over HTTP, pipeline and runner, on a virtual clock
  (each task starts at a random phase), so 20 minutes of traffic take seconds;
- CloudWatch: every EMF line the exporters wrote, stored as CloudWatch stores it (high resolution at the
  second, standard at the minute), arriving ``--ingestion-delay`` s after its timestamp, and the alarms
  evaluated with CloudWatch's rules (tests/support/cwalarm.py, checked against the User Guide's tables):
  the new scale-out alarms as rendered (alarms/cli/scaling/, defaults), today's GPU-utilization alarms as
  the previous render made them, and both scale-in alarms.

Scenarios, each ``--trials`` times with other seeds and phases:
- step: 100 requests/s per task (the GPU ~50 % busy) for 6 minutes, then 700/s (1.2x capacity) for 8 minutes;
- busy: 350 requests/s per task for 12 minutes: batching keeps the GPU ~100 % busy at 60 % of capacity, queue
  time a few ms (busy but healthy: no scaling should happen);
- idle: 5 requests/s per task for 20 minutes (only scale-in should happen).

``--fleet`` (issue 37): for 2, 20 and 100 tasks and surges of 10, 50 and 200 % over their capacity, the rendered
policies (alarms/cli/scaling/) beside the previous ones (the same files at commit d83eb08: fixed +1/+2 steps,
120 s cooldown), in the same run: time from the surge until the serving tasks carry the demand, the peak desired
count against the tasks needed, and scaling actions that reverse the one before (a fluid model of the fleet,
CloudWatch's alarms from tests/support/cwalarm.py, Application Auto Scaling from tests/support/aas.py; seconds).

It prints, per scenario and policy, when scale-out first fired relative to the step (or that it fired
before it, or never) and whether scale-in fired, as median and range over the trials.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import random
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from exporter.__main__ import build_catalog, build_sources  # noqa: E402
from exporter.config import load as load_settings  # noqa: E402
from exporter.pipeline import Pipeline  # noqa: E402
from exporter.runner import Runner  # noqa: E402
from telemetry import logs  # noqa: E402
from tests.support.cwalarm import ALARM, Alarm, Key, Store, statistic  # noqa: E402

MAX_BATCH = 16
BATCH_FIXED = 0.004  # seconds per batch
BATCH_PER_REQUEST = 0.0015  # seconds per request in it
CAPACITY = MAX_BATCH / (BATCH_FIXED + BATCH_PER_REQUEST * MAX_BATCH)  # requests/s of one task
UTIL_WINDOW = 2.0  # Triton refreshes its DCGM GPU metrics every 2 s (--metrics-interval-ms)

# Today's policy, as `python -m render` wrote it before docs/scaling.md (alarms/cli/scaling/ then): a task added
# when the service's GPU utilization averaged over 85 % for five 60-second periods, one removed below 40 % for 15.
TODAY_OUT = {
    "AlarmName": "triton-gpu-utilization-high",
    "Namespace": "Triton",
    "MetricName": "GpuUtilization",
    "Dimensions": [],
    "Statistic": "Average",
    "Period": 60,
    "EvaluationPeriods": 5,
    "DatapointsToAlarm": 5,
    "Threshold": 85.0,
    "ComparisonOperator": "GreaterThanThreshold",
    "TreatMissingData": "notBreaching",
}
TODAY_IN = {
    **TODAY_OUT,
    "AlarmName": "triton-gpu-utilization-low",
    "EvaluationPeriods": 15,
    "DatapointsToAlarm": 15,
    "Threshold": 40.0,
    "ComparisonOperator": "LessThanThreshold",
}
NEW_OUT = ("scale-out-pending", "scale-out-queue-time")  # the rendered scale-out alarms that Triton's metrics feed


# --- the scripted Triton ---------------------------------------------------------------------------------------


class Load:
    """Requests/s over time: ``steps`` is [(from second, rate)], sorted."""

    def __init__(self, steps: list[tuple[float, float]]) -> None:
        self.starts = [t for t, _ in steps]
        self.rates = [r for _, r in steps]

    def rate(self, t: float) -> float:
        return self.rates[max(0, bisect.bisect_right(self.starts, t) - 1)]

    def next_change(self, t: float) -> float:
        i = bisect.bisect_right(self.starts, t)
        return self.starts[i] if i < len(self.starts) else math.inf


@dataclass
class Batcher:
    """One model instance behind Triton's dynamic batcher, simulated event by event up to the time asked."""

    load: Load
    rng: random.Random
    now: float = 0.0
    next_arrival: float = 0.0
    queue: deque[float] = field(default_factory=deque)
    batch: tuple[float, float, list[float]] | None = None  # (start, end, arrival times)
    busy: deque[tuple[float, float]] = field(default_factory=deque)  # recent busy intervals
    success: int = 0
    executions: int = 0
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0

    def __post_init__(self) -> None:
        self.next_arrival = self._after(0.0)

    def _after(self, t: float) -> float:
        """The next Poisson arrival after ``t`` under a piecewise-constant rate (memoryless across changes)."""
        while True:
            rate, change = self.load.rate(t), self.load.next_change(t)
            nxt = t + self.rng.expovariate(rate) if rate > 0 else math.inf
            if nxt < change:
                return nxt
            if change == math.inf:
                return math.inf
            t = change

    def _start(self, t: float) -> None:
        arrivals = [self.queue.popleft() for _ in range(min(MAX_BATCH, len(self.queue)))]
        self.batch = (t, t + BATCH_FIXED + BATCH_PER_REQUEST * len(arrivals), arrivals)

    def advance(self, until: float) -> None:
        while True:
            done = self.batch[1] if self.batch else math.inf
            if min(done, self.next_arrival) > until:
                break
            if self.batch is not None and done <= self.next_arrival:
                start, end, arrivals = self.batch
                self.busy.append((start, end))
                self.success += len(arrivals)
                self.executions += 1
                self.request_us += sum(end - a for a in arrivals) * 1e6
                self.queue_us += sum(start - a for a in arrivals) * 1e6
                self.compute_us += (end - start) * 1e6 * len(arrivals)
                self.batch = None
                if self.queue:
                    self._start(end)
            else:
                self.queue.append(self.next_arrival)
                if self.batch is None:
                    self._start(self.next_arrival)
                self.next_arrival = self._after(self.next_arrival)
        self.now = until
        while self.busy and self.busy[0][1] < until - UTIL_WINDOW:
            self.busy.popleft()

    def utilization(self) -> float:
        lo = self.now - UTIL_WINDOW
        spans = [*self.busy, *([(self.batch[0], self.now)] if self.batch and self.batch[0] < self.now else [])]
        return sum(max(0.0, min(e, self.now) - max(s, lo)) for s, e in spans) / UTIL_WINDOW

    def metrics(self) -> str:
        m = 'model="m",version="1"'
        gpu = 'gpu_uuid="GPU-00000000-1111-2222-3333-444455556666"'
        lines = [
            "# TYPE nv_inference_request_success counter",
            f"nv_inference_request_success{{{m}}} {self.success}",
            "# TYPE nv_inference_request_failure counter",
            *(f'nv_inference_request_failure{{{m},reason="{r}"}} 0' for r in ("OTHER", "BACKEND", "CANCELED")),
            "# TYPE nv_inference_count counter",
            f"nv_inference_count{{{m}}} {self.success}",
            "# TYPE nv_inference_exec_count counter",
            f"nv_inference_exec_count{{{m}}} {self.executions}",
            "# TYPE nv_inference_request_duration_us counter",
            f"nv_inference_request_duration_us{{{m}}} {self.request_us:.0f}",
            "# TYPE nv_inference_queue_duration_us counter",
            f"nv_inference_queue_duration_us{{{m}}} {self.queue_us:.0f}",
            "# TYPE nv_inference_compute_infer_duration_us counter",
            f"nv_inference_compute_infer_duration_us{{{m}}} {self.compute_us:.0f}",
            "# TYPE nv_inference_pending_request_count gauge",
            f"nv_inference_pending_request_count{{{m}}} {len(self.queue)}",
            "# TYPE nv_gpu_utilization gauge",
            f"nv_gpu_utilization{{{gpu}}} {self.utilization():.4f}",
            "# TYPE nv_gpu_memory_total_bytes gauge",
            f"nv_gpu_memory_total_bytes{{{gpu}}} 24000000000",
            "# TYPE nv_gpu_memory_used_bytes gauge",
            f"nv_gpu_memory_used_bytes{{{gpu}}} 9000000000",
        ]
        return "\n".join(lines) + "\n"


class ScriptedTriton:
    """Triton's HTTP surface the exporter reads, answered from a :class:`Batcher` at the virtual time."""

    def __init__(self, batcher: Batcher, clock: Callable[[], float]) -> None:
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, body: bytes, ctype: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    with lock:
                        batcher.advance(clock())
                        text = batcher.metrics()
                    self._send(text.encode(), "text/plain; version=0.0.4")
                elif self.path == "/v2":
                    self._send(b'{"name":"triton","version":"2.51.0"}', "application/json")
                else:  # /v2/models/m/versions/1/config
                    self._send(b'{"name":"m","backend":"onnxruntime","max_batch_size":16}', "application/json")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send(b'[{"name":"m","version":"1","state":"READY"}]', "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the exporter, as the shipped task definition runs it --------------------------------------------------


def shipped_environment() -> dict[str, str]:
    """The exporter container's environment in deploy/task-definition.json (equal to the stack's and Terraform's)."""
    td = json.loads((ROOT / "deploy" / "task-definition.json").read_text())
    (exporter,) = [c for c in td["containerDefinitions"] if c["name"] == "exporter"]
    return {e["name"]: e["value"] for e in exporter["environment"]}


class Recording:
    """The runner's sink: every EMF line, decoded."""

    def __init__(self) -> None:
        self.docs: list[dict[str, object]] = []

    def send(self, events: list[bytes]) -> None:
        self.docs += [orjson.loads(e) for e in events]

    def take_dropped(self) -> int:
        return 0

    def close(self, timeout: float) -> None:
        pass


def run_task(load: Load, seconds: float, epoch: float, phase: float, seed: int) -> list[dict[str, object]]:
    """One task: the scripted Triton and the exporter on one virtual clock, from ``phase`` to ``seconds``."""
    now = [phase]
    stop = threading.Event()

    def clock() -> float:
        return now[0]

    def wait(delay: float) -> None:
        now[0] += delay
        if now[0] >= seconds:
            stop.set()

    triton = ScriptedTriton(Batcher(load, random.Random(seed)), clock)
    env = shipped_environment() | {
        "TRITON_URL": triton.url,
        "TRITON_METRICS_URL": triton.url + "/metrics",
        "AWS_EMF_NAMESPACE": "Triton",  # the ${Namespace} of the task definition; the rendered alarms' default
        "EXPORTER_OUTPUT": "stdout",  # the runner gets the recording sink below
    }
    env.pop("ECS_CONTAINER_METADATA_URI_V4", None)
    settings = load_settings(argv=[], environ=env)
    catalog = build_catalog(settings)
    pipeline = Pipeline(settings, catalog, build_sources(settings, catalog), clock=clock, wall=lambda: epoch + now[0])
    sink = Recording()
    try:
        Runner(pipeline, sink, settings.interval, stop, clock=clock, wait=wait).run()
    finally:
        triton.close()
    return sink.docs


# --- CloudWatch's side ---------------------------------------------------------------------------------------


def rendered(name: str) -> dict[str, object]:
    return json.loads((ROOT / "alarms" / "cli" / "scaling" / f"alarm-{name}.json").read_text())


@dataclass
class Outcome:
    out_first: float | None  # when scale-out first fired, seconds from the start
    in_first: float | None


def evaluate(docs: list[dict[str, object]], epoch: float, seconds: float, delay: float) -> dict[str, Outcome]:
    store = Store()
    for d in docs:
        store.add_emf(d, delay)
    out: dict[str, Outcome] = {}
    policies = {
        "today": ([TODAY_OUT], TODAY_IN),
        "new": ([rendered(n) for n in NEW_OUT], rendered("scale-in")),
    }
    for policy, (outs, into) in policies.items():
        fired = []
        for body in outs:
            a = Alarm.from_api(body)
            a.run(store, epoch, epoch + seconds)
            t = a.first(ALARM)
            if t is not None:
                fired.append(t - epoch)
        a = Alarm.from_api(into)
        a.run(store, epoch, epoch + seconds)
        t_in = a.first(ALARM)
        out[policy] = Outcome(min(fired, default=None), None if t_in is None else t_in - epoch)
    return out


def steady_figures(docs: list[dict[str, object]], epoch: float, start: float, end: float) -> dict[str, float]:
    """The steady phase as the exporter saw it: GPU utilization, backlog per task, worst queue time."""

    def mean(name: str) -> float:
        vals = [
            float(d[name])  # type: ignore[arg-type]
            for d in docs
            if name in d and start <= d["_aws"]["Timestamp"] / 1000 - epoch < end  # type: ignore[index]
        ]
        return statistics.fmean(vals) if vals else math.nan

    return {
        "gpu_util_pct": mean("GpuUtilization"),
        "pending_per_task": mean("TaskPendingRequests"),
        "queue_ms": mean("TaskQueueLatencyMax") / 1000,
    }


SCENARIOS: dict[str, tuple[list[tuple[float, float]], float, float | None]] = {
    # name: (per-task load steps, seconds, the step's time)
    "step": ([(0.0, 100.0), (360.0, 700.0)], 840.0, 360.0),
    "busy": ([(0.0, 350.0)], 720.0, None),
    "idle": ([(0.0, 5.0)], 1200.0, None),
}


# --- the fleet bench (issue 37): how much capacity, how soon, and whether it is kept ------------------------------

FLEET_SIZES = (2, 20, 100)
FLEET_SURGES = (0.10, 0.50, 2.00)
PREVIOUS = "d83eb08"  # the last commit rendering the fixed +1/+2 steps with a 120 s scale-out cooldown
TASK_RATE = 100.0  # requests/s one task serves (the unit: only demand over capacity matters)
BEFORE = 0.9  # the fleet's load before the surge, share of its capacity
WARM_S = 1200.0  # before the surge: the alarms have their history
AFTER_S = 3600.0  # simulated after the surge
KEPT_S = 1800.0  # oscillations counted in the 30 minutes after the fleet first serves the demand
QUEUE_S = 2.0  # Triton's queue holds this many seconds of a task's service (max_queue_size); the rest is REJECTED


class SecondStore(Store):
    """:class:`Store` indexed by the second: the same datapoints, without scanning every value at each one."""

    def __init__(self) -> None:
        super().__init__()
        self.by_second: dict[tuple[object, int], list[tuple[float, float]]] = {}

    def add(self, key: Key, timestamp: float, value: float, arrival: float, high_resolution: bool) -> None:
        stored = math.floor(timestamp) if high_resolution else math.floor(timestamp / 60) * 60
        self.by_second.setdefault((key, stored), []).append((value, arrival))

    def datapoint(self, key: Key, stat: str, start: float, period: float, now: float) -> float | None:
        got = [
            v for s in range(int(start), int(start + period)) for v, a in self.by_second.get((key, s), ()) if a <= now
        ]
        return statistic(stat, got)


def policy_set(read: Callable[[str], str]) -> tuple[dict[str, dict[str, object]], dict[str, dict[str, object]], int]:
    """(alarm bodies, PutScalingPolicy bodies) by alarm name from a render of alarms/cli/scaling/, and the
    scale-in cooldown."""
    names = [
        line.removeprefix("alarm-").removesuffix(".json") for line in read("").split() if line.startswith("alarm-")
    ]
    alarms = {n: json.loads(read(f"alarm-{n}.json")) for n in names}
    policies = {n: json.loads(read(f"policy-{n}.json")) for n in names}
    cooldown = int(policies["scale-in"]["StepScalingPolicyConfiguration"]["Cooldown"])
    return alarms, policies, cooldown


def _read_now(name: str) -> str:
    folder = ROOT / "alarms" / "cli" / "scaling"
    return "\n".join(sorted(p.name for p in folder.iterdir())) if not name else (folder / name).read_text()


def _read_previous(name: str) -> str:
    import subprocess

    if not name:
        cmd = ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{PREVIOUS}:alarms/cli/scaling/"]
    else:
        cmd = ["git", "-C", str(ROOT), "show", f"{PREVIOUS}:alarms/cli/scaling/{name}"]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@dataclass
class FleetRun:
    to_capacity: float | None  # seconds from the surge until the ready tasks serve the demand
    needed: int
    peak: int  # the most tasks desired
    reversals: int  # scaling actions that reverse the previous one, within KEPT_S of meeting the demand
    actions: list[tuple[float, int]]
    final: int


def fleet_run(policy: tuple[dict[str, dict[str, object]], dict[str, dict[str, object]], int], tasks: int,
              surge: float, start_s: float, delay: float, seed: int) -> FleetRun:  # fmt: skip
    """One service of ``tasks`` tasks, its demand stepping from BEFORE to (1 + surge) times their capacity.

    A fluid model, one second a step: the balancer spreads the demand over the tasks that serve (all alike), each
    task's queue holds :data:`QUEUE_S` seconds of its service and rejects the rest (Triton's REJECTED); a task
    serves ``start_s`` after ECS starts it and reports nothing before
    (its exporter waits for Triton). Each serving task writes what its exporter writes (10 s: backlog, queue
    time, served, rejected; 60 s: GPU utilization), CloudWatch stores them (``delay`` s later) and evaluates the
    policy's alarms (tests/support/cwalarm.py); Application Auto Scaling applies its policies
    (tests/support/aas.py); ECS starts and stops tasks to the desired count (starting ones stopped first).
    """
    from tests.support.aas import StepPolicy, Target

    alarm_bodies, policy_bodies, in_cooldown = policy
    alarms = {n: Alarm.from_api(b) for n, b in alarm_bodies.items()}
    target = Target(1, tasks * 10, tasks, {n: StepPolicy.from_api(b) for n, b in policy_bodies.items()},
                    scale_in_cooldown=in_cooldown)  # fmt: skip
    rng = random.Random(seed)
    epoch = 1_800_000_000.0
    surge_at = WARM_S + rng.uniform(0, 10)
    end = WARM_S + AFTER_S
    store = SecondStore()
    ready: list[float] = [0.0] * tasks  # when each task serves (0: already)
    backlog = served10 = served60 = rejected10 = 0.0
    wait_sum10 = 0.0
    needed = math.ceil((1 + surge) * tasks - 1e-9)
    to_capacity: float | None = None
    high = math.pi  # the exporters' phase in their 10 s grid
    t = 0.0
    while t < end:
        demand = tasks * TASK_RATE * (BEFORE if t < surge_at else 1 + surge) * (1 + rng.gauss(0, 0.01))
        serving = sum(1 for r in ready if r <= t)
        capacity = serving * TASK_RATE
        done = min(capacity, backlog + demand)
        backlog += demand - done
        shed = max(0.0, backlog - QUEUE_S * capacity)  # no task serving: the balancer answers 503, not counted
        backlog -= shed
        rejected10 += shed
        served10 += done
        served60 += done
        wait_sum10 += backlog / capacity if capacity else 0.0
        if to_capacity is None and t >= surge_at and capacity >= (1 + surge) * tasks * TASK_RATE:
            to_capacity = t - surge_at
        tick = t + 1
        if serving and int(tick - high) % 10 == 0:
            stamp = epoch + tick
            per = 1.0 / serving
            for name, value in (
                ("TaskPendingRequests", backlog * per),
                ("TaskRequestsServed", served10 * per),
                ("TaskRequestsRejected", rejected10 * per),
                ("TaskQueueLatencyMax", wait_sum10 / 10 * 1e6),
            ):
                store.add(("Triton", name, frozenset()), stamp, value, stamp + delay, True)  # fmt: skip
            served10 = wait_sum10 = rejected10 = 0.0
            if int(tick - high) % 60 == 0:
                util = 100.0 * served60 / (capacity * 60) if capacity else 0.0
                store.add(("Triton", "GpuUtilization", frozenset()), stamp, min(100.0, util), stamp + delay, False)
                served60 = 0.0
        now = epoch + tick
        invoked = []
        for name, alarm in alarms.items():
            if int(tick) % alarm.evaluation_interval:
                continue
            state = alarm.evaluate(store, now)
            if target.due(name, state == ALARM, now):
                last = math.floor(now / alarm.period) * alarm.period - alarm.period
                points = [alarm.value(store, last - i * alarm.period, now) for i in range(alarm.evaluation_periods)]
                real = [p for p in points if p is not None]
                if real:
                    invoked.append((name, statistics.fmean(real) - alarm.threshold))
        if invoked:
            desired = target.invoke(invoked, now)
            while len(ready) < desired:
                ready.append(tick + start_s)
            while len(ready) > desired:  # ECS stops a starting task first, else a serving one
                ready.remove(max(ready))
        t = tick
    actions = [(a - epoch - surge_at, n) for a, n in target.history if a - epoch >= surge_at]
    met = to_capacity if to_capacity is not None else AFTER_S
    kept = [n for a, n in actions if a <= met + KEPT_S]
    moves = [b - a for a, b in zip([tasks, *kept], kept, strict=False)]
    reversals = sum(1 for x, y in itertools.pairwise(moves) if x * y < 0)
    peak = max([tasks, *(n for _, n in actions)])
    return FleetRun(to_capacity, needed, peak, reversals, actions, target.desired)


def fleet_main(args: argparse.Namespace) -> None:
    now = policy_set(_read_now)
    previous = policy_set(_read_previous)
    template = json.loads((ROOT / "alarms" / "triton-alarms.template.json").read_text())
    task_start = float(template["Parameters"]["TaskStartSeconds"]["Default"])
    cooldown = float(now[1]["scale-out-excess"]["StepScalingPolicyConfiguration"]["Cooldown"])  # type: ignore[index]
    start_s = task_start if args.task_start is None else args.task_start
    print(
        f"fleet bench: TaskStartSeconds {task_start:g} s (the rendered default; scale-out cooldown {cooldown:g} s), "
        f"a new task serves {start_s:g} s after "
        f"ECS starts it, EMF ingestion delay {args.ingestion_delay:g} s, load {BEFORE:.0%} of capacity before the "
        f"surge, a task's queue {QUEUE_S:g} s of its service (the rest rejected), MaxCapacity 10 x the fleet; "
        f"seed {args.seed}"
    )
    print(
        f"now: alarms/cli/scaling/ ({', '.join(sorted(now[0]))}); "
        f"previous: {PREVIOUS} ({', '.join(sorted(previous[0]))})"
    )
    wall = time.perf_counter()
    rows = []
    for tasks in FLEET_SIZES:
        for surge in FLEET_SURGES:
            seed = args.seed * 1000 + tasks * 10 + int(surge * 10)
            runs = {name: fleet_run(p, tasks, surge, start_s, args.ingestion_delay, seed)
                    for name, p in (("previous", previous), ("now", now))}  # fmt: skip
            rows.append((tasks, surge, runs))
    elapsed = time.perf_counter() - wall

    def cap(r: FleetRun) -> str:
        return "never" if r.to_capacity is None else f"{r.to_capacity:.0f} s"

    print()
    print(
        "| tasks | surge | needed | time to capacity: previous / now | peak desired (overshoot): previous / now "
        "| reversals: previous / now | actions in 1 h: previous / now |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for tasks, surge, runs in rows:
        p, n = runs["previous"], runs["now"]
        print(
            f"| {tasks} | {surge:.0%} | {n.needed} | {cap(p)} / {cap(n)} | {p.peak} ({p.peak - p.needed:+d}) / "
            f"{n.peak} ({n.peak - n.needed:+d}) | {p.reversals} / {n.reversals} | {len(p.actions)} / {len(n.actions)} |"
        )
    print(f"\n({elapsed:.1f} s of wall clock)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--ingestion-delay", type=float, default=5.0, help="seconds from an EMF line to its metric")
    p.add_argument(
        "--also-delays", type=float, nargs="*", default=[1.0, 15.0], help="the step's detection at these delays too"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fleet", action="store_true", help="the fleet bench: 2, 20, 100 tasks, surges of 10, 50, 200 %%")
    p.add_argument("--task-start", type=float, help="--fleet: seconds a new task takes to serve (TaskStartSeconds)")
    args = p.parse_args()
    if args.fleet:
        fleet_main(args)
        return
    logs.setup("error")  # NVML's absence here (EXPORTER_NVML=auto, as shipped) is not news
    epoch = float(int(time.time()) // 3600 * 3600 - 3 * 3600)  # a round hour, recent enough for EMF
    print(
        f"scripted Triton per task: dynamic batching, capacity {CAPACITY:.0f} requests/s; {args.tasks} tasks; "
        f"EMF ingestion delay {args.ingestion_delay:g} s; {args.trials} trials per scenario"
    )
    env = shipped_environment()
    shipped = load_settings(argv=[], environ=env)
    fast = Pipeline(shipped, build_catalog(shipped), []).periods[1:]
    print(
        f"exporter as deploy/task-definition.json runs it: EXPORTER_INTERVAL={env.get('EXPORTER_INTERVAL')}, "
        f"fast metrics every {', '.join(f'{p:g}' for p in fast)} s"
    )
    rng = random.Random(args.seed)
    results: dict[tuple[str, str], list[Outcome]] = {}
    by_delay: dict[float, list[float | None]] = {d: [] for d in args.also_delays}
    steady: dict[str, list[dict[str, float]]] = {}
    wall = time.perf_counter()
    for name, (steps, seconds, step_at) in SCENARIOS.items():
        for _ in range(args.trials):
            shift = rng.uniform(0, 10) if step_at is not None else 0.0  # the step's phase in a 10 s period
            load = Load([(t + (shift if t else 0.0), r) for t, r in steps])
            docs = []
            for _ in range(args.tasks):
                docs += run_task(load, seconds, epoch, rng.uniform(0, 10), rng.randrange(1 << 30))
            for policy, outcome in evaluate(docs, epoch, seconds, args.ingestion_delay).items():
                if step_at is not None and outcome.out_first is not None:
                    outcome.out_first -= step_at + shift  # relative to the step
                results.setdefault((name, policy), []).append(outcome)
            if step_at is not None:
                for delay in args.also_delays:
                    t = evaluate(docs, epoch, seconds, delay)["new"].out_first
                    by_delay[delay].append(None if t is None else t - step_at - shift)
            end = (step_at + shift) if step_at is not None else seconds
            steady.setdefault(name, []).append(steady_figures(docs, epoch, 60.0, end))
    print(f"({time.perf_counter() - wall:.1f} s of wall clock)\n")
    print("steady phase as the exporter saw it (mean per task):")
    for name, figs in steady.items():
        avg = {k: statistics.fmean(f[k] for f in figs) for k in figs[0]}
        print(
            f"  {name:<5} GPU utilization {avg['gpu_util_pct']:5.1f} %, backlog {avg['pending_per_task']:6.2f} "
            f"requests, worst queue time {avg['queue_ms']:7.2f} ms"
        )
    print()
    print(f"{'scenario':<8} {'policy':<6} {'scale-out: after the step / before it':<44} {'scale-in fired':<24}")
    for (name, policy), outcomes in results.items():
        step_at = SCENARIOS[name][2]
        outs = [o.out_first for o in outcomes]
        if step_at is not None:
            before = [t for t in outs if t is not None and t < 0]
            after = [t for t in outs if t is not None and t >= 0]
            text = (
                f"{statistics.median(after):.0f} s after the step (min {min(after):.0f}, max {max(after):.0f})"
                if after
                else "never after the step"
            )
            if len(after) < len(outs) and not before:
                text += f", not within the run in {len(outs) - len(after)} trials"
            if before:
                text += f"; FIRED BEFORE the step in {len(before)}/{len(outs)} (at {-max(before):.0f} s before)"
        else:
            fired = [t for t in outs if t is not None]
            text = (
                f"FIRED in {len(fired)}/{len(outs)} trials (median {statistics.median(fired):.0f} s in)"
                if fired
                else f"never in {len(outs)} trials"
            )
        ins = [o.in_first for o in outcomes if o.in_first is not None]
        in_text = f"{len(ins)}/{len(outcomes)} (median {statistics.median(ins):.0f} s in)" if ins else "never"
        print(f"{name:<8} {policy:<6} {text:<44} {in_text:<24}")
    for delay, times in by_delay.items():
        after = [t for t in times if t is not None and t >= 0]
        if after:
            print(
                f"step     new    at {delay:g} s ingestion delay: {statistics.median(after):.0f} s after the step "
                f"(min {min(after):.0f}, max {max(after):.0f})"
            )


if __name__ == "__main__":
    main()
