"""Alarm specifications as data: one dataclass per alarm shape, with named fields.

Each shape renders to a :class:`Spec` (:meth:`MetricAlarm.spec`): the ``PutMetricAlarm`` body, with
``${Param}`` tokens in strings and :class:`~render.base.params.Ref` for numbers, beside what only the
renderers use (the file and resource name, the actions, the parameter the alarm exists under, the metrics
``cost`` bills). Every metric is checked with :func:`~render.base.widgets.emitted`; a shape whose metric the
selection leaves out renders as None.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from catalog import Catalog

from ..base.params import Ref
from ..base.widgets import emitted

NOTIFY = ("notify",)


@dataclass(frozen=True)
class Spec:
    """One alarm as every renderer takes it (CLI files, CloudFormation, Terraform, cost)."""

    file: str  # its suffix: the file (alarms/cli/alarm-<file>.json) and the resource name
    body: dict[str, Any]  # the PutMetricAlarm fields, nothing else
    actions: tuple[str, ...]  # "notify" (the SNS topic) and the scaling policies it invokes
    condition: str = ""  # a "true"/"false" parameter the alarm exists under (ModelSync, OtlpMetrics)
    metric: str = ""  # the metric it reads (cost: a GROUP BY model alarm bills one per model emitting it)
    terms: tuple[str, ...] = ()  # every metric a metric-math alarm reads (cost: one alarm metric each)
    rules: tuple[str, ...] = ()  # the Contributor Insights rules it reads (INSIGHT_RULE_METRIC): created first

    @property
    def name(self) -> str:
        return str(self.body["AlarmName"])


@dataclass(frozen=True)
class RuleSpec:
    """A Contributor Insights rule an alarm reads: the PutInsightRule fields and the parameter it exists under."""

    file: str
    body: dict[str, Any]
    condition: str = ""


@dataclass(frozen=True)
class MetricAlarm:
    """A single-metric alarm; ``stat`` ``pNN`` is an extended statistic (a percentile of a distribution)."""

    suffix: str
    description: str
    metric: str
    stat: str
    period: int
    points: int
    threshold: Ref | float
    comparison: str = "GreaterThanThreshold"
    missing: str = "notBreaching"
    actions: tuple[str, ...] = NOTIFY
    dimensions: tuple[tuple[str, str], ...] = ()
    optional: bool = False  # a metric of an optional pack (LLM)
    condition: str = ""  # a "true"/"false" parameter the alarm exists under (ModelSync)

    def spec(self, catalog: Catalog) -> Spec | None:
        metric = emitted(catalog, self.metric, tuple(k for k, _ in self.dimensions), self.optional)
        if metric is None:
            return None
        check_period(catalog, metric, self.period, self.suffix)
        statistic = {"ExtendedStatistic": self.stat} if re.fullmatch(r"p\d+(\.\d+)?", self.stat) else {}
        body = {
            "AlarmName": f"${{AlarmNamePrefix}}-{self.suffix}",
            "AlarmDescription": self.description,
            "Namespace": "${Namespace}",
            "MetricName": metric,
            "Dimensions": [{"Name": k, "Value": v} for k, v in self.dimensions],
            **(statistic or {"Statistic": self.stat}),
            "Period": self.period,
            "EvaluationPeriods": self.points,
            "DatapointsToAlarm": self.points,
            "Threshold": self.threshold,
            "ComparisonOperator": self.comparison,
            "TreatMissingData": self.missing,
        }
        return Spec(self.suffix, body, self.actions, self.condition, metric)


HIGH_RESOLUTION_PERIODS = (10, 30)  # CloudWatch: a high-resolution alarm's period; else a multiple of 60


def check_period(catalog: Catalog, name: str, period: int, alarm: str) -> None:
    """An alarm's period must be one CloudWatch takes and its metric can fill: a 10 or 30-second period
    only on a high-resolution metric emitted at least that often (a standard metric has one value a minute:
    such an alarm would see data in one period of six), and every period a whole number of the metric's
    values."""
    metric = catalog.get(name)
    assert metric is not None
    if period < 60 and period not in HIGH_RESOLUTION_PERIODS:
        raise ValueError(f"alarm {alarm}: period {period} s; CloudWatch takes 10, 30 or a multiple of 60")
    if period % 60 and period not in HIGH_RESOLUTION_PERIODS:
        raise ValueError(f"alarm {alarm}: period {period} s; CloudWatch takes 10, 30 or a multiple of 60")
    if period < 60 and not metric.high_resolution:
        raise ValueError(f"alarm {alarm}: a {period} s period needs {name} at high resolution (resolution = 1)")
    if period < 60 and (metric.interval is None or period % metric.interval):
        raise ValueError(
            f"alarm {alarm}: a {period} s period needs {name} every {period} s or a divisor of it "
            f"(its catalog interval is {metric.interval or 'the full cycle'})"
        )


@dataclass(frozen=True)
class Term:
    """One metric of a :class:`MathAlarm`'s sum: ``id / divisor``, read with ``stat`` on the service rollup."""

    id: str
    metric: str
    stat: str
    divisor: Ref
    optional: bool = False  # left out when the selection (or an optional pack, LLM) leaves the metric out


@dataclass(frozen=True)
class MathAlarm:
    """An alarm on a sum of normalised signals, ``m1 / T1 + m2 / T2 + ...``, each on its service-wide set.

    CloudWatch's metric math treats a missing value in arithmetic as 0 and drops a datapoint that divides by
    zero (User Guide, "Using metric math", "Basic arithmetic functions"): a signal no task reports, such as
    the queue time of an idle model, adds nothing; when no term has data the expression has none, and
    ``missing`` decides (notBreaching: no data, no action). No term is wrapped in ``FILL``: a filled term has
    data at every timestamp, so silence from every task would read as an idle service (docs/scaling.md).
    """

    suffix: str
    description: str
    terms: tuple[Term, ...]
    period: int
    points: int
    threshold: float
    comparison: str
    missing: str = "notBreaching"
    actions: tuple[str, ...] = NOTIFY
    label: str = ""

    def spec(self, catalog: Catalog) -> Spec | None:
        kept = []
        for t in self.terms:
            metric = emitted(catalog, t.metric, (), t.optional)
            if metric is None and not t.optional:
                return None  # a required signal the selection leaves out: no alarm that would ignore it
            if metric is not None:
                check_period(catalog, metric, self.period, self.suffix)
                kept.append(t)
        expression = " + ".join(f"{t.id} / ${{{t.divisor.name}}}" for t in kept)
        queries: list[dict[str, Any]] = [
            {"Id": "e1", "Expression": expression, "Label": self.label or self.suffix, "ReturnData": True}
        ]
        for t in kept:
            queries.append(
                {
                    "Id": t.id,
                    "MetricStat": {
                        "Metric": {"Namespace": "${Namespace}", "MetricName": t.metric, "Dimensions": []},
                        "Period": self.period,
                        "Stat": t.stat,
                    },
                    "ReturnData": False,
                }
            )
        body = {
            "AlarmName": f"${{AlarmNamePrefix}}-{self.suffix}",
            "AlarmDescription": self.description,
            "Metrics": queries,
            "EvaluationPeriods": self.points,
            "DatapointsToAlarm": self.points,
            "Threshold": self.threshold,
            "ComparisonOperator": self.comparison,
            "TreatMissingData": self.missing,
        }
        return Spec(self.suffix, body, self.actions, metric=kept[0].metric, terms=tuple(t.metric for t in kept))


@dataclass(frozen=True)
class ModelAlarm:
    """A Metrics Insights query alarm, ``GROUP BY model`` on the metric's ``model`` rollup: each model is its
    own contributor, and a model deployed later is covered without touching the alarm."""

    suffix: str
    description: str
    func: str  # SUM, MAX
    metric: str
    period: int
    points: int
    threshold: Ref
    label: str
    optional: bool = False

    def spec(self, catalog: Catalog) -> Spec | None:
        metric = emitted(catalog, self.metric, ("model",), self.optional)
        if metric is None:
            return None
        query = (
            f'SELECT {self.func}({metric}) FROM SCHEMA("${{Namespace}}", model) GROUP BY model '
            f"ORDER BY {self.func}() DESC"
        )
        body = {
            "AlarmName": f"${{AlarmNamePrefix}}-{self.suffix}",
            "AlarmDescription": self.description,
            "Metrics": [
                {"Id": "q1", "Expression": query, "Period": self.period, "Label": self.label, "ReturnData": True}
            ],
            "EvaluationPeriods": self.points,
            "DatapointsToAlarm": self.points,
            "Threshold": self.threshold,
            "ComparisonOperator": "GreaterThanThreshold",
            "TreatMissingData": "notBreaching",
        }
        return Spec(self.suffix, body, NOTIFY, metric=metric)


def model_slug(model: str) -> str:
    """File- and id-safe form of a model name; a hash keeps two names that clean alike apart."""
    slug = "-".join(re.findall(r"[A-Za-z0-9]+", model))[:60]
    return slug if slug == model else f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:6]}".lstrip("-")
