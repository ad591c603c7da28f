"""``python -m render cost --otlp``: OTLP points and GB a month, bytes per point from the real encoder, and with
``--otlp-semconv genai`` the GenAI server metrics, compared with what the real OTLP output sends."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

from catalog import Catalog, genai
from demo.payloads import first_response_metrics, llm_metrics, model_names, triton_metrics
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.series import model_key
from exporter.sources import Collected, ModelConfig, VersionState
from exporter.sources.promtext import Parser
from render import cost
from render.base.options import Options
from tests.support.helpers import CATALOG, FixedSource
from tests.support.otlp_recording import Recording
from tests.support.paths import REPO

OPTS = Options(catalog=CATALOG)


def test_points_and_bytes_come_from_the_encoder_and_scale_with_tasks() -> None:
    one = cost.otlp_estimate(cost.Deployment(models=1000, max_models=1000), OPTS)
    # bench/bench_pipeline.py measured 24,028 points and 76 B a point for 1000 core models (one GPU, no NVML
    # fields beyond Triton's; the request and queue summaries 10,000 of them); the model here adds the NVML
    # source's GPU series and the exporter's own gauges. (--max-models 1000: the default 500 emits half.)
    assert 24_000 <= one.points_per_cycle <= 26_000
    assert 60 <= one.request_bytes_per_point <= 100
    assert 500 <= one.billed_bytes_per_point - one.request_bytes_per_point <= 700  # the ECS resource and scope
    three = cost.otlp_estimate(cost.Deployment(models=1000, max_models=1000, tasks=3), OPTS)
    assert three.points_per_cycle == 3 * one.points_per_cycle
    assert three.gb_per_month == pytest.approx(3 * one.gb_per_month)
    assert one.points_per_month == one.points_per_cycle * 730 * 60
    assert one.usd is None and one.price_per_gb is None  # no price is published
    priced = cost.otlp_estimate(cost.Deployment(models=1000, max_models=1000), OPTS, 0.25)
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


# --- the estimate against the real OTLP output ---------------------------------------------------------------

GENAI = {g.name for g in genai.METRICS}
BACKENDS = {"vllm": "vllm", "tensorrt_llm": "tensorrtllm"}  # the estimate's backend -> Triton's name for it
BUCKET = re.compile(r'(?P<family>\S+)_bucket\{(?P<labels>.*),le="[^"]+"\} (?P<value>\S+)$')


def rebucketed(text: str) -> str:
    """``text`` with every histogram on :data:`cost.HISTOGRAM_BOUNDS` bounds, as the estimate assumes (its
    total, ``_sum`` and ``_count`` kept): the bytes of a point depend on its bucket count."""
    out: list[str] = []
    totals: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = BUCKET.match(line)
        if m is None:
            out.append(line)
        else:  # the +Inf bucket comes last: it leaves the total
            totals[(m["family"], m["labels"])] = float(m["value"])
    n = cost.HISTOGRAM_BOUNDS
    for (family, labels), total in totals.items():
        for i in range(n):
            out.append(f'{family}_bucket{{{labels},le="{2**i}"}} {total * (i + 1) // (n + 1):g}')
        out.append(f'{family}_bucket{{{labels},le="+Inf"}} {total:g}')
    return "".join(ln + "\n" for ln in out if ln[:1] != "#")


def real_cycle(
    models: int, versions: int, llm: int, backend: str, histograms: bool, semconv: bool, catalog: Catalog = CATALOG
) -> list[tuple[bytes, int]]:
    """The second cycle of the real pipeline through the real OTLP output (encoded, not posted): the first ``llm``
    models stream (decoupled) on ``backend`` with its families, the others are ONNX classifiers; with
    ``histograms`` every model has Triton's first-response histogram (histogram_latencies=true)."""
    step = [1]
    names = model_names(models)
    parser = Parser(catalog.wanted_samples())  # every series of the families read, as with an OTLP output

    def body() -> str:
        text = ""
        for v in range(1, versions + 1):
            text += triton_metrics(names, step[0], version=str(v))
            if llm:
                text += llm_metrics(names[:llm], step[0], backend, version=str(v))
            if histograms:
                text += first_response_metrics(names, step[0], version=str(v))
        return rebucketed(text)

    index = [VersionState(m, str(v), "READY") for m in names for v in range(1, versions + 1)]
    configs = {
        model_key(v.model, v.version): ModelConfig(decoupled=True, backend=BACKENDS[backend])
        if v.model in names[:llm]
        else ModelConfig(decoupled=False, backend="onnxruntime", platform="onnxruntime_onnx")
        for v in index
    }
    sources = [
        FixedSource("triton_metrics", lambda: Collected(samples=parser.parse(body()))),
        FixedSource("triton_index", lambda: Collected(index=index, configs=configs)),
    ]
    out = Recording(catalog, genai=semconv)
    clock = [0.0]
    pipe = Pipeline(Settings(nvml="off"), catalog, sources, clock=lambda: clock[0], outputs=[out])
    pipe.cycle()
    out.items.clear()
    step[0] += 1
    clock[0] += 60.0
    pipe.cycle()
    pipe.close()
    return out.items


def by_metric(items: list[tuple[bytes, int]]) -> dict[str, tuple[int, int]]:
    """Metric name -> (points, serialized bytes)."""
    out: dict[str, tuple[int, int]] = {}
    for data, n in items:
        name = Metric.FromString(data).name
        points, size = out.get(name, (0, 0))
        out[name] = (points + n, size + len(data))
    return out


CASES = [  # models, versions, LLM models, their backend, histogram_latencies, the --metrics selection
    (5, 1, 2, "vllm", False, ""),
    (4, 2, 2, "vllm", True, ""),
    (6, 1, 3, "tensorrt_llm", True, ""),
    (6, 1, 3, "tensorrt_llm", False, ""),
    (5, 1, 2, "vllm", True, "-InterTokenLatency,-InterTokenLatencyP*"),
    (4, 1, 0, "vllm", True, ""),
]


@pytest.mark.parametrize(("models", "versions", "llm", "backend", "histograms", "selection"), CASES)
def test_genai_points_and_bytes_are_what_the_otlp_output_sends(
    models: int, versions: int, llm: int, backend: str, histograms: bool, selection: str
) -> None:
    """Per GenAI metric, the estimate has the points the real output sends for the same deployment, and the
    same bytes (same bucket count, attributes and model-name length); every histogram family alike."""
    catalog = CATALOG.select(selection) if selection else CATALOG
    real = by_metric(real_cycle(models, versions, llm, backend, histograms, True, catalog))
    d = cost.Deployment(
        models=models,
        versions=versions,
        gpus=0,
        nvml=False,
        llm_models=llm,
        llm_backend=backend,
        histograms=histograms,
        model_name_length=len("model_00000"),
        otlp=True,
        otlp_semconv="genai",
    )
    est = by_metric(cost.otlp_cycle(d, Options(catalog=catalog)))
    genai_real = {k: v for k, v in real.items() if k in GENAI}
    assert {k: v for k, v in est.items() if k in GENAI} == genai_real
    if llm and not selection:  # vLLM: all three; TensorRT-LLM: time to first token from Triton's histogram
        assert len(genai_real) == (3 if backend == "vllm" else int(histograms))
    if selection:
        assert "gen_ai.server.time_per_output_token" not in genai_real and genai_real
    if not llm:
        assert not genai_real  # a classifier gets none
    # the source histograms: the same points (a family the deployment lacks sends nothing), and where the
    # labels are the model's own, the same bytes
    hist = {k for k, f in catalog.families.items() if f.type == "histogram"}
    histograms_real = {k: v for k, v in real.items() if k in hist}
    histograms_est = {k: v for k, v in est.items() if k in hist}
    assert {k: p for k, (p, _) in histograms_est.items()} == {k: p for k, (p, _) in histograms_real.items()}
    for k, v in histograms_real.items():
        if set(catalog.families[k].labels) <= {"model", "version"}:
            assert histograms_est[k] == v, k
    # off: none, from either
    off = by_metric(real_cycle(models, versions, llm, backend, histograms, False, catalog))
    assert not GENAI & set(off)
    assert not GENAI & set(by_metric(cost.otlp_cycle(replace(d, otlp_semconv="off"), Options(catalog=catalog))))


def test_the_estimate_prices_the_genai_points() -> None:
    base = cost.Deployment(models=10, llm_models=4, otlp=True)
    off = cost.otlp_estimate(base, OPTS)
    on = cost.otlp_estimate(replace(base, otlp_semconv="genai", tasks=1), OPTS)
    assert on.genai_points_per_cycle == 4 * 3  # vLLM: all three per LLM model version
    assert on.points_per_cycle == off.points_per_cycle + on.genai_points_per_cycle
    assert off.genai_points_per_cycle == 0 and off.genai_gb_per_month == 0
    # the GenAI bytes are what the total grew by (their share of the billed bytes)
    assert on.gb_per_month - off.gb_per_month == pytest.approx(on.genai_gb_per_month, rel=1e-9)
    three = cost.otlp_estimate(replace(base, otlp_semconv="genai", tasks=3), OPTS)
    assert three.genai_points_per_cycle == 3 * on.genai_points_per_cycle
    assert three.genai_gb_per_month == pytest.approx(3 * on.genai_gb_per_month)


def test_the_command_takes_the_sidecars_setting(capsys) -> None:
    assert cost.main(["--models", "4", "--llm-models", "2", "--otlp-semconv", "genai"]) == 0  # implies --otlp
    out = capsys.readouterr().out
    assert "OTLP metrics:" in out and "of them GenAI:                6 points a cycle" in out
    assert cost.main(["--models", "4", "--llm-models", "2", "--otlp"]) == 0
    assert "GenAI" not in capsys.readouterr().out  # off by default, as in the sidecar
    assert cost.main(["--models", "4", "--otlp-semconv", "semconv"]) == 2
    assert "--otlp-semconv: invalid choice: 'semconv' (choose from off, genai)" in capsys.readouterr().err


def test_docs_quote_the_current_figures() -> None:
    """docs/otlp.md's OTLP figures are what the estimate says today."""
    text = " ".join((REPO / "docs" / "otlp.md").read_text().split())
    core = cost.otlp_estimate(cost.Deployment(models=1000, max_models=1000), OPTS)
    assert (
        f"{core.points_per_cycle:,} points a cycle, {core.points_per_month / 1e6:,.0f} M points and "
        f"{core.gb_per_month:,.0f} GB a month at {core.billed_bytes_per_point:.0f} B billed a point "
        f"({core.request_bytes_per_point:.0f} B in the requests)"
    ) in text
    llm = cost.otlp_estimate(cost.Deployment(models=200, llm_models=20, otlp_semconv="genai"), OPTS)
    assert (
        f"200 models of which 20 vLLM: {llm.genai_points_per_cycle} GenAI points a cycle, "
        f"{llm.genai_gb_per_month:.2f} of {llm.gb_per_month:,.2f} GB a month"
    ) in text
