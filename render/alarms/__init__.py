"""Alarms and ECS step scaling, as parameterised specs in the API's own shapes.

One spec per alarm, written once as data (:mod:`.spec`'s dataclasses; the
tables are :mod:`.core` for the exporter's metrics and :mod:`.modelsync`
for model sync's, :mod:`.promql` for the PromQL alarms on the OTLP output),
each a :class:`~.spec.Spec`: a body in ``PutMetricAlarm`` shape with
``${Param}`` tokens in strings and :class:`~render.base.params.Ref` for
numbers, and the renderers' own fields beside it. The CLI files (:mod:`.cli`) resolve them to the render options;
the CloudFormation template keeps them as parameters
(``AWS::CloudWatch::Alarm`` takes the same property names) and Terraform as
variables.
"""

from __future__ import annotations

from .cli import cli_alarm, cli_files
from .scaling import POLICIES, SCALING_ACTIONS, has_scaling, scaling_specs, used_policies
from .spec import MathAlarm, MetricAlarm, ModelAlarm, RuleSpec, Spec, Term, model_slug
from .table import alarm_names, alarm_specs, insight_rule_specs, promql_specs

__all__ = [
    "POLICIES", "SCALING_ACTIONS", "MathAlarm", "MetricAlarm", "ModelAlarm", "RuleSpec", "Spec", "Term", "alarm_names",
    "alarm_specs", "cli_alarm", "cli_files", "has_scaling", "insight_rule_specs", "model_slug", "promql_specs",
    "scaling_specs", "used_policies",
]  # fmt: skip
