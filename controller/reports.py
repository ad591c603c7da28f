"""A host's GPU fault report, read as data, and the controller's rule of which faults drain an instance.

The message an exporter sends (``--gpu-fault-action drain``; exporter/gpufaults/drain.py writes it)::

    {"type": "gpu_fault", "version": 1,
     "cluster": "<cluster ARN or name>", "task_arn": "<the reporting task>",
     "ec2_instance_id": "i-...",            # where the host could read it (optional)
     "container_instance_arn": "...",       # optional
     "gpu_uuid": "GPU-...", "gpu": 0, "nvml_index": 0,
     "fault": "xid" | "recovery_action" | "lost" | "row_remap_failure",
     "code": 79,                            # the XID or the recovery action
     "reason": "XID 79, GPU has fallen off the bus",
     "evidence": {"reads": 1},              # consecutive reads of the recovery action
     "observed_at": 1760000000.0}

The rule (:func:`classify`) is the controller's, whatever the host concluded: a host's verdict is evidence,
not a decision. A lost GPU, a failed row remap and the fatal XIDs drain at once; a driver recovery action
other than NONE drains once it read so twice in a row; XID 63 (a memory remapping event: NVIDIA's action is
IGNORE), XID 142 (NVENC, unused by inference) and DRAIN_P2P (quiesce peer-to-peer traffic and read again)
are reported, never drained.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from telemetry.shapes import Doc, Malformed, items, loads, number, text

MAX_MESSAGE_BYTES = 16 * 1024  # a report is under 1 KiB; SQS allows 256 KiB
NAME_LIMIT = 2048  # an ARN is at most 2,048 characters

# The XIDs that take an instance out of service: the EKS node monitoring agent's fatal set (2026) less the
# two that are report-only here. The exporter's verdict (exporter/gpufaults/verdict.py) marks the same ones;
# tests/unit/controller/test_reports.py holds both to agree.
DRAINING_XIDS = frozenset({46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156, 158})
REPORT_ONLY_XIDS = frozenset({63, 142})
RECOVERY_NONE = 0
RECOVERY_DRAIN_P2P = 3
REPORT_ONLY_RECOVERY = frozenset({RECOVERY_DRAIN_P2P})
RECOVERY_READS = 2  # a recovery action must read so this many times in a row
FAULTS = ("xid", "recovery_action", "lost", "row_remap_failure")


@dataclass(frozen=True)
class FaultReport:
    """One validated report: who says it (task, instance), which GPU, what was seen."""

    cluster: str
    task_arn: str
    gpu_uuid: str
    gpu: int
    fault: str
    reason: str
    code: int | None = None
    reads: int = 1
    ec2_instance_id: str = ""
    container_instance_arn: str = ""
    observed_at: float = 0.0
    evidence: dict[str, object] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return self.task_arn.rsplit("/", 1)[-1]

    def fields(self) -> dict[str, object]:
        """What a log line carries of the report."""
        out: dict[str, object] = {
            "task_arn": self.task_arn,
            "gpu_uuid": self.gpu_uuid,
            "gpu": self.gpu,
            "fault": self.fault,
            "reason": self.reason,
            "reads": self.reads,
        }
        if self.code is not None:
            out["code"] = self.code
        if self.ec2_instance_id:
            out["reported_ec2_instance_id"] = self.ec2_instance_id
        return out


def parse(body: str | bytes) -> FaultReport:
    """A message body as a report; raises Malformed naming the field."""
    doc = Doc(loads(body, MAX_MESSAGE_BYTES))
    kind = doc.text("type", limit=64, printable=True)
    if kind != "gpu_fault":
        raise Malformed("type", f"{kind[:40]!r}: the controller reads gpu_fault reports")
    doc.integer("version", 1, 1)
    fault = doc.text("fault", limit=32, printable=True)
    if fault not in FAULTS:
        raise Malformed("fault", f"{fault[:40]!r} is not one of {', '.join(FAULTS)}")
    code = doc.optional_integer("code", 0, 1_000_000)
    if fault in ("xid", "recovery_action") and code is None:
        raise Malformed("code", f"missing (a {fault} report names its code)")
    evidence = doc.optional_doc("evidence")
    reads = evidence.integer("reads", 1, 1_000_000, default=1) if evidence else 1
    task_arn = doc.text("task_arn", limit=NAME_LIMIT, printable=True)
    if not task_arn.startswith("arn:") or ":task/" not in task_arn:
        raise Malformed("task_arn", "not an ECS task ARN")
    ec2 = doc.text("ec2_instance_id", limit=64, default="", printable=True)
    if ec2 and not (ec2.startswith("i-") and ec2[2:].isalnum()):
        raise Malformed("ec2_instance_id", "not an EC2 instance id (i-...)")
    return FaultReport(
        cluster=doc.text("cluster", limit=NAME_LIMIT, printable=True),
        task_arn=task_arn,
        gpu_uuid=doc.text("gpu_uuid", limit=128, printable=True),
        gpu=doc.integer("gpu", 0, 1024),
        fault=fault,
        reason=doc.text("reason", limit=512, default="", printable=True),
        code=code,
        reads=reads,
        ec2_instance_id=ec2,
        container_instance_arn=doc.text("container_instance_arn", limit=NAME_LIMIT, default="", printable=True),
        observed_at=doc.number("observed_at", 0, 1e11, default=0.0),
        evidence={"reads": reads},
    )


def classify(report: FaultReport) -> str:
    """``drain`` or why not (a phrase for the log): the controller's own rule, whatever the host concluded."""
    if report.fault in ("lost", "row_remap_failure"):
        return "drain"
    if report.fault == "xid":
        if report.code in DRAINING_XIDS:
            return "drain"
        if report.code in REPORT_ONLY_XIDS:
            return f"XID {report.code} is report-only (no drain)"
        return f"XID {report.code} is not a fault that drains"
    if report.code == RECOVERY_NONE:
        return "recovery action NONE is no fault"
    if report.code in REPORT_ONLY_RECOVERY:
        return "recovery action DRAIN_P2P is report-only (quiesce peer-to-peer traffic and read again; no drain)"
    if report.reads < RECOVERY_READS:
        return f"a recovery action drains once it read so {RECOVERY_READS} times in a row; read {report.reads}"
    return "drain"


def cluster_name(cluster: str) -> str:
    """``arn:aws:ecs:r:a:cluster/NAME`` or ``NAME`` -> ``NAME``."""
    return cluster.rsplit("cluster/", 1)[-1] if cluster.startswith("arn:") else cluster


# --- a model-sync daemon's rollout report ---------------------------------------------------------------------
#
#     {"type": "rollout", "version": 1, "cluster": "...", "task_arn": "<the reporting task: its identity>",
#      "daemon": "<a random id of the daemon process>", "model": "<model>",
#      "event": "seen" | "serving" | "evidence" | "load_failed" | "triton_gone",
#      "artifact": {"sha256": "...", "key": "...", "etag": "...", "version_id": "..."},
#      "counters": {"<triton model>\u001f<version>": [successes, failures, duration_us], ...},   # evidence
#      "reason": "...", "observed_at": 1760000000.0}
#
# ``seen``: S3's object differs from what the state calls stable (a hint: the controller reads S3 itself);
# ``serving``/``evidence``: what the host serves, and its Triton's cumulative counters for the model (the
# controller takes the differences); ``load_failed``: a canary could not install the artifact; ``triton_gone``:
# the host's Triton stopped answering while serving the artifact.

ROLLOUT_EVENTS = ("seen", "serving", "evidence", "load_failed", "triton_gone")
MAX_SERIES = 256  # Triton model versions of one model's counters (a bundle's steps)


@dataclass(frozen=True)
class RolloutReport:
    cluster: str
    task_arn: str
    daemon: str
    model: str
    event: str
    sha256: str
    key: str = ""
    etag: str = ""
    version_id: str = ""
    counters: dict[tuple[str, str], tuple[float, float, float]] = field(default_factory=dict)
    reason: str = ""

    @property
    def task_id(self) -> str:
        return self.task_arn.rsplit("/", 1)[-1]


def kind(body: str | bytes) -> str:
    """The message's ``type`` (``gpu_fault`` or ``rollout``); raises Malformed."""
    doc = Doc(loads(body, MAX_MESSAGE_BYTES))
    return doc.text("type", limit=64, printable=True)


def parse_rollout(body: str | bytes) -> RolloutReport:
    """A rollout report read as data; raises Malformed naming the field."""
    doc = Doc(loads(body, MAX_MESSAGE_BYTES))
    if doc.text("type", limit=64, printable=True) != "rollout":
        raise Malformed("type", "not a rollout report")
    doc.integer("version", 1, 1)
    event = doc.text("event", limit=32, printable=True)
    if event not in ROLLOUT_EVENTS:
        raise Malformed("event", f"{event[:40]!r} is not one of {', '.join(ROLLOUT_EVENTS)}")
    task_arn = doc.text("task_arn", limit=NAME_LIMIT, printable=True)
    if not task_arn.startswith("arn:") or ":task/" not in task_arn:
        raise Malformed("task_arn", "not an ECS task ARN")
    model = doc.text("model", limit=NAME_LIMIT, printable=True)
    if not model or model.startswith(".") or "/" in model:
        raise Malformed("model", "not a model name")
    art = doc.doc("artifact")
    counters: dict[tuple[str, str], tuple[float, float, float]] = {}
    raw = doc.optional_doc("counters")
    if raw is not None:
        if len(raw.raw) > MAX_SERIES:
            raise Malformed("counters", f"more than {MAX_SERIES} series")
        for i, (name, values) in enumerate(raw.raw.items()):
            where = f"counters#{i}"
            triton_model, _, version = text(name, where, NAME_LIMIT).partition("\x1f")
            got = items(values, where)
            if len(got) != 3:
                raise Malformed(where, "not 3 counters")
            s, f, d = (number(v, f"{where}[{j}]", 0.0, 1e20) for j, v in enumerate(got))
            counters[(triton_model, version)] = (s, f, d)
    return RolloutReport(
        cluster=doc.text("cluster", limit=NAME_LIMIT, default="", printable=True),
        task_arn=task_arn,
        daemon=doc.text("daemon", limit=64, printable=True),
        model=model,
        event=event,
        sha256=art.text("sha256", limit=256, printable=True),
        key=art.text("key", limit=NAME_LIMIT, default="", printable=True),
        etag=art.text("etag", limit=256, default="", printable=True),
        version_id=art.text("version_id", limit=1024, default="", printable=True),
        counters=counters,
        reason=doc.text("reason", limit=1024, default="", printable=True),
    )


# --- an operator's command (python -m modelsync rollout promote|reject, modelsync/rolloutcli.py) ---------------
#
#     {"type": "operator", "version": 1, "action": "promote" | "reject", "model": "<model>",
#      "artifact": "<sha256, 8+ hex digits, or an S3 version id; '' for the default>", "force": false,
#      "request": "<32 hex digits: the answer's key>", "claimed_by": "<user@host, as the operator's machine says>",
#      "expires_at": 1760000000.0}
#
# The operator's identity is the message's SQS SenderId (the IAM user or role session that sent it), never
# ``claimed_by``. The controller answers at ``<prefix>.modelsync/operator/<request>.json``.

OPERATOR_ACTIONS = ("promote", "reject")


@dataclass(frozen=True)
class OperatorRequest:
    action: str
    model: str
    artifact: str
    force: bool
    request: str
    claimed_by: str
    expires_at: float


def parse_operator(body: str | bytes) -> OperatorRequest:
    """An operator's command read as data; raises Malformed naming the field."""
    doc = Doc(loads(body, MAX_MESSAGE_BYTES))
    if doc.text("type", limit=64, printable=True) != "operator":
        raise Malformed("type", "not an operator command")
    doc.integer("version", 1, 1)
    action = doc.text("action", limit=16, printable=True)
    if action not in OPERATOR_ACTIONS:
        raise Malformed("action", f"{action[:40]!r} is not one of {', '.join(OPERATOR_ACTIONS)}")
    model = doc.text("model", limit=NAME_LIMIT, printable=True)
    if not model or model.startswith(".") or "/" in model:
        raise Malformed("model", "not a model name")
    request = doc.text("request", limit=64, printable=True)
    if len(request) != 32 or any(c not in "0123456789abcdef" for c in request):
        raise Malformed("request", "not 32 hex digits")
    return OperatorRequest(
        action=action,
        model=model,
        artifact=doc.text("artifact", limit=1024, default="", printable=True),
        force=doc.flag("force"),
        request=request,
        claimed_by=doc.text("claimed_by", limit=256, default="", printable=True),
        expires_at=doc.number("expires_at", 0, 1e11),
    )
