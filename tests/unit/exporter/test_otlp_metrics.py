"""The OTLP metrics output (docs/otlp.md): Triton's families as OTLP, to a local endpoint with real TLS, a real
SigV4 check and real protobuf decoding (tests/support/otlp_endpoint.py), from fixture texts and a real Triton."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import orjson
import pytest
from botocore.credentials import Credentials
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric

from catalog.otlp import snake
from exporter.config import ConfigError, Settings, load
from exporter.otlp_output import DROPPED as DROPPED_SERIES
from exporter.otlp_output import OtlpMetricsOutput
from exporter.pipeline import Pipeline
from telemetry.otlp.endpoint import parse_endpoint
from telemetry.otlp.exporter import ExportOptions, OtlpHttpExporter
from telemetry.otlp.metrics import HistogramPoint, MetricsEncoder
from telemetry.otlp.signals import METRICS
from telemetry.otlp.sigv4 import Signer
from tests.support.helpers import CATALOG, IndexSource, TextSource, documents, task_doc
from tests.support.otlp_endpoint import ACCESS_KEY, SECRET_KEY, OtlpEndpoint, Reply
from tests.support.otlp_recording import Recording
from tests.support.paths import REPO

ROOT = REPO
FAST = ExportOptions(linger=0.0, backoff_start=0.05, backoff_max=0.2, connect_timeout=1.0, timeout=5.0)

BODY = """# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="add",version="1"}} {ok}
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="add",reason="BACKEND",version="1"}} {fail}
nv_inference_request_failure{{model="add",reason="OTHER",version="1"}} 0
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="add",version="1"}} 3
# TYPE nv_inference_first_response_histogram_ms histogram
nv_inference_first_response_histogram_ms_count{{model="add",version="1"}} {ok}
nv_inference_first_response_histogram_ms_sum{{model="add",version="1"}} {sum}
nv_inference_first_response_histogram_ms_bucket{{model="add",version="1",le="100"}} 1
nv_inference_first_response_histogram_ms_bucket{{model="add",version="1",le="500"}} 2
nv_inference_first_response_histogram_ms_bucket{{model="add",version="1",le="2000"}} {two}
nv_inference_first_response_histogram_ms_bucket{{model="add",version="1",le="+Inf"}} {ok}
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{{model="add",version="1"}} {ok}
nv_inference_request_summary_us_sum{{model="add",version="1"}} 1000
nv_inference_request_summary_us{{model="add",version="1",quantile="0.5"}} 90
nv_inference_request_summary_us{{model="add",version="1",quantile="0.99"}} Nan
"""
INDEX = b'[{"name":"add","version":"1","state":"READY"},{"name":"idle","version":"2","state":"UNAVAILABLE"}]'


def body(ok: int, fail: int = 1, total: float = 1200.0) -> str:
    return BODY.format(ok=ok, fail=fail, sum=total, two=min(ok, 3))


def metrics(received) -> list[tuple[dict[str, str], Metric]]:
    """Every Metric of the accepted requests, with its resource's attributes."""
    out = []
    for r in received:
        for rm in r.request.resource_metrics:
            resource = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
            out += [(resource, m) for sm in rm.scope_metrics for m in sm.metrics]
    return out


def by_name(found: list[tuple[dict[str, str], Metric]]) -> dict[str, list[Metric]]:
    out: dict[str, list[Metric]] = {}
    for _, m in found:
        out.setdefault(m.name, []).append(m)
    return out


def attrs(point) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def wait_for(check: Callable[[], object], timeout: float = 30.0) -> None:  # generous: a loaded 2-core CI box
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.fixture
def cloudwatch(signed_otlp_endpoint: OtlpEndpoint) -> OtlpEndpoint:
    """A local HTTPS stand-in for CloudWatch's OTLP endpoint that checks SigV4 (service monitoring)."""
    return signed_otlp_endpoint


def output_to(endpoint: OtlpEndpoint, catalog=CATALOG, options: ExportOptions = FAST) -> OtlpMetricsOutput:
    env = {"AWS_REGION": "us-west-2", "AWS_CA_BUNDLE": str(endpoint.ca_bundle)}
    ep = parse_endpoint(endpoint.endpoint("/v1/metrics"), env)
    signer = Signer(ep.service, ep.region, lambda: Credentials(ACCESS_KEY, SECRET_KEY))
    exporter: OtlpHttpExporter[Metric] = OtlpHttpExporter(METRICS, ep, options, signer, env)
    return OtlpMetricsOutput(catalog, [ep], "triton-server", exporters=[exporter])


def fixture_pipeline(out: OtlpMetricsOutput, *texts: str, clock=None) -> Pipeline:
    settings = Settings(nvml="off", timeout=1.0)
    sources = [TextSource(*texts, selects=False), IndexSource(INDEX)]
    kwargs = {"clock": clock} if clock else {}
    return Pipeline(settings, CATALOG, sources, outputs=[out], **kwargs)


# --- settings ----------------------------------------------------------------------------------------


def test_output_takes_emf_and_otlp_forms_repeated_flag_or_blank_separated_variable() -> None:
    env = {"AWS_REGION": "us-east-1"}
    s = load(["--output", "file:/tmp/x", "--output", "otlp+https://monitoring.eu-west-1.amazonaws.com/v1/metrics"], env)
    assert [str(o) for o in s.emf_outputs] == ["file:/tmp/x"]
    (ep,) = s.otlp_outputs
    assert (ep.signed, ep.service, ep.region) == (True, "monitoring", "eu-west-1")
    s = load([], {"EXPORTER_OUTPUT": "  tcp://127.0.0.1:25888   otlp+http://127.0.0.1:4318/v1/metrics "})
    assert [str(o) for o in s.outputs] == ["tcp://127.0.0.1:25888", "otlp+http://127.0.0.1:4318/v1/metrics"]
    assert not load(["--output", "otlp+http://collector:4318/v1/metrics"], {}).emf_outputs  # OTLP only: no EMF


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("otlp+https://xray.us-east-1.amazonaws.com/v1/traces", "a traces endpoint"),
        ("otlp+https://logs.us-east-1.amazonaws.com/v1/metrics", "signed for 'logs'"),
        ("otlp+http://collector:4318", "needs the OTLP path"),
        ("otlp+ftp://x/v1/metrics", "starts with otlp+https://"),
        ("stdout stdout", "given twice"),
    ],
)
def test_a_bad_output_is_refused_with_exit_2(value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load([], {"EXPORTER_OUTPUT": value, "AWS_REGION": "us-east-1"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "AWS_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter"],
        env={**env, "EXPORTER_OUTPUT": value, "AWS_REGION": "us-east-1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# --- the encoding ------------------------------------------------------------------------------------


def decode(items: list[tuple[bytes, int]]) -> list[Metric]:
    out = []
    for data, units in items:
        m = Metric()
        m.ParseFromString(data)
        assert units == len(getattr(m, m.WhichOneof("data")).data_points)
        out.append(m)
    return out


def test_counters_are_cumulative_sums_that_restart_with_a_new_start_time_after_a_reset() -> None:
    enc = MetricsEncoder(resource_labels=5)
    labels = {"a": {"model": "m", "version": "1"}, "b": {"model": "n", "version": "1"}}
    seconds = 1_800_000_000 * 10**9
    results = []
    for step, values in enumerate(({"a": 5.0, "b": 1.0}, {"a": 9.0, "b": math.nan}, {"a": 2.0, "b": 4.0})):
        enc.begin(seconds + step * 60 * 10**9)
        enc.counter("c", values, labels.__getitem__, "help text")
        results.append({attrs(p)["model"]: p for m in decode(enc.finish()) for p in m.sum.data_points})
    m = decode((enc.begin(seconds), enc.counter("c", {"a": 1.0}, labels.__getitem__), enc.finish())[2])[0]
    assert m.sum.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert m.sum.is_monotonic
    first, second, third = results
    assert first["m"].start_time_unix_nano == first["m"].time_unix_nano == seconds  # first seen
    assert second["m"].start_time_unix_nano == seconds and second["m"].as_double == 9
    assert "n" not in second  # NaN is no value
    # went down: restarted after the previous point, which is where the new start goes
    assert third["m"].start_time_unix_nano == second["m"].time_unix_nano + 1 and third["m"].as_double == 2
    assert third["n"].start_time_unix_nano == seconds  # unchanged across the NaN scrape


def test_histograms_keep_the_bounds_and_become_per_bucket_counts() -> None:
    enc = MetricsEncoder()
    enc.begin(10**18)
    bad = enc.histogram(
        "h",
        [
            HistogramPoint("a", [100.0, 500.0, 2000.0], [1, 2, 3, 4], 1200.0),
            HistogramPoint("b", [1.0], [5, 3], 1.0),  # cumulative counts that go down: torn, left out
        ],
        {"a": {"model": "m"}, "b": {"model": "n"}}.__getitem__,
    )
    (m,) = decode(enc.finish())
    (p,) = m.histogram.data_points
    assert bad == 1 and m.histogram.aggregation_temporality == 2
    assert list(p.explicit_bounds) == [100, 500, 2000] and list(p.bucket_counts) == [1, 1, 1, 1]
    assert (p.count, p.sum, attrs(p)) == (4, 1200.0, {"model": "m"})


def test_histogram_points_left_out_of_a_torn_scrape_are_logged_and_the_recovery_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A torn scrape (bucket counts going down) or a series without its +Inf bucket is left out, never guessed;
    as for EMF's distributions, the exporter's log says how many points, once per change, and when it clears."""

    def text(counts: tuple[int, int, int], inf: bool) -> str:
        lines = ["# TYPE nv_inference_first_response_histogram_ms histogram"]
        for model in ("torn", "whole"):
            bounds = ("100", "500", "+Inf") if model == "whole" or inf else ("100", "500")
            for le, n in zip(bounds, counts if model == "torn" else (1, 2, 3), strict=False):
                lines.append(
                    f'nv_inference_first_response_histogram_ms_bucket{{model="{model}",version="1",le="{le}"}} {n}'
                )
            lines.append(f'nv_inference_first_response_histogram_ms_sum{{model="{model}",version="1"}} 9')
        return "\n".join(lines) + "\n"

    rec = Recording()
    index = orjson.dumps([{"name": m, "version": "1", "state": "READY"} for m in ("torn", "whole")])
    texts = (text((3, 2, 4), True), text((1, 2, 3), False), text((1, 2, 3), True))
    pipe = Pipeline(
        Settings(nvml="off", timeout=1.0),
        CATALOG,
        [TextSource(*texts, selects=False), IndexSource(index)],
        outputs=[rec],
    )
    caplog.set_level("INFO", logger="exporter.otlp_metrics")
    try:
        seen = []
        for _ in texts:
            rec.items.clear()
            pipe.cycle()
            (m,) = [m for m in decode(rec.items) if m.name == "nv_inference_first_response_histogram_ms"]
            seen.append(sorted(attrs(p)["model"] for p in m.histogram.data_points))
            seen.append([r.getMessage() for r in caplog.records if r.name == "exporter.otlp_metrics"])
            caplog.clear()
    finally:
        pipe.close(outputs_timeout=1.0)
    assert rec.histogram_points_left_out == 2  # the torn one, then the one without +Inf: counted, as reason
    left_out = "OTLP: leaving out 1 histogram points whose bucket counts go down or lack +Inf"
    assert seen == [["whole"], [left_out], ["whole"], [], ["torn", "whole"], ["inconsistent histograms: recovered"]]


def test_the_first_response_histogram_says_whether_its_model_is_decoupled() -> None:
    """Time to first token is the first-response histogram of decoupled models only (Triton 26.01 publishes it
    for every model): the points carry decoupled="true"|"false" from the model's configuration, which the
    PromQL TTFT alarm selects on; a version whose configuration is not read yet is sent without it."""

    def histogram(model: str, total: float) -> str:
        lines = [
            f'nv_inference_first_response_histogram_ms_bucket{{model="{model}",version="1",le="{le}"}} {n}'
            for le, n in (("100", 1), ("500", 3), ("+Inf", 4))
        ]
        lines.append(f'nv_inference_first_response_histogram_ms_sum{{model="{model}",version="1"}} {total}')
        lines.append(f'nv_inference_first_response_histogram_ms_count{{model="{model}",version="1"}} 4')
        return "\n".join(lines)

    text = "# TYPE nv_inference_first_response_histogram_ms histogram\n" + "\n".join(
        histogram(m, t) for m, t in (("chat", 700.0), ("classify", 90.0), ("unread", 5.0))
    )
    index = orjson.dumps([{"name": m, "version": "1", "state": "READY"} for m in ("chat", "classify", "unread")])
    configs = {
        "chat/1": b'{"backend": "python", "model_transaction_policy": {"decoupled": true}}',
        "classify/1": b'{"backend": "python"}',
    }
    rec = Recording()
    pipe = Pipeline(
        Settings(nvml="off", timeout=1.0),
        CATALOG,
        [TextSource(text + "\n", selects=False), IndexSource(index, configs)],
        outputs=[rec],
    )
    try:
        pipe.cycle()
    finally:
        pipe.close(outputs_timeout=1.0)
    (m,) = [m for m in decode(rec.items) if m.name == "nv_inference_first_response_histogram_ms"]
    points = {attrs(p)["model"]: p for p in m.histogram.data_points}
    assert attrs(points["chat"])["decoupled"] == "true" and attrs(points["classify"])["decoupled"] == "false"
    assert "decoupled" not in attrs(points["unread"])  # its kind is not known yet
    assert (points["chat"].sum, points["classify"].sum, points["chat"].count) == (700.0, 90.0, 4)


def test_a_family_over_1000_points_is_split_into_several_metrics() -> None:
    enc = MetricsEncoder()
    enc.begin(10**18)
    enc.gauge("g", {str(i): float(i) for i in range(2500)}, lambda k: {"model": k})
    items = enc.finish()
    assert [u for _, u in items] == [1000, 1000, 500] and {m.name for m in decode(items)} == {"g"}


def test_a_point_over_150_labels_or_1024_characters_is_left_out_and_counted() -> None:
    enc = MetricsEncoder(resource_labels=10)  # with the resource's: 10 + 140 = 150 is the most
    series = {"ok": 1.0, "wide": 2.0, "long": 3.0}
    labels = {
        "ok": {f"l{i}": "v" for i in range(140)},
        "wide": {f"l{i}": "v" for i in range(141)},
        "long": {"model": "x" * 1025},
    }
    enc.begin(10**18)
    enc.gauge("g", series, labels.__getitem__)
    (m,) = decode(enc.finish())
    assert len(m.gauge.data_points) == 1 and len(m.gauge.data_points[0].attributes) == 140
    assert enc.dropped_labels == 2


def test_self_metric_names() -> None:
    assert [snake(n) for n in ("ModelReady", "TritonUp", "GpuUtilization", "SourceUp")] == [
        "model_ready",
        "triton_up",
        "gpu_utilization",
        "source_up",
    ]


# --- through the pipeline, to the signed HTTPS endpoint -----------------------------------------------


def test_the_scrape_arrives_signed_in_otlps_model(cloudwatch: OtlpEndpoint) -> None:
    out = output_to(cloudwatch)
    clock = [0.0]
    pipe = fixture_pipeline(out, body(4), body(6), clock=lambda: clock[0])
    try:
        pipe.cycle()
        clock[0] += 60
        docs = documents(pipe.cycle())
    finally:
        # Returns once the sender has delivered both cycles; under load they may share one request, so
        # counting requests (as this test did) could wait for ever.
        pipe.close(outputs_timeout=30.0)
    assert out.exporters[0].stats().sent == out.exporters[0].stats().accepted
    assert cloudwatch.received and all(r.status == 200 for r in cloudwatch.received)  # 403 on a bad signature
    found = metrics(cloudwatch.accepted())
    resource = found[0][0]
    assert resource["container.name"] == "triton-server" and resource["cloud.provider"] == "aws"
    named = by_name(found)
    ok = [p for m in named["nv_inference_request_success"] for p in m.sum.data_points]
    assert [p.as_double for p in ok] == [4, 6] and attrs(ok[0]) == {"model": "add", "version": "1"}
    assert ok[0].start_time_unix_nano == ok[1].start_time_unix_nano == ok[0].time_unix_nano < ok[1].time_unix_nano
    assert named["nv_inference_request_success"][0].sum.is_monotonic
    reasons = {attrs(p)["reason"] for p in named["nv_inference_request_failure"][0].sum.data_points}
    assert reasons == {"BACKEND", "OTHER"}  # Triton's failure reason kept as a label
    (pending,) = named["nv_inference_pending_request_count"][0].gauge.data_points
    assert pending.as_double == 3
    h = named["nv_inference_first_response_histogram_ms"][-1].histogram.data_points[0]
    assert list(h.explicit_bounds) == [100, 500, 2000] and list(h.bucket_counts) == [1, 1, 1, 3]
    assert (h.count, h.sum) == (6, 1200)
    quantiles = [p for m in named["nv_inference_request_summary_us"] for p in m.gauge.data_points]
    assert {attrs(p)["quantile"] for p in quantiles} == {"0.5"}  # the NaN quantile is no value
    ready = {attrs(p)["model"]: p.as_double for p in named["triton_exporter_model_ready"][-1].gauge.data_points}
    assert ready == {"add": 1.0, "idle": 0.0}  # from the repository index, as EMF's ModelReady
    assert named["triton_exporter_triton_up"][-1].gauge.data_points[0].as_double == 1
    assert task_doc(docs)["ExporterHeartbeat"] == 1  # EMF unchanged beside it


def test_endpoint_down_never_blocks_the_cycle_and_drops_are_counted(cloudwatch: OtlpEndpoint) -> None:
    cloudwatch.stop()
    out = output_to(cloudwatch, options=replace(FAST, max_attempts=2, capacity=2))
    clock = [0.0]
    pipe = fixture_pipeline(out, body(4), body(6), body(8), body(9), clock=lambda: clock[0])
    try:
        pipe.cycle()
        wait_for(lambda: out.exporters[0].stats().dropped_undelivered > 0)  # it gave up after two refusals
        for _ in range(3):
            clock[0] += 60
            result = pipe.cycle()
        stats = out.exporters[0].stats()
        assert stats.dropped_undelivered > 0 and stats.dropped_buffer_full > 0 and stats.sent == 0
        assert task_doc(documents(result))["OtlpPointsDropped"] > 0  # reported in EMF the next cycle
    finally:
        pipe.close()


def test_a_stuck_endpoint_never_blocks_the_cycle(cloudwatch: OtlpEndpoint) -> None:
    release = threading.Event()
    cloudwatch.script(Reply(hold=release))  # sits on the first request until released (or a minute)
    out = output_to(cloudwatch, options=replace(FAST, capacity=2, timeout=120.0))
    clock = [0.0]
    pipe = fixture_pipeline(out, body(4), body(6), body(8), body(9), clock=lambda: clock[0])
    try:
        for _ in range(4):
            pipe.cycle()
            clock[0] += 60
        assert cloudwatch.received == []  # every cycle ended while the endpoint still held the first request
        assert out.exporters[0].stats().dropped_buffer_full > 0  # what did not fit was dropped and counted
    finally:
        release.set()
        pipe.close()


def test_partial_success_is_read_and_counted(cloudwatch: OtlpEndpoint) -> None:
    cloudwatch.script(Reply(rejected=3, message="3 points refused: too old"))
    out = output_to(cloudwatch)
    clock = [0.0]
    pipe = fixture_pipeline(out, body(4), body(6), clock=lambda: clock[0])
    try:
        pipe.cycle()
        wait_for(lambda: out.exporters[0].stats().requests_sent >= 1)
        clock[0] += 60
        second = task_doc(documents(pipe.cycle()))  # its window holds the first request's answer
        wait_for(lambda: out.exporters[0].stats().requests_sent >= 2)
        clock[0] += 60
        third = task_doc(documents(pipe.cycle()))
    finally:
        pipe.close()
    assert out.exporters[0].stats().rejected_partial == 3
    dropped = {k: v for k, v in out.series().samples["exporter_otlp_points_dropped_total"].items() if v}
    assert list(dropped.values()) == [3.0] and "partial" in next(iter(dropped))
    out.histogram_points_left_out = 2  # as encode() counts them (the torn-scrape test above)
    reasons = {out.series().labels[k].get("reason"): v for k, v in out.series().samples[DROPPED_SERIES].items()}
    assert reasons["inconsistent"] == 2.0 and reasons["partial"] == 3.0
    assert second["OtlpPointsDropped"] + third["OtlpPointsDropped"] == 3  # in EMF, as every drop
    first_two = sum(r.units() for r in cloudwatch.accepted()[:2])  # the third cycle's own request comes later
    assert second["OtlpPointsSent"] + third["OtlpPointsSent"] == first_two - 3 > 0


# --- the daemon against a real Triton ------------------------------------------------------------------


def test_the_sidecar_parses_every_quantile_only_when_an_otlp_output_sends_them():
    """EMF reads three of a summary's five quantiles and the parser skips the rest; the OTLP output sends
    every series of the families it reads, so with one the parser keeps them all."""
    from exporter.__main__ import build_sources
    from exporter.config import load

    def parser(*argv: str):
        settings = load(["--nvml", "off", *argv], {})
        sources = build_sources(settings, CATALOG)
        try:
            return next(s for s in sources if s.name == "triton_metrics").parser
        finally:
            for s in sources:
                s.close()

    assert parser().selects == CATALOG.sample_selects() != {}
    assert parser("--output", "stdout", "--output", "otlp+http://127.0.0.1:4318/v1/metrics").selects == {}
