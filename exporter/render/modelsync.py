"""The model-sync pieces of the rendered dashboard and alarms, from modelsync's own metric table.

:func:`section` adds one dashboard section (``dashboard.build`` calls it
once), :func:`alarm_specs` the sync-failure alarm in the spec shape of
alarms.py (``alarms.alarm_specs`` calls it once). Every metric name and
dimension set goes through :func:`_metric`, which refuses anything
``modelsync.metrics.METRICS`` does not define; tests/test_catalog_agreement.py
checks the rendered files against what the recorder really emits.

The "builds per model" widget is a Logs Insights query over the modelsync
log group: each host writes one ``ModelInSync`` event per model per
reconcile with the ``ModelArtifact`` property (the sha256 it serves), so
the newest artifact per (model, host) counted per model shows a fleet
serving mixed builds, and which hosts lag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modelsync.metrics import BY_NAME, PHASES

from .options import Options

if TYPE_CHECKING:
    from .dashboard import Layout

FAILURE_PERIOD = 300  # any failed sync in 5 minutes


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
    lay.add(
        d._logs(
            opts,
            "Builds served per model (hosts on different sha256 first)",
            [group],
            "fields @timestamp, model, host, ModelArtifact"
            f"\n| filter ispresent({in_sync}) and ispresent(ModelArtifact)"
            "\n| stats latest(ModelArtifact) as artifact by model, host"
            "\n| stats count_distinct(artifact) as builds, count(*) as hosts"
            " by model\n| sort builds desc, model asc\n| limit 100",
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
    """The sync-failure alarm: any failed attempt on any host in 5 minutes (PutMetricAlarm shape)."""
    return [
        {
            "_file": "model-sync-failures",
            "_actions": ("notify",),
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
        }
    ]
