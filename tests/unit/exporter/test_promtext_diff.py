"""Differential test: our /metrics reader against prometheus_client, the reference.

Hypothesis writes valid exposition text (escapes in label values, NaN/±Inf,
timestamps, HELP/TYPE lines in either order, untyped families, blank lines,
unicode) mixing the families the catalog wants with others, including
histograms with ``:`` in their names as vLLM and ``pb_utils`` models publish
them (``_count``/``_sum`` before or after the ``_bucket`` lines, as Triton
prints them, ``le`` bounds as written); both parsers read it and must agree
on every sample the catalog keeps. The catalog here is the built-in one plus
the shipped user example (``app:*`` families). The /metrics bodies captured
from the real Triton for the golden tests are held to the reference too.
PROMTEXT_EXAMPLES raises the example count (the fuzz job uses 20000).
"""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from catalog import build
from exporter.sources.promtext import Parser
from tests.support.paths import FIXTURES, REPO

EXAMPLES = int(os.environ.get("PROMTEXT_EXAMPLES", "300"))
ROOT = REPO
CATALOG = build([ROOT / "catalog" / "example.toml"])
WANTED = CATALOG.wanted_samples()
SELECTS = CATALOG.sample_selects()  # what the sidecar skips without an OTLP output (three of five quantiles)
GOLDEN = FIXTURES / "golden"
CAPTURED = (
    "real_triton",
    "response_cache",
    "tensorrt_llm",
    "vllm",
)  # golden cases whose bodies came from the real Triton

# Families we want (with their real types) and decoys that share prefixes with them.
FAMILIES = [
    ("nv_inference_count", "counter"),
    ("nv_inference_request_failure", "counter"),
    ("nv_inference_request_success", "counter"),
    ("nv_gpu_utilization", "gauge"),
    ("nv_inference_pending_request_count", "gauge"),
    ("nv_inference_request_summary_us", "summary"),
    ("nv_inference_first_response_histogram_ms", "histogram"),
    ("nv_inference_count_extra", "counter"),
    ("nv_inference", "gauge"),
    ("nv_inference_queue_summary_us", "summary"),
    ("nv_cache_num_hits_per_model", "counter"),
    ("nv_cpu_memory_total_bytes", "gauge"),
    ("nv_pinned_memory_pool_used_bytes", "gauge"),
    ("nv_cache_num_hits", "gauge"),
    ("other_metric", "gauge"),
    ("nv_gpu_utilization_total", "untyped"),
    # LLM families with ":" (vLLM backend, pb_utils models), and decoys sharing their prefixes
    ("vllm:time_to_first_token_seconds", "histogram"),
    ("vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm:prompt_tokens_total", "counter"),
    ("nv_llm_output_token_len", "histogram"),
    ("nv_trt_llm_general_metrics", "gauge"),
    ("nv_trt_llm_disaggregated_serving_metrics", "counter"),
    ("app:tool_call_seconds", "histogram"),
    ("app:prompt_cache_hits_total", "counter"),
    ("vllm:time_to_first_token", "gauge"),
    ("vllm:time_to_first_token_seconds_p", "histogram"),
    ("app:other_seconds", "histogram"),
]
# Bucket bounds as Triton prints them (vLLM's TTFT and e2e, TensorRT-LLM's lengths) and as others may.
LE_SETS = [
    ("100", "500", "+Inf"),
    ("0.001", "0.04", "0.25", "2.5", "10", "+Inf"),
    ("1", "2.5", "60", "+Inf"),
    ("10", "50", "100", "500", "1000", "+Inf"),
    ("1e-3", "1.0", "+Inf"),
]

label_names = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,6}", fullmatch=True).filter(lambda s: s not in ("quantile", "le"))
label_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


number = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
    st.sampled_from(["NaN", "Nan", "nan", "+Inf", "-Inf", "Inf", "1e3", "1.5E-3", "-0", ".5", "+7"]),
)
timestamp = st.one_of(st.just(""), st.integers(0, 2**40).map(lambda t: f" {t}"))


@st.composite
def label_block(draw, extra: dict[str, str] | None = None) -> str:
    names = draw(st.lists(label_names, max_size=3, unique=True))
    pairs = [(n, draw(label_values)) for n in names] + list((extra or {}).items())
    pairs = draw(st.permutations(pairs))
    if not pairs and draw(st.booleans()):
        return ""
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in pairs) + "}"


@st.composite
def family_text(draw, name: str, kind: str) -> str:
    lines = []
    header = []
    if draw(st.booleans()):
        header.append(f"# HELP {name} {esc(draw(label_values))}")
    if kind != "untyped" or draw(st.booleans()):
        header.append(f"# TYPE {name} {kind}")
    if draw(st.booleans()):
        header.reverse()
    lines += header
    seen: set[str] = set()
    for _ in range(draw(st.integers(0, 4))):
        if kind == "summary":
            base = draw(label_block())
            inner = base[1:-1]
            if inner in seen:
                continue
            seen.add(inner)
            sep = "," if inner else ""
            for q in ("0.5", "0.95"):
                lines.append(f'{name}{{{inner}{sep}quantile="{q}"}} {draw(number)}{draw(timestamp)}')
            lines.append(f"{name}_count{base} {draw(number)}")
            lines.append(f"{name}_sum{base} {draw(number)}")
        elif kind == "histogram":
            base = draw(label_block())
            inner = base[1:-1]
            if inner in seen:
                continue
            seen.add(inner)
            sep = "," if inner else ""
            les = draw(st.sampled_from(LE_SETS))
            counts = sorted(draw(st.lists(st.integers(0, 1000), min_size=len(les), max_size=len(les))))
            buckets = [f'{name}_bucket{{{inner}{sep}le="{le}"}} {c}' for le, c in zip(les, counts, strict=True)]
            totals = [f"{name}_count{base} {counts[-1]}", f"{name}_sum{base} {draw(number)}"]
            lines += totals + buckets if draw(st.booleans()) else buckets + totals  # Triton: count, sum, buckets
        else:
            block = draw(label_block())
            if block in seen:
                continue
            seen.add(block)
            lines.append(f"{name}{block} {draw(number)}{draw(timestamp)}")
        if draw(st.integers(0, 5)) == 0:
            lines.append("")
    return "\n".join(lines)


@st.composite
def exposition(draw) -> str:
    chosen = draw(st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=6, unique_by=lambda f: f[0]))
    return "\n".join(draw(family_text(name, kind)) for name, kind in chosen) + "\n"


def reference(text: str, selects: bool = False) -> dict[tuple[str, frozenset], float]:
    """prometheus_client's samples the catalog keeps; ``selects``: only the label values a metric reads."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if family.type == "counter" and name == family.name + "_total" and name not in WANTED:
                # prometheus_client renames counter samples to *_total (OpenMetrics style); a counter
                # whose name already ends in _total (vllm:prompt_tokens_total) keeps it
                name = family.name
            if name in WANTED:
                if selects and name in SELECTS and s.labels.get(SELECTS[name][0]) not in SELECTS[name][1]:
                    continue
                out[(name, frozenset(s.labels.items()))] = s.value
    return out


def ours(text: str, parser: Parser) -> dict[tuple[str, frozenset], float]:
    exp = parser.parse(text)
    assert exp.malformed == 0, exp.examples
    return {
        (name, frozenset(exp.labels[key].labels.items())): value
        for name, series in exp.samples.items()
        for key, value in series.items()
    }


def _same_nan(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(same(dict(a[n]), dict(b[n])) for n in a)


def same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


# Shared across examples on purpose (the label cache must not leak between bodies); the C scanner
# and the pure-Python paths are both held to the reference.
PARSERS = {
    "native": Parser(WANTED),
    "python": Parser(WANTED, native=False),
    "native-selects": Parser(WANTED, selects=SELECTS),
    "python-selects": Parser(WANTED, native=False, selects=SELECTS),
}


def test_the_c_scanner_is_built_here():
    """CI and the image build it (setup.py); without it the suite would only test the Python paths."""
    assert PARSERS["native"].native


@pytest.mark.parametrize("path", sorted(PARSERS))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=exposition())
def test_agrees_with_prometheus_client(path, text):
    expected = reference(text, path.endswith("selects"))
    got = ours(text, PARSERS[path])
    assert same(got, expected), (text, got, expected)


@pytest.mark.parametrize("path", sorted(PARSERS))
@pytest.mark.parametrize("body", [f"{case}/metrics-{i}.txt" for case in CAPTURED for i in (1, 2)])
def test_agrees_with_prometheus_client_on_real_bodies(path, body):
    """Bodies the real Triton 2.51 served: core families, and the LLM sample models' vllm:* / nv_llm_* ones."""
    text = (GOLDEN / body).read_text()
    expected = reference(text, path.endswith("selects"))
    assert same(ours(text, PARSERS[path]), expected)
    names = {name for name, _ in expected}
    assert "nv_inference_request_success" in names  # not vacuous: the catalog's samples are in there
    case = body.split("/")[0]
    if case == "vllm":
        buckets = [k for k in expected if k[0] == "vllm:time_to_first_token_seconds_bucket"]
        assert len(buckets) == 17 and {"vllm:prompt_tokens_total", "app:tool_call_seconds_sum"} <= names
    if case == "tensorrt_llm":
        assert {"nv_llm_output_token_len_bucket", "nv_llm_input_token_len_sum", "nv_trt_llm_request_metrics"} <= names
    quantiles = {dict(k[1])["quantile"] for k in expected if k[0] == "nv_inference_request_summary_us"}
    if case != "response_cache":  # the cache on: Triton creates no request summary
        assert quantiles == (
            {"0.5", "0.95", "0.99"} if path.endswith("selects") else {"0.5", "0.9", "0.95", "0.99", "0.999"}
        )


def test_selects_are_what_the_metrics_read():
    """Every reader of a summary takes one quantile: the other quantiles are skipped, and their label blocks
    never interned. A metric that reads the family whole (a user file) keeps every series."""
    assert SELECTS["nv_inference_request_summary_us"] == ("quantile", frozenset({"0.5", "0.95", "0.99"}))
    assert "nv_inference_request_success" not in SELECTS
    text = (GOLDEN / "real_triton/metrics-2.txt").read_text()
    parser = Parser(WANTED, selects=SELECTS)
    parser.parse(text)
    interned = {ls.labels.get("quantile") for ls in parser._interned.values()}
    assert "0.5" in interned and "0.9" not in interned and "0.999" not in interned


def test_a_metric_reading_the_whole_family_keeps_every_series(tmp_path):
    user = tmp_path / "all.toml"
    user.write_text(
        '[[metric]]\nname = "TrtRequestsAnyType"\nscope = "model"\nunit = "Count"\nkind = "gauge"\n'
        'inputs = ["nv_trt_llm_request_metrics"]\nhelp = "Every request_type."\n'
    )
    assert "nv_trt_llm_request_metrics" in SELECTS
    selects = build([user]).sample_selects()
    assert "nv_trt_llm_request_metrics" not in selects and "nv_inference_request_summary_us" in selects


def test_selected_blocks_that_break_the_grammar_are_counted_on_both_paths():
    text = (
        "# TYPE nv_inference_request_summary_us summary\n"
        'nv_inference_request_summary_us{model="m",version="1",quantile="0.5"} 3\n'
        'nv_inference_request_summary_us{model="m",version="1",quantile="0.9"} 4\n'
        'nv_inference_request_summary_us{model="m",version="1",quantile=0.99} 5\n'
    )
    for native in (True, False):
        exp = Parser(WANTED, native=native, selects=SELECTS).parse(text)
        assert exp.malformed == 1 and list(exp.samples["nv_inference_request_summary_us"].values()) == [3.0]


@pytest.mark.parametrize(
    "text",
    [
        "nv_inference_count_extra 0\n",  # only a longer name with the wanted one as its prefix
        "x# TYPE nv_inference_count_extra counter\nnv_inference_count_extra{} 0\n\n",  # found by hypothesis
        "# TYPE nv_inference_count counter\n# TYPE vllm:time_to_first_token_seconds histogram\n",  # empty families
    ],
)
def test_a_name_without_samples_has_no_entry_on_either_path(text):
    """Regression: the Python path kept an empty series for nv_inference_count where the C path had none."""
    assert PARSERS["native"].parse(text).samples == PARSERS["python"].parse(text).samples == {}


@settings(max_examples=max(EXAMPLES // 3, 50), deadline=None)
@given(exposition(), st.integers(0, 200), st.sampled_from(["x", "{", "}", '"', "\\", " ", "\n", "nv_inference_count{"]))
def test_garbage_never_crashes_and_never_invents_samples(text, cut, junk):
    """Corrupt valid text at one point: no crash, and only the touched lines may change.

    Every sample away from the corruption is kept as it was, and at most two
    lines' worth of samples are lost or new (a newline can split one line in
    two). Exact agreement with prometheus_client is the job of the test
    above: a corruption can also break the format's grouping rule (a
    family's lines together after its TYPE), which prometheus_client
    tolerates and this reader, by design, does not.
    """
    corrupted = text[:cut] + junk + text[cut:]
    native, python = Parser(WANTED).parse(corrupted), Parser(WANTED, native=False).parse(corrupted)
    assert native.samples == python.samples or _same_nan(native.samples, python.samples)
    assert (native.malformed, native.duplicates) == (python.malformed, python.duplicates)
    exp = native
    got = {
        (name, frozenset(exp.labels[key].labels.items())): value
        for name, series in exp.samples.items()
        for key, value in series.items()
    }
    original = reference(text)
    assert len(set(got) - set(original)) <= 2
    assert len(set(original) - set(got)) <= 2 + exp.duplicates
    unchanged = [k for k in set(got) & set(original) if not same({k: got[k]}, {k: original[k]})]
    assert len(unchanged) <= 1  # only a value on the corrupted line may read differently
