"""The Terraform half of the render: alarms, ECS service scaling and the dashboard template.

Built from the same specs as the CloudFormation template (alarms/'s ``alarm_specs``,
``scaling_specs`` and ``PARAMETERS``; template.py's dashboard stand-ins), so the two
cannot drift apart. Two files:

- ``deploy/terraform/alarms.tf.json``, in Terraform's JSON syntax: one
  ``aws_cloudwatch_metric_alarm`` per spec, the scalable target and step policies, a
  variable for every alarm parameter the hand-written module does not declare itself,
  the ``templatefile()`` variables of the dashboard and an ``alarm_names`` output;
- ``dashboards/triton.json.tftpl``: the dashboard body as a ``templatefile()`` template.

Spec tokens become Terraform references: ``${Namespace}`` -> ``${local.namespace}``, a
:class:`Ref` -> ``${var.failure_threshold}``, the service name -> the created
``aws_ecs_service.this``. A PutMetricAlarm field with no Terraform argument here stops the
render with its name instead of being dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .alarms import (
    SCALING_ACTIONS,
    RuleSpec,
    Spec,
    alarm_specs,
    has_scaling,
    insight_rule_specs,
    promql_specs,
    scaling_specs,
    used_policies,
)
from .base.options import Options
from .base.params import PARAMETERS, Param, Ref, RefPlus, parameter_values
from .template import dashboard_body_template, dashboard_parameters

ALARMS_FILE = "deploy/terraform/alarms.tf.json"
DASHBOARD_FILE = "dashboards/triton.json.tftpl"

# Alarm parameters the hand-written module declares in variables.tf: the task definition, service, log groups,
# controller alarms or dashboard use them too, and they carry the stack's patterns and defaults (an empty
# namespace, alarm prefix or dashboard name is the deployment's own). Every other one is generated here.
MODULE_VARIABLES = frozenset(
    {
        "ClusterName",
        "ServiceName",
        "Namespace",
        "LogGroupPrefix",
        "ModelSync",
        "OtlpMetrics",
        "AlarmNamePrefix",
        "DashboardName",
    }
)
# Names that are not variables: the service the module creates (so the scalable target depends on it),
# and CloudFormation's pseudo parameters, which main.tf reads from data sources.
REFERENCES = {
    "ServiceName": "aws_ecs_service.this.name",
    "Namespace": "local.namespace",  # var.namespace, or the deployment's own default when it is empty
    # The same: the variable, or the task family when it is empty (the stack's default is its own name).
    "AlarmNamePrefix": "local.alarm_name_prefix",
    "DashboardName": "local.dashboard_name",
    "ModelSync": "local.model_sync",  # model_sync_bucket_name set
    "OtlpMetrics": "local.otlp_metrics",  # var.otlp_metrics (otlp.tf)
    "AWS::Region": "local.region",
    "AWS::AccountId": "local.account_id",
    "AWS::Partition": "local.partition",
}
SCALING_TARGET = "ecs_service"
INSIGHT_RULE = "aws_cloudwatch_contributor_insight_rule"
RULE_ARGS = {"RuleName": "rule_name", "RuleState": "rule_state", "RuleDefinition": "rule_definition"}

_TOKEN = re.compile(r"\$\{([A-Za-z0-9:]+)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")

# PutMetricAlarm field -> aws_cloudwatch_metric_alarm argument (the provider's names).
ALARM_ARGS = {
    "AlarmName": "alarm_name",
    "AlarmDescription": "alarm_description",
    "ActionsEnabled": "actions_enabled",
    "Namespace": "namespace",
    "MetricName": "metric_name",
    "Dimensions": "dimensions",
    "Statistic": "statistic",
    "ExtendedStatistic": "extended_statistic",
    "Period": "period",
    "Unit": "unit",
    "EvaluationPeriods": "evaluation_periods",
    "DatapointsToAlarm": "datapoints_to_alarm",
    "Threshold": "threshold",
    "ThresholdMetricId": "threshold_metric_id",
    "ComparisonOperator": "comparison_operator",
    "TreatMissingData": "treat_missing_data",
    "EvaluateLowSampleCountPercentile": "evaluate_low_sample_count_percentiles",
    "Metrics": "metric_query",
    "EvaluationCriteria": "evaluation_criteria",
    "EvaluationInterval": "evaluation_interval",
}
PROMQL_ARGS = {"Query": "query", "PendingPeriod": "pending_period", "RecoveryPeriod": "recovery_period"}
QUERY_ARGS = {
    "Id": "id",
    "Expression": "expression",
    "Label": "label",
    "ReturnData": "return_data",
    "Period": "period",
    "AccountId": "account_id",
    "MetricStat": "metric",
}
METRIC_STAT_ARGS = {"Period": "period", "Stat": "stat", "Unit": "unit"}
METRIC_ARGS = {"Namespace": "namespace", "MetricName": "metric_name", "Dimensions": "dimensions"}
TARGET_ARGS = {
    "ServiceNamespace": "service_namespace",
    "ResourceId": "resource_id",
    "ScalableDimension": "scalable_dimension",
    "MinCapacity": "min_capacity",
    "MaxCapacity": "max_capacity",
}
STEP_CONFIG_ARGS = {
    "AdjustmentType": "adjustment_type",
    "Cooldown": "cooldown",
    "MetricAggregationType": "metric_aggregation_type",
    "MinAdjustmentMagnitude": "min_adjustment_magnitude",
    "StepAdjustments": "step_adjustment",
}
STEP_ARGS = {
    "MetricIntervalLowerBound": "metric_interval_lower_bound",
    "MetricIntervalUpperBound": "metric_interval_upper_bound",
    "ScalingAdjustment": "scaling_adjustment",
}


def variable_name(param: str) -> str:
    """``LatencySloMicroseconds`` -> ``latency_slo_microseconds``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", param).lower()


def reference(param: str) -> str:
    return REFERENCES.get(param) or "var." + variable_name(param)


def _escape(text: str) -> str:
    """Literal text inside a Terraform template: quote its own interpolation and directive starts."""
    return text.replace("${", "$${").replace("%{", "%%{")


def tf_string(value: str) -> str:
    out, pos = [], 0
    for m in _TOKEN.finditer(value):
        out += [_escape(value[pos : m.start()]), "${" + reference(m.group(1)) + "}"]
        pos = m.end()
    return "".join([*out, _escape(value[pos:])])


def tf_value(value: Any) -> Any:
    if isinstance(value, Ref):
        return "${" + reference(value.name) + "}"
    if isinstance(value, RefPlus):
        return "${" + reference(value.name) + f" + {value.plus}" + "}"
    if isinstance(value, str):
        return tf_string(value)
    if isinstance(value, list | tuple):
        return [tf_value(v) for v in value]
    if isinstance(value, dict):
        return {k: tf_value(v) for k, v in value.items()}
    return value


def _args(fields: dict[str, Any], names: dict[str, str], what: str) -> dict[str, Any]:
    unknown = set(fields) - set(names)
    if unknown:
        raise KeyError(f"{what} field(s) {sorted(unknown)} have no Terraform argument in render/terraform.py")
    return {names[k]: v for k, v in fields.items()}


def _dimensions(dims: list[dict[str, str]]) -> dict[str, Any]:
    return {d["Name"]: tf_value(d["Value"]) for d in dims}


def _metric_query(query: dict[str, Any]) -> dict[str, Any]:
    out = {k: tf_value(v) for k, v in _args(query, QUERY_ARGS, "PutMetricAlarm Metrics[]").items() if k != "metric"}
    if "MetricStat" in query:
        stat = dict(query["MetricStat"])
        metric = stat.pop("Metric")
        block = {k: tf_value(v) for k, v in _args(stat, METRIC_STAT_ARGS, "MetricStat").items()}
        for k, v in _args(metric, METRIC_ARGS, "MetricStat.Metric").items():
            block[k] = _dimensions(v) if k == "dimensions" else tf_value(v)
        out["metric"] = [block]
    return out


def _evaluation_criteria(criteria: dict[str, Any]) -> dict[str, Any]:
    """``EvaluationCriteria.PromQLCriteria`` -> ``evaluation_criteria { promql_criteria { ... } }``."""
    extra = set(criteria) - {"PromQLCriteria"}
    if extra:
        raise KeyError(f"EvaluationCriteria field(s) {sorted(extra)} have no Terraform argument")
    return {"promql_criteria": [tf_value(_args(criteria["PromQLCriteria"], PROMQL_ARGS, "PromQLCriteria"))]}


def resource_name(suffix: str) -> str:
    name = suffix.replace("-", "_")
    if not _NAME.match(name):
        raise ValueError(f"{suffix!r} makes no Terraform resource name")
    return name


def _enabled(param: str) -> str:
    return "${" + reference(param) + " ? 1 : 0}"


def _policy_arns(kinds: list[str]) -> str:
    return "[" + ", ".join(f"aws_appautoscaling_policy.{k}[0].arn" for k in kinds) + "]"


def alarm_resource(spec: Spec) -> dict[str, Any]:
    body: dict[str, Any] = {}
    kinds = spec.actions
    scaling = [k for k in kinds if k in SCALING_ACTIONS]
    notify = "notify" in kinds
    if kinds and not notify:  # as in the CloudFormation template: scaling-only alarms exist with scaling
        body["count"] = _enabled("EnableScaling")
    if spec.condition:
        body["count"] = _enabled(spec.condition)
    if spec.rules:  # INSIGHT_RULE_METRIC names them: create them first
        body["depends_on"] = [f"{INSIGHT_RULE}.{resource_name(r)}" for r in spec.rules]
    for key, value in _args(spec.body, ALARM_ARGS, "PutMetricAlarm").items():
        if key == "dimensions":
            if value:
                body[key] = _dimensions(value)
        elif key == "metric_query":
            body[key] = [_metric_query(q) for q in value]
        elif key == "evaluation_criteria":
            body[key] = [_evaluation_criteria(value)]
        else:
            body[key] = tf_value(value)
    enable = reference("EnableScaling")
    if notify:
        body["ok_actions"] = "${local.alarm_topic_arns}"
        body["alarm_actions"] = (
            "${concat(local.alarm_topic_arns, " + f"{enable} ? {_policy_arns(scaling)} : [])}}"
            if scaling
            else "${local.alarm_topic_arns}"
        )
    elif scaling:
        body["alarm_actions"] = "${" + _policy_arns(scaling) + "}"
    body["tags"] = "${var.tags}"
    return body


def insight_rule_resource(rule: RuleSpec) -> dict[str, Any]:
    body = {"count": _enabled(rule.condition)} if rule.condition else {}
    body |= {k: tf_value(v) for k, v in _args(rule.body, RULE_ARGS, "PutInsightRule").items()}
    body["tags"] = "${var.tags}"
    return body


def scaling_resources(alarms: list[Spec]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scalable target and the step policies the scaling alarms of ``alarms`` invoke (none without them)."""
    if not has_scaling(alarms):
        return {}, {}
    specs = scaling_specs(alarms)
    target = specs["target"]
    target_body = {"count": _enabled("EnableScaling"), **tf_value(_args(target, TARGET_ARGS, "RegisterScalableTarget"))}
    policies: dict[str, Any] = {}
    for key in (p.key for p in used_policies(alarms)):
        pol = dict(specs[key])
        for field in ("ServiceNamespace", "ResourceId", "ScalableDimension"):
            # Taken from the target, so Terraform creates the target first (CloudFormation: ScalingTargetId).
            if pol.pop(field) != target[field]:
                raise ValueError(f"scaling policy {key}: {field} differs from the scalable target's")
        config = dict(pol.pop("StepScalingPolicyConfiguration"))
        steps = [tf_value(_args(s, STEP_ARGS, "StepAdjustment")) for s in config.pop("StepAdjustments")]
        block = {
            **tf_value(_args(config, STEP_CONFIG_ARGS, "StepScalingPolicyConfiguration")),
            "step_adjustment": steps,
        }
        extra = set(pol) - {"PolicyName", "PolicyType"}
        if extra:
            raise KeyError(
                f"PutScalingPolicy field(s) {sorted(extra)} have no Terraform argument in render/terraform.py"
            )
        ref = f"aws_appautoscaling_target.{SCALING_TARGET}[0]"
        policies[key] = {
            "count": _enabled("EnableScaling"),
            "name": tf_value(pol["PolicyName"]),
            "policy_type": pol["PolicyType"],
            "service_namespace": f"${{{ref}.service_namespace}}",
            "resource_id": f"${{{ref}.resource_id}}",
            "scalable_dimension": f"${{{ref}.scalable_dimension}}",
            "step_scaling_policy_configuration": [block],
        }
    return {SCALING_TARGET: target_body}, policies


def variable(name: str, p: Param, default: Any) -> dict[str, Any]:
    var = variable_name(name)
    if p.type == "Number":
        out: dict[str, Any] = {"type": "number", "description": p.description, "default": default}
    elif set(p.allowed) == {"true", "false"}:
        out = {"type": "bool", "description": p.description, "default": default == "true"}
    elif p.type == "String" and not p.allowed:
        out = {"type": "string", "description": p.description, "default": default}
    else:
        raise ValueError(f"parameter {name}: no Terraform type for {p.type} {p.allowed}")
    checks = []
    if p.min is not None:
        checks.append((f"var.{var} >= {p.min:g}", f"at least {p.min:g}"))
    if p.max is not None:
        checks.append((f"var.{var} <= {p.max:g}", f"at most {p.max:g}"))
    if checks:
        out["validation"] = [
            {
                "condition": "${" + " && ".join(c for c, _ in checks) + "}",
                "error_message": f"The {var} variable must be {' and '.join(t for _, t in checks)}.",
            }
        ]
    return out


def dashboard_template(opts: Options) -> str:
    return dashboard_body_template(opts, lambda p: "${" + p.removeprefix("AWS::") + "}", _escape, indent=2) + "\n"


def _json_text(expression: str) -> str:
    """A string expression JSON-escaped, for a value the template puts inside a JSON string."""
    return f'${{trimsuffix(trimprefix(jsonencode({expression}), "\\""), "\\"")}}'


def module_file(opts: Options) -> dict[str, Any]:
    values = parameter_values(opts)
    specs = [*alarm_specs(opts), *promql_specs(opts)]
    alarms = {resource_name(s.file): alarm_resource(s) for s in specs}
    if len(alarms) != len(specs):
        raise ValueError("two alarms make the same Terraform resource name")
    target, policies = scaling_resources(specs)
    dashboard_vars = {
        p.removeprefix("AWS::"): _json_text(reference(p)) if kind == "string" else "${" + reference(p) + "}"
        for p, kind in dashboard_parameters().items()
    }
    names = {
        s.file: (
            f"${{one(aws_cloudwatch_metric_alarm.{r}[*].alarm_name)}}"
            if "count" in alarms[r]
            else f"${{aws_cloudwatch_metric_alarm.{r}.alarm_name}}"
        )
        for s, r in zip(specs, alarms, strict=True)
    }
    topic = reference("AlarmTopicArn")
    return {
        "//": "Generated by `python -m render` (render/terraform.py) from the metric catalog's "
        "alarm and scaling specs; do not edit, re-render. tests/unit/render/test_render.py fails when it is stale.",
        "variable": {
            variable_name(name): variable(name, p, values[name])
            for name, p in PARAMETERS.items()
            if name not in MODULE_VARIABLES
        },
        "locals": {
            "alarm_topic_arns": f'${{{topic} == "" ? [] : [{topic}]}}',
            "dashboard_template_vars": dashboard_vars,
        },
        "resource": {
            **({"aws_appautoscaling_target": target, "aws_appautoscaling_policy": policies} if target else {}),
            INSIGHT_RULE: {resource_name(r.file): insight_rule_resource(r) for r in insight_rule_specs(opts)},
            "aws_cloudwatch_metric_alarm": alarms,
        },
        "output": {
            "alarm_names": {
                "description": "Alarm name per alarm (null for a scaling alarm while scaling is off)",
                "value": names,
            },
        },
    }


def files(opts: Options) -> dict[str, str]:
    """Relative path -> file text."""
    return {ALARMS_FILE: json.dumps(module_file(opts), indent=2) + "\n", DASHBOARD_FILE: dashboard_template(opts)}
