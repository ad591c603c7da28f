"""What the sidecar holds and loads: the label cache's sharing, the /metrics body's lifetime, start-up imports.

Figures (CPU seconds, MB) live in bench/bench_once.py and bench/bench_pipeline.py; these tests hold the
properties behind them, none timed.
"""

from __future__ import annotations

import gc
import io
import subprocess
import sys
import threading
import tracemalloc
import weakref
from importlib.metadata import version

import pytest

from exporter.coverage import _split
from exporter.runner import Runner, run_once
from exporter.series import Exposition, LabelSet
from exporter.sources.promtext import HAVE_SCANNER, LabelError, Parser, parse_labels
from exporter.sources.triton import TritonMetricsSource
from telemetry import DISTRIBUTION, distribution_version
from tests.support.fakes import FakeHttp, head
from tests.support.paths import REPO
from triton_http import Response

if HAVE_SCANNER:
    from exporter.sources import _scan

ROOT = REPO


def _body(models: int, buckets: int) -> str:
    lines = ["# TYPE nv_inference_count counter"]
    lines += [f'nv_inference_count{{model="m{i:04d}",version="1"}} {i}' for i in range(models)]
    lines.append("# TYPE nv_inference_first_response_histogram_ms histogram")
    for i in range(models):
        for b in range(buckets):
            lines.append(f'nv_inference_first_response_histogram_ms_bucket{{model="m{i:04d}",version="1",le="{b}"}} 1')
        lines.append(f'nv_inference_first_response_histogram_ms_bucket{{model="m{i:04d}",version="1",le="+Inf"}} 1')
    lines.append("# TYPE nv_gpu_utilization gauge")
    lines.append('nv_gpu_utilization{gpu_uuid="GPU-0"} 0.5')
    return "\n".join(lines) + "\n"


WANTED = ["nv_inference_count", "nv_inference_first_response_histogram_ms_bucket", "nv_gpu_utilization"]


@pytest.mark.parametrize("native", [True, False])
def test_label_sets_of_one_model_share_its_strings_and_entity(native):
    exp = Parser(WANTED, native=native).parse(_body(3, 4))
    sets = [ls for ls in exp.labels.values() if ls.entity[0] == "model" and ls.entity[1] == "m0001"]
    assert len(sets) == 1 + 5  # the counter's block (the entity's own key), 5 buckets
    entity = exp.labels[sets[0].entity_key]
    for ls in sets:
        assert ls.entity is entity.entity and ls.entity_key is entity.key  # one tuple and key, not copies
        assert ls.labels["model"] is entity.labels["model"]  # one string per distinct label text
    les = {id(ls.labels["le"]) for ls in exp.labels.values() if ls.labels.get("le") == "2"}
    assert len(les) == 1  # le="2" of every model is one string
    gpu = next(ls for ls in exp.labels.values() if "gpu_uuid" in ls.labels)
    assert gpu.entity == ("gpu", "GPU-0") and gpu.entity_key == gpu.key


@pytest.mark.parametrize(
    "block",
    [
        "",
        'a="1"',
        'a="1",',
        'b="2",a="1"',
        'model="m",version="1",le="10"',
        'le="10",model="m"',
        'a="1",quantile="0.5",le="2"',
        'ab="1",a="2"',
        'a="x\\"y",b="\\\\"',
        ' a = "1" , b="2" ',
        'a="1",,',
        ",",
        'a="1"b="2"',
        'a="1",a="2"',
        'a="1",b="2",a="3"',
        '1a="x"',
        'a="line\nbreak"',
        'a="unterminated',
    ],
)
def test_the_plain_block_path_reads_as_the_full_grammar(block):
    """parse_labels' one-regex path for Triton's plain layout gives what the label-by-label grammar gives,
    errors included (a repeated name is refused on both)."""

    def outcome(strings):
        try:
            return parse_labels(block, strings)
        except LabelError as exc:
            return type(exc)

    import exporter.sources.promtext as promtext

    plain = outcome({})
    original, promtext._PLAIN_BLOCK = promtext._PLAIN_BLOCK, promtext.re.compile(r"(?!)")  # never matches
    try:
        grammar = outcome(None)
    finally:
        promtext._PLAIN_BLOCK = original
    assert plain == grammar
    if block == 'a="1",a="2"':
        assert plain is LabelError
    if promtext.HAVE_SCANNER:  # the C scanner's reading of the same layout: the same pairs, or None (not plain)
        found = promtext._scan.labels(block, {})
        native = None if found is None else found[0]
        assert native is None or native == grammar
        if found is not None:  # and whether the block is spelt as its key: then the parser takes it as the key
            assert found[1] == (LabelSet(found[0]).key == block)
        plain = ("", 'a="1"', 'a="1",', 'b="2",a="1"', 'model="m",version="1",le="10"', 'le="10",model="m"')
        plain += ('a="1",quantile="0.5",le="2"', 'ab="1",a="2"')
        assert (native is None) == (block not in plain)


@pytest.mark.parametrize("native", [True, False])
def test_a_block_as_triton_writes_it_is_its_own_key(native):
    """Keys are spelt as Triton writes a block (sorted, ``le`` last): the label cache holds one string for the
    raw block and the set's key, not two (45,000 blocks at 1000 LLM models, ~4 MB)."""
    parser = Parser(WANTED, native=native)
    exp = parser.parse(_body(3, 4))
    blocks = [b for b in parser._cache if b]
    assert len(blocks) == 3 * 6 + 1
    for block in blocks:
        if parser._cache[block] is not block:  # an entity's own set, made before its block came (families
            assert exp.labels[block].entity_key is parser._cache[block]  # are read in set order): 1 per entity
        assert exp.labels[parser._cache[block]].key is parser._cache[block]
    assert sum(parser._cache[b] is b for b in blocks) >= len(blocks) - 3
    # Another spelling of a set is read as the same series, under the same key.
    again = parser.parse('# TYPE nv_inference_count counter\nnv_inference_count{version="1",model="m0001"} 7\n')
    assert again.samples["nv_inference_count"] == {'model="m0001",version="1"': 7.0}


def test_keys_are_one_to_one_whatever_the_values():
    values = ['a"b', "a\\", 'a\\"', "a\nb", "a\\nb", 'x",y="z', ""]
    keys = {LabelSet((("model", v), ("version", "1"))).key for v in values}
    assert len(keys) == len(values)
    for v in values:  # and the coverage reads a model and version back from an entity key
        assert _split(LabelSet((("model", v), ("version", "1"))).entity_key) == (v, "1")


def test_entity_keys_match_the_content_derived_form():
    ls = LabelSet((("le", "5"), ("model", "m"), ("version", "2")))
    assert ls.entity_key == LabelSet((("model", "m"), ("version", "2"))).key
    gpu = LabelSet((("gpu_uuid", "GPU-1"), ("x", "y")))
    assert gpu.entity_key == LabelSet((("gpu_uuid", "GPU-1"),)).key


class _OneBody:
    """The client's side of one answer, made here so that the test itself holds no reference to the bytes."""

    connect_timeout = 1.0
    max_bytes = 1 << 30

    def __init__(self, text: str) -> None:
        self.text = text

    def request(
        self, method: str, url: str, timeout: float, json: object = None, max_bytes: int | None = None, text=None
    ):
        return Response(200, "text/plain; version=0.0.4", self.text.encode())


class _Measuring(Parser):
    def parse(self, text: str):
        self.held, self.peak = tracemalloc.get_traced_memory()
        return super().parse(text)


def test_the_body_bytes_are_gone_before_the_parse():
    """At 1000 LLM models the body is ~10 MB; bytes and text held together through the parse were the
    process's peak. The parse starts with the text alone."""
    text = _body(300, 30)  # ~2.7 MB
    size = len(text)
    parser = _Measuring(WANTED)
    source = TritonMetricsSource("http://triton/metrics", parser, 1.0, 1 << 30, http=_OneBody(text))  # type: ignore[arg-type]
    base, exp = _traced_collect(source)
    assert exp is not None and len(exp.samples["nv_inference_count"]) == 300
    assert parser.held - base < 1.5 * size  # the decoded text (1x), not the bytes too (2x)


def _traced_collect(source: TritonMetricsSource) -> tuple[int, Exposition | None]:
    """The traced memory before one collect (the parser's figures are measured against it), and its samples."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        return base, source.collect(5.0).samples
    finally:
        tracemalloc.stop()


needs_scanner = pytest.mark.skipif(not HAVE_SCANNER, reason="the C scanner is not built here")


@needs_scanner
def test_the_body_is_read_straight_into_its_text():
    """Bytes then their decoded text held the body twice for a moment, the --once process's peak at 1000 LLM
    models (bench/bench_once.py). Triton's body is ASCII and sized: it is read into a str, no bytes beside it."""
    text = _body(300, 30)  # ~0.8 MB
    size = len(text)
    answer = head(200, length=size) + text.encode()  # built before tracing: the server's copy is not the client's
    parser = _Measuring(WANTED)
    with FakeHttp(lambda server, conn, req: server.send(conn, answer)) as server:
        source = TritonMetricsSource(server.url + "/metrics", parser, 1.0, 1 << 30)
        base, exp = _traced_collect(source)
    assert exp is not None and len(exp.samples["nv_inference_count"]) == 300
    assert parser.peak - base < 1.5 * size  # the text once (bytes then text: 2x)


class _Reads:
    """``readinto`` over ``data``, ``step`` bytes a call at most, as a socket hands a body in pieces."""

    def __init__(self, data: bytes, step: int = 7) -> None:
        self.data, self.step, self.at = data, step, 0

    def readinto(self, view: memoryview) -> int:
        n = min(self.step, len(view), len(self.data) - self.at)
        view[:n] = self.data[self.at : self.at + n]
        self.at += n
        return n


@needs_scanner
@pytest.mark.parametrize(
    "data, size, expected",
    [
        (b"nv_x 1\n" * 100, 700, "nv_x 1\n" * 100),  # whole and ASCII: the str itself
        (b"", 0, ""),
        ('nv_x{model="é"} 1\n'.encode(), 21, 'nv_x{model="é"} 1\n'.encode()),  # not ASCII: bytes to decode
        (b"nv_x 1\n", 70, b"nv_x 1\n"),  # ended early: the bytes that came
    ],
    ids=["ascii", "empty", "utf-8", "short"],
)
def test_read_ascii_gives_a_str_only_for_a_whole_ascii_body(data, size, expected):
    got = _scan.read_ascii(_Reads(data).readinto, size)
    assert type(got) is type(expected) and got == expected
    if isinstance(got, str):
        assert {got: 1}[expected] == 1 and got.isascii()  # an ordinary str: hashes and compares as one


@needs_scanner
def test_read_ascii_never_hands_out_a_str_a_view_still_writes_into():
    kept: list[memoryview] = []

    def keeps(view: memoryview) -> int:
        kept.append(view[1:])  # a view derived from the one given, alive after the call
        return 1

    with pytest.raises(BufferError, match="kept a view"):
        _scan.read_ascii(keeps, 5)
    with pytest.raises(BufferError, match="closed"):
        memoryview(kept[0].obj)  # no new view of that memory either

    def fails(view: memoryview) -> int:
        raise TimeoutError("timed out")

    with pytest.raises(TimeoutError):  # readinto's own error, as the client maps it
        _scan.read_ascii(fails, 5)
    with pytest.raises(ValueError, match="impossible count"):
        _scan.read_ascii(lambda view: len(view) + 1, 5)


def test_the_version_is_the_installed_metadata():
    assert distribution_version(DISTRIBUTION) == version(DISTRIBUTION)
    assert distribution_version("orjson") == version("orjson")
    assert distribution_version("no-such-distribution-here") == "0+unknown"


def test_what_once_imports_before_its_first_scrape():
    """Everything ``--once`` loads before it scrapes (settings, catalog, sources, pipeline, the version in
    every event), and none of what it does not use: importlib.metadata's stack (zipfile, email.message's
    helpers, tempfile), the AWS SDK, requests, OpenTelemetry's SDK."""
    code = (
        "import sys\n"
        "from exporter.__main__ import build_catalog, build_sources\n"
        "from exporter.config import load\n"
        "from exporter.pipeline import Pipeline\n"
        "from exporter.runner import run_once\n"
        "settings = load(['--once', '--nvml', 'off', '--ecs-metadata-url', 'http://127.0.0.1:9/v4'])\n"
        "catalog = build_catalog(settings)\n"
        "Pipeline(settings, catalog, build_sources(settings, catalog))\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "exporter.pipeline" in loaded and "triton_http.client" in loaded  # the check sees what was loaded
    unused = ("importlib.metadata", "zipfile", "tempfile", "boto3", "botocore", "requests", "opentelemetry", "pynvml")
    assert sorted(m for m in loaded if m.split(".")[0] in unused or m in unused) == []


class _Result:
    def __init__(self) -> None:
        self.statuses: list[object] = []
        self.events: list[bytes] = []


class _Stop(Exception):
    pass


class _Pipeline:
    """Records, at its second cycle, whether the first cycle's result is still held by the caller."""

    periods = (0.01,)

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.first: weakref.ref[_Result] | None = None
        self.first_alive: bool | None = None
        self.stop = stop  # the loop's: set at the second cycle, which then ends it

    def cycle(self, events_dropped: int = 0, due: object = None) -> _Result:
        if self.first is None:
            result = _Result()
            self.first = weakref.ref(result)
            return result
        gc.collect()
        self.first_alive = self.first() is not None
        if self.stop is None:
            raise _Stop
        self.stop.set()
        return _Result()

    def close(self) -> None:
        pass


class _Sink:
    def send(self, events: object) -> None:
        pass

    def take_dropped(self) -> int:
        return 0

    def close(self, grace: float) -> None:
        pass


def test_once_holds_no_first_window_through_the_second_cycle():
    pipeline = _Pipeline()
    with pytest.raises(_Stop):
        run_once(pipeline, _Sink(), 0.0, io.StringIO(), sleep=lambda _: None)  # type: ignore[arg-type]
    assert pipeline.first_alive is False


def test_the_loop_holds_no_sent_window_through_the_next_cycle():
    stop = threading.Event()
    pipeline = _Pipeline(stop)
    Runner(pipeline, _Sink(), 0.01, stop).run()  # type: ignore[arg-type]
    assert pipeline.first_alive is False
