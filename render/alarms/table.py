"""Every alarm and Contributor Insights rule the render writes, fleet-wide first.

The exporter's (:mod:`.core`) and model sync's (:mod:`.modelsync`), as
specs in the API's own shapes (:mod:`.spec`); the CLI files
(:mod:`.cli`), the CloudFormation template and Terraform all render these.
"""

from __future__ import annotations

from ..base.options import Options
from ..base.params import parameter_values, resolve
from . import core, modelsync, promql
from .scaling import SCALING_ACTIONS, has_scaling
from .spec import RuleSpec, Spec


def alarm_specs(opts: Options) -> list[Spec]:
    """Every alarm on a metric that is emitted: the exporter's fleet-wide ones, model sync's, the named models'.

    Scaling alarms only with scaling (a scale-out and the scale-in alarm): an alarm whose one action is a policy
    the render does not create would watch for nothing.
    """
    specs = [s for s in (*core.fleet_specs(opts), *modelsync.alarm_specs(opts), *core.model_specs(opts)) if s]
    if has_scaling(specs):
        return specs
    return [s for s in specs if not s.actions or not set(s.actions) <= set(SCALING_ACTIONS)]


def promql_specs(opts: Options) -> list[Spec]:
    """The PromQL alarms on what the OTLP metrics output sends (:mod:`.promql`), under ``OtlpMetrics``."""
    return promql.promql_specs(opts)


def insight_rule_specs(opts: Options) -> list[RuleSpec]:
    """Contributor Insights rules (PutInsightRule shape) that alarms read with INSIGHT_RULE_METRIC."""
    return modelsync.insight_rule_specs(opts)


def alarm_names(opts: Options) -> list[str]:
    values = parameter_values(opts)
    return [resolve(s.name, values) for s in alarm_specs(opts)]
