"""``python -m render cost --otlp``: OTLP points and GB a month, bytes per point from the real encoder."""

from __future__ import annotations

import pytest

from render import cost
from render.base.options import Options
from tests.support.helpers import CATALOG

OPTS = Options(catalog=CATALOG)


def test_points_and_bytes_come_from_the_encoder_and_scale_with_tasks() -> None:
    one = cost.otlp_estimate(cost.Deployment(models=1000), OPTS)
    # bench/bench_pipeline.py measured 24,028 points and 76 B a point for 1000 core models (one GPU, no NVML
    # fields beyond Triton's; the request and queue summaries 10,000 of them); the model here adds the NVML
    # source's GPU series and the exporter's own gauges.
    assert 24_000 <= one.points_per_cycle <= 26_000
    assert 60 <= one.request_bytes_per_point <= 100
    assert 500 <= one.billed_bytes_per_point - one.request_bytes_per_point <= 700  # the ECS resource and scope
    three = cost.otlp_estimate(cost.Deployment(models=1000, tasks=3), OPTS)
    assert three.points_per_cycle == 3 * one.points_per_cycle
    assert three.gb_per_month == pytest.approx(3 * one.gb_per_month)
    assert one.points_per_month == one.points_per_cycle * 730 * 60
    assert one.usd is None and one.price_per_gb is None  # no price is published
    priced = cost.otlp_estimate(cost.Deployment(models=1000), OPTS, 0.25)
    assert priced.usd == pytest.approx(priced.gb_per_month * 0.25)


def test_a_deselected_family_sends_no_points() -> None:
    full = cost.otlp_estimate(cost.Deployment(models=10), OPTS)
    fewer = cost.otlp_estimate(cost.Deployment(models=10), Options(catalog=CATALOG.select("-RequestLatencyP*")))
    assert fewer.points_per_cycle == full.points_per_cycle - 10 * 5  # 3 quantiles, _sum and _count a model


def test_the_command_prints_it_next_to_emf(capsys) -> None:
    assert cost.main(["--models", "4", "--otlp"]) == 0
    out = capsys.readouterr().out
    assert "EMF log ingestion:" in out and "OTLP metrics:" in out and "no price (--otlp-price-per-gb)" in out
    assert cost.main(["--models", "4", "--otlp-price-per-gb", "0.5"]) == 0
    assert "$" in capsys.readouterr().out.split("OTLP metrics:")[1].splitlines()[0]
