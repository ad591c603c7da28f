"""The self-contained CloudFormation template: alarms, ECS service scaling and the dashboard.

Built from the same specs as the CLI files (alarms/) and the same
dashboard builder, so the three cannot drift apart. Every value a user
might change is a Parameter whose default is the render option, so
deploy/ can include it as a nested stack and pass its own names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from . import dashboard
from .alarms import (
    POLICIES,
    SCALING_ACTIONS,
    alarm_specs,
    has_scaling,
    insight_rule_specs,
    promql_specs,
    scaling_specs,
    used_policies,
)
from .base.options import Options
from .base.params import PARAMETERS, Param, Ref, RefPlus, parameter_values

_TOKEN = re.compile(r"\$\{[A-Za-z0-9:]+\}")

# Dashboard values that become template parameters: render the body with unique stand-ins, then
# swap each stand-in for a ${...} reference inside Fn::Sub.
_STRING_STANDINS = {
    "namespace": ("@@Namespace@@", "Namespace"),
    "region": ("@@AWS::Region@@", "AWS::Region"),
    "account_id": ("@@AWS::AccountId@@", "AWS::AccountId"),
    "partition": ("@@AWS::Partition@@", "AWS::Partition"),
    "alarm_prefix": ("@@AlarmNamePrefix@@", "AlarmNamePrefix"),
    "log_group_prefix": ("@@LogGroupPrefix@@", "LogGroupPrefix"),
}
_NUMBER_STANDINS = {  # distinctive values no real threshold has; json.dumps prints them exactly
    "failure_threshold": (1.1e300, "FailureThreshold"),
    "load_success_rate": (2.2e300, "LoadSuccessRateThreshold"),
    "gpu_memory": (3.3e300, "GpuMemoryThreshold"),
    "pending_scale_out": (4.4e300, "PendingRequestsScaleOut"),
    "gpu_scale_in": (5.5e300, "GpuScaleInUtilization"),
    "kv_cache_utilization": (7.7e300, "KvCacheUtilizationThreshold"),
    "ttft_p95_ms": (8.8e300, "TtftP95Milliseconds"),
    "requests_waiting_scale_out": (9.9e300, "RequestsWaitingScaleOut"),
}
# Options in milliseconds whose parameter is in microseconds (x1000 in Options' *_us properties).
_MS_STANDINS = {
    "latency_slo_ms": (6.6e297, "LatencySloMicroseconds"),
    "queue_time_scale_out_ms": (2.4e297, "QueueTimeScaleOutMicroseconds"),
}


SUMS = "Sums"  # the Mappings entry holding, per RefPlus, every sum its parameter's range allows


def _cfn(value: Any) -> Any:
    if isinstance(value, Ref):
        return {"Ref": value.name}
    if isinstance(value, RefPlus):  # no addition in CloudFormation: item <value> of "<min+plus>,...,<max+plus>"
        sums = {"Fn::FindInMap": [SUMS, value.name, f"Plus{value.plus}"]}
        return {"Fn::Select": [{"Ref": value.name}, {"Fn::Split": [",", sums]}]}
    if isinstance(value, str):
        return {"Fn::Sub": value} if _TOKEN.search(value) else value
    if isinstance(value, list | tuple):
        return [_cfn(v) for v in value]
    if isinstance(value, dict):
        return {k: _cfn(v) for k, v in value.items()}
    return value


def _sums(resources: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The Mappings every RefPlus of ``resources`` selects from: the sums for whole seconds from 0 to the maximum."""
    out: dict[str, dict[str, str]] = {}

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if list(x) == ["Fn::FindInMap"] and x["Fn::FindInMap"][0] == SUMS:
                _, name, key = x["Fn::FindInMap"]
                param: Param = PARAMETERS[name]
                assert param.min == 0 and param.max is not None, f"{name}: Fn::Select needs indices from 0"
                plus = int(key.removeprefix("Plus"))
                out.setdefault(name, {})[key] = ",".join(str(v + plus) for v in range(int(param.max) + 1))
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(resources)
    return out


def _logical(prefix: str, suffix: str) -> str:
    return prefix + "".join(p[:1].upper() + p[1:] for p in re.findall(r"[A-Za-z0-9]+", suffix))


POLICY_IDS = {p.key: p.logical for p in POLICIES}


def _actions(kinds: tuple[str, ...]) -> dict[str, Any]:
    topic = {"Ref": "AlarmTopicArn"}
    none = {"Ref": "AWS::NoValue"}
    scaling = [k for k in kinds if k in SCALING_ACTIONS]
    notify = "notify" in kinds
    out: dict[str, Any] = {}
    if notify:
        out["OKActions"] = {"Fn::If": ["HasTopic", [topic], none]}
    if notify and scaling:
        policy = {"Ref": POLICY_IDS[scaling[0]]}
        out["AlarmActions"] = {
            "Fn::If": [
                "HasTopic",
                {"Fn::If": ["ScalingEnabled", [topic, policy], [topic]]},
                {"Fn::If": ["ScalingEnabled", [policy], none]},
            ]
        }
    elif notify:
        out["AlarmActions"] = {"Fn::If": ["HasTopic", [topic], none]}
    elif scaling:
        out["AlarmActions"] = [{"Ref": POLICY_IDS[s]} for s in scaling]
    return out


def dashboard_parameters() -> dict[str, str]:
    """Parameter -> "string" or "number", for every parameter the dashboard body takes."""
    out = {param: "string" for _, param in _STRING_STANDINS.values()}
    out |= {param: "number" for _, param in [*_NUMBER_STANDINS.values(), *_MS_STANDINS.values()]}
    return out


def dashboard_body_template(
    opts: Options, placeholder: Callable[[str], str], escape: Callable[[str], str], indent: int | None = None
) -> str:
    """The dashboard body as template text: each parameter's value becomes ``placeholder(parameter)``.

    ``escape`` quotes the body's own template syntax first (CloudFormation's ``${!``, Terraform's
    ``$${``), so the same body serves Fn::Sub and Terraform's templatefile().
    """
    standins: dict[str, Any] = {k: v[0] for k, v in _STRING_STANDINS.items()}
    standins |= {k: v[0] for k, v in _NUMBER_STANDINS.items()}
    standins |= {k: v[0] for k, v in _MS_STANDINS.items()}
    body = dashboard.build(replace(opts, **standins))
    text = escape(json.dumps(body, indent=indent) if indent else json.dumps(body, separators=(",", ":")))
    for standin, param in _STRING_STANDINS.values():
        text = text.replace(standin, placeholder(param))
    numbers = [*_NUMBER_STANDINS.values(), *((n * 1000.0, param) for n, param in _MS_STANDINS.values())]
    if len({json.dumps(n) for n, _ in numbers}) != len(numbers):
        raise AssertionError("two dashboard stand-ins print alike")
    for number, param in numbers:
        text = text.replace(json.dumps(number), placeholder(param))
    if "@@" in text or "e+30" in text or "e+29" in text:
        raise AssertionError("a dashboard stand-in was not replaced")
    return text


def dashboard_body_sub(opts: Options) -> str:
    """The dashboard body as a Fn::Sub string over the template's parameters."""
    return dashboard_body_template(opts, lambda p: "${" + p + "}", lambda text: text.replace("${", "${!"))


def _condition(param: str, used: set[str]) -> str:
    """The condition that a "true"/"false" parameter makes (``ModelSync`` -> ``ModelSyncEnabled``)."""
    used.add(param)
    return f"{param}Enabled"


def build(opts: Options) -> dict[str, Any]:
    values = parameter_values(opts)
    params: dict[str, Any] = {}
    for name, p in PARAMETERS.items():
        entry: dict[str, Any] = {"Type": p.type, "Description": p.description}
        default = values[name]
        entry["Default"] = str(default) if p.type == "String" else default
        if p.allowed:
            entry["AllowedValues"] = list(p.allowed)
        if p.min is not None:
            entry["MinValue"] = p.min
        if p.max is not None:
            entry["MaxValue"] = p.max
        params[name] = entry

    resources: dict[str, Any] = {}
    specs = alarm_specs(opts)
    if has_scaling(specs):
        scaling = scaling_specs(specs)
        target = {k: v for k, v in scaling["target"].items()}
        resources["ScalableTarget"] = {
            "Type": "AWS::ApplicationAutoScaling::ScalableTarget",
            "Condition": "ScalingEnabled",
            "Properties": _cfn(target),
        }
        for policy in used_policies(specs):
            pol, logical = scaling[policy.key], policy.logical
            resources[logical] = {
                "Type": "AWS::ApplicationAutoScaling::ScalingPolicy",
                "Condition": "ScalingEnabled",
                "Properties": _cfn(
                    {
                        "PolicyName": pol["PolicyName"],
                        "PolicyType": pol["PolicyType"],
                        "ScalingTargetId": Ref("ScalableTarget"),
                        "StepScalingPolicyConfiguration": pol["StepScalingPolicyConfiguration"],
                    }
                ),
            }
    conditions: set[str] = set()
    for rule in insight_rule_specs(opts):
        resources[_logical("InsightRule", rule.file)] = {
            "Type": "AWS::CloudWatch::InsightRule",
            "Condition": _condition(rule.condition, conditions),
            "Properties": {
                "RuleName": _cfn(rule.body["RuleName"]),
                "RuleState": rule.body["RuleState"],
                "RuleBody": _cfn(rule.body["RuleDefinition"]),
            },
        }
    for spec in [*specs, *promql_specs(opts)]:
        res: dict[str, Any] = {
            "Type": "AWS::CloudWatch::Alarm",
            "Properties": {**_cfn(spec.body), **_actions(spec.actions)},
        }
        if spec.actions and all(a in SCALING_ACTIONS for a in spec.actions):
            res["Condition"] = "ScalingEnabled"
        if spec.condition:
            res["Condition"] = _condition(spec.condition, conditions)
        if spec.rules:  # INSIGHT_RULE_METRIC names them: create them first
            res["DependsOn"] = [_logical("InsightRule", r) for r in spec.rules]
        resources[_logical("Alarm", spec.file)] = res
    resources["Dashboard"] = {
        "Type": "AWS::CloudWatch::Dashboard",
        "Condition": "DashboardEnabled",
        "Properties": {
            "DashboardName": {"Ref": "DashboardName"},
            "DashboardBody": {"Fn::Sub": dashboard_body_sub(opts)},
        },
    }
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "Triton exporter alarms, ECS service scaling on the leading signals and dashboard; generated by "
        "`python -m render` from the metric catalog. Do not edit, re-render.",
        "Parameters": params,
        **({"Mappings": {SUMS: sums}} if (sums := _sums(resources)) else {}),
        "Conditions": {
            "HasTopic": {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]},
            **(
                {"ScalingEnabled": {"Fn::Equals": [{"Ref": "EnableScaling"}, "true"]}}
                if "ScalableTarget" in resources
                else {}
            ),
            "DashboardEnabled": {"Fn::Equals": [{"Ref": "CreateDashboard"}, "true"]},
            **{f"{p}Enabled": {"Fn::Equals": [{"Ref": p}, "true"]} for p in sorted(conditions)},
        },
        "Resources": resources,
        "Outputs": {
            **(
                {"HeartbeatAlarmName": {"Value": {"Ref": "AlarmExporterHeartbeatMissing"}}}
                if "AlarmExporterHeartbeatMissing" in resources
                else {}
            ),
            **(
                {"ScalableTargetId": {"Condition": "ScalingEnabled", "Value": {"Ref": "ScalableTarget"}}}
                if "ScalableTarget" in resources
                else {}
            ),
            "DashboardName": {"Condition": "DashboardEnabled", "Value": {"Ref": "Dashboard"}},
        },
    }
