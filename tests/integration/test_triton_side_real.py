"""The deep health probe's imports on its every-30-seconds run, against a real Triton."""

from __future__ import annotations

import pytest

from demo.triton import TritonServer
from tests.unit.triton_side.test_triton_side import HEAVY, imported_modules


@pytest.mark.triton
def test_default_probe_run_imports_nothing_heavy(triton: TritonServer) -> None:
    """The healthCheck's run (every 30 s in every task) loads only what it needs."""
    code, names = imported_modules("--triton-url", triton.url, "--ignore", "broken", "--quiet")
    assert code == 0
    assert {"probe", "_cli", "_http", "_jsonparse", "_report", "socket"} <= names
    assert names & HEAVY == set(), sorted(names & HEAVY)  # _infer: the smoke inference's, imported by --smoke only
    code, names = imported_modules("--triton-url", triton.url, "--models", "add", "--smoke", "--quiet")
    assert code == 0 and "_infer" in names and "threading" not in names  # one model: no thread
    port = triton.url.rsplit(":", 1)[1]
    code, names = imported_modules("--triton-url", f"http://localhost:{port}", "--models", "add", "--quiet")
    assert code == 0 and names & HEAVY == set(), sorted(names & HEAVY)  # localhost: no resolver, no idna codec
    code, names = imported_modules("--triton-url", "http://127.0.0.1:9", "--quiet")  # nothing listens on port 9
    assert code == 1 and names & HEAVY == set(), sorted(names & HEAVY)
    # --help is the exception: argparse writes it
    code, names = imported_modules("--help")
    assert code == 0 and "argparse" in names
