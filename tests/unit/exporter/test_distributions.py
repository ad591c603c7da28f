"""Histograms as CloudWatch distributions: bucket deltas in, EMF value objects out, valid and truthful."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import Scope
from exporter.series import LabelSet
from exporter.sources import ModelConfig
from exporter.sources.promtext import Parser
from exporter.state import DeltaState
from exporter.transform import MAX_DISTRIBUTION_PAIRS, Transform
from telemetry.emf import Encoder, Event
from telemetry.emf_validate import validate
from tests.support.helpers import CATALOG

TTFT = "vllm:time_to_first_token_seconds"
TRITON_FIRST = "nv_inference_first_response_histogram_ms"
INF = math.inf


def histogram(
    family: str, per_model: dict[str, tuple[dict[float, float], float]], **extra: str
) -> tuple[dict[str, dict[str, float]], dict[str, LabelSet]]:
    """Samples of ``family``: per model (cumulative counts by upper bound, sum)."""
    samples: dict[str, dict[str, float]] = {f"{family}_bucket": {}, f"{family}_sum": {}}
    labels: dict[str, LabelSet] = {}
    for model, (cumulative, total) in per_model.items():
        base = {"model": model, "version": "1", **extra}
        for bound, count in cumulative.items():
            ls = LabelSet.of(**base, le="+Inf" if bound == INF else repr(bound))
            labels[ls.key] = ls
            samples[f"{family}_bucket"][ls.key] = count
        ls = LabelSet.of(**base)
        labels[ls.key] = ls
        samples[f"{family}_sum"][ls.key] = total
        entity = LabelSet.of(model=model, version="1")
        labels[entity.key] = entity
    return samples, labels


def window(
    before: dict,
    after: dict,
    labels: dict,
    transform: Transform | None = None,
    decoupled: dict[str, bool] | None = None,
):
    """One window; every model is decoupled (a streaming model: Triton's first response is its first token)
    unless ``decoupled`` (model -> flag) says otherwise; a model left out of it has no known configuration."""
    transform = transform or Transform(CATALOG)
    state = DeltaState(CATALOG.counter_samples())
    state.update(before, labels, 0.0)
    w = state.update(after, labels, 60.0)
    models = {ls.entity[1] for ls in labels.values() if ls.entity[0] == "model"}
    flags = dict.fromkeys(models, True) if decoupled is None else decoupled
    configs = {key(m): ModelConfig(decoupled=flag) for m, flag in flags.items()}
    return transform.evaluate(after, w, labels, {}, configs)


def key(model: str) -> str:
    return LabelSet.of(model=model, version="1").key


BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, INF)


def cumulative(observations: list[float]) -> dict[float, float]:
    return {b: float(sum(1 for o in observations if o <= b)) for b in BUCKETS}


def test_bucket_deltas_become_values_counts_at_midpoints_in_milliseconds() -> None:
    before, labels = histogram(TTFT, {"m": (cumulative([0.05] * 3), 0.15)})
    obs = [0.05] * 4 + [0.07] * 5 + [0.3]  # this window: 4 in (0.04, 0.06], 5 in (0.06, 0.08], 1 in (0.25, 0.5]
    after, _ = histogram(TTFT, {"m": (cumulative([0.05] * 3 + obs), 0.15 + sum(obs))})
    dist = window(before, after, labels).distributions["TimeToFirstToken"][key("m")]
    assert dist == {
        "Values": [50.0, 70.0, 375.0],
        "Counts": [4.0, 5.0, 1.0],
        "Max": 500.0,
        "Min": 40.0,
        "Count": 10.0,
        "Sum": pytest.approx(sum(obs) * 1000),
    }


def test_first_bucket_starts_at_zero_and_inf_bucket_is_its_lower_edge() -> None:
    before, labels = histogram(TRITON_FIRST, {"m": ({100: 0, 500: 0, 2000: 0, 5000: 0, INF: 0}, 0)})
    after, _ = histogram(TRITON_FIRST, {"m": ({100: 2, 500: 2, 2000: 2, 5000: 2, INF: 5}, 9000)})
    dist = window(before, after, labels).distributions["TimeToFirstToken"][key("m")]
    assert dist["Values"] == [50.0, 5000.0] and dist["Counts"] == [2.0, 3.0]
    assert (dist["Min"], dist["Max"]) == (0.0, 5000.0)  # +Inf: its lower edge bounds Max
    assert dist["Sum"] == 9000


def test_no_observation_no_metric_and_the_first_scrape_is_a_baseline() -> None:
    same, labels = histogram(TTFT, {"m": (cumulative([0.05]), 0.05)})
    assert "TimeToFirstToken" not in window(same, same, labels).distributions
    state = DeltaState(CATALOG.counter_samples())
    w = state.update(same, labels, 0.0)
    assert Transform(CATALOG).evaluate(same, w, labels, {}).distributions == {}


def test_a_reset_emits_nothing_for_that_model_only() -> None:
    before, labels = histogram(TTFT, {"a": (cumulative([0.05] * 9), 0.45), "b": (cumulative([0.05]), 0.05)})
    after, _ = histogram(TTFT, {"a": (cumulative([0.05] * 2), 0.1), "b": (cumulative([0.05] * 3), 0.15)})
    dists = window(before, after, labels).distributions["TimeToFirstToken"]
    assert set(dists) == {key("b")} and dists[key("b")]["Count"] == 2


def test_first_present_input_wins_per_model() -> None:
    """A vLLM model with Triton's histogram too reports vLLM's; a TensorRT-LLM model reports Triton's."""
    v0, labels = histogram(TTFT, {"vllm": (cumulative([]), 0)})
    v1, _ = histogram(TTFT, {"vllm": (cumulative([0.05]), 0.05)})
    t0, l2 = histogram(TRITON_FIRST, {"vllm": ({100: 0, INF: 0}, 0), "trt": ({100: 0, INF: 0}, 0)})
    t1, _ = histogram(TRITON_FIRST, {"vllm": ({100: 0, INF: 7}, 7000), "trt": ({100: 3, INF: 3}, 150)})
    labels |= l2
    dists = window(v0 | t0, v1 | t1, labels).distributions["TimeToFirstToken"]
    assert dists[key("vllm")]["Values"] == [50.0] and dists[key("vllm")]["Count"] == 1
    assert dists[key("trt")]["Values"] == [50.0] and dists[key("trt")]["Count"] == 3 and dists[key("trt")]["Sum"] == 150


def test_gpu_instances_add_up_bucket_by_bucket() -> None:
    b0, labels = histogram(TRITON_FIRST, {"m": ({100: 0, INF: 0}, 0)}, gpu_uuid="GPU-a")
    b1, l1 = histogram(TRITON_FIRST, {"m": ({100: 0, INF: 0}, 0)}, gpu_uuid="GPU-b")
    a0, _ = histogram(TRITON_FIRST, {"m": ({100: 2, INF: 3}, 500)}, gpu_uuid="GPU-a")
    a1, _ = histogram(TRITON_FIRST, {"m": ({100: 1, INF: 1}, 60)}, gpu_uuid="GPU-b")
    before = {k: {**b0[k], **b1[k]} for k in b0}
    after = {k: {**a0[k], **a1[k]} for k in a0}
    dist = window(before, after, labels | l1).distributions["TimeToFirstToken"][key("m")]
    assert dist["Counts"] == [3.0, 1.0] and dist["Sum"] == 560


def test_buckets_that_go_down_against_each_other_are_left_out_and_counted() -> None:
    before, labels = histogram(TRITON_FIRST, {"m": ({100: 5, 500: 5, INF: 5}, 100)})
    after, _ = histogram(TRITON_FIRST, {"m": ({100: 9, 500: 7, INF: 9}, 300)})  # le=100 gained more than le=500
    result = window(before, after, labels)
    assert "TimeToFirstToken" not in result.distributions and result.inconsistent_histograms == 1


def test_a_histogram_without_inf_bucket_is_not_guessed_at() -> None:
    before, labels = histogram(TRITON_FIRST, {"m": ({100: 0, 500: 0}, 0)})
    after, _ = histogram(TRITON_FIRST, {"m": ({100: 2, 500: 3}, 300)})
    assert "TimeToFirstToken" not in window(before, after, labels).distributions


def test_more_than_100_buckets_are_merged_within_their_edges() -> None:
    bounds = [float(i) for i in range(1, 251)] + [INF]
    zero = {b: 0.0 for b in bounds}
    full = {b: float(min(i + 1, 250)) for i, b in enumerate(bounds)}  # one observation in each finite bucket
    catalog = CATALOG
    before, labels = histogram(TRITON_FIRST, {"m": (zero, 0)})
    after, _ = histogram(TRITON_FIRST, {"m": (full, 250 * 125)})
    dist = window(before, after, labels, Transform(catalog)).distributions["TimeToFirstToken"][key("m")]
    assert len(dist["Values"]) <= MAX_DISTRIBUTION_PAIRS and dist["Count"] == 250 == sum(dist["Counts"])
    assert dist["Min"] <= min(dist["Values"]) <= max(dist["Values"]) <= dist["Max"]


def test_per_task_percentile_interpolates_in_the_window_buckets() -> None:
    before, labels = histogram(TTFT, {"m": (cumulative([]), 0)})
    obs = [0.05] * 4 + [0.07] * 5 + [0.3]
    after, _ = histogram(TTFT, {"m": (cumulative(obs), sum(obs))})
    values = window(before, after, labels).values
    # rank 5 of 10: in (0.06, 0.08] holding ranks 5-9 -> 60 + 20 * (5 - 4) / 5 ms
    assert values["TimeToFirstTokenP50"][key("m")] == pytest.approx(64.0)
    assert values["TimeToFirstTokenP99"][key("m")] == pytest.approx(250 + 250 * (9.9 - 9))


def test_distributions_encode_to_valid_emf() -> None:
    before, labels = histogram(TTFT, {"m": (cumulative([]), 0)})
    after, _ = histogram(TTFT, {"m": (cumulative([0.05, 0.3, 12.0]), 12.35)})
    dists = window(before, after, labels).distributions
    enc = Encoder("Triton", CATALOG.metrics)
    event = Event(
        Scope.MODEL,
        {"model": "m", "version": "1"},
        {"RequestSuccess": 3.0},
        {},
        {name: d[key("m")] for name, d in dists.items()},
    )
    [doc] = enc.encode(event, 1_796_000_000_000)
    assert validate(doc, now_ms=1_796_000_000_000) == []
    parsed = orjson.loads(doc)
    assert parsed["TimeToFirstToken"]["Values"] == [50.0, 375.0, 10000.0]
    declared = {m["Name"] for d in parsed["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert declared == {"TimeToFirstToken", "RequestSuccess"}  # one distribution, one number


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=50), min_size=len(BUCKETS), max_size=len(BUCKETS)),
    st.floats(min_value=0, max_value=1e6),
)
def test_any_bucket_deltas_give_a_valid_truthful_distribution(per_bucket: list[int], total: float) -> None:
    cum, running = {}, 0
    for bound, n in zip(BUCKETS, per_bucket, strict=True):
        running += n
        cum[bound] = float(running)
    before, labels = histogram(TTFT, {"m": ({b: 0.0 for b in BUCKETS}, 0.0)})
    after, _ = histogram(TTFT, {"m": (cum, total)})
    dists = window(before, after, labels).distributions.get("TimeToFirstToken", {})
    if running == 0:
        assert dists == {}
        return
    dist = dists[key("m")]
    assert dist["Count"] == running == sum(dist["Counts"]) and all(c > 0 for c in dist["Counts"])
    assert dist["Min"] <= min(dist["Values"]) and max(dist["Values"]) <= dist["Max"]
    lowers = (0.0, *(b * 1000 for b in BUCKETS[:-1]))
    uppers = tuple(b * 1000 for b in BUCKETS)
    expected = [
        (lo + hi) / 2 if hi != INF else lo for lo, hi, n in zip(lowers, uppers, per_bucket, strict=True) if n > 0
    ]
    assert dist["Values"] == pytest.approx(expected)
    doc = {
        "_aws": {
            "Timestamp": 1,
            "CloudWatchMetrics": [{"Namespace": "T", "Dimensions": [[]], "Metrics": [{"Name": "D"}]}],
        },
        "D": dist,
    }
    assert [e for e in validate(doc, now_ms=1) if "Timestamp" not in e] == []


# --- the validator's distribution rules --------------------------------------------------------


def _doc(value: object) -> dict:
    return {
        "_aws": {
            "Timestamp": 1,
            "CloudWatchMetrics": [
                {"Namespace": "T", "Dimensions": [[]], "Metrics": [{"Name": "D", "Unit": "Milliseconds"}]}
            ],
        },
        "D": value,
    }


GOOD = {"Values": [1.0, 2.0], "Counts": [3.0, 1.0], "Max": 2.5, "Min": 0.5, "Count": 4.0, "Sum": 5.0}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({}, None),
        ({"Values": [float(i) for i in range(101)], "Counts": [1.0] * 101, "Count": 101.0}, "1-100 value/count pairs"),
        ({"Counts": [3.0, 0.0], "Count": 3.0}, "Counts must be finite numbers > 0"),
        ({"Counts": [3.0, -1.0], "Count": 2.0}, "Counts must be finite numbers > 0"),
        ({"Values": [1.0, float("nan")]}, "Values must be finite numbers"),
        ({"Count": 5.0}, "Count 5.0 is not the sum of Counts"),
        ({"Min": 3.0}, "Min 3.0 > Max 2.5"),
        ({"Sum": float("inf")}, "Sum must be finite numbers"),
        ({"Values": [1.0]}, "1 Values but 2 Counts"),
        ({"Extra": 1}, "unexpected ['Extra']"),
    ],
)
def test_validator_knows_the_distribution_shape(change: dict, error: str | None) -> None:
    value = {**GOOD, **change}
    errors = [e for e in validate(_doc(value), now_ms=1) if "Timestamp" not in e]
    if error is None:
        assert errors == []
    else:
        assert any(error in e for e in errors), errors
    missing = dict(GOOD)
    del missing["Sum"]
    assert any("missing ['Sum']" in e for e in validate(_doc(missing), now_ms=1))


# --- breakdown zeros ---------------------------------------------------------------------------


def failures(reasons: dict[str, dict[str, float]]) -> tuple[dict, dict]:
    samples: dict[str, float] = {}
    labels: dict[str, LabelSet] = {}
    for model, by_reason in reasons.items():
        for reason, value in by_reason.items():
            ls = LabelSet.of(model=model, reason=reason, version="1")
            labels[ls.key] = ls
            samples[ls.key] = value
        entity = LabelSet.of(model=model, version="1")
        labels[entity.key] = entity
    return {"nv_inference_request_failure": samples}, labels


REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")


@pytest.mark.parametrize("emit", [False, True])
def test_reason_zeros_are_left_out_while_no_request_failed(emit: bool) -> None:
    before, labels = failures({"idle": dict.fromkeys(REASONS, 1.0), "failing": dict.fromkeys(REASONS, 1.0)})
    after, _ = failures(
        {"idle": dict.fromkeys(REASONS, 1.0), "failing": {**dict.fromkeys(REASONS, 1.0), "BACKEND": 4.0}}
    )
    values = window(before, after, labels, Transform(CATALOG, breakdown_zeros=emit)).values
    assert values["RequestFailure"] == {key("idle"): 0.0, key("failing"): 3.0}  # totals keep their data points
    assert values["RequestFailureBackend"][key("failing")] == 3.0
    assert values["RequestFailureOther"][key("failing")] == 0.0  # a zero beside a non-zero total is information
    for reason in REASONS:
        assert (key("idle") in values[f"RequestFailure{reason.title()}"]) is emit


def test_a_deselected_total_still_decides_its_breakdowns_zeros() -> None:
    catalog = CATALOG.select("-RequestFailure")
    before, labels = failures({"idle": dict.fromkeys(REASONS, 0.0), "failing": dict.fromkeys(REASONS, 0.0)})
    after, _ = failures(
        {"idle": dict.fromkeys(REASONS, 0.0), "failing": {**dict.fromkeys(REASONS, 0.0), "REJECTED": 2.0}}
    )
    values = window(before, after, labels, Transform(catalog)).values
    assert "RequestFailure" not in values
    assert values["RequestFailureCanceled"] == {key("failing"): 0.0}


def test_parser_reads_histogram_families_with_colons() -> None:
    from demo.payloads import llm_metrics

    exp = Parser(CATALOG.wanted_samples()).parse(llm_metrics(["m"], 2, "vllm"))
    bucket = exp.samples[f"{TTFT}_bucket"]
    assert len(bucket) == len(BUCKETS) and exp.malformed == 0
    assert exp.samples[f"{TTFT}_sum"] == {LabelSet.of(model="m", version="1").key: pytest.approx(1.7)}


# --- decoupled or not: time to first token, or request latency -------------------------------------


def test_first_response_is_a_time_to_first_token_only_for_decoupled_models():
    """Triton 26.01+ prints the first-response histogram for every model: for a model that is not decoupled the
    first response is the whole response, so it is a request latency, never a time to first token."""
    zero = {100.0: 0, 500.0: 0, 2000.0: 0, 5000.0: 0, INF: 0}
    full = {100.0: 10, 500.0: 30, 2000.0: 30, 5000.0: 30, INF: 30}
    models = {m: (zero, 0) for m in ("stream", "plain", "unknown")}
    before, labels = histogram(TRITON_FIRST, models)
    after, _ = histogram(TRITON_FIRST, {m: (full, 3000) for m in models})
    result = window(before, after, labels, decoupled={"stream": True, "plain": False})
    assert set(result.distributions["TimeToFirstToken"]) == {key("stream")}
    assert set(result.distributions["RequestLatency"]) == {key("plain")}
    assert result.distributions["RequestLatency"][key("plain")]["Count"] == 30
    # a version whose configuration is not known yet gets neither (no guess)
    assert key("unknown") not in result.distributions["TimeToFirstToken"]


def test_vllm_time_to_first_token_does_not_depend_on_the_configuration():
    before, labels = histogram(TTFT, {"v": (cumulative([]), 0)})
    after, _ = histogram(TTFT, {"v": (cumulative([0.03, 0.03]), 0.06)})
    result = window(before, after, labels, decoupled={})  # configuration unknown (or not decoupled)
    assert result.distributions["TimeToFirstToken"][key("v")]["Count"] == 2
    assert "RequestLatency" not in result.distributions


# --- each series on its own bounds (a model config may set its own buckets) --------------------------

CUSTOM = (10.0, 25.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 10000.0)  # docs/llm.md's kind
DEFAULT = (100.0, 500.0, 2000.0, 5000.0)  # Triton's


def counts(bounds: tuple[float, ...], observations: list[float]) -> dict[float, float]:
    return {b: float(sum(1 for o in observations if o <= b)) for b in (*bounds, INF)}


def test_models_with_different_bounds_each_keep_their_distribution():
    """One model's config sets its own first-response buckets, the other keeps Triton's: neither loses its
    TimeToFirstToken (decoupled) or RequestLatency (not decoupled); each is read on its own bounds."""
    obs = [40.0, 40.0, 120.0, 700.0]
    before, labels = histogram(
        TRITON_FIRST,
        {m: (counts(b, []), 0.0) for m, b in (("custom", CUSTOM), ("default", DEFAULT), ("plain", CUSTOM))}
        | {"plain2": (counts(DEFAULT, []), 0.0)},
    )
    after, _ = histogram(
        TRITON_FIRST,
        {m: (counts(b, obs), 900.0) for m, b in (("custom", CUSTOM), ("default", DEFAULT), ("plain", CUSTOM))}
        | {"plain2": (counts(DEFAULT, obs), 900.0)},
    )
    flags = {"custom": True, "default": True, "plain": False, "plain2": False}
    result = window(before, after, labels, decoupled=flags)
    ttft, latency = result.distributions["TimeToFirstToken"], result.distributions["RequestLatency"]
    assert set(ttft) == {key("custom"), key("default")} and set(latency) == {key("plain"), key("plain2")}
    own = {"Values": [37.5, 125.0, 625.0], "Counts": [2.0, 1.0, 1.0], "Min": 25.0, "Max": 750.0}
    triton = {"Values": [50.0, 300.0, 1250.0], "Counts": [2.0, 1.0, 1.0], "Min": 0.0, "Max": 2000.0}
    for dist, want in ((ttft[key("custom")], own), (ttft[key("default")], triton)):
        assert {k: dist[k] for k in want} == want and (dist["Count"], dist["Sum"]) == (4.0, 900.0)
    assert latency[key("plain")]["Values"] == own["Values"] and latency[key("plain2")]["Values"] == triton["Values"]
    assert result.inconsistent_histograms == 0


def test_per_task_percentiles_read_each_models_own_bounds():
    """The same for a percentile: vLLM's histogram where one model was given other bounds."""
    fine = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
    before, labels = histogram(TTFT, {"a": (counts(BUCKETS[:-1], []), 0.0), "b": (counts(fine, []), 0.0)})
    obs = [0.015] * 10
    after, _ = histogram(TTFT, {"a": (counts(BUCKETS[:-1], obs), 0.15), "b": (counts(fine, obs), 0.15)})
    values = window(before, after, labels).values["TimeToFirstTokenP95"]
    assert values[key("a")] == pytest.approx(19.5) and values[key("b")] == pytest.approx(19.5)


def test_a_torn_histogram_is_left_out_without_costing_the_others_theirs():
    """A series without its +Inf bucket in the window is not guessed at; models on other bounds keep theirs."""
    before, labels = histogram(TRITON_FIRST, {"torn": (counts(CUSTOM, []), 0.0), "ok": (counts(DEFAULT, []), 0.0)})
    after, _ = histogram(TRITON_FIRST, {"torn": (counts(CUSTOM, [40.0]), 40.0), "ok": (counts(DEFAULT, [40.0]), 40.0)})
    inf = LabelSet.of(model="torn", version="1", le="+Inf").key
    del after[f"{TRITON_FIRST}_bucket"][inf]
    del before[f"{TRITON_FIRST}_bucket"][inf]
    assert set(window(before, after, labels).distributions["TimeToFirstToken"]) == {key("ok")}


def test_once_shows_time_to_first_token_of_models_on_their_own_and_on_tritons_buckets():
    """Through the pipeline and --once's table: a model on docs/llm.md's buckets beside one on Triton's default
    buckets; both show their TTFT p95 and their EMF distribution (the second showed "-" before)."""
    from demo.payloads import triton_metrics
    from exporter.config import Settings
    from exporter.pipeline import Pipeline
    from exporter.summary import render_summary
    from tests.support.helpers import IndexSource, TextSource, documents, model_doc
    from tests.support.histograms import first_response

    models = ("tuned", "stock")
    bounds = {"tuned": CUSTOM, "stock": DEFAULT}

    def body(obs: list[float]) -> str:
        return triton_metrics(list(models), step=len(obs) + 1) + first_response({m: (bounds[m], obs) for m in models})

    index = orjson.dumps([{"name": m, "version": "1", "state": "READY"} for m in models])
    decoupled = b'{"backend": "python", "model_transaction_policy": {"decoupled": true}}'
    sources = [
        TextSource(body([]), body([40.0, 40.0, 120.0, 700.0])),
        IndexSource(index, {f"{m}/1": decoupled for m in models}, server_version="2.52.0"),
    ]
    clock = [0.0]
    pipe = Pipeline(Settings(nvml="off", timeout=1.0), CATALOG, sources, clock=lambda: clock[0])
    pipe.cycle()
    clock[0] += 60.0
    result = pipe.cycle()
    docs = documents(result)
    assert model_doc(docs, "tuned")["TimeToFirstToken"]["Values"] == [37.5, 125.0, 625.0]
    assert model_doc(docs, "stock")["TimeToFirstToken"]["Values"] == [50.0, 300.0, 1250.0]
    table = render_summary(result).split("LLM serving")[1]
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.startswith(models)}
    assert (rows["tuned"][2], rows["stock"][2]) == ("625.0", "1250.0")  # TTFT p95 ms, nearest rank
