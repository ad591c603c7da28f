"""Entry point: ``python -m controller [run|resume|status] [settings]``.

    python -m controller            the service: one per cluster (docs/controller.md)
    python -m controller resume     resume paused GPU drains (clears the pause and the hour's reports)
    python -m controller status     print the state: what is draining, waiting, paused

Exit codes: 0 done, 1 the state could not be read or written, 2 invalid settings. An error is one
``controller: error: ...`` line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from telemetry import logs
from telemetry.settings import fail
from telemetry.shapes import Malformed
from telemetry.sinks import SinkClosed, make_sink

from .drains import resume
from .fanout import FleetSize, ServiceFanout, TaskQueues
from .fleet import AwsFleet, boto_client
from .inbox import SqsInbox
from .metrics import Counts, Recorder
from .rollouts import RolloutDecider, ecs_stop
from .service import Controller
from .settings import ConfigError, Settings, load
from .state import Conflict, FileStore, S3Store, State, Store, StoreError

LOGGER = "controller"
PROG = "python -m controller"


def make_store(settings: Settings) -> Store:
    if settings.state_file:
        return FileStore(Path(settings.state_file))
    return S3Store(settings.state_bucket, settings.key)


def make_fanout(settings: Settings) -> ServiceFanout | None:
    """The fan-out's parts (--service with --topic-arn and/or --bucket); None when off. The queues live in the
    topic's region, beside it."""
    if not settings.service:
        return None
    ecs = boto_client("ecs")
    queues = None
    if settings.topic_arn:
        region = settings.topic_arn.split(":")[3]
        queues = TaskQueues(
            settings.cluster,
            settings.service,
            settings.topic_arn,
            settings.queue_name_prefix,
            ecs,
            boto_client("sqs", region=region),
            boto_client("sns", region=region),
        )
    size = None
    if settings.bucket:
        size = FleetSize(boto_client("s3"), settings.bucket, settings.prefix, settings.cluster, settings.service)
    return ServiceFanout(ecs, settings.cluster, settings.service, queues, size)


class Unversioned(Exception):
    """Rollouts on with a bucket that keeps no versions: a rejected artifact could not be taken back."""


def make_rollouts(settings: Settings, counts: Counts) -> RolloutDecider | None:
    """The rollouts' decider (--rollouts on); raises Unversioned when the bucket is not versioned."""
    if settings.rollouts != "on":
        return None
    from modelsync.ledger import Ledger
    from modelsync.s3 import S3

    s3 = boto_client("s3")
    try:
        status = s3.get_bucket_versioning(Bucket=settings.bucket).get("Status", "")
    except Exception as exc:
        raise Unversioned(f"cannot read the versioning of s3://{settings.bucket}: {exc}") from None
    if status != "Enabled":
        raise Unversioned(
            f"--rollouts on needs a versioned bucket: s3://{settings.bucket} versioning is "
            f"{status or 'never enabled'}, so a rejected artifact could not be taken back and the canaries could not "
            "install the stable one pinned to its version. Turn versioning on (aws s3api put-bucket-versioning "
            "--versioning-configuration Status=Enabled) or turn rollouts off"
        )
    return RolloutDecider(
        Ledger(s3, settings.bucket, settings.prefix),
        S3(s3, settings.bucket, settings.prefix),
        settings.cluster,
        settings.rules,
        settings.canary_fraction,
        counts,
        ecs_stop(boto_client("ecs"), settings.cluster),
    )


def resume_main(store: Store) -> int:
    """Clear the pause, written over the version read (a running controller's write and this never mix)."""
    for _ in range(5):
        data, version = store.load()
        try:
            state = State.from_json(data) if data is not None else State()
        except Malformed as exc:
            sys.stderr.write(f"the state at {store.where} did not validate ({exc}): starting afresh\n")
            state = State()
        was = resume(state)
        try:
            store.save(state.to_json(), version)
        except Conflict:
            continue  # the controller wrote in between: read again
        waiting = sum(1 for e in state.entries.values() if e.phase == "waiting")
        said = "resumed GPU drains" if was else "GPU drains were not paused; the hour's reports are counted afresh"
        sys.stdout.write(f"{said} ({store.where}); {waiting} instance(s) waiting their turn\n")
        return 0
    return fail(PROG, f"{store.where} kept changing; try again", 1)


def status_main(store: Store) -> int:
    data, _ = store.load()
    if data is None:
        sys.stdout.write(f"no state at {store.where} yet\n")
        return 0
    try:
        state = State.from_json(data)
    except Malformed as exc:
        return fail(PROG, f"the state at {store.where} does not validate: {exc}", 1)
    sys.stdout.write(json.dumps(json.loads(state.to_json()), indent=2, sort_keys=True) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logs.catch_unexpected(LOGGER)
    try:
        command, settings = load(list(sys.argv[1:] if argv is None else argv), os.environ)
    except ConfigError as exc:
        return fail(PROG, f"invalid setting: {exc}")
    store = make_store(settings)
    try:
        if command == "resume":
            return resume_main(store)
        if command == "status":
            return status_main(store)
    except StoreError as exc:
        return fail(PROG, str(exc), 1)
    log = logs.setup(settings.log_level, name=LOGGER)
    counts = Counts()
    try:
        rollouts = make_rollouts(settings, counts)
    except Unversioned as exc:
        return fail(PROG, f"invalid setting: {exc}")
    sink = make_sink(settings.output, buffer_events=1000, connect_timeout=1.0)
    controller = Controller(
        settings.cluster,
        SqsInbox(settings.queue_url),
        AwsFleet(settings.cluster),
        store,
        Recorder(settings.namespace, sink, settings.cluster),
        settings.bounds,
        fanout=make_fanout(settings),
        rollouts=rollouts,
        counts=counts,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "controller started for cluster %s: state at %s, at most %s draining, %d drains an hour, pause above %g%%",
        settings.cluster,
        store.where,
        settings.max_draining,
        settings.max_drains_per_hour,
        settings.pause_above * 100,
        extra={"fields": {"queue_url": settings.queue_url}},
    )
    if settings.service:
        log.info(
            "fan-out on for service %s: %s; %s",
            settings.service,
            f"one queue per task, {settings.queue_name_prefix}<task id>, on {settings.topic_arn}"
            if settings.topic_arn
            else "no queues (no --topic-arn)",
            f"its running task count published at s3://{settings.bucket}/{settings.prefix}.modelsync/fleet.json"
            if settings.bucket
            else "the fleet size is not published (no --bucket)",
        )
    if rollouts is not None:
        log.info(
            "rollouts decided here: canary share %g of the running tasks, bake %g s, at least %d requests, failure "
            "increase %g (95 %% confidence), latency ratio %g, failure ceiling %g",
            settings.canary_fraction, settings.bake_seconds, settings.bake_min_requests,
            settings.max_failure_increase, settings.max_latency_ratio, settings.max_failure_ratio,
        )  # fmt: skip
    try:
        controller.run(settings.interval, stop)
    except SinkClosed as exc:
        log.error("%s; stopping", exc)
        return 1
    finally:
        sink.close(2.0)
    log.info("controller stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
