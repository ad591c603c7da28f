"""Crash-fuzzing: the /metrics parser, the index parser and the whole pipeline on arbitrary input.

Differential fuzzing against prometheus_client on valid input lives in
tests/unit/exporter/test_promtext_diff.py (PROMTEXT_EXAMPLES). Here the input is anything:
random text, random bytes, and mutations (insertions, deletions, byte flips,
truncation, duplicated and swapped lines) of a real Triton-shaped body. The
properties: nothing raises but SourceError, every EMF document is valid, no
value is NaN or infinite, and state stays within what was scraped.
FUZZ_EXAMPLES sets the example count per test (default 200; docs/reliability.md
records a run with 20,000).
"""

from __future__ import annotations

import math
import os
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demo.payloads import triton_metrics
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.sources import SourceError
from exporter.sources.promtext import Parser
from exporter.sources.triton import TritonMetricsSource, parse_index
from tests.support.helpers import CATALOG, IndexSource, documents, task_doc
from triton_http import Response

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
SEED = triton_metrics(["add", 'q"uo\\te', "modèle"], 3, gpus=["GPU-0000"])
SEED_LINES = SEED.splitlines(keepends=True)
PARSER = Parser(CATALOG.wanted_samples())

TOKENS = [
    "{",
    "}",
    '"',
    "\\",
    "\n",
    "\r\n",
    " ",
    "\t",
    ",",
    "=",
    "#",
    "# TYPE ",
    "# HELP ",
    "NaN",
    "+Inf",
    "-Inf",
    "1e309",
    "nv_inference_request_success",
    "_count",
    "_sum",
    "quantile=",
    'model="',
    "\x00",
    "\ufffd",
    "é",
    "🚀",
    "le=",
    "0x1",
    "--1",
    "1 2 3",
    "summary",
    "counter",
    "histogram",
]


@st.composite
def mutated(draw) -> str:
    """A Triton-shaped body with a few random edits."""
    lines = list(SEED_LINES)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "duplicate", "swap", "truncate", "line"]))
        text = "".join(lines)
        if op == "line":
            lines.insert(
                draw(st.integers(0, len(lines))),
                draw(st.sampled_from([*SEED_LINES, ""])).replace(
                    draw(st.sampled_from(TOKENS)), draw(st.sampled_from(TOKENS)), 1
                ),
            )
            continue
        if op in ("duplicate", "swap") and len(lines) > 1:
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            if op == "duplicate":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            continue
        pos = draw(st.integers(0, len(text)))
        if op == "insert":
            text = text[:pos] + draw(st.one_of(st.sampled_from(TOKENS), st.text(max_size=5))) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 40)) :]
        elif op == "replace":
            text = text[:pos] + draw(st.sampled_from(TOKENS)) + text[pos + 1 :]
        else:
            text = text[:pos]
        lines = text.splitlines(keepends=True)
    return "".join(lines)


texts = st.one_of(st.text(), mutated(), st.lists(st.sampled_from(SEED_LINES + TOKENS)).map("".join))
bodies = st.one_of(
    st.binary(),
    texts.map(lambda t: t.encode("utf-8", "surrogatepass")),
    mutated().map(lambda t: t.encode("latin-1", "replace")),
)


def _check_exposition(exp) -> None:
    assert exp.malformed >= 0 and exp.duplicates >= 0
    assert len(exp.examples) <= 5 and all(len(e) <= 200 for e in exp.examples)
    for name, series in exp.samples.items():
        assert name in PARSER.names
        for key, value in series.items():
            assert key in exp.labels
            assert isinstance(value, float)


@FUZZ
@given(texts)
def test_parser_never_raises_on_any_text(text):
    _check_exposition(PARSER.parse(text))


@FUZZ
@given(mutated())
def test_parser_keeps_every_untouched_model_line(text):
    """A line of the seed that survived the edits intact, inside its own family block, is read."""
    exp = PARSER.parse(text)
    _check_exposition(exp)
    if text == SEED:
        assert exp.malformed == 0
        assert len(exp.samples["nv_inference_request_success"]) == 3


class BodySource(TritonMetricsSource):
    """The real /metrics source, with the HTTP answer replaced by the fuzzed bytes."""

    def __init__(self, bodies: list[bytes]) -> None:
        super().__init__("http://127.0.0.1:1/metrics", Parser(CATALOG.wanted_samples()), 0.1, 1 << 20)
        self.bodies = bodies

    def collect(self, timeout: float):
        body = self.bodies.pop(0)
        with mock.patch("exporter.sources.triton.fetch", return_value=Response(200, "text/plain", body)):
            return super().collect(timeout)


@FUZZ
@given(bodies, bodies, st.booleans())
def test_pipeline_never_raises_and_emits_only_valid_emf(first, second, seed_first):
    if seed_first:
        first = SEED.encode()
    pipe = Pipeline(Settings(nvml="off", max_models=50), CATALOG, [BodySource([first, second]), IndexSource()])
    for _ in range(2):
        result = pipe.cycle()
        errors = [s.error for s in result.statuses if s.error]
        assert not any(e.startswith("internal error") for e in errors), errors  # only SourceError may fail it
        docs = documents(result)  # every line is valid EMF (finite numbers, limits)
        task = task_doc(docs)
        metrics_up = result.statuses[0].up
        assert task["TritonUp"] == (1 if metrics_up else 0) and task["ParseErrors"] >= 0
        for doc in docs:
            for value in doc.values():
                if isinstance(value, float):
                    assert math.isfinite(value)
        assert pipe.state.size() <= result.series_kept


@FUZZ
@given(
    st.one_of(
        st.binary(),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
            lambda children: (
                st.lists(children)
                | st.dictionaries(st.sampled_from(["name", "version", "state", "reason", "x"]), children)
            ),
            max_leaves=20,
        ).map(lambda v: __import__("orjson").dumps(v)),
    )
)
def test_index_parser_raises_only_source_error(body):
    try:
        rows = parse_index(body)
    except SourceError as exc:
        assert "\n" not in str(exc)
        return
    for row in rows:
        assert isinstance(row.model, str) and isinstance(row.version, str) and isinstance(row.state, str)
