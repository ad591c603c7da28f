"""``--gpu-fault-action drain``: take this ECS container instance out of service when a GPU turns unhealthy.

Once per process (every GPU turning unhealthy asks; the first request starts it, later ones find it done or
under way), off the cycle's thread:

1. this task's cluster and ARN from the task metadata endpoint (``ECS_CONTAINER_METADATA_URI_V4/task``);
2. ECS ``DescribeTasks`` -> ``containerInstanceArn``; ``DescribeContainerInstances`` -> ``ec2InstanceId`` and
   the instance's status;
3. ECS ``UpdateContainerInstancesState`` to ``DRAINING`` (skipped when it is DRAINING already: another task on
   the instance saw the same fault, or this exporter before a restart): ECS places nothing new there and moves
   the services' tasks away;
4. Auto Scaling ``SetInstanceHealth`` ``Unhealthy`` with ``ShouldRespectGracePeriod=False``: the group replaces
   the instance (scale-in protection, which the capacity provider's managed termination protection uses, does
   not block a health replacement; docs/gpu.md).

Every call is idempotent, so several tasks of one instance draining it at once is safe. A step that fails is
logged and the attempt retried on a later cycle (after the interval, doubling up to 5 minutes), from the first
step not done; the exporter keeps emitting meanwhile. Endpoints, credentials and retries of single calls come
from botocore's usual settings (``AWS_ENDPOINT_URL`` too); the region is the task's own (from its ARN).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from telemetry.logs import get
from triton_http import Client, Redirected, RequestFailed, TooLarge

from .verdict import Fault

log = get("gpu_drain")

RETRY_MAX = 300.0  # seconds between attempts at most
METADATA_MAX_BYTES = 1 << 20
ATTEMPTS = "exporter_gpu_drain_attempts_total"
FAILURES = "exporter_gpu_drain_failures_total"


class DrainFailed(Exception):
    """One step of the drain failed; ``step`` names it (metadata, describe, draining, unhealthy)."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


@dataclass
class Host:
    """What the drain found out and did so far; a retry starts from the first step not done."""

    cluster: str = ""
    task_arn: str = ""
    region: str = ""
    container_instance: str = ""
    ec2_instance: str = ""
    was_draining: bool = False  # DRAINING before this exporter asked
    draining: bool = False
    unhealthy: bool = False
    no_group: bool = False  # the instance belongs to no Auto Scaling group: drained, not replaced
    faults: list[Fault] = field(default_factory=list)


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


def boto_clients(region: str, timeout: float) -> tuple[Any, Any]:
    """ECS and Auto Scaling clients: endpoint, credentials and call retries from botocore's usual settings."""
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=region,
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"mode": "standard", "max_attempts": 3},
        user_agent_extra="triton-emf-exporter-gpu-drain",
    )
    session = boto3.session.Session()
    return session.client("ecs", config=config), session.client("autoscaling", config=config)


def _error(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        code, message = err.get("Code", ""), err.get("Message", "")
        if code:
            return f"{code}: {message}" if message else str(code)
    return f"{type(exc).__name__}: {exc}"


class Drainer:
    """The drain action: thread-safe, never blocks the caller, never raises into it."""

    name = "drain"

    def __init__(
        self,
        metadata_url: str,
        retry_interval: float = 60.0,
        timeout: float = 5.0,
        clients: Callable[[str, float], tuple[Any, Any]] = boto_clients,
        metadata: Callable[[str, float], tuple[str, str]] = read_task_metadata,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metadata_url = metadata_url
        self.retry_interval = max(retry_interval, 0.1)
        self.timeout = timeout
        self._clients_for = clients
        self._metadata = metadata
        self.clock = clock
        self.host = Host()
        self.done = False
        self.attempts = 0
        self.failures = 0
        self.last_error = ""
        self.next_try = 0.0
        self._clients: tuple[Any, Any] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()

    # --- the Action interface -------------------------------------------------------------------

    def unhealthy(self, fault: Fault) -> str:
        with self._lock:
            first = not self.host.faults
            self.host.faults.append(fault)
            if self.done:
                return f"this instance was drained already ({self._summary()})"
            if not first:
                return "this instance is being drained already (for GPU " + str(self.host.faults[0].gpu) + ")"
        self._start()
        return "draining this instance: ECS DRAINING, then Auto Scaling Unhealthy (the drain logs its outcome)"

    def poll(self) -> None:
        with self._lock:
            due = self.host.faults and not self.done and self.clock() >= self.next_try
        if due:
            self._start()

    def series(self) -> list[tuple[str, float]]:
        return [(ATTEMPTS, float(self.attempts)), (FAILURES, float(self.failures))]

    def close(self) -> None:
        self._closed.set()

    # --- the attempt ----------------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._closed.is_set() or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._attempt, name="gpu-drain", daemon=True)
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
            log.error("GPU drain: unexpected %s", type(exc).__name__, exc_info=True)
            self._failed("unexpected", f"{type(exc).__name__}: {exc}")
        else:
            with self._lock:
                self.done = True
                self.last_error = ""
            self._log_done()

    def _failed(self, step: str, message: str) -> None:
        with self._lock:
            self.failures += 1
            delay = min(RETRY_MAX, self.retry_interval * 2 ** min(self.failures - 1, 16))
            self.next_try = self.clock() + delay
            self.last_error = f"{step}: {message}"
            host = self.host
        log.error(
            "GPU drain failed at %s: %s; this instance stays in service until a retry succeeds (in %gs)",
            step,
            message,
            delay,
            extra={
                "fields": {
                    "drain_step": step,
                    "error": message,
                    "retry_in_s": delay,
                    "cluster": host.cluster or None,
                    "container_instance_arn": host.container_instance or None,
                    "ec2_instance_id": host.ec2_instance or None,
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
        if self._clients is None:
            try:
                self._clients = self._clients_for(host.region, self.timeout)
            except Exception as exc:
                raise DrainFailed("clients", _error(exc)) from None
        ecs, autoscaling = self._clients
        if not host.container_instance or not host.ec2_instance:
            self._describe(ecs)
        if not host.draining:
            self._draining(ecs)
        if not host.unhealthy and not host.no_group:
            self._unhealthy(autoscaling)

    def _describe(self, ecs: Any) -> None:
        host = self.host
        try:
            tasks = ecs.describe_tasks(cluster=host.cluster, tasks=[host.task_arn])
        except Exception as exc:
            raise DrainFailed("describe", f"ecs:DescribeTasks: {_error(exc)}") from None
        found = [t for t in tasks.get("tasks", []) if t.get("containerInstanceArn")]
        if not found:
            why = "; ".join(f"{f.get('arn', '')} {f.get('reason', '')}".strip() for f in tasks.get("failures", []))
            raise DrainFailed(
                "describe",
                f"ecs:DescribeTasks: no container instance for this task ({why or 'not on EC2 capacity'})",
            )
        arn = str(found[0]["containerInstanceArn"])
        try:
            described = ecs.describe_container_instances(cluster=host.cluster, containerInstances=[arn])
        except Exception as exc:
            raise DrainFailed("describe", f"ecs:DescribeContainerInstances: {_error(exc)}") from None
        instances = [c for c in described.get("containerInstances", []) if c.get("ec2InstanceId")]
        if not instances:
            raise DrainFailed("describe", f"ecs:DescribeContainerInstances: {arn} has no EC2 instance")
        host.container_instance = arn
        host.ec2_instance = str(instances[0]["ec2InstanceId"])
        if instances[0].get("status") == "DRAINING":
            host.was_draining = host.draining = True

    def _draining(self, ecs: Any) -> None:
        host = self.host
        try:
            answer = ecs.update_container_instances_state(
                cluster=host.cluster, containerInstances=[host.container_instance], status="DRAINING"
            )
        except Exception as exc:
            raise DrainFailed("draining", f"ecs:UpdateContainerInstancesState: {_error(exc)}") from None
        if answer.get("failures"):
            why = "; ".join(str(f.get("reason", f)) for f in answer["failures"])
            raise DrainFailed("draining", f"ecs:UpdateContainerInstancesState: {why}")
        host.draining = True

    def _unhealthy(self, autoscaling: Any) -> None:
        host = self.host
        try:
            autoscaling.set_instance_health(
                InstanceId=host.ec2_instance, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
            )
        except Exception as exc:
            message = _error(exc)
            if message.startswith("ValidationError") and "not found" in message.lower():
                host.no_group = True  # nothing to retry: no group would replace it
                return
            raise DrainFailed("unhealthy", f"autoscaling:SetInstanceHealth: {message}") from None
        host.unhealthy = True

    def _summary(self) -> str:
        host = self.host
        return f"container instance {host.container_instance}, EC2 instance {host.ec2_instance}"

    def _log_done(self) -> None:
        host = self.host
        if host.no_group:
            outcome = (
                "not in an Auto Scaling group, so nothing replaces it: replace or repair it by hand, then set it "
                "ACTIVE again"
            )
        else:
            outcome = "marked Unhealthy in its Auto Scaling group, which replaces it"
        already = " (it was DRAINING already)" if host.was_draining else ""
        log.warning(
            "drained this instance for an unhealthy GPU: container instance %s (EC2 instance %s) DRAINING in "
            "cluster %s%s; %s",
            host.container_instance,
            host.ec2_instance,
            host.cluster,
            already,
            outcome,
            extra={
                "fields": {
                    "cluster": host.cluster,
                    "container_instance_arn": host.container_instance,
                    "ec2_instance_id": host.ec2_instance,
                    "was_draining": host.was_draining,
                    "auto_scaling_unhealthy": host.unhealthy,
                    "gpus": [f.uuid for f in host.faults],
                    "attempts": self.attempts,
                }
            },
        )
