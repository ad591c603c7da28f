"""PromQL alarms on what the OTLP metrics output sends (docs/otlp.md), beside the classic alarms on EMF.

One :class:`PromQLAlarm` per condition the classic alarms (:mod:`.core`) cover: failures, p95 latency,
time to first token, KV cache, a model not ready, GPU memory. Each is a ``PutMetricAlarm`` with
``EvaluationCriteria.PromQLCriteria`` (``Query``, ``PendingPeriod``, ``RecoveryPeriod``) and
``EvaluationInterval``, no metric, statistic, period or threshold field: the query's result vector is
what breaches, each series a contributor (botocore 1.44.8's model; ``AWS::CloudWatch::Alarm`` in
cfn-lint 1.58.0). Thresholds are the same parameters as the classic alarms' (``${FailureThreshold}``...),
written into the query text.

Queries are built from the catalog: ``<name>`` in a source expression is a family
(``<nv_inference_request_failure>``) or an exporter-computed metric (``<ModelReady>``, sent as
``triton_exporter_model_ready``), each checked by :func:`~render.base.widgets.sent` with the
labels the expression names (``by (...)``, ``{label="..."}``). A source whose names the selection does
not send is left out; an alarm left with no source is not rendered, so a deselected family gets no
alarm. Several sources (Triton's and NVML's GPU memory, vLLM's and Triton's time to first token) are
joined with ``or``: the first that has a series for a label set wins.

Histograms are queried as OTLP sends them, native: ``histogram_quantile(0.95, sum by (model)
(rate(x[5m])))``, no ``_bucket`` and no ``le`` (docs/dashboards.md, "PromQL alarms", says why).

All exist only with OTLP metrics on (the ``OtlpMetrics`` parameter); they notify, never scale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..base.options import Options
from ..base.widgets import sent
from .spec import NOTIFY, Spec

CONDITION = "OtlpMetrics"  # the parameter that says the OTLP metrics output is deployed
INTERVAL = 60  # EvaluationInterval, s: the exporter's default cycle
RECOVERY = 300  # RecoveryPeriod, s: 5 minutes without breaching before a contributor is OK again

_NAME = re.compile(r"<([A-Za-z_:][A-Za-z0-9_:]*)>")
_BY = re.compile(r"\bby \(([^)]*)\)")
_MATCHER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)=")


@dataclass(frozen=True)
class PromQLAlarm:
    """A PromQL alarm: ``(source or source ...) comparison``, breaching for ``pending`` seconds."""

    suffix: str
    description: str
    sources: tuple[str, ...]  # PromQL expressions with <family> / <OwnMetric> names
    comparison: str  # "> ${FailureThreshold}", "== 0"
    pending: int  # PendingPeriod, s: how long a contributor breaches before ALARM
    recovery: int = RECOVERY
    optional: tuple[str, ...] = ()  # names of an optional pack (LLM), absent when it is off

    def expression(self, opts: Options) -> str | None:
        """The query, or None when the selection sends none of any source's names."""
        kept = [e for e in (self._source(s, opts) for s in self.sources) if e is not None]
        if not kept:
            return None
        body = kept[0] if len(kept) == 1 else "(" + " or ".join(f"({e})" for e in kept) + ")"
        return f"{body} {self.comparison}"

    def _source(self, source: str, opts: Options) -> str | None:
        grouped = [x.strip() for m in _BY.findall(source) for x in m.split(",") if x.strip()]
        labels = tuple(dict.fromkeys([*grouped, *_MATCHER.findall(source)]))
        names = {n: sent(opts.catalog, n, labels, n in self.optional) for n in _NAME.findall(source)}
        if not names or None in names.values():
            return None
        return _NAME.sub(lambda m: str(names[m.group(1)]), source)

    def spec(self, opts: Options) -> Spec | None:
        query = self.expression(opts)
        if query is None:
            return None
        body = {
            "AlarmName": f"${{AlarmNamePrefix}}-{self.suffix}",
            "AlarmDescription": self.description,
            "EvaluationCriteria": {
                "PromQLCriteria": {"Query": query, "PendingPeriod": self.pending, "RecoveryPeriod": self.recovery}
            },
            "EvaluationInterval": INTERVAL,
        }
        return Spec(self.suffix, body, NOTIFY, CONDITION)


PROMQL: tuple[PromQLAlarm, ...] = (
    PromQLAlarm(
        suffix="promql-model-failures",
        description="PromQL (OTLP): a model had more failed inference requests than FailureThreshold in 5 minutes, "
        "summed over its tasks (each model a contributor).",
        sources=("sum by (model) (increase(<nv_inference_request_failure>[5m]))",),
        comparison="> ${FailureThreshold}",
        pending=0,
    ),
    PromQLAlarm(
        suffix="promql-model-latency-p95",
        description="PromQL (OTLP): a model's p95 request latency stayed above LatencySloMicroseconds for 5 minutes: "
        "Triton's summary quantile (worst task), else vLLM's end-to-end latency histogram over all tasks.",
        sources=(
            'max by (model) (<nv_inference_request_summary_us>{quantile="0.95"})',
            "histogram_quantile(0.95, sum by (model) (rate(<vllm:e2e_request_latency_seconds>[5m]))) * 1000000",
        ),
        comparison="> ${LatencySloMicroseconds}",
        pending=300,
        optional=("vllm:e2e_request_latency_seconds",),
    ),
    PromQLAlarm(
        suffix="promql-model-ttft-p95",
        description="PromQL (OTLP): a model's time to first token p95 over all its tasks stayed above "
        "TtftP95Milliseconds for 5 minutes (vLLM's histogram, else Triton's first-response histogram of decoupled "
        "models).",
        sources=(
            "histogram_quantile(0.95, sum by (model) (rate(<vllm:time_to_first_token_seconds>[5m]))) * 1000",
            # decoupled="true": added by the OTLP output from the model's configuration; the same histogram of
            # a model that is not decoupled is its whole request latency, not time to first token (Triton 26.01+)
            "histogram_quantile(0.95, sum by (model) "
            '(rate(<nv_inference_first_response_histogram_ms>{decoupled="true"}[5m])))',
        ),
        comparison="> ${TtftP95Milliseconds}",
        pending=300,
        optional=("vllm:time_to_first_token_seconds",),
    ),
    PromQLAlarm(
        suffix="promql-model-kv-cache-high",
        description="PromQL (OTLP): a model's KV-cache utilization (worst task) stayed above "
        "KvCacheUtilizationThreshold percent for 5 minutes: requests will queue.",
        sources=('max by (model) (<nv_trt_llm_kv_cache_block_metrics>{kv_cache_block_type="fraction"}) * 100',),
        comparison="> ${KvCacheUtilizationThreshold}",
        pending=300,
        optional=("nv_trt_llm_kv_cache_block_metrics",),
    ),
    PromQLAlarm(
        suffix="promql-model-not-ready",
        description="PromQL (OTLP): a model version the repository index lists has not been READY on some task "
        "for 3 minutes (each model, version and task a contributor).",
        sources=("<ModelReady>",),
        comparison="== 0",
        pending=180,
    ),
    PromQLAlarm(
        suffix="promql-gpu-memory-high",
        description="PromQL (OTLP): GPU memory above GpuMemoryThreshold percent on some GPU for 10 minutes "
        "(Triton's GPU metrics, else the NVML source's; each GPU a contributor).",
        sources=(
            "max by (gpu_uuid) (<nv_gpu_memory_used_bytes> / <nv_gpu_memory_total_bytes>) * 100",
            "max by (gpu_uuid) (<nvml_memory_used_bytes> / <nvml_memory_total_bytes>) * 100",
        ),
        comparison="> ${GpuMemoryThreshold}",
        pending=600,
    ),
)


def promql_specs(opts: Options) -> list[Spec]:
    """The PromQL alarms whose families the selection sends."""
    return [s for s in (a.spec(opts) for a in PROMQL) if s is not None]
