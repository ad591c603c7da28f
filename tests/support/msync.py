"""Shared parts of the modelsync tests: moto's server, model archives, a faulty proxy and file system.

Real parts wherever they can run here: moto's server for S3, SQS and SNS (boto3
talks HTTP to it, like to AWS), a real Triton in explicit mode, real files.
What cannot be produced on demand is injected behind modelsync's own small
interfaces: :class:`FaultFileSystem` (ENOSPC on a write, a crash right
before the flip) and :class:`TruncatingProxy` (an S3 body cut short).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import io
import itertools
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from demo.triton import TritonServer, free_port
from modelsync.__main__ import App, build
from modelsync.fsio import LocalFileSystem
from modelsync.reconcile import Report
from modelsync.settings import Settings
from modelsync.store import state_dir
from telemetry.emf_validate import validate
from telemetry.sinks import Output

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
_names = itertools.count()


# --- moto ------------------------------------------------------------------------------------


@dataclass
class Moto:
    url: str

    def client(self, service: str, url: str | None = None) -> Any:
        return boto3.client(
            service,
            endpoint_url=url or self.url,
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"mode": "standard", "max_attempts": 2}),
        )

    def env(self, url: str | None = None) -> dict[str, str]:
        """The environment a modelsync subprocess gets: the standard AWS variables only."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MODELSYNC_", "TRITON_"))}
        return {**keep, **CREDENTIALS, "AWS_ENDPOINT_URL": url or self.url}


@pytest.fixture(scope="session")
def moto() -> Iterator[Moto]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield Moto(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


def unique(prefix: str) -> str:
    return f"{prefix}{os.getpid() % 10000}x{next(_names)}"


def new_bucket(moto: Moto, versioned: bool = True) -> str:
    name = unique("models-")
    s3 = moto.client("s3")
    s3.create_bucket(Bucket=name)
    if versioned:
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


# --- model archives ----------------------------------------------------------------------------

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [{{ kind: KIND_CPU }}]
"""

MODEL_PY = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x + {add}).astype(np.float32))]))
        return out
"""

BROKEN_PY = 'raise RuntimeError("boom: this build does not load")\n'


def model_files(name: str, add: float = 1.0, broken: bool = False, version: str = "1") -> dict[str, bytes]:
    return {
        f"{name}/config.pbtxt": CONFIG.format(name=name).encode(),
        f"{name}/{version}/model.py": (BROKEN_PY if broken else MODEL_PY.format(add=add)).encode(),
    }


def make_zip(
    files: dict[str, bytes],
    symlinks: dict[str, str] | None = None,
    raw: list[zipfile.ZipInfo] | None = None,
    compression: int = zipfile.ZIP_DEFLATED,
) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(
    moto: Moto, bucket: str, key: str, data: bytes, digest: str | None = "auto", tag: str | None = None
) -> dict[str, Any]:
    """PUT like the docs' ``aws s3 cp --metadata sha256=...``; ``digest=None`` for no metadata."""
    s3 = moto.client("s3")
    meta = {} if digest is None else {"sha256": sha(data) if digest == "auto" else digest}
    kwargs: dict[str, Any] = {"Metadata": meta}
    if tag is not None:
        kwargs["Tagging"] = f"sha256={tag}"
    return s3.put_object(Bucket=bucket, Key=key, Body=data, **kwargs)


# --- the daemon's parts, in process ----------------------------------------------------------


@dataclass
class Env:
    """One test's world: bucket, repository and store, the Triton serving the repository."""

    moto: Moto
    triton: TritonServer
    bucket: str
    root: Path
    emf: Path
    s3_url: str = ""
    fs: Any = field(default_factory=LocalFileSystem)

    @property
    def repository(self) -> Path:
        return self.triton.model_repository

    @property
    def store(self) -> Path:
        return self.root / "store"

    def settings(self, **kw: Any) -> Settings:
        base = Settings(
            bucket=self.bucket,
            repository=self.repository,
            store=self.store,
            triton_url=self.triton.url,
            interval=5.0,
            output=Output("file", path=str(self.emf)),
            min_free_bytes=0,
            hash_tag_wait=0.0,
            load_timeout=60.0,
            host="test-host",
        )
        return replace(base, **kw)

    def app(self, **kw: Any) -> App:
        fs = kw.pop("fs", self.fs)
        return build(
            self.settings(**kw),
            fs=fs,
            s3_client=self.moto.client("s3", self.s3_url or None),
            sqs_client=self.moto.client("sqs"),
            sns_client=self.moto.client("sns"),
        )

    def sync(self, **kw: Any) -> Report:
        app = self.app(**kw)
        try:
            app.syncer.recover()
            return app.syncer.reconcile_all()
        finally:
            app.close()

    def docs(self) -> list[dict[str, Any]]:
        """Every EMF line written so far, each checked by the independent validator."""
        if not self.emf.exists():
            return []
        out = []
        for line in self.emf.read_bytes().splitlines():
            errors = validate(line)
            assert errors == [], (errors, line[:300])
            out.append(json.loads(line))
        return out

    def attempts(self, model: str) -> list[dict[str, Any]]:
        return [d for d in self.docs() if d.get("model") == model and "SyncAttempts" in d]

    def link(self, model: str) -> str:
        return os.readlink(self.repository / model)

    def infer(self, model: str, value: float = 1.0) -> float:
        status, body = self.triton.infer(
            model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [value]}]
        )
        assert status == 200, body
        return body["outputs"][0]["data"][0]

    def files_outside_store(self) -> set[str]:
        """Every path under the test root that is neither in the store nor the EMF file (for escape checks)."""
        out = set()
        for p in self.root.rglob("*"):
            rel = p.relative_to(self.root).as_posix()
            if not rel.startswith("store") and p != self.emf:
                out.add(rel)
        return out


def module_triton(name: str) -> Any:
    """A module-scoped fixture: one Triton over a repository of its own, for a test module's Envs.

    In the module: ``served = module_triton("bundles")``, and an ``env`` fixture returning :func:`module_env`."""

    @pytest.fixture(scope="module")
    def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, TritonServer]]:
        root = tmp_path_factory.mktemp(name)
        (root / "repo").mkdir()
        (root / "triton").mkdir()
        server = TritonServer(root / "repo", workdir=root / "triton")
        server.start()
        try:
            yield root, server
        finally:
            server.stop()

    return served


def module_env(moto: Moto, served: tuple[Path, TritonServer], request: pytest.FixtureRequest) -> Env:
    """An Env on the module's Triton (``served``, from :func:`module_triton`) with a bucket of its own."""
    root, server = served
    return Env(moto, server, new_bucket(moto), root, root / f"emf-{request.node.name[:40]}.log")


def leftovers(store: Path, repository: Path) -> list[str]:
    """What a sync left in staging: files or folders in the store's staging folders, temporary links beside
    the repository (an empty staging folder of a repository is its own, not a leftover)."""
    staged = [p for d in (store / ".staging").glob("*") for p in (d.iterdir() if d.is_dir() else [d])]
    links = list(state_dir(repository).glob("link-*"))
    return sorted(str(p) for p in staged + links)


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s")


# --- faults -----------------------------------------------------------------------------------


class _FaultyFile(io.RawIOBase):
    def __init__(self, inner: Any, budget: list[int]) -> None:
        self.inner = inner
        self.budget = budget

    def write(self, data: Any) -> int:
        if self.budget[0] < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget[0] -= len(data)
        return self.inner.write(data)

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()

    def close(self) -> None:
        if not self.closed:
            try:
                super().close()  # flushes first, while the real file is still open
            finally:
                self.inner.close()

    def writable(self) -> bool:
        return True


class FaultFileSystem(LocalFileSystem):
    """The real file system, with one fault armed: ENOSPC once ``write_budget`` bytes were written,
    a reported free space, or a crash (``os._exit``) right before the link flip."""

    def __init__(
        self, write_budget: int | None = None, free: int | None = None, crash_before_flip: bool = False
    ) -> None:
        self.budget = [write_budget if write_budget is not None else 1 << 62]
        self.free = free
        self.crash_before_flip = crash_before_flip

    def create(self, path: Path) -> Any:
        return _FaultyFile(super().create(path), self.budget)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self.budget[0] < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget[0] -= len(data)
        return super().pwrite(fd, data, offset)

    def free_bytes(self, path: Path) -> int:
        return self.free if self.free is not None else super().free_bytes(path)

    def replace(self, src: Path, dst: Path) -> None:
        if self.crash_before_flip and src.is_symlink():
            os._exit(137)  # the process dies between extract and flip: no cleanup runs
        super().replace(src, dst)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client gone mid-answer (the point of a cut or a killed daemon): no traceback on stderr."""


class TruncatingProxy:
    """An HTTP proxy in front of moto that logs every request and injects faults into GETs of chosen keys.

    ``cut``: bodies cut after ``keep`` bytes (status line and headers,
    Content-Length included, as moto sent them; then the connection closes
    early, the way a reset looks to the client). ``corrupt``: one byte of
    the body flipped (same length). ``fail``: that many GETs of any key
    answered 503 first. ``hold``: GETs of those keys from byte
    ``hold_from`` on wait until :meth:`release` (a transfer frozen mid-way, for a crash).
    ``log``: (method, key path, Range header, status, body bytes sent).
    """

    def __init__(self, upstream: str, keep: int = 100) -> None:
        self.upstream = upstream.split("//", 1)[1]
        self.keep = keep
        self.cut: set[str] = set()
        self.corrupt: set[str] = set()
        self.corrupt_directory: set[str] = set()  # keys whose suffix-range reads get a byte flipped:
        self.directory_fault = "crc"  # the last central entry's CRC, or "signature" (the first header's)
        self.cuts = 0
        self.fail = 0
        self.hold: set[str] = set()
        self.hold_from = 0
        self.held = 0
        self.log: list[tuple[str, str, str, int, int]] = []
        self._gate = threading.Event()
        self._count = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path.split("?")[0]
                ranged = self.headers.get("Range") or ""
                # A suffix range ("bytes=-N": a zip's directory read from its end, modelsync/unzip.py) is
                # never faulted: the faults here are the body's parts'.
                suffix = ranged.startswith("bytes=-")
                start = int(ranged[6:].split("-")[0]) if ranged.startswith("bytes=") and not suffix else 0
                faulted = self.command == "GET" and not suffix
                if faulted and start >= proxy.hold_from and any(k in path for k in proxy.hold):
                    with proxy._count:
                        proxy.held += 1
                    proxy._gate.wait(60)
                if faulted and proxy.fail > 0:
                    with proxy._count:
                        proxy.fail -= 1
                    proxy.log.append((self.command, path, ranged, 503, 0))
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                cut = faulted and any(k in path for k in proxy.cut)
                if suffix and data and any(k in path for k in proxy.corrupt_directory):
                    # the last central entry's CRC-32, or the first central header's signature (unreadable)
                    crc = proxy.directory_fault == "crc"
                    at = data.rfind(b"PK\x01\x02") + 16 if crc else data.find(b"PK\x01\x02")
                    data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
                if faulted and data and any(k in path for k in proxy.corrupt):
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                if cut:
                    self.send_header("Connection", "close")
                self.end_headers()
                if cut and len(data) > proxy.keep:
                    proxy.cuts += 1
                    proxy.log.append((self.command, path, ranged, resp.status, proxy.keep))
                    self.wfile.write(data[: proxy.keep])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                proxy.log.append((self.command, path, ranged, resp.status, len(data)))
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def gets(self, key: str) -> list[tuple[str, str, str, int, int]]:
        """The logged GETs of one key."""
        return [e for e in self.log if e[0] == "GET" and e[1].endswith("/" + key)]

    def release(self) -> None:
        self._gate.set()

    def __enter__(self) -> TruncatingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


# --- a fleet: several hosts, each a real Triton with its daemon, on one bucket and topic -------------------

ROLLOUT_PY = """import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            {body}
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x + {add}).astype(np.float32))]))
        return out
"""
BODIES = {
    "ok": "pass",
    "fail": 'raise RuntimeError("this build fails every request")',  # Triton counts it: failure, reason BACKEND
    "slow": "time.sleep(0.05)",  # 20x and more the python backend's few milliseconds
}


def rollout_files(name: str, add: float, behaviour: str = "ok") -> dict[str, bytes]:
    """A model answering x + ``add`` (the answer names the artifact that served it), well or badly."""
    return {
        f"{name}/config.pbtxt": CONFIG.format(name=name).encode(),
        f"{name}/1/model.py": ROLLOUT_PY.format(add=add, body=BODIES[behaviour]).encode(),
    }


def s3_event(bucket: str, key: str, version_id: str = "") -> str:
    """An S3 ObjectCreated notification as S3 publishes it to a topic."""
    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.1",
                    "eventSource": "aws:s3",
                    "eventTime": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
                    "eventName": "ObjectCreated:Put",
                    "s3": {
                        "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
                        "object": {"key": key, "versionId": version_id, "sequencer": f"{time.time_ns():X}"},
                    },
                }
            ]
        }
    )


class Traffic(threading.Thread):
    """Requests to one model of one host, one after another with ``gap`` seconds between: (time, status, answer).

    The answer (x + add) names the artifact that served the request; a failed request has no answer (NaN)."""

    def __init__(self, triton: TritonServer, model: str, gap: float = 0.02) -> None:
        super().__init__(daemon=True, name=f"traffic-{model}")
        self.triton = triton
        self.model = model
        self.gap = gap
        self.results: list[tuple[float, int, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                status, body = self.triton.infer(
                    self.model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]
                )
                answer = float(body["outputs"][0]["data"][0]) if status == 200 else float("nan")
            except (OSError, ValueError, KeyError, TypeError):
                status, answer = 0, float("nan")
            self.results.append((time.monotonic(), status, answer))
            self._halt.wait(self.gap)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def failures(self) -> int:
        return sum(1 for _, status, _ in self.results if status != 200)

    def answers(self) -> set[float]:
        return {a for _, status, a in self.results if status == 200}


@dataclass
class Host:
    name: str
    root: Path
    triton: TritonServer
    proc: Any = None  # the daemon (subprocess.Popen), None when not running
    traffic: dict[str, Traffic] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.root / "modelsync.log"

    @property
    def emf(self) -> Path:
        return self.root / "emf.log"

    def answer(self, model: str) -> float:
        try:
            status, body = self.triton.infer(
                model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]
            )
        except OSError:
            return float("nan")
        return float(body["outputs"][0]["data"][0]) if status == 200 else float("nan")

    def lines(self) -> list[dict[str, Any]]:
        """The daemon's JSON log lines (every run of it: the file is appended to)."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def decisions(self, model: str) -> list[dict[str, Any]]:
        """This host's rollout decisions for ``model`` (one JSON line each: verdict, evidence)."""
        return [d for d in self.lines() if d.get("model") == model and "verdict" in d]


class Fleet:
    """Hosts with a real Triton and a ``python -m modelsync`` each, on one bucket and one SNS topic, with safe
    rollouts on. Uploads are announced on the topic as S3 would (after the PUT); the bucket's own
    notifications carry the rollout state's writes (under ``.modelsync/``) to the same topic."""

    def __init__(self, moto: Moto, root: Path, hosts: int, **flags: Any) -> None:
        self.moto = moto
        self.root = root
        self.bucket = new_bucket(moto)
        self.topic = moto.client("sns").create_topic(Name=unique("rollout-events-"))["TopicArn"]
        self.queue_prefix = unique("ro-")
        moto.client("s3").put_bucket_notification_configuration(
            Bucket=self.bucket,
            NotificationConfiguration={
                "TopicConfigurations": [
                    {
                        "TopicArn": self.topic,
                        "Events": ["s3:ObjectCreated:*"],
                        "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": ".modelsync/"}]}},
                    }
                ]
            },
        )
        self.flags = {
            "canary-fraction": "0.25",
            "bake-seconds": "5",
            "bake-min-requests": "20",
            # The slow build adds 50 ms to the Python backend's 1 to 4 ms (13x and more) and the others fail;
            # 6 keeps a loaded 2-core machine's noise (a canary's few seconds against a control's: 3.45x seen
            # in a cold full run, where 3 rejected a good build) from rejecting a good one.
            "max-latency-ratio": "6",
            "interval": "300",
            **{k.replace("_", "-"): str(v) for k, v in flags.items()},
        }
        self.hosts: list[Host] = []
        for _i in range(hosts):
            self.add_host(start=False)

    def add_host(self, start: bool = True) -> Host:
        name = f"host-{len(self.hosts)}"
        hroot = self.root / name
        (hroot / "repo").mkdir(parents=True)
        (hroot / "triton").mkdir()
        triton = TritonServer(hroot / "repo", workdir=hroot / "triton")
        triton.start()
        host = Host(name, hroot, triton)
        self.hosts.append(host)
        if start:
            self.start(host)
        return host

    def start(self, host: Host) -> None:
        args = [
            sys.executable, "-m", "modelsync",
            "--bucket", self.bucket,
            "--repository", str(host.triton.model_repository),
            "--store", str(host.root / "store"),
            "--triton-url", host.triton.url,
            "--triton-metrics-url", host.triton.metrics_url,
            "--output", f"file:{host.emf}",
            "--min-free-bytes", "0",
            "--hash-tag-wait", "0",
            "--load-timeout", "60",
            "--host-id", host.name,
            "--topic-arn", self.topic,
            "--queue-name-prefix", self.queue_prefix,
            *(a for k, v in self.flags.items() for a in (f"--{k}", v)),
        ]  # fmt: skip
        root = Path(__file__).resolve().parent.parent.parent
        with open(host.log, "ab") as err:
            host.proc = subprocess.Popen(args, cwd=root, env=self.moto.env(), stdout=subprocess.DEVNULL, stderr=err)

    def start_all(self) -> None:
        for host in self.hosts:
            if host.proc is None:
                self.start(host)
        wait_for(lambda: len(self.queues()) >= len(self.hosts), timeout=90, step=0.3)

    def queues(self) -> list[str]:
        return self.moto.client("sqs").list_queues(QueueNamePrefix=self.queue_prefix).get("QueueUrls", [])

    def kill(self, host: Host) -> None:
        """SIGKILL: nothing of the daemon runs again (its queue and rollout entries stay behind)."""
        if host.proc is not None:
            host.proc.kill()
            host.proc.wait(10)
            host.proc = None

    def stop(self, host: Host) -> None:
        if host.proc is not None:
            host.proc.send_signal(signal.SIGTERM)
            try:
                host.proc.wait(30)
            except Exception:
                host.proc.kill()
                host.proc.wait(10)
            host.proc = None

    def upload(self, model: str, files: dict[str, bytes]) -> dict[str, Any]:
        """PUT ``<model>.zip`` with its sha256, then the notification S3 sends the topic."""
        put = upload(self.moto, self.bucket, f"{model}.zip", make_zip(files))
        self.moto.client("sns").publish(
            TopicArn=self.topic, Message=s3_event(self.bucket, f"{model}.zip", put.get("VersionId", ""))
        )
        return put

    def upload_directory(self, model: str, files: dict[str, bytes]) -> dict[str, Any]:
        """A directory model's files, its manifest last, then the manifest's notification."""
        put = upload_directory(self.moto, self.bucket, model, files)
        key = f"{model}/manifest.json"
        self.moto.client("sns").publish(
            TopicArn=self.topic, Message=s3_event(self.bucket, key, put.get("VersionId", ""))
        )
        return put

    def answers(self, model: str) -> list[float]:
        return [h.answer(model) for h in self.hosts]

    def traffic(self, model: str, gap: float = 0.02) -> None:
        for h in self.hosts:
            t = Traffic(h.triton, model, gap)
            h.traffic[model] = t
            t.start()

    def stop_traffic(self, model: str) -> dict[str, Traffic]:
        out = {}
        for h in self.hosts:
            t = h.traffic.pop(model, None)
            if t is not None:
                t.stop()
                out[h.name] = t
        return out

    def state(self, model: str) -> dict[str, Any] | None:
        try:
            body = self.moto.client("s3").get_object(Bucket=self.bucket, Key=f".modelsync/rollouts/{model}.json")
        except Exception:
            return None
        return json.loads(body["Body"].read())

    def close(self) -> None:
        for h in self.hosts:
            for t in h.traffic.values():
                t.stop()
            self.stop(h)
        for h in self.hosts:
            h.triton.stop()


def rollout_bundle(name: str, add: float, behaviour: str = "ok") -> dict[str, bytes]:
    """A bundle: ensemble ``name`` running ``<name>-pre`` (adds ``add``) then ``<name>-post`` (adds 10 x ``add``,
    behaving as ``behaviour``); the answer to 0 is 11 x ``add`` when both steps are of one upload."""
    pre, post = f"{name}-pre", f"{name}-post"
    files = {**rollout_files(pre, add), **rollout_files(post, 10 * add, behaviour)}
    files[f"{name}/config.pbtxt"] = ROLLOUT_ENSEMBLE.format(name=name, pre=pre, post=post).encode()
    files[f"{name}/1/"] = b""
    return files


ROLLOUT_ENSEMBLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{pre}" model_version: -1
     input_map {{ key: "INPUT0" value: "INPUT0" }} output_map {{ key: "OUTPUT0" value: "t1" }} }},
  {{ model_name: "{post}" model_version: -1
     input_map {{ key: "INPUT0" value: "t1" }} output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} }}
] }}
"""


def upload_directory(moto: Moto, bucket: str, model: str, files: dict[str, bytes]) -> dict[str, Any]:
    """A directory model: each file under ``<model>/``, then ``<model>/manifest.json`` with its sha256 last."""
    s3 = moto.client("s3")
    entries = []
    for name, data in sorted(files.items()):
        rel = name.split("/", 1)[1]
        s3.put_object(Bucket=bucket, Key=f"{model}/{rel}", Body=data)
        entries.append({"path": rel, "size": len(data), "sha256": sha(data)})
    manifest = json.dumps({"files": entries}).encode()
    return upload(moto, bucket, f"{model}/manifest.json", manifest)
