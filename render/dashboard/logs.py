"""Logs: Logs Insights over the Fluent Bit log groups (errors, failed loads, per-model load history)."""

from __future__ import annotations

from ..base.options import MAX_LOG_GROUPS_PER_QUERY, Options, model_log_group
from ..base.widgets import Placed, Section, emitted, logs, text

TEXT = (
    "**Logs**: Logs Insights over the Fluent Bit log groups: recent errors and failed model loads "
    "(errors group), and load/unload history of the models named at render time (per-model groups)."
)
# The trace relay's slow-request lines (exporter/traces/source.py); the same query is in docs/tracing.md.
SLOW_REQUESTS = (
    # Not @message as a column: through FireLens it is the whole {"log": ...} record; the parsed fields say it all.
    "fields @timestamp"
    "\n| filter @message like /slow request: model=/"
    "\n| parse @message /model=(?<model>\\S+) version=(?<version>\\S+) request_ms=(?<ms>[0-9.]+)"
    " trace_id=(?<trace_id>[0-9a-f]{32}) span_id=(?<span_id>[0-9a-f]{16})/"
    "\n| fields ms * 1 as request_ms"  # parsed fields are strings: sort as a number
    "\n| sort request_ms desc\n| limit 50"
)


def widgets(opts: Options) -> list[Placed]:
    errors = f"{opts.log_group_prefix}/errors"
    groups = sorted({model_log_group(opts.log_group_prefix, m) for m in opts.models})
    history = (
        logs(
            opts,
            "Model load/unload history (per-model groups)",
            groups[:MAX_LOG_GROUPS_PER_QUERY],
            "fields @timestamp, model, version, level, message"
            "\n| filter message like /^(loading: |successfully loaded|successfully unloaded|failed to load)/"
            "\n| sort @timestamp desc\n| limit 100",
        )
        if groups
        else text(
            "**Model load/unload history**: render with `--model NAME` (repeatable) to add a "
            f"Logs Insights widget over the per-model groups `{opts.log_group_prefix}/model/<name>`; "
            "failed loads of every model are in the errors group on the left."
        )
    )
    return [
        Placed(
            logs(
                opts,
                "Recent errors and warnings (errors group)",
                [errors],
                "fields @timestamp, level, model, model_instance, version, message, @logStream"
                "\n| sort @timestamp desc\n| limit 100",
            ),
            24,
        ),
        Placed(
            logs(
                opts,
                "Failed model loads (errors group)",
                [errors],
                "fields @timestamp, model, version, message"
                '\n| filter level = "ERROR" and message like /^failed to load \'/'
                "\n| parse message /: (?<reason>[^\\n]*)/"
                "\n| stats count(*) as failures, latest(reason) as last_reason, max(@timestamp) as last_seen"
                " by model, version\n| sort last_seen desc\n| limit 100",
            ),
            12,
        ),
        Placed(history, 12),
        *(
            [
                Placed(
                    logs(
                        opts,
                        "Slowest traced requests: open a trace_id in X-Ray (exporter group)",
                        [f"{opts.log_group_prefix}/exporter"],
                        SLOW_REQUESTS,
                    ),
                    24,
                )
            ]
            if emitted(opts.catalog, "TracedRequestTime", ("model", "version"), optional=True)
            else []
        ),
    ]


SECTION = Section(TEXT, widgets)
