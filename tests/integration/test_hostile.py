"""Hostile input and security: what arrives may be broken, huge or malicious.

Every EMF document produced here goes through telemetry.emf_validate (via
helpers.documents). Sources that need misbehaviour a real Triton cannot show
(an HTML page, a 200 MB body, a redirect, a non-JSON index) are loopback
fakes from tests/support/fakes.py; the rest is the real pipeline on Triton-shaped text
(demo.payloads) or the real Triton server.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from demo.payloads import triton_metrics
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.sources.promtext import Parser
from exporter.sources.triton import TritonIndexSource, TritonMetricsSource
from telemetry.emf import MAX_DIMENSION_VALUE_LENGTH, MAX_EVENT_BYTES
from tests.support.fakes import FakeHttp, closed_port, huge, redirect, respond, silent
from tests.support.helpers import (
    CATALOG,
    Capture,
    IndexSource,
    TextSource,
    documents,
    metric_names,
    model_doc,
    task_doc,
)
from tests.support.paths import REPO

ROOT = REPO
SETTINGS = Settings(nvml="off", timeout=2.0, connect_timeout=0.5)
INDEX_AB = orjson.dumps([{"name": m, "version": "1", "state": "READY"} for m in ("a", "b")])


def run(*texts: str, index: bytes = INDEX_AB, **overrides) -> list[list[dict]]:
    """Each text is one scrape; returns every cycle's validated documents."""
    pipe = Pipeline(replace(SETTINGS, **overrides), CATALOG, [TextSource(*texts), IndexSource(index)])
    return [documents(pipe.cycle()) for _ in texts]


def http_pipeline(metrics_url: str, triton_url: str, **overrides) -> Pipeline:
    settings = replace(SETTINGS, metrics_url=metrics_url, triton_url=triton_url, **overrides)
    return Pipeline(
        settings,
        CATALOG,
        [
            TritonMetricsSource(
                metrics_url, Parser(CATALOG.wanted_samples()), settings.connect_timeout, settings.max_body_bytes
            ),
            TritonIndexSource(triton_url, settings.connect_timeout, settings.max_body_bytes),
        ],
    )


def status(result, name: str):
    return next(s for s in result.statuses if s.name == name)


def insert_after(text: str, anchor: str, lines: list[str]) -> str:
    assert anchor in text, anchor
    return text.replace(anchor + "\n", anchor + "\n" + "".join(line + "\n" for line in lines), 1)


# --- malformed input -----------------------------------------------------------------------


def test_malformed_and_truncated_lines_are_skipped_and_counted_the_rest_kept():
    good = triton_metrics(["a", "b"], 2, summaries=False)
    garbage = [
        'nv_inference_request_success{model="c",version="1" 5',  # unclosed label block
        'nv_inference_request_success{model="c",version="1"} five',  # not a number
        'nv_inference_request_success{model=c,version="1"} 3',  # unquoted value
        'nv_inference_request_success{model="c",version="1"} 1 2 3',  # trailing junk
        'nv_inference_request_success{model="c",,version="1"} 3',  # empty label
        'nv_inference_request_success{"model"="c"} 3',  # quoted name
    ]
    other = ["nv_inference_request_success\x00{} 3", "\x00\xff\ufffd", "{}} 3"]  # not a wanted name: ignored
    broken = insert_after(good, 'nv_inference_request_success{model="b",version="1"} 18', garbage + other)
    truncated = broken[: broken.rindex("nv_cpu_memory_used_bytes") + 20]  # cut mid-line, no newline
    docs = run(triton_metrics(["a", "b"], 1, summaries=False), truncated)[1]
    task = task_doc(docs)
    assert task["ParseErrors"] == len(garbage)
    for m in ("a", "b"):
        doc = model_doc(docs, m)
        assert doc["RequestSuccess"] == 9  # the good lines around the bad ones are kept
        assert doc["InferenceCount"] == 12
    assert not any(d.get("model") == "c" for d in docs)  # nothing guessed from a bad line
    assert "CpuUtilization" in task


def test_nan_and_infinities_never_reach_emf_and_mark_a_reset():
    first = triton_metrics(["a", "b"], 1)
    second = triton_metrics(["a", "b"], 2)
    second = second.replace(
        'nv_inference_request_success{model="a",version="1"} 18',
        'nv_inference_request_success{model="a",version="1"} NaN',
    )
    second = second.replace(
        'nv_inference_pending_request_count{model="b",version="1"} 0',
        'nv_inference_pending_request_count{model="b",version="1"} +Inf',
    )
    second = second.replace("nv_cpu_utilization 0.25", "nv_cpu_utilization -Inf")
    second = re.sub(
        r'(nv_inference_request_summary_us\{model="b",version="1",quantile="0.95"\}) \d+', r"\1 Nan", second
    )
    third = triton_metrics(["a", "b"], 3)
    cycles = run(first, second, third)  # documents() rejects any non-finite value
    docs = cycles[1]
    task = task_doc(docs)
    assert task["CounterResets"] == 1
    assert "RequestSuccess" not in model_doc(docs, "a")  # NaN counter: the whole version is reset
    b = model_doc(docs, "b")
    assert b["RequestSuccess"] == 9
    assert "PendingRequests" not in b
    assert "RequestLatencyP95" not in b
    assert "CpuUtilization" not in task
    # NaN -> 27: not a delta of 27 after a NaN; the NaN window had no baseline value to trust
    a3 = model_doc(cycles[2], "a")
    assert "RequestSuccess" not in a3 or a3["RequestSuccess"] == 9
    assert model_doc(cycles[2], "b")["RequestSuccess"] == 9


def test_duplicate_series_do_not_inflate_deltas():
    second = triton_metrics(["a", "b"], 2, summaries=False)
    dup = [
        'nv_inference_request_success{model="a",version="1"} 18',  # exact repeat
        'nv_inference_request_success{version="1",model="a"} 18',  # same series, labels reordered
    ]
    second = insert_after(second, 'nv_inference_request_success{model="b",version="1"} 18', dup)
    docs = run(triton_metrics(["a", "b"], 1, summaries=False), second)[1]
    assert model_doc(docs, "a")["RequestSuccess"] == 9
    assert model_doc(docs, "b")["RequestSuccess"] == 9
    assert sum(1 for d in docs if d.get("model") == "a") == 1


HOSTILE_NAMES = [
    'quo"te',
    "back\\slash",
    "new\nline",
    "modèle-ü-模型-🚀",
    "x" * 10_000,
    "",
    " ",
    "tab\there",
    '\\"}\n nv_inference_request_success{model="evil"} 1e9',  # an injection attempt
]


def test_hostile_label_values_become_safe_distinct_dimensions_with_the_original_kept():
    index = orjson.dumps([{"name": n, "version": "1", "state": "READY"} for n in HOSTILE_NAMES])
    docs = run(triton_metrics(HOSTILE_NAMES, 1), triton_metrics(HOSTILE_NAMES, 2), index=index)[1]
    model_docs = [d for d in docs if "model" in d]
    assert len(model_docs) == len(HOSTILE_NAMES)
    dims = {d["model"] for d in model_docs}
    assert len(dims) == len(HOSTILE_NAMES)  # no two names collapse into one dimension value
    for doc in model_docs:
        assert doc["RequestSuccess"] == 9  # the numbers survive the names
        value = doc["model"]
        assert value.isascii() and value.isprintable() and 0 < len(value) <= MAX_DIMENSION_VALUE_LENGTH
    originals = {d.get("model_original", d["model"]) for d in model_docs}
    for name in HOSTILE_NAMES:
        if len(name) <= 4096:
            assert name in originals, name[:40]
    long_doc = next(d for d in model_docs if d.get("model_original", "").startswith("xxxx"))
    assert len(long_doc["model_original"]) <= 4 * MAX_DIMENSION_VALUE_LENGTH  # clipped, not 10,000 chars
    assert all(len(orjson.dumps(d)) < MAX_EVENT_BYTES for d in docs)
    assert not any(d.get("model") == "evil" for d in docs)
    assert task_doc(docs)["ParseErrors"] == 0


# --- size and cardinality ------------------------------------------------------------------


RSS_PROBE = textwrap.dedent("""
    import sys, time
    from catalog import build
    from exporter.config import Settings
    from exporter.sources.promtext import Parser
    from exporter.sources import SourceError
    from exporter.sources.triton import TritonMetricsSource
    src = TritonMetricsSource(sys.argv[1], Parser(build().wanted_samples()), 1.0, Settings().max_body_bytes)
    t = time.monotonic()
    try:
        src.collect(30.0)
        print("ACCEPTED")
    except SourceError as exc:
        print("ERROR", exc)
    print("SECONDS", time.monotonic() - t)
    for line in open("/proc/self/status"):
        if line.startswith(("VmHWM", "VmRSS")):
            print(line.strip())
""")


@pytest.mark.slow
def test_200mb_metrics_body_is_refused_at_the_cap_without_holding_it():
    total = 200 * 1024 * 1024
    with FakeHttp(huge(total)) as server:
        proc = subprocess.run(
            [sys.executable, "-c", RSS_PROBE, server.url + "/metrics"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        sent = server.bytes_sent
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "ERROR" in out and "byte cap; refused" in out, out
    peak_kb = int(re.search(r"VmHWM:\s+(\d+) kB", out).group(1))
    cap = Settings().max_body_bytes
    assert peak_kb * 1024 < cap + 80 * 1024 * 1024, out  # the cap plus the interpreter, never the body
    assert peak_kb * 1024 < total / 2, out
    assert sent < total  # it stopped reading: the server could not push the rest


def test_body_over_a_small_cap_fails_the_source_and_the_cycle_goes_on():
    total = 50 * 1024 * 1024
    with (
        FakeHttp(huge(total)) as metrics,
        FakeHttp(respond(INDEX_AB, content_type="application/json")) as index,
    ):
        pipe = http_pipeline(metrics.url + "/metrics", index.url, max_body_bytes=1024 * 1024)
        result = pipe.cycle()
        st = status(result, "triton_metrics")
        assert not st.up and "1048576 byte cap" in st.error
        assert status(result, "triton_index").up
        docs = documents(result)
        assert task_doc(docs)["TritonUp"] == 0
        assert {d["source"]: d["SourceUp"] for d in docs if "SourceUp" in d}["triton_metrics"] == 0
    assert metrics.bytes_sent < total / 2  # it stopped reading at the cap: the server could not push the rest


@pytest.mark.slow
def test_ten_thousand_models_are_capped_with_a_warning_and_a_dropped_count():
    names = [f"m{i:05d}" for i in range(10_000)]
    with Capture.on("exporter.pipeline", logging.WARNING) as capture:
        pipe = Pipeline(
            SETTINGS,
            CATALOG,
            [
                TextSource(triton_metrics(names, 1, summaries=False), triton_metrics(names, 2, summaries=False)),
                IndexSource(),
            ],
        )
        pipe.cycle()
        result = pipe.cycle()
    docs = documents(result)
    models = [d for d in docs if "model" in d]
    assert len(models) == SETTINGS.max_models == 500
    assert {d["model"] for d in models} == set(names[:500])  # a stable choice, in name order
    assert all(d["RequestSuccess"] == 9 for d in models)
    task = task_doc(docs)
    series_per_model = 13  # 8 counters, 4 failure reasons, 1 pending gauge
    assert task["SeriesDropped"] == 9_500 * series_per_model
    assert task["SeriesKept"] == 500 * series_per_model + 5  # + the task gauges: CPU use and memory, pinned pool
    warnings = [r.getMessage() for r in capture.records if r.levelno >= logging.WARNING]
    assert any("9500 model versions over --max-models=500" in w for w in warnings), warnings
    assert pipe.state.size() <= 500 * series_per_model  # baselines only for what is emitted


# --- what the sources answer ---------------------------------------------------------------


@pytest.mark.triton
@pytest.mark.parametrize(
    "body", [b"<html><body>502 Bad Gateway</body></html>", b"not json at all", b'{"a": 1}', b"\xff\xfe\x00garbage", b""]
)
def test_repository_index_that_is_not_a_json_list_fails_only_that_source(triton, body):
    with FakeHttp(respond(body, content_type="text/html")) as fake:
        pipe = http_pipeline(triton.metrics_url, fake.url)
        pipe.cycle()
        triton.infer_add(2)
        result = pipe.cycle()
    st = status(result, "triton_index")
    assert not st.up
    assert "answered non-JSON" in st.error or "not a list" in st.error, st.error
    assert fake.url in st.error
    docs = documents(result)
    assert task_doc(docs)["TritonUp"] == 0
    assert model_doc(docs, "add")["RequestSuccess"] == 2  # /metrics from the real server still counts


def test_index_rows_that_are_not_models_are_skipped():
    body = orjson.dumps(
        [
            {"name": "a", "version": "1", "state": "READY"},
            7,
            None,
            {"version": "1"},
            {"name": 5},
            {"name": "b", "version": 2, "state": "LOADING"},
        ]
    )
    docs = run(triton_metrics(["a"], 1), index=body)[0]
    assert model_doc(docs, "a")["ModelReady"] == 1
    assert model_doc(docs, "b", "2")["ModelReady"] == 0
    assert task_doc(docs)["ModelsReady"] == 1


@pytest.mark.parametrize(
    "status_code, ctype, body",
    [
        (200, "text/html; charset=utf-8", b"<!DOCTYPE html><html><h1>Login</h1></html>"),
        (200, "text/plain", b"\n  <html><body>nv_inference_request_success 1</body></html>"),
        (503, "text/html", b"<html>Service Unavailable</html>"),
        (200, "text/plain", b"# just a comment\nsome_other_metric 1\n"),
    ],
)
def test_html_or_foreign_page_instead_of_metrics_fails_the_source_with_a_reason(status_code, ctype, body):
    with (
        FakeHttp(respond(body, status_code, ctype)) as metrics,
        FakeHttp(respond(INDEX_AB, content_type="application/json")) as index,
    ):
        result = http_pipeline(metrics.url + "/metrics", index.url).cycle()
    st = status(result, "triton_metrics")
    assert not st.up
    assert re.search(r"HTML page|HTTP 503|no Triton \(nv_\*\) series", st.error), st.error
    docs = documents(result)
    assert task_doc(docs)["TritonUp"] == 0
    assert model_doc(docs, "a")["ModelReady"] == 1  # the index still counts


# --- security ------------------------------------------------------------------------------


def test_image_runs_as_a_non_root_user():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    users = [line.split(None, 1)[1].strip() for line in lines[last_from:] if line.upper().startswith("USER ")]
    assert users, "the final stage sets no USER: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    if user.isdigit():
        assert int(user) >= 1000
    group = users[-1].split(":")[1] if ":" in users[-1] else ""
    assert group not in ("root", "0")


def test_redirects_are_not_followed_and_the_target_receives_nothing():
    with FakeHttp(respond(triton_metrics(["a"], 1).encode())) as target:
        with (
            FakeHttp(redirect(target.url + "/metrics")) as metrics,
            FakeHttp(redirect(target.url + "/v2/repository/index", 307)) as index,
        ):
            result = http_pipeline(metrics.url + "/metrics", index.url).cycle()
        assert target.connections == 0 and target.requests == []
    for name in ("triton_metrics", "triton_index"):
        st = status(result, name)
        assert not st.up
        assert "redirect" in st.error and "not followed" in st.error and target.url in st.error


def test_proxy_and_netrc_from_the_environment_are_ignored(monkeypatch, tmp_path):
    with (
        FakeHttp(respond(b"")) as proxy,
        FakeHttp(respond(triton_metrics(["a"], 1).encode())) as metrics,
        FakeHttp(respond(INDEX_AB, content_type="application/json")) as index,
    ):
        for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(var, proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        (tmp_path / ".netrc").write_text("machine 127.0.0.1 login leak password netrcsecret\n")
        monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
        result = http_pipeline(metrics.url + "/metrics", index.url).cycle()
        assert all(s.up for s in result.statuses), result.statuses
        assert proxy.connections == 0
        assert all("authorization" not in r.headers for r in metrics.requests + index.requests)


def _listening_inodes(pid: int) -> tuple[set[str], set[str]]:
    """(socket inodes the process holds, inodes of every LISTEN/bound-UDP socket in its namespace)."""
    mine = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    listening = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            state, inode = cols[3], cols[9]
            if (table.startswith("tcp") and state == "0A") or table.startswith("udp"):
                listening.add(inode)
    return mine, listening


def test_the_running_exporter_opens_no_listening_socket(tmp_path):
    with (
        FakeHttp(respond(triton_metrics(["a"], 1).encode())) as metrics,
        FakeHttp(respond(INDEX_AB, content_type="application/json")) as index,
    ):
        out = tmp_path / "emf.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "--interval",
                "0.3",
                "--output",
                f"file:{out}",
                "--triton-metrics-url",
                metrics.url + "/metrics",
                "--triton-url",
                index.url,
                "--nvml",
                "off",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        try:
            held: set[str] = set()
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                mine, listening = _listening_inodes(proc.pid)
                held |= mine
                assert not mine & listening, "the exporter holds a listening socket"
                time.sleep(0.05)
            assert out.exists() and b"ExporterHeartbeat" in out.read_bytes()
            assert metrics.connections >= 1  # it was running and talking (as a client only)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(5)


def test_credentials_in_urls_never_reach_the_logs(tmp_path):
    log = tmp_path / "stderr.log"
    with FakeHttp(silent) as hung:
        port = closed_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "--interval",
                "0.4",
                "--timeout",
                "0.2",
                "--output",
                f"file:{tmp_path / 'emf.log'}",
                "--log-level",
                "debug",
                "--nvml",
                "off",
                "--startup-wait",
                "0",  # scrape the unreachable Triton at once: the cycles' errors are what is checked
                "--triton-metrics-url",
                f"http://bob:s3cr3t-m@127.0.0.1:{port}/metrics",
                "--triton-url",
                f"http://alice:s3cr3t-t@127.0.0.1:{hung.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
            cwd=ROOT,
        )
        try:  # until both failures were logged (a fixed sleep lost the race to a slow start-up)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                seen = log.read_text(errors="replace")
                if "Connection refused" in seen and "within 0.2s" in seen:
                    break
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    text = log.read_text()
    assert "Connection refused" in text and "within 0.2s" in text, text  # the failures were logged ...
    assert "s3cr3t" not in text and "bob" not in text and "alice" not in text  # ... without the credentials
    assert f"http://***@127.0.0.1:{port}/metrics" in text
    for line in text.splitlines():
        orjson.loads(line)


@pytest.mark.parametrize("value", ["1e308", "-1e308", "1e309", "-0", "0x10", "1_000", "infinity", "NaN"])
def test_extreme_numbers_are_finite_in_emf_or_absent(value):
    second = triton_metrics(["a"], 2, summaries=False).replace(
        'nv_inference_request_success{model="a",version="1"} 18',
        f'nv_inference_request_success{{model="a",version="1"}} {value}',
    )
    docs = run(triton_metrics(["a"], 1, summaries=False), second)[1]
    doc = model_doc(docs, "a")
    for name in metric_names(doc):
        assert math.isfinite(doc[name])
    assert doc.get("RequestSuccess", 0) >= 0
