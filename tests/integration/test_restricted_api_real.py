"""Triton's admin APIs closed to everyone without the task's key, and our sidecars holding it, on a real Triton.

Triton runs as the deployment runs it (``--http-restricted-api`` and ``--grpc-restricted-protocol`` for the
groups of triton_http/admin.py, keyed on ``triton-admin-key``): a client without the key (whoever reaches the
load balancer) cannot load, unload, reconfigure or read the repository, over HTTP or gRPC, and still gets
inference, metadata and health; the exporter, model sync and the health probe, given ``TRITON_ADMIN_KEY``,
work as before, and without it say what is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from demo.triton import TritonServer
from exporter.sources import SourceError
from exporter.sources.triton import TritonIndexSource
from exporter.traces.sampling import TraceRate
from modelsync.errors import LoadFailed, TritonUnavailable
from modelsync.triton import Triton
from tests.integration.test_health import run_probe
from tests.support.paths import REPO
from triton_http import parse_key
from triton_http.admin import GRPC_HEADER, HEADER

pytestmark = pytest.mark.triton

KEY = "k3y-Only-The-Task-Knows-0123456789"
ADD_INPUT = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> TritonServer:
    from demo.triton import copy_models

    workdir = tmp_path_factory.mktemp("restricted")
    server = TritonServer(copy_models(["add", "text"], workdir / "models"), workdir=workdir, admin_key=KEY)
    server.start()
    yield server  # type: ignore[misc]
    server.stop()


ADMIN_CALLS = [
    ("POST", "/v2/repository/index", {}),
    ("POST", "/v2/repository/models/add/unload", {}),
    ("POST", "/v2/repository/models/add/load", {"parameters": {"config": "{}"}}),
    ("GET", "/v2/models/add/config", None),
    ("GET", "/v2/models/stats", None),
    ("GET", "/v2/models/add/stats", None),
    ("POST", "/v2/trace/setting", {"trace_rate": "1"}),
    ("POST", "/v2/models/add/trace/setting", {"trace_rate": "1"}),
    ("GET", "/v2/logging", None),
    ("GET", "/v2/systemsharedmemory/status", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS, ids=[f"{m} {p}" for m, p, _ in ADMIN_CALLS])
def test_every_admin_api_is_refused_without_the_key_or_with_a_wrong_one(
    restricted: TritonServer, method: str, path: str, body: object
) -> None:
    status, answer = restricted.request(method, path, body, admin=False)
    assert status == 403 and "restricted" in str(answer), (status, answer)
    status, answer = restricted.request(method, path, body, admin=False, headers={HEADER: KEY[:-1] + "X"})
    assert status == 403, (status, answer)
    assert any(v["name"] == "add" and v["state"] == "READY" for v in restricted.index())  # nothing was unloaded


def test_inference_metadata_and_health_are_served_without_the_key(restricted: TritonServer) -> None:
    assert restricted.request("GET", "/v2/health/ready", admin=False)[0] == 200
    assert restricted.request("GET", "/v2/health/live", admin=False)[0] == 200
    assert restricted.request("GET", "/v2/models/add/ready", admin=False)[0] == 200
    status, meta = restricted.request("GET", "/v2/models/add", admin=False)
    assert status == 200 and meta["inputs"][0]["name"] == "INPUT0"
    status, out = restricted.request("POST", "/v2/models/add/infer", {"inputs": ADD_INPUT}, admin=False)
    assert status == 200 and out["outputs"], out


def test_the_key_opens_load_and_unload(restricted: TritonServer) -> None:
    assert restricted.unload("text") == 200
    assert not any(v["name"] == "text" and v["state"] == "READY" for v in restricted.index())
    assert restricted.load("text") == 200
    assert restricted.request("GET", "/v2/models/text/ready", admin=False)[0] == 200


def test_grpc_refuses_the_repository_api_without_the_key_and_serves_inference(restricted: TritonServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{restricted.grpc_port}")
    try:
        for call in (
            lambda h: client.get_model_repository_index(headers=h),
            lambda h: client.unload_model("add", headers=h),
            lambda h: client.load_model("add", headers=h, files={"file:1/model.py": b"import os\n"}),
            lambda h: client.get_model_config("add", headers=h),
            lambda h: client.get_log_settings(headers=h),
        ):
            for headers in (None, {HEADER: KEY}, {GRPC_HEADER: KEY[:-1] + "X"}):  # gRPC wants its own header name
                with pytest.raises(InferenceServerException, match="restricted"):
                    call(headers)
        assert client.get_model_repository_index(headers={GRPC_HEADER: KEY}).models  # the key as gRPC names it
        assert client.is_model_ready("add")
        inp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        import numpy as np

        inp.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
        assert client.infer("add", [inp]).get_response().outputs
    finally:
        client.close()
    assert any(v["name"] == "add" and v["state"] == "READY" for v in restricted.index())


def test_the_exporters_index_source_reads_with_the_key_and_says_what_is_missing_without(
    restricted: TritonServer,
) -> None:
    source = TritonIndexSource(restricted.url, 1.0, 1 << 20, admin_key=parse_key(KEY))
    collected = source.collect(5.0)
    assert {(v.model, v.state) for v in collected.index} >= {("add", "READY")}
    assert collected.configs  # the model configurations, a restricted API too
    with pytest.raises(SourceError, match="set TRITON_ADMIN_KEY"):
        TritonIndexSource(restricted.url, 1.0, 1 << 20).collect(5.0)
    with pytest.raises(SourceError, match="refused the key in TRITON_ADMIN_KEY"):
        TritonIndexSource(restricted.url, 1.0, 1 << 20, admin_key=parse_key("x" * 20)).collect(5.0)


def test_the_trace_rate_is_applied_with_the_key_and_refused_without(restricted: TritonServer) -> None:
    keyed = TraceRate(restricted.url, 7, admin_key=parse_key(KEY))
    keyed.keep(5.0)
    assert keyed.applied == 1 and not keyed.conditions.active
    bare = TraceRate(restricted.url, 9)
    bare.keep(5.0)
    assert bare.applied == 0 and "TRITON_ADMIN_KEY" in str(bare.conditions.active)


def test_model_sync_loads_with_the_key_and_names_the_missing_key_without(restricted: TritonServer) -> None:
    Triton(restricted.url, 60, admin_key=parse_key(KEY)).load("add")
    with pytest.raises(LoadFailed, match="set TRITON_ADMIN_KEY"):
        Triton(restricted.url, 60).load("add")
    with pytest.raises(TritonUnavailable, match="set TRITON_ADMIN_KEY"):
        Triton(restricted.url, 60).index()


def test_the_health_probe_reads_the_key_from_its_variable(restricted: TritonServer) -> None:
    code, out = run_probe("--triton-url", restricted.url, env={"TRITON_ADMIN_KEY": KEY})
    assert code == 0, out
    assert KEY not in out
    code, out = run_probe("--triton-url", restricted.url, env={"TRITON_ADMIN_KEY": ""})
    assert code == 1 and "set TRITON_ADMIN_KEY" in out, out


def _once(restricted: TritonServer, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "TRITON_", "ECS_"))}
    return subprocess.run(
        [sys.executable, "-m", "exporter", "--once", "--interval", "1", "--nvml", "off"],
        cwd=REPO,
        env={**clean, "TRITON_URL": restricted.url, "TRITON_METRICS_URL": restricted.metrics_url, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_exporter_once_with_the_key_in_its_variable_reads_the_index_and_never_shows_the_key(
    restricted: TritonServer,
) -> None:
    run = _once(restricted, {"TRITON_ADMIN_KEY": KEY})
    assert run.returncode == 0, run.stderr
    assert "source triton_index: up" in run.stderr, run.stderr
    assert KEY not in run.stdout + run.stderr
    run = _once(restricted, {})  # --once stops at a Triton it cannot read, saying why
    assert run.returncode != 0 and "set TRITON_ADMIN_KEY to the task's admin key" in run.stderr, run.stderr


@pytest.mark.parametrize("bad", ["short", "has space in it 0123456789", "quote'0123456789abcdef", "x" * 300])
def test_a_malformed_key_is_a_clear_usage_error_that_does_not_show_it(
    restricted: TritonServer, bad: str, tmp_path: object
) -> None:
    run = _once(restricted, {"TRITON_ADMIN_KEY": bad})
    assert run.returncode == 2 and "TRITON_ADMIN_KEY" in run.stderr, run.stderr
    assert bad not in run.stderr


def test_settings_never_show_the_key() -> None:
    from exporter.config import load as exporter_settings
    from modelsync.settings import load as modelsync_settings

    shown: list[Callable[[], object]] = [
        lambda: exporter_settings([], {"TRITON_ADMIN_KEY": KEY}),
        lambda: modelsync_settings(["--bucket", "models-bucket"], {"TRITON_ADMIN_KEY": KEY}),
    ]
    for settings in shown:
        value = settings()
        assert KEY not in repr(value) and KEY not in str(value)
        assert value.triton_admin_key is not None and value.triton_admin_key.value == KEY  # type: ignore[attr-defined]
