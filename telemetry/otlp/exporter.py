"""OTLP/HTTP export from a sender thread: the producer only appends to a bounded FIFO.

``submit`` serializes the items and queues them; the sender thread takes
the oldest into a request within the signal's limits (items per request,
5 MB uncompressed), gzips it, signs it when the endpoint is signed, and
posts it. An unreachable, slow or throttling endpoint fills the FIFO; when
it is full the oldest items are dropped and counted. A 429, a 5xx, a
timeout or a refused connection is retried with capped, jittered
exponential backoff (``Retry-After`` wins when given) until the batch runs
out of attempts or age; any other answer but 200 drops the batch. A 200
may still refuse part of it (``partial_success``), which is counted too.
:meth:`OtlpHttpExporter.stats` holds every count, for the exporter's own
metrics: accepted = sent + every dropped_* + pending.
"""

from __future__ import annotations

import collections
import email.utils
import gzip
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Generic

import requests
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ..logs import Conditions, get
from .endpoint import Endpoint
from .signals import MAX_REQUEST_BYTES, PREFIX_MAX, P, Signal, encode, head
from .sigv4 import CredentialsMissing, Signer

log = get("otlp")
CLIP = 300  # characters of a refusing answer's body kept in the log


@dataclass(frozen=True)
class ExportOptions:
    """How much to hold, how long to wait, how hard to retry."""

    capacity: int = 20_000  # items (spans, metrics) buffered; the oldest go first
    capacity_bytes: int = 64 << 20  # and their serialized bytes, so 200 KB spans cannot take gigabytes
    max_request_bytes: int = MAX_REQUEST_BYTES  # uncompressed
    linger: float = 0.2  # seconds a request waits to fill once it has an item
    connect_timeout: float = 3.0
    timeout: float = 10.0  # seconds to wait for each read of the answer
    max_attempts: int = 8  # per batch, the first included
    max_batch_age: float = 120.0  # seconds a batch is retried at most
    backoff_start: float = 0.5
    backoff_max: float = 30.0
    retry_after_max: float = 60.0  # a Retry-After beyond this is shortened to it
    gzip: bool = True
    gzip_level: int = 5


@dataclass
class ExportStats:
    """Cumulative counts; items in the signal's unit (spans, data points) unless named otherwise."""

    accepted: int = 0  # everything submitted, dropped later or not
    sent: int = 0  # in requests answered 200 (including any partially rejected)
    dropped_buffer_full: int = 0  # the oldest, pushed out of a full FIFO
    dropped_oversize: int = 0  # an item over the endpoint's per-item or per-request limit
    dropped_rejected_http: int = 0  # requests refused with a status that is not retried (400, 403, 413...)
    dropped_undelivered: int = 0  # out of attempts or age, or still queued at close
    rejected_partial: int = 0  # refused inside a 200 (partial_success)
    retries: int = 0  # requests sent again (requests, not items)
    failed_batches: int = 0  # requests given up (refused, out of attempts or age, abandoned at close)
    requests_sent: int = 0  # requests answered 200
    bytes_sent: int = 0  # their bodies, as sent (compressed)

    @property
    def delivered(self) -> int:
        """Items the endpoint kept: sent, less what a 200 answer rejected."""
        return self.sent - self.rejected_partial

    def dropped_by_reason(self) -> dict[str, int]:
        """Every item lost, by the reason the outputs' own metrics name (docs/tracing.md, docs/otlp.md)."""
        return {
            "buffer_full": self.dropped_buffer_full,
            "oversize": self.dropped_oversize,
            "rejected": self.dropped_rejected_http,
            "failed": self.dropped_undelivered,
            "partial": self.rejected_partial,
        }


@dataclass(eq=False)
class Entry:
    """One queued item: its resource and scope heads (shared between the items of one submit) and bytes."""

    resource: bytes
    scope: bytes
    data: bytes
    units: int


@dataclass(eq=False)
class Batch:
    entries: list[Entry]
    units: int
    started: float
    attempts: int = 0


@dataclass(frozen=True)
class Answer:
    """What one post came to: ``ok``, ``retry`` (after ``delay`` if the endpoint said) or ``refused``."""

    outcome: str
    status: int = 0
    detail: str = ""
    delay: float | None = None
    body: bytes = b""


def retry_after(value: str | None, now: float) -> float | None:
    """Retry-After in seconds (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


class OtlpHttpExporter(Generic[P]):
    """Posts one signal's items to one OTLP/HTTP endpoint from a sender thread, behind a bounded FIFO."""

    def __init__(
        self,
        signal: Signal[P],
        endpoint: Endpoint,
        options: ExportOptions | None = None,
        signer: Signer | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.signal = signal
        self.endpoint = endpoint
        self.options = options or ExportOptions()
        self.max_units = signal.max_units
        self.signer = signer or (Signer(endpoint.service, endpoint.region) if endpoint.signed else None)
        self.verify: str | bool = env.get("AWS_CA_BUNDLE") or True  # as boto3: a private CA for a proxy or test
        self.queue: collections.deque[Entry] = collections.deque()
        self.queued_bytes = 0
        self.queued_units = 0
        self.cond = threading.Condition()
        self.wake = threading.Event()  # set by close(): cuts a backoff short
        self.counts = ExportStats()
        self.inflight: Batch | None = None
        self.closing = False
        self.deadline = float("inf")
        self.failures = 0  # consecutive failed posts, for the backoff; reset by a 200
        self.conditions = Conditions(log)
        self.session: requests.Session | None = None
        self.thread = threading.Thread(target=self._run, name=f"otlp-{signal.name}", daemon=True)
        self.thread.start()

    # --- producer side ------------------------------------------------------------------

    def submit(
        self,
        resource: Resource,
        scope: InstrumentationScope,
        items: Sequence[P],
        resource_schema_url: str = "",
        scope_schema_url: str = "",
    ) -> None:
        """Queue ``items`` (spans or metrics) that share a resource and scope; never waits on the network."""
        encoded = [(item.SerializeToString(), self.signal.units(item)) for item in items]
        self.submit_encoded(resource, scope, encoded, resource_schema_url, scope_schema_url)

    def submit_encoded(
        self,
        resource: Resource,
        scope: InstrumentationScope,
        items: Sequence[tuple[bytes, int]],
        resource_schema_url: str = "",
        scope_schema_url: str = "",
    ) -> None:
        """Queue already serialized items, each with its units (a Metric's data points); never waits."""
        rhead, shead = head(resource, resource_schema_url), head(scope, scope_schema_url)
        overhead = len(rhead) + len(shead) + 3 * PREFIX_MAX
        limit = min(self.signal.max_item_bytes, self.options.max_request_bytes - overhead)
        entries, oversize, total = [], 0, 0
        for data, units in items:
            total += units
            if len(data) > limit or units > self.max_units:
                oversize += units
                continue
            entries.append(Entry(rhead, shead, data, units))
        with self.cond:
            self.counts.accepted += total
            if self.closing:  # nobody will send them
                self.counts.dropped_undelivered += total - oversize
                self.counts.dropped_oversize += oversize
                return
            if oversize:
                self.counts.dropped_oversize += oversize
                self.conditions.set(
                    f"otlp_{self.signal.name}_oversize",
                    f"OTLP {self.signal.name}: dropped an item over the endpoint's limits "
                    f"({self.signal.max_units} {self.signal.unit} or {limit} bytes)",
                )
            for entry in entries:
                self.queue.append(entry)
                self.queued_bytes += len(entry.data)
                self.queued_units += entry.units
            while self.queue and (
                len(self.queue) > self.options.capacity or self.queued_bytes > self.options.capacity_bytes
            ):
                self._forget(self.queue.popleft())
            self.cond.notify()

    def _forget(self, entry: Entry) -> None:
        self.queued_bytes -= len(entry.data)
        self.queued_units -= entry.units
        self.counts.dropped_buffer_full += entry.units

    def stats(self) -> ExportStats:
        """A copy of the cumulative counts."""
        with self.cond:
            return ExportStats(**{f.name: getattr(self.counts, f.name) for f in fields(ExportStats)})

    def pending(self) -> int:
        """Units queued or in the request being sent."""
        with self.cond:
            return self.queued_units + (self.inflight.units if self.inflight else 0)

    def close(self, timeout: float) -> None:
        """Deliver what can be delivered within ``timeout`` seconds; count the rest as dropped."""
        with self.cond:
            self.closing = True
            self.deadline = time.monotonic() + timeout
            self.cond.notify()
        self.wake.set()
        self.thread.join(max(0.0, self.deadline - time.monotonic()))
        with self.cond:
            left = self.queued_units + (self.inflight.units if self.inflight else 0)
            if self.inflight is not None:
                self.counts.failed_batches += 1
                self.inflight = None  # the sender, if it ever returns, no longer counts it
            self.counts.dropped_undelivered += left
            self.queue.clear()
            self.queued_units = self.queued_bytes = 0
        if left:
            log.warning("OTLP %s exporter closed with %d %s undelivered", self.signal.name, left, self.signal.unit)
        if self.session is not None and not self.thread.is_alive():
            self.session.close()

    # --- sender thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closing:
                    self.cond.wait()
                if not self.queue or time.monotonic() >= self.deadline:
                    return  # close() counts what is left
                linger_end = time.monotonic() + self.options.linger
                while not self.closing and self.queued_units < self.max_units:
                    if self.queued_bytes >= self.options.max_request_bytes:
                        break
                    remaining = linger_end - time.monotonic()
                    if remaining <= 0:
                        break
                    self.cond.wait(remaining)
                batch = self._take()
            self._deliver(batch)

    def _take(self) -> Batch:
        """The oldest entries that fit one request (caller holds the lock); they become the in-flight batch."""
        entries: list[Entry] = []
        units, size = 0, 0
        resources: set[bytes] = set()
        scopes: set[tuple[bytes, bytes]] = set()
        while self.queue:
            entry = self.queue[0]
            grow = len(entry.data) + PREFIX_MAX
            if entry.resource not in resources:
                grow += len(entry.resource) + PREFIX_MAX
            if (entry.resource, entry.scope) not in scopes:
                grow += len(entry.scope) + PREFIX_MAX
            if entries and (units + entry.units > self.max_units or size + grow > self.options.max_request_bytes):
                break
            self.queue.popleft()
            self.queued_bytes -= len(entry.data)
            self.queued_units -= entry.units
            resources.add(entry.resource)
            scopes.add((entry.resource, entry.scope))
            entries.append(entry)
            units += entry.units
            size += grow
        self.inflight = Batch(entries, units, time.monotonic())
        return self.inflight

    def _body(self, batch: Batch) -> bytes:
        groups: dict[bytes, dict[bytes, list[bytes]]] = {}
        for e in batch.entries:
            groups.setdefault(e.resource, {}).setdefault(e.scope, []).append(e.data)
        body = encode(groups)
        return gzip.compress(body, self.options.gzip_level, mtime=0) if self.options.gzip else body

    def _deliver(self, batch: Batch) -> None:
        body = self._body(batch)
        while True:
            batch.attempts += 1
            answer = self._post(body)
            if answer.outcome == "ok":
                rejected, message = self._partial(answer)
                self._settle(batch, sent=True, rejected=rejected, size=len(body))
                self.failures = 0
                self.conditions.set(f"otlp_{self.signal.name}", None)
                self.conditions.set(f"otlp_{self.signal.name}_given_up", None)
                self.conditions.set(f"otlp_{self.signal.name}_partial", message)
                return
            if answer.outcome == "refused":
                self.conditions.set(
                    f"otlp_{self.signal.name}_refused",
                    f"OTLP {self.signal.name} to {self.endpoint}: HTTP {answer.status}, request dropped: "
                    f"{answer.detail[:CLIP]}",
                    status=answer.status,
                )
                self._settle(batch, sent=False, refused=True)
                return
            self.failures += 1
            self.conditions.set(
                f"otlp_{self.signal.name}",
                f"OTLP {self.signal.name} to {self.endpoint} failed: {answer.detail[:CLIP]}; retrying",
            )
            delay = min(self.options.backoff_max, self.options.backoff_start * 2 ** (self.failures - 1))
            delay *= random.uniform(0.5, 1.0)
            if answer.delay is not None:
                delay = min(answer.delay, self.options.retry_after_max)
            now = time.monotonic()
            if (
                batch.attempts >= self.options.max_attempts
                or now + delay - batch.started > self.options.max_batch_age
                or now + delay >= self.deadline
            ):
                self._settle(batch, sent=False)
                return
            self.wake.wait(delay)
            if time.monotonic() >= self.deadline:
                self._settle(batch, sent=False)
                return
            with self.cond:
                if self.inflight is not batch:
                    return  # close() gave up on it
                self.counts.retries += 1

    def _settle(self, batch: Batch, sent: bool, rejected: int = 0, size: int = 0, refused: bool = False) -> None:
        """Count a batch's fate once; close() may have counted it already."""
        with self.cond:
            if self.inflight is not batch:
                return
            self.inflight = None
            if sent:
                self.counts.sent += batch.units
                self.counts.rejected_partial += rejected
                self.counts.requests_sent += 1
                self.counts.bytes_sent += size
                return
            self.counts.failed_batches += 1
            if refused:
                self.counts.dropped_rejected_http += batch.units
            else:
                self.counts.dropped_undelivered += batch.units
        if not refused:  # once per outage, not once per batch: the counts say how many
            self.conditions.set(
                f"otlp_{self.signal.name}_given_up",
                f"OTLP {self.signal.name}: giving up on requests after {batch.attempts} attempts; "
                f"their {self.signal.unit} are counted as dropped until the endpoint answers again",
            )

    def _post(self, body: bytes) -> Answer:
        headers = {"Content-Type": "application/x-protobuf"}
        if self.options.gzip:
            headers["Content-Encoding"] = "gzip"
        try:
            if self.signer is not None:
                headers = self.signer.sign(self.endpoint.url, headers, body)
        except CredentialsMissing as exc:
            return Answer("retry", detail=str(exc))
        read = min(self.options.timeout, max(0.05, self.deadline - time.monotonic()))
        try:
            if self.session is None:
                self.session = requests.Session()
            response = self.session.post(
                self.endpoint.url,
                data=body,
                headers=headers,
                timeout=(min(self.options.connect_timeout, read), read),
                verify=self.verify,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            return Answer("retry", detail=f"{type(exc).__name__}: {exc}")
        status = response.status_code
        if status == 200:
            return Answer("ok", 200, body=response.content)
        detail = f"HTTP {status} {response.text[:CLIP]!r}"
        if status == 429 or 500 <= status <= 599:
            return Answer("retry", status, detail, retry_after(response.headers.get("Retry-After"), time.time()))
        return Answer("refused", status, response.text)

    def _partial(self, answer: Answer) -> tuple[int, str | None]:
        """Units refused inside a 200 and the endpoint's message (None when all were accepted)."""
        if not answer.body:
            return 0, None
        message = self.signal.response()
        try:
            message.ParseFromString(answer.body)  # the answer's encoding is the request's (OTLP/HTTP)
        except Exception:  # google.protobuf's DecodeError, or anything a broken answer raises
            log.debug("OTLP %s: unreadable 200 answer %r", self.signal.name, answer.body[:CLIP])
            return 0, None
        partial: Any = getattr(message, "partial_success")  # noqa: B009 - the response type is the signal's
        rejected = int(getattr(partial, self.signal.rejected_field))
        if not rejected and not partial.error_message:
            return 0, None
        text = f"OTLP {self.signal.name}: the endpoint refused {rejected} {self.signal.unit}: "
        return rejected, text + (partial.error_message[:CLIP] or "(no message)")
