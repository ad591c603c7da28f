"""Alarm specifications as data: one dataclass per alarm shape, with named fields.

A spec renders to the ``PutMetricAlarm`` shape (:meth:`MetricAlarm.spec`),
with ``${Param}`` tokens in strings and :class:`~render.base.params.Ref`
for numbers; keys starting with ``_`` are render metadata, not API fields
(``_file``: the file and resource name; ``_actions``: notify and scaling
actions; ``_condition``: the parameter that must be "true"; ``_metric``: the
metric, for ``cost``; ``_rules``: Contributor Insights rules it reads). Every
metric is checked with :func:`~render.base.emitted`; a spec whose
metric the selection leaves out renders as None.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from catalog import Catalog

from ..base.params import Ref
from ..base.widgets import emitted

Spec = dict[str, Any]
NOTIFY = ("notify",)


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
        statistic = {"ExtendedStatistic": self.stat} if re.fullmatch(r"p\d+(\.\d+)?", self.stat) else {}
        return {
            "_file": self.suffix,
            "_actions": self.actions,
            **({"_condition": self.condition} if self.condition else {}),
            "_metric": metric,
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
        return {
            "_file": self.suffix,
            "_actions": NOTIFY,
            "_metric": metric,
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


def model_slug(model: str) -> str:
    """File- and id-safe form of a model name; a hash keeps two names that clean alike apart."""
    slug = "-".join(re.findall(r"[A-Za-z0-9]+", model))[:60]
    return slug if slug == model else f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:6]}".lstrip("-")
