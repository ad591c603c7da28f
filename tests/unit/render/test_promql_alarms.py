"""The PromQL alarms (render/alarms/promql.py): valid for the API, CloudFormation and Terraform, built from
the catalog, and querying what the OTLP metrics output really sends.

- botocore's PutMetricAlarm model (1.44.8: ``EvaluationCriteria.PromQLCriteria``, ``EvaluationInterval``) accepts
  every CLI file; the template that holds them passes cfn-lint (tests/unit/render/test_render.py lints it whole;
  here a bad interval is shown to fail both, so neither check is vacuous);
- a family the ``--metrics`` selection does not send gets no alarm, a source of an ``or`` is dropped alone, and a
  family or label the catalog does not have stops the render;
- every metric name and label a rendered query names is one the OTLP output sends (the real output, encoder and
  protobuf, over the golden /metrics fixtures, the repository index and the fake NVML): a renamed family, a
  renamed label or a changed ``triton_exporter_`` name fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import botocore.session
import orjson
import pytest
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters
from cfnlint.api import lint_all
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

from catalog import build
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.sources.nvml import NvmlSource
from exporter.sources.promtext import Parser
from render import render
from render.alarms import promql_specs
from render.alarms.promql import PROMQL, PromQLAlarm
from render.base.options import Options
from render.base.widgets import sent
from render.template import build as build_template
from tests.support import nvml_fake as fk
from tests.support.helpers import CATALOG, IndexSource, TextSource
from tests.support.otlp_recording import Recording
from tests.support.paths import REPO

ROOT = REPO
GOLDEN = ROOT / "tests" / "fixtures" / "golden"
PUT = botocore.session.get_session().get_service_model("cloudwatch").operation_model("PutMetricAlarm").input_shape
DEFAULT = Options(catalog=CATALOG)
COVERED = {"failures", "latency", "ttft", "kv", "ready", "gpu"}  # the classic alarms' conditions


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return render(DEFAULT)


def promql_files(files: dict[str, str]) -> dict[str, dict]:
    return {rel: json.loads(t) for rel, t in files.items() if rel.startswith("alarms/cli/promql/promql-")}


# --- the API's and CloudFormation's own validators ----------------------------------------------------


def test_every_cli_file_passes_botocores_put_metric_alarm_model(files) -> None:
    bodies = promql_files(files)
    assert len(bodies) == len(PROMQL) == 6
    for body in bodies.values():
        validate_parameters(body, PUT)
        criteria = body["EvaluationCriteria"]["PromQLCriteria"]
        assert set(body) <= {"AlarmName", "AlarmDescription", "EvaluationCriteria", "EvaluationInterval"}
        assert 0 < len(criteria["Query"]) <= 10_000 and "${" not in criteria["Query"]
        assert body["EvaluationInterval"] == 60 and 0 <= criteria["PendingPeriod"] <= 86_400
    apply = files["alarms/cli/promql/apply.sh"]
    assert 'for f in promql-*.json; do\n  aws cloudwatch put-metric-alarm --cli-input-json "file://$f"' in apply
    assert "alarm-" not in " ".join(r for r in files if r.startswith("alarms/cli/promql/"))  # apply.sh's glob


def test_botocore_and_cfn_lint_refuse_a_bad_promql_alarm(files) -> None:
    body = json.loads(files["alarms/cli/promql/promql-model-failures.json"])
    for bad in ({"EvaluationInterval": 5}, {"EvaluationCriteria": {"PromQLCriteria": {"PendingPeriod": 0}}}):
        with pytest.raises(ParamValidationError):
            validate_parameters(body | bad, PUT)
    template = json.loads(files["alarms/triton-alarms.template.json"])
    assert [m for m in lint_all(json.dumps(template)) if m.rule.id != "I4010"] == []
    template["Resources"]["AlarmPromqlModelFailures"]["Properties"]["EvaluationInterval"] = 5
    assert [m for m in lint_all(json.dumps(template)) if m.rule.id != "I4010"] != []


def test_the_template_creates_them_only_with_otlp_metrics() -> None:
    template = build_template(DEFAULT)
    promql = {n: r for n, r in template["Resources"].items() if "EvaluationCriteria" in r.get("Properties", {})}
    assert len(promql) == len(PROMQL)
    assert {r["Condition"] for r in promql.values()} == {"OtlpMetricsEnabled"}
    assert template["Conditions"]["OtlpMetricsEnabled"] == {"Fn::Equals": [{"Ref": "OtlpMetrics"}, "true"]}
    assert template["Parameters"]["OtlpMetrics"]["Default"] == "false"
    query = promql["AlarmPromqlModelFailures"]["Properties"]["EvaluationCriteria"]["PromQLCriteria"]["Query"]
    assert query == {"Fn::Sub": "sum by (model) (increase(nv_inference_request_failure[5m])) > ${FailureThreshold}"}


# --- built from the catalog -----------------------------------------------------------------------------


def _queries(opts: Options) -> dict[str, str]:
    return {s.file: s.body["EvaluationCriteria"]["PromQLCriteria"]["Query"] for s in promql_specs(opts)}


def test_the_conditions_of_the_classic_alarms_are_covered_with_the_same_thresholds(files) -> None:
    q = {f: b["EvaluationCriteria"]["PromQLCriteria"]["Query"] for f, b in promql_files(files).items()}
    by = {k.rsplit("/", 1)[1].removeprefix("promql-").removesuffix(".json"): v for k, v in q.items()}
    assert by["model-failures"].endswith("> 5.0")
    assert by["model-latency-p95"].endswith("> 500000.0")  # latency_slo_ms 500, in microseconds
    assert by["model-ttft-p95"].endswith("> 2000.0") and "histogram_quantile(0.95, " in by["model-ttft-p95"]
    assert by["model-kv-cache-high"].endswith("> 90.0")
    assert by["model-not-ready"] == "triton_exporter_model_ready == 0"
    assert by["gpu-memory-high"].endswith("> 95.0")
    assert len(by) == len(COVERED)
    tighter = _queries(Options(catalog=CATALOG, failure_threshold=1, ttft_p95_ms=300))
    assert tighter["promql-model-failures"].endswith("> ${FailureThreshold}")  # tokens until resolved


def test_a_family_the_selection_does_not_send_gets_no_alarm() -> None:
    kv = CATALOG.select("-KvCache*,-RuntimeGpuMemory,-RuntimeCpuMemory,-RuntimePinnedMemory")
    assert "promql-model-kv-cache-high" not in _queries(Options(catalog=kv))
    # Triton's GPU memory left out: the NVML source's alone, no `or`.
    nv = CATALOG.select("-GpuMemoryUsed,-GpuMemoryTotal,-GpuMemoryUsedPercent")
    assert "promql-gpu-memory-high" not in _queries(Options(catalog=nv))
    core = Options(catalog=build(packs=("core",)))  # no LLM pack: Triton's first-response histogram alone
    ttft = _queries(core)["promql-model-ttft-p95"]
    assert "vllm:" not in ttft and ttft.startswith("histogram_quantile(0.95, sum by (model) (rate(nv_inference_first")
    assert "promql-model-kv-cache-high" not in _queries(core)
    assert "promql-model-not-ready" not in _queries(Options(catalog=CATALOG.select("-ModelReady")))


def test_an_unknown_family_or_label_stops_the_render() -> None:
    renamed = PromQLAlarm("x", "x", ("sum by (model) (rate(<nv_inference_request_failures>[5m]))",), "> 1", 0)
    with pytest.raises(KeyError, match="nv_inference_request_failures"):
        renamed.spec(DEFAULT)
    relabelled = PromQLAlarm("x", "x", ("sum by (modell) (rate(<nv_inference_request_failure>[5m]))",), "> 1", 0)
    with pytest.raises(KeyError, match="modell"):
        relabelled.spec(DEFAULT)
    with pytest.raises(KeyError, match="gpu_uuid"):
        sent(CATALOG, "ModelReady", ("gpu_uuid",))
    assert sent(CATALOG, "nv_inference_request_summary_us", ("model", "quantile")) == "nv_inference_request_summary_us"


# --- the queries against what the OTLP output sends -------------------------------------------------------


def configs(case: Path) -> dict[str, bytes]:
    """What the model config API answered for the fixture's versions (the ``decoupled`` label comes from it)."""
    f = case / "configs.json"
    return {k: orjson.dumps(v) for k, v in orjson.loads(f.read_bytes()).items()} if f.exists() else {}


def sent_series() -> dict[str, tuple[str, set[str]]]:
    """OTLP metric name -> (its data kind, every point label it carried), over the golden fixtures."""
    out: dict[str, tuple[str, set[str]]] = {}
    for case in ("gpu_multi_instance", "real_triton", "tensorrt_llm", "vllm"):
        d = GOLDEN / case
        texts = [(d / f"metrics-{i}.txt").read_text() for i in (1, 2)]
        text_source = TextSource(*texts)
        text_source.parser = Parser(CATALOG.wanted_samples())
        nvml = NvmlSource(fk.FakeNvml(fk.gpus(1)), {})
        nvml.start()
        rec = Recording()
        pipe = Pipeline(
            Settings(nvml="auto", timeout=1.0),
            CATALOG,
            [text_source, IndexSource((d / "index.json").read_bytes(), configs(d)), nvml],
            outputs=[rec],
        )
        try:
            pipe.cycle()
            pipe.cycle()
        finally:
            pipe.close(outputs_timeout=1.0)
        for data, _ in rec.items:
            m = Metric()
            m.ParseFromString(data)
            kind = m.WhichOneof("data")
            labels = {kv.key for p in getattr(m, kind).data_points for kv in p.attributes}
            out.setdefault(m.name, (kind, set()))[1].update(labels)
    return out


FUNCTIONS = {"sum", "max", "min", "avg", "by", "rate", "increase", "histogram_quantile", "or", "and", "unless"}
_TOKEN = re.compile(r'"[^"]*"|[A-Za-z_:][A-Za-z0-9_:]*')


def query_names(query: str) -> tuple[set[str], set[str], set[str]]:
    """(metric names, label names, names inside histogram_quantile) of a query, read from its text alone."""
    labels = {x.strip() for m in re.findall(r"\bby \(([^)]*)\)", query) for x in m.split(",")}
    labels |= set(re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)=", query))
    bare = re.sub(r"\$\{\w+\}|\[[^\]]*\]|\b\d+(\.\d+)?\b", " ", query)  # thresholds, ranges, numbers
    names = {t for t in _TOKEN.findall(bare) if not t.startswith('"')} - FUNCTIONS - labels
    quantile_of = r"histogram_quantile\([0-9.]+, sum by \([^)]*\) \(rate\(([A-Za-z_:][\w:]*)(?:\{[^}]*\})?\["
    histograms = set(re.findall(quantile_of, query))
    return names, labels, histograms


def test_every_name_and_label_a_query_reads_is_sent_by_the_otlp_output() -> None:
    series = sent_series()
    queries = _queries(DEFAULT)
    assert len(queries) == len(PROMQL)
    used: set[str] = set()
    for alarm, query in queries.items():
        parts = [query_names(part) for part in query.split(") or (")]  # each source of an `or` on its own
        assert all(names for names, _, _ in parts), alarm
        for name, labels, histograms in ((n, lb, h) for names, lb, h in parts for n in names):
            assert name in series, f"{alarm}: {name} is not sent (sent: {sorted(series)})"
            kind, carried = series[name]
            wanted = labels & {"model", "gpu_uuid", "quantile", "kv_cache_block_type", "version", "reason", "decoupled"}
            assert wanted <= carried | {"le"}, f"{alarm}: {name} has labels {carried}, the query reads {wanted}"
            if name in histograms:
                assert kind == "histogram", f"{alarm}: {name} is queried as a native histogram but sent as {kind}"
        used |= {n for names, _, _ in parts for n in names}
    # Not vacuous: every family and own metric the table names was sent by some fixture.
    assert {"vllm:time_to_first_token_seconds", "nvml_memory_used_bytes", "triton_exporter_model_ready"} <= used
    assert series["nv_inference_request_summary_us"][0] == "gauge"  # the quantiles, as docs/otlp.md says


def test_a_renamed_own_metric_would_not_be_found() -> None:
    """The own-metric name comes from catalog/otlp.py, which the output uses too: both move together."""
    assert "triton_exporter_model_ready" in sent_series()
    assert sent(CATALOG, "ModelReady", ("model",)) == "triton_exporter_model_ready"
