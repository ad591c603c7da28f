"""Object events from SQS (S3 notifications, directly or through SNS, or EventBridge), as reconcile hints.

Delivery is at least once, late and out of order, so an event never says
what to install: it only names a model whose reconcile should run now (the
reconcile lists S3 and decides). What this module does with them:

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

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from telemetry.logs import Conditions

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


class MalformedMessage(ValueError):
    """An SQS message that is none of the event envelopes we know."""


def parse(body: str) -> list[ObjectEvent]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise MalformedMessage(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedMessage("not a JSON object")
    if doc.get("Type") == "Notification" and isinstance(doc.get("Message"), str):  # through SNS
        return parse(doc["Message"])
    if doc.get("Event") == "s3:TestEvent":
        return []
    if isinstance(doc.get("Records"), list):
        out = []
        for rec in doc["Records"]:
            s3 = rec.get("s3") if isinstance(rec, dict) else None
            if not isinstance(s3, dict) or not str(rec.get("eventSource", "")).endswith("s3"):
                continue
            obj, bucket = s3.get("object") or {}, (s3.get("bucket") or {}).get("name", "")
            name = str(rec.get("eventName", ""))
            if "key" not in obj or not (name.startswith("ObjectCreated") or name.startswith("ObjectRemoved")):
                continue
            out.append(
                ObjectEvent(
                    bucket,
                    unquote_plus(str(obj["key"])),
                    name.startswith("ObjectRemoved"),
                    str(obj.get("sequencer") or ""),
                    str(rec.get("eventTime") or ""),
                    str(obj.get("versionId") or ""),
                )
            )
        return out
    if doc.get("source") == "aws.s3" and isinstance(doc.get("detail"), dict):
        detail = doc["detail"]
        obj, bucket = detail.get("object") or {}, (detail.get("bucket") or {}).get("name", "")
        kind = str(doc.get("detail-type", ""))
        if "key" not in obj or kind not in ("Object Created", "Object Deleted"):
            return []
        key = str(obj["key"])
        keys = dict.fromkeys([key, unquote_plus(key)])
        return [
            ObjectEvent(
                bucket,
                k,
                kind == "Object Deleted",
                str(obj.get("sequencer") or ""),
                str(doc.get("time") or ""),
                str(obj.get("version-id") or ""),
            )
            for k in keys
        ]
    raise MalformedMessage("neither an S3 notification, an SNS notification nor an EventBridge S3 event")


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
    """Long-polls the SQS queue on its own thread; every message is deleted once parsed.

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
            except MalformedMessage as exc:
                self.malformed += 1
                self.log.warning(
                    "ignored an SQS message: %s", exc, extra={"fields": {"message_id": msg.get("MessageId")}}
                )
                events = []
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

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll_once()
                self.conditions.set("sqs", None)
            except Exception as exc:  # a queue outage must not end the daemon: the reconcile still runs
                self.conditions.set("sqs", f"cannot receive from {self.queue_url}: {exc}; retrying in 5s")
                self.stop.wait(5)
