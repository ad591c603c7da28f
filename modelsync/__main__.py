"""Entry point: settings once, the parts built and wired, outcomes mapped to exit codes.

    python -m modelsync [settings]     the daemon: reconcile at start, every --interval, and on SQS events
    python -m modelsync --once [...]   one reconcile; exit 0 when every model in S3 is installed and READY
    python -m modelsync rollout status|promote|reject ...   the operator's view of safe rollouts (rolloutcli.py)

Exit codes: 0 done (or in sync with --once), 1 something could not be
applied (--once) or the store is held by another daemon, 2 invalid settings.
An error that stops it is one ``modelsync: error: ...`` line.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from telemetry import logs
from telemetry.settings import fail
from telemetry.sinks import Sink, SinkClosed, make_sink

from .events import EventFilter, Pending, QueuePoller
from .fanout import Fanout, FleetHosts, TaskQueue, build_fanout, build_task_queue, task_arn
from .follow import Follower, sqs_sender
from .fsio import FileSystem, LocalFileSystem
from .health import HEARTBEAT_EVERY, Status
from .ledger import Ledger
from .metrics import Recorder
from .reconcile import Report, Syncer
from .rollout import Rollouts
from .s3 import S3, make_client
from .settings import SUBCOMMANDS, ConfigError, Settings, load
from .startup import StartWatch
from .store import Store, StoreError
from .transfer import START_CONNECTIONS, Budget, TransferConfig
from .triton import Triton

LOGGER = "modelsync"
PROG = "python -m modelsync"
SINK_GRACE = 1.0
BUFFER_EVENTS = 20_000
CONNECT_TIMEOUT = 1.0
FIRST_SYNC_RETRY = 5.0  # seconds between passes until the first sync is complete (Triton waits for it)


class NoIdentity(Exception):
    """--rollouts controller outside an ECS task: no task ARN to report under."""


class Unversioned(Exception):
    """Rollouts on with a bucket that keeps no versions."""


def check_versioned(settings: Settings, client: object) -> None:
    """Rollouts decided by the daemons need a versioned bucket (a rejected artifact is taken back by version):
    refused at start rather than installed everywhere at once."""
    if not (settings.canary_fraction > 0 and settings.rollouts == "self"):
        return
    try:
        status = client.get_bucket_versioning(Bucket=settings.bucket).get("Status", "")  # type: ignore[attr-defined]
    except Exception as exc:
        raise Unversioned(f"cannot read the versioning of s3://{settings.bucket}: {exc}") from None
    if status != "Enabled":
        raise Unversioned(
            f"--canary-fraction needs a versioned bucket: s3://{settings.bucket} versioning is "
            f"{status or 'never enabled'}, so a rejected artifact could not be taken back. Turn versioning on, or "
            "rollouts off"
        )


@dataclass
class App:
    settings: Settings
    store: Store
    syncer: Syncer
    sink: Sink
    poller: QueuePoller | None
    pending: Pending
    fanout: Fanout | TaskQueue | None = None  # --topic-arn: this daemon's own queue (self) or its task's (controller)

    def close(self) -> None:
        if self.poller is not None:
            self.poller.close()
        if self.fanout is not None:
            self.fanout.close()  # self: unsubscribes and deletes its queue; controller: leaves it to the controller
        self.sink.close(SINK_GRACE)
        self.store.close()


def build(
    settings: Settings,
    fs: FileSystem | None = None,
    log: logging.Logger | None = None,
    s3_client: object | None = None,
    sqs_client: object | None = None,
    sns_client: object | None = None,
) -> App:
    """Wire the parts; raises StoreError when the store cannot be used."""
    fs = fs or LocalFileSystem()
    log = log or logging.getLogger(LOGGER)
    store = Store(settings.repository, settings.store_root, fs)
    store.open()
    sink = make_sink(settings.output, BUFFER_EVENTS, CONNECT_TIMEOUT)
    recorder = Recorder(settings.namespace, sink, settings.host)
    transfer = TransferConfig(  # every download of the daemon shares --connections (the budget)
        part_size=settings.part_size,
        connections=settings.connections,
        start_connections=min(START_CONNECTIONS, settings.connections),
        budget=Budget(settings.connections),
    )
    s3_conn = s3_client or make_client("s3", connections=settings.connections)
    s3 = S3(s3_conn, settings.bucket, settings.prefix, transfer)
    previous = Status.read(settings.repository)
    status = Status(pid=os.getpid(), started=time.time(), first_sync=previous.first_sync if previous else None)
    triton = Triton(settings.triton_url, settings.load_timeout, admin_key=settings.triton_admin_key)
    syncer = Syncer(settings, s3, store, triton, recorder, fs, log, status=status)
    pending = Pending()
    poller = None
    if settings.queue_url and not settings.once:
        client = sqs_client or make_client("sqs", region_hint=_queue_region(settings.queue_url))
        poller = QueuePoller(
            client,
            settings.queue_url,
            EventFilter(settings.bucket, settings.prefix),
            pending,
            logging.getLogger(f"{LOGGER}.sqs"),
        )
    fanout: Fanout | TaskQueue | None = None
    if settings.topic_arn and not settings.once and settings.fanout == "controller":
        fanout = build_task_queue(
            settings.topic_arn,
            settings.queue_name_prefix,
            EventFilter(settings.bucket, settings.prefix),
            pending,
            logging.getLogger(f"{LOGGER}.fanout"),
            sqs_client,
        )
    elif settings.topic_arn and not settings.once:
        fanout = build_fanout(
            settings.topic_arn,
            settings.queue_name_prefix,
            settings.host,
            EventFilter(settings.bucket, settings.prefix),
            pending,
            logging.getLogger(f"{LOGGER}.fanout"),
            sqs_client,
            sns_client,
        )
    if settings.rollouts == "controller":
        arn = task_arn(os.environ)
        if not arn:
            raise NoIdentity(
                "--rollouts controller needs this task's ARN from the ECS task metadata "
                "(ECS_CONTAINER_METADATA_URI_V4): the controller assigns canaries by task ARN"
            )
        rlog = logging.getLogger(f"{LOGGER}.rollout")
        if settings.ignored:
            rlog.warning(
                "rollout settings %s are given but rollouts are the controller's (--rollouts controller): ignored; "
                "set them on the controller (CONTROLLER_*)",
                ", ".join("--" + f.replace("_", "-") for f in settings.ignored),
                extra={"fields": {"ignored": list(settings.ignored)}},
            )  # fmt: skip
        reports = sqs_client or make_client("sqs", region_hint=_queue_region(settings.controller_queue_url))
        syncer.rollouts = Follower(
            settings,
            Ledger(s3_conn, settings.bucket, settings.prefix),
            recorder,
            rlog,
            syncer.identify,
            syncer.entry_models,
            sqs_sender(reports, settings.controller_queue_url),
            arn,
            arn.split(":")[5].split("/")[1] if arn.count("/") >= 2 else "",
        )
    elif settings.canary_fraction > 0:
        live_hosts: Callable[[], int | None] = lambda: None  # noqa: E731
        if settings.fanout == "controller":  # ECS's running tasks, as the controller counted them
            live_hosts = FleetHosts(s3_conn, settings.bucket, settings.prefix, logging.getLogger(f"{LOGGER}.rollout"))
        elif isinstance(fanout, Fanout):  # the daemons' own queues
            live_hosts = fanout.live_hosts
        syncer.rollouts = Rollouts(
            settings,
            Ledger(s3_conn, settings.bucket, settings.prefix),
            recorder,
            logging.getLogger(f"{LOGGER}.rollout"),
            syncer.identify,
            syncer.entry_models,
            live_hosts,
            participate=not settings.once,
        )
    return App(settings, store, syncer, sink, poller, pending, fanout)


def _queue_region(url: str) -> str:
    """``https://sqs.<region>.amazonaws.com/...``: the region when nothing else configures one."""
    host = url.split("//", 1)[-1].split("/", 1)[0]
    parts = host.split(".")
    return parts[1] if len(parts) > 3 and parts[0] == "sqs" else ""


def run_once(app: App, stderr: TextIO) -> int:
    """One reconcile; one line per model that could not be applied."""
    app.syncer.recover()
    report = app.syncer.reconcile_all()
    write_report(report, stderr)
    return 0 if report.ok else 1


def one_line(text: str, limit: int = 1000) -> str:
    """A reason on one line: Triton's load errors carry a multi-line traceback."""
    lines = (line.strip().lstrip(";").strip() for line in text.splitlines())
    joined = " / ".join(line for line in lines if line)
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def write_report(report: Report, stderr: TextIO) -> None:
    if report.error:
        stderr.write(f"modelsync: {one_line(report.error)}\n")
    for model, o in sorted(report.outcomes.items()):
        if o.failed:
            stderr.write(f"modelsync: {model}: {o.result or 'failed'}: {one_line(o.reason)}\n")
        elif not o.in_sync and o.reason:
            stderr.write(f"modelsync: note: {model}: {one_line(o.reason)}\n")
    stderr.flush()


def heartbeat(app: App, stop: threading.Event, log: logging.Logger) -> threading.Thread:
    """Every few seconds: the status file (the health check's proof of life) and the store lease (what this
    repository links to stays in the shared store)."""

    def beat() -> None:
        while not stop.is_set():
            try:
                app.syncer.status.heartbeat = time.time()
                app.syncer.status.write(app.settings.repository)
                app.store.heartbeat()
            except Exception as exc:  # a full disk must not end the daemon; the health check will say so
                log.error("heartbeat failed: %s", exc)
            stop.wait(HEARTBEAT_EVERY)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    return thread


def rollout_ticks(app: App, stop: threading.Event, log: logging.Logger) -> threading.Thread | None:
    """With safe rollouts: every few seconds, this host's evidence and verdicts (rollout.py), on a thread of its
    own so that a long install of another model never silences a canary; the models it names are reconciled
    by the loop."""
    rollouts = app.syncer.rollouts
    if rollouts is None:
        return None

    def run() -> None:
        while not stop.wait(rollouts.progress):
            try:
                for model in rollouts.tick():
                    app.pending.nudge(model)
            except Exception:  # a bug in one tick must not end the rollouts
                log.exception("rollout tick failed; continuing")

    thread = threading.Thread(target=run, name="rollouts", daemon=True)
    thread.start()
    return thread


def run_daemon(app: App, stop: threading.Event, log: logging.Logger) -> None:
    """Reconcile at start and every interval (fixed rate), and the models SQS events name in between; until
    the first sync is complete, every few seconds."""
    interval = app.settings.interval
    measured = StartWatch.attach(app.syncer, log, stop)  # this task's start, reported once (startup.py)
    app.syncer.recover()
    heartbeat(app, stop, log)
    rollout_ticks(app, stop, log)
    if app.poller is not None:
        app.poller.start()
    if app.fanout is not None:
        app.fanout.start()  # finds (controller) or makes (self) its queue in the background, retried; polls it
    start = time.monotonic()
    slot = 0
    log.info(
        "modelsync started",
        extra={
            "fields": {
                "bucket": app.settings.bucket,
                "prefix": app.settings.prefix,
                "repository": str(app.settings.repository),
                "store": str(app.settings.store_root),
                "queue": app.settings.queue_url,
                "interval_s": interval,
                "canary_fraction": app.settings.canary_fraction,
            }
        },
    )
    while not stop.is_set():
        try:
            report = app.syncer.reconcile_all()
            if measured is not None:
                measured.after_pass(report)
        except SinkClosed:
            raise
        except Exception:  # a bug in one pass must not end the daemon
            log.exception("reconcile failed; continuing on schedule")
        if app.syncer.before_first_sync:
            due = time.monotonic() + min(interval, FIRST_SYNC_RETRY)
        else:
            slot = max(slot + 1, int((time.monotonic() - start) / interval) + 1)
            due = start + slot * interval
        while not stop.is_set() and time.monotonic() < due:
            models = app.pending.take(min(1.0, max(0.0, due - time.monotonic())))
            if models and not stop.is_set():
                try:
                    app.syncer.reconcile_models(models)
                except SinkClosed:
                    raise
                except Exception:
                    log.exception("event-triggered reconcile failed")
    log.info("modelsync stopped")


def main(argv: Sequence[str] | None = None) -> int:
    logs.catch_unexpected(LOGGER)  # no raw traceback on stderr, whatever fails (docs/reliability.md)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["rollout"]:
        from .rolloutcli import main as rollout_main

        return rollout_main(argv[1:])
    try:
        settings = load(argv, os.environ, commands=SUBCOMMANDS)
    except ConfigError as exc:
        return fail(PROG, f"invalid setting: {exc}")
    log = logs.setup(settings.log_level, name=LOGGER)
    try:
        if not settings.once:
            check_versioned(settings, make_client("s3"))
        app = build(settings, log=log)
    except StoreError as exc:
        return fail(PROG, str(exc), 1 if exc.busy else 2)
    except (NoIdentity, Unversioned) as exc:
        return fail(PROG, f"invalid setting: {exc}")
    try:
        if settings.once:
            return run_once(app, sys.stderr)
        stop = threading.Event()

        def on_signal(*_: object) -> None:
            stop.set()
            app.pending.wake()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        run_daemon(app, stop, log)
        return 0
    except SinkClosed as exc:
        log.error("%s; stopping", exc)
        return 1
    finally:
        app.close()


if __name__ == "__main__":
    sys.exit(main())
