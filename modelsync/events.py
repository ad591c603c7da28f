"""Object events from SQS (S3 notifications, directly or through SNS, or EventBridge), as reconcile hints.

Delivery is at least once, late and out of order, so an event never says
what to install: it only names a model whose reconcile should run now (the
reconcile lists S3 and decides). What this module does with them:

- reads every body as data (shapes.py): a body of the wrong shape, size, depth or numbers is malformed,
  counted, logged and deleted, never an exception past the poller (it would be delivered again and again);
- parses the three envelopes, URL-decodes S3 notification keys (``+`` is a
  space there) and ignores ``s3:TestEvent``;
- drops duplicates and events older than one already seen for the same key
  (S3's ``sequencer``: hex strings, compared after right-padding the shorter
  with zeros; events without one are ordered by event time);
- keeps only the newest pending event per model;
- maps a rollout state object (``<prefix>.modelsync/rollouts/<model>.json``, ledger.py) to its model: a
  verdict written there reaches every daemon like an upload.

An EventBridge key is used as given and also URL-decoded when that differs:
reconciling a name that does not exist costs one listing and does nothing.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from telemetry.logs import Conditions
from telemetry.shapes import Doc, Malformed, loads

from .ledger import model_of_state
from .s3 import model_of

MAX_SEEN = 100_000


@dataclass(frozen=True)
class ObjectEvent:
    bucket: str
    key: str
    removed: bool
    sequencer: str = ""
    time: str = ""
    version_id: str = ""


MAX_BODY = 256 * 1024  # bytes: the largest SQS message, and so the largest body or SNS Message we read
MAX_KEY = 4096  # characters of an object key as sent: S3's 1,024 bytes, URL-encoded
MAX_FIELD = 256  # characters of the other strings we keep (bucket, event name, time, version id)
MAX_SEQUENCER = 64
MAX_REASON = 200  # characters of why a message was ignored, in its log line
_HEX = re.compile(r"[0-9A-Fa-f]*")

MalformedMessage = Malformed  # an SQS message of the wrong shape (the name callers know)


def parse(body: str | bytes) -> list[ObjectEvent]:
    """The object events of one SQS message body; MalformedMessage for a body of any other shape.

    Everything in a body is checked before use (JSON, size, depth, numbers, types: shapes.py): a message
    that is not what it claims to be must be dropped by the poller, never raise past it."""
    doc = Doc(loads(body, MAX_BODY))
    if doc.get("Type") == "Notification":  # through SNS: the S3 notification is a string inside
        return _events(Doc(loads(doc.text("Message"), MAX_BODY), "Message"))
    return _events(doc)


def _events(doc: Doc) -> list[ObjectEvent]:
    if doc.get("Event") == "s3:TestEvent":
        return []
    if doc.has("Records"):
        records = doc.items("Records")
        return [ev for i, rec in enumerate(records) for ev in _record(Doc(rec, f"{doc.at('Records')}[{i}]"))]
    if doc.get("source") == "aws.s3":
        return _bridge(doc)
    raise Malformed(doc.path, "neither an S3 notification, an SNS notification nor an EventBridge S3 event")


def _record(rec: Doc) -> list[ObjectEvent]:
    """One record of an S3 notification; other services' records and other S3 events are skipped."""
    source, name = (
        rec.text("eventSource", default="", limit=MAX_FIELD),
        rec.text("eventName", default="", limit=MAX_FIELD),
    )
    if not source.endswith("s3") or not name.startswith(("ObjectCreated", "ObjectRemoved")):
        return []
    s3 = rec.doc("s3")
    obj = s3.doc("object")
    return [
        ObjectEvent(
            s3.doc("bucket").text("name", limit=MAX_FIELD),
            unquote_plus(obj.text("key", limit=MAX_KEY)),
            name.startswith("ObjectRemoved"),
            _sequencer(obj),
            rec.text("eventTime", default="", limit=MAX_FIELD),
            obj.text("versionId", default="", limit=MAX_FIELD),
        )
    ]


def _bridge(doc: Doc) -> list[ObjectEvent]:
    """An EventBridge S3 event; kinds other than created and deleted are skipped."""
    detail = doc.doc("detail")
    kind = doc.text("detail-type", default="", limit=MAX_FIELD)
    if kind not in ("Object Created", "Object Deleted"):
        return []
    obj = detail.doc("object")
    bucket, key = detail.doc("bucket").text("name", limit=MAX_FIELD), obj.text("key", limit=MAX_KEY)
    sequencer, when, version = (
        _sequencer(obj),
        doc.text("time", default="", limit=MAX_FIELD),
        obj.text("version-id", default="", limit=MAX_FIELD),
    )
    removed = kind == "Object Deleted"
    return [ObjectEvent(bucket, k, removed, sequencer, when, version) for k in dict.fromkeys([key, unquote_plus(key)])]


def _sequencer(obj: Doc) -> str:
    """S3's ordering of one key's events: hex digits (compared as such by :func:`newer`)."""
    seq = obj.text("sequencer", default="", limit=MAX_SEQUENCER)
    if not _HEX.fullmatch(seq):
        raise Malformed(obj.at("sequencer"), "not hexadecimal")
    return seq


def newer(a: ObjectEvent, b: ObjectEvent) -> bool:
    """True when ``a`` happened after ``b`` (same key)."""
    if a.sequencer and b.sequencer:
        width = max(len(a.sequencer), len(b.sequencer))
        return a.sequencer.upper().ljust(width, "0") > b.sequencer.upper().ljust(width, "0")
    return a.time > b.time


class EventFilter:
    """Duplicates and stale events out; what is left names models to reconcile."""

    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.latest: OrderedDict[str, ObjectEvent] = OrderedDict()  # key -> newest event seen
        self.duplicates = 0
        self.stale = 0
        self.foreign = 0

    def accept(self, ev: ObjectEvent) -> str | None:
        """The model to reconcile for this event, or None (duplicate, stale, not ours)."""
        model = model_of(ev.key, self.prefix) or model_of_state(ev.key, self.prefix)  # an upload, or a rollout
        if ev.bucket != self.bucket or model is None:
            self.foreign += 1
            return None
        seen = self.latest.get(ev.key)
        if seen == ev:
            self.duplicates += 1
            return None
        if seen is not None and not newer(ev, seen):
            self.stale += 1
            return None
        self.latest[ev.key] = ev
        self.latest.move_to_end(ev.key)
        if len(self.latest) > MAX_SEEN:
            self.latest.popitem(last=False)
        return model


class Pending:
    """Models waiting for a reconcile, newest event per model, handed to the loop thread."""

    def __init__(self) -> None:
        self._models: OrderedDict[str, ObjectEvent] = OrderedDict()
        self._cond = threading.Condition()

    def put(self, model: str, ev: ObjectEvent) -> None:
        with self._cond:
            self._models[model] = ev
            self._models.move_to_end(model)
            self._cond.notify()

    def take(self, timeout: float) -> dict[str, ObjectEvent]:
        """Everything pending, waiting up to ``timeout`` for the first one."""
        with self._cond:
            if not self._models:
                self._cond.wait(timeout)
            out = dict(self._models)
            self._models.clear()
            return out

    def nudge(self, model: str) -> None:
        """Reconcile ``model`` soon although no event named it (a rollout in flight, modelsync/rollout.py)."""
        with self._cond:
            if model not in self._models:
                self._models[model] = ObjectEvent("", "", False)
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


class QueuePoller:
    """Long-polls the SQS queue on its own thread; every message is deleted once parsed, a malformed one
    too (counted in ``malformed`` and logged once).

    Deleting before the reconcile ran is safe: the reconcile at start (after a
    crash) and every ``--interval`` is what guarantees convergence, and an
    event is only a hint to do it sooner.
    """

    def __init__(
        self,
        client: Any,
        queue_url: str,
        filt: EventFilter,
        pending: Pending,
        log: Any,
        wait_seconds: int = 10,
        on_message: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.queue_url = queue_url
        self.filter = filt
        self.pending = pending
        self.log = log
        self.wait_seconds = wait_seconds
        self.on_message = on_message
        self.conditions = Conditions(log)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sqs-poller", daemon=True)
        self.received = 0
        self.malformed = 0

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()

    def poll_once(self) -> int:
        """One ReceiveMessage call; returns the number of messages handled."""
        resp = self.client.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=self.wait_seconds
        )
        messages = resp.get("Messages", [])
        for msg in messages:
            self.received += 1
            try:
                events = parse(msg.get("Body", ""))
            except Malformed as exc:
                self._ignore(msg, str(exc))
                continue
            except Exception as exc:  # a shape no check foresaw: the message must still be deleted
                self._ignore(msg, f"{type(exc).__name__}: {exc}")
                continue
            for ev in events:
                model = self.filter.accept(ev)
                if model is not None:
                    self.pending.put(model, ev)
        if messages:
            self.client.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )
            if self.on_message:
                self.on_message()
        return len(messages)

    def _ignore(self, msg: Any, reason: str) -> None:
        """Count a malformed message and say why, in one line (the reason, never the body); it is deleted
        with the batch: delivering it again could never make it readable."""
        self.malformed += 1
        self.log.warning(
            "ignored an SQS message: %s",
            reason[:MAX_REASON],
            extra={"fields": {"message_id": str(msg.get("MessageId"))[:100], "malformed": self.malformed}},
        )

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll_once()
                self.conditions.set("sqs", None)
            except Exception as exc:  # a queue outage must not end the daemon: the reconcile still runs
                self.conditions.set("sqs", f"cannot receive from {self.queue_url}: {exc}; retrying in 5s")
                self.stop.wait(5)
