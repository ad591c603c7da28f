"""deploy/stack.yaml: one CloudFormation stack for the Triton task, service, logs, IAM, alarms.

Offline, with the real validators: cfn-lint's Python API for the template, botocore's ECS
model for the task definition the stack registers. The semantic checks evaluate the
template's intrinsic functions (Ref, Fn::Sub, Fn::If, Fn::Select/Split...) for given
parameter values and then check what CloudFormation would create:

- the containers equal deploy/task-definition.json's, field by field;
- every log group Fluent Bit writes, found by running log lines through the real
  fluentbit/triton.conf (tests/support/fluentbit_sim.py) with the router environment the stack
  sets, exists in the stack or lies under the one per-model wildcard;
- the task role may write exactly those groups (a small IAM evaluator: Allow statements,
  ``*``/``?`` wildcards), create only the per-model ones, and nothing else;
- the nested alarms stack gets every parameter of alarms/triton-alarms.template.json.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters
from cfnlint.api import ManualArgs
from cfnlint.api import lint as cfn_lint
from cfnlint.decode.cfn_yaml import load as load_cfn_yaml

from tests.deploy.test_deploy import SAMPLE, substitute
from tests.deploy.test_fluentbit import GOLDEN
from tests.support.fluentbit_sim import FireLensTask, Pipeline, Record, dockerfile_copies, dockerfile_env
from tests.support.paths import REPO

ROOT = REPO
STACK = ROOT / "deploy" / "stack.yaml"
TASK_DEF = ROOT / "deploy" / "task-definition.json"
ALARMS = ROOT / "alarms" / "triton-alarms.template.json"
FB = ROOT / "fluentbit"
DOCS = ROOT / "docs" / "deploy.md"

REGION, ACCOUNT = SAMPLE["Region"], SAMPLE["AccountId"]
REGISTRY = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"
# Parameter values that make the stack's containers the sample task definition of test_deploy.
VALUES = {
    "ClusterName": "gpu-cluster",
    "VpcId": "vpc-0123456789abcdef0",
    "SubnetIds": "subnet-0123456789abcdef0,subnet-0fedcba9876543210",
    "SecurityGroupIds": "sg-0123456789abcdef0",
    "ListenerArn": f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT}:listener/app/shared/50dc6c495c0c9188/"
    "f2f7dc8efc522ab2",
    "TritonImage": f"{REGISTRY}/triton-server:{SAMPLE['TritonTag']}",
    "ExporterImage": f"{REGISTRY}/triton-emf-exporter:{SAMPLE['ExporterTag']}",
    "LogRouterImage": f"{REGISTRY}/triton-log-router:{SAMPLE['LogRouterTag']}",
    "ModelRepository": SAMPLE["ModelRepository"],
    "ExpectGpu": SAMPLE["ExpectGpu"],
}
PSEUDO = {
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::Partition": "aws",
    "AWS::StackName": "triton",
    "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/triton/51af3dc0-da77-11e4-872e-1234567890ab",
    "AWS::URLSuffix": "amazonaws.com",
}
NO_VALUE = object()
# Resource types whose Ref is the value of one of their own properties (a name), not an id known after creation.
REF_IS_PROPERTY = {
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::ECS::Cluster": "ClusterName",
    "AWS::ECS::CapacityProvider": "Name",
    "AWS::ECS::ClusterCapacityProviderAssociations": "Cluster",  # its primary identifier
}


# --- a small evaluator for the intrinsic functions the template uses ------------------------


class Stack:
    """The template with parameter values: resolves intrinsics the way CloudFormation would."""

    def __init__(self, template: dict[str, Any], **params: str) -> None:
        self.t = template
        self.pseudo = dict(PSEUDO)  # AWS::StackName and friends; a test may name another stack
        unknown = set(params) - set(template["Parameters"])
        assert not unknown, unknown
        self.params: dict[str, Any] = {}
        for name, p in template["Parameters"].items():
            if name in params:
                value = params[name]
            else:
                assert "Default" in p, f"parameter {name} has no default and no value"
                value = p["Default"]
            value = value if isinstance(value, str) else json.dumps(value)  # Ref of a Number is a string
            if "AllowedPattern" in p:
                assert re.fullmatch(p["AllowedPattern"], value), (name, value)
            if "AllowedValues" in p:
                assert value in [str(v) for v in p["AllowedValues"]], (name, value)
            self.params[name] = value.split(",") if p["Type"].startswith("List<") else value

    def condition(self, name: str) -> bool:
        return bool(self.ev(self.t["Conditions"][name]))

    def resources(self, type_: str | None = None) -> dict[str, dict[str, Any]]:
        out = {}
        for name, res in self.t["Resources"].items():
            if type_ and res["Type"] != type_:
                continue
            if "Condition" in res and not self.condition(res["Condition"]):
                continue
            out[name] = res
        return out

    def props(self, name: str) -> dict[str, Any]:
        return self.ev(self.t["Resources"][name].get("Properties", {}))

    def ref(self, name: str) -> Any:
        if name in self.params:
            if self.t["Parameters"][name]["Type"].startswith("AWS::SSM::Parameter::Value<"):
                return f"<ssm:{self.params[name]}>"  # CloudFormation passes the SSM parameter's value
            return self.params[name]
        if name in self.pseudo:
            return self.pseudo[name]
        if name == "AWS::NoValue":
            return NO_VALUE
        res = self.t["Resources"][name]
        prop = REF_IS_PROPERTY.get(res["Type"])  # Ref of a log group is its name, and so on
        if prop and prop in res.get("Properties", {}):
            return self.ev(res["Properties"][prop])
        return f"<{name}>"

    def sub(self, text: str, local: dict[str, Any]) -> str:
        def repl(m: re.Match[str]) -> str:
            key = m.group(1)
            if key.startswith("!"):
                return "${" + key[1:] + "}"
            if key in local:
                return str(local[key])
            if "." in key and key.split(".")[0] in self.t["Resources"]:
                return f"<{key}>"
            return str(self.ref(key))

        return re.sub(r"\$\{([^}]+)\}", repl, text)

    def ev(self, x: Any) -> Any:
        if isinstance(x, list):
            return [v for v in (self.ev(i) for i in x) if v is not NO_VALUE]
        if not isinstance(x, dict):
            return x
        if len(x) == 1:
            ((key, arg),) = x.items()
            if key == "Ref":
                return self.ref(arg)
            if key == "Fn::Sub":
                text, local = (arg, {}) if isinstance(arg, str) else (arg[0], self.ev(arg[1]))
                return self.sub(text, local)
            if key == "Fn::Split":
                return str(self.ev(arg[1])).split(arg[0])
            if key == "Fn::Select":
                return self.ev(arg[1])[int(self.ev(arg[0]))]
            if key == "Fn::FindInMap":
                name, top, second = (self.ev(a) for a in arg)
                return self.t["Mappings"][name][top][second]
            if key == "Fn::Base64":
                return base64.b64encode(str(self.ev(arg)).encode()).decode()
            if key == "Fn::Join":
                return arg[0].join(str(v) for v in self.ev(arg[1]))
            if key == "Fn::If":
                return self.ev(arg[1] if self.condition(arg[0]) else arg[2])
            if key == "Fn::Equals":
                return str(self.ev(arg[0])) == str(self.ev(arg[1]))
            if key == "Fn::Not":
                return not self.ev(arg[0])
            if key == "Fn::And":
                return all(self.ev(a) for a in arg)
            if key == "Fn::Or":
                return any(self.ev(a) for a in arg)
            if key == "Condition":
                return self.condition(arg)
            if key == "Fn::GetAtt":
                return "<{}.{}>".format(*(arg.split(".", 1) if isinstance(arg, str) else arg))
            assert not key.startswith("Fn::"), f"evaluator does not know {key}"
        return {k: v for k, v in ((k, self.ev(v)) for k, v in x.items()) if v is not NO_VALUE}


def mk(template: dict[str, Any], **overrides: str) -> Stack:
    return Stack(template, **(VALUES | overrides))


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return json.loads(json.dumps(load_cfn_yaml(str(STACK))))


@pytest.fixture(scope="module")
def stack(template) -> Stack:
    return Stack(template, **VALUES)


@pytest.fixture(scope="module")
def alarms_template() -> dict[str, Any]:
    return json.loads(ALARMS.read_text())


# --- cfn-lint ------------------------------------------------------------------------------


def lint(text: str) -> list[str]:
    # W3002: the nested stack's TemplateURL is a local path that `aws cloudformation package`
    # uploads; that is the intended use, and test_nested_alarms_stack checks the path.
    # I4010 (informational) only asks for Metadata "Context" descriptions, as in test_render.
    # Informational and experimental rules on, like lint_all, in three regions rather than all (10x faster).
    config = ManualArgs(
        include_checks=["I"], include_experimental=True, regions=["us-east-1", "eu-west-1", "ap-northeast-1"]
    )
    return [str(m) for m in cfn_lint(text, config=config) if m.rule.id not in ("W3002", "I4010")]


def test_stack_passes_cfn_lint() -> None:
    assert lint(STACK.read_text()) == []


def test_cfn_lint_is_not_vacuous() -> None:
    text = STACK.read_text()
    broken = text.replace("HealthCheckPath: /v2/health/ready", "HealthCheckPath: /v2/health/ready\n      Colour: blue")
    broken = broken.replace("Essential: false", "Essential: maybe", 1)
    assert broken != text
    problems = lint(broken)
    assert any("Colour" in p for p in problems) and any("maybe" in p for p in problems), problems


def test_the_brief_parameters_exist(template) -> None:
    for name in (
        "ClusterName",
        "VpcId",
        "SubnetIds",
        "SecurityGroupIds",
        "TritonImage",
        "ExporterImage",
        "LogRouterImage",
        "ModelRepository",
        "ModelRepositoryHostPath",
        "TaskStartSeconds",
        "MinCapacity",
        "MaxCapacity",
        "AlarmTopicArn",
        "LogGroupPrefix",
        "LogRetentionDays",
        "Namespace",
        "EnableExec",
        "ListenerArn",
    ):
        assert name in template["Parameters"], name
    assert template["Parameters"]["EnableExec"]["Default"] == "false"


# --- the task definition ---------------------------------------------------------------------


def api_shape(x: Any, in_options: bool = False) -> Any:
    """CloudFormation ContainerDefinitions (PascalCase) -> RegisterTaskDefinition (camelCase)."""
    if isinstance(x, list):
        return [api_shape(v) for v in x]
    if isinstance(x, dict):
        if in_options:
            return dict(x)
        return {k[:1].lower() + k[1:]: api_shape(v, in_options=(k == "Options")) for k, v in x.items()}
    return x


def sample_taskdef() -> dict[str, Any]:
    return json.loads(substitute(TASK_DEF.read_text(), {k: json.dumps(v)[1:-1] for k, v in SAMPLE.items()}))


_INTEGERS = {"cpu", "memory", "memoryReservation"}  # a Ref of a Number parameter evaluates to its string


def integer_fields(td: dict[str, Any]) -> dict[str, Any]:
    """The container fields ECS takes as integers, as integers (a Ref of a Number evaluates to a string)."""
    for c in td["containerDefinitions"]:
        for key in _INTEGERS & set(c):
            c[key] = int(c[key])
    return td


def stack_taskdef(stack: Stack) -> dict[str, Any]:
    props = integer_fields(api_shape(stack.props("TaskDefinition")))
    props["executionRoleArn"] = f"arn:aws:iam::{ACCOUNT}:role/exec"
    props["taskRoleArn"] = f"arn:aws:iam::{ACCOUNT}:role/task"
    for c in props["containerDefinitions"]:  # the Ref of the stack's own secret, as the files' sample names it
        for secret in c.get("secrets", []):
            if secret["valueFrom"] == "<TritonAdminKey>":
                secret["valueFrom"] = SAMPLE["TritonAdminKeyArn"]
    return props


def by_name(td: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in td["containerDefinitions"]}


def test_containers_equal_the_task_definition_json(stack) -> None:
    """Same containers, images, commands, env names and values, health check, dependsOn, essential..."""
    ours, theirs = stack_taskdef(stack), sample_taskdef()
    assert (ours["networkMode"], ours["requiresCompatibilities"]) == (
        theirs["networkMode"],
        theirs["requiresCompatibilities"],
    )
    expected = by_name(theirs)
    # The one intended difference: the stack pre-creates the router's own group, so the
    # awslogs driver needs no CreateLogGroup (and the execution role does not get it).
    del expected["log_router"]["logConfiguration"]["options"]["awslogs-create-group"]
    assert by_name(ours) == expected


def test_stack_task_definition_is_valid_for_ecs(stack) -> None:
    shape = botocore.session.get_session().get_service_model("ecs").operation_model("RegisterTaskDefinition")
    for s in (stack, mk(stack.t, ModelRepositoryHostPath="/mnt/efs/models", ModelRepository="/models")):
        validate_parameters(stack_taskdef(s), shape.input_shape)


def test_values_follow_the_parameters(template) -> None:
    s = mk(
        template,
        Namespace="Prod/Triton",
        LogGroupPrefix="/prod/inf",
        LogRetentionDays="90",
        ExpectGpu="L4",
        ModelRepository="s3://other/repo",
    )
    c = by_name(stack_taskdef(s))
    env = {name: {e["name"]: e["value"] for e in c[name]["environment"]} for name in c}
    assert env["exporter"]["AWS_EMF_NAMESPACE"] == "Prod/Triton"
    assert (
        c["triton-server"]["cpu"] == 3072
        and by_name(stack_taskdef(mk(template, TritonCpu="7168")))["triton-server"]["cpu"] == 7168
    )
    assert env["log_router"]["TRITON_LOG_GROUP_PREFIX"] == "/prod/inf"
    assert env["log_router"]["TRITON_LOG_RETENTION_DAYS"] == "90"
    assert env["triton-server"]["MODEL_REPOSITORY"] == "s3://other/repo"
    assert env["triton-server"]["STARTUP_EXPECT_GPU"] == "L4"
    assert c["log_router"]["logConfiguration"]["options"]["awslogs-group"] == "/prod/inf/log-router"
    for res in s.resources("AWS::Logs::LogGroup"):
        assert s.props(res)["RetentionInDays"] == "90"


def test_model_repository_host_path_is_mounted_read_only(template, stack) -> None:
    assert "volumes" not in stack_taskdef(stack)
    s = mk(template, ModelRepositoryHostPath="/mnt/efs/models", ModelRepository="/models")
    td = stack_taskdef(s)
    (vol,) = td["volumes"]
    assert vol["host"]["sourcePath"] == "/mnt/efs/models"
    triton = by_name(td)["triton-server"]
    assert triton["mountPoints"] == [{"sourceVolume": vol["name"], "containerPath": "/models", "readOnly": True}]
    assert {e["name"]: e["value"] for e in triton["environment"]}["MODEL_REPOSITORY"] == "/models"
    assert all("mountPoints" not in c for n, c in by_name(td).items() if n != "triton-server")


# --- log groups: what Fluent Bit writes, with the router environment the stack sets ---------


def router_env(s: Stack) -> dict[str, str]:
    router = by_name(stack_taskdef(s))["log_router"]
    return dockerfile_env(FB / "Dockerfile") | {e["name"]: e["value"] for e in router["environment"]}


def groups_fluent_bit_writes(s: Stack) -> set[str]:
    """Run Triton and exporter lines through the real triton.conf; collect the groups written."""
    p = Pipeline(FB / "triton.conf", router_env(s), dockerfile_copies(FB / "Dockerfile"))
    lines = [g[0] for g in GOLDEN] + (ROOT / "tests/fixtures/logs/triton_bare_pre2405.log").read_text().splitlines()
    emf = '{"_aws":{"Timestamp":1,"CloudWatchMetrics":[]},"x":1}'
    records = FireLensTask("triton-server").records(lines)
    records += FireLensTask("exporter").records([emf], stream="stdout")
    records += FireLensTask("exporter").records(['{"level":"info","msg":"up"}'], stream="stderr")
    tcp = next(i for i in p.inputs if i.name == "tcp")
    records.append(Record(tcp.get("Tag") or "", 1.7e9, {"log": emf}))
    return {e.group for e in p.run(records)}


def config_groups(s: Stack) -> tuple[set[str], set[str]]:
    """Fixed log_group_name values and log_group_template patterns (``*`` for $TAG parts) of triton.conf."""
    p = Pipeline(FB / "triton.conf", router_env(s), dockerfile_copies(FB / "Dockerfile"))
    fixed, templates = set(), set()
    for o in p.outputs:
        assert o.name == "cloudwatch_logs"
        if o.get("log_group_template"):
            templates.add(re.sub(r"\$TAG\[\d+\](\.\$TAG\[\d+\])*", "*", o.get("log_group_template") or ""))
        fixed.add(o.get("log_group_name") or "")
    return fixed, templates


def stack_groups(s: Stack) -> dict[str, str]:
    return {s.ref(name): name for name in s.resources("AWS::Logs::LogGroup")}


@pytest.mark.parametrize("prefix", ["/ecs/triton", "/prod/inf"])
def test_every_group_fluent_bit_writes_is_in_the_stack(template, prefix: str) -> None:
    s = mk(template, LogGroupPrefix=prefix)
    fixed, templates = config_groups(s)
    assert fixed == {f"{prefix}/{g}" for g in ("server", "errors", "metrics", "exporter")}
    assert templates == {f"{prefix}/model/*"}
    created = stack_groups(s)
    assert fixed <= set(created)
    # The router's own awslogs group, and nothing outside the prefix.
    assert set(created) == fixed | {f"{prefix}/log-router"}
    written = groups_fluent_bit_writes(s)
    assert written >= fixed  # the sample lines reach every fixed group ...
    models = written - fixed
    assert {f"{prefix}/model/add", f"{prefix}/model/m.x.v2.b", f"{prefix}/model/ns.ranker"} <= models
    assert all(g.startswith(f"{prefix}/model/") for g in models)  # ... and the rest are per-model groups
    for name in created.values():
        assert template["Resources"][name]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


# --- IAM ------------------------------------------------------------------------------------


def statements(s: Stack, role: str) -> list[dict[str, Any]]:
    out = []
    for policy in s.props(role).get("Policies", []):
        for st in policy["PolicyDocument"]["Statement"]:
            assert st["Effect"] == "Allow" and "NotAction" not in st and "NotResource" not in st
            out.append(st)
    return out


def _as_list(v: Any) -> list[str]:
    return v if isinstance(v, list) else [v]


def _glob(pattern: str, value: str) -> bool:
    rx = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(rx, value, re.I if ":" not in pattern else 0) is not None


def allowed(sts: list[dict[str, Any]], action: str, resource: str) -> bool:
    return any(
        any(re.fullmatch(re.escape(a).replace(r"\*", ".*"), action, re.I) for a in _as_list(st["Action"]))
        and any(_glob(r, resource) for r in _as_list(st["Resource"]))
        for st in sts
    )


def group_arn(name: str) -> str:
    return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}"


def stream_arn(group: str) -> str:
    return f"{group_arn(group)}:log-stream:triton-server-firelens-4f1b2c3d"


WRITE = ("logs:CreateLogStream", "logs:PutLogEvents")
CREATE = ("logs:CreateLogGroup", "logs:PutRetentionPolicy")


@pytest.mark.parametrize("prefix", ["/ecs/triton", "/prod/inf"])
def test_task_role_writes_exactly_the_fluent_bit_groups(template, prefix: str) -> None:
    s = mk(template, LogGroupPrefix=prefix)
    sts = statements(s, "TaskRole")
    written = groups_fluent_bit_writes(s)
    precreated = set(stack_groups(s))
    for group in written:
        for action in WRITE:
            assert allowed(sts, action, stream_arn(group)), (action, group)
        for action in CREATE:  # only groups the stack cannot create: the per-model ones
            for arn in (group_arn(group), group_arn(group) + ":*"):
                assert allowed(sts, action, arn) == (group not in precreated), (action, group)
    outside = [
        f"{prefix}/log-router",
        f"{prefix}-other/server",
        f"{prefix}2/model/add",
        "/ecs/other/server",
        "/aws/lambda/x",
        f"{prefix}/modelx",
    ]
    for group in outside:
        for action in (*WRITE, *CREATE):
            assert not allowed(sts, action, stream_arn(group)) and not allowed(sts, action, group_arn(group)), group
    # Only the logs actions Fluent Bit's cloudwatch_logs output calls; no metrics or ECS API.
    actions = {a for st in sts for a in _as_list(st["Action"])}
    assert actions == set(WRITE) | set(CREATE)
    assert not any(r == "*" for st in sts for r in _as_list(st["Resource"]))


def test_task_role_extras_follow_their_parameters(template, stack) -> None:
    base = {a for st in statements(stack, "TaskRole") for a in _as_list(st["Action"])}
    assert not any(a.startswith(("ssmmessages:", "s3:", "cloudwatch:", "ecs:")) for a in base)
    assert stack.props("Service")["EnableExecuteCommand"] is False

    s = mk(template, EnableExec="true", ModelBucketName="example-models")
    sts = statements(s, "TaskRole")
    assert s.props("Service")["EnableExecuteCommand"] is True
    for action in (
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
    ):
        assert allowed(sts, action, "*"), action
    assert allowed(sts, "s3:GetObject", "arn:aws:s3:::example-models/triton/add/1/model.py")
    assert allowed(sts, "s3:ListBucket", "arn:aws:s3:::example-models")
    assert not allowed(sts, "s3:GetObject", "arn:aws:s3:::other-bucket/x")
    assert not allowed(sts, "s3:PutObject", "arn:aws:s3:::example-models/x")


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        (f"{REGISTRY}/triton-server:24.10", "triton-server"),
        (f"{REGISTRY}/team/triton-server:24.10-py3", "team/triton-server"),
        (f"{REGISTRY}/team/ml/triton-server@sha256:{'a' * 64}", "team/ml/triton-server"),
        ("210987654321.dkr.ecr.eu-west-1.amazonaws.com/shared/router:1", "shared/router"),
    ],
)
def test_execution_role_pulls_only_the_three_repositories(template, image: str, repository: str) -> None:
    s = Stack(template, **(VALUES | {"TritonImage": image}))
    sts = statements(s, "ExecutionRole")
    account, region = image.split(".")[0], image.split(".")[3]
    arn = f"arn:aws:ecr:{region}:{account}:repository/{repository}"
    for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"):
        assert allowed(sts, action, arn), (action, arn)
        assert allowed(sts, action, f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/triton-emf-exporter")
        assert allowed(sts, action, f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/triton-log-router")
        assert not allowed(sts, action, f"arn:aws:ecr:{region}:{account}:repository/{repository}-other")
        assert not allowed(sts, action, f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/anything")
    assert allowed(sts, "ecr:GetAuthorizationToken", "*")
    router = f"{s.params['LogGroupPrefix']}/log-router"
    assert allowed(sts, "logs:PutLogEvents", stream_arn(router))
    assert allowed(sts, "logs:CreateLogStream", stream_arn(router))
    assert not allowed(sts, "logs:CreateLogGroup", group_arn(router))
    assert not allowed(sts, "logs:PutLogEvents", stream_arn(f"{s.params['LogGroupPrefix']}/metrics"))


def test_every_wildcard_resource_is_justified(template) -> None:
    s = mk(template, EnableExec="true", ModelSyncBucketName="example-models")
    seen = 0
    for name in s.resources("AWS::IAM::Role"):
        notes = template["Resources"][name].get("Metadata", {}).get("WildcardJustification", {})
        for st in statements(s, name):
            if "*" in _as_list(st["Resource"]):
                assert len(notes.get(st.get("Sid", ""), "")) > 40, f"{name} {st.get('Sid')}: justify Resource *"
                seen += 1
    # ecr:GetAuthorizationToken (both execution roles), the ECS Exec channels, and the controller's (with model sync,
    # its fan-out): ecs:ListTasks (the cluster's, by condition), sqs:ListQueues.
    assert seen == 5


def test_roles_trust_only_ecs_tasks_of_this_account(stack) -> None:
    for name in ("ExecutionRole", "TaskRole"):
        (st,) = stack.props(name)["AssumeRolePolicyDocument"]["Statement"]
        assert st["Principal"] == {"Service": "ecs-tasks.amazonaws.com"} and st["Action"] == "sts:AssumeRole"
        assert st["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
    td = stack.props("TaskDefinition")
    assert (td["ExecutionRoleArn"], td["TaskRoleArn"]) == ("<ExecutionRole.Arn>", "<TaskRole.Arn>")


# --- service and load balancer ---------------------------------------------------------------


def test_service_target_group_and_listener_rule(template, stack) -> None:
    tg = stack.props("TargetGroup")
    assert (tg["HealthCheckPath"], tg["Port"], tg["Protocol"], tg["TargetType"]) == (
        "/v2/health/ready",
        8000,
        "HTTP",
        "ip",
    )
    assert tg["HealthCheckPort"] in ("traffic-port", "8000") and tg["VpcId"] == VALUES["VpcId"]
    svc = stack.props("Service")
    (lb,) = svc["LoadBalancers"]
    assert lb["TargetGroupArn"] == "<TargetGroup>"
    triton = by_name(stack_taskdef(stack))[lb["ContainerName"]]
    assert lb["ContainerPort"] in [p["containerPort"] for p in triton["portMappings"]] and lb["ContainerPort"] == 8000
    assert (svc["Cluster"], svc["ServiceName"], svc["LaunchType"]) == ("gpu-cluster", "triton", "EC2")
    net = svc["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert net["Subnets"] == VALUES["SubnetIds"].split(",") and net["SecurityGroups"] == ["sg-0123456789abcdef0"]
    assert svc["HealthCheckGracePeriodSeconds"] == "600"
    # Grace covers the container health check's own start-up allowance.
    hc = triton["healthCheck"]
    assert int(svc["HealthCheckGracePeriodSeconds"]) >= hc["startPeriod"] + hc["interval"] * hc["retries"]
    rule = stack.props("ListenerRule")
    assert rule["ListenerArn"] == VALUES["ListenerArn"]
    assert rule["Actions"] == [{"Type": "forward", "TargetGroupArn": "<TargetGroup>"}]
    assert [c["Field"] for c in rule["Conditions"]] == ["path-pattern"]
    assert template["Resources"]["Service"]["DependsOn"] == "ListenerRule"  # ECS needs the TG on a listener
    s = mk(template, ListenerHostHeader="triton.example.com")
    assert s.props("ListenerRule")["Conditions"][1] == {
        "Field": "host-header",
        "HostHeaderConfig": {"Values": ["triton.example.com"]},
    }


# --- deploys keep the count (issue 37) --------------------------------------------------------


def desired_after_update(template: dict[str, Any], running: int, before: dict[str, str], after: dict[str, str]) -> int:
    """The service's desired count after a stack update from ``before`` to ``after`` parameter values, as
    CloudFormation documents AWS::ECS::Service: a resource whose evaluated properties did not change is not
    updated; an updated service with ``DesiredCount`` set is set to it; with ``DesiredCount`` unset the update
    keeps the count the service had (scaling's), and only a creation starts one task (the facts: aws-cdk PR
    #13130, containers-roadmap #493)."""
    one, two = mk(template, **before), mk(template, **after)
    old, new = one.props("Service"), two.props("Service")
    if old == new and one.props("TaskDefinition") == two.props("TaskDefinition"):
        return running  # a new task definition is a new Ref in the service's TaskDefinition: an update
    return int(new["DesiredCount"]) if "DesiredCount" in new else running


def test_an_update_keeps_the_scaled_count(template) -> None:
    """Scaling took the service to 7 tasks; a stack update that changes a scaling threshold, and a deploy that
    also changes the image (the service's task definition changes), leave 7 running."""
    assert "DesiredCount" not in template["Resources"]["Service"]["Properties"]
    assert "DesiredCount" not in template["Parameters"]
    threshold = {"PendingRequestsScaleOut": "20"}
    deploy = threshold | {"TritonImage": f"{REGISTRY}/triton-server:25.01"}
    assert desired_after_update(template, 7, {}, threshold) == 7
    assert desired_after_update(template, 7, {}, deploy) == 7
    # The check is live: the service as it was (DesiredCount from a parameter) drops to 1 on the deploy.
    old = copy.deepcopy(template)
    old["Resources"]["Service"]["Properties"]["DesiredCount"] = {"Ref": "MinCapacity"}
    assert desired_after_update(old, 7, {}, deploy) == 1


def test_min_capacity_is_at_least_one(template, alarms_template) -> None:
    """No task, no signal: MinCapacity 0 would strand the service; the stack refuses it."""
    for t in (template, alarms_template):
        assert t["Parameters"]["MinCapacity"]["MinValue"] == 1
    with pytest.raises(AssertionError):
        _check_number(template, "MinCapacity", "0")


def _check_number(template: dict[str, Any], name: str, value: str) -> None:
    p = template["Parameters"][name]
    assert float(value) >= float(p.get("MinValue", "-inf")) and float(value) <= float(p.get("MaxValue", "inf"))


# --- the nested alarms stack -----------------------------------------------------------------


def test_nested_alarms_stack_gets_every_parameter(template, alarms_template, stack) -> None:
    nested = template["Resources"]["Alarms"]
    assert nested["Type"] == "AWS::CloudFormation::Stack"
    assert (STACK.parent / nested["Properties"]["TemplateURL"]).resolve() == ALARMS.resolve()
    passed = nested["Properties"]["Parameters"]
    assert set(passed) == set(alarms_template["Parameters"]), "pass every parameter, none left at its default"
    wired = {
        "ClusterName": {"Ref": "ClusterName"},
        "ServiceName": {"Fn::GetAtt": ["Service", "Name"]},
        "Namespace": NAMESPACE,  # the stack's default differs on purpose: test_namespace_is_one_per_stack
        # ...and so do these two's: test_alarm_and_dashboard_names_are_one_per_stack
        "AlarmNamePrefix": STACK_NAMED["AlarmNamePrefix"],
        "DashboardName": STACK_NAMED["DashboardName"],
        "ModelSync": {"Fn::If": ["ModelSyncEnabled", "true", "false"]},
    }
    for name, value in passed.items():
        if name in wired:
            assert value == wired[name], name
            continue
        # Passed through from a parent parameter of the same name and definition.
        assert value == {"Ref": name}, name
        ours, theirs = template["Parameters"][name], alarms_template["Parameters"][name]
        if name in ("Namespace", "ModelSync"):
            continue
        for key in ("Type", "Default", "AllowedValues", "MinValue", "MaxValue"):
            assert ours.get(key) == theirs.get(key), (name, key)
    # The service name the scalable target uses is the one the stack creates.
    assert stack.props("Service")["ServiceName"] == stack.params["ServiceName"]
    assert alarms_template["Resources"]["ScalableTarget"]["Properties"]["ResourceId"] == {
        "Fn::Sub": "service/${ClusterName}/${ServiceName}"
    }


NAMESPACE = {"Fn::If": ["HasNamespace", {"Ref": "Namespace"}, {"Fn::Sub": "Triton/${AWS::StackName}"}]}


def test_namespace_is_one_per_stack(template) -> None:
    """Two stacks in one account with the defaults write, alarm on and scale on two namespaces: with one
    shared namespace, each service's GpuUtilization alarms would read the other's tasks too."""
    one, two = mk(template), mk(template)
    two.pseudo = PSEUDO | {"AWS::StackName": "triton-b"}
    spaces = []
    for s in (one, two):
        env = {e["name"]: e["value"] for e in by_name(stack_taskdef(s))["exporter"]["environment"]}
        assert (
            s.ev(template["Resources"]["Alarms"]["Properties"]["Parameters"]["Namespace"]) == env["AWS_EMF_NAMESPACE"]
        )
        assert s.ev(template["Outputs"]["Namespace"]["Value"]) == env["AWS_EMF_NAMESPACE"]
        spaces.append(env["AWS_EMF_NAMESPACE"])
    assert spaces == ["Triton/triton", "Triton/triton-b"]
    chosen = mk(template, Namespace="Prod/Triton")
    env = {e["name"]: e["value"] for e in by_name(stack_taskdef(chosen))["exporter"]["environment"]}
    assert env["AWS_EMF_NAMESPACE"] == "Prod/Triton"
    assert template["Parameters"]["Namespace"]["Default"] == ""


# Parameters whose empty default is the stack's own name: what the stack passes to the nested alarms stack.
STACK_NAMED = {
    name: {"Fn::If": [f"Has{name}", {"Ref": name}, {"Ref": "AWS::StackName"}]}
    for name in ("AlarmNamePrefix", "DashboardName")
}


def nested_of(s: Stack) -> Stack:
    """The nested alarms stack as the stack creates it: with the parameters it passes."""
    passed = s.props("Alarms")["Parameters"]
    passed["ServiceName"] = s.props("Service")["ServiceName"]  # what GetAtt Service.Name returns
    return Stack(json.loads(ALARMS.read_text()), **passed)


NAMED = {  # what a stack names with the alarm prefix: resource type -> its name property
    "AWS::CloudWatch::Alarm": "AlarmName",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "PolicyName",
    "AWS::CloudWatch::InsightRule": "RuleName",
}


def names_created(s: Stack) -> tuple[dict[str, set[str]], set[str]]:
    """The names the stack gives its alarms, scaling policies and Contributor Insights rules (the main stack's
    own and the nested alarms stack's), by type, and its dashboards' names, with its parameters and name."""
    nested = nested_of(s)
    names = {
        kind: {one.props(n)[prop] for one in (s, nested) for n in one.resources(kind)} for kind, prop in NAMED.items()
    }
    dashboards = {nested.props(n)["DashboardName"] for n in nested.resources("AWS::CloudWatch::Dashboard")}
    return names, dashboards


def _unprefixed(names: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    assert all(n.startswith(prefix) for kind in names.values() for n in kind), (prefix, names)
    return {kind: {n.removeprefix(prefix) for n in kind_names} for kind, kind_names in names.items()}


def test_alarm_and_dashboard_names_are_one_per_stack(template) -> None:
    """Two stacks in one account with the defaults create disjoint alarms, scaling policies, Contributor Insights
    rules and dashboards, named after each stack: with one shared prefix the second stack's create fails on the
    first's alarm names, and with one dashboard name each would overwrite the other's. An explicit
    AlarmNamePrefix or DashboardName still wins, each over its own names only."""
    for name in STACK_NAMED:
        assert template["Parameters"][name]["Default"] == ""
        assert template["Conditions"][f"Has{name}"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": name}, ""]}]}
    # Everything on: the controller's alarms (drains, fan-out, rollouts), model sync's rules, scaling, PromQL.
    every = {"GpuFaultAction": "drain", "ModelSyncBucketName": "example-models", "CanaryFraction": "0.25"}
    every |= {"OtlpMetrics": "true"}
    one, two = mk(template, **every), mk(template, **every)
    two.pseudo = PSEUDO | {"AWS::StackName": "triton-b"}
    (names_a, dash_a), (names_b, dash_b) = names_created(one), names_created(two)
    for kind in NAMED:  # every one of both templates' resources of the type is created, so every name is compared
        made = sum(
            r["Type"] == kind for t in (template, json.loads(ALARMS.read_text())) for r in t["Resources"].values()
        )
        assert made and len(names_a[kind]) == len(names_b[kind]) == made, kind
        assert names_a[kind].isdisjoint(names_b[kind]), kind
    assert _unprefixed(names_a, "triton-") == _unprefixed(names_b, "triton-b-")
    assert (dash_a, dash_b) == ({"triton"}, {"triton-b"})
    # The dashboard's alarm widgets show this stack's alarms, not the other's.
    body = nested_of(two).props("Dashboard")["DashboardBody"]
    assert ":alarm:triton-b-" in body and ":alarm:triton-" not in body.replace(":alarm:triton-b-", "")
    # Explicit values win, whatever the stack's name.
    suffixes = _unprefixed(names_a, "triton-")
    for s in (one, two):
        chosen = Stack(template, **(s.params | {"AlarmNamePrefix": "prod-triton", "DashboardName": "Prod"}))
        chosen.pseudo = s.pseudo
        names, dashboards = names_created(chosen)
        assert _unprefixed(names, "prod-triton-") == suffixes and dashboards == {"Prod"}
    # Each on its own: the prefix does not rename the dashboard, nor the dashboard's name the alarms.
    names, dashboards = names_created(mk(template, **every, DashboardName="Prod"))
    assert names == names_a and dashboards == {"Prod"}
    names, dashboards = names_created(mk(template, **every, AlarmNamePrefix="prod-triton"))
    assert _unprefixed(names, "prod-triton-") == suffixes and dashboards == {"triton"}


def test_dashboard_output_follows_the_nested_condition(template, alarms_template) -> None:
    out = template["Outputs"]["DashboardName"]
    assert out["Value"] == {"Fn::GetAtt": ["Alarms", "Outputs.DashboardName"]}
    assert alarms_template["Outputs"]["DashboardName"]["Condition"] == "DashboardEnabled"
    assert template["Conditions"]["DashboardEnabled"] == alarms_template["Conditions"]["DashboardEnabled"]
    assert out["Condition"] == "DashboardEnabled"


# --- docs ----------------------------------------------------------------------------------


def test_docs_deploy_command_sets_every_required_parameter(template) -> None:
    docs = DOCS.read_text()
    assert "aws cloudformation package --template-file deploy/stack.yaml" in docs
    block = re.search(r"aws cloudformation deploy .*?--parameter-overrides(.*?)(?:\n\n|```)", docs, re.S)
    assert block, "docs/deploy.md has no `aws cloudformation deploy ... --parameter-overrides`"
    given = set(re.findall(r"\b([A-Z][A-Za-z]+)=", block.group(1)))
    required = {n for n, p in template["Parameters"].items() if "Default" not in p}
    assert required <= given, required - given
    assert given <= set(template["Parameters"]), given - set(template["Parameters"])
    assert "CAPABILITY_IAM" in block.group(0)


def test_sample_values_are_what_the_stack_would_accept(template) -> None:
    """The evaluator's parameter checks are live: a wrong value is refused like CloudFormation would."""
    for bad in (
        {"TritonImage": "nvcr.io/nvidia/tritonserver:24.10-py3"},
        {"LogGroupPrefix": "/ecs/triton/"},
        {"LogRetentionDays": "42"},
        {"EnableExec": "yes"},
    ):
        with pytest.raises(AssertionError):
            Stack(template, **(copy.deepcopy(VALUES) | bad))


def test_triton_args_follow_the_stacks_flags_and_cannot_reopen_the_admin_api(template) -> None:
    """The user's flags come after the restriction and before the trace flags; the parameter's pattern, not the
    order, keeps the restriction the stack's (the flags that would change it are refused); the memory is theirs."""
    stack = mk(template, TritonArgs="--model-load-thread-count=8", TritonMemory="16384", Tracing="true")
    triton = by_name(stack_taskdef(stack))["triton-server"]
    line = triton["command"][2]
    assert (
        line.index("--grpc-restricted-protocol")
        < line.index(" --model-load-thread-count=8 ")
        < line.index("--trace-config")
    )
    assert triton["memoryReservation"] == 16384
    assert " --model-load-thread-count" not in by_name(stack_taskdef(mk(template)))["triton-server"]["command"][2]
    pattern = template["Parameters"]["TritonArgs"]["AllowedPattern"]
    for refused in ("--allow-sagemaker=true", "--allow-vertex-ai=true", "--http-restricted-api=trace:k=v",
                    "--grpc-restricted-protocol=x:k=v", "--model-control-mode=poll", "--load-model=*",
                    "--model-repository=/tmp", "--log-verbose=1; id", "--x=$(id)", '--x="y"', "--x=`id`"):  # fmt: skip
        assert not re.fullmatch(pattern, refused), refused
    assert re.fullmatch(pattern, "--backend-config=python,shm-default-byte-size=16777216 --log-verbose=1")
