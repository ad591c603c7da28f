"""Delta state and the catalog transform, on hand-built series."""

from __future__ import annotations

import math

import pytest

from catalog import Scope, modelsync_catalog
from exporter.series import LabelSet
from exporter.state import DeltaState
from exporter.transform import Transform, histogram_quantile
from tests.support.helpers import CATALOG


def series(**values: float) -> tuple[dict[str, float], dict[str, LabelSet]]:
    """model name -> value, as one series each (labels model, version=1)."""
    labels = {}
    out = {}
    for model, v in values.items():
        ls = LabelSet.of(model=model, version="1")
        labels[ls.key] = ls
        out[ls.key] = v
    return out, labels


def test_first_scrape_is_a_baseline_then_deltas():
    state = DeltaState(CATALOG.counter_samples())
    s, labels = series(a=10, b=5)
    w = state.update({"nv_inference_request_success": s}, labels, 0.0)
    assert w.elapsed is None and w.deltas == {}
    s2, _ = series(a=13, b=5)
    w = state.update({"nv_inference_request_success": s2}, labels, 30.0)
    assert w.elapsed == 30.0
    assert sorted(w.deltas["nv_inference_request_success"].values()) == [0, 3]


def test_counter_going_down_resets_the_whole_entity():
    state = DeltaState(CATALOG.counter_samples())
    s, labels = series(a=10, b=5)
    d, _ = series(a=100, b=100)
    state.update({"nv_inference_request_success": s, "nv_inference_request_duration_us": d}, labels, 0.0)
    s2, _ = series(a=2, b=6)  # a restarted
    d2, _ = series(a=150, b=200)  # a's duration did not go down, but a is reset as a whole
    w = state.update({"nv_inference_request_success": s2, "nv_inference_request_duration_us": d2}, labels, 60.0)
    a_key = LabelSet.of(model="a", version="1").key
    assert w.reset_entities == {a_key}
    assert a_key not in w.deltas["nv_inference_request_success"]
    assert a_key not in w.deltas["nv_inference_request_duration_us"]
    assert list(w.deltas["nv_inference_request_duration_us"].values()) == [100]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_inf_counter_is_a_reset_not_a_value(bad):
    state = DeltaState(CATALOG.counter_samples())
    s, labels = series(a=1)
    state.update({"nv_inference_count": s}, labels, 0.0)
    s2, _ = series(a=bad)
    w = state.update({"nv_inference_count": s2}, labels, 60.0)
    assert w.deltas["nv_inference_count"] == {} and w.reset_entities
    s3, _ = series(a=5)
    w = state.update({"nv_inference_count": s3}, labels, 120.0)
    assert w.deltas["nv_inference_count"] == {}  # recovering from NaN is a reset too: no bogus delta
    s4, _ = series(a=7)
    assert list(state.update({"nv_inference_count": s4}, labels, 180.0).deltas["nv_inference_count"].values()) == [2]


def test_vanished_series_leave_the_state():
    state = DeltaState(CATALOG.counter_samples())
    many, labels = series(**{f"m{i}": 1.0 for i in range(500)})
    state.update({"nv_inference_count": many}, labels, 0.0)
    assert state.size() == 500
    few, labels2 = series(m1=2.0)
    state.update({"nv_inference_count": few}, labels2, 60.0)
    assert state.size() == 1


def test_gauges_are_not_held_in_the_state():
    state = DeltaState(CATALOG.counter_samples())
    s, labels = series(a=3)
    state.update({"nv_inference_pending_request_count": s}, labels, 0.0)
    assert state.size() == 0


def run(metrics_at_0: dict, metrics_at_t: dict, labels: dict, elapsed: float = 60.0):
    state = DeltaState(CATALOG.counter_samples())
    state.update(metrics_at_0, labels, 0.0)
    window = state.update(metrics_at_t, labels, elapsed)
    return Transform(CATALOG).evaluate(metrics_at_t, window, labels, {}).values


def test_ratios_only_with_a_positive_denominator():
    s0, labels = series(a=10, b=10)
    d0, _ = series(a=1000, b=1000)
    s1, _ = series(a=14, b=10)
    d1, _ = series(a=1400, b=1000)
    cols = run(
        {"nv_inference_request_success": s0, "nv_inference_request_duration_us": d0},
        {"nv_inference_request_success": s1, "nv_inference_request_duration_us": d1},
        labels,
    )
    a = LabelSet.of(model="a", version="1").key
    b = LabelSet.of(model="b", version="1").key
    assert cols["RequestLatencyAvg"] == {a: 100.0}  # b had no requests: no average, not 0, not NaN
    assert cols["RequestsPerSecond"] == {a: pytest.approx(4 / 60), b: 0.0}


def test_quantiles_only_when_requests_arrived_and_finite():
    labels = {}
    q = {}
    for model, value in (("a", 1500.0), ("b", 900.0), ("c", math.nan)):
        for quantile in ("0.5", "0.95", "0.99"):
            ls = LabelSet.of(model=model, version="1", quantile=quantile)
            labels[ls.key] = ls
            q[ls.key] = value
    s0, l2 = series(a=1, b=1, c=1)
    s1, _ = series(a=3, b=1, c=9)
    labels.update(l2)
    cols = run(
        {"nv_inference_request_success": s0},
        {"nv_inference_request_success": s1, "nv_inference_request_summary_us": q},
        labels,
    )
    assert cols["RequestLatencyP95"] == {LabelSet.of(model="a", version="1").key: 1500.0}


def test_histogram_quantile_matches_prometheus_interpolation():
    inf = math.inf
    assert histogram_quantile(0.5, (100, 500, inf), (10, 50, 50)) == pytest.approx(100 + 400 * 15 / 40)
    assert histogram_quantile(0.99, (100, 500, inf), (10, 50, 100)) == 500  # rank in +Inf: highest bound
    assert histogram_quantile(0.5, (100, inf), (0, 0)) is None  # no observations in the window
    assert histogram_quantile(0.5, (100,), (3,)) is None  # no +Inf bucket: not a valid histogram


def test_first_present_input_wins_for_gpu_metrics():
    uuid = "GPU-1"
    ls = LabelSet.of(gpu_uuid=uuid)
    labels = {ls.key: ls}
    both = {"nv_gpu_utilization": {ls.key: 0.5}, "nvml_gpu_utilization_percent": {ls.key: 10.0}}
    assert run(both, both, labels)["GpuUtilization"] == {ls.key: 50.0}
    nvml_only = {"nvml_gpu_utilization_percent": {ls.key: 10.0}}
    assert run(nvml_only, nvml_only, labels)["GpuUtilization"] == {ls.key: 10.0}


def test_series_split_by_gpu_are_summed_per_model():
    labels, s0, s1 = {}, {}, {}
    for gpu, before, after in (("G1", 10, 15), ("G2", 20, 27)):
        ls = LabelSet.of(model="m", version="1", gpu_uuid=gpu)
        labels[ls.key] = ls
        s0[ls.key], s1[ls.key] = before, after
    cols = run({"nv_inference_request_success": s0}, {"nv_inference_request_success": s1}, labels)
    assert cols["RequestSuccess"] == {LabelSet.of(model="m", version="1").key: 12}


def test_every_catalog_metric_has_a_computation():
    for m in CATALOG.metrics:
        if m.kind.value in ("state", "self"):
            assert not m.inputs
        else:
            assert m.inputs, m.name
    assert CATALOG.get("GpuPowerWatts").unit == "None"
    # Every scope is used: the model-sync one by model sync's own pack, never by the exporter's catalog.
    assert {m.scope for m in CATALOG.metrics} == set(Scope) - {Scope.MODELSYNC}
    assert {m.scope for m in modelsync_catalog().metrics} == {Scope.MODELSYNC}
