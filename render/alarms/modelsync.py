"""Model sync's alarms and Contributor Insights rules, from model sync's pack of the catalog.

Every alarm here exists only where model sync is deployed (the ``ModelSync``
parameter). Every metric goes through :func:`~render.base.widgets.emitted`
against ``opts.modelsync``, the pack the daemon encodes its events from;
tests/unit/render/test_catalog_agreement.py checks the rendered files against what the
recorder really emits.

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
for the two rules plus $0.02 per million events matched.
"""

from __future__ import annotations

import json

from ..base.options import Options
from ..base.params import Ref
from ..base.widgets import emitted
from .spec import NOTIFY, MetricAlarm, RuleSpec, Spec

FAILURE_PERIOD = 300  # any failed sync in 5 minutes
SKEW_PERIOD = 300  # at least one reconcile of every task (MODELSYNC_INTERVAL 300 in the shipped deploy)
RULE_ARTIFACTS, RULE_MODELS = "model-artifacts", "models"
CONDITION = "ModelSync"  # the parameter that says model sync is deployed

SYNC_FAILURES = MetricAlarm(
    suffix="model-sync-failures",
    description="modelsync could not apply a model archive on some host in the last 5 minutes "
    "(hash mismatch, missing hash, download error, disk full, unsafe archive, load failed "
    "or rolled back); the dashboard's 'Recent sync failures' widget names model and reason.",
    metric="SyncFailures",
    stat="Sum",
    period=FAILURE_PERIOD,
    points=1,
    threshold=0.0,
    condition=CONDITION,
)


# Safe rollouts (--canary-fraction): written only when rollouts happen, so missing data is not breaching.
ROLLOUT_PERIOD = 300
WAIT_ALARM_SECONDS = 1800.0  # half an hour past the bake without --bake-min-requests on the canaries

ROLLOUT_REJECTED = MetricAlarm(
    suffix="model-rollout-rejected",
    description="A safe rollout rejected a new model artifact in the last 5 minutes: its canaries failed more "
    "requests or answered slower than the hosts on the previous artifact (or could not load it). The canaries "
    "went back to the previous artifact and no other host installed it; it stays rejected until a different "
    "upload or `python -m modelsync rollout promote`. The dashboard's 'Rollout decisions' widget shows the "
    "evidence.",
    metric="RolloutsRejected",
    stat="Sum",
    period=ROLLOUT_PERIOD,
    points=1,
    threshold=0.0,
    condition=CONDITION,
)
ROLLOUT_WAITING = MetricAlarm(
    suffix="model-rollout-waiting",
    description="A safe rollout has waited over 30 minutes past its bake for --bake-min-requests requests on "
    "its canaries: silence never promotes, so the new artifact serves only there. Send traffic, or decide with "
    "`python -m modelsync rollout promote|reject MODEL`; `rollout status` shows the evidence so far.",
    metric="RolloutEvidenceWait",
    stat="Maximum",
    period=ROLLOUT_PERIOD,
    points=1,
    threshold=WAIT_ALARM_SECONDS,
    condition=CONDITION,
)


def skew_expressions(prefix: str) -> tuple[str, str]:
    """The two INSIGHT_RULE_METRIC expressions (rule names under ``prefix``)."""
    return (
        f"INSIGHT_RULE_METRIC('{prefix}-{RULE_ARTIFACTS}', 'UniqueContributors')",
        f"INSIGHT_RULE_METRIC('{prefix}-{RULE_MODELS}', 'UniqueContributors')",
    )


def insight_rule_specs(opts: Options) -> list[RuleSpec]:
    """The two Contributor Insights rules of the version-skew alarm (PutInsightRule shape)."""
    in_sync = emitted(opts.modelsync, "ModelInSync", ("model",))

    def rule(suffix: str, keys: list[str]) -> RuleSpec:
        body = {
            "Schema": {"Name": "CloudWatchLogRule", "Version": 1},
            "LogGroupNames": ["${LogGroupPrefix}/modelsync"],
            "LogFormat": "JSON",
            # One model event per model per reconcile of every task; attempts and host events are left out.
            "Contribution": {"Keys": keys, "Filters": [{"Match": f"$.{in_sync}", "IsPresent": True}]},
            "AggregateOn": "Count",
        }
        return RuleSpec(
            suffix,
            {
                "RuleName": f"${{AlarmNamePrefix}}-{suffix}",
                "RuleState": "ENABLED",
                "RuleDefinition": json.dumps(body, separators=(",", ":")),
            },
            CONDITION,
        )

    return [rule(RULE_ARTIFACTS, ["$.model", "$.ModelArtifact"]), rule(RULE_MODELS, ["$.model"])]


def alarm_specs(opts: Options) -> list[Spec | None]:
    """The sync-failure alarm (any failed attempt on any task in 5 minutes), the version-skew alarm, and the
    two of safe rollouts (a rejection; a rollout waiting too long for evidence)."""
    artifacts, models = skew_expressions("${AlarmNamePrefix}")
    body = {
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
    }
    skew = Spec(
        "model-version-skew",
        body,
        NOTIFY,
        CONDITION,
        metric=emitted(opts.modelsync, "ModelInSync", ("model",)) or "",
        rules=(RULE_ARTIFACTS, RULE_MODELS),
    )
    return [
        SYNC_FAILURES.spec(opts.modelsync),
        skew,
        ROLLOUT_REJECTED.spec(opts.modelsync),
        ROLLOUT_WAITING.spec(opts.modelsync),
    ]
