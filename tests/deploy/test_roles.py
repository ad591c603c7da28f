"""Roles as narrow as the work (issue 36, finding 5): the Triton task's role and the controller's, in the stack and in
the Terraform module, for every scenario tests/deploy/test_terraform.py compares, against a named allowlist.

Each grant is a statement with a ``Sid`` in the list below: its actions a subset of the Sid's, each resource one the
Sid allows for that deployment (built from its parameters, and the queue prefix from the side's own container
environment), its condition exactly the Sid's. Anything else (an unnamed statement, another action, another
resource, a missing or different condition, a managed policy but X-Ray's) is a violation. The role that runs
Triton, and model code from the bucket, so reads the model objects under the prefix, receives from and deletes on
its task's fan-out queue (which the controller makes), sends to the controller's queue (with GPU drains), and keeps
what the task needs besides (logs, OTLP, Exec, the KMS key, scale-in protection); it cannot create, tag,
reconfigure, delete, list or subscribe a queue, drain or mark an instance, or write the fleet's size.

Both sides are read as deployed: the stack with its intrinsics resolved (tests/deploy/test_stack.py's evaluator),
its placeholders written as the module's (test_terraform.placeholders), the module from its plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.deploy.test_stack import ACCOUNT, REGION, VALUES, Stack, _as_list, allowed
from tests.deploy.test_stack import template as template
from tests.deploy.test_terraform import SCENARIOS, module_for, placeholders

XRAY = "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess"
CONTROLLER_QUEUE = "<aws_sqs_queue.controller[0].arn>"
TOPIC = "<aws_sns_topic.modelsync[0].arn>"
STATE_BUCKET = "<aws_s3_bucket.controller_state[0].arn>"
OWN_GROUP = "<aws_autoscaling_group.gpu[0].name>"


@dataclass(frozen=True)
class Grant:
    actions: frozenset[str]
    resources: frozenset[str]
    condition: dict[str, Any] | None = None


def grant(actions: str | list[str], resources: str | list[str], condition: dict[str, Any] | None = None) -> Grant:
    return Grant(frozenset(_as_list(actions)), frozenset(_as_list(resources)), condition)


@dataclass
class Side:
    """One deployable form's view of a scenario: the two roles' statements and what their grants are built on."""

    name: str
    params: dict[str, str]  # every parameter, defaults included
    triton: list[dict[str, Any]]
    triton_managed: list[str]
    controller: list[dict[str, Any]] | None
    controller_managed: list[str]
    env: dict[str, dict[str, str]]  # container -> its environment (the controller's included, as "controller")


def _env(containers: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {c["name"]: {e["name"]: e["value"] for e in c.get("environment", [])} for c in containers}


def _stack_statements(s: Stack, role: str) -> list[dict[str, Any]]:
    return [st for p in s.props(role).get("Policies", []) for st in placeholders(p["PolicyDocument"]["Statement"])]


def stack_side(template: dict[str, Any], params: dict[str, str]) -> Side:
    from tests.deploy.test_stack import api_shape

    s = Stack(template, **params)
    controller = "ControllerTaskRole" in s.resources()
    containers = api_shape(s.props("TaskDefinition"))["containerDefinitions"]
    if controller:
        containers += api_shape(s.props("ControllerTaskDefinition"))["containerDefinitions"]
    return Side(
        "stack",
        dict(s.params),
        _stack_statements(s, "TaskRole"),
        s.props("TaskRole").get("ManagedPolicyArns", []),
        _stack_statements(s, "ControllerTaskRole") if controller else None,
        s.props("ControllerTaskRole").get("ManagedPolicyArns", []) if controller else [],
        placeholders(_env(containers)),
    )


def module_side(params: dict[str, str], stack_params: dict[str, str]) -> Side:
    plan = module_for(params).plan()

    def on(role: str) -> list[dict[str, Any]]:
        return [
            st
            for address, p in plan.items()
            if address.startswith("aws_iam_role_policy.") and str(p["role"]) == f"<aws_iam_role.{role}.id>"
            for st in json.loads(p["policy"])["Statement"]
        ]

    def managed(role: str) -> list[str]:
        return [
            str(p["policy_arn"])
            for address, p in plan.items()
            if address.startswith("aws_iam_role_policy_attachment.") and str(p["role"]) == f"<aws_iam_role.{role}.name>"
        ]

    controller = "aws_iam_role.controller_task[0]" in plan
    containers = json.loads(plan["aws_ecs_task_definition.this"]["container_definitions"])
    if controller:
        containers += json.loads(plan["aws_ecs_task_definition.controller[0]"]["container_definitions"])
    return Side(
        "module",
        stack_params,
        on("task"),
        managed("task"),
        on("controller_task[0]") if controller else None,
        managed("controller_task[0]"),
        _env(containers),
    )


def queue_prefix(side: Side) -> str:
    """The daemons' queue prefix, as the side's own modelsync container has it."""
    return side.env["modelsync"]["MODELSYNC_QUEUE_NAME_PREFIX"]


def rollouts(p: dict[str, str]) -> bool:
    """Safe rollouts on: model sync with CanaryFraction above 0 (the stack's RolloutsEnabled)."""
    return bool(p["ModelSyncBucketName"]) and p["CanaryFraction"] != "0"


def triton_allowlist(side: Side) -> dict[str, Grant]:
    """Every grant the Triton task role may hold in this deployment, by Sid."""
    p = side.params
    logs = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{p['LogGroupPrefix']}"
    out = {
        # Fluent Bit writes the stack's own groups, and creates the per-model ones under the prefix.
        "WriteFixedGroups": grant(
            ["logs:CreateLogStream", "logs:PutLogEvents"],
            [f"{logs}/{g}:*" for g in ("server", "errors", "metrics", "exporter")],
        ),
        "CreateAndWriteModelGroups": grant(
            ["logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:CreateLogStream", "logs:PutLogEvents"],
            f"{logs}/model/*",
        ),
    }
    if p["OtlpMetrics"] == "true":  # the exporter's OTLP output (no resource-level permissions)
        out["PutOtlpMetrics"] = grant("cloudwatch:PutMetricData", "*")
    # The exporter's GPU fault reports; the modelsync daemon's rollout evidence (the controller decides rollouts).
    if p["GpuFaultAction"] == "drain" or rollouts(p):
        out["ReportToTheController"] = grant("sqs:SendMessage", CONTROLLER_QUEUE)
    if p["TaskProtection"] == "true":  # the ECS agent, as the task role, for the exporter
        out["TaskScaleInProtection"] = grant(
            ["ecs:UpdateTaskProtection", "ecs:GetTaskProtection"],
            f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{p['ClusterName']}/*",
        )
    if p["ModelBucketName"]:  # Triton's own s3:// repository
        out["ListModelBucket"] = grant("s3:ListBucket", f"arn:aws:s3:::{p['ModelBucketName']}")
        out["ReadModelObjects"] = grant("s3:GetObject", f"arn:aws:s3:::{p['ModelBucketName']}/*")
    if p["ModelSyncBucketName"]:
        bucket, prefix = p["ModelSyncBucketName"], p["ModelSyncPrefix"]
        out["ListThePrefix"] = grant(
            "s3:ListBucket", f"arn:aws:s3:::{bucket}", {"StringLike": {"s3:prefix": f"{prefix}*"}}
        )
        out["ReadArchives"] = grant(
            ["s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectTagging", "s3:GetObjectVersionTagging"],
            f"arn:aws:s3:::{bucket}/{prefix}*",
        )
        out["ReadItsTasksQueue"] = grant(
            ["sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:DeleteMessage"],
            f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_prefix(side)}*",
        )
    if p["ModelBucketKmsKeyArn"]:
        out["DecryptThroughS3"] = grant(
            "kms:Decrypt",
            p["ModelBucketKmsKeyArn"],
            {"StringEquals": {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}},
        )
    if p["EnableExec"] == "true":  # the ssmmessages channels take no resource-level permissions
        out["EcsExecChannels"] = grant(
            [f"ssmmessages:{a}" for a in ("CreateControlChannel", "CreateDataChannel", "OpenControlChannel",
                                          "OpenDataChannel")],
            "*",
        )  # fmt: skip
    return out


def controller_allowlist(side: Side) -> dict[str, Grant]:
    """Every grant the controller's task role may hold in this deployment, by Sid."""
    p = side.params
    ecs = f"arn:aws:ecs:{REGION}:{ACCOUNT}"
    cluster_arn = f"{ecs}:cluster/{p['ClusterName']}"
    out = {
        "ReadTheReports": grant(["sqs:ReceiveMessage", "sqs:DeleteMessage"], CONTROLLER_QUEUE),
        "DescribeTheClustersTasks": grant("ecs:DescribeTasks", f"{ecs}:task/{p['ClusterName']}/*"),
        "ListTheClustersTasks": grant("ecs:ListTasks", "*", {"ArnEquals": {"ecs:cluster": cluster_arn}}),
        "TheState": grant(["s3:GetObject", "s3:PutObject"], f"{STATE_BUCKET}/controller/{p['ClusterName']}/state.json"),
        "TellAMissingStateFromADeniedOne": grant("s3:ListBucket", STATE_BUCKET),
    }
    if p["GpuFaultAction"] == "drain":
        out["DrainTheInstance"] = grant(
            ["ecs:DescribeContainerInstances", "ecs:UpdateContainerInstancesState"],
            f"{ecs}:container-instance/{p['ClusterName']}/*",
        )
        out["CountTheInstances"] = grant("ecs:ListContainerInstances", cluster_arn)
        out["IsItStillInItsGroup"] = grant("autoscaling:DescribeAutoScalingInstances", "*")
        group = OWN_GROUP if p["CreateCluster"] == "true" else p["GpuFaultAutoScalingGroupName"]
        if group:
            out["ReplaceTheInstance"] = grant(
                "autoscaling:SetInstanceHealth",
                f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/{group}",
            )
    if p["ModelSyncBucketName"]:
        queues = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_prefix(side)}*"
        out["MakeAndCheckTheTasksQueues"] = grant(
            ["sqs:CreateQueue", "sqs:TagQueue", "sqs:GetQueueAttributes", "sqs:SetQueueAttributes",
             "sqs:ListQueueTags", "sqs:GetQueueUrl"],
            queues,
        )  # fmt: skip
        out["RemoveStoppedTasksQueues"] = grant("sqs:DeleteQueue", queues)
        out["ListTheTasksQueues"] = grant("sqs:ListQueues", "*")
        out["SubscribeTheTasksQueues"] = grant(
            "sns:Subscribe",
            TOPIC,
            {"StringEquals": {"sns:Protocol": "sqs"}, "StringLike": {"sns:Endpoint": queues}},
        )
        out["TheTopicsSubscriptions"] = grant(
            ["sns:ListSubscriptionsByTopic", "sns:Unsubscribe"], [TOPIC, f"{TOPIC}:*"]
        )
        out["PublishTheFleetSize"] = grant(
            "s3:PutObject", f"arn:aws:s3:::{p['ModelSyncBucketName']}/{p['ModelSyncPrefix']}.modelsync/fleet.json"
        )
        if p["ModelBucketKmsKeyArn"]:
            out["EncryptTheFleetSize"] = grant(
                "kms:GenerateDataKey",
                p["ModelBucketKmsKeyArn"],
                {"StringEquals": {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}},
            )
    if rollouts(p):  # controller/rollouts.py and controller/__main__.py: what the rollouts call, nothing more
        bucket, prefix = p["ModelSyncBucketName"], p["ModelSyncPrefix"]
        out["DecideTheRollouts"] = grant(
            ["s3:GetObject", "s3:PutObject"],
            [f"arn:aws:s3:::{bucket}/{prefix}.modelsync/{folder}/*" for folder in ("rollouts", "stable", "operator")],
        )
        out["ReadTheRolledOutArtifacts"] = grant(
            ["s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectTagging", "s3:GetObjectVersionTagging"],
            f"arn:aws:s3:::{bucket}/{prefix}*",
        )
        out["ListTheModelPrefix"] = grant(
            "s3:ListBucket", f"arn:aws:s3:::{bucket}", {"StringLike": {"s3:prefix": f"{prefix}*"}}
        )
        out["CheckTheBucketIsVersioned"] = grant("s3:GetBucketVersioning", f"arn:aws:s3:::{bucket}")
        if p["GpuFaultAction"] != "drain":  # DrainTheInstance grants it with drains on
            out["WasTheCanarysInstanceDraining"] = grant(
                "ecs:DescribeContainerInstances", f"{ecs}:container-instance/{p['ClusterName']}/*"
            )
        if p["ModelBucketKmsKeyArn"]:
            out["RolloutObjectsWithTheKey"] = grant(
                ["kms:Decrypt", "kms:GenerateDataKey"],
                p["ModelBucketKmsKeyArn"],
                {"StringEquals": {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}},
            )
    return out


def violations(statements: list[dict[str, Any]], allow: dict[str, Grant]) -> list[str]:
    """Each grant beyond the allowlist: an unnamed or unknown Sid, an action, a resource or a condition not its."""
    out = []
    seen: set[str] = set()
    for st in statements:
        sid = st.get("Sid", "")
        if st.get("Effect") != "Allow" or {"NotAction", "NotResource", "NotPrincipal"} & set(st):
            out.append(f"{sid or '(no Sid)'}: not a plain Allow statement")
            continue
        if sid not in allow:
            out.append(f"{sid or '(no Sid)'}: not in the allowlist ({_as_list(st['Action'])})")
            continue
        if sid in seen:
            out.append(f"{sid}: granted twice")
        seen.add(sid)
        want = allow[sid]
        out += [f"{sid}: action {a}" for a in _as_list(st["Action"]) if a not in want.actions]
        out += [f"{sid}: resource {r}" for r in _as_list(st["Resource"]) if r not in want.resources]
        if st.get("Condition") != want.condition:
            out.append(f"{sid}: condition {st.get('Condition')} (allowed: {want.condition})")
    return out


@pytest.fixture(scope="module", params=list(SCENARIOS))
def sides(request, template) -> tuple[Side, Side]:
    params = VALUES | SCENARIOS[request.param]
    stack = stack_side(template, params)
    return stack, module_side(params, stack.params)


def test_the_triton_task_role_holds_only_named_grants(sides: tuple[Side, Side]) -> None:
    for side in sides:
        allow = triton_allowlist(side)
        assert violations(side.triton, allow) == [], side.name
        # Every grant it holds is one of the list's, and each of the list's it holds is needed by this deployment.
        assert {st["Sid"] for st in side.triton} == set(allow), side.name
        assert set(side.triton_managed) <= {XRAY} and (XRAY in side.triton_managed) == (
            side.params["Tracing"] == "true"
        )


def test_the_controller_role_holds_only_named_grants(sides: tuple[Side, Side]) -> None:
    for side in sides:
        on = side.params["GpuFaultAction"] == "drain" or bool(side.params["ModelSyncBucketName"])
        assert (side.controller is not None) == on, side.name
        if side.controller is None:
            continue
        allow = controller_allowlist(side)
        assert violations(side.controller, allow) == [], side.name
        assert {st["Sid"] for st in side.controller} == set(allow), side.name
        assert side.controller_managed == [], side.name


# What finding 5 found the Triton task role could do, and what the controller alone may: none of it, in any scenario.
def forbidden_to_the_triton_task(side: Side) -> list[tuple[str, str]]:
    p = side.params
    ecs = f"arn:aws:ecs:{REGION}:{ACCOUNT}"
    out = [
        ("ecs:UpdateContainerInstancesState", f"{ecs}:container-instance/{p['ClusterName']}/0123456789abcdef"),
        ("autoscaling:SetInstanceHealth", f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:x:"
                                          "autoScalingGroupName/g"),
        ("ecs:ListTasks", "*"),
        ("sqs:ReceiveMessage", CONTROLLER_QUEUE),
        ("sqs:SendMessage", f"arn:aws:sqs:{REGION}:{ACCOUNT}:other"),
        ("sqs:ListQueues", "*"),
    ]  # fmt: skip
    if p["ModelSyncBucketName"]:
        queue = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_prefix(side)}0123456789abcdef0123456789abcdef"
        bucket, prefix = p["ModelSyncBucketName"], p["ModelSyncPrefix"]
        for action in ("CreateQueue", "TagQueue", "SetQueueAttributes", "GetQueueAttributes", "DeleteQueue",
                       "ListQueueTags", "SendMessage", "ChangeMessageVisibility"):  # fmt: skip
            out.append((f"sqs:{action}", queue))
        for action in ("sns:Subscribe", "sns:Unsubscribe", "sns:ListSubscriptionsByTopic", "sns:Publish"):
            out += [(action, TOPIC), (action, f"{TOPIC}:5d3e8f2a-0b1c-4d5e-8f9a-0b1c2d3e4f5a")]
        out += [
            ("s3:PutObject", f"arn:aws:s3:::{bucket}/{prefix}.modelsync/fleet.json"),
            # the rollouts' objects: the controller alone decides and writes them
            ("s3:PutObject", f"arn:aws:s3:::{bucket}/{prefix}.modelsync/rollouts/model.json"),
            ("s3:PutObject", f"arn:aws:s3:::{bucket}/{prefix}.modelsync/stable/model.json"),
            ("s3:PutObject", f"arn:aws:s3:::{bucket}/{prefix}.modelsync/operator/request.json"),
            ("s3:PutObject", f"arn:aws:s3:::{bucket}/{prefix}model.zip"),
            ("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{prefix}model.zip"),
        ]
        if prefix:  # outside the prefix (a folder: its slash)
            out.append(("s3:GetObject", f"arn:aws:s3:::{bucket}/{prefix.rstrip('/')}-private/model.zip"))
    return out


def test_the_triton_task_role_cannot_do_the_controllers_work(sides: tuple[Side, Side]) -> None:
    for side in sides:
        for action, resource in forbidden_to_the_triton_task(side):
            assert not allowed(side.triton, action, resource), (side.name, action, resource)
        if side.params["ModelSyncBucketName"]:  # and can do its own: its queue, the objects, the fleet's size
            queue = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_prefix(side)}0123456789abcdef0123456789abcdef"
            bucket, prefix = side.params["ModelSyncBucketName"], side.params["ModelSyncPrefix"]
            for action in ("sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:DeleteMessage"):
                assert allowed(side.triton, action, queue), (side.name, action)
            for key in ("model.zip", ".modelsync/fleet.json"):
                assert allowed(side.triton, "s3:GetObject", f"arn:aws:s3:::{bucket}/{prefix}{key}"), (side.name, key)
            # The controller makes what the daemon reads: the same queue names, the same fleet object.
            assert side.controller is not None
            assert side.env["controller"]["CONTROLLER_QUEUE_NAME_PREFIX"] == queue_prefix(side)
            assert allowed(side.controller, "sqs:CreateQueue", queue) and allowed(
                side.controller, "sqs:DeleteQueue", queue
            )
            fleet = f"arn:aws:s3:::{bucket}/{prefix}.modelsync/fleet.json"
            assert allowed(side.controller, "s3:PutObject", fleet)
            assert not allowed(side.controller, "s3:PutObject", f"arn:aws:s3:::{bucket}/{prefix}model.zip")
            if rollouts(side.params):  # the daemon reports to the controller, which writes the rollouts' objects
                assert allowed(side.triton, "sqs:SendMessage", CONTROLLER_QUEUE), side.name
                for folder in ("rollouts", "stable", "operator"):
                    key = f"arn:aws:s3:::{bucket}/{prefix}.modelsync/{folder}/model.json"
                    assert allowed(side.controller, "s3:PutObject", key), (side.name, key)
                    assert allowed(side.controller, "s3:GetObject", key), (side.name, key)
                assert allowed(side.controller, "s3:GetBucketVersioning", f"arn:aws:s3:::{bucket}")


def test_the_triton_task_role_writes_nothing_in_s3(sides: tuple[Side, Side]) -> None:
    """No s3:PutObject at all (nor a wildcard that holds it), in any scenario: the controller writes the rollouts'
    state, the stable copy, the operators' answers and the fleet's size."""
    for side in sides:
        for st in side.triton:
            for action in _as_list(st["Action"]):
                assert action.lower() not in ("s3:putobject", "s3:*", "*") and not action.lower().startswith(
                    "s3:put"
                ), (side.name, st.get("Sid"), action)


# --- the check itself can fail ------------------------------------------------------------------------------

# The Triton task role's model-sync grants before the controller owned the fan-out (deploy/stack.yaml at 7a5835b).
OLD_MODELSYNC = [
    {"Sid": "OwnQueues", "Effect": "Allow",
     "Action": ["sqs:CreateQueue", "sqs:DeleteQueue", "sqs:GetQueueAttributes", "sqs:SetQueueAttributes",
                "sqs:GetQueueUrl", "sqs:TagQueue", "sqs:ListQueueTags", "sqs:ReceiveMessage", "sqs:DeleteMessage"],
     "Resource": "QUEUES"},
    {"Sid": "FindQueues", "Effect": "Allow", "Action": "sqs:ListQueues", "Resource": "*"},
    {"Sid": "SubscribeOwnQueues", "Effect": "Allow", "Action": "sns:Subscribe", "Resource": TOPIC,
     "Condition": {"StringEquals": {"sns:Protocol": "sqs"}, "StringLike": {"sns:Endpoint": "QUEUES"}}},
    {"Sid": "TheTopicsSubscriptions", "Effect": "Allow", "Action": ["sns:ListSubscriptionsByTopic", "sns:Unsubscribe"],
     "Resource": [TOPIC, f"{TOPIC}:*"]},
]  # fmt: skip


def test_the_allowlist_refuses_what_finding_5_found(template) -> None:
    params = VALUES | SCENARIOS["modelsync-rollouts"]
    side = stack_side(template, params)
    allow = triton_allowlist(side)
    queues = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_prefix(side)}*"
    old = json.loads(json.dumps(OLD_MODELSYNC).replace("QUEUES", queues))
    found = violations([*side.triton, *old], allow)
    assert [v.split(":")[0] for v in found] == [
        "OwnQueues",
        "FindQueues",
        "SubscribeOwnQueues",
        "TheTopicsSubscriptions",
    ]
    # An allowed Sid that grows an action, a resource, or loses its condition; an unnamed statement; a Deny-less trick.
    sts = {st["Sid"]: st for st in side.triton}
    for bad in (
        sts["ReadItsTasksQueue"] | {"Action": ["sqs:ReceiveMessage", "sqs:CreateQueue"]},
        sts["ReadItsTasksQueue"] | {"Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:*"},
        sts["ReadArchives"] | {"Resource": f"arn:aws:s3:::{params['ModelSyncBucketName']}/*"},
        {k: v for k, v in sts["ListThePrefix"].items() if k != "Condition"},
        sts["ReportToTheController"] | {"Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:other"},
        {
            "Sid": "RolloutState",
            "Effect": "Allow",
            "Action": "s3:PutObject",
            "Resource": f"arn:aws:s3:::{params['ModelSyncBucketName']}/triton/.modelsync/rollouts/*",
        },
        {"Effect": "Allow", "Action": "s3:PutObject", "Resource": "*"},
        {"Sid": "WriteFixedGroups", "Effect": "Allow", "NotAction": "iam:*", "Resource": "*", "Action": []},
    ):
        others = [st for st in side.triton if st.get("Sid") != bad.get("Sid")]
        assert violations([*others, bad], allow) != [], bad
    # And the controller's list refuses a drain right where drains are off, and a second topic.
    side = stack_side(template, VALUES | SCENARIOS["modelsync"])
    assert side.controller is not None
    allow = controller_allowlist(side)
    assert violations(side.controller, allow) == []
    drain = {"Sid": "DrainTheInstance", "Effect": "Allow", "Action": "ecs:UpdateContainerInstancesState",
             "Resource": f"arn:aws:ecs:{REGION}:{ACCOUNT}:container-instance/gpu-cluster/*"}  # fmt: skip
    assert violations([*side.controller, drain], allow) == ["DrainTheInstance: not in the allowlist "
                                                            "(['ecs:UpdateContainerInstancesState'])"]  # fmt: skip
    sub = next(st for st in side.controller if st["Sid"] == "TheTopicsSubscriptions")
    other = [st for st in side.controller if st is not sub]
    assert violations([*other, sub | {"Resource": "arn:aws:sns:us-east-1:123456789012:other"}], allow) != []
