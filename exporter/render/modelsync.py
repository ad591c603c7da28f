"""The model-sync pieces of the rendered dashboard and alarms, from modelsync's own metric table.

:func:`section` adds one dashboard section (``dashboard.build`` calls it
once), :func:`alarm_specs` the sync-failure alarm in the spec shape of
alarms.py (``alarms.alarm_specs`` calls it once). Every metric name and
dimension set goes through :func:`_metric`, which refuses anything
``modelsync.metrics.METRICS`` does not define; tests/test_catalog_agreement.py
checks the rendered files against what the recorder really emits.

Version skew: each task's daemon writes one ``ModelInSync`` event per model
per reconcile with the ``ModelArtifact`` property (the sha256 it serves).
Two Contributor Insights rules over the modelsync log group count, per
5-minute period, the distinct (model, artifact) pairs and the distinct
models; their difference is the number of artifacts served beyond one per
model, 0 when every task of every model agrees. The alarm fires when it
stays above 0 for ``VersionSkewPeriods`` periods (a rollout's own switch
shows for a period or two). CloudWatch has no "count distinct" over metric
values, which is why this is a Contributor Insights count over the log
events, not an EMF metric: exact, one alarm for every model, and $1 a month
for the two rules plus $0.02 per million events matched. The dashboard lists
the artifacts per model with the number of tasks serving each (Logs Insights).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from modelsync.metrics import BY_NAME, PHASES

from .options import Options

if TYPE_CHECKING:
    from .dashboard import Layout

FAILURE_PERIOD = 300  # any failed sync in 5 minutes
SKEW_PERIOD = 300  # at least one reconcile of every task (MODELSYNC_INTERVAL 300 in the shipped deploy)
RULE_ARTIFACTS, RULE_MODELS = "model-artifacts", "models"
CONDITION = "ModelSync"  # the parameter that says model sync is deployed


def _metric(name: str, dims: tuple[str, ...]) -> str:
    row = BY_NAME.get(name)
    if row is None:
        raise KeyError(f"modelsync does not emit {name!r}")
    if tuple(dims) not in row.dimension_sets:
        raise KeyError(f"{name} is not emitted with dimensions {list(dims)}; modelsync has {row.dimension_sets}")
    return name


def log_group(opts: Options) -> str:
    """Where the modelsync daemon's stdout (EMF and nothing else) lands: deploy/stack.yaml's awslogs group."""
    return f"{opts.log_group_prefix}/modelsync"


def _search(opts: Options, name: str, dims: tuple[str, ...], stat: str) -> str:
    from .dashboard import search_expression  # dashboard imports this module

    return search_expression(opts.namespace, _metric(name, dims), dims, stat)


def _row(opts: Options, name: str, options: dict[str, Any]) -> list[Any]:
    return [opts.namespace, _metric(name, ()), options]


SECTION = (
    "**Model sync**: S3 archives installed on every host by modelsync: attempts by result, failures per "
    "model, phase durations, time from upload to READY, and hosts serving different builds of one model "
    "(Logs Insights over the modelsync log group)."
)


def _rule_name(suffix: str) -> str:
    return f"${{AlarmNamePrefix}}-{suffix}"


def insight_rule_specs(opts: Options) -> list[dict[str, Any]]:
    """The two Contributor Insights rules of the version-skew alarm (PutInsightRule shape)."""
    in_sync = _metric("ModelInSync", ("model",))

    def rule(suffix: str, keys: list[str]) -> dict[str, Any]:
        body = {
            "Schema": {"Name": "CloudWatchLogRule", "Version": 1},
            "LogGroupNames": ["${LogGroupPrefix}/modelsync"],
            "LogFormat": "JSON",
            # One model event per model per reconcile of every task; attempts and host events are left out.
            "Contribution": {"Keys": keys, "Filters": [{"Match": f"$.{in_sync}", "IsPresent": True}]},
            "AggregateOn": "Count",
        }
        return {
            "_file": suffix,
            "_condition": CONDITION,
            "RuleName": _rule_name(suffix),
            "RuleState": "ENABLED",
            "RuleDefinition": json.dumps(body, separators=(",", ":")),
        }

    return [rule(RULE_ARTIFACTS, ["$.model", "$.ModelArtifact"]), rule(RULE_MODELS, ["$.model"])]


def skew_expressions(prefix: str) -> tuple[str, str]:
    """The two INSIGHT_RULE_METRIC expressions (rule names under ``prefix``)."""
    return (
        f"INSIGHT_RULE_METRIC('{prefix}-{RULE_ARTIFACTS}', 'UniqueContributors')",
        f"INSIGHT_RULE_METRIC('{prefix}-{RULE_MODELS}', 'UniqueContributors')",
    )


def section(opts: Options, lay: Layout) -> None:
    from . import dashboard as d  # dashboard imports this module (and alarms, which imports it too)

    lay.section(SECTION)
    lay.add(
        d._graph(
            opts,
            "Sync attempts by result (all hosts)",
            [d._expr(_search(opts, "SyncAttempts", ("result",), "Sum"), "", "e1")],
            stat="Sum",
            unit_label="attempts",
        ),
        8,
        6,
    )
    lay.add(
        d._graph(
            opts,
            "Sync failures per model",
            [d._expr(_search(opts, "SyncFailures", ("model",), "Sum"), "", "e1")],
            stat="Sum",
            unit_label="failures",
            annotations=[{"value": 0, "label": "alarm: any failure in 5 min"}],
        ),
        8,
        6,
    )
    lay.add(
        d._graph(
            opts,
            "Models in sync / out of sync (per host: min / max)",
            [
                _row(opts, "ModelsInSync", {"stat": "Minimum", "label": "in sync (min over hosts)"}),
                _row(opts, "ModelsOutOfSync", {"stat": "Maximum", "label": "out of sync (max over hosts)"}),
                _row(
                    opts,
                    "SecondsSinceLastSuccess",
                    {"stat": "Maximum", "label": "s since all in sync (worst host)", "yAxis": "right"},
                ),
            ],
        ),
        8,
        6,
    )
    lay.add(
        d._graph(
            opts,
            "Sync phase durations (ms, worst attempt)",
            [_row(opts, f"Sync{p.title()}Time", {"stat": "Maximum", "label": p}) for p in PHASES],
            stat="Maximum",
            unit_label="milliseconds",
        ),
        8,
        6,
    )
    lay.add(
        d._graph(
            opts,
            "Upload to READY per model (s, slowest host)",
            [d._expr(_search(opts, "SyncUploadToReady", ("model",), "Maximum"), "", "e1")],
            stat="Maximum",
            unit_label="seconds",
        ),
        8,
        6,
    )
    lay.add(
        d._graph(
            opts,
            "Archive bytes downloaded per model",
            [d._expr(_search(opts, "SyncBytesDownloaded", ("model",), "Sum"), "", "e1")],
            stat="Sum",
            unit_label="bytes",
        ),
        8,
        6,
    )
    group = log_group(opts)
    in_sync = _metric("ModelInSync", ("model",))
    artifacts, models = skew_expressions(opts.alarm_prefix)
    lay.add(
        d._graph(
            opts,
            "Version skew: artifacts served beyond one per model (all tasks, 5 min)",
            [
                d._expr(artifacts, "model/artifact pairs", "pairs", visible=False, period=SKEW_PERIOD),
                d._expr(models, "models", "models", visible=False, period=SKEW_PERIOD),
                d._expr("pairs - models", "extra artifacts (0: every task agrees)", "skew", period=SKEW_PERIOD),
            ],
            stat="Maximum",
            unit_label="artifacts",
            annotations=[{"value": 0, "label": "alarm: above 0 for VersionSkewPeriods x 5 min"}],
        ),
        12,
        6,
    )
    lay.add(
        d._logs(
            opts,
            "Artifacts served per model, with the tasks serving each (last reconcile of every task)",
            [group],
            "fields @timestamp, model, host, ModelArtifact"
            f"\n| filter ispresent({in_sync})"
            "\n| stats latest(ModelArtifact) as artifact by model, host"
            "\n| stats count(*) as tasks by model, artifact"
            "\n| sort model asc, tasks desc\n| limit 200",
        ),
        12,
        6,
    )
    lay.add(
        d._logs(
            opts,
            "Recent sync failures",
            [group],
            "fields @timestamp, model, result, host, reason, sha256"
            f"\n| filter {_metric('SyncFailures', ('model',))} > 0"
            "\n| sort @timestamp desc\n| limit 50",
        ),
        12,
        6,
    )


def alarm_specs(opts: Options) -> list[dict[str, Any]]:
    """The sync-failure alarm (any failed attempt on any task in 5 minutes) and the version-skew alarm
    (PutMetricAlarm shape); both exist only where model sync is deployed."""
    from .alarms import Ref  # alarms imports this module

    artifacts, models = skew_expressions("${AlarmNamePrefix}")
    return [
        {
            "_file": "model-sync-failures",
            "_actions": ("notify",),
            "_condition": CONDITION,
            "_metric": "SyncFailures",
            "AlarmName": "${AlarmNamePrefix}-model-sync-failures",
            "AlarmDescription": "modelsync could not apply a model archive on some host in the last 5 minutes "
            "(hash mismatch, missing hash, download error, disk full, unsafe archive, load failed "
            "or rolled back); the dashboard's 'Recent sync failures' widget names model and reason.",
            "Namespace": "${Namespace}",
            "MetricName": _metric("SyncFailures", ()),
            "Dimensions": [],
            "Statistic": "Sum",
            "Period": FAILURE_PERIOD,
            "EvaluationPeriods": 1,
            "DatapointsToAlarm": 1,
            "Threshold": 0.0,
            "ComparisonOperator": "GreaterThanThreshold",
            "TreatMissingData": "notBreaching",
        },
        {
            "_file": "model-version-skew",
            "_actions": ("notify",),
            "_condition": CONDITION,
            "_metric": "ModelInSync",
            "_rules": (RULE_ARTIFACTS, RULE_MODELS),
            "AlarmName": "${AlarmNamePrefix}-model-version-skew",
            "AlarmDescription": "The tasks of some model have served different artifacts for VersionSkewPeriods "
            "consecutive 5-minute periods: some hosts lag or failed an update, so one load balancer serves "
            "mixed versions. The dashboard's 'Artifacts served per model' widget names the model, the artifacts "
            "and how many tasks serve each; 'Recent sync failures' says why.",
            "Metrics": [
                {"Id": "pairs", "Expression": artifacts, "Period": SKEW_PERIOD, "ReturnData": False},
                {"Id": "models", "Expression": models, "Period": SKEW_PERIOD, "ReturnData": False},
                {
                    "Id": "skew",
                    "Expression": "pairs - models",
                    "Label": "artifacts served beyond one per model",
                    "ReturnData": True,
                },
            ],
            "EvaluationPeriods": Ref("VersionSkewPeriods"),
            "DatapointsToAlarm": Ref("VersionSkewPeriods"),
            "Threshold": 0.0,
            "ComparisonOperator": "GreaterThanThreshold",
            "TreatMissingData": "notBreaching",
        },
    ]
