"""OTLP metrics in the deployment: one switch (OtlpMetrics / otlp_metrics), off by default.

Same evaluator as tests/deploy/test_stack.py; tests/deploy/test_terraform.py compares the module with the stack
with it on ("otlp", "otlp-renamed") and off (every other scenario), so what is proven here of the stack holds for the
module too. Offline:

- off (the default), the task is deploy/task-definition.json's (and with model sync the modelsync file's),
  field by field, the task role has no cloudwatch:PutMetricData and the alarms stack creates no PromQL alarm;
- on, only the exporter's EXPORTER_OUTPUT and the task role change: the exporter's own parser reads the EMF
  output first and CloudWatch's OTLP endpoint in the stack's region (SigV4, service monitoring) after it, and
  the role gets cloudwatch:PutMetricData (no resource-level permissions: Resource "*") and nothing else;
- the nested alarms stack gets the switch, and with it the PromQL alarms;
- botocore's ECS model accepts the task definition either way;
- OtlpSemconv (off by default): with OtlpMetrics and genai, the exporter alone gets EXPORTER_OTLP_SEMCONV=genai
  (the GenAI server metrics, docs/otlp.md); without OtlpMetrics nothing changes, since the exporter refuses
  the setting without an OTLP output: in every combination the exporter's own settings loader accepts its
  environment (tests/deploy/test_terraform.py's "otlp-genai" and "genai-without-otlp" scenarios: the module agrees).
"""

from __future__ import annotations

import json

import botocore.session
import pytest
from botocore.validate import validate_parameters

from catalog.otlp import SEMCONVS
from exporter.config import load
from render.alarms.promql import PROMQL
from telemetry.otlp.endpoint import Endpoint
from telemetry.sinks import Output
from tests.deploy.test_stack import REGION, Stack, allowed, by_name, mk, sample_taskdef, stack_taskdef, statements
from tests.deploy.test_stack import template as template
from tests.deploy.test_stack_modelsync import ON as MODELSYNC
from tests.deploy.test_stack_modelsync import modelsync_file
from tests.deploy.test_stack_tracing import env_of
from tests.support.paths import REPO

ROOT = REPO
ON = {"OtlpMetrics": "true"}
GENAI = {"OtlpSemconv": "genai"}
EMF = "tcp://127.0.0.1:25888"


def test_otlp_metrics_is_off_by_default(template) -> None:
    assert template["Parameters"]["OtlpMetrics"]["Default"] == "false"
    off = mk(template)
    assert not off.condition("OtlpMetricsEnabled")
    assert env_of(by_name(stack_taskdef(off))["exporter"])["EXPORTER_OUTPUT"] == EMF
    assert not allowed(statements(off, "TaskRole"), "cloudwatch:PutMetricData", "*")
    assert off.props("Alarms")["Parameters"]["OtlpMetrics"] == "false"


@pytest.mark.parametrize("params", [{}, MODELSYNC], ids=["plain", "modelsync"])
def test_off_the_containers_are_the_json_files(template, params: dict[str, str]) -> None:
    ours = by_name(stack_taskdef(mk(template, **params)))
    theirs = by_name(modelsync_file() if params else sample_taskdef())
    assert ours["exporter"] == theirs["exporter"]
    text = (ROOT / "deploy" / ("task-definition-modelsync.json" if params else "task-definition.json")).read_text()
    assert "otlp+" not in text


def test_on_the_exporter_sends_emf_first_then_otlp_to_cloudwatch_in_the_stacks_region(template) -> None:
    env = env_of(by_name(stack_taskdef(mk(template, **ON)))["exporter"])
    url = f"otlp+https://monitoring.{REGION}.amazonaws.com/v1/metrics"
    assert env["EXPORTER_OUTPUT"] == f"{EMF} {url}"
    settings = load([], env)
    emf, otlp = settings.outputs
    assert isinstance(emf, Output) and str(emf) == EMF  # EMF stays first: scaling and the classic alarms
    assert isinstance(otlp, Endpoint) and (otlp.signed, otlp.service, otlp.region) == (True, "monitoring", REGION)
    china = Stack(template, **(mk(template).params | ON))
    china.pseudo = china.pseudo | {"AWS::Partition": "aws-cn", "AWS::URLSuffix": "amazonaws.com.cn"}
    china.pseudo["AWS::Region"] = "cn-north-1"
    env = env_of(by_name(stack_taskdef(china))["exporter"])
    assert env["EXPORTER_OUTPUT"].endswith(" otlp+https://monitoring.cn-north-1.amazonaws.com.cn/v1/metrics")
    assert load([], env).otlp_outputs[0].region == "cn-north-1"


def test_on_the_task_role_may_put_metric_data_and_nothing_else_new(template) -> None:
    off, on = mk(template), mk(template, **ON)
    added = [p for p in on.props("TaskRole")["Policies"] if p not in off.props("TaskRole")["Policies"]]
    assert added == [
        {
            "PolicyName": "otlp-metrics",
            "PolicyDocument": {
                "Version": "2012-10-17",
                "Statement": [
                    {"Sid": "PutOtlpMetrics", "Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*"}
                ],
            },
        }
    ]
    assert allowed(statements(on, "TaskRole"), "cloudwatch:PutMetricData", "*")
    assert "ManagedPolicyArns" not in on.props("TaskRole")
    assert on.props("ExecutionRole") == off.props("ExecutionRole")


def test_on_only_the_exporter_the_role_and_the_alarms_switch_change(template) -> None:
    off, on = mk(template), mk(template, **ON)
    assert set(on.resources()) == set(off.resources())
    for name in off.resources():
        a, b = off.props(name), on.props(name)
        if name == "TaskDefinition":
            ca, cb = by_name(stack_taskdef(off)), by_name(stack_taskdef(on))
            assert {n for n in ca if ca[n] != cb[n]} == {"exporter"}
            assert {k for k in ca["exporter"] if ca["exporter"][k] != cb["exporter"][k]} == {"environment"}
            continue
        if name == "TaskRole":
            a, b = {k: v for k, v in a.items() if k != "Policies"}, {k: v for k, v in b.items() if k != "Policies"}
        if name == "Alarms":
            assert b["Parameters"].pop("OtlpMetrics") == "true" and a["Parameters"].pop("OtlpMetrics") == "false"
        assert a == b, name


def test_the_alarms_stack_creates_the_promql_alarms_only_with_the_switch(template) -> None:
    nested = json.loads((ROOT / "alarms" / "triton-alarms.template.json").read_text())
    for value, count in (("false", 0), ("true", len(PROMQL))):
        params = mk(template, **{"OtlpMetrics": value}).props("Alarms")["Parameters"]
        params["ServiceName"] = "triton"
        alarms = Stack(nested, **params)
        promql = [n for n in alarms.resources("AWS::CloudWatch::Alarm") if "EvaluationCriteria" in alarms.props(n)]
        assert len(promql) == count, value


@pytest.mark.parametrize("params", [ON, ON | MODELSYNC], ids=["plain", "modelsync"])
def test_on_the_task_definition_is_valid_for_ecs(template, params: dict[str, str]) -> None:
    shape = botocore.session.get_session().get_service_model("ecs").operation_model("RegisterTaskDefinition")
    validate_parameters(stack_taskdef(mk(template, **params)), shape.input_shape)


def test_docs_say_how_to_deploy_it() -> None:
    text = (ROOT / "docs" / "otlp.md").read_text()
    section = text[text.index("\n## Deploy") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    for needed in ("OtlpMetrics=true", "otlp_metrics = true", "cloudwatch:PutMetricData", "cloudwatch:namespace"):
        assert needed in section, needed


# --- OtlpSemconv: the GenAI server metrics ---------------------------------------------------------------


def test_otlp_semconv_is_off_by_default_and_takes_the_exporters_values(template) -> None:
    p = template["Parameters"]["OtlpSemconv"]
    assert p["Default"] == "off" and p["AllowedValues"] == ["off", "genai"]
    assert tuple(p["AllowedValues"]) == SEMCONVS  # the exporter's --otlp-semconv values
    assert not mk(template).condition("OtlpSemconvEnabled")
    assert "EXPORTER_OTLP_SEMCONV" not in env_of(by_name(stack_taskdef(mk(template, **ON)))["exporter"])


@pytest.mark.parametrize("modelsync", [{}, MODELSYNC], ids=["plain", "modelsync"])
@pytest.mark.parametrize("otlp", ["true", "false"])
@pytest.mark.parametrize("semconv", ["off", "genai"])
def test_the_exporter_starts_with_every_combination(template, otlp: str, semconv: str, modelsync: dict) -> None:
    """The exporter refuses EXPORTER_OTLP_SEMCONV without an OTLP output (exit 2): the stack never sets it so."""
    env = env_of(by_name(stack_taskdef(mk(template, OtlpMetrics=otlp, OtlpSemconv=semconv, **modelsync)))["exporter"])
    settings = load([], env)  # raises ConfigError on a combination the exporter refuses
    both = otlp == "true" and semconv == "genai"
    assert settings.otlp_semconv == ("genai" if both else "off")
    assert ("EXPORTER_OTLP_SEMCONV" in env) == both and bool(settings.otlp_outputs) == (otlp == "true")


def test_genai_without_otlp_changes_nothing(template) -> None:
    off, alone = mk(template), mk(template, **GENAI)
    assert not alone.condition("OtlpSemconvEnabled")
    for name in off.resources():
        assert off.props(name) == alone.props(name), name


def test_genai_adds_one_variable_to_the_exporter_and_nothing_else(template) -> None:
    on, genai = mk(template, **ON), mk(template, **ON, **GENAI)
    assert set(genai.resources()) == set(on.resources())
    for name in on.resources():
        if name != "TaskDefinition":
            assert on.props(name) == genai.props(name), name
    a, b = by_name(stack_taskdef(on)), by_name(stack_taskdef(genai))
    assert {n for n in a if a[n] != b[n]} == {"exporter"}
    assert {k for k in a["exporter"] if a["exporter"][k] != b["exporter"][k]} == {"environment"}
    added = [e for e in b["exporter"]["environment"] if e not in a["exporter"]["environment"]]
    assert added == [{"name": "EXPORTER_OTLP_SEMCONV", "value": "genai"}]
    assert [e for e in a["exporter"]["environment"] if e not in b["exporter"]["environment"]] == []


@pytest.mark.parametrize("params", [ON | GENAI, ON | GENAI | MODELSYNC], ids=["plain", "modelsync"])
def test_with_genai_the_task_definition_is_valid_for_ecs(template, params: dict[str, str]) -> None:
    shape = botocore.session.get_session().get_service_model("ecs").operation_model("RegisterTaskDefinition")
    validate_parameters(stack_taskdef(mk(template, **params)), shape.input_shape)


def test_the_json_files_set_no_semconv() -> None:
    """The task-definition files have no OTLP output, so no EXPORTER_OTLP_SEMCONV (the exporter would refuse it);
    their exporter's environment loads as is."""
    for taskdef in (sample_taskdef(), modelsync_file()):
        env = env_of(by_name(taskdef)["exporter"])
        assert "EXPORTER_OTLP_SEMCONV" not in env
        assert load([], env).otlp_semconv == "off"


def test_docs_say_how_to_turn_genai_on() -> None:
    text = (ROOT / "docs" / "otlp.md").read_text()
    section = text[text.index("\n## Deploy") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    for needed in ("OtlpSemconv=genai", 'otlp_semconv = "genai"', "EXPORTER_OTLP_SEMCONV"):
        assert needed in section, needed
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert "`OtlpSemconv`" in deploy and "`otlp_semconv`" in deploy
