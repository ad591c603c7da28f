"""Coverage reasons without a server: Triton's release from its version, families' ``since``, flags, once only."""

from __future__ import annotations

import pytest

from catalog import Catalog, Family, Scope, build
from catalog.load import read
from exporter.coverage import Coverage, gaps, release_of
from exporter.series import LabelSet, model_key
from exporter.sources import ModelConfig
from tests.support.helpers import CATALOG, Capture

PLAIN = ModelConfig(decoupled=False, backend="python")
STREAM = ModelConfig(decoupled=True, backend="python")
CORE = {
    "nv_inference_request_success",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_request_summary_us",
    "nv_inference_pending_request_count",
    "nv_inference_exec_count",
    "nv_inference_count",
    "nv_inference_request_failure",
    "nv_model_load_duration_secs",
}


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.51.0", (24, 10)), ("2.52.0", (24, 11)), ("2.53.1", (24, 12)), ("2.54.0", (25, 1)), ("2.66.0", (26, 1))],
)
def test_server_version_to_release(version, release):
    assert release_of(version) == release


def test_unknown_versions_give_no_release():
    assert release_of("") is None and release_of("3.0.0") is None and release_of("dev") is None


def test_since_names_a_triton_release_per_kind_of_model():
    def release(since: str, decoupled: bool) -> tuple[int, int] | None:
        return Family("f", "gauge", since=since).triton_release(decoupled)

    assert release("Triton 24.11", False) == release("Triton 24.11", True) == (24, 11)
    assert release("TensorRT-LLM backend v0.18 (Triton 25.04)", False) == (25, 4)
    assert release("", True) is None and release("vLLM backend r24.08", True) is None
    both = "Triton 24.11 (decoupled models); Triton 26.01 (every model)"
    assert (release(both, True), release(both, False)) == ((24, 11), (26, 1))
    assert release("Triton 24.11 (decoupled models)", False) is None


def test_the_first_response_releases_come_from_the_catalog(tmp_path):
    # The coverage's releases are the family's `since`: a user file that moves it moves the reason.
    first = CATALOG.families["nv_inference_first_response_histogram_ms"]
    assert (first.triton_release(True), first.triton_release(False)) == ((24, 11), (26, 1))
    user = tmp_path / "moved.toml"
    user.write_text(
        "[families]\n"
        'nv_inference_first_response_histogram_ms = { type = "histogram", labels = ["model", "version"], '
        'requires = "histogram_latencies", since = "Triton 25.02 (decoupled models); Triton 26.03 (every model)", '
        "override = true }\n"
    )
    catalog = build([user])
    assert "needs 25.02+" in reasons(STREAM, CORE, (24, 12), catalog)["TimeToFirstToken"]
    assert "needs 26.03+" in reasons(PLAIN, CORE, (26, 1), catalog)["RequestLatency"]


def test_counter_latencies_is_the_families_requires():
    # Which families --metrics-config counter_latencies=false removes is said by the catalog, not by coverage.
    durations = {f for f, fam in CATALOG.families.items() if fam.requires == "counter_latencies"}
    assert "nv_inference_request_duration_us" in durations and len(durations) == 5
    assert (
        "counter_latencies is off"
        in reasons(PLAIN, CORE - {"nv_inference_request_duration_us"}, (24, 10))["RequestLatencyAvg"]
    )


def reasons(config: ModelConfig, present: set[str], release: tuple[int, int] | None, catalog: Catalog = CATALOG):
    return {g.metric: g.reason for g in gaps(catalog, config, present, release)}


def test_first_response_before_and_after_the_releases_that_publish_it():
    # 24.10: none at all; 24.11+: decoupled models only; 26.01+: every model
    assert "needs 24.11+" in reasons(STREAM, CORE, (24, 10))["TimeToFirstToken"]
    assert "needs 26.01+" in reasons(PLAIN, CORE, (25, 12))["RequestLatency"]
    assert "too old" not in reasons(STREAM, CORE, (24, 11)).get("TimeToFirstToken", "")
    later = reasons(PLAIN, CORE, (26, 1))
    assert (
        later["RequestLatency"] == "histogram_latencies is off (--metrics-config histogram_latencies=true turns it on)"
    )
    # present: nothing to say; a model that is not decoupled has no time to first token to miss
    with_histogram = reasons(PLAIN, CORE | {"nv_inference_first_response_histogram_ms_bucket"}, (26, 1))
    assert "RequestLatency" not in with_histogram and "TimeToFirstToken" not in with_histogram
    assert "RequestLatency" not in reasons(STREAM, CORE, (26, 1))  # decoupled: its first response is no latency


def test_unknown_version_does_not_claim_too_old():
    assert "too old" not in reasons(STREAM, CORE, None)["TimeToFirstToken"]


def test_since_of_a_family_is_compared_with_the_release():
    text = """
[families]
"app:thing" = { type = "gauge", labels = ["model", "version"], since = "Some backend v2 (Triton 25.04)" }

[[metric]]
name = "Thing"
scope = "model"
unit = "Count"
kind = "gauge"
inputs = ["app:thing"]
help = "A thing."
"""
    loaded = read([("x.toml", text)])
    catalog = Catalog(list(loaded.metrics.values()), loaded.families)
    assert loaded.families["app:thing"].since == "Some backend v2 (Triton 25.04)"
    assert reasons(PLAIN, set(), (25, 3), catalog) == {"Thing": "Triton 25.03 is too old: app:thing needs 25.04+"}
    assert reasons(PLAIN, set(), (25, 4), catalog) == {"Thing": "Triton prints no app:thing for this model"}
    assert reasons(PLAIN, {"app:thing"}, (25, 3), catalog) == {}


def test_llm_families_concern_only_their_backend():
    vllm = ModelConfig(decoupled=True, backend="vllm")
    on = ModelConfig(decoupled=True, backend="vllm", parameters=(("REPORT_CUSTOM_METRICS", "True"),))
    assert "REPORT_CUSTOM_METRICS=true" in reasons(vllm, CORE, (26, 1))["PromptTokens"]
    assert "REPORT_CUSTOM_METRICS" not in reasons(on, CORE, (26, 1)).get("PromptTokens", "")
    assert "PromptTokens" not in reasons(PLAIN, CORE, (26, 1))  # an image model misses no token count
    trt = ModelConfig(decoupled=True, backend="tensorrtllm")
    assert "KvCacheUtilization" in reasons(trt, CORE, (26, 1)) and "KvCacheUtilization" not in reasons(
        STREAM, CORE, (26, 1)
    )


def test_response_cache_and_counter_latencies():
    cached = ModelConfig(decoupled=False, response_cache=True)
    got = reasons(cached, CORE - {"nv_inference_request_summary_us", "nv_inference_request_duration_us"}, (24, 10))
    assert got["RequestLatencyP95"].startswith("response cache on")
    assert got["RequestLatencyAvg"] == "counter_latencies is off (--metrics-config counter_latencies=false)"


def test_logged_once_per_appearance_and_recomputed_only_on_change():
    with Capture.on("exporter.coverage") as capture:
        cov = Coverage(CATALOG)
        key = model_key("m", "1")
        labels = {key: LabelSet.of(model="m", version="1")}
        samples = {"nv_inference_request_success": {key: 1.0}}
        first = cov.update({key: PLAIN}, "2.51.0", samples, labels)
        assert first[key].model == "m" and first[key].gaps
        for _ in range(3):
            assert cov.update({key: PLAIN}, "2.51.0", samples, labels) == first
        assert len(capture.messages()) == 1 and capture.messages()[0].startswith("model 'm' version 1 cannot produce")
        cov.update({}, "2.51.0", samples, labels)  # gone (unloaded, or the index failed)
        cov.update({key: PLAIN}, "2.51.0", samples, labels)  # back: said again
        cov.update({key: PLAIN}, "2.66.0", samples, labels)  # Triton upgraded: said again
        assert len(capture.messages()) == 3


def test_the_llm_api_backend_is_recognised_and_its_missing_families_are_explained():
    """TensorRT-LLM's LLM-API model (upstream's triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt,
    as Triton's config API answers it) publishes no TensorRT-LLM family: say so instead of staying silent."""
    import orjson

    from exporter.sources.modelconfig import parse_config

    config_api = {
        "name": "tensorrt_llm",
        "backend": "python",
        "input": [
            {"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1]},
            {"name": "streaming", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
            {"name": "sampling_param_temperature", "data_type": "TYPE_FP32", "dims": [1], "optional": True},
        ],
        "output": [
            {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
            {"name": "kv_cache_hit_rate", "data_type": "TYPE_FP32", "dims": [-1]},
        ],
        "model_transaction_policy": {"decoupled": True},
    }
    llm_api = parse_config(orjson.dumps(config_api))
    assert llm_api.llm_api and llm_api.decoupled
    why = reasons(llm_api, CORE, (26, 1))
    assert "LLM-API (PyTorch) backend publishes none of nv_trt_llm_*" in why["KvCacheUtilization"]
    assert "LLM-API" in why["RequestsWaiting"]
    # A Python model that only looks a bit alike is not taken for it, and keeps its silence on TensorRT-LLM.
    other = parse_config(orjson.dumps({**config_api, "input": [{"name": "text_input"}]}))
    assert not other.llm_api and "KvCacheUtilization" not in reasons(other, CORE, (26, 1))


def test_cache_metrics_concern_only_models_with_the_response_cache_on():
    """The response cache is a per-model opt-in: a model without it misses nothing (the demo listed CacheHits
    for every model before)."""
    assert not {"CacheHits", "CacheMisses", "CacheHitRate"} & set(reasons(PLAIN, CORE, (26, 1)))
    cached = ModelConfig(decoupled=False, response_cache=True)
    assert {"CacheHits", "CacheMisses", "CacheHitRate"} <= set(reasons(cached, CORE, (26, 1)))


def test_a_backend_family_missing_where_the_backend_is_on_names_the_backend_release_that_publishes_it():
    """vLLM with REPORT_CUSTOM_METRICS on, but no e2e histogram: an older backend (r24.08) is the likely cause."""
    on = ModelConfig(decoupled=True, backend="vllm", parameters=(("REPORT_CUSTOM_METRICS", "true"),))
    why = reasons(on, CORE, (26, 1))
    e2e = next(m.name for m in CATALOG.metrics if any(i.family == "vllm:e2e_request_latency_seconds" for i in m.inputs))
    assert why[e2e] == (
        "no vllm:e2e_request_latency_seconds from this model's backend: it is published from vLLM backend r24.09"
    )


# --- a family that is there without the value a metric selects is a missing input too ----------------


def _trt_before_v018(step: int) -> str:
    """An upstream-shaped TensorRT-LLM body as backends before v0.18 print it: no request_type="waiting", no
    kv_cache_block_type="fraction" (both came with v0.18, Triton 25.04)."""
    from demo.payloads import llm_metrics, triton_metrics

    body = triton_metrics(["tensorrt_llm"], step) + llm_metrics(["tensorrt_llm"], step, "tensorrt_llm")
    lines = [ln for ln in body.splitlines() if 'request_type="waiting"' not in ln and '"fraction"' not in ln]
    assert len(lines) == len(body.splitlines()) - 2
    return "\n".join(lines) + "\n"


def test_tensorrt_llm_before_v018_is_said_to_miss_requests_waiting_and_kv_cache_utilization():
    """The regression: RequestsWaiting and KvCacheUtilization showed "-" in --once's table, but the coverage
    line (and its log line) did not name them: their families were there, the values they select were not."""
    from exporter.config import Settings
    from exporter.pipeline import Pipeline
    from exporter.summary import render_summary
    from tests.support.helpers import IndexSource, TextSource

    config = b'{"backend": "tensorrtllm", "model_transaction_policy": {"decoupled": true}}'
    sources = [
        TextSource(_trt_before_v018(1), _trt_before_v018(2)),
        IndexSource(
            b'[{"name": "tensorrt_llm", "version": "1", "state": "READY"}]',
            {"tensorrt_llm/1": config},
            server_version="2.55.0",  # 25.02
        ),
    ]
    clock = [0.0]
    with Capture.on("exporter.coverage") as capture:
        pipe = Pipeline(Settings(nvml="off", timeout=1.0), CATALOG, sources, clock=lambda: clock[0])
        pipe.cycle()
        clock[0] += 60.0
        result = pipe.cycle()
    (line,) = capture.messages()
    why = {g.metric: g.reason for g in result.coverage[model_key("tensorrt_llm", "1")].gaps}
    assert why["RequestsWaiting"] == (
        'nv_trt_llm_request_metrics has no request_type="waiting" for this model: '
        "it is published from TensorRT-LLM backend v0.18 (Triton 25.04)"
    )
    assert why["KvCacheUtilization"] == (
        'nv_trt_llm_kv_cache_block_metrics has no kv_cache_block_type="fraction" for this model: '
        "it is published from TensorRT-LLM backend v0.18 (Triton 25.04)"
    )
    assert "RequestsWaiting (" in line and "KvCacheUtilization (" in line
    assert not {"RequestsActive", "KvCacheBlocksUsed", "RequestsMax"} & set(why)  # their values are there
    text = render_summary(result)
    # --once's "not produced, and why": each reason once, then the metrics it keeps from the model
    for metric in ("RequestsWaiting", "KvCacheUtilization"):
        shown = text[text.index("  " + why[metric] + "\n") :].splitlines()[1]
        assert metric in shown and shown.endswith(": tensorrt_llm/1")
    row = next(r for r in text.split("LLM serving")[1].splitlines() if r.startswith("tensorrt_llm"))
    assert row.split()[-1] == str(len(why))  # the table's count is the line's


def _selecting() -> list[tuple[str, str, tuple[str, str]]]:
    """(metric, sample, (label, value)) for every model metric of the catalog that selects one split value of a
    /metrics family, its inputs and denominators alike."""
    out = []
    for m in CATALOG.metrics:
        if m.scope is not Scope.MODEL:
            continue
        for i in (*m.inputs, *m.denominators):
            if i.where is not None and CATALOG.families[i.family].source == "triton":
                out.append((m.name, i.sample, i.where))
    return out


def _concerned_config(family: Family) -> ModelConfig:
    if family.requires == "tensorrt_llm":
        return ModelConfig(decoupled=True, backend="tensorrtllm")
    if family.requires == "vllm":
        return ModelConfig(decoupled=True, backend="vllm", parameters=(("REPORT_CUSTOM_METRICS", "true"),))
    return ModelConfig(decoupled=False, backend="python", response_cache=family.requires == "response_cache")


def test_the_split_values_are_derived_from_the_catalog():
    cases = _selecting()
    assert {
        ("RequestsWaiting", ("request_type", "waiting")),
        ("KvCacheUtilization", ("kv_cache_block_type", "fraction")),
    } <= {(m, w) for m, _, w in cases}
    assert {w[0] for _, _, w in cases} >= {"reason", "quantile", "request_type", "kv_cache_block_type"}


@pytest.mark.parametrize(("metric", "sample", "where"), _selecting(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_metric_that_selects_a_split_value_is_named_when_only_that_value_is_missing(metric, sample, where):
    """Through Coverage.update (the scrape's bit masks): the family is there with every other value the catalog
    selects of it, and a value no metric reads, but not this one: the metric is named, with the value."""
    family = next(CATALOG.families[i.family] for m in CATALOG.metrics for i in m.all_inputs() if i.sample == sample)
    config = _concerned_config(family)
    label, value = where
    others = {w[1] for _, s, w in _selecting() if s == sample and w[0] == label} - {value}
    key = model_key("m", "1")
    labels = {key: LabelSet.of(model="m", version="1")}

    def scrape(values: set[str]) -> dict[str, dict[str, float]]:
        samples: dict[str, dict[str, float]] = {n: {key: 1.0} for n in CORE}
        samples[sample] = {}
        for v in (*values, "not_read_by_any_metric"):
            ls = LabelSet.of(model="m", version="1", **{label: v})
            labels[ls.key] = ls
            samples[sample][ls.key] = 1.0
        return samples

    missing = Coverage(CATALOG).update({key: config}, "2.66.0", scrape(others), labels)[key]
    why = {g.metric: g.reason for g in missing.gaps}
    assert metric in why and f'{family.name} has no {label}="{value}" for this model' in why[metric]
    complete = Coverage(CATALOG).update({key: config}, "2.66.0", scrape(others | {value}), labels)[key]
    assert metric not in {g.metric for g in complete.gaps}


def test_a_since_clause_about_one_value_does_not_stand_for_the_whole_family():
    """nv_trt_llm_request_metrics' since names v0.18 (Triton 25.04) for request_type waiting only: a model whose
    backend prints none of the family on Triton 25.02 is not told that Triton is too old for RequestsActive."""
    trt = ModelConfig(decoupled=True, backend="tensorrtllm")
    why = reasons(trt, CORE, (25, 2))
    assert "too old" not in why["RequestsActive"] and "too old" not in why["RequestsWaiting"]
    assert why["RequestsActive"] == "Triton prints no nv_trt_llm_request_metrics for this model"
