"""OpenTelemetry's GenAI server metrics in the OTLP output (--otlp-semconv genai, docs/otlp.md): upstream-shaped
/metrics bodies (vLLM with its families, a decoupled Python model on its own first-response buckets, an ONNX
classifier, TensorRT-LLM streaming and not) through the real output to a local endpoint that checks SigV4 and
decodes with opentelemetry-proto; the conversion to seconds; what the coverage says of a model that gets none."""

from __future__ import annotations

import time
from collections.abc import Callable
from fractions import Fraction

import orjson
import pytest
from botocore.credentials import Credentials
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric

from catalog import build, genai
from demo.payloads import FIRST_RESPONSE_BUCKETS, VLLM_STEP, llm_metrics, triton_metrics
from exporter.config import ConfigError, Settings, load
from exporter.otlp_output import OtlpMetricsOutput
from exporter.pipeline import CycleResult, Pipeline
from exporter.series import model_key
from exporter.summary import render_summary
from telemetry.otlp.endpoint import parse_endpoint
from telemetry.otlp.exporter import ExportOptions, OtlpHttpExporter
from telemetry.otlp.signals import METRICS
from telemetry.otlp.sigv4 import Signer
from tests.support.helpers import CATALOG, Capture, IndexSource, TextSource
from tests.support.histograms import first_response
from tests.support.otlp_endpoint import ACCESS_KEY, SECRET_KEY, OtlpEndpoint
from tests.support.paths import REPO

FAST = ExportOptions(linger=0.0, backoff_start=0.05, backoff_max=0.2, connect_timeout=1.0, timeout=5.0)
TTFT, TPOT, DURATION = (m.name for m in genai.METRICS)
STREAM_BOUNDS = (2.5, 10, 25, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000)  # ms
CONFIGS = {  # what Triton's model config API answers for each
    "vllm_model": {
        "backend": "vllm",
        "model_transaction_policy": {"decoupled": True},
        "parameters": {"REPORT_CUSTOM_METRICS": {"string_value": "true"}},
    },
    "stream": {"backend": "python", "model_transaction_policy": {"decoupled": True}},
    "classify": {"backend": "onnxruntime", "platform": "onnxruntime_onnx"},
    "tensorrt_llm": {"backend": "tensorrtllm", "model_transaction_policy": {"decoupled": True}},
    "trt_plain": {  # not streaming, and says which API it serves
        "backend": "tensorrtllm",
        "parameters": {"gen_ai.operation.name": {"string_value": "text_completion"}},
    },
}
FIRST = {  # ms: Triton 26.01 prints the first-response histogram of every model
    "vllm_model": [40.0, 90.0],
    "stream": [2.0, 7.0, 7.0, 120.0, 4000.0],
    "classify": [3.0, 4.0],
    "tensorrt_llm": [150.0, 150.0, 700.0],
    "trt_plain": [900.0, 2500.0],
}


def body(step: int, vllm: bool = True) -> str:
    """The five models after ``step`` rounds of traffic: core families, each backend's own, first responses;
    without ``vllm``, the vLLM backend's families are left out (it publishes none without REPORT_CUSTOM_METRICS)."""
    per_model = {
        m: (STREAM_BOUNDS if m == "stream" else FIRST_RESPONSE_BUCKETS, obs * step) for m, obs in FIRST.items()
    }
    return (
        triton_metrics(list(CONFIGS), step)
        + (llm_metrics(["vllm_model"], step, "vllm") if vllm else "")
        + llm_metrics(["tensorrt_llm", "trt_plain"], step, "tensorrt_llm")
        + first_response(per_model)
    )


def wait_for(check: Callable[[], object], timeout: float = 60.0) -> None:  # generous: a loaded 2-core CI box
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def attrs(point) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def run(
    endpoint: OtlpEndpoint, semconv: str = "genai", catalog=CATALOG, cycles: int = 2, vllm: bool = True
) -> tuple[dict, CycleResult]:
    """``cycles`` cycles a minute apart through the real OTLP output; the Metric messages received, by name."""
    env = {"AWS_REGION": "us-west-2", "AWS_CA_BUNDLE": str(endpoint.ca_bundle)}
    ep = parse_endpoint(endpoint.endpoint("/v1/metrics"), env)
    signer = Signer(ep.service, ep.region, lambda: Credentials(ACCESS_KEY, SECRET_KEY))
    exporter: OtlpHttpExporter[Metric] = OtlpHttpExporter(METRICS, ep, FAST, signer, env)
    out = OtlpMetricsOutput(catalog, [ep], "triton-server", exporters=[exporter], genai=semconv == "genai")
    index = orjson.dumps([{"name": m, "version": "1", "state": "READY"} for m in CONFIGS])
    configs = {f"{m}/1": orjson.dumps(c) for m, c in CONFIGS.items()}
    sources = [
        TextSource(*(body(s, vllm) for s in range(1, cycles + 1)), selects=False),
        IndexSource(index, configs, "2.66.0"),
    ]
    settings = Settings(nvml="off", timeout=1.0, outputs=(ep,), otlp_semconv=semconv)
    clock = [0.0]
    pipe = Pipeline(settings, catalog, sources, clock=lambda: clock[0], outputs=[out])
    try:
        for _ in range(cycles):
            result = pipe.cycle()
            clock[0] += 60.0
    finally:
        pipe.close(
            outputs_timeout=60.0
        )  # returns once the sender has delivered everything (cycles may share a request)
    stats = exporter.stats()
    assert stats.sent == stats.accepted > 0 and not any(stats.dropped_by_reason().values()), stats
    named: dict[str, list[Metric]] = {}
    for r in endpoint.accepted():
        for rm in r.request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    named.setdefault(m.name, []).append(m)
    return named, result


def points(named: dict, name: str) -> dict[str, list]:
    """model -> its data points of ``name``, in the order sent."""
    out: dict[str, list] = {}
    for m in named.get(name, []):
        for p in m.histogram.data_points:
            out.setdefault(attrs(p)["gen_ai.request.model"], []).append(p)
    return out


def per_bucket(bounds, observations) -> list[int]:
    edges = [*bounds, float("inf")]
    return [sum(1 for o in observations if lo < o <= hi) for lo, hi in zip([float("-inf"), *edges], edges)]


def test_each_model_gets_what_its_backend_publishes_in_seconds_with_the_specs_attributes(
    signed_otlp_endpoint: OtlpEndpoint,
) -> None:
    named, _ = run(signed_otlp_endpoint)
    for g in genai.METRICS:
        for m in named[g.name]:
            assert (m.unit, m.description) == ("s", g.description)
            assert m.histogram.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    ttft, tpot, duration = points(named, TTFT), points(named, TPOT), points(named, DURATION)
    # vLLM's own histograms win (its first-response histogram goes out under its own name only); the decoupled
    # Python and TensorRT-LLM models get Triton's first response; the classifier gets nothing, ever (no zeros)
    assert set(ttft) == {"vllm_model", "stream", "tensorrt_llm"}
    assert set(tpot) == {"vllm_model"}
    assert set(duration) == {"vllm_model", "trt_plain"}

    vllm_buckets, vllm_obs = VLLM_STEP["vllm:time_to_first_token_seconds"]
    first, second = ttft["vllm_model"]
    assert list(second.explicit_bounds) == list(vllm_buckets)  # already seconds: the source's own bounds
    assert list(second.bucket_counts) == [
        2 * n for n in per_bucket(vllm_buckets, [v for v, c in vllm_obs for _ in range(c)])
    ]
    assert second.sum == pytest.approx(2 * sum(v * c for v, c in vllm_obs)) and second.count == 20
    # cumulative, with one start time from the first sighting on
    assert first.start_time_unix_nano == second.start_time_unix_nano == first.time_unix_nano < second.time_unix_nano

    stream = ttft["stream"][-1]  # Triton's ms on the model's own buckets, as seconds: exact
    assert list(stream.explicit_bounds) == [
        0.0025, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
    ]  # fmt: skip
    assert list(stream.bucket_counts) == per_bucket(STREAM_BOUNDS, FIRST["stream"] * 2)
    assert stream.sum == sum(FIRST["stream"] * 2) / 1000 and stream.count == 10
    trt = ttft["tensorrt_llm"][-1]
    assert list(trt.explicit_bounds) == [0.1, 0.5, 2.0, 5.0]  # Triton's default buckets
    assert list(trt.bucket_counts) == per_bucket(FIRST_RESPONSE_BUCKETS, FIRST["tensorrt_llm"] * 2)

    e2e_buckets = VLLM_STEP["vllm:e2e_request_latency_seconds"][0]
    assert list(duration["vllm_model"][-1].explicit_bounds) == list(e2e_buckets)  # vLLM's, not Triton's
    plain = duration["trt_plain"][-1]  # not decoupled: Triton's first response is the whole request
    assert list(plain.explicit_bounds) == [0.1, 0.5, 2.0, 5.0] and plain.sum == 6.8 and plain.count == 4
    assert list(tpot["vllm_model"][-1].explicit_bounds) == list(VLLM_STEP["vllm:time_per_output_token_seconds"][0])

    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "triton",
        "gen_ai.request.model": "stream",
        "triton.model.version": "1",
    }
    assert attrs(stream) == expected
    assert attrs(plain) == {**expected, "gen_ai.request.model": "trt_plain", "gen_ai.operation.name": "text_completion"}
    # Triton's own families go out unchanged beside them, the classifier's too
    raw = [p for m in named["nv_inference_first_response_histogram_ms"] for p in m.histogram.data_points]
    assert {attrs(p)["model"] for p in raw} == set(CONFIGS)
    assert list(next(p for p in raw if attrs(p)["model"] == "stream").explicit_bounds) == list(STREAM_BOUNDS)


def test_off_by_default_the_output_is_what_it_was(signed_otlp_endpoint: OtlpEndpoint) -> None:
    assert Settings().otlp_semconv == "off" and load([], {}).otlp_semconv == "off"
    named, result = run(signed_otlp_endpoint, semconv="off", cycles=1)
    assert named and not [n for n in named if n.startswith("gen_ai.")]
    assert not [g for c in result.coverage.values() for g in c.gaps if g.metric.startswith("gen_ai.")]


def test_the_coverage_says_why_a_model_gets_none(signed_otlp_endpoint: OtlpEndpoint) -> None:
    with Capture.on("exporter.coverage") as capture:
        _, result = run(signed_otlp_endpoint, cycles=1)
    why = {
        c.model: {g.metric: g.reason for g in c.gaps if g.metric.startswith("gen_ai.")}
        for c in result.coverage.values()
    }
    assert why["vllm_model"] == {}
    reason = "not a generative model: an onnxruntime model that is not decoupled (a gen_ai.operation.name parameter"
    assert set(why["classify"]) == {TTFT, TPOT, DURATION} and all(
        r.startswith(reason) for r in why["classify"].values()
    )
    assert why["stream"] == {
        TPOT: "nothing measures it for a python model that is decoupled: it is read from "
        "vllm:time_per_output_token_seconds (vLLM models)",
        DURATION: "nothing measures it for a python model that is decoupled: it is read from "
        "vllm:e2e_request_latency_seconds (vLLM models) or nv_inference_first_response_histogram_ms "
        "(models that are not decoupled)",
    }
    assert set(why["tensorrt_llm"]) == {TPOT, DURATION} and set(why["trt_plain"]) == {TTFT, TPOT}
    assert "(decoupled models)" in why["trt_plain"][TTFT]
    # the log line says it, in the same line as the catalog's metrics; --once says each reason once, then the
    # metrics it keeps and the model versions they are kept from
    line = next(m for m in capture.messages() if m.startswith("model 'classify' "))
    assert f"{TTFT}, {TPOT}, {DURATION} (not a generative model" in line
    summary = render_summary(result)
    section = summary[summary.index("  " + why["classify"][TTFT] + "\n") :]
    assert (
        section.splitlines()[1].startswith(f"    {TTFT}, {TPOT}, {DURATION}")
        and "classify/1" in section.splitlines()[1]
    )


def test_a_source_that_is_there_but_off_gives_its_reason(signed_otlp_endpoint: OtlpEndpoint) -> None:
    """A vLLM model without REPORT_CUSTOM_METRICS: nothing from vLLM, Triton's first response for its TTFT."""
    CONFIGS["vllm_model"]["parameters"] = {}
    try:
        named, result = run(signed_otlp_endpoint, cycles=1, vllm=False)
    finally:
        CONFIGS["vllm_model"]["parameters"] = {"REPORT_CUSTOM_METRICS": {"string_value": "true"}}
    why = {g.metric: g.reason for g in result.coverage[model_key("vllm_model", "1")].gaps}
    assert why[TPOT].startswith("the vLLM backend publishes its metrics only with REPORT_CUSTOM_METRICS=true")
    assert TTFT not in why  # Triton's first response of a decoupled model stands in
    assert "vllm_model" in points(named, TTFT)


def test_a_metric_left_out_by_the_selection_is_said_once(signed_otlp_endpoint: OtlpEndpoint) -> None:
    catalog = build([], "-InterTokenLatency*")
    with Capture.on("exporter.otlp_metrics", 30) as capture:
        named, result = run(signed_otlp_endpoint, catalog=catalog, cycles=1)
    assert TPOT not in named and TTFT in named
    assert capture.messages() == [
        f"--otlp-semconv genai: {TPOT} is not sent: none of InterTokenLatency is selected (--metrics)"
    ]
    why = {g.metric: g.reason for g in result.coverage[model_key("vllm_model", "1")].gaps}
    assert why[TPOT] == "none of InterTokenLatency is selected (--metrics)"


# --- the parts, without a server -------------------------------------------------------------------


def test_the_setting_and_its_variable() -> None:
    otlp = ["--output", "otlp+http://127.0.0.1:4318/v1/metrics"]
    assert load([*otlp, "--otlp-semconv", "genai"], {}).otlp_semconv == "genai"
    assert load(otlp, {"EXPORTER_OTLP_SEMCONV": "genai"}).otlp_semconv == "genai"
    with pytest.raises(ConfigError, match="--otlp-semconv"):
        load([*otlp, "--otlp-semconv", "genai2"], {})
    with pytest.raises(ConfigError, match="none is given"):  # nothing would send them
        load(["--otlp-semconv", "genai"], {})


def test_bounds_and_sums_convert_to_seconds_exactly() -> None:
    ms = Fraction(1, 1000)
    table = {0.3: 0.0003, 2.5: 0.0025, 7.5: 0.0075, 100: 0.1, 0.1: 0.0001, 1e-3: 1e-6, 33.3: 0.0333, 5000: 5.0}
    assert {b: genai.bound_seconds(b, ms) for b in table} == table  # the doubles of the numbers as written
    assert any(b * 0.001 != s for b, s in table.items())  # what a multiplication would have sent
    assert genai.bound_seconds(0.25, Fraction(1)) == 0.25 and genai.seconds(1234.0, ms) == 1.234
    assert genai.seconds(0.7, Fraction(1)) == 0.7


def test_the_mapping_is_read_from_the_catalog() -> None:
    plan = {p.metric.name: p for p in genai.plan(CATALOG)}
    assert list(plan) == [TTFT, TPOT, DURATION]
    factors = {(s.input.family, s.input.decoupled): s.factor for p in plan.values() for s in p.sources}
    assert factors == {
        ("vllm:time_to_first_token_seconds", None): 1,
        ("nv_inference_first_response_histogram_ms", True): Fraction(1, 1000),
        ("vllm:time_per_output_token_seconds", None): 1,
        ("vllm:e2e_request_latency_seconds", None): 1,
        ("nv_inference_first_response_histogram_ms", False): Fraction(1, 1000),
    }
    # every source the mapping names is a distribution in a unit of time in the built-in catalog
    by_name = {m.name: m for m in CATALOG.metrics}
    for g in genai.METRICS:
        for name in g.sources:
            assert by_name[name].unit in ("Seconds", "Milliseconds") and by_name[name].kind.value == "distribution"


@pytest.mark.parametrize(
    ("declared", "decoupled", "backend", "expected"),
    [
        (None, True, "python", "chat"),  # streaming
        (None, False, "vllm", "chat"),
        (None, False, "tensorrtllm", "chat"),
        (None, False, "onnxruntime", None),  # a classifier
        ("text_completion", False, "onnxruntime", "text_completion"),  # declared: generative
        ("embeddings", True, "python", "embeddings"),
        ("none", True, "python", None),  # a streaming model that is not generative opts out
        ("  ", True, "python", "chat"),
    ],
)
def test_operation_name(declared, decoupled, backend, expected) -> None:
    assert genai.operation(declared, decoupled, backend) == expected


def test_the_docs_name_the_spec_version_the_metrics_and_the_attributes() -> None:

    text = (REPO / "docs" / "otlp.md").read_text()
    version = genai.SPEC.split()[3]
    assert version.startswith("v1.") and f"**{version}**" in text
    for name in (*(m.name for m in genai.METRICS), genai.OPERATION_PARAMETER, genai.VERSION_ATTRIBUTE):
        assert f"`{name}`" in text, name
    assert f"`{genai.PROVIDER}`" in text and f"`{genai.OPERATION}`" in text and "--otlp-semconv genai" in text


# --- the daemon against a real Triton ------------------------------------------------------------------
