"""Model sync: attempts by result, failures, phase durations, upload to READY, bytes, each task's start (time
to serve and its phases), version skew, failures, and safe rollouts (decisions per model, rollouts in flight,
evidence waits, a timeline of every decision).

Every metric comes from model sync's pack of the catalog (``opts.modelsync``) through the one reference
checker; the phase-duration graph draws every ``Sync<Phase>Time`` metric the pack defines, the task-start graph
every ``Start<Phase>Time``. :data:`GRAPHS` is the table of per-model and per-result SEARCH graphs.
"""

from __future__ import annotations

import re
from typing import Any

from ..alarms.modelsync import SKEW_PERIOD, WAIT_ALARM_SECONDS, skew_expressions
from ..base.options import Options, modelsync_log_group
from ..base.widgets import Placed, Section, emitted, expr, graph, logs, row, search

TEXT = (
    "**Model sync**: S3 archives installed on every host by modelsync: attempts by result, failures per "
    "model, phase durations, time from upload to READY, hosts serving different builds of one model "
    "(Logs Insights over the modelsync log group), and each task's start: its time to serve and phases. With "
    "safe rollouts (--canary-fraction): each rollout's decisions per model, the rollouts in flight, and a "
    "timeline of every decision with its evidence."
)
PHASE = re.compile(r"Sync([A-Z][a-z]+)Time")
START_PHASE = re.compile(r"Start([A-Z][A-Za-z]+)Time")

# title, metric, dimension set, statistic, y-axis label, annotations
GRAPHS: tuple[tuple[str, str, tuple[str, ...], str, str, list[dict[str, Any]] | None], ...] = (
    ("Sync attempts by result (all hosts)", "SyncAttempts", ("result",), "Sum", "attempts", None),
    (
        "Sync failures per model",
        "SyncFailures",
        ("model",),
        "Sum",
        "failures",
        [{"value": 0, "label": "alarm: any failure in 5 min"}],
    ),
)
LATER_GRAPHS: tuple[tuple[str, str, tuple[str, ...], str, str, list[dict[str, Any]] | None], ...] = (
    ("Upload to READY per model (s, slowest host)", "SyncUploadToReady", ("model",), "Maximum", "seconds", None),
    ("Archive bytes downloaded per model", "SyncBytesDownloaded", ("model",), "Sum", "bytes", None),
)


def _searches(opts: Options, table: tuple[tuple[str, str, tuple[str, ...], str, str, Any], ...]) -> list[Placed]:
    return [
        Placed(
            graph(
                opts,
                title,
                [expr(search(opts, metric, dims, stat, catalog=opts.modelsync), "", "e1")],
                stat=stat,
                unit_label=label,
                annotations=annotations,
            )
        )
        for title, metric, dims, stat, label, annotations in table
    ]


def widgets(opts: Options) -> list[Placed]:
    pack = opts.modelsync
    phases = [(m.name, match.group(1).lower()) for m in pack.metrics if (match := PHASE.fullmatch(m.name))]
    group = modelsync_log_group(opts)
    in_sync = emitted(pack, "ModelInSync", ("model",))
    failures = emitted(pack, "SyncFailures", ("model",))
    artifacts, models = skew_expressions(opts.alarm_prefix)
    hosts = graph(
        opts,
        "Models in sync / out of sync (per host: min / max)",
        [
            row(opts, "ModelsInSync", {"stat": "Minimum", "label": "in sync (min over hosts)"}, pack),
            row(opts, "ModelsOutOfSync", {"stat": "Maximum", "label": "out of sync (max over hosts)"}, pack),
            row(
                opts,
                "SecondsSinceLastSuccess",
                {"stat": "Maximum", "label": "s since all in sync (worst host)", "yAxis": "right"},
                pack,
            ),
        ],
    )
    durations = graph(
        opts,
        "Sync phase durations (ms, worst attempt)",
        [row(opts, name, {"stat": "Maximum", "label": label}, pack) for name, label in phases],
        stat="Maximum",
        unit_label="milliseconds",
    )
    skew = graph(
        opts,
        "Version skew: artifacts served beyond one per model (all tasks, 5 min)",
        [
            expr(artifacts, "model/artifact pairs", "pairs", visible=False, period=SKEW_PERIOD),
            expr(models, "models", "models", visible=False, period=SKEW_PERIOD),
            expr("pairs - models", "extra artifacts (0: every task agrees)", "skew", period=SKEW_PERIOD),
        ],
        stat="Maximum",
        unit_label="artifacts",
        annotations=[{"value": 0, "label": "alarm: above 0 for VersionSkewPeriods x 5 min"}],
    )
    served = logs(
        opts,
        "Artifacts served per model, with the tasks serving each (last reconcile of every task)",
        [group],
        "fields @timestamp, model, host, ModelArtifact"
        f"\n| filter ispresent({in_sync})"
        "\n| stats latest(ModelArtifact) as artifact by model, host"
        "\n| stats count(*) as tasks by model, artifact"
        "\n| sort model asc, tasks desc\n| limit 200",
    )
    recent = logs(
        opts,
        "Recent sync failures",
        [group],
        "fields @timestamp, model, result, host, reason, sha256"
        f"\n| filter {failures} > 0"
        "\n| sort @timestamp desc\n| limit 50",
    )
    return [
        *_searches(opts, GRAPHS),
        Placed(hosts),
        Placed(durations),
        *_searches(opts, LATER_GRAPHS),
        *start_widgets(opts),
        Placed(skew, 12),
        Placed(served, 12),
        Placed(recent, 24),  # a row of its own: the rollout graphs after it fill the next row, three of 8
        *rollout_widgets(opts),
    ]


def start_widgets(opts: Options) -> list[Placed]:
    """Each task's start (modelsync/startup.py): ``TimeToServe`` beside every ``Start<Phase>Time`` the pack
    defines (phases are unions of wall-clock intervals and may overlap, so they are drawn side by side, never
    stacked), and one row per start from the daemon's ``task start`` log line."""
    pack = opts.modelsync
    phases = [(m.name, match.group(1)) for m in pack.metrics if (match := START_PHASE.fullmatch(m.name))]
    labels = {name: re.sub(r"(?<!^)(?=[A-Z])", " ", part).lower() for name, part in phases}
    starts = graph(
        opts,
        "Task start: time to serve and its phases (s, slowest start)",
        [
            row(opts, "TimeToServe", {"stat": "Maximum", "label": "time to serve"}, pack),
            *(row(opts, name, {"stat": "Maximum", "label": labels[name]}, pack) for name, _ in phases),
        ],
        stat="Maximum",
        unit_label="seconds",
    )
    per_start = logs(
        opts,
        "Task starts, newest first: time to serve and its phases (s), bytes downloaded, reused from the store",
        [modelsync_log_group(opts)],
        "fields @timestamp, host, time_to_serve_s, phases.wait as wait, phases.list as list,"
        " phases.download as download, phases.verify as verify, phases.place as place, phases.load as load,"
        " phases.first_ready as first_ready, bytes_downloaded, reused"
        # The daemon's JSON line only: the start's EMF event is in the same group, with the same host.
        '\n| filter logger = "modelsync" and ispresent(time_to_serve_s)'
        "\n| sort @timestamp desc\n| limit 100",
    )
    return [Placed(starts), Placed(per_start, 16)]


ROLLOUT_GRAPHS: tuple[tuple[str, str, tuple[str, ...], str, str, list[dict[str, Any]] | None], ...] = (
    ("Rollouts promoted per model", "RolloutsPromoted", ("model",), "Sum", "promotions", None),
    (
        "Rollouts rejected per model",
        "RolloutsRejected",
        ("model",),
        "Sum",
        "rejections",
        [{"value": 0, "label": "alarm: any rejection in 5 min"}],
    ),
)


def rollout_widgets(opts: Options) -> list[Placed]:
    """Safe rollouts: promotions and rejections per model, what is in flight and waiting, and every decision
    with its evidence, model by model (Logs Insights over the decision log lines: the timeline)."""
    pack = opts.modelsync
    flight = graph(
        opts,
        "Rollouts in flight (max over hosts) and evidence wait past the bake (s, worst)",
        [
            row(opts, "RolloutsInFlight", {"stat": "Maximum", "label": "in flight"}, pack),
            row(
                opts,
                "RolloutEvidenceWait",
                {"stat": "Maximum", "label": "s waiting for --bake-min-requests", "yAxis": "right"},
                pack,
            ),
        ],
        annotations=[{"value": WAIT_ALARM_SECONDS, "label": "alarm: waiting 30 min", "yAxis": "right"}],
    )
    decisions = logs(
        opts,
        "Rollout timeline per model: every decision with its evidence (newest first)",
        [modelsync_log_group(opts)],
        "fields @timestamp, model, verdict, host, artifact, previous, reason,"
        " evidence.canary.requests as canary_requests, evidence.canary.failure_ratio as canary_failures,"
        " evidence.canary.avg_ms as canary_ms, evidence.baseline.avg_ms as baseline_ms"
        # The decision lines only: a decision with a metric is also in the group as an EMF event (model sync's
        # stdout goes there too), which would be its second row.
        '\n| filter logger = "modelsync.rollout" and ispresent(verdict)'
        "\n| sort model asc, @timestamp desc\n| limit 200",
    )
    return [*_searches(opts, ROLLOUT_GRAPHS), Placed(flight), Placed(decisions, 24)]


SECTION = Section(TEXT, widgets)
