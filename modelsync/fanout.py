"""SNS fan-out: every host reads a queue of its own subscribed to one topic, so every host hears every object event.

Two modes (``--fanout``): ``self`` (below: every daemon creates, tags, subscribes and sweeps its own queue;
for use outside ECS) and ``controller`` (:class:`TaskQueue`: the fleet's controller makes one queue per ECS
task, ``<prefix><task id>``, and the daemon only finds it by name, receives from it and deletes its messages;
the live hosts a rollout is sized from are then the controller's count of the service's running tasks,
:class:`FleetHosts`, not a number of queues anyone with the role could inflate). What follows is ``self``.

Why: with one shared SQS queue each event reaches one host and the others
wait for their next reconcile (``--interval``). An SNS topic copies each
message to every subscribed queue, so one queue per daemon gives every host
the hint within seconds. Events stay hints (see events.py): the reconcile
lists S3 and decides, and the interval reconcile stays the safety net for
everything that can go wrong here.

Design choices:

- **One queue per daemon process**, named ``<prefix><12 hex digits>``,
  random: 48 bits make a collision between live daemons practically
  impossible, the name stays short (prefixes up to 68 characters fit), and a
  restarted daemon never meets SQS's "name deleted in the last 60 s" refusal.
  Who owns a queue is in its tags (``modelsync-host``, and ``modelsync-task``
  = the ECS task ARN when the task metadata endpoint answers), not its name.
- **The queue**: SSE-SQS, one hour's retention (a hint older than that is
  worthless: the reconcile has run many times since), and a policy that lets
  only ``sns.amazonaws.com`` send, only for this topic (``aws:SourceArn``).
  The policy is set after creation because its resource is the queue's ARN,
  which SQS answers (account and partition included) rather than us guessing.
  The subscription keeps raw delivery off: ``events.parse`` unwraps the SNS
  envelope (and would read a raw S3 notification too).
- **Liveness** is a tag, ``modelsync-heartbeat`` = Unix seconds, set at
  creation (CreateQueue carries the tags: no untagged moment) and refreshed
  every :data:`HEARTBEAT_EVERY` by the thread that polls the queue: the tag
  says "somebody reads this queue". A queue's last sign of life is the newer
  of that tag and its ``CreatedTimestamp``, so a queue created moments ago
  whose tag is not visible yet is never taken for an orphan. Every time here
  is on SQS's clock (the ``Date`` header of its last answer, one-second
  resolution), not the host's: a host whose clock is off by an hour neither
  looks dead to the others nor takes their live queues for orphans.
- **The lease** (:data:`LEASE`, 10 minutes) is a constant, not a setting:
  every daemon judges every other daemon's queue, and a fleet in which one
  daemon had a shorter lease than the others' heartbeat would delete live
  queues. Ten missed heartbeats absorb throttling, an SQS brownout, a long
  garbage-collection pause or a frozen host for a few minutes.
- **The sweep**: every daemon, every :data:`SWEEP_EVERY` (jittered), lists
  the queues with its prefix, deletes those idle longer than the lease
  (unsubscribing their subscriptions first), then unsubscribes the topic's
  SQS subscriptions whose queue no longer exists (GetQueueUrl confirms: the
  listing is eventually consistent, so "not listed" alone is not proof).
  Only names of the exact form ``<prefix><12 hex>`` and, for subscriptions,
  queues in the topic's region are touched: a foreign queue that happens to
  share the prefix is never deleted. The period grows with the number of
  queues seen (``SWEEP_EVERY × queues / FLEET_SWEEPS``) so that a big fleet
  sweeps about :data:`FLEET_SWEEPS` times per period in total instead of
  once per host (each sweep costs two calls per queue). A sweep that finds
  this daemon's own subscription missing from the topic (removed by hand)
  has the polling thread subscribe again.
- **Failures never stop the daemon**: creation and subscription are retried
  with backoff (1 s doubling to 60 s), every failed call is logged once per
  change (``Conditions``), and meanwhile the reconcile timer keeps the host
  converging. A daemon whose own queue disappeared (swept after this host
  stalled longer than the lease, or deleted by hand) creates a new one under
  a new name; the sweep removes the old subscription.
- **A clean stop** (SIGTERM/SIGINT, end of ``run_daemon``) unsubscribes and
  deletes the queue. A killed daemon leaves both until another daemon's
  sweep finds the heartbeat older than the lease: at most LEASE + one sweep
  period later (~15 minutes with a few hosts); SNS deliveries to it and its
  messages cost pennies and expire after the retention.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import secrets
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.exceptions import ClientError

from telemetry.logs import Conditions
from telemetry.shapes import loads

from .events import EventFilter, Pending, QueuePoller

ID_HEX = 12  # the random part of a queue name: 48 bits
MAX_QUEUE_NAME = 80  # SQS
MAX_PREFIX = MAX_QUEUE_NAME - ID_HEX
RETENTION_SECONDS = 3600  # events are hints: an hour-old one is worthless
HEARTBEAT_EVERY = 60.0
LEASE = 600.0  # a queue idle for longer is an orphan (why a constant: module docstring)
SWEEP_EVERY = 300.0
FLEET_SWEEPS = 5  # above this many queues, each daemon sweeps less often (see module docstring)
FIRST_SWEEP_MAX = 60.0  # the first sweep, jittered so a fleet started together does not sweep at once
RETRY_FIRST, RETRY_MAX = 1.0, 60.0
CLOSE_WAIT = 10.0  # how long close() waits for a create/subscribe in flight before giving up on cleanup
HEARTBEAT_TAG = "modelsync-heartbeat"
HOST_TAG = "modelsync-host"
TASK_TAG = "modelsync-task"
METADATA_TIMEOUT = 2.0
MAX_METADATA = 1 << 20  # bytes of the task metadata document read at most
CLOCK_SLACK = 2.0  # seconds this host's clock may differ from SQS's before a creation tag is rewritten

# --fanout controller (controller/fanout.py makes the queues; the same names there)
TASK_ID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MAX_TASK_ID = 36
MAX_TASK_PREFIX = MAX_QUEUE_NAME - MAX_TASK_ID  # 44
LOOKUP_FIRST, LOOKUP_MAX = 1.0, 20.0  # seconds between looks for the queue the controller makes
FLEET_KEY = ".modelsync/fleet.json"
FLEET_STALE = 900.0  # seconds: an older count (the controller rewrites it every 300 s at least) is unknown
MAX_FLEET_DOC = 4096
MAX_HOSTS = 1_000_000

_PREFIX = re.compile(r"[A-Za-z0-9_-]+")
_TOPIC = re.compile(r"arn:(aws[a-z-]*):sns:([a-z0-9-]+):(\d{12}):([A-Za-z0-9_-]{1,256}(?:\.fifo)?)")
_GONE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
_NAME_TAKEN = {"QueueAlreadyExists", "QueueNameExists", "AWS.SimpleQueueService.QueueDeletedRecently"}
_NOT_FOUND = {"NotFound", "NotFoundException", "ResourceNotFound"}


class FanoutError(RuntimeError):
    """A fan-out step failed; the daemon logs it and retries (the reconcile timer covers the gap)."""


class SetupError(FanoutError):
    """Creating, securing or subscribing this daemon's queue failed (``step`` names which call)."""

    def __init__(self, step: str, queue: str, exc: BaseException) -> None:
        super().__init__(f"fan-out {step} for queue {queue}: {_reason(exc)}")
        self.step = step


class QueueGone(FanoutError):
    """This daemon's own queue no longer exists: a new one is made under a new name."""


# --- settings' validators (used by settings.py) ------------------------------------------------------


def check_topic_arn(text: str) -> str:
    """An SNS topic ARN, or empty (fan-out off)."""
    if not text:
        return ""
    m = _TOPIC.fullmatch(text.strip())
    if not m:
        raise ValueError("must be an SNS topic ARN: arn:aws:sns:<region>:<12-digit account>:<topic name>")
    if m.group(4).endswith(".fifo"):
        raise ValueError("a FIFO topic delivers only to FIFO queues; use a standard topic")
    return m.group(0)


def check_queue_prefix(text: str) -> str:
    """A queue name prefix that leaves room for the id: 1-68 of ``A-Z a-z 0-9 _ -``."""
    if not _PREFIX.fullmatch(text) or len(text) > MAX_PREFIX:
        raise ValueError(
            f"must be 1-{MAX_PREFIX} characters of A-Z, a-z, 0-9, '_' and '-' (SQS queue names are at most "
            f"{MAX_QUEUE_NAME} characters and the daemon appends a {ID_HEX}-character id)"
        )
    return text


def check_task_queue_prefix(prefix: str) -> str:
    """With ``--fanout controller`` the ECS task id (up to 36 characters) follows the prefix within SQS's 80."""
    if len(prefix) > MAX_TASK_PREFIX:
        raise ValueError(
            f"is {len(prefix)} characters: with --fanout controller the queue is <prefix><ECS task id> (up to "
            f"{MAX_TASK_ID} characters) within SQS's {MAX_QUEUE_NAME}, so the prefix is at most {MAX_TASK_PREFIX}"
        )
    return prefix


def topic_region(topic_arn: str) -> str:
    return topic_arn.split(":")[3]


# --- helpers -------------------------------------------------------------------------------------


def _code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _queue_name(url_or_arn: str) -> str:
    return url_or_arn.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def task_arn(environ: Mapping[str, str]) -> str:
    """This ECS task's ARN from the task metadata endpoint (v4), or empty outside ECS or when it does not answer."""
    base = environ.get("ECS_CONTAINER_METADATA_URI_V4", "")
    if not base.startswith(("http://", "https://")):
        return ""
    try:
        with urllib.request.urlopen(base.rstrip("/") + "/task", timeout=METADATA_TIMEOUT) as resp:
            doc = loads(resp.read(MAX_METADATA + 1), MAX_METADATA)  # read as data: deep, huge or odd, it is refused
        arn = doc.get("TaskARN") if isinstance(doc, dict) else None
        return arn if isinstance(arn, str) else ""
    except (OSError, ValueError):  # Malformed is a ValueError
        return ""


@dataclass
class SweepReport:
    """What one sweep saw and did (logged; returned for tests)."""

    listed: int = 0  # queues of our name form, this daemon's included
    deleted: list[str] = field(default_factory=list)  # queue names
    unsubscribed: list[str] = field(default_factory=list)  # subscription ARNs
    errors: list[str] = field(default_factory=list)


@dataclass
class _Subscription:
    arn: str
    queue: str  # the endpoint queue's name
    region: str
    account: str


class Fanout:
    """This daemon's own queue on the topic: set up, polled, kept alive, cleaned up; and the fleet's orphans swept.

    ``start()`` runs two threads: one sets the queue up (retrying) and then
    polls it through :class:`QueuePoller` and refreshes the heartbeat; the
    other sweeps. ``close()`` unsubscribes and deletes the queue. ``setup``,
    ``heartbeat``, ``sweep`` and ``teardown`` are usable on their own.
    """

    def __init__(
        self,
        sqs: Any,
        sns: Any,
        topic_arn: str,
        prefix: str,
        filt: EventFilter,
        pending: Pending,
        log: logging.Logger,
        *,
        host: str = "",
        environ: Mapping[str, str] | None = None,
        lease: float = LEASE,
        heartbeat_every: float = HEARTBEAT_EVERY,
        sweep_every: float = SWEEP_EVERY,
        first_sweep_max: float = FIRST_SWEEP_MAX,
        wait_seconds: int = 10,
        retry_first: float = RETRY_FIRST,
        retry_max: float = RETRY_MAX,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sqs = sqs
        self.sns = sns
        self.topic_arn = topic_arn
        self.region = topic_region(topic_arn)
        self.prefix = prefix
        self.filter = filt
        self.pending = pending
        self.log = log
        self.host = host
        self.environ = os.environ if environ is None else environ
        self.lease = lease
        self.heartbeat_every = heartbeat_every
        self.sweep_every = sweep_every
        self.first_sweep_max = first_sweep_max
        self.wait_seconds = wait_seconds
        self.retry_first = retry_first
        self.retry_max = retry_max
        self.clock = clock
        self.conditions = Conditions(log)
        self._ours = re.compile(re.escape(prefix) + f"[0-9a-f]{{{ID_HEX}}}")
        self._lock = threading.Lock()  # setup and teardown: never both at once
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._task_arn: str | None = None
        self.queue_name = self._new_name()
        self.queue_url = ""
        self.queue_arn = ""
        self.policy_set = False
        self.subscription_arn = ""
        self._next_heartbeat = 0.0
        self._poller: QueuePoller | None = None
        self._offset = 0.0  # SQS's clock minus ours, from the Date header of its answers

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._run_queue, name="fanout-queue", daemon=True),
            threading.Thread(target=self._run_sweeps, name="fanout-sweep", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        """Stop polling and sweeping, then unsubscribe and delete this daemon's queue (errors logged)."""
        self._stop.set()
        self.teardown()
        for t in self._threads:
            t.join(0.5)  # a long poll in flight ends by itself; the process may exit under it

    @property
    def ready(self) -> bool:
        """The queue exists, may receive from the topic, and is subscribed."""
        return bool(self.subscription_arn)

    def now(self) -> float:
        """Unix time on SQS's clock (as of its last answer), which CreatedTimestamp and every heartbeat use."""
        return self.clock() + self._offset

    def _note_clock(self, resp: Any) -> None:
        try:
            date = resp["ResponseMetadata"]["HTTPHeaders"]["date"]
            self._offset = parsedate_to_datetime(date).timestamp() - self.clock()
        except (KeyError, TypeError, ValueError, IndexError):
            pass

    # --- this daemon's queue ---------------------------------------------------------------------

    def setup(self) -> None:
        """Create the queue, set its policy, subscribe it: each missing step, in order; raises SetupError."""
        with self._lock:
            if self._stop.is_set():
                return
            if not self.queue_url:
                self._create()
            if not self.queue_arn:
                self.queue_arn = self._call(
                    "GetQueueAttributes",
                    lambda: self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"]),
                )["Attributes"]["QueueArn"]
            if not self.policy_set:
                policy = json.dumps(queue_policy(self.queue_arn, self.topic_arn))
                self._call(
                    "SetQueueAttributes",
                    lambda: self.sqs.set_queue_attributes(QueueUrl=self.queue_url, Attributes={"Policy": policy}),
                )
                self.policy_set = True
            if not self.subscription_arn:
                resp = self._call(
                    "Subscribe",
                    lambda: self.sns.subscribe(
                        TopicArn=self.topic_arn,
                        Protocol="sqs",
                        Endpoint=self.queue_arn,
                        Attributes={"RawMessageDelivery": "false"},
                        ReturnSubscriptionArn=True,
                    ),
                )
                self.subscription_arn = str(resp["SubscriptionArn"])
                self.log.info(
                    "fan-out queue subscribed to the topic",
                    extra={
                        "fields": {
                            "queue": self.queue_name,
                            "topic": self.topic_arn,
                            "subscription": self.subscription_arn,
                        }
                    },
                )

    def _create(self) -> None:
        tags = {HEARTBEAT_TAG: str(int(self.now()))}
        if self.host:
            tags[HOST_TAG] = self.host[:256]
        if self._task_arn is None:
            self._task_arn = task_arn(self.environ)
        if self._task_arn:
            tags[TASK_TAG] = self._task_arn[:256]
        name = self.queue_name
        try:
            resp = self.sqs.create_queue(
                QueueName=name,
                Attributes={"SqsManagedSseEnabled": "true", "MessageRetentionPeriod": str(RETENTION_SECONDS)},
                tags=tags,
            )
        except ClientError as exc:
            if _code(exc) in _NAME_TAKEN:
                self.queue_name = self._new_name()  # the next attempt uses another name
            raise SetupError("CreateQueue", name, exc) from None
        except Exception as exc:
            raise SetupError("CreateQueue", name, exc) from None
        self._note_clock(resp)
        self.queue_url = str(resp["QueueUrl"])
        self._next_heartbeat = time.monotonic() + self.heartbeat_every
        if abs(self._offset) > CLOCK_SLACK:  # the creation tag used this host's clock: rewrite it on SQS's now
            try:
                self.heartbeat()
            except FanoutError:
                self._next_heartbeat = 0.0  # the polling thread tries again
        self.log.info(
            "fan-out queue created",
            extra={
                "fields": {
                    "queue": name,
                    "queue_url": self.queue_url,
                    "topic": self.topic_arn,
                    "retention_s": RETENTION_SECONDS,
                    "task": self._task_arn or None,
                }
            },
        )

    def _call(self, step: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ClientError as exc:
            if _code(exc) in _GONE:
                raise QueueGone(f"fan-out queue {self.queue_name} no longer exists ({step})") from None
            raise SetupError(step, self.queue_name, exc) from None
        except Exception as exc:
            raise SetupError(step, self.queue_name, exc) from None

    def heartbeat(self) -> None:
        """Mark the queue alive (tag ``modelsync-heartbeat`` = now); QueueGone when it no longer exists."""
        try:
            resp = self.sqs.tag_queue(QueueUrl=self.queue_url, Tags={HEARTBEAT_TAG: str(int(self.now()))})
        except ClientError as exc:
            if _code(exc) in _GONE:
                raise QueueGone(f"fan-out queue {self.queue_name} no longer exists (TagQueue)") from None
            raise FanoutError(f"fan-out heartbeat on {self.queue_name}: {_reason(exc)}") from None
        except Exception as exc:
            raise FanoutError(f"fan-out heartbeat on {self.queue_name}: {_reason(exc)}") from None
        self._note_clock(resp)
        self._next_heartbeat = time.monotonic() + self.heartbeat_every

    def poll_once(self) -> int:
        """One long poll of the queue through the shared poller (filter, pending); QueueGone when it vanished."""
        if self._poller is None or self._poller.queue_url != self.queue_url:
            self._poller = QueuePoller(
                self.sqs, self.queue_url, self.filter, self.pending, self.log, wait_seconds=self.wait_seconds
            )
        try:
            n = self._poller.poll_once()
        except ClientError as exc:
            if _code(exc) in _GONE:
                raise QueueGone(f"fan-out queue {self.queue_name} no longer exists (ReceiveMessage)") from None
            raise FanoutError(f"fan-out receive from {self.queue_name}: {_reason(exc)}") from None
        if n:
            self.log.debug("fan-out: %d message(s) received", n, extra={"fields": {"queue": self.queue_name}})
        return n

    def teardown(self) -> None:
        """Unsubscribe and delete this daemon's queue; every failure is logged, never raised."""
        if not self._lock.acquire(timeout=CLOSE_WAIT):
            self.log.warning(
                "fan-out: a create/subscribe call is still in flight; queue %s is left for another daemon's "
                "sweep (after the %.0f s lease)",
                self.queue_name,
                self.lease,
                extra={"fields": {"queue": self.queue_name}},
            )
            return
        try:
            self._teardown()
        finally:
            self._lock.release()

    def _teardown(self) -> None:
        fields = {"queue": self.queue_name, "subscription": self.subscription_arn or None}
        if self.subscription_arn:
            try:
                self.sns.unsubscribe(SubscriptionArn=self.subscription_arn)
                self.log.info("fan-out queue unsubscribed", extra={"fields": fields})
            except Exception as exc:
                if _code(exc) not in _NOT_FOUND:
                    self.log.warning(
                        "fan-out: cannot unsubscribe %s: %s; another daemon's sweep removes it once the queue is gone",
                        self.subscription_arn,
                        _reason(exc),
                        extra={"fields": fields},
                    )
        if self.queue_url:
            try:
                self.sqs.delete_queue(QueueUrl=self.queue_url)
                self.log.info("fan-out queue deleted", extra={"fields": fields})
            except Exception as exc:
                if _code(exc) not in _GONE:
                    self.log.warning(
                        "fan-out: cannot delete queue %s: %s; another daemon's sweep deletes it after the %.0f s lease",
                        self.queue_name,
                        _reason(exc),
                        self.lease,
                        extra={"fields": fields},
                    )
        self._forget()

    def _forget(self) -> None:
        """Drop this daemon's queue state; the next setup creates a new queue under a new name."""
        self.queue_name = self._new_name()
        self.queue_url = self.queue_arn = self.subscription_arn = ""
        self.policy_set = False
        self._poller = None

    def _new_name(self) -> str:
        return self.prefix + secrets.token_hex(ID_HEX // 2)

    def _run_queue(self) -> None:
        delay = self.retry_first
        while not self._stop.is_set():
            try:
                if self.queue_url and time.monotonic() >= self._next_heartbeat:
                    self.heartbeat()
                if not self.ready:
                    self.setup()
                    if not self.ready:  # stopped meanwhile
                        continue
                    delay = self.retry_first
                self.poll_once()
                self.conditions.set("fanout", None)
            except QueueGone as exc:
                if self._stop.is_set():
                    break
                self.log.warning("%s; creating a new queue", exc, extra={"fields": {"queue": self.queue_name}})
                with self._lock:
                    self._forget()
            except Exception as exc:  # every failure is retried: the reconcile timer covers the gap
                if self._stop.is_set():
                    break
                self.conditions.set("fanout", f"{exc}; retrying in {delay:.0f}s", queue=self.queue_name)
                self._stop.wait(delay)
                delay = min(delay * 2, self.retry_max)

    # --- the fleet's orphans ---------------------------------------------------------------------

    def _run_sweeps(self) -> None:
        wait = random.uniform(0, self.first_sweep_max)
        while not self._stop.wait(wait):
            report = self.sweep()
            wait = self.sweep_every * max(1.0, report.listed / FLEET_SWEEPS) * random.uniform(0.5, 1.5)

    def sweep(self) -> SweepReport:
        """Delete queues of our name form idle for longer than the lease, and subscriptions to vanished queues.

        Never raises: every failed call is logged and counted in the report.
        """
        report = SweepReport()
        subs = self._subscriptions(report)
        own = self.subscription_arn
        if subs is not None and own and own not in {sub.arn for sub in subs}:
            self.log.warning(
                "fan-out: this daemon's subscription %s is gone from the topic; subscribing again",
                own,
                extra={"fields": {"queue": self.queue_name, "subscription": own}},
            )
            with self._lock:
                if self.subscription_arn == own:
                    self.subscription_arn = ""  # the polling thread subscribes again (Subscribe is idempotent)
        by_queue: dict[str, list[_Subscription]] = {}
        for sub in subs or []:
            by_queue.setdefault(sub.queue, []).append(sub)
        listed = self._list_queues(report)
        now = self.now()  # on SQS's clock, as of the listing
        for url in listed or []:
            name = _queue_name(url)
            if url == self.queue_url or name == self.queue_name:
                continue
            try:
                idle = self._idle_seconds(url, now)
            except Exception as exc:
                if _code(exc) not in _GONE:
                    self._sweep_error(report, f"cannot read queue {name}: {_reason(exc)}", name)
                continue
            if idle is None or idle <= self.lease:
                continue
            for sub in by_queue.pop(name, []):  # first stop SNS sending to it
                self._unsubscribe(sub, report, f"its queue {name} is an orphan")
            try:
                self.sqs.delete_queue(QueueUrl=url)
            except Exception as exc:
                if _code(exc) not in _GONE:
                    self._sweep_error(report, f"cannot delete orphan queue {name}: {_reason(exc)}", name)
                continue
            report.deleted.append(name)
            self.log.info(
                "fan-out: deleted orphan queue %s (idle %.0f s, lease %.0f s)",
                name,
                idle,
                self.lease,
                extra={"fields": {"queue": name, "idle_s": round(idle), "lease_s": self.lease}},
            )
        names = {_queue_name(u) for u in listed} if listed is not None else set()
        for queue, queue_subs in by_queue.items():
            if queue == self.queue_name or queue in names:
                continue
            for sub in queue_subs:
                if sub.arn == self.subscription_arn:
                    continue
                try:
                    exists = self._queue_exists(sub)
                except Exception as exc:
                    self._sweep_error(report, f"cannot check queue {queue}: {_reason(exc)}", queue)
                    continue
                if not exists:
                    self._unsubscribe(sub, report, f"its queue {queue} no longer exists")
        level = logging.INFO if report.deleted or report.unsubscribed or report.errors else logging.DEBUG
        self.log.log(
            level,
            "fan-out sweep done",
            extra={
                "fields": {
                    "listed": report.listed,
                    "deleted": report.deleted,
                    "unsubscribed": len(report.unsubscribed),
                    "errors": len(report.errors),
                }
            },
        )
        return report

    def live_hosts(self) -> int | None:
        """How many daemons read a queue of this fleet now (this one included): queues of our name form whose
        last sign of life is within the lease. None when SQS cannot be asked. A rollout sizes its canary
        share with it; a daemon killed moments ago still counts until its queue's lease runs out."""
        report = SweepReport()
        listed = self._list_queues(report)
        if listed is None:
            return None
        now = self.now()
        live = 0
        for url in listed:
            if url == self.queue_url or _queue_name(url) == self.queue_name:
                live += 1
                continue
            try:
                idle = self._idle_seconds(url, now)
            except Exception:
                continue  # deleted meanwhile, or unreadable: not a host to count on
            live += idle is None or idle <= self.lease
        if not self.queue_url:
            live += 1  # this daemon, whose queue is still being made
        return live

    def _list_queues(self, report: SweepReport) -> list[str] | None:
        """Queue URLs of our name form (ListQueues with the prefix, every page); None when the listing failed."""
        urls: list[str] = []
        try:
            for page in self._pages(
                lambda token: self.sqs.list_queues(
                    QueueNamePrefix=self.prefix, MaxResults=1000, **({"NextToken": token} if token else {})
                )
            ):
                self._note_clock(page)
                urls += [u for u in page.get("QueueUrls", []) if self._ours.fullmatch(_queue_name(u))]
        except Exception as exc:
            self._sweep_error(report, f"cannot list queues named {self.prefix}*: {_reason(exc)}", "")
            return None
        report.listed = len(urls)
        return urls

    def _subscriptions(self, report: SweepReport) -> list[_Subscription] | None:
        """The topic's SQS subscriptions to queues of our name form in the topic's region; None when that failed."""
        out: list[_Subscription] = []
        try:
            for page in self._pages(
                lambda token: self.sns.list_subscriptions_by_topic(
                    TopicArn=self.topic_arn, **({"NextToken": token} if token else {})
                )
            ):
                for sub in page.get("Subscriptions", []):
                    endpoint = str(sub.get("Endpoint", ""))
                    parts = endpoint.split(":")
                    arn = str(sub.get("SubscriptionArn", ""))
                    if (
                        sub.get("Protocol") != "sqs"
                        or len(parts) != 6
                        or not arn.startswith("arn:")  # "PendingConfirmation" cannot be unsubscribed
                        or parts[3] != self.region
                        or not self._ours.fullmatch(parts[5])
                    ):
                        continue
                    out.append(_Subscription(arn, parts[5], parts[3], parts[4]))
        except Exception as exc:
            self._sweep_error(report, f"cannot list the subscriptions of {self.topic_arn}: {_reason(exc)}", "")
            return None
        return out

    @staticmethod
    def _pages(call: Callable[[str], Any]) -> Iterator[Any]:
        token = ""
        while True:
            page = call(token)
            yield page
            token = str(page.get("NextToken") or "")
            if not token:
                return

    def _idle_seconds(self, url: str, now: float) -> float | None:
        """Seconds since the queue's last sign of life (heartbeat tag or creation); None: younger than the lease."""
        attrs = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["CreatedTimestamp"])["Attributes"]
        created = float(attrs.get("CreatedTimestamp") or 0)
        if now - created <= self.lease:
            return None  # just created: its tags may not be visible yet
        tags = self.sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
        try:
            beat = float(tags.get(HEARTBEAT_TAG, 0))
        except ValueError:
            beat = 0.0
        if not math.isfinite(beat):  # "inf" would keep a dead queue alive for ever
            beat = 0.0
        return now - max(created, beat)

    def _queue_exists(self, sub: _Subscription) -> bool:
        try:
            self.sqs.get_queue_url(QueueName=sub.queue, QueueOwnerAWSAccountId=sub.account)
        except ClientError as exc:
            if _code(exc) in _GONE:
                return False
            raise
        return True

    def _unsubscribe(self, sub: _Subscription, report: SweepReport, why: str) -> None:
        try:
            self.sns.unsubscribe(SubscriptionArn=sub.arn)
        except Exception as exc:
            if _code(exc) not in _NOT_FOUND:
                self._sweep_error(report, f"cannot unsubscribe {sub.arn}: {_reason(exc)}", sub.queue)
            return
        report.unsubscribed.append(sub.arn)
        self.log.info(
            "fan-out: removed subscription %s (%s)",
            sub.arn,
            why,
            extra={"fields": {"queue": sub.queue, "subscription": sub.arn}},
        )

    def _sweep_error(self, report: SweepReport, text: str, queue: str) -> None:
        report.errors.append(text)
        self.log.warning("fan-out sweep: %s; trying again at the next sweep", text, extra={"fields": {"queue": queue}})


class TaskQueue:
    """``--fanout controller``: this ECS task's queue, ``<prefix><task id>``, made and subscribed by the controller.

    The daemon finds it by name (``GetQueueUrl``), long-polls it through :class:`QueuePoller` and deletes
    what it read; it never creates, tags, reconfigures, subscribes or deletes a queue (its role cannot). Until
    the queue exists (a task the controller has not seen yet, a stopped controller) it looks again every few
    seconds (1 s doubling to 20 s) and says once that it waits; the reconcile at start and every
    ``--interval`` keeps the host converging meanwhile. A queue that disappears (the controller removed it:
    ECS says the task stopped) is waited for again.
    """

    def __init__(
        self,
        sqs: Any,
        prefix: str,
        filt: EventFilter,
        pending: Pending,
        log: logging.Logger,
        *,
        environ: Mapping[str, str] | None = None,
        wait_seconds: int = 10,
        retry_first: float = LOOKUP_FIRST,
        retry_max: float = LOOKUP_MAX,
    ) -> None:
        self.sqs = sqs
        self.prefix = prefix
        self.filter = filt
        self.pending = pending
        self.log = log
        self.environ = os.environ if environ is None else environ
        self.wait_seconds = wait_seconds
        self.retry_first = retry_first
        self.retry_max = retry_max
        self.conditions = Conditions(log)
        self.queue_name = ""
        self.queue_url = ""
        self._poller: QueuePoller | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return bool(self.queue_url)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fanout-queue", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop polling; the queue stays (the controller removes it once ECS says the task stopped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(0.5)

    def name(self) -> str:
        """``<prefix><task id>`` from the task metadata; empty while the task's id cannot be read."""
        if not self.queue_name:
            tid = task_arn(self.environ).rsplit("/", 1)[-1]
            if TASK_ID.fullmatch(tid):
                self.queue_name = self.prefix + tid
        return self.queue_name

    def lookup(self) -> bool:
        """Find the queue by name; False (said once) while it does not exist. Raises FanoutError otherwise."""
        name = self.name()
        if not name:
            self.conditions.set(
                "fanout",
                "fan-out: this task's id cannot be read from the ECS task metadata (ECS_CONTAINER_METADATA_URI_V4), "
                "so its queue cannot be named; reconciling every --interval meanwhile",
            )
            return False
        try:
            got = self.sqs.get_queue_url(QueueName=name)
        except ClientError as exc:
            if _code(exc) in _GONE:
                self.conditions.set(
                    "fanout",
                    f"fan-out: waiting for the controller to make queue {name} for this task; reconciling every "
                    "--interval meanwhile",
                    level=logging.INFO,
                    queue=name,
                )
                return False
            raise FanoutError(f"fan-out GetQueueUrl for queue {name}: {_reason(exc)}") from None
        except Exception as exc:
            raise FanoutError(f"fan-out GetQueueUrl for queue {name}: {_reason(exc)}") from None
        self.queue_url = str(got["QueueUrl"])
        self.conditions.set("fanout", None, queue=name)
        self.log.info("fan-out queue found (made by the controller)", extra={"fields": {"queue": name}})
        return True

    def poll_once(self) -> int:
        """One long poll of the queue; QueueGone when it no longer exists."""
        if self._poller is None or self._poller.queue_url != self.queue_url:
            self._poller = QueuePoller(
                self.sqs, self.queue_url, self.filter, self.pending, self.log, wait_seconds=self.wait_seconds
            )
        try:
            return self._poller.poll_once()
        except ClientError as exc:
            if _code(exc) in _GONE:
                raise QueueGone(f"fan-out queue {self.queue_name} no longer exists (ReceiveMessage)") from None
            raise FanoutError(f"fan-out receive from {self.queue_name}: {_reason(exc)}") from None

    def _run(self) -> None:
        delay = self.retry_first
        while not self._stop.is_set():
            try:
                if not self.ready and not self.lookup():
                    self._stop.wait(delay)
                    delay = min(delay * 2, self.retry_max)
                    continue
                delay = self.retry_first
                self.poll_once()
                self.conditions.set("fanout-receive", None, queue=self.queue_name)
            except QueueGone as exc:
                self.log.warning("%s; waiting for the controller to make it again", exc,
                                 extra={"fields": {"queue": self.queue_name}})  # fmt: skip
                self.queue_url = ""
                self._poller = None
            except Exception as exc:  # retried: the reconcile timer covers the gap
                if self._stop.is_set():
                    break
                self.conditions.set("fanout-receive", f"{exc}; retrying in {delay:.0f}s", queue=self.queue_name)
                self._stop.wait(delay)
                delay = min(delay * 2, self.retry_max)


class FleetHosts:
    """``--fanout controller``: the live hosts a canary share is sized from, as the controller counted them.

    The controller writes ``<prefix>.modelsync/fleet.json`` (the Triton service's running tasks, from ECS)
    whenever the count changes and at least every 5 minutes; nobody else may write it. A count older than
    :data:`FLEET_STALE` on S3's clock (the object's LastModified against the Date of S3's answer), missing or
    malformed is unknown (None): a rollout then waits rather than guess. One GET, at the start of a rollout.
    """

    def __init__(self, s3: Any, bucket: str, prefix: str, log: logging.Logger, stale_after: float = FLEET_STALE):
        self.s3 = s3
        self.bucket = bucket
        self.key = prefix + FLEET_KEY
        self.log = log
        self.stale_after = stale_after
        self.conditions = Conditions(log)

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def __call__(self) -> int | None:
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=self.key)
            body = got["Body"].read(MAX_FLEET_DOC + 1)
            age = self._now(got) - got["LastModified"].timestamp()
            running = loads(body, MAX_FLEET_DOC).get("running") if body else None
        except ClientError as exc:
            why = "it does not exist yet" if _code(exc) in {"NoSuchKey", "404"} else _reason(exc)
            self._unknown(f"cannot read the fleet size at {self.where}: {why}")
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # Malformed is a ValueError
            self._unknown(f"the fleet size at {self.where} is unreadable: {type(exc).__name__}: {exc}")
            return None
        if not isinstance(running, int) or isinstance(running, bool) or not 0 <= running <= MAX_HOSTS:
            self._unknown(f"the fleet size at {self.where} has no valid running count")
            return None
        if age > self.stale_after:
            self._unknown(
                f"the fleet size at {self.where} is {age:.0f} s old (the controller rewrites it every 300 s; "
                f"older than {self.stale_after:.0f} s is unknown): is the controller running?"
            )
            return None
        self.conditions.set("fleet-size", None)
        return running

    @staticmethod
    def _now(resp: Any) -> float:
        """S3's clock: the Date of its answer (S3 always sends one); this host's only where it sent none."""
        try:
            return parsedate_to_datetime(resp["ResponseMetadata"]["HTTPHeaders"]["date"]).timestamp()
        except (KeyError, TypeError, ValueError, IndexError):
            return time.time()

    def _unknown(self, why: str) -> None:
        self.conditions.set("fleet-size", f"{why}; a rollout waits for a known number of hosts")


def queue_policy(queue_arn: str, topic_arn: str) -> dict[str, Any]:
    """Only SNS, and only for this topic, may send to the queue."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "OnlyTheTopic",
                "Effect": "Allow",
                "Principal": {"Service": "sns.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": topic_arn}},
            }
        ],
    }


def build_task_queue(
    topic_arn: str, prefix: str, filt: EventFilter, pending: Pending, log: logging.Logger, sqs: Any = None
) -> TaskQueue:
    """``--fanout controller``: a TaskQueue whose client is in the topic's region (the queue lives beside it)."""
    from .s3 import make_client

    return TaskQueue(sqs if sqs is not None else make_client("sqs", region=topic_region(topic_arn)), prefix, filt,
                     pending, log)  # fmt: skip


def build_fanout(
    topic_arn: str,
    prefix: str,
    host: str,
    filt: EventFilter,
    pending: Pending,
    log: logging.Logger,
    sqs: Any = None,
    sns: Any = None,
) -> Fanout:
    """A Fanout whose clients are in the topic's region (the queue lives beside the topic)."""
    from .s3 import make_client

    region = topic_region(topic_arn)
    return Fanout(
        sqs if sqs is not None else make_client("sqs", region=region),
        sns if sns is not None else make_client("sns", region=region),
        topic_arn,
        prefix,
        filt,
        pending,
        log,
        host=host,
    )
