"""Shared fixtures: real Triton servers started from the nvidia-pytriton wheel.

``triton`` is one server for the whole session, with every core sample model
(``add``, ``slow``, ``text``, ``fails`` load; ``broken`` fails to load). The LLM
sample models (``vllm_model``, ``tensorrt_llm``) are left out of it on purpose:
tests/integration/test_llm_real.py serves them on its own server, whose traffic it fully
controls. Tests that restart, freeze or unload models use ``triton_factory``
to get their own.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from demo.triton import TritonServer, copy_models, sample_models

from .support.helpers import ECS_TASK
from .support.otlp_endpoint import ACCESS_KEY, SECRET_KEY, OtlpEndpoint

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def triton() -> Iterator[TritonServer]:
    workdir = Path(tempfile.mkdtemp(prefix="triton-session-"))
    server = TritonServer(copy_models(sample_models(llm=False), workdir / "models"), workdir=workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def triton_factory(tmp_path: Path) -> Iterator[Callable[..., TritonServer]]:
    """Make a private server: ``triton_factory(models=["add"], log_format="ISO8601", start=True)``."""
    servers: list[TritonServer] = []

    def make(models: list[str] | None = None, start: bool = True, **kwargs: object) -> TritonServer:
        workdir = tmp_path / f"triton{len(servers)}"
        workdir.mkdir()
        server = TritonServer(copy_models(models, workdir / "models"), workdir=workdir, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        if start:
            server.start()
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def metadata_server():
    """A local ECS task metadata endpoint (v4): (base URL, the paths it was asked)."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            body = json.dumps(ECS_TASK).encode() if self.path == "/v4/abc/task" else b"{}"
            self.send_response(200 if self.path == "/v4/abc/task" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v4/abc", hits
    server.shutdown()


@pytest.fixture
def signed_otlp_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpEndpoint]:
    """A local HTTPS OTLP endpoint that checks SigV4 (us-west-2), with the environment the exporter signs with:
    its test credentials, its CA as AWS_CA_BUNDLE, its region."""
    endpoint = OtlpEndpoint(tmp_path, region="us-west-2")
    for name, value in {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_CA_BUNDLE": str(endpoint.ca_bundle),
        "AWS_REGION": "us-west-2",
    }.items():
        monkeypatch.setenv(name, value)
    yield endpoint
    endpoint.close()


# --- the layers ---------------------------------------------------------------------------------------------
# tests/unit/<package>/ and tests/support/tests/ run in this process on nothing but the code (and local fakes);
# tests/integration/ drives a real Triton or moto's server; tests/deploy/ checks what is deployed (CloudFormation,
# Terraform, Fluent Bit, checkov, the container rehearsal); tests/repo/ the repository as a whole.
# A test that needs a real Triton, moto or the container engine cannot land in a layer that promises none.
_OUTSIDE = {"triton", "triton_factory", "moto"}
_SELF_CONTAINED = ("tests/unit/", "tests/support/tests/")


# Under pytest-xdist (scripts/test.sh: ``-n 6``) a module's tests stay on one worker, so its module-scoped
# fixtures (a Triton, a checkov scan, a built image) are made once, and the modules that drive the container
# engine share one worker, as they share one engine. (xdist's own ``--dist loadgroup`` cannot do this under
# pytest 9: it renames node ids through an attribute pytest no longer reads; the scheduler hook is public.)
_ENGINE = ("tests/deploy/test_rehearsal.py", "tests/deploy/test_triton_side_debian.py")


def work_unit(nodeid: str) -> str:
    """The unit a worker takes whole: the test's module, or the container engine's."""
    path = nodeid.split("::", 1)[0]
    return "container-engine" if path in _ENGINE else path


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pragma: no cover - the dev lock has pytest-xdist; a bare pytest runs serially
    pass
else:

    class _ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling:
        config.option.loadscopereorder = False  # take the units in collection order: the longest first (below)
        return _ByModule(config, log)  # type: ignore[arg-type]


# The units that take minutes (measured on a full run: real Tritons baking rollouts, the engine building images),
# first, so that none of them starts last and runs alone; the many short modules fill in behind them.
LONGEST_FIRST = (
    "tests/integration/modelsync/test_modelsync_rollouts_recovery.py",
    "container-engine",
    "tests/integration/modelsync/test_modelsync_rollouts.py",
    "tests/integration/modelsync/test_modelsync_bundles.py",
    "tests/deploy/test_checkov.py",
    "tests/deploy/test_image_install.py",
    "tests/integration/modelsync/test_modelsync_daemon.py",
    "tests/integration/test_preview_real.py",
    "tests/deploy/test_terraform.py",
)


def run_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the longest units first, each unit's tests in their own order."""
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    return sorted(items, key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        path = item.nodeid.split("::")[0]
        if not path.startswith(_SELF_CONTAINED):
            continue
        needs = sorted(_OUTSIDE & set(getattr(item, "fixturenames", ())))
        needs += sorted({"triton", "rehearsal"} & {m.name for m in item.iter_markers()} - set(needs))
        if needs:
            misplaced.append(f"{item.nodeid} ({', '.join(needs)})")
    items[:] = run_order(items)
    if misplaced:
        raise pytest.UsageError(
            "tests under tests/unit/ and tests/support/tests/ need no real Triton, moto or container engine; "
            "move these to tests/integration/ or tests/deploy/:\n  " + "\n  ".join(misplaced)
        )
