"""deploy/terraform: the Terraform module deploys what deploy/stack.yaml deploys, and cannot drift.

No Terraform binary or provider can be fetched here, so ``terraform validate`` / ``plan``
never run. Instead, with the real parsers (python-hcl2's HCL grammar, json):

- every ``.tf`` file parses, every variable has a type and a description, and the
  resources, variables and outputs the issue lists exist;
- tests/support/tfeval.py evaluates the module the way ``terraform plan`` would configure it, and
  tests/deploy/test_stack.py's evaluator does the same for the CloudFormation stack (and its nested
  alarms template), from the SAME parameter values; the two must describe the same
  deployment: containers, network mode, volumes, service, target group, listener rule, log
  groups, the roles' policies statement by statement, every alarm, the scalable target and
  step policies, the dashboard body, and with model sync the task's two more containers and
  volumes, the topic, its policy, the EventBridge rule and the task role's model-sync policy.
  The comparisons iterate over whatever the stack has, every stack resource and property
  needs a Terraform counterpart (and the other way round), and a resource one side creates
  under a condition the other does not is a difference;
- with CreateCluster / create_cluster, the cluster, its capacity provider and their association, the Auto
  Scaling group, the launch template (its user data decoded: deploy/user-data.sh, filled in alike), the
  instance role with its managed policies and the instance profile, and the service's capacity provider
  strategy in place of its launch type;
- every stack parameter is a variable with the same default and the same constraints
  (values at and beyond each bound are accepted or refused alike);
- the examples/ root module with its terraform.tfvars.example evaluates to a full plan;
- checkov's Terraform checks pass (slow).
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import hcl2
import pytest
from hcl2.utils import SerializationOptions
from lark.exceptions import UnexpectedInput

from exporter.config import load as load_settings
from render import render
from render import terraform as tfrender
from render.alarms import SCALING_ACTIONS, alarm_specs
from render.alarms.promql import PROMQL
from render.base.options import Options
from render.template import POLICY_IDS
from tests.deploy.test_stack import (
    ACCOUNT,
    PSEUDO,
    REGION,
    REGISTRY,
    VALUES,
    Stack,
    api_shape,
    integer_fields,
    load_cfn_yaml,
    names_created,
)
from tests.deploy.test_stack_modelsync import MODELSYNC_RESOURCES
from tests.support.helpers import CATALOG
from tests.support.paths import REPO
from tests.support.tfeval import Module, TfError, Unknown, ValidationFailed, _source_text, parse_directory

ROOT = REPO
TF = ROOT / "deploy" / "terraform"
EXAMPLES = TF / "examples"
STACK = ROOT / "deploy" / "stack.yaml"
ALARMS = ROOT / "alarms" / "triton-alarms.template.json"
DATA: dict[str, Any] = {
    "aws_caller_identity": {"account_id": ACCOUNT},
    "aws_region": {"region": REGION},
    "aws_partition": {"partition": "aws", "dns_suffix": "amazonaws.com"},
    # The value of the parameter as the stack's evaluator writes an SSM-typed parameter's (tests/deploy/test_stack.py).
    "aws_ssm_parameter": lambda args: {"insecure_value": f"<ssm:{args['name']}>", "type": "String"},
    # The generated password, as its arguments: the secret's version is compared with the stack's generation.
    "aws_secretsmanager_random_password": lambda args: {
        "random_password": f"<random:{json.dumps(args, sort_keys=True)}>"
    },
}
# Variables with no stack parameter, documented in docs/deploy.md. desired_count: the count at creation (the
# stack sets none: CloudFormation then starts one task and keeps the count on update; issue 37).
TF_ONLY = {"task_family", "tags", "desired_count"}

# Scenarios: the same CloudFormation parameter values go into both.
SCENARIOS = {
    "defaults": {},
    "renamed": {
        "Namespace": "Prod/Triton",
        "LogGroupPrefix": "/prod/inf",
        "LogRetentionDays": "90",
        "ServiceName": "inference",
        "ExpectGpu": 'A10G|L4\\d"',
        "ModelRepository": "s3://other/repo",
    },
    "extras": {
        "EnableExec": "true",
        "ModelBucketName": "example-models",
        "ModelRepositoryHostPath": "/mnt/efs/models",
        "ModelRepository": "/models",
        "ListenerHostHeader": "triton.example.com",
        "ListenerRulePriority": "7",
        "HealthCheckGracePeriodSeconds": "900",
        "TritonImage": f"{REGISTRY}/team/ml/triton-server@sha256:{'a' * 64}",
        "ExporterImage": "210987654321.dkr.ecr.eu-west-1.amazonaws.com/shared/exporter:1",
        "TritonCpu": "7168",
        "TritonMemory": "16384",
        "TritonArgs": "--model-load-thread-count=8 --backend-config=python,shm-default-byte-size=16777216",
        "ModelBucketKmsKeyArn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    },
    "alarms": {
        "EnableScaling": "false",
        "CreateDashboard": "false",
        "AlarmTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:ops",
        "FailureThreshold": "7",
        "LatencySloMicroseconds": "250000",
        "GpuMemoryThreshold": "90",
        "AlarmNamePrefix": "prod-triton",
        "DashboardName": "Prod",
        "MinCapacity": "2",
        "MaxCapacity": "8",
    },
    # Both names given, with the dashboard on: they win over the deployment's own on both sides.
    "named": {"AlarmNamePrefix": "prod-triton", "DashboardName": "Prod", "ModelSyncBucketName": "example-models"},
    "topic-and-scaling": {
        "AlarmTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:ops",
        "PendingRequestsScaleOut": "20",
        "QueueTimeScaleOutMicroseconds": "50000",
        "GpuScaleInUtilization": "20",
        "ScaleInCooldown": "900",
        "LoadSuccessRateThreshold": "99.5",
    },
    # Model sync with its defaults, over a host path that it then replaces on Triton.
    "modelsync": {
        "ModelSyncBucketName": "example-models",
        "ModelRepositoryHostPath": "/mnt/efs/models",
        "ModelRepository": "/models",
    },
    # Model sync with every one of its parameters and the ones it reads (prefix, namespace, exec) changed.
    "modelsync-renamed": {
        "ModelSyncBucketName": "prod.models-1",
        "ModelSyncPrefix": "triton/v2/",
        "ModelSyncHostPath": "/local/nvme/triton",
        "TritonCpu": "4096",
        "TritonMemory": "12288",
        "ModelBucketKmsKeyArn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "EnableExec": "true",
        "Namespace": "Prod/Triton",
        "LogGroupPrefix": "/prod/inf",
        "ServiceName": "inference",
        "LogRetentionDays": "90",
    },
    # Model sync with safe rollouts: their six parameters, the controller deciding (CONTROLLER_ROLLOUTS=on, its
    # rollout grants), the daemons following (MODELSYNC_ROLLOUTS=controller) and the task role's send to its queue.
    "modelsync-rollouts": {
        "ModelSyncBucketName": "example-models",
        "ModelSyncPrefix": "triton/",
        "CanaryFraction": "0.25",
        "BakeSeconds": "300",
        "BakeMinRequests": "500",
        "MaxFailureIncrease": "0.005",
        "MaxLatencyRatio": "2",
        "MaxFailureRatio": "0.1",
        "RolloutOperatorRoleArn": f"arn:aws:iam::{ACCOUNT}:role/ml-release",  # admitted to the controller's queue
    },
    # Tracing with its defaults, and with its rate, the service name, the log prefix and model sync changed.
    "tracing": {"Tracing": "true"},
    "tracing-renamed": {
        "Tracing": "true",
        "TritonArgs": "--log-verbose=1",  # before the trace flags, on both sides
        "TraceRate": "7",
        "ServiceName": "inference",
        "LogGroupPrefix": "/prod/inf",
        "ModelSyncBucketName": "example-models",
    },
    # OTLP metrics and the PromQL alarms with their defaults, and with the names and thresholds they read changed.
    "otlp": {"OtlpMetrics": "true"},
    "otlp-renamed": {
        "OtlpMetrics": "true",
        "AlarmNamePrefix": "prod-triton",
        "FailureThreshold": "9",
        "LatencySloMicroseconds": "250000",
        "GpuMemoryThreshold": "80",
        "AlarmTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:ops",
        "ModelSyncBucketName": "example-models",
    },
    # The GenAI server metrics on the OTLP output; and the switch alone, without an OTLP output: nothing set.
    "otlp-genai": {"OtlpMetrics": "true", "OtlpSemconv": "genai"},
    "genai-without-otlp": {"OtlpSemconv": "genai"},
    # GPU faults drain the instance: on an existing cluster without and with its group, and with the stack's own.
    "gpu-drain": {"GpuFaultAction": "drain"},
    # The controller's alarms read the alarm prefix and topic, its container the namespace, its group the prefix.
    "gpu-drain-group": {
        "GpuFaultAction": "drain",
        "GpuFaultAutoScalingGroupName": "gpu-fleet",
        "ClusterName": "inference-gpus",
        "AlarmNamePrefix": "prod-triton",
        "AlarmTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:ops",
        "Namespace": "Prod/Triton",
        "LogGroupPrefix": "/prod/inf",
    },
    "cluster-gpu-drain": {
        "GpuFaultAction": "drain",
        "CreateCluster": "true",
        "ClusterName": "inference-gpus",
        "AlarmNamePrefix": "prod-triton",
    },
    # The controller with both jobs: GPU drains (no group known) and model sync's fan-out, on a customer managed
    # key (the fleet size's write asks KMS for a data key), with the names its grants and variables read changed.
    "modelsync-drain": {
        "GpuFaultAction": "drain",
        "ModelSyncBucketName": "prod.models-1",
        "ModelSyncPrefix": "triton/v2/",
        "ModelBucketKmsKeyArn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "ServiceName": "inference",
        "ClusterName": "inference-gpus",
        "AlarmNamePrefix": "prod-triton",
    },
    # Task scale-in protection: the exporter's variable and the task role's statement, on a renamed cluster
    # (the statement's resource reads it).
    "task-protection": {"TaskProtection": "true", "ClusterName": "inference-gpus"},
    # A cluster from zero with its defaults.
    "cluster": {"CreateCluster": "true"},
    # A cluster from zero with every one of its parameters and the ones it reads (the store's path, the
    # cluster's name, the subnets and groups, model sync) changed.
    "cluster-renamed": {
        "CreateCluster": "true",
        "ClusterName": "inference-gpus",
        "InstanceType": "p4d.24xlarge",
        "ClusterMinSize": "0",
        "ClusterMaxSize": "3",
        "RootVolumeSize": "250",
        "GpuAmiParameter": "/team/amis/triton-gpu",
        "ModelSyncBucketName": "example-models",
        "ModelSyncHostPath": "/local/nvme/triton",
        "SubnetIds": "subnet-0aaaaaaaaaaaaaaaa",
        "SecurityGroupIds": "sg-0bbbbbbbbbbbbbbbb,sg-0ccccccccccccccccc",
        "ServiceName": "inference",
    },
}


# --- building both sides ------------------------------------------------------------------


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return json.loads(json.dumps(load_cfn_yaml(str(STACK))))


@pytest.fixture(scope="module")
def alarms_template() -> dict[str, Any]:
    return json.loads(ALARMS.read_text())


def variables(directory: Path = TF) -> dict[str, Any]:
    return {b.labels[0]: b for b in parse_directory(directory) if b.type == "variable"}


def _type(block: Any) -> str:
    expr = block.body.attrs.get("type")
    value = getattr(expr, "value", None)  # JSON syntax: the type is a literal string
    return value if isinstance(value, str) else _source_text(expr).replace(" ", "")


def hcl(path: Path | str) -> dict[str, Any]:
    """python-hcl2's own reading of a file (or a text): strings unquoted, expressions as ``${...}`` text."""
    options = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)
    text = path.read_text() if isinstance(path, Path) else path
    return hcl2.loads(text, serialization_options=options)


def declared_variables(directory: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.tf")):
        for entry in hcl(path).get("variable", []):
            out |= entry
    for path in sorted(directory.glob("*.tf.json")):
        out |= json.loads(path.read_text()).get("variable", {})
    return out


def tf_value(type_: str, value: str) -> Any:
    """A CloudFormation parameter value (a string) as the Terraform variable's type takes it."""
    if type_.startswith("list("):
        return value.split(",")
    if type_ == "number":
        return float(value) if re.fullmatch(r"-?\d+(\.\d+)?", value) else value
    if type_ == "bool":
        return {"true": True, "false": False}.get(value, value)
    return value


def tf_inputs(params: dict[str, str]) -> dict[str, Any]:
    decl = variables()
    out = {}
    for name, value in params.items():
        var = tfrender.variable_name(name)
        assert var in decl, f"stack parameter {name} has no Terraform variable {var}"
        out[var] = tf_value(_type(decl[var]), value)
    return out


def module_for(params: dict[str, str], directory: Path = TF) -> Module:
    return Module(directory, tf_inputs(params), DATA)


def stacks_for(
    template: dict[str, Any], alarms_template: dict[str, Any], params: dict[str, str]
) -> tuple[Stack, Stack]:
    stack = Stack(template, **params)
    passed = stack.props("Alarms")["Parameters"]
    passed["ServiceName"] = stack.props("Service")["ServiceName"]  # what GetAtt Service.Name returns
    return stack, Stack(alarms_template, **passed)


# --- normalising: one shape for both sides --------------------------------------------------

_NUMBER = re.compile(r"-?\d+(\.\d+)?")
# Unknown-until-apply values: CloudFormation Ref/GetAtt placeholders -> the Terraform attribute.
_PLACEHOLDERS = {
    "<ExecutionRole.Arn>": "<aws_iam_role.execution.arn>",
    "<TaskRole.Arn>": "<aws_iam_role.task.arn>",
    "<TargetGroup>": "<aws_lb_target_group.this.arn>",
    "<TaskDefinition>": "<aws_ecs_task_definition.this.arn>",
    "<ModelSyncTopic>": "<aws_sns_topic.modelsync[0].arn>",  # Ref of a topic is its ARN
    "<TritonAdminKey>": "<aws_secretsmanager_secret.admin_key.arn>",  # Ref of a secret is its ARN
    "<ModelSyncTopic>:*": "<aws_sns_topic.modelsync[0].arn>:*",
    "<ModelSyncEventRule.Arn>": "<aws_cloudwatch_event_rule.modelsync[0].arn>",
    # A cluster from zero: the group's Ref is its name, which the capacity provider takes as well as its ARN.
    "<AutoScalingGroup>": "<aws_autoscaling_group.gpu[0].arn>",
    # ...and its name in the ARN the GPU fault drain may mark instances of Unhealthy (gpufaults.tf).
    f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/<AutoScalingGroup>": (
        f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/"
        "<aws_autoscaling_group.gpu[0].name>"
    ),
    "<LaunchTemplate>": "<aws_launch_template.gpu[0].id>",
    # The fleet's controller (controller.tf): the Ref of a queue is its URL, of a bucket its name (its id).
    "<ControllerQueue>": "<aws_sqs_queue.controller[0].url>",
    "<ControllerQueue.Arn>": "<aws_sqs_queue.controller[0].arn>",
    "<ControllerDeadLetterQueue>": "<aws_sqs_queue.controller_dead_letter[0].url>",
    "<ControllerDeadLetterQueue.Arn>": "<aws_sqs_queue.controller_dead_letter[0].arn>",
    "<ControllerStateBucket>": "<aws_s3_bucket.controller_state[0].id>",
    "<ControllerStateBucket.Arn>": "<aws_s3_bucket.controller_state[0].arn>",
    "<ControllerTaskRole.Arn>": "<aws_iam_role.controller_task[0].arn>",
    "<ControllerExecutionRole.Arn>": "<aws_iam_role.controller_execution[0].arn>",
    "<ControllerTaskDefinition>": "<aws_ecs_task_definition.controller[0].arn>",
    "<LaunchTemplate.LatestVersionNumber>": "<aws_launch_template.gpu[0].latest_version>",
    "<InstanceRole>": "<aws_iam_role.instance[0].name>",
    "<InstanceProfile.Arn>": "<aws_iam_instance_profile.instance[0].arn>",
    **{f"<{logical}>": f"<aws_appautoscaling_policy.{key}[0].arn>" for key, logical in POLICY_IDS.items()},
}


_TOKEN = re.compile(r"<[A-Za-z0-9]+(?:\.[A-Za-z0-9.]+)?>")


def _placeholder(x: str) -> str:
    """A whole-string placeholder, else each one inside the string (an ARN built on a bucket's: ``<B.Arn>/key``)."""
    if x in _PLACEHOLDERS:
        return _PLACEHOLDERS[x]
    return _TOKEN.sub(lambda m: _PLACEHOLDERS.get(m.group(0), m.group(0)), x) if "<" in x else x


def placeholders(x: Any) -> Any:
    """Only the CloudFormation placeholders replaced: for values compared exactly (container definitions)."""
    if isinstance(x, str):
        return _placeholder(x)
    if isinstance(x, list):
        return [placeholders(i) for i in x]
    if isinstance(x, dict):
        return {k: placeholders(v) for k, v in x.items()}
    return x


def norm(x: Any) -> Any:
    """Numbers and numeric strings as floats (a Ref of a Number is a string), empty or null values
    dropped (CloudFormation's AWS::NoValue and an empty Terraform list mean the same to the API),
    CloudFormation placeholders as their Terraform attribute."""
    if isinstance(x, bool):
        return x
    if isinstance(x, Unknown):
        return str(x)
    if isinstance(x, int | float):
        return float(x)
    if isinstance(x, str):
        if _NUMBER.fullmatch(x):
            return float(x)
        return _placeholder(x)
    if isinstance(x, list):
        return [norm(i) for i in x]
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items() if v not in (None, [], {})}
    return x


class Mapper:
    """Takes Terraform arguments out of one resource's configuration; leftovers are differences."""

    def __init__(self, where: str, args: dict[str, Any], ignore: tuple[str, ...] = ("tags",)) -> None:
        self.where, self.args = where, {k: v for k, v in args.items() if k not in ignore}

    def take(self, name: str, default: Any = None) -> Any:
        return self.args.pop(name, default)

    def block(self, name: str) -> Mapper:
        blocks = self.args.pop(name, [])
        if len(blocks) != 1:
            raise AssertionError(f"{self.where}: expected one {name} block, got {len(blocks)}")
        return Mapper(f"{self.where}.{name}", blocks[0], ignore=())

    def optional_block(self, name: str) -> Mapper | None:
        return self.block(name) if name in self.args else None

    def done(self) -> list[str]:
        return [f"{self.where}: Terraform sets {k} = {v!r}, which the stack does not" for k, v in self.args.items()]


def compare(where: str, stack_side: Any, tf_side: Any) -> list[str]:
    a, b = norm(stack_side), norm(tf_side)
    if a == b:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                out.append(f"{where}.{k}: stack {a.get(k)!r} != terraform {b.get(k)!r}")
        return out
    return [f"{where}: stack {a!r} != terraform {b!r}"]


# --- resource by resource ------------------------------------------------------------------


def one_of(plan: dict[str, Any], address: str) -> dict[str, Any]:
    assert address in plan, f"terraform plan has no {address}"
    return plan[address]


def of_type(plan: dict[str, Any], rtype: str) -> dict[str, dict[str, Any]]:
    return {a: r for a, r in plan.items() if a.split(".")[0] == rtype}


def matched(stack: Stack, plan: dict[str, Any], cfn_type: str) -> list[tuple[str, str]]:
    """(logical id, Terraform address) of the stack's resources of a type that both sides create
    (``differences`` reports the ones only one side creates)."""
    return [(n, COUNTERPARTS[n]) for n in stack.resources(cfn_type) if n in COUNTERPARTS and COUNTERPARTS[n] in plan]


def _family(family: Any, base: Any) -> Any:
    """The family relative to the deployment's name (the stack's own name there, <cluster>-<service> here)."""
    return "<family>" + family[len(base) :] if isinstance(family, str) and family.startswith(base) else family


def task_definition(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    cfn_base = stack.props("TaskDefinition")["Family"]
    tf_base = one_of(plan, "aws_ecs_task_definition.this")["family"]
    for logical, address in matched(stack, plan, "AWS::ECS::TaskDefinition"):
        cfn = placeholders(integer_fields(api_shape(stack.props(logical))))
        td = Mapper(address, plan[address])
        tf = {
            "family": td.take("family"),
            "networkMode": td.take("network_mode"),
            "requiresCompatibilities": td.take("requires_compatibilities"),
            "executionRoleArn": td.take("execution_role_arn"),
            "taskRoleArn": td.take("task_role_arn"),
            # Fargate's task-level size (the controller's); the Triton task has none.
            "cpu": td.take("cpu"),
            "memory": td.take("memory"),
        }
        containers = json.loads(td.take("container_definitions"))
        volumes = [
            {
                "name": v.pop("name"),
                **({"host": {"sourcePath": h}} if (h := v.pop("host_path")) is not None else {}),
                **v,
            }
            for v in map(dict, td.take("volume", []))
        ]  # copies: the plan stays as it was; no host path: a task volume
        if volumes:
            tf["volumes"] = volumes
        diffs += td.done()
        cfn["family"], tf["family"] = _family(cfn.get("family"), cfn_base), _family(tf["family"], tf_base)
        cfn_containers = {c["name"]: c for c in cfn.pop("containerDefinitions")}
        tf_containers = {c["name"]: c for c in containers}
        if set(cfn_containers) != set(tf_containers):
            diffs.append(
                f"containers of {logical}: stack {sorted(cfn_containers)} != terraform {sorted(tf_containers)}"
            )
        for name in sorted(set(cfn_containers) & set(tf_containers)):
            if cfn_containers[name] != tf_containers[name]:  # exact: ECS takes these strings as they are
                for key in sorted(set(cfn_containers[name]) | set(tf_containers[name])):
                    a, b = cfn_containers[name].get(key), tf_containers[name].get(key)
                    if a != b:
                        diffs.append(f"container {name}.{key}: stack {a!r} != terraform {b!r}")
        diffs += compare(f"task definition {logical}", cfn, tf)
    return diffs


def service(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    for logical, address in matched(stack, plan, "AWS::ECS::Service"):
        m = Mapper(address, plan[address])
        net, lb = m.optional_block("network_configuration"), m.optional_block("load_balancer")
        breaker = m.optional_block("deployment_circuit_breaker")
        desired = m.take("desired_count")
        tf: dict[str, Any] = {
            "ServiceName": m.take("name"),
            "Cluster": m.take("cluster"),
            "TaskDefinition": m.take("task_definition"),
            "LaunchType": m.take("launch_type"),
            "SchedulingStrategy": m.take("scheduling_strategy"),
            # The Triton service's is the count at creation only (lifecycle ignore_changes): the stack sets none and
            # keeps the count. The controller's is 1 on both sides, compared.
            "DesiredCount": desired if "DesiredCount" in stack.props(logical) else None,
            "EnableExecuteCommand": m.take("enable_execute_command"),
            "HealthCheckGracePeriodSeconds": m.take("health_check_grace_period_seconds"),
            "PropagateTags": m.take("propagate_tags"),
            "DeploymentConfiguration": {
                "MinimumHealthyPercent": m.take("deployment_minimum_healthy_percent"),
                "MaximumPercent": m.take("deployment_maximum_percent"),
            },
            "CapacityProviderStrategy": _strategy(m.take("capacity_provider_strategy", [])),
        }
        if net:
            tf["NetworkConfiguration"] = {
                "AwsvpcConfiguration": {
                    "Subnets": net.take("subnets"),
                    "SecurityGroups": net.take("security_groups"),
                    # ECS's default when the stack leaves it out.
                    "AssignPublicIp": {False: None, True: "ENABLED"}[net.take("assign_public_ip", False)],
                }
            }
        if lb:
            tf["LoadBalancers"] = [
                {
                    "ContainerName": lb.take("container_name"),
                    "ContainerPort": lb.take("container_port"),
                    "TargetGroupArn": lb.take("target_group_arn"),
                }
            ]
        if breaker:
            tf["DeploymentConfiguration"]["DeploymentCircuitBreaker"] = {
                "Enable": breaker.take("enable"),
                "Rollback": breaker.take("rollback"),
            }
        diffs += m.done() + [d for b in (net, lb, breaker) if b for d in b.done()]
        diffs += compare(f"service {logical}", stack.props(logical), tf)
    return diffs


def target_group(stack: Stack, plan: dict[str, Any]) -> list[str]:
    m = Mapper("aws_lb_target_group", one_of(plan, "aws_lb_target_group.this"))
    hc = m.block("health_check")
    tf = {
        "VpcId": m.take("vpc_id"),
        "TargetType": m.take("target_type"),
        "Protocol": m.take("protocol"),
        "ProtocolVersion": m.take("protocol_version"),
        "Port": m.take("port"),
        "TargetGroupAttributes": [
            {"Key": "deregistration_delay.timeout_seconds", "Value": str(m.take("deregistration_delay"))}
        ],
        "HealthCheckEnabled": hc.take("enabled"),
        "HealthCheckProtocol": hc.take("protocol"),
        "HealthCheckPort": hc.take("port"),
        "HealthCheckPath": hc.take("path"),
        "HealthCheckIntervalSeconds": hc.take("interval"),
        "HealthCheckTimeoutSeconds": hc.take("timeout"),
        "HealthyThresholdCount": hc.take("healthy_threshold"),
        "UnhealthyThresholdCount": hc.take("unhealthy_threshold"),
        "Matcher": {"HttpCode": hc.take("matcher")},
    }
    return m.done() + hc.done() + compare("target group", stack.props("TargetGroup"), tf)


def _rule_action(action: dict[str, Any]) -> dict[str, Any]:
    if action["type"] == "forward":
        return {"Type": "forward", "TargetGroupArn": action["target_group_arn"]}
    ((fixed,),) = [action["fixed_response"]]
    names = {"status_code": "StatusCode", "content_type": "ContentType", "message_body": "MessageBody"}
    return {"Type": action["type"], "FixedResponseConfig": {names[k]: v for k, v in fixed.items()}}


def listener_rule(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    fields = {"path_pattern": ("path-pattern", "PathPatternConfig"), "host_header": ("host-header", "HostHeaderConfig")}
    for logical, address in matched(stack, plan, "AWS::ElasticLoadBalancingV2::ListenerRule"):
        m = Mapper(address, plan[address])
        conditions = []
        for cond in m.take("condition", []):
            ((kind, (block,)),) = cond.items()
            field, config = fields[kind]
            conditions.append({"Field": field, config: {"Values": block["values"]}})
        (action,) = m.take("action")
        m.take("lifecycle", None)  # the priorities' order, which the stack's parameters describe in words
        tf = {
            "ListenerArn": m.take("listener_arn"),
            "Priority": m.take("priority"),
            "Conditions": conditions,
            "Actions": [_rule_action(action)],
        }
        diffs += m.done() + compare(f"listener rule {logical}", stack.props(logical), tf)
    return diffs


def admin_key(stack: Stack, plan: dict[str, Any]) -> list[str]:
    """Triton's admin key: a secret each, generated alike (the stack's GenerateSecretString; the module's
    random password written once into the secret's version)."""
    props = dict(stack.props("TritonAdminKey"))
    m = Mapper("aws_secretsmanager_secret.admin_key", one_of(plan, "aws_secretsmanager_secret.admin_key"))
    family = one_of(plan, "aws_ecs_task_definition.this")["family"]
    assert m.take("name_prefix") == f"{family}-triton-admin-key-"
    description = m.take("description").replace(family, stack.props("TaskDefinition")["Family"])
    v = Mapper(
        "aws_secretsmanager_secret_version.admin_key", one_of(plan, "aws_secretsmanager_secret_version.admin_key")
    )
    assert str(v.take("secret_id")) == "<aws_secretsmanager_secret.admin_key.id>"
    generated = json.loads(v.take("secret_string").removeprefix("<random:").removesuffix(">"))
    # The first value stays, as the stack's (the plan has no lifecycle: read it from the source).
    (version,) = [r["aws_secretsmanager_secret_version"]["admin_key"] for r in hcl(TF / "admin_key.tf")["resource"]
                  if "aws_secretsmanager_secret_version" in r]  # fmt: skip
    assert version["lifecycle"][0]["ignore_changes"] == ["secret_string"], version["lifecycle"]
    names = {
        "password_length": "PasswordLength",
        "exclude_punctuation": "ExcludePunctuation",
        "include_space": "IncludeSpace",
    }
    tf = {"Description": description, "GenerateSecretString": {names[k]: val for k, val in generated.items()}}
    return m.done() + v.done() + compare("admin key", props, tf)


def log_groups(stack: Stack, plan: dict[str, Any]) -> list[str]:
    cfn = {
        stack.props(n)["LogGroupName"]: stack.props(n)["RetentionInDays"]
        for n in stack.resources("AWS::Logs::LogGroup")
    }
    tf = {}
    diffs = []
    for address, r in of_type(plan, "aws_cloudwatch_log_group").items():
        m = Mapper(address, r)
        tf[m.take("name")] = m.take("retention_in_days")
        diffs += m.done()
    return diffs + compare("log groups", cfn, tf)


def _statement(st: dict[str, Any]) -> dict[str, Any]:
    def listed(v: Any) -> list[str]:
        return sorted(set(v if isinstance(v, list) else [v]))

    return {**st, "Action": listed(st["Action"]), "Resource": listed(st["Resource"])}


def _policy(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "Statement": sorted(map(_statement, doc["Statement"]), key=lambda s: s.get("Sid", ""))}


def roles(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    policies = of_type(plan, "aws_iam_role_policy")
    attachments = of_type(plan, "aws_iam_role_policy_attachment")
    pairs = matched(stack, plan, "AWS::IAM::Role")
    for logical, address in pairs:
        props = stack.props(logical)
        m = Mapper(address, plan[address])
        tf: dict[str, Any] = {
            "Description": m.take("description"),
            "AssumeRolePolicyDocument": json.loads(m.take("assume_role_policy")),
        }
        diffs += m.done()
        tf_policies = {}
        for paddress, p in policies.items():
            pm = Mapper(paddress, p)
            if str(pm.take("role")) == f"<{address}.id>":
                tf_policies[pm.take("name")] = _policy(json.loads(pm.take("policy")))
                diffs += pm.done()
        cfn_policies = {p["PolicyName"]: _policy(p["PolicyDocument"]) for p in props.pop("Policies", [])}
        diffs += compare(f"{logical} policies", cfn_policies, tf_policies)
        managed = []
        for aaddress, a in attachments.items():
            am = Mapper(aaddress, a, ignore=())
            if str(am.take("role")) == f"<{address}.name>":
                managed.append(am.take("policy_arn"))
                diffs += am.done()
        tf["ManagedPolicyArns"] = sorted(managed)
        props["ManagedPolicyArns"] = sorted(props.get("ManagedPolicyArns", []))
        diffs += compare(logical, props, tf)
    known = {f"<{address}.id>" for _, address in pairs}
    attached = {str(p.get("role")) for p in policies.values()} - known
    named = {f"<{address}.name>" for _, address in pairs}
    managed_on = {str(a.get("role")) for a in attachments.values()} - named
    return (
        diffs
        + [f"policy on an unknown role {r}" for r in attached]
        + [f"managed policy attached to an unknown role {r}" for r in managed_on]
    )


def topics(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    for logical, address in matched(stack, plan, "AWS::SNS::Topic"):
        m = Mapper(address, plan[address])
        diffs += m.done() + compare(f"topic {logical}", stack.props(logical), {})
    return diffs


def topic_policies(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    for logical, address in matched(stack, plan, "AWS::SNS::TopicPolicy"):
        m = Mapper(address, plan[address], ignore=())
        tf = {"Topics": [m.take("arn")], "PolicyDocument": _policy(json.loads(m.take("policy")))}
        cfn = stack.props(logical)
        cfn["PolicyDocument"] = _policy(cfn["PolicyDocument"])
        diffs += m.done() + compare(f"topic policy {logical}", cfn, tf)
    return diffs


def event_rules(stack: Stack, plan: dict[str, Any]) -> list[str]:
    """A rule with its targets: inline Targets in the stack, aws_cloudwatch_event_target here."""
    diffs = []
    targets = of_type(plan, "aws_cloudwatch_event_target")
    pairs = matched(stack, plan, "AWS::Events::Rule")
    for logical, address in pairs:
        m = Mapper(address, plan[address])
        tf_targets = []
        for taddress, target in targets.items():
            tm = Mapper(taddress, target, ignore=())
            if str(tm.take("rule")) == f"<{address}.name>":
                tf_targets.append({"Id": tm.take("target_id"), "Arn": tm.take("arn")})
                diffs += tm.done()
        tf = {
            "Description": m.take("description"),
            "State": m.take("state"),
            "EventPattern": json.loads(m.take("event_pattern")),
            "Targets": tf_targets,
        }
        diffs += m.done() + compare(f"event rule {logical}", stack.props(logical), tf)
    rules = {f"<{address}.name>" for _, address in pairs}
    return diffs + [
        f"event target {a} on an unknown rule {t.get('rule')}"
        for a, t in targets.items()
        if str(t.get("rule")) not in rules
    ]


def queues(stack: Stack, plan: dict[str, Any]) -> list[str]:
    """SQS queues (the controller's and its dead-letter queue): the redrive policy compared as JSON."""
    diffs = []
    for logical, address in matched(stack, plan, "AWS::SQS::Queue"):
        m = Mapper(address, plan[address])
        tf = {
            "SqsManagedSseEnabled": m.take("sqs_managed_sse_enabled"),
            "KmsMasterKeyId": m.take("kms_master_key_id"),
            "VisibilityTimeout": m.take("visibility_timeout_seconds"),
            "MessageRetentionPeriod": m.take("message_retention_seconds"),
            "DelaySeconds": m.take("delay_seconds"),
            "ReceiveMessageWaitTimeSeconds": m.take("receive_wait_time_seconds"),
            "FifoQueue": m.take("fifo_queue"),
        }
        if (redrive := m.take("redrive_policy")) is not None:
            tf["RedrivePolicy"] = json.loads(redrive)
        diffs += m.done() + compare(f"queue {logical}", stack.props(logical), tf)
    return diffs


def _resource_policies(
    stack: Stack, plan: dict[str, Any], cfn_type: str, target: tuple[str, str], kind: str
) -> list[str]:
    """Queue and bucket policies: the stack's one target (Queues: [url] or Bucket: name) and the document."""
    cfn_key, tf_key = target
    diffs = []
    for logical, address in matched(stack, plan, cfn_type):
        m = Mapper(address, plan[address], ignore=())
        tf = {cfn_key: m.take(tf_key), "PolicyDocument": _policy(json.loads(m.take("policy")))}
        cfn = stack.props(logical)
        cfn["PolicyDocument"] = _policy(cfn["PolicyDocument"])
        if cfn_key == "Queues":
            tf["Queues"] = [tf["Queues"]]
        diffs += m.done() + compare(f"{kind} {logical}", cfn, tf)
    return diffs


def queue_policies(stack: Stack, plan: dict[str, Any]) -> list[str]:
    return _resource_policies(stack, plan, "AWS::SQS::QueuePolicy", ("Queues", "queue_url"), "queue policy")


def bucket_policies(stack: Stack, plan: dict[str, Any]) -> list[str]:
    return _resource_policies(stack, plan, "AWS::S3::BucketPolicy", ("Bucket", "bucket"), "bucket policy")


# The Terraform resources that stand for the properties of one AWS::S3::Bucket (provider 4 and later).
BUCKET_PARTS = (
    "aws_s3_bucket_server_side_encryption_configuration",
    "aws_s3_bucket_public_access_block",
    "aws_s3_bucket_ownership_controls",
    "aws_s3_bucket_versioning",
    "aws_s3_bucket_lifecycle_configuration",
)


def _bucket_part(rtype: str, m: Mapper) -> dict[str, Any]:
    """One of BUCKET_PARTS as the AWS::S3::Bucket property it stands for (what it leaves is a difference)."""
    if rtype == "aws_s3_bucket_server_side_encryption_configuration":
        rules = []
        for rule in m.take("rule", []):
            rm = Mapper(f"{m.where}.rule", rule, ignore=())
            default = rm.block("apply_server_side_encryption_by_default")
            by_default = {
                "SSEAlgorithm": default.take("sse_algorithm"),
                "KMSMasterKeyID": default.take("kms_master_key_id"),
            }
            rules.append(
                {"ServerSideEncryptionByDefault": by_default, "BucketKeyEnabled": rm.take("bucket_key_enabled")}
            )
            assert not rm.done() + default.done(), rm.done() + default.done()
        return {"BucketEncryption": {"ServerSideEncryptionConfiguration": rules}}
    if rtype == "aws_s3_bucket_public_access_block":
        names = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
        snake = ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets")
        return {"PublicAccessBlockConfiguration": {n: m.take(s) for n, s in zip(names, snake, strict=True)}}
    if rtype == "aws_s3_bucket_ownership_controls":
        return {
            "OwnershipControls": {"Rules": [{"ObjectOwnership": r["object_ownership"]} for r in m.take("rule", [])]}
        }
    if rtype == "aws_s3_bucket_versioning":
        return {"VersioningConfiguration": {"Status": m.block("versioning_configuration").take("status")}}
    rules = []
    for rule in m.take("lifecycle_rule", []) + m.take("rule", []):
        rm = Mapper(f"{m.where}.rule", rule, ignore=())
        out: dict[str, Any] = {"Id": rm.take("id"), "Status": rm.take("status")}
        if rm.take("filter") not in ([{}], None):  # an empty filter: the whole bucket, as no Prefix or Filter
            out["Filter"] = "a filter the test does not map"
        if (noncurrent := rm.optional_block("noncurrent_version_expiration")) is not None:
            out["NoncurrentVersionExpiration"] = {"NoncurrentDays": noncurrent.take("noncurrent_days")}
            assert not noncurrent.done(), noncurrent.done()
        if (abort := rm.optional_block("abort_incomplete_multipart_upload")) is not None:
            out["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": abort.take("days_after_initiation")}
            assert not abort.done(), abort.done()
        for left in rm.args:
            out[left] = rm.args[left]  # anything else: shown as a difference
        rules.append(out)
    return {"LifecycleConfiguration": {"Rules": rules}}


def buckets(stack: Stack, plan: dict[str, Any]) -> list[str]:
    """A bucket with its settings: properties of the AWS::S3::Bucket there, resources of their own here."""
    diffs = []
    pairs = matched(stack, plan, "AWS::S3::Bucket")
    parts = {a: r for rtype in BUCKET_PARTS for a, r in of_type(plan, rtype).items()}
    for logical, address in pairs:
        m = Mapper(address, plan[address])
        tf: dict[str, Any] = {"BucketName": m.take("bucket")}
        if m.take("bucket_prefix") is not None:
            diffs.append(f"{address}: bucket_prefix, where the stack lets CloudFormation name the bucket")
        for paddress, part in parts.items():
            if str(part.get("bucket")) == f"<{address}.id>":
                pm = Mapper(paddress, part, ignore=())
                pm.take("bucket")
                tf |= _bucket_part(paddress.split(".")[0], pm)
                diffs += pm.done()
        diffs += m.done() + compare(f"bucket {logical}", stack.props(logical), tf)
    known = {f"<{address}.id>" for _, address in pairs}
    return diffs + [
        f"{a} on an unknown bucket {p.get('bucket')}" for a, p in parts.items() if str(p.get("bucket")) not in known
    ]


ALARM_FIELDS = {  # aws_cloudwatch_metric_alarm argument -> AWS::CloudWatch::Alarm property
    "alarm_name": "AlarmName",
    "alarm_description": "AlarmDescription",
    "actions_enabled": "ActionsEnabled",
    "namespace": "Namespace",
    "metric_name": "MetricName",
    "statistic": "Statistic",
    "extended_statistic": "ExtendedStatistic",
    "period": "Period",
    "unit": "Unit",
    "evaluation_periods": "EvaluationPeriods",
    "datapoints_to_alarm": "DatapointsToAlarm",
    "threshold": "Threshold",
    "threshold_metric_id": "ThresholdMetricId",
    "comparison_operator": "ComparisonOperator",
    "treat_missing_data": "TreatMissingData",
    "evaluate_low_sample_count_percentiles": "EvaluateLowSampleCountPercentile",
    "evaluation_interval": "EvaluationInterval",
    "alarm_actions": "AlarmActions",
    "ok_actions": "OKActions",
    "insufficient_data_actions": "InsufficientDataActions",
}
QUERY_FIELDS = {
    "id": "Id",
    "expression": "Expression",
    "label": "Label",
    "return_data": "ReturnData",
    "period": "Period",
    "account_id": "AccountId",
}


def _dimensions(d: dict[str, str] | None) -> list[dict[str, str]]:
    return [{"Name": k, "Value": v} for k, v in sorted((d or {}).items())]


def _alarm_as_cfn(address: str, args: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    m = Mapper(address, args)
    out: dict[str, Any] = {}
    diffs: list[str] = []
    if "dimensions" in m.args:
        out["Dimensions"] = _dimensions(m.take("dimensions"))
    queries = []
    for q in m.take("metric_query", []):
        qm = Mapper(f"{address}.metric_query", q, ignore=())
        entry = {QUERY_FIELDS[k]: qm.take(k) for k in list(qm.args) if k in QUERY_FIELDS}
        for metric in qm.take("metric", []):
            mm = Mapper(f"{address}.metric_query.metric", metric, ignore=())
            entry["MetricStat"] = {
                "Metric": {
                    "Namespace": mm.take("namespace"),
                    "MetricName": mm.take("metric_name"),
                    "Dimensions": _dimensions(mm.take("dimensions")),
                },
                "Period": mm.take("period"),
                "Stat": mm.take("stat"),
                "Unit": mm.take("unit"),
            }
            diffs += mm.done()
        queries.append(entry)
        diffs += qm.done()
    if queries:
        out["Metrics"] = queries
    for criteria in m.take("evaluation_criteria", []):  # a PromQL alarm (render/alarms/promql.py)
        cm = Mapper(f"{address}.evaluation_criteria", criteria, ignore=())
        for promql in cm.take("promql_criteria", []):
            pm = Mapper(f"{address}.evaluation_criteria.promql_criteria", promql, ignore=())
            out["EvaluationCriteria"] = {
                "PromQLCriteria": {
                    "Query": pm.take("query"),
                    "PendingPeriod": pm.take("pending_period"),
                    "RecoveryPeriod": pm.take("recovery_period"),
                }
            }
            diffs += pm.done()
        diffs += cm.done()
    for k in list(m.args):
        if k in ALARM_FIELDS:
            out[ALARM_FIELDS[k]] = m.take(k)
    return out, m.done() + diffs


def _sorted_dims(props: dict[str, Any]) -> dict[str, Any]:
    props = copy.deepcopy(props)
    if "Dimensions" in props:
        props["Dimensions"] = sorted(props["Dimensions"], key=lambda d: d["Name"])
    return props


def alarms(nested: Stack, plan: dict[str, Any], main: Stack | None = None) -> list[str]:
    """Every alarm by name: the nested stack's, and the main stack's own (the controller's) where given."""
    cfn = {
        s.props(n)["AlarmName"]: _sorted_dims(s.props(n))
        for s in (nested, *([main] if main else []))
        for n in s.resources("AWS::CloudWatch::Alarm")
    }
    tf, diffs = {}, []
    for address, args in of_type(plan, "aws_cloudwatch_metric_alarm").items():
        props, d = _alarm_as_cfn(address, args)
        tf[props["AlarmName"]] = props
        diffs += d
    if set(cfn) != set(tf):
        diffs.append(f"alarms: stack {sorted(cfn)} != terraform {sorted(tf)}")
    for props in (*cfn.values(), *tf.values()):  # a threshold in a PromQL query: Fn::Sub prints 5.0, Terraform 5
        promql = props.get("EvaluationCriteria", {}).get("PromQLCriteria")
        if promql:
            promql["Query"] = re.sub(r"\b(\d+)\.0\b", r"\1", promql["Query"])
        for q in props.get("Metrics", []):  # ...and in a metric-math expression (the scale-in's load index)
            if isinstance(q.get("Expression"), str):
                q["Expression"] = re.sub(r"\b(\d+)\.0\b", r"\1", q["Expression"])
    for name in sorted(set(cfn) & set(tf)):
        diffs += compare(f"alarm {name}", cfn[name], tf[name])
    return diffs


def insight_rules(nested: Stack, plan: dict[str, Any]) -> list[str]:
    """Contributor Insights rules by name; the definitions compared as JSON (both are JSON texts)."""
    cfn = {}
    for n in nested.resources("AWS::CloudWatch::InsightRule"):
        props = nested.props(n)
        cfn[props["RuleName"]] = {"RuleState": props["RuleState"], "RuleBody": json.loads(props["RuleBody"])}
    tf, diffs = {}, []
    for address, args in of_type(plan, "aws_cloudwatch_contributor_insight_rule").items():
        m = Mapper(address, args)
        tf[m.take("rule_name")] = {"RuleState": m.take("rule_state"), "RuleBody": json.loads(m.take("rule_definition"))}
        diffs += m.done()
    if set(cfn) != set(tf):
        diffs.append(f"insight rules: stack {sorted(cfn)} != terraform {sorted(tf)}")
    for name in sorted(set(cfn) & set(tf)):
        diffs += compare(f"insight rule {name}", cfn[name], tf[name])
    return diffs


def scaling(nested: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    targets = of_type(plan, "aws_appautoscaling_target")
    cfn_targets = nested.resources("AWS::ApplicationAutoScaling::ScalableTarget")
    if len(targets) != len(cfn_targets):
        return [f"scalable targets: stack {len(cfn_targets)} != terraform {len(targets)}"]
    target_args: dict[str, Any] = {}
    for (_, args), logical in zip(targets.items(), cfn_targets, strict=True):
        m = Mapper("aws_appautoscaling_target", args)
        target_args = dict(m.args)
        tf = {
            "ServiceNamespace": m.take("service_namespace"),
            "ResourceId": m.take("resource_id"),
            "ScalableDimension": m.take("scalable_dimension"),
            "MinCapacity": m.take("min_capacity"),
            "MaxCapacity": m.take("max_capacity"),
        }
        diffs += m.done() + compare("scalable target", nested.props(logical), tf)
    cfn_policies = {
        nested.props(n)["PolicyName"]: nested.props(n)
        for n in nested.resources("AWS::ApplicationAutoScaling::ScalingPolicy")
    }
    tf_policies = {}
    for address, args in of_type(plan, "aws_appautoscaling_policy").items():
        m = Mapper(address, args, ignore=())
        same_target = all(
            m.take(k) == target_args.get(k) for k in ("service_namespace", "resource_id", "scalable_dimension")
        )
        config = m.block("step_scaling_policy_configuration")
        steps = [
            {
                "MetricIntervalLowerBound": s.get("metric_interval_lower_bound"),
                "MetricIntervalUpperBound": s.get("metric_interval_upper_bound"),
                "ScalingAdjustment": s.get("scaling_adjustment"),
            }
            for s in config.take("step_adjustment", [])
        ]
        name = m.take("name")
        tf_policies[name] = {
            "PolicyName": name,
            "PolicyType": m.take("policy_type"),
            "ScalingTargetId": "<ScalableTarget>" if same_target else "another target",
            "StepScalingPolicyConfiguration": {
                "AdjustmentType": config.take("adjustment_type"),
                "Cooldown": config.take("cooldown"),
                "MetricAggregationType": config.take("metric_aggregation_type"),
                "MinAdjustmentMagnitude": config.take("min_adjustment_magnitude"),
                "StepAdjustments": steps,
            },
        }
        diffs += m.done() + config.done()
    if set(cfn_policies) != set(tf_policies):
        diffs.append(f"scaling policies: stack {sorted(cfn_policies)} != terraform {sorted(tf_policies)}")
    for name in sorted(set(cfn_policies) & set(tf_policies)):
        diffs += compare(f"scaling policy {name}", cfn_policies[name], tf_policies[name])
    return diffs


def dashboard(nested: Stack, plan: dict[str, Any]) -> list[str]:
    cfn = {
        nested.props(n)["DashboardName"]: json.loads(nested.props(n)["DashboardBody"])
        for n in nested.resources("AWS::CloudWatch::Dashboard")
    }
    tf, diffs = {}, []
    for address, args in of_type(plan, "aws_cloudwatch_dashboard").items():
        m = Mapper(address, args)
        tf[m.take("dashboard_name")] = json.loads(m.take("dashboard_body"))
        diffs += m.done()
    if cfn != tf:  # exact: the same JSON document
        diffs.append(
            f"dashboards differ: stack {sorted(cfn)}, terraform {sorted(tf)}"
            + ("" if set(cfn) != set(tf) else " (same names, different bodies)")
        )
    return diffs


# --- a cluster from zero (CreateCluster / create_cluster) -------------------------------------


def _strategy(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """capacity_provider_strategy blocks as CloudFormation's CapacityProviderStrategy items."""
    return [{"CapacityProvider": b["capacity_provider"], "Weight": b["weight"], "Base": b["base"]} for b in blocks]


def clusters(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    for logical, address in matched(stack, plan, "AWS::ECS::Cluster"):
        m = Mapper(address, plan[address])
        diffs += compare(f"cluster {logical}", stack.props(logical), {"ClusterName": m.take("name")}) + m.done()
    return diffs


def capacity_providers(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    for logical, address in matched(stack, plan, "AWS::ECS::CapacityProvider"):
        m = Mapper(address, plan[address])
        asg = m.block("auto_scaling_group_provider")
        scaling = asg.optional_block("managed_scaling")
        provider: dict[str, Any] = {
            "AutoScalingGroupArn": asg.take("auto_scaling_group_arn"),
            "ManagedTerminationProtection": asg.take("managed_termination_protection"),
            "ManagedDraining": asg.take("managed_draining"),
        }
        if scaling:
            provider["ManagedScaling"] = {
                "Status": scaling.take("status"),
                "TargetCapacity": scaling.take("target_capacity"),
                "MinimumScalingStepSize": scaling.take("minimum_scaling_step_size"),
                "MaximumScalingStepSize": scaling.take("maximum_scaling_step_size"),
                "InstanceWarmupPeriod": scaling.take("instance_warmup_period"),
            }
        tf = {"Name": m.take("name"), "AutoScalingGroupProvider": provider}
        diffs += m.done() + asg.done() + (scaling.done() if scaling else [])
        diffs += compare(f"capacity provider {logical}", stack.props(logical), tf)
    return diffs


def capacity_provider_associations(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    for logical, address in matched(stack, plan, "AWS::ECS::ClusterCapacityProviderAssociations"):
        m = Mapper(address, plan[address], ignore=())
        tf = {
            "Cluster": m.take("cluster_name"),
            "CapacityProviders": m.take("capacity_providers"),
            "DefaultCapacityProviderStrategy": _strategy(m.take("default_capacity_provider_strategy", [])),
        }
        diffs += m.done() + compare(f"capacity provider associations {logical}", stack.props(logical), tf)
    return diffs


def autoscaling_groups(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    for logical, address in matched(stack, plan, "AWS::AutoScaling::AutoScalingGroup"):
        m = Mapper(address, plan[address])
        template = m.block("launch_template")
        # Terraform only: destroy terminates the instances although they are protected from scale-in (the
        # stack's deletion needs their protection lifted first; docs/deploy.md says both).
        if m.take("force_delete") is not True:
            diffs.append(f"{address}: force_delete is not true, so terraform destroy waits on protected instances")
        tf = {
            "MinSize": m.take("min_size"),
            "MaxSize": m.take("max_size"),
            "VPCZoneIdentifier": m.take("vpc_zone_identifier"),
            "NewInstancesProtectedFromScaleIn": m.take("protect_from_scale_in"),
            "LaunchTemplate": {"LaunchTemplateId": template.take("id"), "Version": template.take("version")},
            "Tags": [
                {"Key": t["key"], "Value": t["value"], "PropagateAtLaunch": t["propagate_at_launch"]}
                for t in m.take("tag", [])
            ],
        }
        diffs += m.done() + template.done() + compare(f"auto scaling group {logical}", stack.props(logical), tf)
    return diffs


def _first_difference(a: str, b: str) -> str:
    for n, (x, y) in enumerate(zip(a.splitlines(), b.splitlines(), strict=False), 1):
        if x != y:
            return f"line {n}: stack {x!r} != terraform {y!r}"
    return f"stack {len(a.splitlines())} lines != terraform {len(b.splitlines())} lines"


def launch_templates(stack: Stack, plan: dict[str, Any]) -> list[str]:
    """The launch template's data, with the user data of both sides decoded and compared line by line."""
    diffs = []
    for logical, address in matched(stack, plan, "AWS::EC2::LaunchTemplate"):
        m = Mapper(address, plan[address])
        profile, metadata = m.block("iam_instance_profile"), m.block("metadata_options")
        devices = []
        for mapping in m.take("block_device_mappings", []):
            bm = Mapper(f"{address}.block_device_mappings", mapping, ignore=())
            ebs = bm.block("ebs")
            devices.append(
                {
                    "DeviceName": bm.take("device_name"),
                    "Ebs": {
                        "VolumeSize": ebs.take("volume_size"),
                        "VolumeType": ebs.take("volume_type"),
                        "Encrypted": ebs.take("encrypted"),
                        "DeleteOnTermination": ebs.take("delete_on_termination"),
                    },
                }
            )
            diffs += bm.done() + ebs.done()
        tf_user_data = base64.b64decode(m.take("user_data") or "").decode()
        tf = {
            "ImageId": m.take("image_id"),
            "InstanceType": m.take("instance_type"),
            "SecurityGroupIds": m.take("vpc_security_group_ids"),
            "IamInstanceProfile": {"Arn": profile.take("arn")},
            "MetadataOptions": {
                "HttpEndpoint": metadata.take("http_endpoint"),
                "HttpTokens": metadata.take("http_tokens"),
                "HttpPutResponseHopLimit": metadata.take("http_put_response_hop_limit"),
            },
            "BlockDeviceMappings": devices,
        }
        diffs += m.done() + profile.done() + metadata.done()
        data = stack.props(logical)["LaunchTemplateData"]
        cfn_user_data = base64.b64decode(data.pop("UserData", "")).decode()
        if cfn_user_data != tf_user_data:
            diffs.append(f"launch template {logical}.UserData: {_first_difference(cfn_user_data, tf_user_data)}")
        diffs += compare(f"launch template {logical}.LaunchTemplateData", data, tf)
    return diffs


def instance_profiles(stack: Stack, plan: dict[str, Any]) -> list[str]:
    diffs = []
    for logical, address in matched(stack, plan, "AWS::IAM::InstanceProfile"):
        m = Mapper(address, plan[address])
        diffs += compare(f"instance profile {logical}", stack.props(logical), {"Roles": [m.take("role")]}) + m.done()
    return diffs


COMPARED = {
    "aws_ecs_task_definition": task_definition,
    "aws_ecs_service": service,
    "aws_lb_target_group": target_group,
    "aws_lb_listener_rule": listener_rule,
    "aws_cloudwatch_log_group": log_groups,
    "aws_iam_role": roles,
    "aws_iam_role_policy": roles,
    "aws_sns_topic": topics,
    "aws_sns_topic_policy": topic_policies,
    "aws_cloudwatch_event_rule": event_rules,
    "aws_cloudwatch_event_target": event_rules,
    "aws_iam_role_policy_attachment": roles,
    "aws_ecs_cluster": clusters,
    "aws_ecs_capacity_provider": capacity_providers,
    "aws_ecs_cluster_capacity_providers": capacity_provider_associations,
    "aws_autoscaling_group": autoscaling_groups,
    "aws_launch_template": launch_templates,
    "aws_iam_instance_profile": instance_profiles,
    "aws_secretsmanager_secret": admin_key,
    "aws_secretsmanager_secret_version": admin_key,
    "aws_sqs_queue": queues,
    "aws_sqs_queue_policy": queue_policies,
    "aws_s3_bucket": buckets,
    **dict.fromkeys(BUCKET_PARTS, buckets),
    "aws_s3_bucket_policy": bucket_policies,
}
NESTED = {
    "aws_cloudwatch_metric_alarm": alarms,
    "aws_appautoscaling_target": scaling,
    "aws_appautoscaling_policy": scaling,
    "aws_cloudwatch_dashboard": dashboard,
    "aws_cloudwatch_contributor_insight_rule": insight_rules,
}
# CloudFormation resource type -> the Terraform type that stands for it (the nested stack is its resources).
CFN_TYPES = {
    "AWS::ECS::TaskDefinition": "aws_ecs_task_definition",
    "AWS::ECS::Service": "aws_ecs_service",
    "AWS::ElasticLoadBalancingV2::TargetGroup": "aws_lb_target_group",
    "AWS::ElasticLoadBalancingV2::ListenerRule": "aws_lb_listener_rule",
    "AWS::Logs::LogGroup": "aws_cloudwatch_log_group",
    "AWS::IAM::Role": "aws_iam_role",
    "AWS::SNS::Topic": "aws_sns_topic",
    "AWS::SNS::TopicPolicy": "aws_sns_topic_policy",
    "AWS::Events::Rule": "aws_cloudwatch_event_rule",
    "AWS::CloudWatch::Alarm": "aws_cloudwatch_metric_alarm",
    "AWS::ApplicationAutoScaling::ScalableTarget": "aws_appautoscaling_target",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "aws_appautoscaling_policy",
    "AWS::CloudWatch::Dashboard": "aws_cloudwatch_dashboard",
    "AWS::CloudWatch::InsightRule": "aws_cloudwatch_contributor_insight_rule",
    "AWS::ECS::Cluster": "aws_ecs_cluster",
    "AWS::ECS::CapacityProvider": "aws_ecs_capacity_provider",
    "AWS::ECS::ClusterCapacityProviderAssociations": "aws_ecs_cluster_capacity_providers",
    "AWS::AutoScaling::AutoScalingGroup": "aws_autoscaling_group",
    "AWS::EC2::LaunchTemplate": "aws_launch_template",
    "AWS::IAM::InstanceProfile": "aws_iam_instance_profile",
    "AWS::SecretsManager::Secret": "aws_secretsmanager_secret",
    "AWS::SQS::Queue": "aws_sqs_queue",
    "AWS::SQS::QueuePolicy": "aws_sqs_queue_policy",
    "AWS::S3::Bucket": "aws_s3_bucket",
    "AWS::S3::BucketPolicy": "aws_s3_bucket_policy",
}
# Stack logical id -> the Terraform address that stands for it, for the types matched one to one (log
# groups, policies, alarms, scaling and the dashboard are matched by name). Conditional resources are
# [0] of a `count`: the stack creating one and the plan not (or the other way round) is a difference.
COUNTERPARTS = {
    "TaskDefinition": "aws_ecs_task_definition.this",
    "Service": "aws_ecs_service.this",
    "TargetGroup": "aws_lb_target_group.this",
    "ListenerRule": "aws_lb_listener_rule.this",
    "ListenerDenyRule": "aws_lb_listener_rule.deny",
    "TritonAdminKey": "aws_secretsmanager_secret.admin_key",
    "ExecutionRole": "aws_iam_role.execution",
    "TaskRole": "aws_iam_role.task",
    "ModelSyncTopic": "aws_sns_topic.modelsync[0]",
    "ModelSyncTopicPolicy": "aws_sns_topic_policy.modelsync[0]",
    "ModelSyncEventRule": "aws_cloudwatch_event_rule.modelsync[0]",
    "Cluster": "aws_ecs_cluster.this[0]",
    "CapacityProvider": "aws_ecs_capacity_provider.gpu[0]",
    "ClusterCapacityProviders": "aws_ecs_cluster_capacity_providers.this[0]",
    "AutoScalingGroup": "aws_autoscaling_group.gpu[0]",
    "LaunchTemplate": "aws_launch_template.gpu[0]",
    "InstanceRole": "aws_iam_role.instance[0]",
    "InstanceProfile": "aws_iam_instance_profile.instance[0]",
    "ControllerQueue": "aws_sqs_queue.controller[0]",
    "ControllerDeadLetterQueue": "aws_sqs_queue.controller_dead_letter[0]",
    "ControllerQueuePolicy": "aws_sqs_queue_policy.controller[0]",
    "ControllerDeadLetterQueuePolicy": "aws_sqs_queue_policy.controller_dead_letter[0]",
    "ControllerStateBucket": "aws_s3_bucket.controller_state[0]",
    "ControllerStateBucketPolicy": "aws_s3_bucket_policy.controller_state[0]",
    "ControllerExecutionRole": "aws_iam_role.controller_execution[0]",
    "ControllerTaskRole": "aws_iam_role.controller_task[0]",
    "ControllerTaskDefinition": "aws_ecs_task_definition.controller[0]",
    "ControllerService": "aws_ecs_service.controller[0]",
}
ONE_TO_ONE = (
    "AWS::ECS::TaskDefinition",
    "AWS::ECS::Service",
    "AWS::ElasticLoadBalancingV2::TargetGroup",
    "AWS::ElasticLoadBalancingV2::ListenerRule",
    "AWS::IAM::Role",
    "AWS::SNS::Topic",
    "AWS::SNS::TopicPolicy",
    "AWS::Events::Rule",
    "AWS::ECS::Cluster",
    "AWS::ECS::CapacityProvider",
    "AWS::ECS::ClusterCapacityProviderAssociations",
    "AWS::AutoScaling::AutoScalingGroup",
    "AWS::EC2::LaunchTemplate",
    "AWS::IAM::InstanceProfile",
    "AWS::SecretsManager::Secret",
    "AWS::SQS::Queue",
    "AWS::SQS::QueuePolicy",
    "AWS::S3::Bucket",
    "AWS::S3::BucketPolicy",
)


def counterparts(stack: Stack, plan: dict[str, Any]) -> list[str]:
    """Each one-to-one stack resource the stack creates has its address in the plan, and nothing more."""
    diffs, expected = [], set()
    for cfn_type in ONE_TO_ONE:
        for name in stack.resources(cfn_type):
            if name not in COUNTERPARTS:
                diffs.append(f"stack resource {name} ({cfn_type}) has no Terraform counterpart in this test")
            elif COUNTERPARTS[name] not in plan:
                diffs.append(f"stack resource {name} ({cfn_type}) exists; terraform plan has no {COUNTERPARTS[name]}")
            expected.add(COUNTERPARTS.get(name))
    tf_types = {CFN_TYPES[t] for t in ONE_TO_ONE}
    diffs += [
        f"terraform creates {a}, which the stack does not"
        for a in sorted(plan)
        if a.split(".")[0] in tf_types and a not in expected
    ]
    return diffs


def _replace_strings(x: Any, names: dict[str, str]) -> Any:
    if isinstance(x, str):
        for theirs, ours in names.items():
            x = x.replace(theirs, ours)
        return x
    if isinstance(x, list):
        return [_replace_strings(i, names) for i in x]
    if isinstance(x, dict):
        return {k: _replace_strings(v, names) for k, v in x.items()}
    return x


def deployment_names(stack: Stack, plan: dict[str, Any]) -> dict[str, str]:
    """The names each side derives from the deployment's own name (the stack's name and id there, the task
    family here): the default namespace Triton/<family> and the daemons' queue prefix. Each side's value
    is checked for its shape, then the plan's is written as the stack's, so everything else compares."""
    names: dict[str, str] = {}
    td = stack.props("TaskDefinition")
    tf_family = one_of(plan, "aws_ecs_task_definition.this")["family"]
    if not stack.params["Namespace"]:
        names[f"Triton/{tf_family}"] = f"Triton/{td['Family']}"
    containers = {c["Name"]: c for c in td["ContainerDefinitions"]}
    if "modelsync" in containers:
        ours = {e["Name"]: e["Value"] for e in containers["modelsync"]["Environment"]}["MODELSYNC_QUEUE_NAME_PREFIX"]
        tf = json.loads(plan["aws_ecs_task_definition.this"]["container_definitions"])
        (daemon,) = [c for c in tf if c["name"] == "modelsync"]
        theirs = {e["name"]: e["value"] for e in daemon["environment"]}["MODELSYNC_QUEUE_NAME_PREFIX"]
        assert re.fullmatch(r"modelsync-[0-9a-f]{32}-", ours) and re.fullmatch(r"modelsync-[0-9a-f]{16}-", theirs)
        names[theirs] = ours
    if "CapacityProvider" in stack.resources():  # gpu-<stack name> there, gpu-<task family> here
        ours, theirs = stack.props("CapacityProvider")["Name"], plan["aws_ecs_capacity_provider.gpu[0]"]["name"]
        assert ours == f"gpu-{td['Family']}" and theirs == f"gpu-{tf_family}"[:255]
        names[theirs] = ours
    return names


# Terraform types named with the alarm prefix, and the dashboard, whose alarm widgets name the alarms.
PREFIXED = (
    "aws_cloudwatch_metric_alarm",
    "aws_appautoscaling_policy",
    "aws_cloudwatch_contributor_insight_rule",
    "aws_cloudwatch_dashboard",
)
NAME_FIELDS = {  # the name argument of each
    "aws_cloudwatch_metric_alarm": "alarm_name",
    "aws_appautoscaling_policy": "name",
    "aws_cloudwatch_contributor_insight_rule": "rule_name",
}


def default_names(stack: Stack, plan: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The alarm prefix and the dashboard's name where their parameters are empty: the stack's name there, the task
    family here (each deployment its own, issue 38). Every name the plan gives must start with the family (the
    dashboard's must be it), then the plan's are written as the stack's, so the names and bodies compare."""
    tf_family = one_of(plan, "aws_ecs_task_definition.this")["family"]
    ours = stack.pseudo["AWS::StackName"]
    plan, diffs = dict(plan), []
    if not stack.params["AlarmNamePrefix"]:
        for address, args in plan.items():
            rtype = address.split(".")[0]
            if rtype not in PREFIXED:
                continue
            name = args.get(NAME_FIELDS.get(rtype, ""))
            if isinstance(name, str) and not name.startswith(f"{tf_family}-"):
                diffs.append(f"default alarm prefix: terraform names {name}, not after the task family {tf_family}")
            plan[address] = _replace_strings(args, {f"{tf_family}-": f"{ours}-"})
    if not stack.params["DashboardName"]:
        for address, args in of_type(plan, "aws_cloudwatch_dashboard").items():
            if args["dashboard_name"] != tf_family:
                diffs.append(f"default dashboard name: terraform {args['dashboard_name']}, not the task family")
            plan[address] = args | {"dashboard_name": ours}
    return plan, diffs


def differences(stack: Stack, nested: Stack, plan: dict[str, Any]) -> list[str]:
    plan = _replace_strings(plan, deployment_names(stack, plan))
    plan, diffs = default_names(stack, plan)
    for s in (stack, nested):
        for name, res in s.t["Resources"].items():
            if res["Type"] == "AWS::CloudFormation::Stack":
                continue
            if res["Type"] not in CFN_TYPES:
                diffs.append(f"stack resource {name} ({res['Type']}) has no Terraform counterpart in this test")
    tf_types = {a.split(".")[0] for a in plan}
    unknown = tf_types - set(COMPARED) - set(NESTED)
    diffs += [f"terraform resource type {t} is not compared with the stack" for t in sorted(unknown)]
    diffs += counterparts(stack, plan)
    for fn in dict.fromkeys(COMPARED.values()):
        diffs += fn(stack, plan)
    for fn in dict.fromkeys(NESTED.values()):
        diffs += alarms(nested, plan, stack) if fn is alarms else fn(nested, plan)
    return diffs


# --- the tests ---------------------------------------------------------------------------------


def test_every_tf_file_parses_with_python_hcl2() -> None:
    files = sorted(TF.rglob("*.tf"))
    assert {f.name for f in files} >= {
        "main.tf",
        "variables.tf",
        "outputs.tf",
        "iam.tf",
        "logs.tf",
        "dashboard.tf",
        "versions.tf",
    }
    assert EXAMPLES / "main.tf" in files
    for f in files:
        with f.open() as fh:
            assert hcl2.load(fh), f
    for f in sorted(TF.rglob("*.tf.json")):
        assert json.loads(f.read_text()), f
    with pytest.raises(UnexpectedInput):  # the parser is a real one: a broken file does not pass
        hcl2.loads('resource "aws_iam_role" "x" {\n  name = \n}\n')


@pytest.mark.parametrize("directory", [TF, EXAMPLES], ids=["module", "examples"])
def test_every_variable_has_a_type_and_a_description(directory: Path) -> None:
    decl = declared_variables(directory)
    assert decl and set(decl) == set(variables(directory))
    for name, var in decl.items():
        assert var.get("type", "").removeprefix("${").removesuffix("}") in (
            "string",
            "number",
            "bool",
            "list(string)",
            "map(string)",
        ), f"variable {name}: type {var.get('type')}"
        assert isinstance(var.get("description"), str) and len(var["description"]) > 10, f"variable {name}"


def test_the_issue_resources_variables_and_outputs_exist() -> None:
    blocks = parse_directory(TF)
    resources = {b.labels[0] for b in blocks if b.type == "resource"}
    assert resources >= {
        "aws_ecs_task_definition",
        "aws_ecs_service",
        "aws_lb_target_group",
        "aws_lb_listener_rule",
        "aws_cloudwatch_log_group",
        "aws_iam_role",
        "aws_iam_role_policy",
        "aws_cloudwatch_dashboard",
        "aws_cloudwatch_metric_alarm",
        "aws_appautoscaling_target",
        "aws_appautoscaling_policy",
        "aws_sns_topic",
        "aws_sns_topic_policy",
        "aws_cloudwatch_event_rule",
        "aws_cloudwatch_event_target",
    }
    assert set(variables()) >= {
        "cluster_name",
        "service_name",
        "vpc_id",
        "subnet_ids",
        "security_group_ids",
        "listener_arn",
        "triton_image",
        "exporter_image",
        "log_router_image",
        "namespace",
        "log_group_prefix",
        "log_retention_days",
        "desired_count",
        "min_capacity",
        "max_capacity",
        "failure_threshold",
        "latency_slo_microseconds",
        "gpu_memory_threshold",
        "pending_requests_scale_out",
        "queue_time_scale_out_microseconds",
        "requests_waiting_scale_out",
        "gpu_scale_in_utilization",
        "task_start_seconds",
        "scale_in_cooldown",
        "load_success_rate_threshold",
        "alarm_topic_arn",
        "model_sync_bucket_name",
        "model_sync_prefix",
        "model_sync_host_path",
        "model_bucket_kms_key_arn",
        "triton_cpu",
        "triton_memory",
        "triton_args",
    }
    outputs = {b.labels[0] for b in blocks if b.type == "output"}
    assert outputs >= {
        "service_name",
        "dashboard_name",
        "log_groups",
        "task_role_arn",
        "execution_role_arn",
        "alarm_names",
        "task_definition_arn",
        "model_sync_topic_arn",
        "model_sync_log_group",
        "namespace",
        "controller_queue_url",
        "controller_service_name",
        "controller_state_bucket",
    }
    # What the issue names in the task definition, as the plan has it.
    plan = module_for(VALUES).plan()
    td = plan["aws_ecs_task_definition.this"]
    assert (td["network_mode"], td["requires_compatibilities"]) == ("awsvpc", ["EC2"])
    containers = {c["name"]: c for c in json.loads(td["container_definitions"])}
    assert set(containers) == {"triton-server", "exporter", "log_router"}
    triton = containers["triton-server"]
    assert {"type": "GPU", "value": "1"} in triton["resourceRequirements"]
    assert triton["healthCheck"]["command"][:3] == ["CMD", "python3", "/opt/triton-health/health.py"]
    assert containers["log_router"]["firelensConfiguration"]["type"] == "fluentbit"
    assert plan["aws_ecs_service.this"]["launch_type"] == "EC2"
    # Model sync: none of it by default (every output null), all of it with a bucket.
    model_sync_outputs = {k: v for k, v in module_for(VALUES).outputs().items() if k.startswith("model_sync_")}
    assert model_sync_outputs and all(v is None for v in model_sync_outputs.values())
    on = module_for(VALUES | {"ModelSyncBucketName": "example-models"})
    outputs = on.outputs()
    assert outputs["model_sync_topic_arn"] == Unknown("aws_sns_topic.modelsync[0].arn")
    assert outputs["log_groups"]["modelsync"] == outputs["model_sync_log_group"] == "/ecs/triton/modelsync"
    assert outputs["namespace"] == "Triton/gpu-cluster-triton"  # var.namespace empty: one per deployment
    plan = on.plan()
    # No daemon service: the controller's (Fargate, which makes the daemons' queues) beside the Triton service.
    assert set(of_type(plan, "aws_ecs_service")) == {"aws_ecs_service.this", "aws_ecs_service.controller[0]"}
    td = plan["aws_ecs_task_definition.this"]
    containers = {c["name"]: c for c in json.loads(td["container_definitions"])}
    assert list(containers) == ["log_router", "modelsync-init", "modelsync", "triton-server", "exporter"]
    daemon = containers["modelsync"]
    assert daemon["readonlyRootFilesystem"] is True and td["network_mode"] == "awsvpc"
    env = {e["name"]: e["value"] for e in daemon["environment"]}
    assert env["MODELSYNC_TOPIC_ARN"] == "<aws_sns_topic.modelsync[0].arn>"
    assert env["MODELSYNC_BUCKET"] == "example-models"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_module_and_stack_describe_the_same_deployment(template, alarms_template, scenario: str) -> None:
    params = VALUES | SCENARIOS[scenario]
    stack, nested = stacks_for(template, alarms_template, params)
    plan = module_for(params).plan()
    assert differences(stack, nested, plan) == []
    # Not vacuous: the scenario's own values reached both sides.
    if scenario == "alarms":
        assert not of_type(plan, "aws_appautoscaling_policy") and not of_type(plan, "aws_cloudwatch_dashboard")
        names = [a["alarm_name"] for a in of_type(plan, "aws_cloudwatch_metric_alarm").values()]
        assert names and all(n.startswith("prod-triton-") for n in names)
    if scenario == "extras":
        assert plan["aws_ecs_task_definition.this"]["volume"] and "aws_iam_role_policy.task_exec[0]" in plan
    exporter_env = {
        e["name"]: e["value"]
        for c in json.loads(plan["aws_ecs_task_definition.this"]["container_definitions"])
        if c["name"] == "exporter"
        for e in c["environment"]
    }
    # The exporter starts with it (it refuses EXPORTER_OTLP_SEMCONV without an OTLP output), with what ECS adds.
    known = {"ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/c0ffee"}
    if "CONTROLLER_QUEUE_URL" in exporter_env:  # the queue's URL, known after apply
        known["CONTROLLER_QUEUE_URL"] = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/terraform-20250101"
    settings = load_settings([], exporter_env | known)
    assert settings.otlp_semconv == exporter_env.get("EXPORTER_OTLP_SEMCONV", "off")
    assert settings.otlp_semconv == ("genai" if scenario == "otlp-genai" else "off")
    # Task scale-in protection: the exporter's switch and the task role's statement, only in its scenario.
    protection = scenario == "task-protection"
    assert settings.task_protection == ("on" if protection else "off")
    assert ("aws_iam_role_policy.task_protection[0]" in plan) == protection
    # GPU drains: the exporter reports to the controller's queue. The controller, all of it, with drains or with
    # model sync (its fan-out), and only then; the drain grants and the report policy only with drains, the
    # fan-out's grants, variables and alarm only with model sync.
    drain = params.get("GpuFaultAction") == "drain"
    sync = bool(params.get("ModelSyncBucketName"))
    assert exporter_env["EXPORTER_GPU_FAULT_ACTION"] == ("drain" if drain else "report")
    assert ("CONTROLLER_QUEUE_URL" in exporter_env) == drain
    controller = set(a for a in plan if "controller" in a.split(".")[1])
    expected = set(CONTROLLER_RESOURCES) if drain or sync else set()
    rollouts = sync and params.get("CanaryFraction", "0") != "0"
    expected -= set() if drain or rollouts else {"aws_iam_role_policy.task_controller_report[0]"}
    expected |= {"aws_cloudwatch_metric_alarm.controller_fanout_failures[0]"} if sync else set()
    expected |= (
        {"aws_cloudwatch_metric_alarm.controller_rollout_crashes[0]",
         "aws_cloudwatch_metric_alarm.controller_rollout_state_repairs[0]"} if rollouts else set()
    )  # fmt: skip
    assert controller == expected
    if drain or sync:
        sids = {
            st["Sid"]: st for st in json.loads(plan["aws_iam_role_policy.controller_task[0]"]["policy"])["Statement"]
        }
        drains = {"DrainTheInstance", "CountTheInstances", "IsItStillInItsGroup"}
        fanout = {"MakeAndCheckTheTasksQueues", "RemoveStoppedTasksQueues", "ListTheTasksQueues",
                  "SubscribeTheTasksQueues", "TheTopicsSubscriptions", "PublishTheFleetSize"}  # fmt: skip
        assert (drains <= set(sids), drains.isdisjoint(sids)) == (drain, not drain)
        assert (fanout <= set(sids), fanout.isdisjoint(sids)) == (sync, not sync)
        assert ("ReplaceTheInstance" in sids) == (drain and scenario not in ("gpu-drain", "modelsync-drain"))
        (container,) = json.loads(plan["aws_ecs_task_definition.controller[0]"]["container_definitions"])
        env = {e["name"]: e["value"] for e in container["environment"]}
        assert ("CONTROLLER_TOPIC_ARN" in env) == sync
        # Rollouts: the controller decides with the deployment's settings; the daemon follows it.
        decides = {"DecideTheRollouts", "ReadTheRolledOutArtifacts", "ListTheModelPrefix", "CheckTheBucketIsVersioned"}
        assert (decides <= set(sids), decides.isdisjoint(sids)) == (rollouts, not rollouts)
        assert ("WasTheCanarysInstanceDraining" in sids) == (rollouts and not drain)
        assert env.get("CONTROLLER_ROLLOUTS") == ("on" if rollouts else None)
        if rollouts:
            assert {k: env[k] for k in env if k.startswith("CONTROLLER_") and k.split("_", 1)[1] in (
                "CANARY_FRACTION", "BAKE_SECONDS", "BAKE_MIN_REQUESTS", "MAX_FAILURE_INCREASE", "MAX_LATENCY_RATIO",
                "MAX_FAILURE_RATIO")} == {
                "CONTROLLER_CANARY_FRACTION": params["CanaryFraction"],
                "CONTROLLER_BAKE_SECONDS": params["BakeSeconds"],
                "CONTROLLER_BAKE_MIN_REQUESTS": params["BakeMinRequests"],
                "CONTROLLER_MAX_FAILURE_INCREASE": params["MaxFailureIncrease"],
                "CONTROLLER_MAX_LATENCY_RATIO": params["MaxLatencyRatio"],
                "CONTROLLER_MAX_FAILURE_RATIO": params["MaxFailureRatio"],
            }  # fmt: skip
            report = json.loads(plan["aws_iam_role_policy.task_controller_report[0]"]["policy"])["Statement"]
            assert [(s["Sid"], s["Action"], s["Resource"]) for s in report] == [
                ("ReportToTheController", "sqs:SendMessage", "<aws_sqs_queue.controller[0].arn>")
            ]
        if sync:
            assert env["CONTROLLER_TOPIC_ARN"] == "<aws_sns_topic.modelsync[0].arn>"
            assert env["CONTROLLER_SERVICE"] == plan["aws_ecs_service.this"]["name"]
    if drain:  # the cluster's tasks and instances; the group only where one is known
        assert exporter_env["CONTROLLER_QUEUE_URL"] == "<aws_sqs_queue.controller[0].url>"
        assert sids["DrainTheInstance"]["Resource"].endswith(f":container-instance/{params['ClusterName']}/*")
        report = json.loads(plan["aws_iam_role_policy.task_controller_report[0]"]["policy"])["Statement"]
        assert [(s["Action"], s["Resource"]) for s in report] == [
            ("sqs:SendMessage", "<aws_sqs_queue.controller[0].arn>")
        ]
    if scenario == "defaults":
        # Every alarm but model sync's four (no bucket: no sync-failure, version-skew or rollout alarm, no rules).
        specs = alarm_specs(Options(catalog=CATALOG))
        assert len(of_type(plan, "aws_cloudwatch_metric_alarm")) == len([s for s in specs if not s.condition])
        assert len(specs) - len([s for s in specs if not s.condition]) == 4
        assert not of_type(plan, "aws_cloudwatch_contributor_insight_rule")
        assert len(of_type(plan, "aws_appautoscaling_policy")) == len(SCALING_ACTIONS)  # the LLM one included
        assert not [a for a in plan if ".modelsync" in a]  # no bucket: none of the model sync
    if scenario.startswith("modelsync"):
        assert len([a for a in plan if "modelsync[0]" in a]) == len(MODELSYNC_RESOURCES) + 2  # + target, role policy
        assert len(of_type(plan, "aws_cloudwatch_contributor_insight_rule")) == 2
        assert "aws_cloudwatch_metric_alarm.model_version_skew[0]" in plan
        assert "aws_cloudwatch_metric_alarm.model_rollout_rejected[0]" in plan
        statements = json.loads(plan["aws_iam_role_policy.task_modelsync[0]"]["policy"])["Statement"]
        assert [st["Sid"] for st in statements] == ["ListThePrefix", "ReadArchives", "ReadItsTasksQueue"]  # no write
        containers = json.loads(plan["aws_ecs_task_definition.this"]["container_definitions"])
        daemon = {e["name"]: e["value"] for c in containers if c["name"] == "modelsync" for e in c["environment"]}
        assert not [k for k in daemon if k in ("MODELSYNC_CANARY_FRACTION", "MODELSYNC_BAKE_SECONDS")]
        on = scenario == "modelsync-rollouts"
        assert daemon.get("MODELSYNC_ROLLOUTS") == ("controller" if on else None)
        assert daemon.get("MODELSYNC_CONTROLLER_QUEUE_URL") == ("<aws_sqs_queue.controller[0].url>" if on else None)
        volumes = plan["aws_ecs_task_definition.this"]["volume"]  # the store and the task's repository replace it
        assert volumes == [
            {"name": "model-store", "host_path": params.get("ModelSyncHostPath", "/opt/triton-models")},
            {"name": "model-repository", "host_path": None},
        ]
    promql = [a for a in plan if ".promql_" in a]
    if scenario.startswith("otlp"):
        assert len(promql) == len(PROMQL) and "aws_iam_role_policy.task_otlp_metrics[0]" in plan
        exporter = next(
            c
            for c in json.loads(plan["aws_ecs_task_definition.this"]["container_definitions"])
            if c["name"] == "exporter"
        )
        output = next(e["value"] for e in exporter["environment"] if e["name"] == "EXPORTER_OUTPUT")
        assert output == f"tcp://127.0.0.1:25888 otlp+https://monitoring.{REGION}.amazonaws.com/v1/metrics"
    else:
        assert not promql and not [a for a in plan if "otlp" in a]
    tracing = [a for a in plan if "xray" in a]
    assert tracing == (["aws_iam_role_policy_attachment.task_xray[0]"] if scenario.startswith("tracing") else [])
    if "ModelBucketKmsKeyArn" in params:
        assert "aws_iam_role_policy.task_model_bucket_key[0]" in plan
    cluster = [a for a in plan if a.split(".")[0] in CLUSTER_TYPES and a not in tracing]
    if scenario.startswith("cluster"):  # the whole cluster, and the service on its capacity provider
        assert len(cluster) == len(CLUSTER_TYPES) + 1  # + the second managed policy
        svc = plan["aws_ecs_service.this"]
        assert svc["launch_type"] is None and len(svc["capacity_provider_strategy"]) == 1
        assert "aws_ecs_cluster_capacity_providers.this" in _source_text_of_depends_on()
    else:
        assert not cluster and plan["aws_ecs_service.this"]["launch_type"] == "EC2"


def tf_names(plan: dict[str, Any]) -> tuple[dict[str, set[str]], set[str]]:
    """The plan's names by the stack's resource types (test_stack.names_created's), and its dashboards' names."""
    types = {"AWS::CloudWatch::Alarm": "aws_cloudwatch_metric_alarm"}
    types |= {"AWS::ApplicationAutoScaling::ScalingPolicy": "aws_appautoscaling_policy"}
    types |= {"AWS::CloudWatch::InsightRule": "aws_cloudwatch_contributor_insight_rule"}
    names = {
        kind: {args[NAME_FIELDS[rtype]] for args in of_type(plan, rtype).values()} for kind, rtype in types.items()
    }
    return names, {args["dashboard_name"] for args in of_type(plan, "aws_cloudwatch_dashboard").values()}


def test_alarm_and_dashboard_names_are_one_per_deployment(template) -> None:
    """Issue 38: two deployments of the module in one account with the defaults create disjoint alarms, scaling
    policies, Contributor Insights rules and dashboards, named after each one's task family (<cluster>-<service>
    or task_family), as two stacks are after their names; an explicit alarm_name_prefix or dashboard_name wins.
    And the module names them as the stack does: a stack named as the module's family gives the same names."""
    every = VALUES | {"GpuFaultAction": "drain", "ModelSyncBucketName": "example-models", "CanaryFraction": "0.25"}
    every |= {"OtlpMetrics": "true"}
    (names_a, dash_a), (names_b, dash_b) = (
        tf_names(module_for(every).plan()),
        tf_names(module_for(every | {"ServiceName": "inference"}).plan()),
    )
    family = Module(TF, tf_inputs(every) | {"task_family": "team-llm"}, DATA)
    names_c, dash_c = tf_names(family.plan())
    for kind, a in names_a.items():
        assert a and len(a) == len(names_b[kind]) == len(names_c[kind]), kind
        assert a.isdisjoint(names_b[kind]) and a.isdisjoint(names_c[kind]) and names_b[kind].isdisjoint(names_c[kind])
        assert all(n.startswith("gpu-cluster-triton-") for n in a), kind
        suffixes = {n.removeprefix("gpu-cluster-triton-") for n in a}
        assert {n.removeprefix("gpu-cluster-inference-") for n in names_b[kind]} == suffixes, kind
        assert {n.removeprefix("team-llm-") for n in names_c[kind]} == suffixes, kind
    assert (dash_a, dash_b, dash_c) == ({"gpu-cluster-triton"}, {"gpu-cluster-inference"}, {"team-llm"})
    # The stack, named as the module's family, names every alarm, policy, rule and the dashboard alike.
    stack = Stack(template, **every)
    stack.pseudo = PSEUDO | {"AWS::StackName": "gpu-cluster-triton"}
    assert names_created(stack) == (names_a, dash_a)
    # Explicit values win, whatever the deployment; and agree with the stack's.
    named = {"AlarmNamePrefix": "prod-triton", "DashboardName": "Prod"}
    chosen = [tf_names(module_for(every | extra | named).plan()) for extra in ({}, {"ServiceName": "inference"})]
    assert chosen[0] == chosen[1] == names_created(Stack(template, **(every | named)))
    assert chosen[0][1] == {"Prod"}
    assert all(n.startswith("prod-triton-") for kind in chosen[0][0].values() for n in kind)
    # Empty by default, as the stack's parameters (test_every_stack_parameter_is_a_variable_with_its_default).
    assert [module_for(VALUES).var(v) for v in ("alarm_name_prefix", "dashboard_name")] == ["", ""]


def test_the_dashboard_with_the_defaults_is_the_committed_one() -> None:
    # The render's default namespace and alarm prefix (the module's defaults are the task family's).
    plan = module_for(VALUES | {"Namespace": "Triton", "AlarmNamePrefix": "triton"}).plan()
    body = json.loads(plan["aws_cloudwatch_dashboard.this[0]"]["dashboard_body"])
    # The sample account and region are the render defaults, so this is dashboards/triton.json itself.
    assert (Options(catalog=CATALOG).account_id, Options(catalog=CATALOG).region) == (ACCOUNT, REGION)
    assert body == json.loads((ROOT / "dashboards" / "triton.json").read_text())


def _copy_module(tmp: Path) -> Path:
    """The module with the files it reads, at the same relative places, to edit without touching the repository."""
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copytree(TF, tmp / "deploy" / "terraform")
    for name in (
        "task-definition.json",
        "task-definition-modelsync.json",
        "task-definition-controller.json",
        "user-data.sh",
    ):
        shutil.copy(ROOT / "deploy" / name, tmp / "deploy" / name)
    (tmp / "dashboards").mkdir()
    shutil.copy(ROOT / "dashboards" / "triton.json.tftpl", tmp / "dashboards" / "triton.json.tftpl")
    return tmp / "deploy" / "terraform"


# Edits to copies of the module and the files it reads, and the difference each must make. The model-sync
# ones are compared with model sync on and every parameter of it changed.
DRIFTS = [
    # A cluster from zero without create_cluster, where the stack creates none.
    (
        "cluster.tf",
        "count = local.create_cluster ? 1 : 0\n  name  = var.cluster_name",
        "count = 1\n  name  = var.cluster_name",
        "terraform creates aws_ecs_cluster.this[0]",
    ),
    ("main.tf", "deregistration_delay = 30", "deregistration_delay = 31", "target group.TargetGroupAttributes"),
    ("iam.tf", '"logs:PutRetentionPolicy", ', "", "TaskRole policies"),
    ("logs.tf", '"metrics", ', "", "log groups"),
    (
        "main.tf",
        "Namespace            = local.namespace",
        'Namespace            = "Triton"',
        "container exporter.environment",
    ),
    (
        "main.tf",
        'local.router.logConfiguration.options : key => value if key != "awslogs-create-group"',
        'local.router.logConfiguration.options : key => value if key != "x"',
        "container log_router.logConfiguration",
    ),
    ("../task-definition.json", '"retries": 5', '"retries": 4', "container triton-server.healthCheck"),
    ("alarms.tf.json", '"evaluation_periods": 15', '"evaluation_periods": 14', "alarm triton-scale-in"),
    (
        "alarms.tf.json",
        '"metric_interval_upper_bound": 0,',
        '"metric_interval_upper_bound": 5,',
        "scaling policy triton-scale-in",
    ),
    # The proportional scale-out's minimum of one task (issue 37).
    (
        "alarms.tf.json",
        '"min_adjustment_magnitude": 1',
        '"min_adjustment_magnitude": 2',
        "scaling policy triton-scale-out-excess",
    ),
    ("../../dashboards/triton.json.tftpl", '"period": 60', '"period": 300', "dashboards differ"),
    # The render's fixed default names, where the stack's are its own name (issue 38).
    (
        "main.tf",
        'alarm_name_prefix = var.alarm_name_prefix != "" ? var.alarm_name_prefix : local.family',
        'alarm_name_prefix = var.alarm_name_prefix != "" ? var.alarm_name_prefix : "triton"',
        "default alarm prefix: terraform names triton-",
    ),
    (
        "main.tf",
        'dashboard_name    = var.dashboard_name != "" ? var.dashboard_name : local.family',
        'dashboard_name    = var.dashboard_name != "" ? var.dashboard_name : "Triton"',
        "default dashboard name: terraform Triton",
    ),
    # The X-Ray policy attached without tracing, where the stack attaches none.
    (
        "tracing.tf",
        "count      = local.tracing ? 1 : 0",
        "count      = 1",
        "TaskRole.ManagedPolicyArns",
    ),
    # A model-sync resource created without a bucket, where the stack creates none.
    (
        "modelsync.tf",
        'count       = local.model_sync ? 1 : 0\n  description = "Object',
        'count       = 1\n  description = "Object',
        "terraform creates aws_cloudwatch_event_rule.modelsync[0]",
    ),
]
# The controller's resources (controller.tf and the Triton task role's report policy), none of which exists without it
# (and, with model sync, its fan-out's alarm).
CONTROLLER_RESOURCES = (
    *(
        f"aws_cloudwatch_metric_alarm.controller_{n}[0]"
        for n in ("drains_paused", "drain_failures", "not_running", "reports_refused", "state_failures")
    ),
    "aws_cloudwatch_log_group.controller[0]",
    "aws_ecs_service.controller[0]",
    "aws_ecs_task_definition.controller[0]",
    "aws_iam_role.controller_execution[0]",
    "aws_iam_role.controller_task[0]",
    "aws_iam_role_policy.controller_execution[0]",
    "aws_iam_role_policy.controller_task[0]",
    "aws_iam_role_policy.task_controller_report[0]",
    "aws_s3_bucket.controller_state[0]",
    *(f"{part}.controller_state[0]" for part in BUCKET_PARTS),
    "aws_s3_bucket_policy.controller_state[0]",
    "aws_sqs_queue.controller[0]",
    "aws_sqs_queue.controller_dead_letter[0]",
    "aws_sqs_queue_policy.controller[0]",
    "aws_sqs_queue_policy.controller_dead_letter[0]",
)
# The Terraform types of a cluster from zero (cluster.tf), none of which exists without create_cluster.
CLUSTER_TYPES = (
    "aws_ecs_cluster",
    "aws_ecs_capacity_provider",
    "aws_ecs_cluster_capacity_providers",
    "aws_autoscaling_group",
    "aws_launch_template",
    "aws_iam_instance_profile",
    "aws_iam_role_policy_attachment",
)


def _source_text_of_depends_on() -> str:
    """The service's depends_on as written (the evaluator does not evaluate meta-arguments)."""
    (block,) = [b for b in parse_directory(TF) if b.type == "resource" and b.labels == ["aws_ecs_service", "this"]]
    return _source_text(block.body.attrs["depends_on"])


MODELSYNC_DRIFTS = [
    ("modelsync.tf", 'Action    = "sns:Publish"', 'Action    = "sns:*"', "topic policy ModelSyncTopicPolicy"),
    (
        "main.tf",
        'lookup(v, "host", null) != null ? var.model_sync_host_path : null',
        'lookup(v, "host", null) != null ? "/opt/triton-models" : null',
        "task definition TaskDefinition.volumes",
    ),
    ("iam.tf", '"s3:GetObjectVersionTagging"]', '"s3:PutObject"]', "TaskRole policies"),
    ("iam.tf", '"${var.model_sync_prefix}*"', '"*"', "TaskRole policies"),
    ("iam.tf", '"sqs:GetQueueUrl", ', "", "TaskRole policies"),
    ("controller.tf", 'StringEquals = { "sns:Protocol" = "sqs" }', "", "ControllerTaskRole policies"),
    ("iam.tf", 'Sid      = "ModelSyncOwnLogs"', 'Sid      = "ModelSyncLogs"', "ExecutionRole policies"),
    ("modelsync.tf", "prefix = var.model_sync_prefix", 'prefix = ""', "event rule ModelSyncEventRule.EventPattern"),
    ("modelsync.tf", 'target_id = "modelsync-topic"', 'target_id = "topic"', "event rule ModelSyncEventRule.Targets"),
    (
        "main.tf",
        "MODELSYNC_TOPIC_ARN = one(aws_sns_topic.modelsync[*].arn)",
        'MODELSYNC_TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:other"',
        "container modelsync.environment",
    ),
    ("../task-definition-modelsync.json", '"stopTimeout": 30', '"stopTimeout": 60', "container modelsync.stopTimeout"),
    (
        "../task-definition-modelsync.json",
        '"condition": "HEALTHY"',
        '"condition": "START"',
        "container triton-server.dependsOn",
    ),
    (
        "../task-definition-modelsync.json",
        '"startTimeout": 900',
        '"startTimeout": 120',
        "container modelsync.startTimeout",
    ),
    (
        "../task-definition-modelsync.json",
        "--model-control-mode=explicit --load-model='*' ",
        "--model-control-mode=explicit ",
        "container triton-server.command",
    ),
    (
        "main.tf",
        "{ cpu = var.triton_cpu, memoryReservation = var.triton_memory }",
        "{ memoryReservation = var.triton_memory }",
        "container triton-server.cpu",
    ),
    (
        "main.tf",
        "{ cpu = var.triton_cpu, memoryReservation = var.triton_memory }",
        "{ cpu = var.triton_cpu }",
        "container triton-server.memoryReservation",
    ),
]
# Tracing, compared with its rate, the service name and the log prefix changed.
TRACING_DRIFTS = [
    ("tracing.tf", "rate=${var.trace_rate}", "rate=1000", "container triton-server.command"),
    ("tracing.tf", "service.name=${var.service_name}", "service.name=triton", "container triton-server.command"),
    ("tracing.tf", "level=TIMESTAMPS", "level=OFF", "container triton-server.command"),
    ("tracing.tf", '"EXPORTER_TRACES_LOG_GROUPS"', '"EXPORTER_TRACE_LOG_GROUPS"', "container exporter.environment"),
    ("tracing.tf", '["exporter"].name', '["server"].name', "container exporter.environment"),
    ("tracing.tf", "policy/AWSXrayWriteOnlyAccess", "policy/AWSXrayFullAccess", "TaskRole.ManagedPolicyArns"),
    ("tracing.tf", "count      = local.tracing ? 1 : 0", "count      = 0", "TaskRole.ManagedPolicyArns"),
    ("main.tf", "lookup(local.added_environment, c.name, []),", "[],", "container exporter.environment"),
]
# A cluster from zero, compared with every parameter of it changed.
OTLP_DRIFTS = [
    ("otlp.tf", "/v1/metrics", "/v1/metric", "container exporter.environment"),
    ("otlp.tf", "${local.exporter_file_output} otlp+", "otlp+", "container exporter.environment"),
    ("otlp.tf", 'Action = "cloudwatch:PutMetricData"', 'Action = "cloudwatch:PutMetricStream"', "TaskRole policies"),
    ("otlp.tf", "count = local.otlp_metrics ? 1 : 0", "count = 0", "TaskRole policies"),
    (
        "otlp.tf",
        '"EXPORTER_OTLP_SEMCONV", value = var.otlp_semconv',
        '"EXPORTER_SEMCONV", value = "genai"',
        "container exporter.environment",
    ),
    (
        "main.tf",
        "concat(local.tracing_environment, local.otlp_semconv_environment, local.controller_report_environment,",
        "concat(local.tracing_environment, local.controller_report_environment,",
        "container exporter.environment",
    ),
    ("alarms.tf.json", '"pending_period": 600', '"pending_period": 60', "alarm prod-triton-promql-gpu-memory-high"),
    (
        "alarms.tf.json",
        "increase(nv_inference_request_failure[5m])",
        "increase(nv_inference_request_failure[1m])",
        "alarm prod-triton-promql-model-failures",
    ),
]
# The controller's fan-out (model sync with GPU drains and a customer managed key): each edit of its grants, its
# variables, the daemon's switch or the Triton task role's queue grant is a difference.
FANOUT_DRIFTS = [
    (
        "controller.tf",
        '"sqs:ListQueueTags", "sqs:GetQueueUrl"]',
        '"sqs:ListQueueTags", "sqs:GetQueueUrl", "sqs:SendMessage"]',
        "ControllerTaskRole policies",
    ),
    ("controller.tf", '.modelsync/fleet.json"', '.modelsync/*"', "ControllerTaskRole policies"),
    ("controller.tf", 'Action    = "kms:GenerateDataKey"', 'Action = "kms:*"', "ControllerTaskRole policies"),
    ("controller.tf", 'Sid       = "EncryptTheFleetSize"', 'Sid = "Encrypt"', "ControllerTaskRole policies"),
    ("controller.tf", "CONTROLLER_TOPIC_ARN    = one(", "CONTROLLER_TOPIC = one(", "container controller.environment"),
    ("controller.tf", "if local.model_sync || !contains", "if !contains", "container controller.environment"),
    ("controller.tf", "ServiceName           = var.service_name", 'ServiceName = "triton"',
     "container controller.environment"),
    ("controller.tf", "count               = local.model_sync ? 1 : 0", "count = 0", "alarms"),
    ("iam.tf", '"sqs:ReceiveMessage", "sqs:DeleteMessage"]', '"sqs:ReceiveMessage", "sqs:DeleteMessage", '
     '"sqs:CreateQueue"]', "TaskRole policies"),
    ("../task-definition-modelsync.json", '"MODELSYNC_FANOUT", "value": "controller"',
     '"MODELSYNC_FANOUT", "value": "self"', "container modelsync.environment"),
    ("../task-definition-controller.json", '"CONTROLLER_PREFIX", "value": "${ModelSyncPrefix}"',
     '"CONTROLLER_PREFIX", "value": ""', "container controller.environment"),
]  # fmt: skip
# GPU drains and the fleet's controller, compared on a cluster from zero (its own group) and on an existing one
# with a group named: each edit of the module (or of the controller's task definition file) is a difference.
GPU_DRAIN_DRIFTS = [
    (
        "controller.tf",
        'Action   = "autoscaling:SetInstanceHealth"',
        'Action = "autoscaling:*"',
        "ControllerTaskRole policies",
    ),
    ("gpufaults.tf", "count = local.gpu_drain || local.rollouts ? 1 : 0", "count = 0", "TaskRole policies"),
    ("gpufaults.tf", 'Action   = "sqs:SendMessage"', 'Action = "sqs:*"', "TaskRole policies"),
    ("controller.tf", "task/${var.cluster_name}/*", "task/*", "ControllerTaskRole policies"),
    (
        "controller.tf",
        'Condition = { ArnEquals = { "ecs:cluster" = local.cluster_arn } }',
        "",
        "ControllerTaskRole policies",
    ),
    (
        "controller.tf",
        'Action   = ["s3:GetObject", "s3:PutObject"]',
        'Action   = ["s3:*"]',
        "ControllerTaskRole policies",
    ),
    ("controller.tf", 'Sid      = "EcrPullTheExporterImage"', 'Sid = "EcrPull"', "ControllerExecutionRole policies"),
    ("gpufaults.tf", "EXPORTER_GPU_FAULT_ACTION = var", "EXPORTER_GPU_FAULT_ACTIONS = var", "container exporter"),
    ("gpufaults.tf", 'name = "CONTROLLER_QUEUE_URL"', 'name = "CONTROLLER_QUEUE"', "container exporter.environment"),
    ("controller.tf", "visibility_timeout_seconds = 120", "visibility_timeout_seconds = 30", "queue ControllerQueue"),
    ("controller.tf", "maxReceiveCount     = 10", "maxReceiveCount = 3", "queue ControllerQueue.RedrivePolicy"),
    (
        "controller.tf",
        "sqs_managed_sse_enabled   = true",
        "sqs_managed_sse_enabled = false",
        "queue ControllerDeadLetter",
    ),
    (
        "controller.tf",
        '== "" ? aws_iam_role.task.arn :',
        '== "" ? "*" :',
        "queue policy ControllerQueuePolicy",
    ),
    (
        "controller.tf",
        'status = "Enabled"\n  }',
        'status = "Suspended"\n  }',
        "bucket ControllerStateBucket.VersioningConfiguration",
    ),
    (
        "controller.tf",
        "restrict_public_buckets = true",
        "restrict_public_buckets = false",
        "bucket ControllerStateBucket.PublicAccess",
    ),
    (
        "controller.tf",
        'sse_algorithm = "AES256"',
        'sse_algorithm = "aws:kms"',
        "bucket ControllerStateBucket.BucketEncryption",
    ),
    (
        "controller.tf",
        "noncurrent_days = 7",
        "noncurrent_days = 30",
        "bucket ControllerStateBucket.LifecycleConfiguration",
    ),
    (
        "controller.tf",
        'object_ownership = "BucketOwnerEnforced"',
        'object_ownership = "ObjectWriter"',
        "bucket ControllerStateBucket.Ownership",
    ),
    (
        "controller.tf",
        '"${aws_s3_bucket.controller_state[0].arn}/*"]',
        "]",
        "bucket policy ControllerStateBucketPolicy",
    ),
    (
        "controller.tf",
        "deployment_maximum_percent         = 100",
        "deployment_maximum_percent = 200",
        "service ControllerService.Deployment",
    ),
    (
        "controller.tf",
        'launch_type                        = "FARGATE"',
        'launch_type = "EC2"',
        "service ControllerService.LaunchType",
    ),
    (
        "controller.tf",
        "desired_count                      = 1",
        "desired_count = 2",
        "service ControllerService.DesiredCount",
    ),
    ("controller.tf", "image = var.exporter_image", "image = var.triton_image", "container controller.image"),
    ("controller.tf", "CONTROLLER_STATE_BUCKET = one(", "CONTROLLER_STATE = one(", "container controller.environment"),
    (
        "../task-definition-controller.json",
        '"memory": "512"',
        '"memory": "1024"',
        "task definition ControllerTaskDefinition.memory",
    ),
    (
        "../task-definition-controller.json",
        '"readonlyRootFilesystem": true',
        '"readonlyRootFilesystem": false',
        "container controller.readonlyRootFilesystem",
    ),
    ("../task-definition-controller.json", '"user": "10001:10001"', '"user": "0:0"', "container controller.user"),
    ("controller.tf", 'name              = "${var.log_group_prefix}/controller"', 'name = "/controller"', "log groups"),
    (
        "controller.tf",
        'treat_missing_data  = "breaching"',
        'treat_missing_data = "missing"',
        "alarm prod-triton-controller-not-running",
    ),
    ("controller.tf", "threshold           = 3", "threshold = 5", "alarm prod-triton-controller-state-failures"),
    (
        "controller.tf",
        'metric_name         = "GpuDrainsPaused"',
        'metric_name = "GpuDrainPaused"',
        "alarm prod-triton-gpu-drains-paused",
    ),
    (
        "controller.tf",
        "dimensions          = { cluster = var.cluster_name }",
        "dimensions = {}",
        "alarm prod-triton-gpu-drain",
    ),
]
CLUSTER_DRIFTS = [
    (
        "cluster.tf",
        'http_tokens                 = "required"',
        'http_tokens = "optional"',
        "launch template LaunchTemplate",
    ),
    (
        "cluster.tf",
        "volume_size           = var.root_volume_size",
        "volume_size = 30",
        "launch template LaunchTemplate",
    ),
    (
        "cluster.tf",
        "ModelStorePath = var.model_sync_host_path",
        'ModelStorePath = "/opt/triton-models"',
        "launch template LaunchTemplate.UserData",
    ),
    (
        "../user-data.sh",
        "ECS_AWSVPC_BLOCK_IMDS=true",
        "ECS_AWSVPC_BLOCK_IMDS=false",
        "launch template LaunchTemplate.UserData",
    ),
    ("../user-data.sh", "mkfs.xfs -q -K", "mkfs.ext4 -q", "launch template LaunchTemplate.UserData"),
    (
        "cluster.tf",
        "protect_from_scale_in = true",
        "protect_from_scale_in = false",
        "auto scaling group AutoScalingGroup",
    ),
    ("cluster.tf", "force_delete = true", "force_delete = false", "aws_autoscaling_group.gpu[0]: force_delete"),
    (
        "cluster.tf",
        'key                 = "AmazonECSManaged"',
        'key = "ManagedByEcs"',
        "auto scaling group AutoScalingGroup.Tags",
    ),
    ("cluster.tf", "target_capacity = 100", "target_capacity = 90", "capacity provider CapacityProvider"),
    (
        "cluster.tf",
        'managed_termination_protection = "ENABLED"',
        'managed_termination_protection = "DISABLED"',
        "capacity provider CapacityProvider",
    ),
    ("cluster.tf", "weight            = 1", "weight = 2", "capacity provider associations ClusterCapacityProviders"),
    (
        "cluster.tf",
        '    "arn:${local.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore",\n',
        "",
        "InstanceRole.ManagedPolicyArns",
    ),
    (
        "main.tf",
        'launch_type                        = local.create_cluster ? null : "EC2"',
        'launch_type = "EC2"',
        "service Service.LaunchType",
    ),
    ("main.tf", "weight            = 1", "weight = 3", "service Service.CapacityProviderStrategy"),
]


@pytest.mark.parametrize(
    ("scenario", "path", "old", "new", "expect"),
    [("renamed", *d) for d in DRIFTS]
    + [("modelsync-renamed", *d) for d in MODELSYNC_DRIFTS]
    + [("cluster-renamed", *d) for d in CLUSTER_DRIFTS]
    + [("tracing-renamed", *d) for d in TRACING_DRIFTS]
    + [("otlp-renamed", *d) for d in OTLP_DRIFTS if "semconv" not in d[1]]
    + [("otlp-genai", *d) for d in OTLP_DRIFTS if "semconv" in d[1]]
    + [
        (
            "genai-without-otlp",
            "otlp.tf",
            "if local.otlp_metrics && var.otlp_semconv",
            "if var.otlp_semconv",
            "container exporter.environment",
        )
    ]
    + [(scenario, *d) for d in GPU_DRAIN_DRIFTS for scenario in ("cluster-gpu-drain", "gpu-drain-group")]
    + [("modelsync-drain", *d) for d in FANOUT_DRIFTS]
    + [
        (  # the controller's alarms without the deployment's default prefix
            "gpu-drain",
            "controller.tf",
            '"${local.alarm_name_prefix}-gpu-drains-paused"',
            '"${var.alarm_name_prefix}-gpu-drains-paused"',
            "default alarm prefix: terraform names -gpu-drains-paused",
        )
    ],
)
def test_a_drifted_module_fails_the_comparison(
    template, alarms_template, tmp_path: Path, scenario: str, path: str, old: str, new: str, expect: str
) -> None:
    module_dir = _copy_module(tmp_path)
    target = (module_dir / path).resolve()
    text = target.read_text()
    assert old in text, (path, old)
    target.write_text(text.replace(old, new, 1))
    params = VALUES | SCENARIOS["renamed"] | SCENARIOS[scenario]
    stack, nested = stacks_for(template, alarms_template, params)
    assert differences(stack, nested, module_for(params, _copy_module(tmp_path / "clean")).plan()) == []
    diffs = differences(stack, nested, module_for(params, module_dir).plan())
    assert any(d.startswith(expect) for d in diffs), diffs


def test_a_drifted_stack_fails_the_comparison(template, alarms_template) -> None:
    plan = module_for(VALUES).plan()
    t = copy.deepcopy(template)
    t["Resources"]["TaskRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"][0]["Action"].append(
        "logs:DescribeLogGroups"
    )
    t["Resources"]["Service"]["Properties"]["PlacementConstraints"] = [{"Type": "distinctInstance"}]
    t["Resources"]["Queue"] = {"Type": "AWS::SQS::Queue", "Properties": {}}
    a = copy.deepcopy(alarms_template)
    a["Resources"]["AlarmExporterHeartbeatMissing"]["Properties"]["Threshold"] = 2.0
    stack, nested = stacks_for(t, a, VALUES)
    diffs = differences(stack, nested, plan)
    assert any(d.startswith("TaskRole policies") for d in diffs), diffs
    assert any("PlacementConstraints" in d for d in diffs), diffs
    assert any("Queue (AWS::SQS::Queue) has no Terraform counterpart" in d for d in diffs), diffs
    assert any(d.startswith("alarm triton-exporter-heartbeat-missing.Threshold") for d in diffs), diffs
    # The empty alarm prefix and dashboard name passed on as they are, not as the stack's name.
    t = copy.deepcopy(template)
    passed = t["Resources"]["Alarms"]["Properties"]["Parameters"]
    passed |= {"AlarmNamePrefix": {"Ref": "AlarmNamePrefix"}, "DashboardName": {"Ref": "DashboardName"}}
    stack, nested = stacks_for(t, alarms_template, VALUES)
    diffs = differences(stack, nested, plan)
    assert any(d.startswith("alarms: stack ['-exporter-heartbeat-missing'") for d in diffs), diffs
    assert any(d.startswith("scaling policies: stack ['-scale-in'") for d in diffs), diffs
    assert "dashboards differ: stack [''], terraform ['triton']" in diffs, diffs


def test_a_drifted_stack_fails_the_comparison_with_model_sync(template, alarms_template) -> None:
    params = VALUES | SCENARIOS["modelsync-renamed"]
    plan = module_for(params).plan()
    t = copy.deepcopy(template)
    t["Resources"]["ModelSyncTopic"]["Properties"] = {"FifoTopic": True}
    containers = t["Resources"]["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    (daemon,) = [
        c for c in containers if isinstance(c, dict) and "Fn::If" in c and c["Fn::If"][1]["Name"] == "modelsync"
    ]
    daemon["Fn::If"][1]["Cpu"] = 512
    stack, nested = stacks_for(t, alarms_template, params)
    diffs = differences(stack, nested, plan)
    assert any(d.startswith("topic ModelSyncTopic.FifoTopic") for d in diffs), diffs
    assert any(d.startswith("container modelsync.cpu") for d in diffs), diffs
    # A resource the stack creates without a bucket, where the module creates none.
    t = copy.deepcopy(template)
    del t["Resources"]["ModelSyncEventRule"]["Condition"]
    stack, nested = stacks_for(t, alarms_template, VALUES)
    diffs = differences(stack, nested, module_for(VALUES).plan())
    assert any(
        d.startswith("stack resource ModelSyncEventRule (AWS::Events::Rule) exists; terraform plan has no")
        for d in diffs
    ), diffs


def test_a_drifted_stack_fails_the_comparison_with_a_cluster(template, alarms_template) -> None:
    params = VALUES | SCENARIOS["cluster-renamed"]
    plan = module_for(params).plan()
    t = copy.deepcopy(template)
    t["Resources"]["AutoScalingGroup"]["Properties"]["MaxSize"] = 10
    t["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] = "optional"
    t["Resources"]["Service"]["Properties"]["LaunchType"] = "EC2"
    t["Resources"]["InstanceRole"]["Properties"]["ManagedPolicyArns"].pop()
    t["Resources"]["LifecycleHook"] = {"Type": "AWS::AutoScaling::LifecycleHook", "Condition": "CreatesCluster"}
    stack, nested = stacks_for(t, alarms_template, params)
    diffs = differences(stack, nested, plan)
    assert any(d.startswith("auto scaling group AutoScalingGroup.MaxSize") for d in diffs), diffs
    assert any(d.startswith("launch template LaunchTemplate.LaunchTemplateData.MetadataOptions") for d in diffs), diffs
    assert any(d.startswith("service Service.LaunchType") for d in diffs), diffs
    assert any(d.startswith("InstanceRole.ManagedPolicyArns") for d in diffs), diffs
    assert any("LifecycleHook (AWS::AutoScaling::LifecycleHook) has no Terraform counterpart" in d for d in diffs), (
        diffs
    )
    # The stack's user data, one line changed: the copy of deploy/user-data.sh drifted.
    t = copy.deepcopy(template)
    data = t["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    data["UserData"]["Fn::Base64"]["Fn::Sub"][0] = data["UserData"]["Fn::Base64"]["Fn::Sub"][0].replace(
        "mountpoint -q", "grep -qs"
    )
    stack, nested = stacks_for(t, alarms_template, params)
    diffs = differences(stack, nested, plan)
    assert any(d.startswith("launch template LaunchTemplate.UserData: line ") for d in diffs), diffs
    # The cluster created without CreateCluster, where the module creates none.
    t = copy.deepcopy(template)
    del t["Resources"]["Cluster"]["Condition"]
    stack, nested = stacks_for(t, alarms_template, VALUES)
    diffs = differences(stack, nested, module_for(VALUES).plan())
    assert any(
        d.startswith("stack resource Cluster (AWS::ECS::Cluster) exists; terraform plan has no aws_ecs_cluster.this[0]")
        for d in diffs
    ), diffs


def test_a_drifted_stack_fails_the_comparison_with_the_controller(template, alarms_template) -> None:
    params = VALUES | SCENARIOS["gpu-drain-group"]
    plan = module_for(params).plan()
    t = copy.deepcopy(template)
    r = t["Resources"]
    r["ControllerQueue"]["Properties"]["RedrivePolicy"]["maxReceiveCount"] = 5
    r["ControllerStateBucket"]["Properties"]["VersioningConfiguration"]["Status"] = "Suspended"
    r["ControllerStateBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"][0]["Action"] = "s3:GetObject"
    r["ControllerQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"].pop()
    r["ControllerService"]["Properties"]["DeploymentConfiguration"]["MinimumHealthyPercent"] = 100
    r["ControllerTaskDefinition"]["Properties"]["Cpu"] = "512"
    r["ControllerAlarmNotRunning"]["Properties"]["EvaluationPeriods"] = 3
    r["ControllerTaskRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"][0]["Action"].append(
        "sqs:PurgeQueue"
    )
    stack, nested = stacks_for(t, alarms_template, params)
    diffs = differences(stack, nested, plan)
    for expect in (
        "queue ControllerQueue.RedrivePolicy",
        "bucket ControllerStateBucket.VersioningConfiguration",
        "bucket policy ControllerStateBucketPolicy",
        "queue policy ControllerQueuePolicy",
        "service ControllerService.DeploymentConfiguration",
        "task definition ControllerTaskDefinition.cpu",
        "alarm prod-triton-controller-not-running.EvaluationPeriods",
        "ControllerTaskRole policies",
    ):
        assert any(d.startswith(expect) for d in diffs), (expect, diffs)
    # The controller deployed without drain, where the module deploys none.
    t = copy.deepcopy(template)
    del t["Resources"]["ControllerQueue"]["Condition"]
    stack, nested = stacks_for(t, alarms_template, VALUES)
    diffs = differences(stack, nested, module_for(VALUES).plan())
    assert any(
        d.startswith("stack resource ControllerQueue (AWS::SQS::Queue) exists; terraform plan has no") for d in diffs
    )


def test_a_rich_render_is_the_same_in_both(tmp_path: Path) -> None:
    """Named models (classic alarms with a model dimension, hostile names), a topic, another namespace:
    the Terraform render and the CloudFormation render of the same options still agree."""
    from tests.unit.render.test_render import RICH

    files = render(RICH)
    module_dir = _copy_module(tmp_path)
    for rel in (tfrender.ALARMS_FILE, tfrender.DASHBOARD_FILE):
        (tmp_path / rel).write_text(files[rel])
    alarms_template = json.loads(files["alarms/triton-alarms.template.json"])
    nested = Stack(alarms_template)  # every parameter at its default: the render options
    params = {
        k: v["Default"]
        for k, v in alarms_template["Parameters"].items()
        if tfrender.variable_name(k) in variables(module_dir)
    }
    params |= {k: v for k, v in VALUES.items() if k not in params}
    params["ModelSyncBucketName"] = "example-models"  # the template's ModelSync defaults to "true"
    plan = module_for({k: str(v) for k, v in params.items()}, module_dir).plan()
    # Model sync runs the controller (its fan-out), whose alarms are controller.tf's, not the render's: the main
    # stack's Controller* alarms, compared in test_module_and_stack_describe_the_same_deployment. Every alarm
    # of the render is still compared here, and nothing else is dropped.
    own = {a for a in plan if a.startswith("aws_cloudwatch_metric_alarm.controller_")}
    assert own and all(a.split(".")[1].split("[")[0] in CONTROLLER_ALARMS for a in own), own
    plan = {a: v for a, v in plan.items() if a not in own}
    assert differences_nested(nested, plan) == []
    dims = [a.get("dimensions") for a in of_type(plan, "aws_cloudwatch_metric_alarm").values()]
    assert {"model": "m@x.v2+b"} in dims  # the per-model alarms came through with their dimension


# controller.tf's own alarms (deploy/stack.yaml's Controller* alarms), outside the render's alarms.tf.json.
CONTROLLER_ALARMS = {
    "controller_drains_paused",
    "controller_drain_failures",
    "controller_not_running",
    "controller_reports_refused",
    "controller_state_failures",
    "controller_fanout_failures",
    "controller_rollout_crashes",
    "controller_rollout_state_repairs",
}


def differences_nested(nested: Stack, plan: dict[str, Any]) -> list[str]:
    return [d for fn in dict.fromkeys(NESTED.values()) for d in fn(nested, plan)]


# --- variables against parameters ------------------------------------------------------------


def test_every_stack_parameter_is_a_variable_with_its_default(template) -> None:
    decl = variables()
    names = {tfrender.variable_name(p): p for p in template["Parameters"]}
    assert set(decl) - TF_ONLY == set(names), set(decl) - TF_ONLY ^ set(names)
    m = module_for(VALUES)
    for var, param in names.items():
        p = template["Parameters"][param]
        if "Default" not in p:
            assert "default" not in decl[var].body.attrs, f"{var} has a default; the stack's {param} has none"
            continue
        expected = tf_value(_type(decl[var]), str(p["Default"]) if not isinstance(p["Default"], str) else p["Default"])
        assert Module(TF, tf_inputs({k: v for k, v in VALUES.items() if k != param}), DATA).var(var) == expected, var
    assert m.var("log_group_prefix") == "/ecs/triton"


def _cfn_accepts(p: dict[str, Any], value: str) -> bool:
    if p["Type"] == "Number":
        if not _NUMBER.fullmatch(value):
            return False
        number = float(value)
        if ("MinValue" in p and number < float(p["MinValue"])) or ("MaxValue" in p and number > float(p["MaxValue"])):
            return False
    if "AllowedValues" in p and value not in [str(v) for v in p["AllowedValues"]]:
        return False
    if "AllowedPattern" in p and not re.fullmatch(p["AllowedPattern"], value):
        return False
    too_short = "MinLength" in p and len(value) < p["MinLength"]
    return not (too_short or ("MaxLength" in p and len(value) > p["MaxLength"]))


def _probes(name: str, p: dict[str, Any]) -> list[str]:
    out = {str(p.get("Default", VALUES.get(name, ""))), VALUES.get(name, "x")}
    for bound in ("MinValue", "MaxValue"):
        if bound in p:
            b = float(p[bound])
            out |= {f"{b:g}", f"{b - 1:g}", f"{b + 1:g}", f"{b - 0.5:g}", f"{b + 0.5:g}"}
    out |= {str(v) for v in p.get("AllowedValues", [])} | ({"nope", "0", "True"} if "AllowedValues" in p else set())
    if "AllowedPattern" in p or "MinLength" in p:
        out |= {
            "",
            "x",
            "a b",
            "/ecs/triton/",
            "/ecs/triton",
            "models",  # a prefix that is no folder: refused, so no grant on models* reaches models-private/
            f"arn:aws:iam::{ACCOUNT}:role/ml-release",
            f"arn:aws:iam::{ACCOUNT}:user/someone",
            "0",
            "0.0",
            "0.000000",
            "0.000001",
            "0.0000001",
            "0.5",  # the controller's ratios: above 0, below 1
            "1",
            "1.0",
            "1.000",
            "1.001",
            "1.5",
            "2",
            "999.999",
            "1000",  # its latency factor: above 1
            "--log-verbose=1 --model-load-thread-count=8",  # Triton's flags: taken
            "--allow-sagemaker=true",  # flags that reopen the admin API or that the deployment owns: refused
            "--http-restricted-api=trace:k=v",
            "--log-verbose=1; id",  # what the shell would run
            "--x=$(id)",
            "models/",
            "A" * 300,
            "Prod/Triton",
            "é",
            "gpu cluster",
            "nvcr.io/nvidia/tritonserver:24.10-py3",
            f"{REGISTRY}/repo:tag",
            f"{REGISTRY}/Repo:tag",
            f"{REGISTRY}/repo@sha256:{'a' * 64}",
            f"{REGISTRY}/repo",
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:listener/app/x/1/2",
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/app/x/1",
        }
    return sorted(out)


def test_variables_accept_and_refuse_what_the_stack_does(template) -> None:
    checked = 0
    for name, p in template["Parameters"].items():
        if not set(p) & {"AllowedPattern", "AllowedValues", "MinValue", "MaxValue", "MinLength", "MaxLength"}:
            continue
        for probe in _probes(name, p):
            if p["Type"].startswith("List<"):
                continue
            try:
                module_for(VALUES | {name: probe})
                tf_ok = True
            except ValidationFailed:
                tf_ok = False
            expected = _cfn_accepts(p, probe)
            if _type(variables()[tfrender.variable_name(name)]) == "bool" and probe in ("1", "0"):
                # Terraform converts the strings "1" and "0" to a bool (cty/convert) before any validation
                # runs; the stack's AllowedValues refuse them. A difference of the tools, not of the module.
                expected = True
            assert tf_ok == expected, (name, probe, "terraform accepts" if tf_ok else "terraform refuses")
            checked += 1
    assert checked > 100


def test_evaluator_refuses_what_terraform_would(tmp_path: Path) -> None:
    """Guards for the evaluator itself: a missing required variable, an unknown one, a typo'd reference."""
    with pytest.raises(TfError, match=r"var\.cluster_name is required"):
        module_for({k: v for k, v in VALUES.items() if k != "ClusterName"})
    with pytest.raises(TfError, match="no variable declared"):
        Module(TF, tf_inputs(VALUES) | {"colour": "blue"}, DATA)
    module_dir = _copy_module(tmp_path)
    (module_dir / "typo.tf").write_text('output "x" {\n  value = aws_iam_role.taks.arn\n}\n')
    with pytest.raises(TfError, match=r"aws_iam_role\.taks is not declared"):
        module_for(VALUES, module_dir).outputs()
    (module_dir / "typo.tf").write_text('output "x" {\n  value = cidrsubnet("10.0.0.0/16", 8, 1)\n}\n')
    with pytest.raises(TfError, match="not implemented"):
        module_for(VALUES, module_dir).outputs()
    (module_dir / "typo.tf").write_text('output "x" {\n  value = replace("a1", "/[0-9]/", "")\n}\n')
    with pytest.raises(TfError, match="regular expression"):  # Terraform's regex form: refused, not taken literally
        module_for(VALUES, module_dir).outputs()
    (module_dir / "typo.tf").write_text('output "x" {\n  value = replace("a/1/", "/1/", "")\n}\n')
    with pytest.raises(TfError, match="regular expression"):
        module_for(VALUES, module_dir).outputs()
    (module_dir / "typo.tf").write_text('output "x" {\n  value = replace("a.b.c", ".", "-")\n}\n')
    assert module_for(VALUES, module_dir).outputs()["x"] == "a-b-c"


# --- the example root module -----------------------------------------------------------------


def test_example_root_module_plans_with_its_tfvars() -> None:
    values = hcl(EXAMPLES / "terraform.tfvars.example")
    root = Module(EXAMPLES, values, DATA)
    plan = root.plan()
    svc = plan["module.triton.aws_ecs_service.this"]
    assert svc["cluster"] == "my-gpu-cluster" and svc["name"] == "triton"
    td = plan["module.triton.aws_ecs_task_definition.this"]
    containers = {c["name"]: c for c in json.loads(td["container_definitions"])}
    assert containers["exporter"]["image"] == f"{REGISTRY}/triton-emf-exporter:0.1.0"
    assert "module.triton.aws_iam_role_policy.task_model_bucket[0]" in plan
    outputs = root.outputs()
    assert outputs["log_groups"]["metrics"] == "/ecs/triton/metrics"
    # No alarm prefix or dashboard name given: the task family's, <cluster>-<service>, one per deployment.
    assert outputs["alarm_names"]["exporter-heartbeat-missing"] == "my-gpu-cluster-triton-exporter-heartbeat-missing"
    assert outputs["dashboard_name"] == td["family"] == "my-gpu-cluster-triton"
    alarm = plan["module.triton.aws_cloudwatch_metric_alarm.exporter_heartbeat_missing"]
    assert alarm["alarm_actions"] == [values["alarm_topic_arn"]]
    assert not [a for a in plan if "modelsync" in a] and outputs["model_sync_topic_arn"] is None


def test_example_root_module_with_model_sync_uncommented() -> None:
    text = (EXAMPLES / "terraform.tfvars.example").read_text()
    line = re.search(r"^# (model_sync_bucket\s*=.*)$", text, re.M)
    assert line, "terraform.tfvars.example shows no model_sync_bucket line to uncomment"
    root = Module(EXAMPLES, hcl(EXAMPLES / "terraform.tfvars.example") | hcl(line.group(1) + "\n"), DATA)
    plan = root.plan()
    assert "module.triton.aws_sns_topic.modelsync[0]" in plan
    rule = json.loads(plan["module.triton.aws_cloudwatch_event_rule.modelsync[0]"]["event_pattern"])
    assert rule["detail"] == {"bucket": {"name": ["my-models"]}, "object": {"key": [{"prefix": "triton/"}]}}
    containers = {
        c["name"]: c for c in json.loads(plan["module.triton.aws_ecs_task_definition.this"]["container_definitions"])
    }
    assert "--model-control-mode=explicit" in containers["triton-server"]["command"][-1]
    assert "modelsync" in containers
    # The evaluator names an unknown by its address inside the module.
    assert root.outputs()["model_sync_topic_arn"] == Unknown("aws_sns_topic.modelsync[0].arn")


def test_example_root_module_with_a_cluster_from_zero_uncommented() -> None:
    text = (EXAMPLES / "terraform.tfvars.example").read_text()
    line = re.search(r"^# (create_cluster\s*=.*)$", text, re.M)
    assert line, "terraform.tfvars.example shows no create_cluster line to uncomment"
    root = Module(EXAMPLES, hcl(EXAMPLES / "terraform.tfvars.example") | hcl(line.group(1) + "\n"), DATA)
    plan = root.plan()
    asg = plan["module.triton.aws_autoscaling_group.gpu[0]"]
    assert asg["vpc_zone_identifier"] == hcl(EXAMPLES / "terraform.tfvars.example")["subnet_ids"]
    svc = plan["module.triton.aws_ecs_service.this"]
    assert svc["cluster"] == "my-gpu-cluster" and svc["launch_type"] is None
    assert root.outputs()["capacity_provider_name"] == "gpu-my-gpu-cluster-triton"
    assert (
        Module(EXAMPLES, hcl(EXAMPLES / "terraform.tfvars.example"), DATA).outputs()["capacity_provider_name"] is None
    )


# --- documentation and checkov ---------------------------------------------------------------


def test_docs_say_terraform_was_not_run_here() -> None:
    """docs/deploy.md gives the commands; it and the README's deploy summary say validate and plan never ran."""
    guide = (ROOT / "docs" / "deploy.md").read_text()
    assert "terraform init" in guide and "terraform plan" in guide and "terraform apply" in guide
    for doc in (ROOT / "README.md", ROOT / "docs" / "deploy.md"):
        text = doc.read_text()
        assert re.search(r"`terraform validate`.{0,40}`plan`.{0,80}not (been )?run", text, re.S), doc.name


def test_the_provider_constraint_admits_only_what_the_module_uses() -> None:
    """data.aws_region's `region` attribute exists from provider 6.0 (5.x has `name` only): a constraint that
    admitted 5.x would let `terraform init` pick a provider on which `plan` fails."""
    used = " ".join(p.read_text() for p in TF.glob("*.tf"))
    assert "data.aws_region.current.region" in used
    (constraint,) = re.findall(
        r'version\s*=\s*"([^"]+)"', (TF / "versions.tf").read_text().split("required_providers")[1]
    )
    lower = re.search(r">=\s*(\d+)\.", constraint)
    assert lower and int(lower.group(1)) >= 6, constraint
    assert re.search(r"<\s*7\.", constraint), constraint
