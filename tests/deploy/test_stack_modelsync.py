"""Model sync in the deployment: two containers of the Triton task, the topic every daemon hears, the task role.

Same evaluator as tests/deploy/test_stack.py (intrinsics resolved for given
parameters). What is proven here, offline:

- the stack's task definition with model sync equals
  deploy/task-definition-modelsync.json field by field, and that file differs
  from deploy/task-definition.json only where model sync needs it;
- the daemon runs inside the Triton task (its network namespace, so
  ``localhost:8000`` is its Triton), Triton starts only once the daemon is
  HEALTHY and loads the links, and the init container's command really gives
  the volumes to uid 10001 (run here as root on real directories);
- botocore's ECS, SNS and EventBridge models accept what would be created;
  the EventBridge pattern against S3's events; modelsync's own settings parser
  for the container environment; the IAM evaluator for the task role.

With ModelSyncBucketName empty nothing of it exists. Running the task on a
container engine is tests/deploy/test_rehearsal.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters

from modelsync.health import Status
from modelsync.settings import load
from modelsync.store import state_dir
from render.base.options import Options, modelsync_log_group
from tests.deploy.test_deploy import PLACEHOLDER, SAMPLE, substitute
from tests.deploy.test_stack import ACCOUNT, REGION, Stack, _as_list, allowed, by_name, mk, stack_taskdef
from tests.deploy.test_stack import template as template
from tests.support.helpers import CATALOG
from tests.support.paths import REPO

SESSION = botocore.session.get_session()
ROOT = REPO
TASK_DEF = ROOT / "deploy" / "task-definition.json"
MODELSYNC_TASK_DEF = ROOT / "deploy" / "task-definition-modelsync.json"
DOCS = ROOT / "docs" / "modelsync.md"
QUEUE_PREFIX = "modelsync-51af3dc0da7711e4872e1234567890ab-"  # the stack's id (test_stack.PSEUDO), its 32 hex digits
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:triton-ModelSyncTopic-1A2B3C4D5E6F"
# The file's placeholders -> values of the shape a user would substitute (see docs/modelsync.md).
MODELSYNC_SAMPLE = SAMPLE.copy() | {
    "ModelSyncBucketName": "example-models",
    "ModelSyncPrefix": "triton/",
    "ModelSyncTopicArn": TOPIC,
    "ModelSyncQueuePrefix": QUEUE_PREFIX,
}
del MODELSYNC_SAMPLE["ModelRepository"]  # the synced repository replaces it
ON = {"ModelSyncBucketName": "example-models", "ModelSyncPrefix": "triton/"}
MODELSYNC_RESOURCES = {"ModelSyncLogGroup", "ModelSyncTopic", "ModelSyncTopicPolicy", "ModelSyncEventRule"}
SYNC_CONTAINERS = ("modelsync-init", "modelsync")


@pytest.fixture(scope="module")
def on(template) -> Stack:
    return mk(template, **ON)


def statements(s: Stack, role: str) -> list[dict[str, Any]]:
    return [st for p in s.props(role)["Policies"] for st in p["PolicyDocument"]["Statement"]]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("environment", [])}


def daemon_env(daemon: dict[str, Any]) -> dict[str, str]:
    """The daemon's environment as ECS would give it: the topic's Ref resolved to an ARN."""
    return {k: TOPIC if v == "<ModelSyncTopic>" else v for k, v in env_of(daemon).items()}


def modelsync_file(values: dict[str, str] = MODELSYNC_SAMPLE) -> dict[str, Any]:
    # json.dumps keeps any value valid inside the JSON strings.
    return json.loads(substitute(MODELSYNC_TASK_DEF.read_text(), {k: json.dumps(v)[1:-1] for k, v in values.items()}))


def base_file() -> dict[str, Any]:
    return json.loads(substitute(TASK_DEF.read_text(), {k: json.dumps(v)[1:-1] for k, v in SAMPLE.items()}))


def test_nothing_of_it_exists_without_a_bucket(template) -> None:
    off = mk(template)
    assert not MODELSYNC_RESOURCES & set(off.resources())
    td = stack_taskdef(off)
    assert not set(SYNC_CONTAINERS) & set(by_name(td))
    triton = by_name(td)["triton-server"]
    assert "--model-control-mode" not in triton["command"][2] and "dependsOn" not in triton
    assert not any(p["PolicyName"] == "modelsync" for p in off.props("TaskRole")["Policies"])


def test_task_definition_equals_the_json_file(on: Stack) -> None:
    """The stack's Triton task with model sync is deploy/task-definition-modelsync.json's, field by field (the
    Terraform module reads the file, and tests/deploy/test_terraform.py compares it with the stack)."""
    ours, theirs = stack_taskdef(on), modelsync_file(MODELSYNC_SAMPLE | {"ModelSyncTopicArn": "<ModelSyncTopic>"})
    for key in ("networkMode", "requiresCompatibilities", "volumes"):
        assert ours[key] == theirs[key], key
    expected = by_name(theirs)
    # The stack creates the groups, so its awslogs drivers create none.
    for name in ("log_router", *SYNC_CONTAINERS):
        del expected[name]["logConfiguration"]["options"]["awslogs-create-group"]
    assert list(by_name(ours)) == list(expected)  # the same order: dependencies first
    assert by_name(ours) == expected


def test_the_json_file_is_valid_for_ecs_and_its_placeholders_are_documented() -> None:
    text = MODELSYNC_TASK_DEF.read_text()
    assert set(PLACEHOLDER.findall(text)) == set(MODELSYNC_SAMPLE)
    table = DOCS.read_text()
    for name in set(MODELSYNC_SAMPLE) - set(SAMPLE):
        assert re.search(rf"^\| `\$\{{{name}\}}` \|", table, re.M), f"docs/modelsync.md does not document ${{{name}}}"
    validate_parameters(
        modelsync_file(), SESSION.get_service_model("ecs").operation_model("RegisterTaskDefinition").input_shape
    )


def test_the_two_json_files_differ_only_where_model_sync_needs_it() -> None:
    """The containers both files share are written twice: this keeps the copies equal."""
    base, synced = by_name(base_file()), by_name(modelsync_file())
    assert list(synced) == ["log_router", *SYNC_CONTAINERS, "triton-server", "exporter"]
    assert synced["log_router"] == base["log_router"] and synced["exporter"] == base["exporter"]
    triton, plain = dict(synced["triton-server"]), dict(base["triton-server"])
    assert triton.pop("dependsOn") == [{"containerName": "modelsync", "condition": "HEALTHY"}]
    assert triton.pop("mountPoints") and "mountPoints" not in plain
    flags = " --model-control-mode=explicit --load-model='*'"
    command = triton.pop("command")
    assert command[:2] == plain["command"][:2]
    assert command[2] == plain.pop("command")[2].replace('"$MODEL_REPOSITORY"', '"$MODEL_REPOSITORY"' + flags)
    env, plain_env = env_of(triton), env_of(plain)
    assert env.pop("MODEL_REPOSITORY") == "/mnt/triton/task/repository" and plain_env.pop("MODEL_REPOSITORY")
    assert env == plain_env
    del triton["environment"], plain["environment"]
    assert triton == plain


def test_model_sync_runs_inside_every_triton_task_and_nowhere_else(on: Stack) -> None:
    """No daemon service: a separate host-network task could not reach an awsvpc Triton on localhost, ran on
    every instance of a mixed cluster, and could not tell the Triton tasks of one instance apart."""
    # The controller's service (Fargate, no GPU) makes the daemons' queues; no daemon runs outside the Triton task.
    assert set(on.resources("AWS::ECS::Service")) == {"Service", "ControllerService"}
    assert set(on.resources("AWS::ECS::TaskDefinition")) == {"TaskDefinition", "ControllerTaskDefinition"}
    assert [c["Name"] for c in on.props("ControllerTaskDefinition")["ContainerDefinitions"]] == ["controller"]
    td = stack_taskdef(on)
    assert td["networkMode"] == "awsvpc"  # one network namespace: localhost is this task's Triton
    daemon = by_name(td)["modelsync"]
    settings = load([], daemon_env(daemon))
    assert settings.triton_url == "http://localhost:8000"
    ports = [p["containerPort"] for p in by_name(td)["triton-server"]["portMappings"]]
    assert int(settings.triton_url.rsplit(":", 1)[1]) in ports


def test_triton_waits_for_the_first_sync_and_loads_the_links(on: Stack) -> None:
    td = stack_taskdef(on)
    c = by_name(td)
    daemon, triton = c["modelsync"], c["triton-server"]
    assert triton["dependsOn"] == [{"containerName": "modelsync", "condition": "HEALTHY"}]
    assert daemon["healthCheck"]["command"] == ["CMD", "/opt/venv/bin/python", "-m", "modelsync.health"]
    hc = daemon["healthCheck"]
    assert 5 <= hc["interval"] <= 300 and 2 <= hc["timeout"] < hc["interval"] and 1 <= hc["retries"] <= 10
    # The deadline of the first sync: past it, ECS gives up on Triton and stops the task.
    assert daemon["startTimeout"] >= 600
    assert daemon["essential"] is False and daemon["restartPolicy"]["enabled"] is True
    assert "--model-control-mode=explicit --load-model='*'" in triton["command"][2]
    settings = load([], daemon_env(daemon))
    assert env_of(triton)["MODEL_REPOSITORY"] == str(settings.repository)
    # Triton mounts what the daemon mounts, read-only, at the same paths: the relative links resolve.
    theirs = {m["sourceVolume"]: (m["containerPath"], m["readOnly"]) for m in triton["mountPoints"]}
    mine = {m["sourceVolume"]: (m["containerPath"], m["readOnly"]) for m in daemon["mountPoints"]}
    assert theirs == {v: (p, True) for v, (p, ro) in mine.items()} and not any(ro for _, ro in mine.values())
    paths = {p for p, _ in mine.values()}
    assert settings.store_root in {Path(p) for p in paths}
    task_mount = next(Path(p) for p in paths if settings.repository.is_relative_to(p))
    assert state_dir(settings.repository).is_relative_to(task_mount)  # temporary links: the repository's mount
    volumes = {v["name"]: v for v in td["volumes"]}
    assert volumes["model-store"]["host"]["sourcePath"] == "/opt/triton-models"  # the instance's, shared
    assert "host" not in volumes["model-repository"]  # the task's own, empty at start


def test_the_health_check_passes_only_after_the_first_sync(on: Stack, tmp_path: Path) -> None:
    """The container's health check command, run with the container's environment over a real status file."""
    daemon = by_name(stack_taskdef(on))["modelsync"]
    env = daemon_env(daemon) | {"MODELSYNC_REPOSITORY": str(tmp_path / "task" / "repository")}
    command = daemon["healthCheck"]["command"]
    assert command[:2] == ["CMD", "/opt/venv/bin/python"]
    cmd = [sys.executable, *command[2:]]  # the image's venv is this one's

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=30)

    assert check().returncode == 1
    state_dir(Path(env["MODELSYNC_REPOSITORY"])).mkdir(parents=True)
    Status(pid=1, started=time.time(), heartbeat=time.time(), note="retrying add: S3 unreachable").write(
        Path(env["MODELSYNC_REPOSITORY"])
    )
    proc = check()
    assert proc.returncode == 1 and "first sync not complete: retrying add" in proc.stderr
    Status(pid=1, started=time.time(), heartbeat=time.time(), first_sync=time.time()).write(
        Path(env["MODELSYNC_REPOSITORY"])
    )
    assert check().returncode == 0
    Status(pid=1, started=0, heartbeat=time.time() - 3600, first_sync=1.0).write(Path(env["MODELSYNC_REPOSITORY"]))
    assert "no heartbeat" in check().stderr


def test_the_init_container_gives_the_volumes_to_the_daemons_user(on: Stack, tmp_path: Path) -> None:
    """ECS (and Docker) create host and task volumes owned by root, and the daemon runs as 10001: without
    this, it exits 2 at every start (cannot use ...: Permission denied). The command runs here, as root,
    on real directories standing for the mounts."""
    if os.geteuid() != 0:
        pytest.skip("needs root to chown, as the init container runs")
    c = by_name(stack_taskdef(on))
    init, daemon = c["modelsync-init"], c["modelsync"]
    assert init["user"] == "0:0" and init["essential"] is False
    assert daemon["dependsOn"] == [{"containerName": "modelsync-init", "condition": "SUCCESS"}]
    assert daemon["user"] == "10001:10001" and daemon["readonlyRootFilesystem"] is True
    assert [m for m in init["mountPoints"]] == [m for m in daemon["mountPoints"]]
    script = init["command"][0]
    for m in init["mountPoints"]:
        local = tmp_path / m["containerPath"].lstrip("/")
        local.mkdir(parents=True)
        os.chown(local, 0, 0)
        script = script.replace(m["containerPath"], str(local))
    assert init["entryPoint"] == ["/bin/sh", "-c"]
    proc = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    uid, gid = (int(x) for x in daemon["user"].split(":"))
    for m in daemon["mountPoints"]:
        st = (tmp_path / m["containerPath"].lstrip("/")).stat()
        assert (st.st_uid, st.st_gid) == (uid, gid), m


def test_container_environment_is_a_valid_modelsync_configuration(on: Stack) -> None:
    daemon = by_name(stack_taskdef(on))["modelsync"]
    env = env_of(daemon)
    assert env["MODELSYNC_TOPIC_ARN"] == "<ModelSyncTopic>"  # Ref of a topic is its ARN
    settings = load([], env | {"MODELSYNC_TOPIC_ARN": TOPIC})
    assert (settings.bucket, settings.prefix, settings.topic_arn) == ("example-models", "triton/", TOPIC)
    assert settings.queue_name_prefix == QUEUE_PREFIX and not settings.queue_url
    # The controller makes, subscribes and removes the task's queue; the daemon only finds and reads it.
    assert settings.fanout == "controller"
    assert str(settings.output) == "stdout"  # awslogs: each stdout line is one event, CloudWatch extracts the EMF
    assert settings.namespace == "Triton/triton" == env_of(by_name(stack_taskdef(on))["exporter"])["AWS_EMF_NAMESPACE"]
    assert daemon["logConfiguration"]["options"]["awslogs-group"] == modelsync_log_group(Options(catalog=CATALOG))


def test_task_role_reads_only_the_prefix_and_its_tasks_queue(on: Stack) -> None:
    """The daemon's calls with --fanout controller (GetQueueUrl, ReceiveMessage, DeleteMessageBatch) on queues of
    the stack's prefix; no queue it could create, tag, reconfigure, delete, list or subscribe (issue 36, finding 5).
    tests/deploy/test_roles.py holds the whole role to a named allowlist, in the stack and the module alike."""
    sts = [
        st
        for p in on.props("TaskRole")["Policies"]
        if p["PolicyName"] == "modelsync"
        for st in p["PolicyDocument"]["Statement"]
    ]
    obj = "arn:aws:s3:::example-models/triton/add.zip"
    for action in ("s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectTagging", "s3:GetObjectVersionTagging"):
        assert allowed(sts, action, obj)
        assert not allowed(sts, action, "arn:aws:s3:::example-models/other/add.zip")
        assert not allowed(sts, action, "arn:aws:s3:::other-bucket/triton/add.zip")
    for action in ("s3:PutObject", "s3:DeleteObject", "s3:PutObjectTagging"):
        assert not allowed(sts, action, obj)
    assert not allowed(sts, "s3:PutObject", "arn:aws:s3:::example-models/triton/.modelsync/fleet.json")
    (listing,) = [st for st in sts if st["Action"] == "s3:ListBucket"]
    assert listing["Resource"] == "arn:aws:s3:::example-models"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "triton/*"}}
    own = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{QUEUE_PREFIX}0123456789abcdef0123456789abcdef"
    for action in ("sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:DeleteMessage"):
        assert allowed(sts, action, own), action
        assert not allowed(sts, action, f"arn:aws:sqs:{REGION}:{ACCOUNT}:other-queue"), action
    for action in ("sqs:CreateQueue", "sqs:DeleteQueue", "sqs:TagQueue", "sqs:SetQueueAttributes",
                   "sqs:GetQueueAttributes", "sqs:ListQueueTags", "sqs:SendMessage", "sqs:ListQueues"):  # fmt: skip
        assert not allowed(sts, action, own) and not allowed(sts, action, "*"), action
    for action in ("sns:Subscribe", "sns:Unsubscribe", "sns:ListSubscriptionsByTopic", "sns:Publish"):
        assert not allowed(sts, action, "<ModelSyncTopic>"), action
    # The queue of a task is <prefix><task id> within SQS's 80 characters, whatever the stack's name.
    assert len(QUEUE_PREFIX) <= 44 and len(QUEUE_PREFIX) + 32 <= 80
    assert not [st for st in sts if "*" in _as_list(st["Resource"])]
    # Its logs go through the execution role's awslogs driver, to its own group only.
    ex = statements(on, "ExecutionRole")
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/ecs/triton/modelsync:log-stream:modelsync/x"
    assert allowed(ex, "logs:PutLogEvents", group)
    assert not allowed(ex, "logs:PutLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/ecs/triton/metrics:x")


def test_a_customer_managed_key_may_decrypt_through_s3_only(template) -> None:
    """A bucket encrypted with SSE-KMS and a customer managed key answers AccessDenied to every GET without
    kms:Decrypt on that key; the grant is limited to calls S3 makes on the task's behalf."""
    key = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    for params in (ON, {"ModelBucketName": "example-models", "ModelRepository": "s3://example-models/triton"}):
        assert not allowed(statements(mk(template, **params), "TaskRole"), "kms:Decrypt", key)
        sts = statements(mk(template, **params, ModelBucketKmsKeyArn=key), "TaskRole")
        (st,) = [st for st in sts if "kms:Decrypt" in _as_list(st["Action"])]
        assert st["Resource"] == key and st["Action"] == "kms:Decrypt"
        assert st["Condition"] == {"StringEquals": {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}}
    with pytest.raises(AssertionError):  # the parameter refuses what is not a key ARN
        mk(template, **ON, ModelBucketKmsKeyArn="alias/models")


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


def test_event_rule_publishes_the_prefix_object_events_to_the_topic(on: Stack) -> None:
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
    assert rule["Targets"] == [{"Id": "modelsync-topic", "Arn": "<ModelSyncTopic>"}]
    policy = on.props("ModelSyncTopicPolicy")
    assert policy["Topics"] == ["<ModelSyncTopic>"]
    (st,) = policy["PolicyDocument"]["Statement"]
    assert st["Principal"] == {"Service": "events.amazonaws.com"} and st["Action"] == "sns:Publish"
    assert st["Condition"] == {"ArnEquals": {"aws:SourceArn": "<ModelSyncEventRule.Arn>"}}
    sns = SESSION.get_service_model("sns")
    validate_parameters(
        {"Name": "triton-modelsync", "Attributes": {k: str(v) for k, v in on.props("ModelSyncTopic").items()}},
        sns.operation_model("CreateTopic").input_shape,
    )


def test_the_daemon_log_group_is_the_one_the_dashboard_queries(on: Stack) -> None:
    group = on.ref("ModelSyncLogGroup")
    assert group == modelsync_log_group(Options(catalog=CATALOG))
    assert on.props("ModelSyncLogGroup")["RetentionInDays"] == "30"
    s = mk(on.t, **ON, LogGroupPrefix="/prod/inf")
    prod = Options(catalog=CATALOG, log_group_prefix="/prod/inf")
    assert s.ref("ModelSyncLogGroup") == modelsync_log_group(prod)


def test_the_prefix_is_a_folder_so_its_grants_stop_at_its_slash(template) -> None:
    """``models`` would grant ``models*``, which reaches ``models-private/...``: the stack takes folders only."""
    pattern = template["Parameters"]["ModelSyncPrefix"]["AllowedPattern"]
    assert [bool(re.fullmatch(pattern, p)) for p in ("", "models/", "team/models/", "models", "/models/", "m*/")] == [
        True, True, True, False, False, False,
    ]  # fmt: skip
    sts = statements(mk(template, ModelSyncBucketName="example-models", ModelSyncPrefix="models/"), "TaskRole")
    assert allowed(sts, "s3:GetObject", "arn:aws:s3:::example-models/models/add.zip")
    assert not allowed(sts, "s3:GetObject", "arn:aws:s3:::example-models/models-private/add.zip")
