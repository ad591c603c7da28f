"""deploy/stack.yaml with model sync on: the daemon service, its queue and rule, its role, Triton in explicit mode.

Same evaluator as tests/test_stack.py (intrinsics resolved for given
parameters), then: the daemon's task definition equals
deploy/modelsync-task-definition.json (which the Terraform module reads),
botocore's ECS and EventBridge models for what would be registered, the
IAM evaluator for the role, the event pattern against S3's EventBridge
events, and modelsync's own settings parser for the container environment.
With ModelSyncBucketName empty nothing of it exists.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters

from exporter.render import modelsync as render_modelsync
from exporter.render.options import Options
from modelsync.settings import load
from tests.helpers import CATALOG
from tests.test_deploy import PLACEHOLDER, SAMPLE, substitute
from tests.test_stack import ACCOUNT, REGION, VALUES, Stack, _as_list, allowed, api_shape, by_name, mk, stack_taskdef
from tests.test_stack import template as template

SESSION = botocore.session.get_session()
ROOT = Path(__file__).resolve().parent.parent
MODELSYNC_TASK_DEF = ROOT / "deploy" / "modelsync-task-definition.json"
DOCS = ROOT / "docs" / "modelsync.md"
# The file's placeholders -> values of the shape a user would substitute (see docs/modelsync.md).
MODELSYNC_SAMPLE = {k: SAMPLE[k] for k in ("AccountId", "Region", "ExporterTag")} | {
    "ModelSyncBucketName": "example-models",
    "ModelSyncPrefix": "triton/",
    "ModelSyncQueueUrl": f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/triton-modelsync",
}
ON = {"ModelSyncBucketName": "example-models", "ModelSyncPrefix": "triton/"}
MODELSYNC_RESOURCES = {
    "ModelSyncLogGroup",
    "ModelSyncQueue",
    "ModelSyncEventRule",
    "ModelSyncQueuePolicy",
    "ModelSyncTaskRole",
    "ModelSyncTaskDefinition",
    "ModelSyncService",
}


@pytest.fixture(scope="module")
def on(template) -> Stack:
    return mk(template, **ON)


def statements(s: Stack, role: str) -> list[dict[str, Any]]:
    return [st for p in s.props(role)["Policies"] for st in p["PolicyDocument"]["Statement"]]


def test_nothing_of_it_exists_without_a_bucket(template) -> None:
    off = mk(template)
    assert not MODELSYNC_RESOURCES & set(off.resources())
    triton = by_name(stack_taskdef(off))["triton-server"]
    assert "--model-control-mode" not in triton["command"][2]


def modelsync_file(values: dict[str, str]) -> dict[str, Any]:
    # json.dumps keeps any value valid inside the JSON strings.
    return json.loads(substitute(MODELSYNC_TASK_DEF.read_text(), {k: json.dumps(v)[1:-1] for k, v in values.items()}))


def test_daemon_task_definition_equals_the_json_file(on: Stack) -> None:
    """The stack's daemon is deploy/modelsync-task-definition.json's, field by field (the Terraform module reads
    the file, and tests/test_terraform.py compares it with the stack)."""
    ours = api_shape(on.props("ModelSyncTaskDefinition"))
    theirs = modelsync_file(MODELSYNC_SAMPLE | {"ModelSyncQueueUrl": "<ModelSyncQueue>"})  # Ref: the queue's URL
    # The stack's own roles, where the file names roles a user creates.
    assert (ours.pop("executionRoleArn"), ours.pop("taskRoleArn")) == ("<ExecutionRole.Arn>", "<ModelSyncTaskRole.Arn>")
    assert {theirs.pop("executionRoleArn"), theirs.pop("taskRoleArn")} == {
        f"arn:aws:iam::{ACCOUNT}:role/triton-task-execution",
        f"arn:aws:iam::{ACCOUNT}:role/triton-modelsync",
    }
    # As for the main task: the stack creates the group, so its awslogs driver creates none.
    del theirs["containerDefinitions"][0]["logConfiguration"]["options"]["awslogs-create-group"]
    assert ours == theirs


def test_the_json_file_is_valid_for_ecs_and_its_placeholders_are_documented() -> None:
    text = MODELSYNC_TASK_DEF.read_text()
    assert set(PLACEHOLDER.findall(text)) == set(MODELSYNC_SAMPLE)
    table = DOCS.read_text()
    for name in MODELSYNC_SAMPLE:
        assert re.search(rf"^\| `\$\{{{name}\}}` \|", table, re.M), f"docs/modelsync.md does not document ${{{name}}}"
    td = modelsync_file(MODELSYNC_SAMPLE)
    validate_parameters(td, SESSION.get_service_model("ecs").operation_model("RegisterTaskDefinition").input_shape)
    (c,) = td["containerDefinitions"]
    settings = load([], {e["name"]: e["value"] for e in c["environment"]})
    assert (settings.bucket, settings.prefix, settings.queue_url) == (
        "example-models",
        "triton/",
        MODELSYNC_SAMPLE["ModelSyncQueueUrl"],
    )


def test_daemon_task_definition_and_service_are_valid_for_ecs(on: Stack) -> None:
    assert set(on.resources()) >= MODELSYNC_RESOURCES
    ecs = SESSION.get_service_model("ecs")
    td = api_shape(on.props("ModelSyncTaskDefinition"))
    td["executionRoleArn"], td["taskRoleArn"] = (f"arn:aws:iam::{ACCOUNT}:role/exec", f"arn:aws:iam::{ACCOUNT}:role/ms")
    validate_parameters(td, ecs.operation_model("RegisterTaskDefinition").input_shape)
    svc = api_shape(on.props("ModelSyncService"))
    svc["taskDefinition"] = "arn:aws:ecs:us-east-1:123456789012:task-definition/triton-modelsync:1"
    validate_parameters(svc, ecs.operation_model("CreateService").input_shape)
    assert (svc["schedulingStrategy"], svc["launchType"], td["networkMode"]) == ("DAEMON", "EC2", "host")
    (c,) = td["containerDefinitions"]
    assert c["image"] == VALUES["ExporterImage"]  # the same image, another entry point
    assert c["entryPoint"] == ["/opt/venv/bin/python", "-m", "modelsync"]
    assert c["user"] == "10001:10001" and c["readonlyRootFilesystem"] is True
    (vol,) = td["volumes"]
    assert vol["host"]["sourcePath"] == "/opt/triton-models"
    assert c["mountPoints"] == [{"sourceVolume": vol["name"], "containerPath": "/mnt/triton", "readOnly": False}]
    assert c["logConfiguration"]["options"]["awslogs-group"] == render_modelsync.log_group(Options(catalog=CATALOG))


def test_container_environment_is_a_valid_modelsync_configuration(on: Stack) -> None:
    (c,) = api_shape(on.props("ModelSyncTaskDefinition"))["containerDefinitions"]
    env = {e["name"]: e["value"] for e in c["environment"]}
    assert env["MODELSYNC_QUEUE_URL"] == "<ModelSyncQueue>"  # Ref of a queue is its URL
    env["MODELSYNC_QUEUE_URL"] = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/triton-ModelSyncQueue-1A2B3C"
    settings = load([], env)
    assert (settings.bucket, settings.prefix, settings.queue_url) == (
        "example-models",
        "triton/",
        env["MODELSYNC_QUEUE_URL"],
    )
    assert str(settings.output) == "stdout"  # awslogs: each stdout line is one event, CloudWatch extracts the EMF
    mount = c["mountPoints"][0]["containerPath"]
    # Repository and store inside the one mounted directory: one filesystem, the store outside the repository.
    assert os.path.commonpath([settings.repository, settings.store_root]) == mount
    assert settings.repository.parent == settings.store_root.parent


def test_triton_switches_to_explicit_mode_over_the_same_directory(on: Stack) -> None:
    td = stack_taskdef(on)
    triton = by_name(td)["triton-server"]
    assert "--model-control-mode=explicit --load-model=*" in triton["command"][2]
    (vol,) = td["volumes"]
    assert vol["host"]["sourcePath"] == "/opt/triton-models"
    assert triton["mountPoints"] == [{"sourceVolume": vol["name"], "containerPath": "/mnt/triton", "readOnly": True}]
    (daemon,) = api_shape(on.props("ModelSyncTaskDefinition"))["containerDefinitions"]
    repo = {e["name"]: e["value"] for e in daemon["environment"]}["MODELSYNC_REPOSITORY"]
    assert {e["name"]: e["value"] for e in triton["environment"]}["MODEL_REPOSITORY"] == repo
    validate_parameters(td, SESSION.get_service_model("ecs").operation_model("RegisterTaskDefinition").input_shape)


def test_task_role_reads_only_the_prefix_and_consumes_only_its_queue(on: Stack) -> None:
    sts = statements(on, "ModelSyncTaskRole")
    obj = "arn:aws:s3:::example-models/triton/add.zip"
    for action in ("s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectTagging", "s3:GetObjectVersionTagging"):
        assert allowed(sts, action, obj)
        assert not allowed(sts, action, "arn:aws:s3:::example-models/other/add.zip")
        assert not allowed(sts, action, "arn:aws:s3:::other-bucket/triton/add.zip")
    for action in ("s3:PutObject", "s3:DeleteObject", "s3:PutObjectTagging", "sqs:SendMessage"):
        assert not allowed(sts, action, obj) and not allowed(sts, action, "<ModelSyncQueue.Arn>")
    (listing,) = [st for st in sts if st["Action"] == "s3:ListBucket"]
    assert listing["Resource"] == "arn:aws:s3:::example-models"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "triton/*"}}
    assert allowed(sts, "sqs:ReceiveMessage", "<ModelSyncQueue.Arn>") and allowed(
        sts, "sqs:DeleteMessage", "<ModelSyncQueue.Arn>"
    )
    actions = {a for st in sts for a in _as_list(st["Action"])}
    assert actions == {
        "s3:ListBucket",
        "s3:GetObject",
        "s3:GetObjectVersion",
        "s3:GetObjectTagging",
        "s3:GetObjectVersionTagging",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
    }
    assert not any(r == "*" for st in sts for r in _as_list(st["Resource"]))
    # Its logs go through the execution role's awslogs driver, to its own group only.
    ex = [st for p in on.props("ExecutionRole")["Policies"] for st in p["PolicyDocument"]["Statement"]]
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/ecs/triton/modelsync:log-stream:modelsync/x"
    assert allowed(ex, "logs:PutLogEvents", group)
    assert not allowed(ex, "logs:PutLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/ecs/triton/metrics:x")


def matches(pattern: Any, event: Any) -> bool:
    """EventBridge matching for the pattern forms the stack uses: value lists and {prefix: ...}."""
    if isinstance(pattern, dict):
        return isinstance(event, dict) and all(k in event and matches(v, event[k]) for k, v in pattern.items())
    return any(event.startswith(p["prefix"]) if isinstance(p, dict) else event == p for p in pattern)


def s3_event(bucket: str, key: str, kind: str = "Object Created") -> dict[str, Any]:
    return {
        "version": "0",
        "id": "17793124-05d4-b198-2fde-7ededc63b103",
        "detail-type": kind,
        "source": "aws.s3",
        "account": ACCOUNT,
        "time": "2026-11-12T00:00:00Z",
        "region": REGION,
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {
            "version": "0",
            "bucket": {"name": bucket},
            "object": {
                "key": key,
                "size": 5,
                "etag": "b1946ac92492d2347c6235b4d2611184",
                "sequencer": "00617F08299329D189",
            },
            "request-id": "N4N7GDK58NMKJ12R",
            "requester": ACCOUNT,
            "reason": "PutObject",
        },
    }


def test_event_rule_sends_the_prefix_object_events_to_the_queue(on: Stack) -> None:
    rule = on.props("ModelSyncEventRule")
    events = SESSION.get_service_model("events")
    validate_parameters(
        {"Name": "modelsync", "EventPattern": json.dumps(rule["EventPattern"]), "State": "ENABLED"},
        events.operation_model("PutRule").input_shape,
    )
    validate_parameters(
        {"Rule": "modelsync", "Targets": rule["Targets"]}, events.operation_model("PutTargets").input_shape
    )
    pattern = rule["EventPattern"]
    assert matches(pattern, s3_event("example-models", "triton/add.zip"))
    assert matches(pattern, s3_event("example-models", "triton/add.zip", "Object Deleted"))
    assert not matches(pattern, s3_event("example-models", "other/add.zip"))
    assert not matches(pattern, s3_event("other-bucket", "triton/add.zip"))
    assert not matches(pattern, s3_event("example-models", "triton/add.zip", "Object Tags Added"))
    assert rule["Targets"] == [{"Id": "modelsync-queue", "Arn": "<ModelSyncQueue.Arn>"}]
    (st,) = on.props("ModelSyncQueuePolicy")["PolicyDocument"]["Statement"]
    assert st["Principal"] == {"Service": "events.amazonaws.com"} and st["Action"] == "sqs:SendMessage"
    assert st["Condition"] == {"ArnEquals": {"aws:SourceArn": "<ModelSyncEventRule.Arn>"}}
    queue = on.props("ModelSyncQueue")
    assert queue["SqsManagedSseEnabled"] is True and queue["ReceiveMessageWaitTimeSeconds"] == 20


def test_the_daemon_log_group_is_the_one_the_dashboard_queries(on: Stack) -> None:
    group = on.ref("ModelSyncLogGroup")
    assert group == render_modelsync.log_group(Options(catalog=CATALOG))
    assert on.props("ModelSyncLogGroup")["RetentionInDays"] == "30"
    s = mk(on.t, **ON, LogGroupPrefix="/prod/inf")
    prod = Options(catalog=CATALOG, log_group_prefix="/prod/inf")
    assert s.ref("ModelSyncLogGroup") == render_modelsync.log_group(prod)
