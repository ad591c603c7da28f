"""Shared fixtures: real Triton servers started from the nvidia-pytriton wheel.

``triton`` is one server for the whole session, with every core sample model
(``add``, ``slow``, ``text``, ``fails`` load; ``broken`` fails to load). The LLM
sample models (``vllm_model``, ``tensorrt_llm``) are left out of it on purpose:
tests/test_llm_real.py serves them on its own server, whose traffic it fully
controls. Tests that restart, freeze or unload models use ``triton_factory``
to get their own.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from demo.triton import TritonServer, copy_models, sample_models

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
