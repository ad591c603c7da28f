"""Start a real Triton server on this machine, without a GPU or Docker.

The ``nvidia-pytriton`` wheel ships a complete ``tritonserver`` binary and the
Python backend. This module wires them together as that server needs (the
backend folder copied somewhere writable with the per-Python-version stub put
inside it, since Triton only looks for the stub there; the wheel's libraries on
``LD_LIBRARY_PATH``; the running interpreter's ``bin/`` first on ``PATH``, since
the stub finds its packages such as numpy through the first ``python3`` there) and
gives tests and the demo one object to start, stop, restart, freeze and query
the server. Standard library only, so the health-probe tests can use it too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from triton_http.admin import HEADER as ADMIN_HEADER
from triton_http.admin import RESTRICTED

MODELS_DIR = Path(__file__).parent / "models"
LLM_MODELS = ("tensorrt_llm", "vllm_model")
"""Sample models that publish LLM backends' metric families (demo/llm.py sends them requests)."""
FIRST_RESPONSE_MODELS = ("classify", "stream")
"""Sample models that publish Triton 26.01's first-response histogram themselves (the 2.51 binary does not)."""


class TritonUnavailable(RuntimeError):
    """The Triton binary from nvidia-pytriton is not installed or did not start."""


def _pytriton_root() -> Path:
    try:
        import pytriton
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise TritonUnavailable("nvidia-pytriton is not installed: pip install nvidia-pytriton") from exc
    return Path(pytriton.__file__).parent / "tritonserver"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_backends(workdir: Path) -> Path:
    """Copy the Python backend somewhere writable and put the matching stub in it."""
    root = _pytriton_root()
    dest = workdir / "backends"
    if not (dest / "python" / "triton_python_backend_stub").exists():
        shutil.copytree(root / "backends", dest, dirs_exist_ok=True)
        ver = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
        if not stub.exists():
            raise TritonUnavailable(f"no Python backend stub for Python {ver} in {stub.parent.parent}")
        shutil.copy2(stub, dest / "python" / "triton_python_backend_stub")
    return dest


def server_env() -> dict[str, str]:
    root = _pytriton_root()
    libs = root.parent.parent / "nvidia_pytriton.libs"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return env


def sample_models(llm: bool = True) -> list[str]:
    """The sample models' names (every folder in demo/models), with or without the LLM ones (and the
    first-response stand-ins, which go with them)."""
    extra = (*LLM_MODELS, *FIRST_RESPONSE_MODELS)
    return sorted(d.name for d in MODELS_DIR.iterdir() if d.is_dir() and (llm or d.name not in extra))


def copy_models(names: list[str] | None, dest: Path, src: Path = MODELS_DIR) -> Path:
    """Copy sample models (all, or the named ones) into a fresh repository folder."""
    dest.mkdir(parents=True, exist_ok=True)
    for d in sorted(src.iterdir()):
        if d.is_dir() and (names is None or d.name in names):
            shutil.copytree(d, dest / d.name, dirs_exist_ok=True)
    return dest


def transient_start_failure(error: str, log: str) -> str | None:
    """Why a failed start is worth a second try, or None when it would fail the same way again.

    Two failures come from the moment, not the repository: another process took a picked port between the
    pick and Triton's bind; and the Python backend aborting with ``boost::interprocess::lock_exception``
    while several stubs start at once on a loaded machine (upstream, intermittent:
    triton-inference-server/server#8882; seen here once in a full suite run, on the start of a repository
    with eleven Python stubs)."""
    text = (error + "\n" + log).lower()
    # Triton's words for it: "cannot listen ..." and "Address already in use" from the HTTP and gRPC servers,
    # "failed to start Metrics service: Unavailable - Socket '127.0.0.1:N' already in use" from the metrics one
    # (early in a long log: not in the error's tail).
    if "cannot listen" in text or "already in use" in text:
        return "a port was taken"
    if "exited with" in text and "boost::interprocess::lock_exception" in log:
        return "the Python backend aborted with boost::interprocess::lock_exception"
    return None


RESTRICTED_APIS = ",".join(RESTRICTED)


def restricted_flags(key: str) -> list[str]:
    """Triton's flags that close its admin APIs to every request without the key, over HTTP and gRPC."""
    return [
        f"--http-restricted-api={RESTRICTED_APIS}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={RESTRICTED_APIS}:{ADMIN_HEADER}={key}",
    ]


@dataclass
class TritonServer:
    """One tritonserver process on free loopback ports.

    ``model_repository`` is used as is; tests usually fill a temporary copy with
    :func:`copy_models` so they can add or break models freely.
    """

    model_repository: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="triton-")))
    log_format: str = "default"
    extra_args: list[str] = field(default_factory=list)
    summary_latencies: bool = True
    load_all: bool = True
    # Triton's restricted APIs (--http-restricted-api, --grpc-restricted-protocol) open to this key alone; the
    # helpers below send it (request(admin=False) does not)
    admin_key: str | None = None
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    _log_count: int = 0

    def __post_init__(self) -> None:
        # Each default port is free when picked but picked alone: two can be the same (seen in CI: "cannot
        # listen to HTTP requests and metrics requests at the same address and port").
        while len({self.http_port, self.grpc_port, self.metrics_port}) < 3:
            self.grpc_port, self.metrics_port = free_port(), free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        binary = _pytriton_root() / "bin" / "tritonserver"
        args = [
            str(binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={prepare_backends(self.workdir)}",
            "--model-control-mode=explicit",
            "--exit-on-error=false",
            f"--log-format={self.log_format}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            "--allow-sagemaker=false",
            "--allow-vertex-ai=false",
        ]
        if self.load_all:
            args.append("--load-model=*")
        if self.summary_latencies:
            args += ["--metrics-config", "summary_latencies=true"]
        if self.admin_key:
            args += restricted_flags(self.admin_key)
        return args + list(self.extra_args)

    def start(self, wait: bool = True, timeout: float = 60.0) -> TritonServer:
        for attempt in range(3):
            try:
                return self._start(wait, timeout)
            except TritonUnavailable as exc:
                why = transient_start_failure(str(exc), self.log_text())
                if attempt == 2 or why is None:
                    raise
                print(f"tritonserver did not start ({why}): starting it again", file=sys.stderr)
                self.stop()
                self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
                self.__post_init__()
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self, wait: bool, timeout: float) -> TritonServer:
        self._log_count += 1
        self.log_path = self.workdir / f"triton-{self._log_count}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True
        )
        log.close()
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the HTTP API answers and no model version is still loading."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise TritonUnavailable(f"tritonserver exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                index = self.index()
                if all(v.get("state") not in ("LOADING", "UNLOADING") for v in index):
                    self.metrics_text()  # the metrics server comes up on its own schedule
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise TritonUnavailable(f"tritonserver not ready after {timeout}s:\n{self.log_text()[-3000:]}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.thaw()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def restart(self, timeout: float = 60.0) -> None:
        self.stop()
        self.start(wait=True, timeout=timeout)

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    # --- a tiny HTTP client, enough for tests and the demo ---------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        timeout: float = 10.0,
        headers: dict | None = None,
        admin: bool = True,
    ):
        """Return (status, parsed JSON or text) for one HTTP call to the server (with the admin key, if it has
        one, unless ``admin`` is False)."""
        data = None if body is None else json.dumps(body).encode()
        sent = {ADMIN_HEADER: self.admin_key} if self.admin_key and admin else {}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={**sent, **(headers or {})})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def index(self) -> list[dict]:
        status, body = self.request("POST", "/v2/repository/index", {}, timeout=2)
        if status != 200 or not isinstance(body, list):
            raise ValueError(f"index answered {status}")
        return body

    def load(self, model: str) -> int:
        return self.request("POST", f"/v2/repository/models/{model}/load", {}, timeout=60)[0]

    def unload(self, model: str) -> int:
        status = self.request("POST", f"/v2/repository/models/{model}/unload", {}, timeout=60)[0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not any(v["name"] == model and v["state"] in ("READY", "UNLOADING") for v in self.index()):
                break
            time.sleep(0.05)
        return status

    def infer(
        self, model: str, inputs: list[dict], version: str | None = None, headers: dict | None = None
    ) -> tuple[int, object]:
        """``headers``: e.g. a W3C ``traceparent``, which Triton honours in trace mode."""
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        return self.request("POST", path, {"inputs": inputs}, headers=headers)

    def infer_add(self, n: int = 1, values: tuple[float, ...] = (1.0, 2.0)) -> None:
        """Send ``n`` successful requests to the sample model ``add``."""
        for _ in range(n):
            status, body = self.infer(
                "add", [{"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": list(values)}]
            )
            if status != 200:
                raise AssertionError(f"add answered {status}: {body}")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            return resp.read().decode()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
