"""Request tracing in the deployment: one switch (Tracing / tracing), off by default.

Same evaluator as tests/deploy/test_stack.py (intrinsics resolved for given parameters); tests/deploy/test_terraform.py
compares the module with the stack with tracing on and off ("tracing", "tracing-renamed"), so what is
proven here of the stack holds for the module too. What is proven here, offline:

- off (the default), the task is deploy/task-definition.json's (and with model sync
  deploy/task-definition-modelsync.json's), field by field, and the task role has no managed policy:
  the two JSON files stay the tracing-off templates;
- on, Triton's command line is the file's with the OpenTelemetry trace flags after it (the rate and the
  service name following their parameters), pointed at the address the exporter's relay listens on;
  the exporter's environment is a valid configuration (its own parser) that forwards SigV4-signed to
  X-Ray's OTLP endpoint in the stack's region and lists its own log group, which the stack creates
  and the task role writes; the task role has AWS's managed X-Ray write policy and nothing else new;
- botocore's ECS model accepts the task definition either way.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters

from exporter.config import load
from tests.deploy.test_stack import (
    ACCOUNT,
    REGION,
    Stack,
    allowed,
    by_name,
    mk,
    sample_taskdef,
    stack_taskdef,
    statements,
)
from tests.deploy.test_stack import template as template
from tests.deploy.test_stack_modelsync import ON as MODELSYNC
from tests.deploy.test_stack_modelsync import modelsync_file
from tests.support.paths import REPO

ROOT = REPO
DOCS = ROOT / "docs" / "tracing.md"
XRAY_POLICY = "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess"
TRACING = {"Tracing": "true"}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("environment", [])}


def trace_flags(command: str) -> dict[str, str]:
    """The --trace-config settings of a Triton command line: {"mode": "opentelemetry", "opentelemetry,url": ...}."""
    words = shlex.split(command)
    out: dict[str, str] = {}
    for i, word in enumerate(words):
        if word == "--trace-config":
            key, _, value = words[i + 1].partition("=")  # opentelemetry,resource=service.name=NAME: up to the first
            assert key not in out, key
            out[key] = value
    return out


def expected_flags(rate: str, service: str) -> dict[str, str]:
    return {
        "mode": "opentelemetry",
        "opentelemetry,url": "http://127.0.0.1:4318/v1/traces",
        "rate": rate,
        "level": "TIMESTAMPS",
        "opentelemetry,resource": f"service.name={service}",
    }


# --- off: what was deployed before ------------------------------------------------------------


def test_tracing_is_off_by_default(template) -> None:
    assert template["Parameters"]["Tracing"]["Default"] == "false"
    assert template["Parameters"]["TraceRate"]["Default"] == "1000"
    off = mk(template)
    assert not off.condition("TracingEnabled")
    assert "ManagedPolicyArns" not in off.props("TaskRole")
    for c in by_name(stack_taskdef(off)).values():
        assert "--trace-config" not in " ".join(c.get("command", []))
        assert not any(name.startswith("EXPORTER_TRACE") for name in env_of(c))


@pytest.mark.parametrize("params", [{}, MODELSYNC], ids=["plain", "modelsync"])
def test_off_the_containers_are_the_json_files(template, params: dict[str, str]) -> None:
    """The files are the tracing-off templates: off, the stack's containers are theirs, field by field."""
    ours = by_name(stack_taskdef(mk(template, **params)))
    theirs = by_name(modelsync_file() if params else sample_taskdef())
    for name in ("triton-server", "exporter"):
        assert ours[name] == theirs[name], name
    text = (ROOT / "deploy" / ("task-definition-modelsync.json" if params else "task-definition.json")).read_text()
    assert "--trace-config" not in text and "EXPORTER_TRACES" not in text


# --- on ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "rate", "service"),
    [
        (TRACING, "1000", "triton"),
        (TRACING | {"TraceRate": "7", "ServiceName": "inference"}, "7", "inference"),
        (TRACING | MODELSYNC | {"TraceRate": "1"}, "1", "triton"),
    ],
    ids=["defaults", "renamed", "modelsync"],
)
def test_on_triton_gets_the_trace_flags_after_its_command(
    template, params: dict[str, str], rate: str, service: str
) -> None:
    on = by_name(stack_taskdef(mk(template, **params)))
    off = by_name(stack_taskdef(mk(template, **(params | {"Tracing": "false"}))))
    command, before = on["triton-server"]["command"], off["triton-server"]["command"]
    assert command[:2] == before[:2] == ["/bin/sh", "-c"]
    assert command[2].startswith(before[2] + " --trace-config ")
    assert trace_flags(command[2]) == expected_flags(rate, service)
    assert command[2].split(" && ")[1].startswith("exec tritonserver ")  # the flags are tritonserver's own
    # Everything else of Triton's is as it was.
    assert {k: v for k, v in on["triton-server"].items() if k != "command"} == {
        k: v for k, v in off["triton-server"].items() if k != "command"
    }


def test_on_the_exporter_relays_to_xray_in_the_stacks_region(template) -> None:
    s = mk(template, **TRACING, LogGroupPrefix="/prod/inf")
    containers = by_name(stack_taskdef(s))
    env = env_of(containers["exporter"])
    off_env = env_of(by_name(stack_taskdef(mk(template, LogGroupPrefix="/prod/inf")))["exporter"])
    assert {k: v for k, v in env.items() if k not in off_env} == {
        "EXPORTER_TRACES_TO": f"otlp+https://xray.{REGION}.amazonaws.com/v1/traces",
        "EXPORTER_TRACES_LOG_GROUPS": "/prod/inf/exporter",
    }
    assert {k: v for k, v in env.items() if k in off_env} == off_env
    settings = load([], env)
    assert settings.traces_to is not None
    assert (settings.traces_to.signed, settings.traces_to.service, settings.traces_to.region) == (True, "xray", REGION)
    # Triton sends where the relay listens, and the relay reads that container's metadata.
    url = trace_flags(containers["triton-server"]["command"][2])["opentelemetry,url"]
    m = re.fullmatch(r"http://([^:/]+):(\d+)/v1/traces", url)
    assert m and settings.traces_listen == (m.group(1), int(m.group(2)))
    assert stack_taskdef(s)["networkMode"] == "awsvpc"  # one network namespace: 127.0.0.1 is the task's
    assert settings.traces_container in containers
    # The listed group is the exporter's own, created by the stack, written by the router with the task role.
    assert settings.traces_log_groups == (s.ref("ExporterLogGroup"),)
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/prod/inf/exporter"
    assert allowed(statements(s, "TaskRole"), "logs:PutLogEvents", f"{group}:log-stream:exporter-firelens-1")


def test_on_the_task_role_gets_the_managed_xray_write_policy_only(template) -> None:
    off, on = mk(template), mk(template, **TRACING)
    assert on.props("TaskRole")["ManagedPolicyArns"] == [XRAY_POLICY]
    # Nothing else of the role changes: the same inline policies, statement for statement.
    assert on.props("TaskRole")["Policies"] == off.props("TaskRole")["Policies"]
    assert on.props("ExecutionRole") == off.props("ExecutionRole")
    china = Stack(template, **(mk(template).params | TRACING))
    china.pseudo = china.pseudo | {"AWS::Partition": "aws-cn", "AWS::URLSuffix": "amazonaws.com.cn"}
    china.pseudo["AWS::Region"] = "cn-north-1"
    assert china.props("TaskRole")["ManagedPolicyArns"] == ["arn:aws-cn:iam::aws:policy/AWSXrayWriteOnlyAccess"]
    env = env_of(by_name(stack_taskdef(china))["exporter"])
    assert env["EXPORTER_TRACES_TO"] == "otlp+https://xray.cn-north-1.amazonaws.com.cn/v1/traces"
    endpoint = load([], env).traces_to
    assert endpoint and endpoint.region == "cn-north-1"


def test_on_only_the_triton_command_the_exporter_env_and_the_role_change(template) -> None:
    off, on = mk(template), mk(template, **TRACING)
    assert set(on.resources()) == set(off.resources())
    for name in off.resources():
        a, b = off.props(name), on.props(name)
        if name == "TaskDefinition":
            ca, cb = by_name(stack_taskdef(off)), by_name(stack_taskdef(on))
            assert {n for n in ca if ca[n] != cb[n]} == {"triton-server", "exporter"}
            continue
        if name == "TaskRole":
            b = {k: v for k, v in b.items() if k != "ManagedPolicyArns"}
        assert a == b, name


@pytest.mark.parametrize("params", [TRACING, TRACING | MODELSYNC], ids=["plain", "modelsync"])
def test_on_the_task_definition_is_valid_for_ecs(template, params: dict[str, str]) -> None:
    shape = botocore.session.get_session().get_service_model("ecs").operation_model("RegisterTaskDefinition")
    validate_parameters(stack_taskdef(mk(template, **params)), shape.input_shape)


def test_the_rate_is_a_whole_number(template) -> None:
    for bad in ("0", "1.5", "-1", "", "1e3"):
        with pytest.raises(AssertionError):
            mk(template, **TRACING, TraceRate=bad)


# --- docs --------------------------------------------------------------------------------------


def test_docs_say_how_to_deploy_it() -> None:
    text = DOCS.read_text()
    section = text[text.index("\n## Deploy") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    for needed in (
        "Tracing=true",
        "tracing = true",
        "TraceRate",
        "trace_rate",
        "AWSXrayWriteOnlyAccess",
        "Transaction Search",
        "UpdateTraceSegmentDestination",
        "AWS::XRay::TransactionSearchConfig",
        "docs.aws.amazon.com",
    ):
        assert needed in section, needed
