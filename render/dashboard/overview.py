"""Overview: is Triton up on every task, are the models loaded, traffic, failures by reason, alarm states."""

from __future__ import annotations

from ..alarms import alarm_names
from ..base.options import Options
from ..base.widgets import MAX_ALARMS_PER_WIDGET, Placed, Section, expr, graph, insights, row

TEXT = (
    "**Overview**: is Triton up on every task, are the models loaded, how much traffic and how many "
    "failures (by Triton's reason), and the state of every alarm."
)


def widgets(opts: Options) -> list[Placed]:
    arn = f"arn:{opts.partition}:cloudwatch:{opts.region}:{opts.account_id}:alarm:"
    alarms = [arn + name for name in alarm_names(opts)][:MAX_ALARMS_PER_WIDGET]  # fleet-wide alarms come first
    reasons = [m for m in opts.catalog.defined if m.breakdown_of == "RequestFailure"]
    status = graph(
        opts,
        "Status (worst task)",
        [
            row(opts, "TritonUp", {"stat": "Minimum", "label": "Triton up (min over tasks)"}),
            row(opts, "ModelsReady", {"stat": "Minimum", "label": "Model versions ready (min)"}),
            row(opts, "ModelsNotReady", {"stat": "Maximum", "label": "Model versions not ready (max)"}),
            row(opts, "ModelLoadSuccessRate", {"stat": "Minimum", "label": "Load success % (min)"}),
            row(opts, "ExporterHeartbeat", {"stat": "Sum", "label": "Exporter heartbeats/min (~tasks)"}),
        ],
        view="singleValue",
    )
    alarm_widget = (
        {"type": "alarm", "properties": {"title": "Alarms", "alarms": alarms, "sortBy": "stateUpdatedTimestamp"}}
        if alarms
        else None
    )
    return [
        Placed(status, 12, 4),
        Placed(alarm_widget, 12, 4),
        Placed(
            graph(
                opts,
                "Requests per second (all models, all tasks)",
                [
                    row(opts, "RequestSuccess", {"id": "ok", "stat": "Sum", "visible": False}),
                    row(opts, "RequestFailure", {"id": "ko", "stat": "Sum", "visible": False}),
                    expr("ok/PERIOD(ok)", "success/s", "okrate"),
                    expr("ko/PERIOD(ko)", "failure/s", "korate"),
                ],
                unit_label="requests/s",
            )
        ),
        Placed(
            graph(
                opts,
                "Failures by reason (all models)",
                [
                    expr(
                        insights(opts, "SUM", m.name, ("model", "version")),
                        m.inputs[0].where[1] if m.inputs[0].where else m.name,
                        f"r{i}",
                    )
                    for i, m in enumerate(reasons)
                ],
                stat="Sum",
                unit_label="failed requests",
            )
        ),
        Placed(
            graph(
                opts,
                "Model versions ready / not ready, load success %",
                [
                    row(opts, "ModelsReady", {"stat": "Minimum", "label": "ready (min over tasks)"}),
                    row(opts, "ModelsNotReady", {"stat": "Maximum", "label": "not ready (max over tasks)"}),
                    row(
                        opts,
                        "ModelLoadSuccessRate",
                        {"stat": "Minimum", "label": "load success % (min)", "yAxis": "right"},
                    ),
                ],
                annotations=[{"value": opts.load_success_rate, "label": "load alarm", "yAxis": "right"}],
            )
        ),
    ]


SECTION = Section(TEXT, widgets)
