"""The deep health probe against real Triton servers (issue 4).

The probe runs as the script ECS runs (``triton_side/health.py``) under
``python -I -S`` to prove it needs nothing beyond the standard library, as in
the stock Triton image; the folder-level checks (Python 3.8, start-up cost)
are in test_triton_side.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.triton import TritonServer, copy_models
from tests.support import fakes
from tests.support.fakes import FakeHttp, head
from tests.unit.triton_side.test_triton_side import CHUNKED, install_copy, json_answer, python38, routes
from triton_side import _http, _infer, _report
from triton_side import probe as health

HEALTH_PY = Path(health.__file__).with_name("health.py")  # the command; its code is probe.py and its modules


def run_probe(*args: str, python: str = sys.executable, script: Path = HEALTH_PY, env: dict | None = None):
    """Run health.py as a subprocess; returns (exit code, stdout + stderr)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HEALTH_", "TRITON_URL"))}
    proc = subprocess.run(
        [python, "-I", "-S", str(script), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean, **(env or {})},
    )
    return proc.returncode, proc.stdout + proc.stderr


def json_probe(*args: str) -> tuple[int, dict]:
    code, out = run_probe(*args, "--json")
    return code, json.loads(out)


def add_model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config.replace("NAME", name))
    (repo / name / "1" / "model.py").write_text(code)


def clone_model(repo: Path, src: str, name: str) -> None:
    shutil.copytree(repo / src, repo / name)
    cfg = repo / name / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace(f'name: "{src}"', f'name: "{name}"'))


# --- without a server ---------------------------------------------------------------------------


def test_first_line_keeps_only_the_headline_of_a_traceback() -> None:
    reason = "Internal: RuntimeError: boom\n\nAt:\n  /models/broken/1/model.py(2): <module>\n"
    assert _report.first_line(reason) == "Internal: RuntimeError: boom"
    long = _report.first_line("x\x1b[31m" + "y" * 1000)
    assert len(long) == _report.REASON_MAX and long.endswith("…") and "\x1b" not in long


def test_flags_win_over_environment_and_bad_values_are_usage_errors(capsys: pytest.CaptureFixture) -> None:
    env = {"TRITON_URL": "http://triton:8000", "HEALTH_MODELS": "a,b/2", "HEALTH_DEADLINE": "3",
           "HEALTH_SMOKE": "all", "HEALTH_IGNORE": "c"}  # fmt: skip
    opts = health.options([], env)
    assert (opts.url, opts.models, opts.ignore, opts.smoke, opts.deadline) == (
        "http://triton:8000", [("a", None), ("b", "2")], [("c", None)], [], 3.0)  # fmt: skip
    opts = health.options(
        ["--triton-url", "http://x:1", "--models", "m@x.v2+b/1", "--deadline", "1.5", "--no-smoke"], env
    )
    assert (opts.url, opts.models, opts.deadline, opts.smoke) == (
        "http://x:1",
        [("m@x.v2+b", "1")],
        1.5,
        None,
    )
    assert health.options(["--smoke", "add"], {}).smoke == [("add", None)]
    assert health.options(["--jobs", "1"], {}).jobs == 1  # serial: was refused ("must be above 1")
    assert health.options([], {"HEALTH_JOBS": "64"}).jobs == 64
    for argv in (
        ["--jobs", "0"],
        ["--jobs", "65"],
        ["--deadline", "soon"],
        ["--deadline", "0"],
        ["--triton-url", "ftp://x"],
        ["--models", "a/b"],
        ["--nope"],
    ):
        assert health.main(argv) == 2, argv
    assert health.main(["--help"]) == 0
    assert "HEALTH_DEADLINE" in capsys.readouterr().out


def test_build_infer_follows_metadata_and_config() -> None:
    """Shapes from the metadata Triton gave for ``add`` and ``text``; optional inputs dropped."""
    meta = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]},
                       {"name": "T", "datatype": "BYTES", "shape": [-1, 3]},
                       {"name": "O", "datatype": "INT64", "shape": [-1, 2]}]}  # fmt: skip
    config = {"max_batch_size": 8, "input": [{"name": "INPUT0", "dims": [-1]}, {"name": "T", "dims": [3]},
                                             {"name": "O", "dims": [2], "optional": True}]}  # fmt: skip
    body, n = _infer.build_infer(meta, config)
    header = json.loads(body[:n])
    assert [(i["name"], i["shape"], i["parameters"]["binary_data_size"]) for i in header["inputs"]] == [
        ("INPUT0", [1, 1], 4), ("T", [1, 3], 12)]  # fmt: skip
    assert body[n:] == bytes(16) and header["parameters"]["binary_data_output"] is True
    config["input"][0]["is_shape_tensor"] = True
    with pytest.raises(_http.Unsynthesisable, match="shape tensor"):
        _infer.build_infer(meta, config)
    with pytest.raises(_http.Unsynthesisable, match="cannot be synthesised"):
        _infer.build_infer({"inputs": [{"name": "x", "datatype": "STRANGE", "shape": [1]}]}, None)


def test_trickling_server_cannot_stretch_the_deadline() -> None:
    """urllib's timeout is per socket operation; a server sending one byte every 0.2 s, forever, must still
    be cut off by the deadline: the probe returns (it could not otherwise), says so, and hangs up."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    stop = threading.Event()
    cut_off = threading.Event()

    def trickle() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 100_000  # never ends (and no byte repeats a read)
            for byte in answer:
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    cut_off.set()
                    return

    threading.Thread(target=trickle, daemon=True).start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    try:
        code, out = run_probe("--triton-url", url, "--deadline", "1")
        assert code == 1
        assert out.startswith(f"FAIL live: no answer from 127.0.0.1:{url.rsplit(':', 1)[1]} within 1 s"), out
        assert cut_off.wait(10)  # the probe closed the connection: the next byte found nobody
    finally:
        stop.set()
        srv.close()


# --- hostile answers: refused with one FAIL line, never a traceback, never waiting for the deadline ----------


def chunked(*pieces: bytes, trailer: bytes = b"") -> bytes:
    """A chunked body of these pieces (with a chunk extension on each, as the RFC allows)."""
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n" + trailer + b"\r\n"


INDEX = b'[{"name":"add","version":"1","state":"READY"}]'
READY = head(200, "application/json", 0)


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        pytest.param({"POST /v2/repository/index": json_answer(b"[" * 100_000 + b"]" * 100_000)},
                     "FAIL index: POST /v2/repository/index answered HTTP 200 with JSON nested deeper than 64 levels",
                     id="deep-json"),
        pytest.param({"POST /v2/repository/index": head(200, "application/json", 10**12)},
                     "FAIL index: POST /v2/repository/index: answer of 1000000000000 bytes, over the probe's limit "
                     "of 8 MiB: refused", id="huge-content-length"),
        pytest.param({"POST /v2/repository/index": head(200, "application/json", extra=CHUNKED) + b"-5\r\nabcde"},
                     "FAIL index: POST /v2/repository/index: bad chunked encoding: chunk size b'-5'",
                     id="negative-chunk"),
        pytest.param({"POST /v2/repository/index": head(200, "application/json", extra=CHUNKED) + b"1_0\r\n"},
                     "FAIL index: POST /v2/repository/index: bad chunked encoding: chunk size b'1_0'", id="odd-chunk"),
        pytest.param({"POST /v2/repository/index": head(200, "application/json", extra={"Content-Length": "+5"})},
                     "FAIL index: POST /v2/repository/index: bad Content-Length '+5'", id="signed-length"),
        pytest.param({"GET /v2/health/live": b"SSH-2.0-OpenSSH_9.2p1\r\n\r\n"},
                     "FAIL live: GET /v2/health/live: not an HTTP answer: 'SSH-2.0-OpenSSH_9.2p1'", id="not-http"),
        pytest.param({"GET /v2/health/live": b"HTTP/1.1 \xb200 OK\r\n\r\n"},  # a Latin-1 digit that int() refuses
                     "FAIL live: GET /v2/health/live: not an HTTP answer: 'HTTP/1.1 \xb200 OK'", id="odd-status"),
        pytest.param({"GET /v2/health/live": b"HTTP/1.1 200 OK\r\nX: " + b"a" * 100_000},
                     "FAIL live: GET /v2/health/live: answer's header longer than 64 KiB: refused", id="long-header"),
        pytest.param({"POST /v2/repository/index": json_answer(b'[{"name": "add", "version": 1')},
                     "FAIL index: POST /v2/repository/index answered HTTP 200 with a body that is not JSON",
                     id="cut-json"),
        pytest.param({"POST /v2/repository/index": head(200, "application/json", 100) + b"[]"},
                     "FAIL index: POST /v2/repository/index: connection closed in the middle of the answer",
                     id="short-body"),
    ],
)  # fmt: skip
def test_hostile_answer_is_one_fail_line(answers: dict[str, bytes], expected: str) -> None:
    with FakeHttp(routes(answers)) as server:
        code, out = run_probe("--triton-url", server.url, "--deadline", "20")
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith(expected), out  # the FAIL line, then the summary
    assert lines[1].startswith(f"UNHEALTHY triton {server.url}: ") and "Traceback" not in out


def test_chunked_answers_are_read_whole() -> None:
    """Chunk extensions and trailers, the index in many small chunks: read as Triton would mean them."""
    pieces = [INDEX[i : i + 7] for i in range(0, len(INDEX), 7)]
    answers = {
        "POST /v2/repository/index": head(200, "application/json", extra=CHUNKED)
        + chunked(*pieces, trailer=b"X: 1\r\n"),
        "GET /v2/models/add/versions/1/ready": READY,
    }
    with FakeHttp(routes(answers)) as server:
        code, out = run_probe("--triton-url", server.url)
    assert code == 0 and out.startswith("OK ") and "(add/1)" in out, out


def test_answer_over_the_size_limit_is_refused(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """No Content-Length, a body that never ends: refused at the limit, not read until the deadline."""
    monkeypatch.setattr(_http, "MAX_BODY_BYTES", 256 * 1024)

    def unending(server: FakeHttp, conn: socket.socket, req: fakes.Request) -> None:
        server.send(conn, head(200, "application/json"))
        while not server.stopped.is_set():
            server.send(conn, b" " * 65536)  # raises once the probe hangs up

    with FakeHttp(unending) as server:
        assert health.main(["--triton-url", server.url, "--deadline", "20"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL live: GET /v2/health/live: answer larger than the probe's limit of 256 KiB: refused")


def test_smoke_reads_only_the_json_header_of_a_large_inference_answer(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """An inference answer past the body limit whose JSON header says what the check needs: read that far only."""
    monkeypatch.setattr(_http, "MAX_BODY_BYTES", 64 * 1024)
    meta = b'{"name":"add","inputs":[{"name":"X","datatype":"FP32","shape":[1]}]}'
    header = b'{"outputs":[{"name":"Y","datatype":"FP32","shape":[262144],"parameters":{"binary_data_size":1048576}}]}'
    infer = head(200, "application/octet-stream", len(header) + 1048576,
                 {"Inference-Header-Content-Length": str(len(header))}) + header + bytes(1048576)  # fmt: skip
    answers = {
        "POST /v2/repository/index": json_answer(INDEX),
        "GET /v2/models/add/versions/1/ready": READY,
        "GET /v2/models/add/versions/1": json_answer(meta),
        "GET /v2/models/add/versions/1/config": json_answer(b'{"name":"add","max_batch_size":0}'),
        "POST /v2/models/add/versions/1/infer": infer,
    }
    with FakeHttp(routes(answers)) as server:
        assert health.main(["--triton-url", server.url, "--smoke", "--deadline", "20"]) == 0
    assert "smoke inference ok for 1" in capsys.readouterr().out


def test_host_names_are_resolved_under_the_deadline(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """localhost and addresses need no resolver; any other name is looked up in a thread the probe waits for
    no longer than its deadline (getaddrinfo has no timeout), and a name that does not resolve is said so."""
    asked: list[str] = []
    hang = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args):  # stands in for a resolver: one name it knows, one it never answers
        asked.append(host)
        if host == "triton.task.local":
            return real("127.0.0.1", port, *args)
        if host == "hangs.task.local":
            hang.wait(30)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(_http.socket, "getaddrinfo", getaddrinfo)
    answers = {"POST /v2/repository/index": json_answer(INDEX), "GET /v2/models/add/versions/1/ready": READY}
    try:
        with FakeHttp(routes(answers)) as server:
            port = server.port
            for host in ("triton.task.local", "localhost", "127.0.0.1"):
                assert health.main(["--triton-url", f"http://{host}:{port}", "--quiet"]) == 0, capsys.readouterr()
            assert asked == ["triton.task.local"]
        assert health.main(["--triton-url", f"http://nowhere.task.local:{port}"]) == 1
        assert capsys.readouterr().out.startswith(
            "FAIL live: cannot resolve 'nowhere.task.local': Name or service not known: wrong TRITON_URL, or no "
            "resolver to ask\n"
        )
        assert health.main(["--triton-url", f"http://hangs.task.local:{port}", "--deadline", "0.5"]) == 1
        assert capsys.readouterr().out.startswith(
            "FAIL live: cannot resolve 'hangs.task.local': no answer from the resolver within 0.5 s"
        )
    finally:
        hang.set()


def test_a_bug_in_the_probe_is_an_unhealthy_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    answers = {"POST /v2/repository/index": json_answer(INDEX), "GET /v2/models/add/versions/1/ready": READY}

    def broken(report: _report.Report) -> str:
        raise AttributeError("'int' object has no attribute 'bit_count'")  # as a newer Python's API on an older one

    monkeypatch.setattr(_report, "render_text", broken)
    with FakeHttp(routes(answers)) as server:
        assert health.main(["--triton-url", server.url]) == 1
    assert capsys.readouterr() == (
        f"UNHEALTHY triton {server.url}: probe error AttributeError: 'int' object has no attribute 'bit_count'\n",
        "",
    )


def test_fail_lines_and_names_are_bounded() -> None:
    """A repository of failing models, one of them with a 10,000-character name: 20 FAIL lines, each bounded."""
    index = [{"name": f"m{i}", "version": "1", "state": "UNAVAILABLE", "reason": "x" * 1000} for i in range(30)]
    index.append({"name": "n" * 10_000, "version": "1", "state": "UNAVAILABLE", "reason": "boom\nAt:\n..."})
    with FakeHttp(routes({"POST /v2/repository/index": json_answer(json.dumps(index).encode())})) as server:
        code, out = run_probe("--triton-url", server.url)
    lines = out.splitlines()
    assert code == 1 and len(lines) == _report.FAIL_LINES_MAX + 2, out
    assert lines[-2] == f"FAIL +{31 - _report.FAIL_LINES_MAX} more failed check(s) (--json lists every check)"
    assert max(len(line) for line in lines) < 1000
    report = _report.Report("http://t", 4.0)
    report.checks = [_report.Check("state", "fail", 0, "x" * 5000, "n" * 10_000, "1", "UNAVAILABLE", "y" * 5000)]
    line = _report.render_text(report).splitlines()[0]
    assert len(line) < 700 and line.startswith("FAIL model 'nnn") and "…" in line


# --- against the shared session server (add, slow, text, fails READY; broken failed) ---------


@pytest.mark.triton
def test_healthy_repository_exits_0(triton: TritonServer) -> None:
    code, out = run_probe("--triton-url", triton.url, "--ignore", "broken")
    assert code == 0, out
    assert out.startswith("OK ") and "add/1" in out and "text/1" in out and len(out.splitlines()) == 1
    assert run_probe("--triton-url", triton.url, "--ignore", "broken", "--quiet") == (0, "")
    # in-process entry point for ``python -m exporter health``: returns the code, never exits
    assert health.main(["--triton-url", triton.url, "--models", "add,slow", "--quiet"]) == 0


@pytest.mark.triton
def test_model_that_failed_to_load_is_named_with_its_reason(triton: TritonServer) -> None:
    code, out = run_probe("--triton-url", triton.url)
    assert code == 1
    lines = out.strip().splitlines()
    assert len(lines) == 2, out  # one line per failing check, one summary line
    assert lines[0] == (
        "FAIL model 'broken' version 1 is UNAVAILABLE: "
        "Internal: RuntimeError: boom: this sample model fails to load on purpose"
    )
    assert lines[1].startswith("UNHEALTHY ") and "broken/1" in lines[1] and "4 of 5" in lines[1]
    code, doc = json_probe("--triton-url", triton.url)
    assert code == 1 and doc["healthy"] is False
    bad = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [(c["model"], c["version"], c["state"]) for c in bad] == [("broken", "1", "UNAVAILABLE")]
    assert bad[0]["reason"].startswith("Internal: RuntimeError: boom")


@pytest.mark.triton
def test_smoke_inference_on_every_serving_sample_model(triton: TritonServer) -> None:
    code, doc = json_probe("--triton-url", triton.url, "--ignore", "broken,fails", "--smoke")
    assert code == 0, doc
    checks = doc["checks"]
    assert [c["check"] for c in checks[:2]] == ["live", "index"]
    assert all({"check", "status", "duration_s", "detail", "model", "version"} <= set(c) for c in checks)
    smoke = {c["model"]: c for c in checks if c["check"] == "smoke"}
    assert set(smoke) == {"add", "slow", "text"} and all(c["status"] == "ok" for c in smoke.values())
    assert smoke["slow"]["duration_s"] >= 0.05  # the model really ran (it sleeps 50 ms)
    assert {c["model"] for c in checks if c["check"] == "ready" and c["status"] == "ok"} == set(smoke)


@pytest.mark.triton
def test_model_whose_inference_fails_is_unhealthy(triton: TritonServer) -> None:
    code, out = run_probe("--triton-url", triton.url, "--ignore", "broken", "--smoke")
    assert code == 1
    lines = out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("FAIL model 'fails' version 1")
    assert "HTTP 500" in lines[0] and "sample model always fails" in lines[0]
    # asked for one model only: the others are not smoke-tested
    code, doc = json_probe("--triton-url", triton.url, "--models", "add,fails", "--smoke", "add")
    assert code == 0 and [c["model"] for c in doc["checks"] if c["check"] == "smoke"] == ["add"]
    code, out = run_probe("--triton-url", triton.url, "--models", "add", "--smoke", "text")
    assert code == 1 and "'text'" in out and "not among the required models" in out


@pytest.mark.triton
def test_stdlib_only_copy_runs_isolated(triton: TritonServer, tmp_path: Path) -> None:
    script = install_copy(tmp_path) / "health.py"
    isolated = subprocess.run([sys.executable, "-I", "-S", "-c", "import requests"], capture_output=True)
    assert isolated.returncode != 0  # -I -S really hides the venv's packages
    oldest = python38()  # Ubuntu 20.04 Triton images; test_triton_side.py checks 3.8 statically everywhere
    pythons = [sys.executable] + ([oldest] if oldest else [])
    for python in pythons:
        code, out = run_probe("--triton-url", triton.url, "--ignore", "broken,fails", "--smoke",
                                 python=python, script=script)  # fmt: skip
        assert code == 0, (python, out)
        assert "smoke inference ok for 3" in out
    code, out = run_probe(script=script, env={"TRITON_URL": triton.url, "HEALTH_IGNORE": "broken"})
    assert code == 0, out


# --- private servers -----------------------------------------------------------------------------


@pytest.mark.triton
def test_unloaded_model_is_fine_unless_required(triton_factory) -> None:
    server = triton_factory(models=["add", "text"])
    assert run_probe("--triton-url", server.url)[0] == 0
    server.unload("text")
    code, out = run_probe("--triton-url", server.url)
    assert code == 0 and "text" not in out, out
    code, out = run_probe("--triton-url", server.url, "--models", "add,text")
    assert code == 1
    assert out.splitlines()[0].startswith("FAIL model 'text' version 1 is UNAVAILABLE: unloaded on purpose")
    assert run_probe("--triton-url", server.url, env={"HEALTH_MODELS": "text"})[0] == 1
    code, out = run_probe("--triton-url", server.url, "--models", "nope")
    assert code == 1 and "'nope'" in out and "not in the repository index" in out


@pytest.mark.triton
def test_stopped_or_frozen_server_fails_within_the_deadline(triton_factory) -> None:
    """A frozen server holds the probe until its deadline, and no longer: the answer is a FAIL line that says so
    (run_probe's own 30 s limit would fail the test if the probe waited on). A stopped one is refused at once."""
    server = triton_factory(models=["add"])
    assert run_probe("--triton-url", server.url)[0] == 0
    port = server.url.rsplit(":", 1)[1]
    server.freeze()
    try:
        code, out = run_probe("--triton-url", server.url, "--deadline", "1.5")
    finally:
        server.thaw()
    assert code == 1
    assert out.startswith(f"FAIL live: no answer from 127.0.0.1:{port} within 1.5 s: the server accepts connections")
    assert "does not respond" in out and "server not answering" in out.splitlines()[-1], out
    server.stop()
    code, out = run_probe("--triton-url", server.url)
    assert code == 1 and out.startswith(f"FAIL live: cannot connect to 127.0.0.1:{port}: Connection refused"), out


SLEEPY_CONFIG = """name: "NAME"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [{ kind: KIND_CPU }]
"""
SLEEPY_CODE = """import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(6)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x(r))]) for r in requests]


def x(request):
    return pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
"""


@pytest.mark.triton
def test_model_still_loading_is_reported_as_loading(tmp_path: Path) -> None:
    repo = copy_models(["add"], tmp_path / "models")
    add_model(repo, "sleepy", SLEEPY_CONFIG, SLEEPY_CODE)
    server = TritonServer(repo, workdir=tmp_path, load_all=False, extra_args=["--load-model=add"])
    server.start()
    try:
        code, out = run_probe("--triton-url", server.url, "--models", "sleepy")
        assert code == 1 and "'sleepy' is NOT LOADED: in the repository but never loaded" in out, out
        assert run_probe("--triton-url", server.url)[0] == 0  # never loaded on purpose: not required by default
        loader = threading.Thread(target=server.load, args=("sleepy",))
        loader.start()
        # A request that reaches Triton right after a load call can wait for that load to finish
        # (seen on 2.51); give up on such a request and poll again on a new connection.
        deadline = time.monotonic() + 5
        index: object = None
        while True:
            try:
                index = server.request("POST", "/v2/repository/index", {}, timeout=0.5)[1]
            except OSError:
                index = None
            if any(v["name"] == "sleepy" and v.get("state") == "LOADING" for v in index or []):
                break
            assert time.monotonic() < deadline, index
            time.sleep(0.05)
        code, out = run_probe("--triton-url", server.url)
        assert code == 1
        assert out.splitlines()[0].startswith("FAIL model 'sleepy' version 1 is LOADING: still loading"), out
        loader.join(30)
        code, out = run_probe("--triton-url", server.url, "--smoke")
        assert code == 0, out
    finally:
        server.stop()


DECOUPLED_CONFIG = SLEEPY_CONFIG + "model_transaction_policy { decoupled: true }\n"
DECOUPLED_CODE = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            y = pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())
            sender.send(pb_utils.InferenceResponse([y]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
SEQUENCE_CONFIG = SLEEPY_CONFIG + "sequence_batching { }\n"
ECHO_CODE = SLEEPY_CODE.replace("time.sleep(6)", "pass")
NON_ASCII = "modèle-ü"


@pytest.fixture(scope="module")
def odd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """Models with unusual names, a decoupled model and a sequence model."""
    work = tmp_path_factory.mktemp("odd")
    repo = copy_models(["add"], work / "models")
    for name in ("m@x.v2+b", "a%41b", "q?x", NON_ASCII):
        clone_model(repo, "add", name)
    add_model(repo, "stream", DECOUPLED_CONFIG, DECOUPLED_CODE)
    add_model(repo, "seq", SEQUENCE_CONFIG, ECHO_CODE)
    add_model(repo, "mute", SLEEPY_CONFIG, ECHO_CODE.replace('Tensor("Y"', 'Tensor("Z"'))  # no declared output
    server = TritonServer(repo, workdir=work)
    server.start()
    yield server
    server.stop()


@pytest.mark.triton
def test_unusual_model_names_are_sent_verbatim(odd_server: TritonServer) -> None:
    code, doc = json_probe("--triton-url", odd_server.url, "--ignore", f"{NON_ASCII},mute", "--smoke")
    assert code == 0, doc
    ready = {c["model"]: c["status"] for c in doc["checks"] if c["check"] == "ready"}
    smoke = {c["model"]: c["status"] for c in doc["checks"] if c["check"] == "smoke"}
    # percent-escaping "@" or "+" would make Triton answer "unknown model": these prove it is not done
    assert ready["m@x.v2+b"] == ready["a%41b"] == smoke["m@x.v2+b"] == smoke["a%41b"] == "ok"
    # "?" cannot be in an HTTP path (Triton cuts the name there): judged from the index only
    assert ready["q?x"] == smoke["q?x"] == "skip"
    # a sequence model needs a correlation id: the probe sends a one-step sequence
    assert smoke["seq"] == "ok"
    # a decoupled model cannot answer on HTTP infer: skipped unless asked for by name
    assert smoke["stream"] == "skip"
    code, out = run_probe("--triton-url", odd_server.url, "--ignore", NON_ASCII, "--smoke", "stream")
    assert code == 1 and "'stream'" in out and "decoupled" in out


@pytest.mark.triton
def test_answer_without_outputs_is_unhealthy(odd_server: TritonServer) -> None:
    """The Python backend drops an undeclared output tensor and still answers 200."""
    code, out = run_probe("--triton-url", odd_server.url, "--models", "mute", "--smoke")
    assert (
        code == 1
        and out.startswith("FAIL model 'mute' version 1 (READY) smoke check: ")
        and ("200 without outputs" in out)
    ), out


@pytest.mark.triton
def test_non_ascii_name_goes_out_as_utf8(odd_server: TritonServer) -> None:
    # The Python backend stub fails to load a non-ASCII model here; the probe names it with its reason ...
    code, out = run_probe("--triton-url", odd_server.url, "--models", NON_ASCII)
    assert code == 1 and out.startswith(f"FAIL model '{NON_ASCII}' version 1 is UNAVAILABLE: Internal: "), out
    # ... and raw UTF-8 in the path reaches that model (a percent-escaped path is "not found")
    client = _http.Client(odd_server.url, _http.Deadline(5))
    seg = _http.segment(NON_ASCII)
    assert seg == NON_ASCII
    resp = client.request("GET", f"/v2/models/{seg}")
    assert resp.status == 404 and "has no available versions" in resp.error_text()
