"""An alarm's state at the end of the run, from its PutMetricAlarm definition (alarms/cli/) and the run's data.

The alarm's metric (a metric with a statistic, or its ``Metrics`` expressions: Metrics Insights
with GROUP BY, Contributor Insights, metric math) is evaluated by :mod:`.metricmath` on the run's
periods (:class:`~demo.preview.metricmath.Clock`). The last ``EvaluationPeriods`` periods decide,
as CloudWatch decides: ``DatapointsToAlarm`` breaching ones put it in ALARM; a missing datapoint
counts as ``TreatMissingData`` says (breaching, notBreaching, or not at all); a query that returns
several series (GROUP BY) is in ALARM when any series is. No datapoint at all and missing data not
treated: INSUFFICIENT_DATA.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .emf import Unsupported
from .metricmath import Data, Series, evaluate
from .text import number

COMPARE: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanThreshold": lambda v, t: v > t,
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}
SYMBOL = {
    "GreaterThanThreshold": ">",
    "GreaterThanOrEqualToThreshold": ">=",
    "LessThanThreshold": "<",
    "LessThanOrEqualToThreshold": "<=",
}


@dataclass(frozen=True)
class AlarmState:
    name: str
    state: str  # ALARM | OK | INSUFFICIENT_DATA | NOT_FOUND
    detail: str = ""
    prefix: str = ""
    no_data: bool = False  # the run gave the alarm's metrics no datapoint

    @property
    def short_name(self) -> str:
        return self.name.removeprefix(self.prefix)


def load_alarms(folder: Path) -> dict[str, dict[str, Any]]:
    """Every alarm definition under ``folder`` (alarms/cli and its subfolders), by AlarmName."""
    out = {}
    for path in sorted(folder.rglob("alarm-*.json")):
        doc = json.loads(path.read_text())
        out[doc["AlarmName"]] = doc
    return out


EXPRESSION_QUERY = {"Id", "Expression", "Label", "Period", "ReturnData"}
METRIC_STAT_QUERY = {"Id", "MetricStat", "Label", "ReturnData"}
METRIC_STAT = {"Metric", "Period", "Stat"}
METRIC = {"Namespace", "MetricName", "Dimensions"}


def alarm_props(definition: dict[str, Any]) -> dict[str, Any]:
    """The alarm's metrics as a metric widget's properties (rows, period), for :mod:`.metricmath`.

    A ``Metrics`` query is an expression row (``Expression``) or a metric row (``MetricStat``: namespace,
    name, dimensions, statistic and period, as the scale-in alarm reads each term); anything else in a query
    (``Unit``, ``AccountId``, a query-level ``Period`` on a MetricStat) is refused."""
    if "Metrics" in definition:
        name = definition["AlarmName"]
        rows: list[list[Any]] = []
        periods = []
        for m in definition["Metrics"]:
            if "Expression" in m:
                if set(m) - EXPRESSION_QUERY:
                    raise Unsupported(f"alarm {name}: query {m.get('Id')}: {sorted(set(m) - EXPRESSION_QUERY)}")
                opts = {"expression": m["Expression"], "id": m["Id"], "visible": m.get("ReturnData", True)}
                if "Period" in m:
                    opts["period"] = m["Period"]
                    periods.append(m["Period"])
                rows.append([opts])
            elif "MetricStat" in m:
                rows.append(_metric_stat_row(name, m))
                periods.append(m["MetricStat"]["Period"])
            else:
                raise Unsupported(f"alarm {name}: query {m.get('Id')} has neither Expression nor MetricStat")
        return {"metrics": rows, "period": max(periods, default=60)}
    stat = definition.get("Statistic") or definition.get("ExtendedStatistic")
    dims = [x for d in definition.get("Dimensions", []) for x in (d["Name"], d["Value"])]
    row = [definition["Namespace"], definition["MetricName"], *dims, {"stat": stat, "period": definition["Period"]}]
    return {"metrics": [row], "period": definition["Period"]}


def _metric_stat_row(alarm: str, query: dict[str, Any]) -> list[Any]:
    stat, metric = query["MetricStat"], query["MetricStat"].get("Metric", {})
    extra = (set(query) - METRIC_STAT_QUERY) | (set(stat) - METRIC_STAT) | (set(metric) - METRIC)
    if extra or set(stat) != METRIC_STAT or not {"Namespace", "MetricName"} <= set(metric):
        raise Unsupported(f"alarm {alarm}: query {query.get('Id')}: a MetricStat the preview does not read {query}")
    dims = [x for d in metric.get("Dimensions", []) for x in (d["Name"], d["Value"])]
    opts = {"id": query["Id"], "stat": stat["Stat"], "period": stat["Period"], "visible": query.get("ReturnData", True)}
    return [metric["Namespace"], metric["MetricName"], *dims, opts]


def evaluate_alarm(name: str, definition: dict[str, Any] | None, data: Data, prefix: str = "triton-") -> AlarmState:
    if definition is None:
        return AlarmState(name, "NOT_FOUND", "no definition in alarms/", prefix)
    compare_name = definition["ComparisonOperator"]
    if compare_name not in COMPARE:
        raise Unsupported(f"alarm {name}: comparison {compare_name}")
    compare, threshold = COMPARE[compare_name], float(definition["Threshold"])
    missing = definition.get("TreatMissingData", "missing")
    props = alarm_props(definition)
    series: list[Series] = [s for line in evaluate(props, data) if line.visible for s in line.series]
    times = data.store.times()
    period = float(props["period"])
    width = data.clock.seconds(period)
    # The periods that ended by the end of the run's last window: a partial last period is not evaluated yet.
    end = (data.clock.bucket(times[-1], data.clock.base) if times else data.clock.origin) + data.clock.window
    complete = int((end - data.clock.origin) / width + 1e-6)
    periods = int(definition["EvaluationPeriods"])
    starts = [data.clock.origin + k * width for k in range(max(0, complete - periods), complete)]
    needed = int(definition.get("DatapointsToAlarm", periods))
    have_data = any(s.points for s in series)
    worst: tuple[str, float] | None = None
    most = 0  # the most breaching periods of any series
    for s in series or [Series("")]:
        verdicts = []
        for start in starts:
            value = _near(s.points, start)
            if value is not None:
                verdicts.append(compare(value, threshold))
            elif missing in ("breaching", "notBreaching"):
                verdicts.append(missing == "breaching")
        most = max(most, sum(verdicts))
        if sum(verdicts) >= needed:
            values = [v for t in starts if (v := _near(s.points, t)) is not None]
            worst = (s.label, values[-1] if values else math.nan)
            break
    symbol = SYMBOL[compare_name]
    if worst is not None:
        label, value = worst
        shown = "missing" if math.isnan(value) else number(value)
        return AlarmState(name, "ALARM", f"{label + ' ' if label else ''}{shown} {symbol} {threshold:g}", prefix)
    if not have_data:
        state = "INSUFFICIENT_DATA" if missing in ("missing", "ignore") else "OK"
        return AlarmState(name, state, "no data in the demo", prefix, no_data=True)
    if most:
        return AlarmState(name, "OK", f"{symbol} {threshold:g} in {most} of the {needed} periods it takes", prefix)
    evaluated = [v for s in series for t in starts if (v := _near(s.points, t)) is not None]
    if not evaluated:
        return AlarmState(name, "OK", f"no datapoint in the last {len(starts)} periods", prefix)
    edge = max(evaluated) if symbol.startswith(">") else min(evaluated)
    return AlarmState(name, "OK", f"{number(edge)}; alarms {symbol} {threshold:g}", prefix)


def _near(points: dict[float, float], start: float) -> float | None:
    for t, v in points.items():
        if abs(t - start) < 1e-6:
            return v
    return None
