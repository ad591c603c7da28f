"""triton_http, the client the exporter and model sync share: every call bounded, every failure typed.

Against loopback servers that misbehave on purpose (tests/support/fakes.py); the sources' and model sync's
behaviour on top of it against a real Triton is in test_triton_real.py, test_modelconfig_real.py,
test_traces_real.py and the model-sync tests.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import tracemalloc

import pytest

from modelsync.errors import LoadFailed, TritonUnavailable
from modelsync.evidence import ScrapeError, scrape
from modelsync.triton import Triton
from tests.support.fakes import FakeHttp, Request, closed_port, head, redirect, respond, silent
from tests.support.paths import REPO
from triton_http import Broken, CannotConnect, Client, Redirected, RequestFailed, TimedOut, TooLarge

ROOT = REPO
CLIENT = Client(connect_timeout=1.0, max_bytes=1 << 20)


def raw(data: bytes, then_wait: float = 0.0):
    """Whatever bytes ``data`` holds, as the whole answer; then wait (the connection open) or hang up."""

    def run(server: FakeHttp, conn: socket.socket, req: Request) -> None:
        server.send(conn, data)
        server.stopped.wait(then_wait)

    return run


def slow_head(every: float):
    """The status line at once, then one header byte every ``every`` seconds, the headers never ending."""

    def run(server: FakeHttp, conn: socket.socket, req: Request) -> None:
        server.send(conn, b"HTTP/1.1 200 OK\r\n")
        while not server.stopped.wait(every):
            server.send(conn, b"X")

    return run


def test_a_server_dripping_its_headers_is_cut_off_at_the_deadline() -> None:
    """A socket timeout applies per read: a header byte every 50 ms kept the previous client waiting."""
    with FakeHttp(slow_head(0.05)) as server:
        start = time.monotonic()
        with pytest.raises(TimedOut, match=r"no answer within 0\.5s"):
            CLIENT.get(server.url + "/v2/repository/index", 0.5)
        took = time.monotonic() - start
        assert server.bytes_sent > 3  # the header really was arriving while the call waited
        sent = server.bytes_sent
        deadline = time.monotonic() + 10
        while server.bytes_sent == sent and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.bytes_sent > sent  # and still is: the call's deadline ended it, not the server
    # The drip never ends by itself; a client without a whole-call deadline would never return.
    assert took < 30, took  # a bound against a hang (0.5 s expected), not a measurement


def test_a_declared_length_over_the_cap_is_refused_before_the_body_is_read() -> None:
    with (
        FakeHttp(raw(head(200, length=10 << 20), then_wait=5)) as server,
        pytest.raises(TooLarge, match=r"body larger than the 1048576 byte cap; refused"),
    ):
        CLIENT.get(server.url + "/metrics", 5)


def test_a_chunked_body_is_read_whole_and_capped_while_reading() -> None:
    chunk = b"x" * 1000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(5)) + b"0\r\n\r\n"
    chunked = head(200, extra={"Transfer-Encoding": "chunked"}) + body
    with FakeHttp(raw(chunked)) as server:
        assert CLIENT.get(server.url + "/metrics", 5).body == chunk * 5
        with pytest.raises(TooLarge, match="4000 byte cap"):
            CLIENT.get(server.url + "/metrics", 5, max_bytes=4000)


def test_a_body_shorter_than_its_length_is_broken_not_truncated_data() -> None:
    with (
        FakeHttp(raw(head(200, length=100) + b"x" * 40)) as server,
        pytest.raises(Broken, match=r"connection broke while reading \(IncompleteRead\(40 bytes read, 60 more"),
    ):
        CLIENT.get(server.url + "/metrics", 5)


def test_a_sized_body_is_held_once_while_it_is_read() -> None:
    """At 1000 LLM models /metrics is ~10 MB: read as chunks and joined, the body was held twice at the join
    (bench/bench_once.py's peak). With its length known, it is read into one buffer of that size."""
    body = b"x" * (4 << 20)
    answer = head(200, length=len(body)) + body  # built before tracing: the server's copy is not the client's
    client = Client(connect_timeout=1.0, max_bytes=8 << 20)
    with FakeHttp(raw(answer)) as server:
        tracemalloc.start()
        try:
            got = client.get(server.url + "/metrics", 10).body
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert got == body
    assert peak < 1.5 * len(body), peak  # the body once (chunks and their join: 2x)


@pytest.mark.parametrize(
    "answer, reason",
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "no HTTP answer (BadStatusLine"),
        (b"", "no HTTP answer (RemoteDisconnected"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * 70000 + b"\r\n\r\n", "no HTTP answer (LineTooLong"),
    ],
    ids=["not-http", "hang-up", "endless-header"],
)
def test_what_is_not_an_http_answer_is_one_line_naming_the_url(answer: bytes, reason: str) -> None:
    with FakeHttp(raw(answer)) as server, pytest.raises(Broken) as caught:
        CLIENT.get(server.url + "/metrics", 5)
    assert str(caught.value).startswith(f"{server.url}/metrics: {reason}"), caught.value
    assert "\n" not in str(caught.value)


def test_refused_connections_and_the_connect_timeout_are_cannot_connect() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v2/health/live"
    with pytest.raises(CannotConnect, match=r"cannot connect \(\[Errno 111\] Connection refused\)"):
        CLIENT.get(url, 5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # a full backlog: the handshake of a further connection never completes
    fillers = []
    try:
        for _ in range(8):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(listener.getsockname())
            fillers.append(s)
        port = listener.getsockname()[1]
        try:
            Client(0.3, 1 << 20).get(f"http://127.0.0.1:{port}/", 5)
        except CannotConnect as exc:  # the kernel dropped the handshake, as a filtered port does
            assert "connect timed out after 0.3s" in str(exc)
        except RequestFailed as exc:  # a kernel that completes it anyway: the answer never comes
            assert isinstance(exc, TimedOut), exc
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_redirects_are_an_error_naming_their_target_and_credentials_never_show() -> None:
    with FakeHttp(redirect("http://elsewhere:1/metrics", 307)) as server:
        url = server.url.replace("http://", "http://bob:s3cr3t@") + "/metrics"
        with pytest.raises(Redirected) as caught:
            CLIENT.get(url, 5)
    assert caught.value.status == 307 and caught.value.location == "http://elsewhere:1/metrics"
    assert "redirects are not followed" in str(caught.value)
    assert "s3cr3t" not in str(caught.value) and "bob" not in str(caught.value)
    assert str(caught.value).startswith(server.url.replace("http://", "http://***@"))
    # sent as configured: Basic authentication from the URL's user information
    assert server.requests[0].headers["authorization"] == "Basic Ym9iOnMzY3IzdA=="


def test_every_request_closes_its_connection_and_posts_json() -> None:
    with FakeHttp(respond(b'{"trace_rate": "3"}', content_type="application/json")) as server:
        got = CLIENT.post(server.url + "/v2/trace/setting", 5, {"trace_rate": "3"})
        CLIENT.get(server.url + "/v2/trace/setting", 5)
    assert got.status == 200 and got.json() == {"trace_rate": "3"}
    first, second = server.requests
    assert first.method == "POST" and first.body == b'{"trace_rate":"3"}'
    assert first.headers["content-type"] == "application/json"
    assert all(r.headers["connection"] == "close" for r in server.requests)  # never holds Triton's shutdown
    assert all(r.headers["accept-encoding"] == "identity" for r in server.requests)  # the cap bounds the bytes
    assert second.method == "GET" and second.body == b""
    assert server.connections == 2


def test_one_client_serves_threads_at_once() -> None:
    with FakeHttp(respond(b"ok")) as server:
        results: list[bytes] = []

        def call() -> None:
            results.append(CLIENT.get(server.url + "/x", 5).body)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert results == [b"ok"] * 8


def test_a_url_that_is_not_http_is_refused_without_a_connection() -> None:
    with pytest.raises(RequestFailed, match="not a usable URL"):
        CLIENT.get("ftp://127.0.0.1/x", 1)
    with FakeHttp(respond(b"ok")) as server, pytest.raises(RequestFailed, match="not a usable request"):
        CLIENT.get(server.url + "/v2/models/a b/ready", 1)


# --- model sync on the shared client ----------------------------------------------------------------------


def test_model_sync_ignores_proxies_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its Triton is on localhost: an HTTP_PROXY set for S3 must not carry the load calls elsewhere."""
    with (
        FakeHttp(respond(b"")) as proxy,
        FakeHttp(respond(b'{"error": "nope"}', 400, "application/json")) as triton,
    ):
        for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(var, proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with pytest.raises(LoadFailed, match="Triton refused to load m: nope"):
            Triton(triton.url, 5).load("m")
    assert proxy.connections == 0 and [r.path for r in triton.requests] == ["/v2/repository/models/m/load"]
    assert triton.requests[0].headers["connection"] == "close"


def test_model_sync_reports_an_unreachable_or_garbled_triton_as_unavailable() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(TritonUnavailable, match=rf"^Triton at {url} unreachable: cannot connect \(\[Errno 111\]"):
        Triton(url, 5).index()
    assert Triton(url, 5).live() is False
    with (
        FakeHttp(respond(b"<html>502</html>", content_type="text/html")) as server,
        pytest.raises(TritonUnavailable, match="answered non-JSON"),
    ):  # one line, not a JSONDecodeError traceback
        Triton(server.url, 5).index()
    with FakeHttp(silent) as server:
        triton = Triton(server.url, 0.3)
        start = time.monotonic()
        with pytest.raises(TritonUnavailable, match=r"no answer within 0\.3s"):
            triton.load("m")  # the load timeout is the whole call's deadline
        assert time.monotonic() - start < 20  # not the silent server's 60 s (0.3 s expected)


def test_rollout_evidence_scrapes_are_bounded_and_typed() -> None:
    with (
        FakeHttp(raw(head(200, length=100 << 20), then_wait=5)) as server,
        pytest.raises(ScrapeError, match="byte cap; refused"),
    ):
        scrape(Client(1.0, 1 << 20), server.url + "/metrics", {"m"})
    with (
        FakeHttp(redirect("http://elsewhere/metrics")) as server,
        pytest.raises(ScrapeError, match="redirects are not followed"),
    ):
        scrape(Client(1.0, 1 << 20), server.url + "/metrics", {"m"})
    body = b'nv_inference_request_success{model="m",version="1"} 7\n'
    with FakeHttp(respond(body)) as server:
        snap = scrape(Client(1.0, 1 << 20), server.url + "/metrics", {"m"})
    assert snap[("m", "1")].success == 7


# --- start-up cost -------------------------------------------------------------------------------------------


def test_the_exporters_sources_do_not_import_requests() -> None:
    """requests costs about 100 ms of start-up; --once and the daemon without OTLP outputs never need it."""
    code = (
        "import sys\n"
        "from exporter.__main__ import build_catalog, build_sources\n"
        "from exporter.config import load\n"
        "settings = load(['--nvml', 'off', '--ecs-metadata-url', 'http://127.0.0.1:9/v4'])\n"
        "build_sources(settings, build_catalog(settings))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('requests', 'urllib3', 'triton_http')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['triton_http', 'triton_http.admin', 'triton_http.client', 'triton_http.errors']", out
