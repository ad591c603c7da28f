"""The fleet's controller in the deployment (docs/controller.md, "Deploy"): its own Fargate service, queue, state
bucket, roles and alarms, with GpuFaultAction=drain or model sync (its fan-out); the Triton task role only reports
and reads its task's queue.

Same evaluator as tests/deploy/test_stack.py (intrinsics resolved for given parameters). What is proven here,
offline, with the real validators:

- the stack's controller task definition equals deploy/task-definition-controller.json field by field (the
  Terraform module reads that file; tests/deploy/test_terraform.py compares the module with the stack), and
  botocore's ECS model accepts it; its placeholders are the ones docs/controller.md documents;
- the container's environment is a valid ``python -m controller`` configuration (its own settings parser), and
  the state key it then uses is the one object its role may read and write;
- the controller's role may make exactly the calls controller/ makes (a small IAM evaluator), on this cluster,
  its queue, its state and the instances' group only;
- the Triton task role, in the stack and in the module, holds no ECS or Auto Scaling right and no SQS right
  but sending to the controller's queue;
- every alarm reads a metric, statistic and dimension the controller's own EMF encoder emits.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters

from controller.fanout import FLEET_KEY
from controller.metrics import FANOUT_NAMES, METRICS, NAMES, ROLLOUT_NAMES, Counts, Recorder
from controller.settings import load
from tests.deploy.test_deploy import PLACEHOLDER, SAMPLE, substitute
from tests.deploy.test_stack import ACCOUNT, REGION, Stack, _as_list, allowed, api_shape, integer_fields, mk
from tests.deploy.test_stack import template as template
from tests.support.paths import REPO

SESSION = botocore.session.get_session()
ROOT = REPO
CONTROLLER_TASK_DEF = ROOT / "deploy" / "task-definition-controller.json"
DOCS = ROOT / "docs" / "controller.md"
DRAIN = {"GpuFaultAction": "drain"}
QUEUE_URL = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/triton-ControllerQueue-1A2B3C4D5E6F"
QUEUE_ARN = f"arn:aws:sqs:{REGION}:{ACCOUNT}:triton-ControllerQueue-1A2B3C4D5E6F"
BUCKET = "triton-controllerstatebucket-1a2b3c4d5e6f"
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:triton-ModelSyncTopic-1A2B3C4D5E6F"
QUEUE_PREFIX = "modelsync-51af3dc0da7711e4872e1234567890ab-"  # the stack's id (test_stack.PSEUDO), its 32 hex digits
# The file's placeholders -> values of the shape a user would substitute (docs/controller.md, "Deploy").
CONTROLLER_SAMPLE = {
    "AccountId": SAMPLE["AccountId"],
    "Region": SAMPLE["Region"],
    "ExporterTag": SAMPLE["ExporterTag"],
    "Namespace": SAMPLE["Namespace"],
    "ClusterName": "gpu-cluster",
    "ControllerQueueUrl": QUEUE_URL,
    "ControllerStateBucket": BUCKET,
    # model sync's fan-out (empty without model sync: an empty variable is unset)
    "ServiceName": "triton",
    "ModelSyncTopicArn": TOPIC,
    "ModelSyncQueuePrefix": QUEUE_PREFIX,
    "ModelSyncBucketName": "example-models",
    "ModelSyncPrefix": "triton/",
}
FANOUT_VARIABLES = (
    "CONTROLLER_SERVICE",
    "CONTROLLER_TOPIC_ARN",
    "CONTROLLER_QUEUE_NAME_PREFIX",
    "CONTROLLER_BUCKET",
    "CONTROLLER_PREFIX",
)
# The stack's own resources with GpuFaultAction=drain, none of which exists without it.
CONTROLLER_RESOURCES = {
    "ControllerLogGroup",
    "ControllerQueue",
    "ControllerDeadLetterQueue",
    "ControllerQueuePolicy",
    "ControllerDeadLetterQueuePolicy",
    "ControllerStateBucket",
    "ControllerStateBucketPolicy",
    "ControllerExecutionRole",
    "ControllerTaskRole",
    "ControllerTaskDefinition",
    "ControllerService",
    "ControllerAlarmDrainsPaused",
    "ControllerAlarmDrainFailures",
    "ControllerAlarmNotRunning",
    "ControllerAlarmReportsRefused",
    "ControllerAlarmStateFailures",
}
# Every scenario with GPU drains: an existing cluster with and without its group, and the stack's own (with model sync).
DRAIN_SCENARIOS = {
    "existing": DRAIN,
    "existing-group": DRAIN | {"GpuFaultAutoScalingGroupName": "gpu-fleet", "ClusterName": "inference-gpus"},
    "own-cluster": DRAIN | {"CreateCluster": "true", "ModelSyncBucketName": "example-models"},
}
SYNC = {"ModelSyncBucketName": "example-models", "ModelSyncPrefix": "triton/"}
# ... and every scenario with the controller: model sync alone (its fan-out), and with drains on a renamed service.
SCENARIOS = DRAIN_SCENARIOS | {
    "sync": SYNC,
    "sync-drain": SYNC | DRAIN | {"ServiceName": "inference", "ClusterName": "inference-gpus"},
}


@pytest.fixture(scope="module")
def on(template) -> Stack:
    return mk(template, **DRAIN)


def statements(s: Stack, role: str) -> list[dict[str, Any]]:
    return [st for p in s.props(role).get("Policies", []) for st in p["PolicyDocument"]["Statement"]]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("environment", [])}


def controller_taskdef(s: Stack) -> dict[str, Any]:
    return integer_fields(api_shape(s.props("ControllerTaskDefinition")))


def controller_container(s: Stack) -> dict[str, Any]:
    (container,) = controller_taskdef(s)["containerDefinitions"]
    return container


def as_deployed(env: dict[str, str]) -> dict[str, str]:
    """The environment as ECS gives it: the queue's Ref is its URL, the bucket's its name, the topic's its ARN."""
    refs = {"<ControllerQueue>": QUEUE_URL, "<ControllerStateBucket>": BUCKET, "<ModelSyncTopic>": TOPIC}
    return {k: refs.get(v, v) for k, v in env.items()}


def controller_file(values: dict[str, str] = CONTROLLER_SAMPLE) -> dict[str, Any]:
    # json.dumps keeps any value valid inside the JSON strings.
    return json.loads(substitute(CONTROLLER_TASK_DEF.read_text(), {k: json.dumps(v)[1:-1] for k, v in values.items()}))


# --- what exists, and where ----------------------------------------------------------------------------------


def test_nothing_of_it_exists_without_drain_or_model_sync(template, on: Stack) -> None:
    off = mk(template)
    assert not CONTROLLER_RESOURCES & set(off.resources()) and set(on.resources()) >= CONTROLLER_RESOURCES
    assert not {n for n in off.resources() if n.startswith("Controller")}
    assert {n for n in on.resources() if n.startswith("Controller")} == CONTROLLER_RESOURCES
    # Model sync alone: the controller for its fan-out, with the fan-out's alarm; nothing in the Triton task reports.
    sync = mk(template, **SYNC)
    assert {n for n in sync.resources() if n.startswith("Controller")} == CONTROLLER_RESOURCES | {
        "ControllerAlarmFanoutFailures"
    }
    for s in (off, sync, mk(template, GpuFaultAction="report", CreateCluster="true")):
        exporter = next(c for c in s.props("TaskDefinition")["ContainerDefinitions"] if c["Name"] == "exporter")
        assert "CONTROLLER_QUEUE_URL" not in {e["Name"] for e in exporter["Environment"]}
        assert not any(p["PolicyName"] == "report-to-controller" for p in s.props("TaskRole")["Policies"])
    outputs = {n for n, o in template["Outputs"].items() if o.get("Condition") == "ControllerEnabled"}
    assert outputs == {"ControllerQueueUrl", "ControllerServiceName", "ControllerStateBucketName"}


@pytest.mark.parametrize("scenario", ["existing", "sync", "sync-drain"])
def test_task_definition_equals_the_json_file(template, scenario: str) -> None:
    """The stack's controller task is deploy/task-definition-controller.json's, field by field: with model sync, the
    fan-out's five variables with the stack's values; without, the file with those five left out (or empty)."""
    s = mk(template, **SCENARIOS[scenario])
    sync = s.condition("ModelSyncEnabled")
    ours = controller_taskdef(s)
    theirs = controller_file(
        CONTROLLER_SAMPLE
        | {"ControllerQueueUrl": "<ControllerQueue>", "ControllerStateBucket": "<ControllerStateBucket>"}
        | {"ClusterName": s.params["ClusterName"], "ServiceName": s.params["ServiceName"]}
        | {"ModelSyncTopicArn": "<ModelSyncTopic>", "ModelSyncBucketName": s.params["ModelSyncBucketName"]}
        | {"ModelSyncPrefix": s.params["ModelSyncPrefix"]}
    )
    for key in ("networkMode", "requiresCompatibilities", "cpu", "memory"):
        assert ours[key] == theirs[key], key
    (expected,) = theirs["containerDefinitions"]
    # The stack creates the group, so its awslogs driver creates none (and the execution role may not).
    assert expected["logConfiguration"]["options"].pop("awslogs-create-group") == "true"
    expected["logConfiguration"]["options"]["awslogs-group"] = "/ecs/triton/controller"
    if not sync:
        expected["environment"] = [e for e in expected["environment"] if e["name"] not in FANOUT_VARIABLES]
    assert controller_container(s) == expected
    assert sync == (scenario != "existing") and (len(expected["environment"]) == 11) == sync


def test_the_json_file_is_valid_for_ecs_and_its_placeholders_are_documented() -> None:
    text = CONTROLLER_TASK_DEF.read_text()
    assert set(PLACEHOLDER.findall(text)) == set(CONTROLLER_SAMPLE)
    docs = DOCS.read_text()
    for name in CONTROLLER_SAMPLE:
        assert re.search(rf"^\| `\$\{{{name}\}}` \|", docs, re.M), f"docs/controller.md does not document ${{{name}}}"
    shape = SESSION.get_service_model("ecs").operation_model("RegisterTaskDefinition").input_shape
    validate_parameters(controller_file(), shape)
    td = controller_file()
    broken = json.loads(json.dumps(td))
    broken["containerDefinitions"][0]["essential"] = "true"
    with pytest.raises(Exception, match="essential"):  # the same validator refuses a wrong type
        validate_parameters(broken, shape)


def test_the_stack_task_definition_is_valid_for_ecs(template) -> None:
    shape = SESSION.get_service_model("ecs").operation_model("RegisterTaskDefinition").input_shape
    for params in SCENARIOS.values():
        td = controller_taskdef(mk(template, **params))
        td |= {"executionRoleArn": f"arn:aws:iam::{ACCOUNT}:role/exec", "taskRoleArn": f"arn:aws:iam::{ACCOUNT}:role/t"}
        (c,) = td["containerDefinitions"]
        c["environment"] = [{"name": k, "value": v} for k, v in as_deployed(env_of(c)).items()]
        validate_parameters(td, shape)


def test_fargate_without_a_gpu_one_at_a_time(on: Stack, template) -> None:
    """It needs no GPU and must survive the drains it decides: Fargate, on any cluster; two never run at once."""
    td = controller_taskdef(on)
    assert (td["requiresCompatibilities"], td["networkMode"], td["cpu"], td["memory"]) == (
        ["FARGATE"], "awsvpc", "256", "512",
    )  # fmt: skip
    c = controller_container(on)
    assert "resourceRequirements" not in c and c["essential"] is True
    assert c["user"] == "10001:10001" and c["readonlyRootFilesystem"] is True
    assert c["logConfiguration"]["logDriver"] == "awslogs"
    assert c["logConfiguration"]["options"]["awslogs-group"] == on.props("ControllerLogGroup")["LogGroupName"]
    assert on.props("ControllerLogGroup")["LogGroupName"] == "/ecs/triton/controller"
    svc = on.props("ControllerService")
    assert (svc["LaunchType"], svc["DesiredCount"], svc["TaskDefinition"]) == (
        "FARGATE",
        1,
        "<ControllerTaskDefinition>",
    )
    assert svc["DeploymentConfiguration"]["MaximumPercent"] == 100
    assert svc["DeploymentConfiguration"]["MinimumHealthyPercent"] == 0
    assert "LoadBalancers" not in svc and "CapacityProviderStrategy" not in svc
    assert svc["NetworkConfiguration"] == on.props("Service")["NetworkConfiguration"]
    assert svc["Cluster"] == "gpu-cluster"
    own = mk(template, **DRAIN_SCENARIOS["own-cluster"])
    assert template["Resources"]["ControllerService"]["Properties"]["Cluster"] == {
        "Fn::If": ["CreatesCluster", {"Ref": "Cluster"}, {"Ref": "ClusterName"}]
    }  # the stack's own cluster: its Ref, so that the service waits for it
    assert own.props("ControllerService")["Cluster"] == own.ref("Cluster")


def test_the_image_runs_python_m_controller() -> None:
    """The entry point is the sidecar image's venv, and the image's build stage copies controller/ into the wheel."""
    c = controller_file()["containerDefinitions"][0]
    assert c["entryPoint"] == ["/opt/venv/bin/python", "-m", "controller"]
    copies = [
        shlex.split(line)[1:] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")
    ]
    assert ["controller/", "./controller/"] in copies


# --- its settings --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_container_environment_is_a_valid_controller_configuration(template, scenario: str) -> None:
    s = mk(template, **SCENARIOS[scenario])
    drain, sync = s.condition("GpuDrainEnabled"), s.condition("ModelSyncEnabled")
    env = env_of(controller_container(s))
    assert (env["CONTROLLER_QUEUE_URL"], env["CONTROLLER_STATE_BUCKET"]) == (
        "<ControllerQueue>",
        "<ControllerStateBucket>",
    )
    command, settings = load([], as_deployed(env))
    assert command == "run" and settings.queue_url == QUEUE_URL and settings.state_bucket == BUCKET
    assert settings.cluster == s.params["ClusterName"] and not settings.state_file
    assert str(settings.output) == "stdout"  # awslogs: each stdout line one event, CloudWatch extracts the EMF
    containers = {c["Name"]: c for c in s.props("TaskDefinition")["ContainerDefinitions"]}
    exporter_env = {e["Name"]: e["Value"] for e in containers["exporter"]["Environment"]}
    assert settings.namespace == exporter_env["AWS_EMF_NAMESPACE"]
    if drain:
        assert exporter_env["CONTROLLER_QUEUE_URL"] == env["CONTROLLER_QUEUE_URL"]  # the hosts report where it reads
    assert exporter_env["EXPORTER_GPU_FAULT_ACTION"] == ("drain" if drain else "report")
    assert ("CONTROLLER_QUEUE_URL" in exporter_env) == drain
    # The fan-out, with model sync: the Triton service's tasks, the daemons' own topic, queue names, bucket and prefix
    # (model sync's settings parser reads the daemon's side).
    assert set(FANOUT_VARIABLES) & set(env) == (set(FANOUT_VARIABLES) if sync else set())
    if sync:
        from modelsync.settings import load as load_modelsync

        daemon = {e["Name"]: e["Value"] for e in containers["modelsync"]["Environment"]}
        sync_settings = load_modelsync([], as_deployed(daemon))
        assert sync_settings.fanout == "controller"
        assert settings.service == s.props("Service")["ServiceName"] == s.params["ServiceName"]
        assert settings.topic_arn == sync_settings.topic_arn == TOPIC
        assert settings.queue_name_prefix == sync_settings.queue_name_prefix == QUEUE_PREFIX
        assert (settings.bucket, settings.prefix) == (sync_settings.bucket, sync_settings.prefix)
        # The task's queue the controller makes is the one the daemon's role may read, and no other's.
        queue = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{settings.queue_name_prefix}0123456789abcdef0123456789abcdef"
        controller_sts, triton_sts = resolved(statements(s, "ControllerTaskRole")), statements(s, "TaskRole")
        assert allowed(controller_sts, "sqs:CreateQueue", queue) and allowed(triton_sts, "sqs:ReceiveMessage", queue)
        fleet = f"arn:aws:s3:::{settings.bucket}/{settings.prefix}{FLEET_KEY}"
        assert allowed(controller_sts, "s3:PutObject", fleet) and allowed(triton_sts, "s3:GetObject", fleet)
        assert not allowed(triton_sts, "s3:PutObject", fleet)
    else:
        assert not settings.service and not settings.topic_arn and not settings.bucket
    # The one object it reads and writes is the one its role may.
    sts = statements(s, "ControllerTaskRole")
    state = f"arn:aws:s3:::{BUCKET}/{settings.key}"
    for action in ("s3:GetObject", "s3:PutObject"):
        assert allowed(resolved(sts), action, state), action
        assert not allowed(resolved(sts), action, f"arn:aws:s3:::{BUCKET}/controller/other-cluster/state.json")


# --- rights --------------------------------------------------------------------------------------------------


def resolved(sts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Statements with the stack's own resources' ARNs as AWS would give them."""
    arns = {
        "<ControllerQueue.Arn>": QUEUE_ARN,
        "<ControllerStateBucket.Arn>": f"arn:aws:s3:::{BUCKET}",
        "<AutoScalingGroup>": "triton-AutoScalingGroup-1A2B3C4D5E6F",
    }

    def fix(r: str) -> str:
        for k, v in arns.items():
            r = r.replace(k, v)
        return r

    return [st | {"Resource": [fix(r) for r in _as_list(st["Resource"])]} for st in sts]


# What controller/ calls (inbox.py, fleet.py, state.py, fanout.py), on what: the resource as IAM evaluates the call.
def calls(cluster: str, group: str | None, drain: bool = True, sync: str | None = None) -> list[tuple[str, str]]:
    base = f"arn:aws:ecs:{REGION}:{ACCOUNT}"
    out = [
        ("sqs:ReceiveMessage", QUEUE_ARN),
        ("sqs:DeleteMessage", QUEUE_ARN),
        ("ecs:DescribeTasks", f"{base}:task/{cluster}/0123456789abcdef0123456789abcdef"),
        ("ecs:ListTasks", "*"),
        ("s3:GetObject", f"arn:aws:s3:::{BUCKET}/controller/{cluster}/state.json"),
        ("s3:PutObject", f"arn:aws:s3:::{BUCKET}/controller/{cluster}/state.json"),
        ("s3:ListBucket", f"arn:aws:s3:::{BUCKET}"),
    ]
    if drain:
        out += [
            ("ecs:DescribeContainerInstances", f"{base}:container-instance/{cluster}/0123456789abcdef"),
            ("ecs:UpdateContainerInstancesState", f"{base}:container-instance/{cluster}/0123456789abcdef"),
            ("ecs:ListContainerInstances", f"{base}:cluster/{cluster}"),
            ("autoscaling:DescribeAutoScalingInstances", "*"),
        ]
    if sync is not None:  # the fan-out (controller/fanout.py): sync is the model prefix
        queue = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{QUEUE_PREFIX}0123456789abcdef0123456789abcdef"
        out += [(f"sqs:{a}", queue) for a in ("CreateQueue", "TagQueue", "GetQueueAttributes", "SetQueueAttributes",
                                             "ListQueueTags", "GetQueueUrl", "DeleteQueue")]  # fmt: skip
        out += [
            ("sqs:ListQueues", "*"),
            ("sns:Subscribe", "<ModelSyncTopic>"),
            ("sns:ListSubscriptionsByTopic", "<ModelSyncTopic>"),
            ("sns:Unsubscribe", "<ModelSyncTopic>:5d3e8f2a-0b1c-4d5e-8f9a-0b1c2d3e4f5a"),
            ("s3:PutObject", f"arn:aws:s3:::example-models/{sync}{FLEET_KEY}"),
        ]
    if group:
        out.append(
            ("autoscaling:SetInstanceHealth", f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:"
             f"0a1b2c3d-0a1b-2c3d-4e5f-0a1b2c3d4e5f:autoScalingGroupName/{group}")
        )  # fmt: skip
    return out


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_controller_role_may_make_exactly_its_calls(template, scenario: str) -> None:
    s = mk(template, **SCENARIOS[scenario])
    sts = resolved(statements(s, "ControllerTaskRole"))
    cluster = s.params["ClusterName"]
    group = {"existing-group": "gpu-fleet", "own-cluster": "triton-AutoScalingGroup-1A2B3C4D5E6F"}.get(scenario)
    sync = s.params["ModelSyncPrefix"] if s.condition("ModelSyncEnabled") else None
    expected = calls(cluster, group, s.condition("GpuDrainEnabled"), sync)
    for action, resource in expected:
        assert allowed(sts, action, resource), (action, resource)
    assert {a for st in sts for a in _as_list(st["Action"])} == {a for a, _ in expected}
    # Nothing of another cluster, group, queue or object.
    base = f"arn:aws:ecs:{REGION}:{ACCOUNT}"
    for action, resource in (
        ("ecs:UpdateContainerInstancesState", f"{base}:container-instance/other/0123456789abcdef"),
        ("ecs:DescribeTasks", f"{base}:task/other/0123456789abcdef"),
        ("ecs:ListContainerInstances", f"{base}:cluster/other"),
        (
            "autoscaling:SetInstanceHealth",
            f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:x:autoScalingGroupName/other",
        ),
        ("sqs:ReceiveMessage", f"arn:aws:sqs:{REGION}:{ACCOUNT}:other"),
        ("s3:PutObject", f"arn:aws:s3:::{BUCKET}/other.json"),
        ("s3:GetObject", "arn:aws:s3:::example-models/triton/model.tar.gz"),
        ("s3:PutObject", "arn:aws:s3:::example-models/triton/model.zip"),
        ("s3:PutObject", "arn:aws:s3:::example-models/triton/.modelsync/rollouts/model.json"),
        ("sqs:CreateQueue", f"arn:aws:sqs:{REGION}:{ACCOUNT}:modelsync-0123456789abcdef-0123"),  # another deployment's
        ("sqs:DeleteQueue", f"arn:aws:sqs:{REGION}:{ACCOUNT}:other"),
        ("sqs:SetQueueAttributes", QUEUE_ARN),
        ("sns:Subscribe", f"arn:aws:sns:{REGION}:{ACCOUNT}:other-topic"),
        ("sns:Publish", "<ModelSyncTopic>"),
    ):
        assert not allowed(sts, action, resource), (action, resource)
    if sync is not None:  # Subscribe only queues of the prefix, over SQS
        (sub,) = [st for st in sts if "sns:Subscribe" in _as_list(st["Action"])]
        assert sub["Condition"] == {
            "StringEquals": {"sns:Protocol": "sqs"},
            "StringLike": {"sns:Endpoint": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{QUEUE_PREFIX}*"},
        }
    # The two Resource "*" grants: ListTasks only on this cluster (its condition), the Describe needs none.
    (list_tasks,) = [st for st in sts if "ecs:ListTasks" in _as_list(st["Action"])]
    assert list_tasks["Condition"] == {"ArnEquals": {"ecs:cluster": f"{base}:cluster/{cluster}"}}
    notes = template["Resources"]["ControllerTaskRole"]["Metadata"]["WildcardJustification"]
    for st in sts:
        if "*" in _as_list(st["Resource"]):
            assert len(notes.get(st["Sid"], "")) > 40, st["Sid"]
    assert len(sts) == len({st["Sid"] for st in sts})  # each grant named


def test_the_controller_execution_role_pulls_the_exporter_image_and_writes_its_group(on: Stack) -> None:
    sts = statements(on, "ControllerExecutionRole")
    repo = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/triton-emf-exporter"
    for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"):
        assert allowed(sts, action, repo) and not allowed(sts, action, repo.replace("emf-exporter", "server"))
    stream = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/ecs/triton/controller:log-stream:controller/c/1"
    assert allowed(sts, "logs:PutLogEvents", stream) and allowed(sts, "logs:CreateLogStream", stream)
    assert not allowed(sts, "logs:PutLogEvents", stream.replace("/controller:", "/metrics:"))
    assert not allowed(sts, "logs:CreateLogGroup", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/ecs/triton/controller")
    for role in ("ControllerExecutionRole", "ControllerTaskRole"):
        (st,) = on.props(role)["AssumeRolePolicyDocument"]["Statement"]
        assert st["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
        assert st["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
    td = on.props("ControllerTaskDefinition")
    assert (td["ExecutionRoleArn"], td["TaskRoleArn"]) == ("<ControllerExecutionRole.Arn>", "<ControllerTaskRole.Arn>")


FLEET_ACTIONS = re.compile(r"^(ecs|autoscaling|ec2):", re.I)


def triton_role_violations(sts: list[dict[str, Any]], queue_arn: str) -> list[str]:
    """What the Triton task role may do to the fleet or to queues beyond sending reports to the controller's."""
    out = []
    for st in sts:
        for action in _as_list(st["Action"]):
            if FLEET_ACTIONS.match(action) or action == "*":
                out.append(f"{st.get('Sid')}: {action}")
            elif action.lower().startswith("sqs:"):
                if action == "sqs:SendMessage" and _as_list(st["Resource"]) == [queue_arn]:
                    continue
                # Model sync's own queues (modelsync-<stack id>-*): never the controller's queue, never all queues.
                resources = _as_list(st["Resource"])
                if "*" in resources or any(allowed([st], action, r) for r in (queue_arn, QUEUE_ARN)):
                    out.append(f"{st.get('Sid')}: {action} on {resources}")
    return out


@pytest.mark.parametrize("scenario", list(DRAIN_SCENARIOS))
def test_the_triton_task_role_can_only_report(template, scenario: str) -> None:
    """The role that runs model code from the bucket: no ECS, Auto Scaling or EC2 right, no SQS right on the
    controller's queue but SendMessage; in the stack and in the module alike."""
    from tests.deploy.test_stack import VALUES
    from tests.deploy.test_terraform import module_for

    s = mk(template, **DRAIN_SCENARIOS[scenario])
    sts = statements(s, "TaskRole")
    assert triton_role_violations(sts, "<ControllerQueue.Arn>") == []
    assert allowed(sts, "sqs:SendMessage", "<ControllerQueue.Arn>")
    plan = module_for(VALUES | DRAIN_SCENARIOS[scenario]).plan()
    tf = [
        st
        for address, p in plan.items()
        if address.startswith("aws_iam_role_policy.") and str(p["role"]) == "<aws_iam_role.task.id>"
        for st in json.loads(p["policy"])["Statement"]
    ]
    assert tf and triton_role_violations(tf, "<aws_sqs_queue.controller[0].arn>") == []
    assert allowed(tf, "sqs:SendMessage", "<aws_sqs_queue.controller[0].arn>")
    # Not vacuous: the check refuses the exporter's old rights, and a send to anything else.
    for bad in (
        {"Sid": "Drain", "Action": "ecs:UpdateContainerInstancesState", "Resource": "*"},
        {"Sid": "Mark", "Action": ["autoscaling:SetInstanceHealth"], "Resource": "*"},
        {"Sid": "Steal", "Action": "sqs:ReceiveMessage", "Resource": "<ControllerQueue.Arn>"},
        {"Sid": "Admin", "Action": "sqs:*", "Resource": "*"},
        {"Sid": "Send", "Action": "sqs:SendMessage", "Resource": "*"},
    ):
        assert triton_role_violations([*sts, bad], "<ControllerQueue.Arn>") != [], bad


def test_only_the_hosts_send_and_only_the_controller_receives(on: Stack) -> None:
    policy = on.props("ControllerQueuePolicy")
    assert policy["Queues"] == ["<ControllerQueue>"]
    sts = {st["Sid"]: st for st in policy["PolicyDocument"]["Statement"]}
    assert all(st["Effect"] == "Deny" and st["Principal"] == "*" for st in sts.values())
    assert sts["DenyInsecureTransport"]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert sts["OnlyTheHostsSend"]["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": "<TaskRole.Arn>"}}
    assert sts["OnlyTheControllerReceives"]["Condition"] == {
        "ArnNotEquals": {"aws:PrincipalArn": "<ControllerTaskRole.Arn>"}
    }
    assert "sqs:ReceiveMessage" in sts["OnlyTheControllerReceives"]["Action"]
    queue = on.props("ControllerQueue")
    assert queue["SqsManagedSseEnabled"] is True and queue["VisibilityTimeout"] >= 60
    assert queue["RedrivePolicy"] == {"deadLetterTargetArn": "<ControllerDeadLetterQueue.Arn>", "maxReceiveCount": 10}
    assert on.props("ControllerDeadLetterQueue")["SqsManagedSseEnabled"] is True
    bucket = on.props("ControllerStateBucket")
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    assert all(bucket["PublicAccessBlockConfiguration"].values()) and len(bucket["PublicAccessBlockConfiguration"]) == 4
    (bucket_policy,) = on.props("ControllerStateBucketPolicy")["PolicyDocument"]["Statement"]
    assert bucket_policy["Effect"] == "Deny" and bucket_policy["Condition"] == {
        "Bool": {"aws:SecureTransport": "false"}
    }


# --- alarms --------------------------------------------------------------------------------------------------


class _Kept:
    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []

    def send(self, events: list[bytes]) -> None:
        self.docs += [json.loads(e) for e in events]

    def take_dropped(self) -> int:
        return 0

    def close(self, timeout: float) -> None:
        pass


@pytest.mark.parametrize("scenario", [*SCENARIOS, "sync-rollouts"])
def test_every_alarm_reads_a_metric_the_controller_emits(template, scenario: str) -> None:
    """The controller's own encoder, with the container's settings, writes one EMF document; each alarm's
    namespace, metric name and dimensions are among what that document declares (CloudWatch would otherwise
    alarm on a series nobody writes)."""
    params = SCENARIOS[scenario] if scenario in SCENARIOS else SYNC | {"CanaryFraction": "0.25"}
    s = mk(template, **params | {"Namespace": "Prod/Triton"})
    _, settings = load([], as_deployed(env_of(controller_container(s))))
    kept = _Kept()
    fanout = (0, 0) if settings.topic_arn else None  # the fan-out's gauges, emitted while it runs (service.py)
    rollouts = 0 if settings.rollouts == "on" else None  # the rollouts' counts, emitted while they are on
    Recorder(settings.namespace, kept, settings.cluster, wall=lambda: 1.7e9).emit(
        Counts(), False, 0, 0, fanout, rollouts
    )
    (doc,) = kept.docs
    emitted = {
        (d["Namespace"], m["Name"], tuple(sorted((k, doc[k]) for k in dims)))
        for d in doc["_aws"]["CloudWatchMetrics"]
        for m in d["Metrics"]
        for dims in d["Dimensions"]
    }
    alarms = [s.props(n) for n in s.resources("AWS::CloudWatch::Alarm")]
    assert len(alarms) == 5 + bool(settings.topic_arn) + 2 * (settings.rollouts == "on")
    assert any(a["MetricName"] in ROLLOUT_NAMES for a in alarms) == (settings.rollouts == "on")
    assert any(a["MetricName"] in FANOUT_NAMES for a in alarms) == bool(settings.topic_arn)
    for alarm in alarms:
        key = (
            alarm["Namespace"],
            alarm["MetricName"],
            tuple(sorted((d["Name"], d["Value"]) for d in alarm["Dimensions"])),
        )
        assert key in emitted, (alarm["AlarmName"], key, sorted(emitted))
        assert alarm["MetricName"] in NAMES + FANOUT_NAMES + ROLLOUT_NAMES
    by_metric = {a["MetricName"]: a for a in alarms}
    assert by_metric["ControllerHeartbeat"]["TreatMissingData"] == "breaching"
    assert by_metric["GpuDrainsPaused"]["Statistic"] == "Maximum"
    assert {m.name: m.unit for m in METRICS}["GpuDrainsPaused"] == "None"  # a 0/1 level, not a count
    # Not vacuous: a name the controller does not emit is refused.
    assert ("Prod/Triton", "GpuDrainPaused", (("cluster", settings.cluster),)) not in emitted


@pytest.mark.parametrize(
    ("parameter", "variable"),
    [
        ("MaxFailureIncrease", "CONTROLLER_MAX_FAILURE_INCREASE"),
        ("MaxFailureRatio", "CONTROLLER_MAX_FAILURE_RATIO"),
        ("MaxLatencyRatio", "CONTROLLER_MAX_LATENCY_RATIO"),
        ("CanaryFraction", "CONTROLLER_CANARY_FRACTION"),
    ],
)
def test_every_value_the_parameter_takes_the_controller_takes(template, parameter: str, variable: str) -> None:
    """A value the stack accepts must not stop the controller at start (0 and 1 did, for the ratios)."""
    p = template["Parameters"][parameter]
    probes = ["0", "0.0", "0.000001", "0.01", "0.5", "0.999999", "1", "1.0", "1.001", "1.5", "2", "999.999", "1000"]
    accepted = [v for v in probes if re.fullmatch(p["AllowedPattern"], v) and len(v) <= p.get("MaxLength", 99)]
    assert accepted, parameter
    for value in accepted:
        if parameter == "CanaryFraction" and float(value) == 0:
            continue  # 0: rollouts off, the controller gets no canary settings
        args = ["--controller-queue-url", "https://sqs.us-east-1.amazonaws.com/123456789012/q", "--cluster", "c",
                "--state-file", "/tmp/controller-state.json"]  # fmt: skip
        _, settings = load(args, {variable: value})
        assert getattr(settings, variable.removeprefix("CONTROLLER_").lower()) == float(value)


def test_an_operator_role_is_admitted_to_the_queue_only_when_named(template) -> None:
    """``python -m modelsync rollout promote|reject`` sends to the controller's queue: the queue policy admits the
    operators' role beside the hosts' when RolloutOperatorRoleArn names it, and no one else."""
    role = f"arn:aws:iam::{ACCOUNT}:role/ml-release"
    params = {"ModelSyncBucketName": "example-models", "CanaryFraction": "0.25"}
    for named, expected in ((role, ["<TaskRole.Arn>", role]), ("", "<TaskRole.Arn>")):
        stack = mk(template, **params, RolloutOperatorRoleArn=named)
        sts = {st["Sid"]: st for st in stack.props("ControllerQueuePolicy")["PolicyDocument"]["Statement"]}
        assert sts["OnlyTheHostsSend"]["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": expected}}
