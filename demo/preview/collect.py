"""One demo run for the preview: real processes, their lines kept as the log groups would hold them.

What runs, all on this machine: the demo's Triton with its sample models and traffic (demo/), in
OpenTelemetry trace mode (one request in TRACE_RATE); the exporter's loop with short windows (EMF
on stdout, its log on stderr, as in the ECS task) with its trace relay on, forwarding to a local
OTLP sink that stands in for X-Ray and keeps nothing; model sync against moto's S3, the bucket's
events fanned out through SNS, with safe rollouts on (the demo's ``text`` model is installed from
an archive, then its update mid-run goes through a canary bake to its verdict on this one host; an
archive whose sha256 does not match, ``ranker``, is uploaded and refused). With ``nvml`` (the default)
the exporter runs on the test suite's NVML fake (tests/support/nvml_fake.py: ``python -m
tests.support.nvml_fake``, the exporter's own entry point with the fake as ``pynvml``): two H100s'
readings for the dashboard's GPU section where this machine has no GPU; with ``nvml=None`` its NVML
source finds no library and says so, as on a CPU host. Each line is stamped when it arrives, then
routed as the task routes it: Triton's and the exporter's lines through the shipped Fluent Bit
configuration (FireLens; read by tests/support/fluentbit_sim.py, the same interpreter the log
tests use), model sync's stdout and stderr to its awslogs group. The run is a list of log events
by group, written to ``events.jsonl``; CloudWatch's metrics are the EMF documents among them, as
CloudWatch extracts them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

from demo import llm
from demo.__main__ import requests
from demo.triton import MODELS_DIR, TritonServer, copy_models, free_port

from .logsinsights import LogEvent

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "/ecs/triton"  # the log group prefix of the shipped deploy (render's default)
MODELSYNC_GROUP = f"{PREFIX}/modelsync"
SYNCED = "text"  # a sample model that model sync installs from S3, then updates mid-run
REFUSED = "ranker"  # an archive uploaded with a sha256 that does not match: refused, a sync failure
HOST = "demo-host-1"
BUCKET = "demo-models"
KEY_PREFIX = "triton/"
TRACE_RATE = 5  # Triton traces one request in 5: the relay's slowest-request lines fill the dashboard's log widget
NVML_FAKE = "hopper"  # the NVML fake's scenario the exporter runs on: two H100s (GPM, HBM temperature)


class RunFailed(RuntimeError):
    """A process of the run did not start or did not do its part in time."""


@dataclass(frozen=True)
class Line:
    time: float
    source: str  # triton | exporter | modelsync
    stream: str  # stdout | stderr
    text: str


@dataclass
class Lines:
    """Every captured line, stamped on arrival; waiters wake on each new one."""

    lines: list[Line] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    ended: set[str] = field(default_factory=set)  # processes whose stderr closed: they exited

    def add(self, source: str, stream: str, text: str) -> None:
        with self.cond:
            self.lines.append(Line(time.time(), source, stream, text.rstrip("\n")))
            self.cond.notify_all()

    def pump(self, source: str, stream: str, pipe: IO[bytes]) -> threading.Thread:
        def run() -> None:
            for raw in iter(pipe.readline, b""):
                self.add(source, stream, raw.decode(errors="replace"))
            if stream == "stderr":
                with self.cond:
                    self.ended.add(source)
                    self.cond.notify_all()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def tail(self, source: str, path: Path, stop: threading.Event) -> threading.Thread:
        """Follow a file (Triton's log) as it grows."""

        def run() -> None:
            pending = ""
            with open(path, errors="replace") as f:
                while True:
                    chunk = f.read()
                    pending += chunk
                    *complete, pending = pending.split("\n")
                    for text in complete:
                        self.add(source, "stderr", text)
                    if not chunk and stop.wait(0.1):
                        break

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def wait(self, pred: Callable[[list[Line]], bool], timeout: float, what: str, source: str = "") -> None:
        """Until ``pred`` holds; RunFailed after ``timeout``, or at once when ``source``, the process that
        should do it, has exited (with its last words: a port taken, a bad flag)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self.lines):
                if source in self.ended:
                    said = [x.text for x in self.lines if x.source == source and x.stream == "stderr"][-5:]
                    raise RunFailed(f"{source} exited while waiting for {what}: " + (" | ".join(said) or "no output"))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RunFailed(f"timed out after {timeout:g}s waiting for {what}")
                self.cond.wait(left)

    def count(self, source: str, needle: str) -> Callable[[list[Line]], int]:
        return lambda lines: sum(1 for x in lines if x.source == source and needle in x.text)


def _repeat(send: Callable[[int], object], stop: threading.Event, pause: float = 0.15) -> None:
    n = 0
    while not stop.is_set():
        send(n)
        n += 1
        stop.wait(pause)


def _at_least(count: Callable[[list[Line]], int], n: int, lines: list[Line]) -> bool:
    return count(lines) >= n


def model_zip(name: str, src: Path, note: str = "") -> bytes:
    """A model archive as docs/modelsync.md packages one: ``<name>/config.pbtxt``, ``<name>/1/...``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(src.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                data = path.read_bytes()
                if path.name == "model.py" and note:
                    data += f"\n# {note}\n".encode()
                if path.name == "config.pbtxt":
                    data = data.replace(f'name: "{src.name}"'.encode(), f'name: "{name}"'.encode())
                zf.writestr(f"{name}/{path.relative_to(src)}", data)
    return buf.getvalue()


class S3:
    """moto's S3 server in this process, and uploads as the docs' ``aws s3 cp --metadata sha256=...``."""

    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
        }
        import boto3

        self.client = boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        self.client.create_bucket(Bucket=BUCKET)
        self.client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        # Every object event (uploads, and the rollout state's conditional writes) to one topic, as the
        # stack's bucket rule does: each daemon reads it through a queue of its own (docs/modelsync.md).
        sns = boto3.client(
            "sns",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        self.topic = sns.create_topic(Name="demo-model-events")["TopicArn"]
        self.client.put_bucket_notification_configuration(
            Bucket=BUCKET,
            NotificationConfiguration={
                "TopicConfigurations": [{"TopicArn": self.topic, "Events": ["s3:ObjectCreated:*"]}]
            },
        )

    def upload(self, model: str, data: bytes, sha256: str | None = None) -> None:
        digest = sha256 or hashlib.sha256(data).hexdigest()
        self.client.put_object(Bucket=BUCKET, Key=f"{KEY_PREFIX}{model}.zip", Body=data, Metadata={"sha256": digest})

    def stop(self) -> None:
        self.server.stop()


class OtlpSink:
    """An OTLP/HTTP endpoint that answers 200 to every POST and keeps nothing (X-Ray's place in the demo)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"otlp+http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def trace_flags(port: int) -> list[str]:
    """Triton's OpenTelemetry trace mode, exporting to the exporter's relay on ``port`` (docs/tracing.md)."""
    return [
        *("--trace-config", "mode=opentelemetry"),
        *("--trace-config", f"opentelemetry,url=http://127.0.0.1:{port}/v1/traces"),
        *("--trace-config", f"rate={TRACE_RATE}"),
        *("--trace-config", "level=TIMESTAMPS"),
        *("--trace-config", "opentelemetry,resource=service.name=triton"),
    ]


def _env(extra: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MODELSYNC_", "TRITON_", "EXPORTER_"))}
    return {**keep, **extra, "PYTHONUNBUFFERED": "1"}


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def run(out: Path, window: float, windows: int, say: Callable[[str], None], nvml: str | None = NVML_FAKE) -> Path:
    """Run the demo for ``windows`` exporter windows of ``window`` seconds; write ``out/events.jsonl``.

    ``nvml``: the NVML fake's scenario the exporter runs on (None: the exporter as it is, NVML absent here)."""
    work = out / "work"
    (work / "triton").mkdir(parents=True, exist_ok=True)
    names = [d.name for d in MODELS_DIR.iterdir() if d.is_dir() and d.name != SYNCED]
    repository = copy_models(names, work / "repository")
    lines = Lines()
    stop = threading.Event()
    s3 = S3()
    sink = OtlpSink()
    relay_port = free_port()
    server = TritonServer(repository, workdir=work / "triton", extra_args=trace_flags(relay_port))
    procs: list[subprocess.Popen[bytes]] = []
    threads: list[threading.Thread] = []
    started = time.time()
    try:
        s3.upload(SYNCED, model_zip(SYNCED, MODELS_DIR / SYNCED))
        say(f"starting Triton with {len(names)} sample models; model sync installs {SYNCED!r} from S3 (moto)")
        server.start(timeout=120)
        assert server.log_path is not None
        threads.append(lines.tail("triton", server.log_path, stop))

        def spawn(source: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(
                [sys.executable, "-m", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_env(env),
                cwd=ROOT,
            )
            assert proc.stdout is not None and proc.stderr is not None
            threads.extend([lines.pump(source, "stdout", proc.stdout), lines.pump(source, "stderr", proc.stderr)])
            procs.append(proc)
            return proc

        spawn(
            "modelsync",
            [
                "modelsync",
                "--bucket",
                BUCKET,
                "--prefix",
                KEY_PREFIX,
                "--repository",
                str(repository),
                "--store",
                str(work / "store"),
                "--triton-url",
                server.url,
                "--interval",
                str(max(1.0, window / 2)),
                "--output",
                "stdout",
                "--host-id",
                HOST,
                "--min-free-bytes",
                "0",
                "--hash-tag-wait",
                "0",
                # Safe rollouts on this one host: it is the canary of every update, judged after a bake of two
                # windows against its own counters on the previous build (docs/modelsync.md).
                "--topic-arn",
                s3.topic,
                "--queue-name-prefix",
                "demo-",
                "--canary-fraction",
                "1",
                "--bake-seconds",
                f"{2 * window:g}",
                "--bake-min-requests",
                "20",
                "--triton-metrics-url",
                server.metrics_url,
            ],
            s3.env,
        )
        installed = lines.count("modelsync", '"ModelInSync":1')
        lines.wait(lambda x: installed(x) > 0, 120, f"model sync to install {SYNCED}", "modelsync")
        # The demo's requests, each model from its own client (as production traffic comes): a model being
        # reloaded delays its own requests, not every other model's too, as one sequential client would.
        senders = [partial(_repeat, one, stop) for one in requests(server)] + [partial(llm.traffic, server, stop)]
        for target in senders:
            threads.append(threading.Thread(target=target, daemon=True))
            threads[-1].start()
        say(f"traffic on; the exporter's loop: {windows} windows of {window:g}s")
        # The exporter's own entry point either way; on the fake, its NVML source reads the fake's GPUs.
        entry = ["exporter"] if nvml is None else ["tests.support.nvml_fake", nvml, str(work / "nvml-control")]
        spawn(
            "exporter",
            [
                *entry,
                "--triton-url",
                server.url,
                "--triton-metrics-url",
                server.metrics_url,
                "--interval",
                f"{window:g}",
                "--output",
                "stdout",
                "--traces-to",
                sink.url,
                "--traces-listen",
                f"127.0.0.1:{relay_port}",
                "--trace-rate",
                str(TRACE_RATE),
            ],
            {},
        )
        beats = lines.count("exporter", '"ExporterHeartbeat"')
        steps = {windows // 3: "update", (2 * windows) // 3: "refused"}
        for n in range(1, windows + 1):
            lines.wait(partial(_at_least, beats, n), window * 4 + 60, f"exporter window {n}", "exporter")
            if steps.get(n) == "update":
                say(f"window {n}: uploading a new build of {SYNCED!r} (a rollout: canary, bake, verdict)")
                s3.upload(SYNCED, model_zip(SYNCED, MODELS_DIR / SYNCED, note="build 2"))
            elif steps.get(n) == "refused":
                say(f"window {n}: uploading {REFUSED!r} with a sha256 that does not match (model sync refuses it)")
                s3.upload(REFUSED, model_zip(REFUSED, MODELS_DIR / "add"), sha256="0" * 64)
        # What the drawing's subtitle says happened, before it is drawn: the rollout's verdict (its bake is two
        # windows from the canary's READY, which can end after the last window on a slow machine) and the refusal.
        for needle, what in (
            ('"RolloutsPromoted":1', f"the rollout of {SYNCED!r} to be promoted"),
            ('"result":"hash_mismatch"', f"model sync to refuse {REFUSED!r}"),
        ):
            lines.wait(partial(_at_least, lines.count("modelsync", needle), 1), window * 4 + 60, what, "modelsync")
    finally:
        stop.set()
        for proc in procs:
            _stop(proc)
        server.stop()
        s3.stop()
        sink.stop()
        for thread in threads:
            thread.join(5)
    events = route(lines.lines)
    path = out / "events.jsonl"
    with open(path, "w") as f:
        meta = {"window": window, "windows": windows, "started": started, "host": HOST, "nvml": nvml}
        f.write(json.dumps({"meta": meta}) + "\n")
        for group, event in events:
            f.write(
                json.dumps({"group": group, "time": event.time, "stream": event.stream, "message": event.message})
                + "\n"
            )
    say(f"{len(lines.lines)} lines -> {len(events)} log events in {len({g for g, _ in events})} groups: {path}")
    return path


def route(lines: list[Line]) -> list[tuple[str, LogEvent]]:
    """The log events each group gets: FireLens and the shipped Fluent Bit configuration for Triton and the
    exporter, the awslogs driver (one event a line) for model sync."""
    from tests.support.fluentbit_sim import FireLensTask, Pipeline, dockerfile_copies, dockerfile_env

    fb = ROOT / "fluentbit"
    env = dockerfile_env(fb / "Dockerfile") | {"AWS_REGION": "us-east-1", "TRITON_LOG_GROUP_PREFIX": PREFIX}
    pipeline = Pipeline(fb / "triton.conf", env, dockerfile_copies(fb / "Dockerfile"), now=datetime.now(UTC))
    tasks = {"triton": FireLensTask("triton-server"), "exporter": FireLensTask("exporter")}
    records = []
    out: list[tuple[str, LogEvent]] = []
    for line in sorted(lines, key=lambda x: x.time):
        if not line.text.strip():
            continue
        if line.source == "modelsync":
            out.append((MODELSYNC_GROUP, LogEvent(line.time, line.text, f"modelsync/modelsync/{HOST}")))
        else:
            records += tasks[line.source].records([line.text], stream=line.stream, t0=line.time)
    out += [(e.group, LogEvent(e.time, e.message, e.stream)) for e in pipeline.run(records)]
    return sorted(out, key=lambda ge: ge[1].time)


def load(path: Path) -> tuple[dict[str, Any], dict[str, list[LogEvent]]]:
    """A run's metadata and its log events by group."""
    meta: dict[str, Any] = {}
    groups: dict[str, list[LogEvent]] = {}
    with open(path) as f:
        for raw in f:
            doc = json.loads(raw)
            if "meta" in doc:
                meta = doc["meta"]
            else:
                groups.setdefault(doc["group"], []).append(LogEvent(doc["time"], doc["message"], doc["stream"]))
    return meta, groups
