"""``--gpu-fault-action drain``: ask the fleet's controller to drain this instance when a GPU turns unhealthy.

Hosts report, the controller decides (docs/controller.md): the exporter calls neither ECS nor Auto Scaling.
For each GPU whose verdict turns unhealthy with a draining fault it sends one SQS message to
``--controller-queue-url``, off the cycle's thread:

1. this task's cluster and ARN from the task metadata endpoint (``ECS_CONTAINER_METADATA_URI_V4/task``), and
   the EC2 instance id from the instance metadata service (IMDSv2) where the task can reach it;
2. SQS ``SendMessage``: the task, the instance, the GPU (uuid and index), the fault, its reason and evidence
   (controller/reports.py reads it; the controller checks it against ECS before it acts).

A step that fails is logged and retried on a later cycle (after the interval, doubling up to 5 minutes); the
exporter keeps emitting meanwhile. The controller takes a report twice as once, so a retry after an answer
lost on the way is safe. Endpoints, credentials and retries of single calls come from botocore's usual
settings (``AWS_ENDPOINT_URL``; ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` and ``AWS_EC2_METADATA_DISABLED`` for the
instance metadata); the region is the task's own (from its ARN).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from telemetry.logs import get
from triton_http import Client, Redirected, RequestFailed, TooLarge

from .verdict import Fault

log = get("gpu_drain")

RETRY_MAX = 300.0  # seconds between attempts at most
METADATA_MAX_BYTES = 1 << 20
IMDS_DEFAULT = "http://169.254.169.254"
ATTEMPTS = "exporter_gpu_drain_attempts_total"
FAILURES = "exporter_gpu_drain_failures_total"


class DrainFailed(Exception):
    """One step of a report failed; ``step`` names it (metadata, clients, send)."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


@dataclass
class Host:
    """Who this exporter is, found out once."""

    cluster: str = ""
    task_arn: str = ""
    region: str = ""
    ec2_instance: str = ""  # "" where the instance metadata cannot be read (awsvpc without a route, disabled)
    looked_for_ec2: bool = False


def region_of(arn: str) -> str:
    parts = arn.split(":")
    if len(parts) < 6 or parts[0] != "arn" or not parts[3]:
        raise ValueError(f"not an ARN with a region: {arn!r}")
    return parts[3]


def read_task_metadata(url: str, timeout: float) -> tuple[str, str]:
    """(cluster, task ARN) from the task metadata endpoint v4; raises DrainFailed."""
    try:
        resp = Client(timeout, METADATA_MAX_BYTES).get(url.rstrip("/") + "/task", timeout)
    except TooLarge:
        raise DrainFailed("metadata", "task metadata answered more than 1 MiB") from None
    except Redirected as exc:
        raise DrainFailed("metadata", f"task metadata {exc.reason}") from None
    except RequestFailed as exc:
        raise DrainFailed("metadata", f"task metadata unreachable: {exc.reason}") from None
    if resp.status != 200:
        raise DrainFailed("metadata", f"task metadata answered HTTP {resp.status}")
    try:
        data = orjson.loads(resp.body)
    except orjson.JSONDecodeError:
        raise DrainFailed("metadata", "task metadata answered non-JSON") from None
    cluster = data.get("Cluster") if isinstance(data, dict) else None
    task = data.get("TaskARN") if isinstance(data, dict) else None
    if not isinstance(cluster, str) or not isinstance(task, str) or not cluster or not task:
        raise DrainFailed("metadata", "task metadata has no Cluster and TaskARN")
    return cluster, task


def read_instance_id(environ: Mapping[str, str], timeout: float = 1.0) -> str:
    """The EC2 instance id through IMDSv2, or "" when it cannot be read (never raises: the id is optional)."""
    if environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        return ""
    base = environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "") or IMDS_DEFAULT
    try:
        token = Client(timeout, 4096, headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}).request(
            "PUT", base.rstrip("/") + "/latest/api/token", timeout
        )
        if token.status != 200:
            return ""
        got = Client(timeout, 4096, headers={"X-aws-ec2-metadata-token": token.body.decode().strip()}).get(
            base.rstrip("/") + "/latest/meta-data/instance-id", timeout
        )
    except (RequestFailed, UnicodeDecodeError):
        return ""
    text = got.body.decode("ascii", "replace").strip() if got.status == 200 else ""
    return text if text.startswith("i-") and text[2:].isalnum() and len(text) <= 32 else ""


def sqs_client(region: str, timeout: float) -> Any:
    """An SQS client: endpoint, credentials and call retries from botocore's usual settings."""
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=region,
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"mode": "standard", "max_attempts": 3},
        user_agent_extra="triton-emf-exporter-gpu-report",
    )
    return boto3.session.Session().client("sqs", config=config)


def _error(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        code, message = err.get("Code", ""), err.get("Message", "")
        if code:
            return f"{code}: {message}" if message else str(code)
    return f"{type(exc).__name__}: {exc}"


def message(host: Host, fault: Fault, observed_at: float) -> dict[str, object]:
    """The report as controller/reports.py reads it."""
    body: dict[str, object] = {
        "type": "gpu_fault",
        "version": 1,
        "cluster": host.cluster,
        "task_arn": host.task_arn,
        "gpu_uuid": fault.uuid,
        "gpu": fault.gpu,
        "nvml_index": fault.nvml_index,
        "fault": fault.kind,
        "reason": fault.reason,
        "evidence": {"reads": fault.reads},
        "observed_at": round(observed_at, 3),
    }
    if fault.code is not None:
        body["code"] = fault.code
    if host.ec2_instance:
        body["ec2_instance_id"] = host.ec2_instance
    return body


class Drainer:
    """The drain action: a report to the controller per unhealthy GPU; thread-safe, never blocks the caller,
    never raises into it."""

    name = "drain"

    def __init__(
        self,
        metadata_url: str,
        queue_url: str,
        retry_interval: float = 60.0,
        timeout: float = 5.0,
        clients: Callable[[str, float], Any] = sqs_client,
        metadata: Callable[[str, float], tuple[str, str]] = read_task_metadata,
        instance_id: Callable[[], str] = lambda: read_instance_id(os.environ),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.metadata_url = metadata_url
        self.queue_url = queue_url
        self.retry_interval = max(retry_interval, 0.1)
        self.timeout = timeout
        self._clients_for = clients
        self._metadata = metadata
        self._instance_id = instance_id
        self.clock = clock
        self.wall = wall
        self.host = Host()
        self.pending: list[tuple[Fault, float]] = []  # (fault, observed at), not yet sent
        self.sent: list[Fault] = []
        self.attempts = 0
        self.failures = 0
        self.last_error = ""
        self.next_try = 0.0
        self._sqs: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()

    # --- the Action interface -------------------------------------------------------------------

    def unhealthy(self, fault: Fault) -> str:
        with self._lock:
            self.pending.append((fault, self.wall()))
        self._start()
        return "asked the controller to drain this instance (the report logs its outcome; the controller decides)"

    def poll(self) -> None:
        with self._lock:
            due = bool(self.pending) and self.clock() >= self.next_try
        if due:
            self._start()

    def series(self) -> list[tuple[str, float]]:
        return [(ATTEMPTS, float(self.attempts)), (FAILURES, float(self.failures))]

    def close(self) -> None:
        self._closed.set()

    @property
    def done(self) -> bool:
        with self._lock:
            return not self.pending and bool(self.sent)

    # --- the attempt ----------------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._closed.is_set() or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._attempt, name="gpu-report", daemon=True)
            self._thread.start()

    def wait(self, timeout: float) -> bool:
        """Wait for the attempt under way (tests); True when none is running."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def _attempt(self) -> None:
        with self._lock:
            self.attempts += 1
        try:
            self._steps()
        except DrainFailed as exc:
            self._failed(exc.step, exc.message)
        except Exception as exc:  # a bug or an unexpected answer: logged and retried like any failure
            log.error("GPU fault report: unexpected %s", type(exc).__name__, exc_info=True)
            self._failed("unexpected", f"{type(exc).__name__}: {exc}")
        else:
            with self._lock:
                self.last_error = ""

    def _failed(self, step: str, message: str) -> None:
        with self._lock:
            self.failures += 1
            delay = min(RETRY_MAX, self.retry_interval * 2 ** min(self.failures - 1, 16))
            self.next_try = self.clock() + delay
            self.last_error = f"{step}: {message}"
            host = self.host
        log.error(
            "GPU fault report to the controller failed at %s: %s; retried in %gs (the instance stays in service "
            "meanwhile)",
            step,
            message,
            delay,
            extra={
                "fields": {
                    "report_step": step,
                    "error": message,
                    "retry_in_s": delay,
                    "cluster": host.cluster or None,
                    "task_arn": host.task_arn or None,
                    "controller_queue_url": self.queue_url,
                }
            },
        )

    def _steps(self) -> None:
        host = self.host
        if not host.task_arn:
            cluster, task = self._metadata(self.metadata_url, self.timeout)
            try:
                region = region_of(task)
            except ValueError as exc:
                raise DrainFailed("metadata", str(exc)) from None
            host.cluster, host.task_arn, host.region = cluster, task, region
        if not host.looked_for_ec2:
            host.ec2_instance = self._instance_id()
            host.looked_for_ec2 = True
        if self._sqs is None:
            try:
                self._sqs = self._clients_for(host.region, self.timeout)
            except Exception as exc:
                raise DrainFailed("clients", _error(exc)) from None
        while True:
            with self._lock:
                if not self.pending:
                    return
                fault, observed = self.pending[0]
            self._send(fault, observed)
            with self._lock:
                self.pending.pop(0)
                self.sent.append(fault)

    def _send(self, fault: Fault, observed: float) -> None:
        host = self.host
        body = message(host, fault, observed)
        try:
            answer = self._sqs.send_message(QueueUrl=self.queue_url, MessageBody=orjson.dumps(body).decode())
        except Exception as exc:
            raise DrainFailed("send", f"sqs:SendMessage: {_error(exc)}") from None
        log.warning(
            "reported GPU %d (%s) to the controller: %s; it checks the report and decides whether and when this "
            "instance drains",
            fault.gpu,
            fault.uuid,
            fault.reason,
            extra={
                "fields": {
                    **fault.fields(),
                    "cluster": host.cluster,
                    "task_arn": host.task_arn,
                    "ec2_instance_id": host.ec2_instance or None,
                    "message_id": str(answer.get("MessageId", "")),
                    "attempts": self.attempts,
                }
            },
        )
