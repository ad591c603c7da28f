"""The demo's Triton starts again only after failures that come from the moment, not the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.triton import TritonServer, TritonUnavailable, transient_start_failure

# The tail of a real start that aborted (a full suite run, eleven Python stubs starting at once).
ABORT_LOG = """\
I1202 22:37:15.773967 30744 backend_model_instance.cc:783] "Starting backend thread for twice_0_1 at nice 0..."
I1202 22:37:15.823856 30744 python_be.cc:2387] "TRITONBACKEND_ModelInstanceFinalize: delete instance state"
terminate called after throwing an instance of 'boost::interprocess::lock_exception'
  what():  boost::interprocess::lock_exception
I1202 22:37:15.907168 31213 pb_stub.cc:2145]  Non-graceful termination detected.
"""
FAILED_LOAD_LOG = "E1202 22:37:06.423842 30744 model_lifecycle.cc:642] \"failed to load 'broken' version 1\"\n"


def test_only_a_taken_port_or_the_python_backends_abort_is_transient() -> None:
    assert transient_start_failure("tritonserver exited with -6:\n...", ABORT_LOG) is not None
    assert transient_start_failure("tritonserver exited with 1: Address already in use", "") == "a port was taken"
    metrics_taken = (
        'E1202 22:57:31.517597 3552 main.cc:293] "failed to start Metrics service: Unavailable - Socket '
        "'127.0.0.1:58015' already in use \"\n" + "I1202 ...\n" * 100
    )
    assert transient_start_failure("tritonserver exited with 1:\n...", metrics_taken) == "a port was taken"
    assert transient_start_failure("tritonserver exited with 1:\n...", FAILED_LOAD_LOG) is None
    assert transient_start_failure("tritonserver not ready after 60s:\n...", FAILED_LOAD_LOG) is None
    # Not ready in time (a hang) is not the abort, whatever the log says: starting again would hang again.
    assert transient_start_failure("tritonserver not ready after 60s:\n...", ABORT_LOG) is None


class _Scripted(TritonServer):
    """A server whose starts fail with the given logs, in order, then succeed (no binary is run)."""

    def __init__(self, workdir: Path, logs: list[str]) -> None:
        super().__init__(workdir, workdir=workdir)
        self.logs = logs
        self.starts = 0

    def _start(self, wait: bool, timeout: float) -> TritonServer:
        self.starts += 1
        self.log_path = self.workdir / f"triton-{self.starts}.log"
        if self.logs:
            log = self.logs.pop(0)
            self.log_path.write_text(log)
            raise TritonUnavailable(f"tritonserver exited with -6:\n{log[-3000:]}")
        self.log_path.write_text("ready\n")
        return self


def test_the_python_backends_abort_is_started_again_with_new_ports(tmp_path: Path, capsys) -> None:
    server = _Scripted(tmp_path, [ABORT_LOG])
    ports = (server.http_port, server.grpc_port, server.metrics_port)
    assert server.start() is server and server.starts == 2
    assert (server.http_port, server.grpc_port, server.metrics_port) != ports
    assert "boost::interprocess::lock_exception): starting it again" in capsys.readouterr().err


def test_a_repository_that_fails_is_not_started_again(tmp_path: Path) -> None:
    server = _Scripted(tmp_path, [FAILED_LOAD_LOG])
    with pytest.raises(TritonUnavailable, match="failed to load"):
        server.start()
    assert server.starts == 1


def test_three_aborts_in_a_row_are_reported(tmp_path: Path) -> None:
    server = _Scripted(tmp_path, [ABORT_LOG] * 3)
    with pytest.raises(TritonUnavailable, match="exited with -6"):
        server.start()
    assert server.starts == 3
