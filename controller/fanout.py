"""The fan-out, owned by the controller: one SQS queue per task of the Triton service, on the model events' topic.

Why here and not in each daemon: a daemon that may create, tag, reconfigure and delete queues on the prefix
can also inflate the count of live hosts a canary share is sized from, or rewrite another daemon's queue
policy (issue 36, finding 5). The controller makes and removes the queues from what ECS says; a daemon only
finds its own by name (``GetQueueUrl``), receives from it and deletes its messages (modelsync/fanout.py).

Every pass (``reconcile``), from ECS, SQS and SNS as they are (no state of its own):

- **Which tasks**: ``ListTasks`` for the service with desired status RUNNING, then ``DescribeTasks``, kept when
  ECS names the task's group ``service:<service>``. A task gets its queue as soon as ECS has placed it
  (PENDING or ACTIVATING, not only RUNNING): its images are still pulling, so the queue is usually there,
  subscribed, before the daemon starts and looks for it.
- **Each task's queue** ``<prefix><task id>``: created encrypted (SSE-SQS), one hour's retention (events are
  hints), a policy that lets only ``sns.amazonaws.com`` send, only for this topic (``aws:SourceArn``), tagged
  with the cluster, the service and the task; verified once per controller process (policy, encryption,
  tags), fixed if it differs; subscribed when the topic lists no subscription for it.
- **A stopped task's queue**: a queue of the exact name form whose task is not listed is removed only when
  ``DescribeTasks`` confirms the task stopped (desired status STOPPED, or ECS no longer knows it: MISSING)
  and the queue's tags name this cluster and service: its subscriptions first, then the queue. A failed or
  eventually consistent listing never deletes anything; a queue with the prefix but another name form, or
  another fleet's tags, is never touched.
- **Bounded**: at most ``max_changes`` queues made or fixed, and as many removed, per pass (the rest wait for
  the next pass, said in the log); listings at most :data:`MAX_PAGES` pages.
- **Failures** are counted (``FanoutFailures``) and logged (one line per call a minute); the pass goes on with
  the next queue, and the next pass tries again. Every call is idempotent (CreateQueue of an existing queue
  with the same attributes, Subscribe of a subscribed endpoint, DeleteQueue of a deleted queue).

The count of the service's running tasks is published for the daemons' rollouts (:class:`FleetSize`): the
number of hosts a canary share is sized from is ECS's, not a number of queues.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from modelsync.fanout import FLEET_KEY, TASK_ID, check_task_queue_prefix, queue_policy  # the same document
from modelsync.fanout import check_queue_prefix as check_daemon_prefix
from telemetry.logs import Throttled

from .fleet import FleetError, error_text

log = logging.getLogger("controller.fanout")

RETENTION_SECONDS = 3600
MAX_CHANGES = 20  # queues made or fixed per pass, and as many removed
MAX_PAGES = 50  # of every listing: 100 tasks, 1,000 queues or 100 subscriptions a page
DESCRIBE_BATCH = 100  # DescribeTasks' own cap
CLUSTER_TAG, SERVICE_TAG, TASK_TAG = "modelsync-cluster", "modelsync-service", "modelsync-task"
FLEET_REFRESH = 300.0  # seconds: the count is rewritten at least this often (and whenever it changes)

_GONE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
_NOT_FOUND = {"NotFound", "NotFoundException", "ResourceNotFound"}


# --- settings' validators (settings.py) --------------------------------------------------------------


def check_queue_prefix(text: str) -> str:
    """Model sync's queue-name prefix rule, with room for the ECS task id after it (the daemons look the queue
    up by that name: one rule for both)."""
    return check_task_queue_prefix(check_daemon_prefix(text))


def task_id(task_arn: str) -> str:
    return task_arn.rsplit("/", 1)[-1]


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _name(url_or_arn: str) -> str:
    return url_or_arn.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


@dataclass(frozen=True)
class ServiceTask:
    arn: str
    id: str
    last_status: str  # PROVISIONING, PENDING, ACTIVATING, RUNNING, ...
    container_instance_arn: str = ""  # EC2 capacity: where it runs (a rollout's canaries go to distinct ones)


@dataclass
class FanoutPass:
    """What one pass saw and did (logged, counted; tests read it)."""

    tasks: int | None = None  # the service's tasks ECS wants running (placed); None: ECS could not be read
    running: int | None = None  # of them, RUNNING now
    queues: int = 0  # queues of the exact name form listed
    created: list[str] = field(default_factory=list)  # queue names
    fixed: list[str] = field(default_factory=list)  # policy, encryption or tags set on an existing queue
    subscribed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unsubscribed: list[str] = field(default_factory=list)  # subscription ARNs
    kept: list[str] = field(default_factory=list)  # of the form, not listed as a task, not confirmed ours to remove
    deferred: int = 0  # changes left for the next pass (the bound)
    failures: int = 0
    live: dict[str, ServiceTask] | None = None  # task id -> the service's tasks as ECS listed them (rollouts)


@dataclass
class _Queue:
    url: str
    arn: str = ""


def _call(name: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        return fn(**kwargs)
    except Exception as exc:
        raise FleetError(name, error_text(exc)) from None


def _pages(call: Callable[[str], Any]) -> Iterator[Any]:
    token = ""
    for _ in range(MAX_PAGES):
        page = call(token)
        yield page
        token = str(page.get("nextToken") or page.get("NextToken") or "")
        if not token:
            return


def service_tasks(ecs: Any, cluster: str, service: str) -> dict[str, ServiceTask]:
    """Task id -> task, for the service's tasks ECS wants running (placed: PENDING and ACTIVATING too), as
    ``DescribeTasks`` names their group; raises FleetError."""
    arns: list[str] = []
    for page in _pages(
        lambda token: _call(
            "ecs:ListTasks", ecs.list_tasks, cluster=cluster, serviceName=service, desiredStatus="RUNNING",
            maxResults=100, **({"nextToken": token} if token else {}),
        )
    ):  # fmt: skip
        arns += [str(a) for a in page.get("taskArns", [])]
    out: dict[str, ServiceTask] = {}
    for start in range(0, len(arns), DESCRIBE_BATCH):
        got = _call(
            "ecs:DescribeTasks", ecs.describe_tasks, cluster=cluster, tasks=arns[start : start + DESCRIBE_BATCH]
        )
        for t in got.get("tasks", []):
            arn = str(t.get("taskArn", ""))
            if t.get("group") == f"service:{service}" and t.get("desiredStatus") == "RUNNING":
                out[task_id(arn)] = ServiceTask(
                    arn, task_id(arn), str(t.get("lastStatus", "")), str(t.get("containerInstanceArn", ""))
                )
    return out


class TaskQueues:
    """The service's tasks' queues on the topic, reconciled with ECS every pass (module docstring)."""

    def __init__(
        self,
        cluster: str,
        service: str,
        topic_arn: str,
        prefix: str,
        ecs: Any,
        sqs: Any,
        sns: Any,
        *,
        max_changes: int = MAX_CHANGES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.cluster_name = cluster.rsplit("/", 1)[-1]  # an ARN's name: the tags hold the same whatever was given
        self.service = service
        self.topic_arn = topic_arn
        _, self.partition, _, self.region, self.account, _ = topic_arn.split(":", 5)
        self.prefix = prefix
        self.ecs, self.sqs, self.sns = ecs, sqs, sns
        self.max_changes = max_changes
        self.ours = re.compile(re.escape(prefix) + f"(?:{TASK_ID.pattern})")
        self.errors = Throttled(log, every=60.0, clock=clock)
        self._verified: dict[str, str] = {}  # queue name -> its ARN, checked by this process
        self._foreign: set[str] = set()  # ids of queues of the form found not to be this fleet's: never touched

    def name_of(self, task: str) -> str:
        return self.prefix + task

    # --- one pass -------------------------------------------------------------------------------------

    def reconcile(self, tasks: dict[str, ServiceTask]) -> FanoutPass:
        """Make the tasks' queues, remove the stopped tasks'; never raises (failures are counted)."""
        out = FanoutPass()
        try:
            queues = self._queues()
            subs = self._subscriptions()
        except FleetError as exc:
            self._failed(out, exc, "the fan-out decides nothing this pass")
            return out
        out.tasks = len(tasks)
        out.queues = len(queues)
        self._make(out, tasks, queues, subs)
        self._remove(out, tasks, queues, subs)
        if out.created or out.deleted or out.fixed or out.subscribed or out.deferred:
            log.info(
                "fan-out pass: %d task(s) of service %s, %d queue(s); made %d, fixed %d, subscribed %d, removed %d%s",
                out.tasks, self.service, out.queues, len(out.created), len(out.fixed), len(out.subscribed),
                len(out.deleted), f"; {out.deferred} change(s) wait for the next pass" if out.deferred else "",
                extra={"fields": {"created": out.created, "deleted": out.deleted, "deferred": out.deferred}},
            )  # fmt: skip
        return out

    def _make(self, out: FanoutPass, tasks: dict[str, ServiceTask], queues: dict[str, _Queue],
              subs: dict[str, list[str]]) -> None:  # fmt: skip
        changes = 0
        for tid in sorted(tasks):
            name = self.name_of(tid)
            if not self.ours.fullmatch(name):  # not an ECS task id: no queue name can be made of it
                continue
            queue = queues.get(tid)
            needs = queue is None or name not in self._verified or name not in subs
            if not needs:
                continue
            if changes >= self.max_changes:
                out.deferred += 1
                continue
            changes += 1
            try:
                if queue is None:
                    queue = self._create(tasks[tid])
                    out.created.append(name)
                    log.info(
                        "fan-out queue %s made for task %s (%s)",
                        name, tasks[tid].arn, tasks[tid].last_status,
                        extra={"fields": {"queue": name, "task_arn": tasks[tid].arn, "topic": self.topic_arn}},
                    )  # fmt: skip
                if name not in self._verified and self._secure(name, queue, tasks[tid]):
                    out.fixed.append(name)
                if name not in subs:
                    arn = self._subscribe(name)
                    out.subscribed.append(name)
                    log.info(
                        "fan-out queue %s subscribed to the topic",
                        name,
                        extra={"fields": {"queue": name, "subscription": arn, "topic": self.topic_arn}},
                    )
            except FleetError as exc:
                self._failed(out, exc, f"queue {name} is tried again next pass", queue=name)

    def _remove(self, out: FanoutPass, tasks: dict[str, ServiceTask], queues: dict[str, _Queue],
                subs: dict[str, list[str]]) -> None:  # fmt: skip
        gone_queues = sorted(tid for tid in queues if tid not in tasks and tid not in self._foreign)
        gone_subs = sorted(
            tid for tid in {self._id_of(n) for n in subs}
            if tid and tid not in tasks and tid not in queues and tid not in self._foreign
        )  # fmt: skip
        candidates = (gone_queues + gone_subs)[: self.max_changes]
        out.deferred += len(gone_queues) + len(gone_subs) - len(candidates)
        if not candidates:
            return
        try:
            stopped = self._stopped(candidates)
        except FleetError as exc:
            self._failed(out, exc, "no queue is removed this pass")
            return
        for tid in candidates:
            name = self.name_of(tid)
            if tid not in stopped:
                out.kept.append(name)  # ECS has it running (another service's, or listed late): not ours to remove
                continue
            try:
                if tid in queues:
                    if not self._owned(queues[tid].url):
                        out.kept.append(name)
                        self._foreign.add(tid)
                        log.warning(
                            "fan-out: queue %s has the name form but its tags do not name cluster %s and service "
                            "%s: another fleet's, or made by hand; left alone", name, self.cluster_name, self.service,
                            extra={"fields": {"queue": name}},
                        )  # fmt: skip
                        continue
                    self._unsubscribe_all(out, name, subs.get(name, []))
                    self._delete(name, queues[tid].url)
                    out.deleted.append(name)
                    log.info("fan-out queue %s removed: its task stopped", name, extra={"fields": {"queue": name}})
                elif not self._exists(name):  # a subscription left to a queue already gone
                    self._unsubscribe_all(out, name, subs.get(name, []))
                else:
                    self._foreign.add(tid)  # its queue exists but was not listed here: not this fleet's
            except FleetError as exc:
                self._failed(out, exc, f"queue {name} is tried again next pass", queue=name)
            self._verified.pop(name, None)

    def _failed(self, out: FanoutPass, exc: FleetError, then: str, queue: str = "") -> None:
        out.failures += 1
        self.errors.log(
            f"fanout:{exc.call}", logging.ERROR, f"fan-out step failed: {exc}; {then}",
            call=exc.call, **({"queue": queue} if queue else {}),
        )  # fmt: skip

    # --- reading -----------------------------------------------------------------------------------

    def _queues(self) -> dict[str, _Queue]:
        """Task id -> queue, for the queues of the exact name form ``<prefix><task id>``."""
        out: dict[str, _Queue] = {}
        for page in _pages(
            lambda token: _call(
                "sqs:ListQueues", self.sqs.list_queues, QueueNamePrefix=self.prefix, MaxResults=1000,
                **({"NextToken": token} if token else {}),
            )
        ):  # fmt: skip
            for url in page.get("QueueUrls", []):
                name = _name(str(url))
                if self.ours.fullmatch(name):
                    out[name[len(self.prefix) :]] = _Queue(str(url))
        return out

    def _subscriptions(self) -> dict[str, list[str]]:
        """Queue name -> subscription ARNs, for the topic's SQS subscriptions to queues of the name form here."""
        out: dict[str, list[str]] = {}
        for page in _pages(
            lambda token: _call(
                "sns:ListSubscriptionsByTopic", self.sns.list_subscriptions_by_topic, TopicArn=self.topic_arn,
                **({"NextToken": token} if token else {}),
            )
        ):  # fmt: skip
            for sub in page.get("Subscriptions", []):
                parts = str(sub.get("Endpoint", "")).split(":")
                if sub.get("Protocol") != "sqs" or len(parts) != 6 or parts[3] != self.region:
                    continue
                if self.ours.fullmatch(parts[5]):
                    out.setdefault(parts[5], []).append(str(sub.get("SubscriptionArn", "")))
        return out

    def _id_of(self, name: str) -> str:
        return name[len(self.prefix) :] if self.ours.fullmatch(name) else ""

    def _stopped(self, ids: list[str]) -> set[str]:
        """The ids ECS confirms stopped: desired STOPPED, or unknown to the cluster (MISSING)."""
        out: set[str] = set()
        for start in range(0, len(ids), DESCRIBE_BATCH):
            batch = ids[start : start + DESCRIBE_BATCH]
            got = _call("ecs:DescribeTasks", self.ecs.describe_tasks, cluster=self.cluster, tasks=batch)
            seen = {task_id(str(t.get("taskArn", ""))): str(t.get("desiredStatus", "")) for t in got.get("tasks", [])}
            failed = {task_id(str(f.get("arn", ""))): str(f.get("reason", "")) for f in got.get("failures", [])}
            for tid in batch:
                if tid in seen:
                    if seen[tid] == "STOPPED":
                        out.add(tid)
                elif failed.get(tid, "MISSING") == "MISSING":  # moto answers an unknown id with neither
                    out.add(tid)
        return out

    def _exists(self, name: str) -> bool:
        try:
            self.sqs.get_queue_url(QueueName=name)
        except Exception as exc:
            if _code(exc) in _GONE:
                return False
            raise FleetError("sqs:GetQueueUrl", error_text(exc)) from None
        return True

    def _owned(self, url: str) -> bool:
        """Whether the queue's tags name this cluster and service (another fleet's queue is never removed)."""
        tags = _call("sqs:ListQueueTags", self.sqs.list_queue_tags, QueueUrl=url).get("Tags", {})
        return bool(tags.get(CLUSTER_TAG) == self.cluster_name and tags.get(SERVICE_TAG) == self.service)

    # --- changing ----------------------------------------------------------------------------------

    def _tags(self, task: ServiceTask) -> dict[str, str]:
        return {CLUSTER_TAG: self.cluster_name, SERVICE_TAG: self.service, TASK_TAG: task.arn[:256]}

    def _create(self, task: ServiceTask) -> _Queue:
        name = self.name_of(task.id)
        arn = f"arn:{self.partition}:sqs:{self.region}:{self.account}:{name}"  # checked by _secure
        got = _call(
            "sqs:CreateQueue", self.sqs.create_queue, QueueName=name,
            Attributes={
                "SqsManagedSseEnabled": "true",
                "MessageRetentionPeriod": str(RETENTION_SECONDS),
                "Policy": json.dumps(queue_policy(arn, self.topic_arn)),
            },
            tags=self._tags(task),
        )  # fmt: skip
        return _Queue(str(got["QueueUrl"]))

    def _secure(self, name: str, queue: _Queue, task: ServiceTask) -> bool:
        """Make the queue's policy, encryption and tags what they must be; True when something was set."""
        attrs = _call(
            "sqs:GetQueueAttributes", self.sqs.get_queue_attributes, QueueUrl=queue.url,
            AttributeNames=["QueueArn", "Policy", "SqsManagedSseEnabled", "KmsMasterKeyId"],
        ).get("Attributes", {})  # fmt: skip
        queue.arn = str(attrs["QueueArn"])
        want: dict[str, str] = {}
        policy = queue_policy(queue.arn, self.topic_arn)
        try:
            current = json.loads(attrs.get("Policy") or "null")
        except ValueError:
            current = None
        if current != policy:
            want["Policy"] = json.dumps(policy)
        if attrs.get("SqsManagedSseEnabled") != "true" and not attrs.get("KmsMasterKeyId"):
            want["SqsManagedSseEnabled"] = "true"
        if want:
            _call("sqs:SetQueueAttributes", self.sqs.set_queue_attributes, QueueUrl=queue.url, Attributes=want)
        tags = _call("sqs:ListQueueTags", self.sqs.list_queue_tags, QueueUrl=queue.url).get("Tags", {})
        missing = {k: v for k, v in self._tags(task).items() if tags.get(k) != v}
        if missing:
            _call("sqs:TagQueue", self.sqs.tag_queue, QueueUrl=queue.url, Tags=missing)
        if want or missing:
            log.warning(
                "fan-out queue %s corrected: %s", name, ", ".join([*want, *(f"tag {k}" for k in missing)]),
                extra={"fields": {"queue": name}},
            )  # fmt: skip
        self._verified[name] = queue.arn
        return bool(want or missing)

    def _subscribe(self, name: str) -> str:
        got = _call(
            "sns:Subscribe", self.sns.subscribe, TopicArn=self.topic_arn, Protocol="sqs",
            Endpoint=self._verified[name], Attributes={"RawMessageDelivery": "false"}, ReturnSubscriptionArn=True,
        )  # fmt: skip
        return str(got.get("SubscriptionArn", ""))

    def _unsubscribe_all(self, out: FanoutPass, name: str, arns: list[str]) -> None:
        for arn in arns:
            if not arn.startswith("arn:"):  # PendingConfirmation: nothing to unsubscribe yet
                continue
            try:
                self.sns.unsubscribe(SubscriptionArn=arn)
            except Exception as exc:
                if _code(exc) not in _NOT_FOUND:
                    raise FleetError("sns:Unsubscribe", error_text(exc)) from None
            out.unsubscribed.append(arn)
            log.info("fan-out subscription %s removed", arn, extra={"fields": {"queue": name, "subscription": arn}})

    def _delete(self, name: str, url: str) -> None:
        try:
            self.sqs.delete_queue(QueueUrl=url)
        except Exception as exc:
            if _code(exc) not in _GONE:
                raise FleetError("sqs:DeleteQueue", error_text(exc)) from None


class FleetSize:
    """``s3://<bucket>/<prefix>.modelsync/fleet.json``: the service's task counts, for the daemons' rollouts.

    Written when a count changes and at least every :data:`FLEET_REFRESH` seconds, so that a daemon can tell a
    live count from a stopped controller's (it judges the object's age on S3's clock, LastModified against the
    Date of S3's answer: nobody's host clock). Only the controller may write it: the Triton task role writes
    nothing but ``<prefix>.modelsync/rollouts/*``.
    """

    def __init__(
        self,
        s3: Any,
        bucket: str,
        prefix: str,
        cluster: str,
        service: str,
        *,
        refresh: float = FLEET_REFRESH,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.key = prefix + FLEET_KEY
        self.cluster = cluster.rsplit("/", 1)[-1]
        self.service = service
        self.refresh = refresh
        self.clock = clock
        self.wall = wall
        self._last: tuple[int, int] | None = None
        self._written = 0.0

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def publish(self, tasks: int, running: int) -> bool:
        """Write the counts when they changed or the last write is getting old; True when written. Raises
        FleetError."""
        now = self.clock()
        if self._last == (tasks, running) and now - self._written < self.refresh:
            return False
        body = json.dumps(
            {"cluster": self.cluster, "service": self.service, "running": running, "placed": tasks,
             "at": round(self.wall(), 3)}, sort_keys=True,
        ).encode()  # fmt: skip
        try:
            self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=body, ContentType="application/json")
        except Exception as exc:
            raise FleetError("s3:PutObject", error_text(exc)) from None
        if self._last != (tasks, running):
            log.info(
                "fleet size published: %d running task(s) of service %s (%d placed) at %s",
                running, self.service, tasks, self.where,
                extra={"fields": {"running": running, "placed": tasks}},
            )  # fmt: skip
        self._last, self._written = (tasks, running), now
        return True


class ServiceFanout:
    """One pass of the controller's fan-out: read the service's tasks once, then reconcile the queues (with
    --topic-arn) and publish the fleet's size (with --bucket). Never raises: failures are in the pass."""

    def __init__(self, ecs: Any, cluster: str, service: str, queues: TaskQueues | None, size: FleetSize | None) -> None:
        self.ecs = ecs
        self.cluster = cluster
        self.service = service
        self.queues = queues
        self.size = size
        self.errors = Throttled(log, every=60.0)

    def run(self) -> FanoutPass:
        try:
            tasks = service_tasks(self.ecs, self.cluster, self.service)
        except FleetError as exc:
            out = FanoutPass(failures=1)
            self.errors.log(
                f"fanout:{exc.call}", logging.ERROR,
                f"fan-out step failed: {exc}; no queue is made or removed and the fleet size is not published "
                "this pass", call=exc.call,
            )  # fmt: skip
            return out
        out = self.queues.reconcile(tasks) if self.queues is not None else FanoutPass(tasks=len(tasks))
        out.tasks = len(tasks)
        out.live = tasks
        out.running = sum(1 for t in tasks.values() if t.last_status == "RUNNING")
        if self.size is not None:
            try:
                self.size.publish(out.tasks, out.running)
            except FleetError as exc:
                out.failures += 1
                self.errors.log(
                    f"fanout:{exc.call}", logging.ERROR,
                    f"fan-out step failed: cannot publish the fleet size at {self.size.where}: {exc}; a rollout "
                    "that needs it waits", call=exc.call,
                )  # fmt: skip
        return out
