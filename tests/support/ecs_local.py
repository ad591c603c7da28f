"""Run an ECS task definition on a local Docker engine, with ECS's semantics: the container rehearsal.

Why: the task definitions (deploy/*.json, the stack's) are otherwise only checked as data.
Running them on real images catches what data checks cannot: a URL that does not connect
from inside the container that is configured with it, a health check that never passes,
a dependency that never resolves, an essential container that exits. The input is a task
definition in the ECS API's shape (lowerCamelCase, as ``RegisterTaskDefinition`` takes it);
nothing here knows our containers, so a redesigned task definition runs unchanged.

Modelled, from the task definition:

* ``networkMode``: ``awsvpc`` (a pause container on the task network holds the task's
  address; every container joins its namespace with ``container:<pause>``), ``host``,
  ``bridge`` (the default bridge; ``portMappings`` published, ``hostPort`` 0 = dynamic);
* ``volumes``: ``host.sourcePath`` remapped under ``Options.host_root`` (the test owns that
  folder; a missing directory is created by Docker, owned by root, as on an ECS instance); a
  volume without a host path is a Docker volume scoped to the task (created empty and owned
  by root; like ECS's, Docker copies the image's content at the mount path into it on first
  use), removed at stop; ``dockerVolumeConfiguration`` as a Docker volume; ``volumesFrom``;
* containers start in ``dependsOn`` order: START, COMPLETE, SUCCESS, HEALTHY, bounded by the
  container's ``startTimeout`` (else ``Options.start_timeout``); a container that logs to
  ``awsfirelens`` implicitly depends on the FireLens container (START), which stops last;
* ``healthCheck`` as Docker's health check with the same ``command`` (exec or shell form),
  ``timeout``, ``retries`` and ``startPeriod``; only ``interval`` is shortened
  (``Options.health_interval``) so tests do not wait 30 s between probes;
* ``essential``: when one exits (and is not restarted) the task stops; ``restartPolicy``
  (``enabled``, ``ignoredExitCodes``, ``restartAttemptPeriod``, scalable for tests);
* ``user``, ``readonlyRootFilesystem``, ``workingDirectory``, ``environment``, ``command``,
  ``entryPoint``, ``stopTimeout`` (``docker stop -t``, default 30 s as the agent's),
  ``mountPoints`` (``readOnly``), ``linuxParameters`` (``initProcessEnabled`` as
  ``--init``, ``sharedMemorySize``, ``capabilities``, ``tmpfs``, ``devices``), ``ulimits``
  (any limit above this host's hard limit is lowered to it and recorded in ``Task.notes``:
  the VMs here cap ``memlock``), ``cpu`` (CPU shares), ``memory`` / ``memoryReservation``,
  ``privileged``, ``dockerLabels``;
* ``secrets``: each ``valueFrom`` is looked up in ``Options.secrets`` (what Secrets Manager holds) and set as
  the variable ``name``; one that is not there fails the task's start, as ECS's does
  (``ResourceInitializationError: unable to pull secrets``);
* what the agent adds to each container: ``ECS_CONTAINER_METADATA_URI_V4`` pointing at a
  small local task-metadata server (``/`` and ``/task``), ``AWS_EXECUTION_ENV``.

Not modelled (each use is recorded in ``Task.notes``): GPUs (with ``Options.fake_gpu`` a
container asking for GPUs gets placeholder device nodes and a fake ``nvidia-smi``, so a
start-up check passes; nothing computes, and no NVML library is mounted),
``environmentFiles``, log drivers and their options (logs are read with ``docker logs``),
FireLens options (the router's image runs with its own config), EFS, IAM roles and the
credentials endpoint (a test passes AWS settings explicitly with ``Options.environment``),
the agent's introspection endpoint, security groups, load balancers, service discovery,
placement. Images are not pulled: ``Options.images`` maps each image's repository name to a
local one.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import resource
import secrets
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NS = 1_000_000_000
DEFAULT_STOP_TIMEOUT = 30  # the agent's ECS_CONTAINER_STOP_TIMEOUT default
HEALTH_DEFAULTS = {"interval": 30, "timeout": 5, "retries": 3, "startPeriod": 0}
RESTART_PERIOD_DEFAULT = 300
LABEL = "rehearsal.task"
_RLIMIT_NAMES = (
    "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice",
    "nofile", "nproc", "rss", "rtprio", "rttime", "sigpending", "stack",
)  # fmt: skip
ULIMITS = {
    n: getattr(resource, f"RLIMIT_{n.upper()}") for n in _RLIMIT_NAMES if hasattr(resource, "RLIMIT_" + n.upper())
}
ENDED = ("exited", "dead", "removed")


class TaskFailed(RuntimeError):
    """The task could not start (a dependency never resolved, an essential container exited...)."""


class NotModelled(ValueError):
    """The task definition uses something the rehearsal cannot run (EFS, an unknown network mode)."""


class DockerError(RuntimeError):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# --- the engine -----------------------------------------------------------------------------


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


@dataclass(frozen=True)
class DockerEngine:
    """One Docker daemon: its Engine API over the unix socket, and the matching CLI.

    The API creates containers (so an exec-form health check and an entry point with
    arguments stay exactly as written) and reads their state; the CLI builds, execs and
    reads logs.
    """

    socket_path: Path
    cli_path: str = "docker"
    api_version: str = "v1.41"  # Docker 20.10, Debian 12's docker.io

    def api(self, method: str, path: str, body: object | None = None, timeout: float = 60.0) -> Any:
        conn = _UnixConnection(str(self.socket_path), timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, f"/{self.api_version}{path}", body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        if resp.status >= 400:
            raise DockerError(f"{method} {path}: {resp.status} {raw.decode(errors='replace').strip()}", resp.status)
        return json.loads(raw) if raw.strip() else None

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.socket_path}", "DOCKER_BUILDKIT": "0"}

    def cli(self, *args: str, timeout: float = 900.0, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run([self.cli_path, *args], env=self.env(), capture_output=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise DockerError(
                f"docker {shlex.join(args)[:300]} exited {proc.returncode}: "
                f"{(proc.stdout + proc.stderr).decode(errors='replace')[-3000:]}",
                proc.returncode,
            )
        return proc

    def inspect(self, ref: str) -> dict[str, Any] | None:
        try:
            return self.api("GET", f"/containers/{ref}/json")  # type: ignore[no-any-return]
        except DockerError as exc:
            if exc.code == 404:
                return None
            raise


# --- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeGpu:
    """What a container asking for GPUs gets: placeholder device nodes and this ``nvidia-smi``.

    No GPU is modelled: ``/dev/nvidiactl`` and ``/dev/nvidiaN`` are ``/dev/null`` under
    those names (enough for a check that lists ``/dev``), and ``nvidia-smi`` (bound over
    ``/usr/bin/nvidia-smi`` where the NVIDIA runtime puts the real one) prints canned
    answers: ``query`` for ``--query-gpu=...``, ``table`` otherwise. No NVML library.
    """

    query: str
    table: str

    def script(self) -> str:
        return (
            "#!/bin/sh\n# Rehearsal fake: no GPU is modelled, these are canned answers.\n"
            "case \"$*\" in\n*--query-gpu*) cat <<'EOF'\n"
            + self.query.rstrip("\n")
            + "\nEOF\n;;\n*) cat <<'EOF'\n"
            + self.table.rstrip("\n")
            + "\nEOF\n;;\nesac\n"
        )


@dataclass(frozen=True)
class Options:
    """How to run a task here: everything a task definition cannot say."""

    images: Mapping[str, str]
    """Image repository name (``triton-server`` in ``<registry>/triton-server:<tag>``) or full image -> local image."""
    host_root: Path
    """``host.sourcePath`` ``/a/b`` becomes ``host_root/a/b``; the task's own files go under ``host_root/.tasks``."""
    network: str = "rehearsal-tasks"
    """The user network awsvpc tasks get their address on (link-local, see scripts/rehearsal-engine.sh)."""
    pause_image: str = "rehearsal/bookworm-minbase"
    health_interval: float = 1.0
    start_timeout: float = 180.0
    restart_period_scale: float = 1.0
    """``restartAttemptPeriod`` times this (ECS's minimum is 60 s: tests shorten it explicitly)."""
    environment: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Per container name, variables added to (or replacing) its ``environment``: what IAM or AWS would supply."""
    fake_gpu: FakeGpu | None = None
    metadata_host: str | None = None
    """Address the task-metadata server listens on, reachable from tasks (the task network's gateway)."""
    cluster: str = "rehearsal"
    secrets: Mapping[str, str] = field(default_factory=dict)
    """A secret's ``valueFrom`` (an ARN) -> its value: what Secrets Manager would hand the agent."""


# --- task-definition helpers ------------------------------------------------------------------


def repository(image: str) -> str:
    """``123.dkr.ecr.r.amazonaws.com/team/triton-server:1.2`` -> ``team/triton-server`` (digests too)."""
    name = image.split("@", 1)[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        name = rest
    head, _, last = name.rpartition("/")
    last = last.split(":", 1)[0]
    return f"{head}/{last}" if head else last


def env_dict(container: Mapping[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("environment", [])}


def configured_urls(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment values that are http(s):// or tcp:// URLs, by variable name."""
    return {k: v for k, v in env_dict(container).items() if re.match(r"^(https?|tcp)://", v)}


def firelens_container(td: Mapping[str, Any]) -> str | None:
    names = [c["name"] for c in td["containerDefinitions"] if c.get("firelensConfiguration")]
    return names[0] if names else None


def dependencies(container: Mapping[str, Any], firelens: str | None) -> list[tuple[str, str]]:
    """(container, condition) pairs this container waits for, the implicit FireLens one included."""
    deps = [(d["containerName"], d["condition"]) for d in container.get("dependsOn", [])]
    log = container.get("logConfiguration") or {}
    implicit = firelens and log.get("logDriver") == "awsfirelens" and container["name"] != firelens
    if implicit and firelens not in {name for name, _ in deps}:
        deps.append((str(firelens), "START"))
    return deps


def start_order(td: Mapping[str, Any]) -> list[str]:
    """Containers in an order that satisfies every dependency (ValueError on a cycle or an unknown name)."""
    firelens = firelens_container(td)
    defs = {c["name"]: c for c in td["containerDefinitions"]}
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise ValueError(f"dependsOn cycle: {' -> '.join((*path, name))}")
        if name not in defs:
            raise ValueError(f"dependsOn names unknown container {name!r}")
        for dep, _ in dependencies(defs[name], firelens):
            visit(dep, (*path, name))
        order.append(name)

    for name in defs:
        visit(name, ())
    return order


# --- the task ---------------------------------------------------------------------------------


@dataclass
class State:
    status: str  # created, running, exited, dead, removed
    exit_code: int | None
    health: str | None  # starting, healthy, unhealthy; None without a health check
    started_at: float | None
    oom_killed: bool = False
    finished_at: float | None = None


@dataclass
class ExecResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Task:
    """A started task: its containers by task-definition name, and what happened to them."""

    engine: DockerEngine
    definition: dict[str, Any]
    options: Options
    name: str
    workdir: Path
    ids: dict[str, str] = field(default_factory=dict)
    pause_id: str | None = None
    volumes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the rehearsal changed or left out for this task (lowered ulimits, log drivers...)."""
    events: list[str] = field(default_factory=list)
    """What the supervisor saw and did: starts, exits, restarts, stops."""
    restarts: dict[str, int] = field(default_factory=dict)
    stopped_reason: str | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    stopping: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    monitor: threading.Thread | None = None
    metadata: ThreadingHTTPServer | None = None
    final_logs: dict[str, str] = field(default_factory=dict)

    @property
    def containers(self) -> dict[str, dict[str, Any]]:
        return {c["name"]: c for c in self.definition["containerDefinitions"]}

    @property
    def network_mode(self) -> str:
        return str(self.definition.get("networkMode", "bridge"))

    def container_name(self, name: str) -> str:
        return f"{self.name}-{name}"

    # -- reading -----------------------------------------------------------------------------

    def state(self, name: str) -> State | None:
        """The container's state; None before it is created."""
        if name not in self.ids:
            return None
        info = self.engine.inspect(self.ids[name])
        if info is None:
            return State("removed", None, None, None)
        st = info["State"]
        started, finished = st.get("StartedAt") or "", st.get("FinishedAt") or ""
        return State(
            status=st["Status"],
            exit_code=st["ExitCode"] if st["Status"] in ("exited", "dead") else None,
            health=(st.get("Health") or {}).get("Status"),
            started_at=docker_time(started) if started and not started.startswith("0001") else None,
            oom_killed=bool(st.get("OOMKilled")),
            finished_at=docker_time(finished) if finished and not finished.startswith("0001") else None,
        )

    def health(self, name: str) -> str | None:
        """Docker's health status of the container: starting, healthy, unhealthy, or None."""
        state = self.state(name)
        return state.health if state else None

    def health_log(self, name: str) -> list[dict[str, Any]]:
        """The last health-check runs (Start, End, ExitCode, Output), as Docker keeps them."""
        info = self.engine.inspect(self.ids[name]) or {}
        return list(((info.get("State") or {}).get("Health") or {}).get("Log") or [])

    def logs(self, name: str) -> str:
        """stdout then stderr of the container (kept after the task stops)."""
        if name in self.final_logs:
            return self.final_logs[name]
        return self._read_logs(self.ids[name])

    def _read_logs(self, cid: str) -> str:
        proc = self.engine.cli("logs", cid, check=False)
        return proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")

    def ip(self) -> str:
        """The task's address: the pause container's (awsvpc), loopback (host), else the first container's."""
        if self.network_mode == "host":
            return "127.0.0.1"
        ref = self.pause_id or next(iter(self.ids.values()))
        nets = (self.engine.inspect(ref) or {}).get("NetworkSettings", {}).get("Networks", {})
        for net in nets.values():
            if net.get("IPAddress"):
                return str(net["IPAddress"])
        raise TaskFailed(f"{self.name}: no address (networks: {list(nets)})")

    def host_port(self, name: str, container_port: int, protocol: str = "tcp") -> int:
        """Bridge mode: the host port Docker published ``container_port`` on."""
        info = self.engine.inspect(self.ids[name]) or {}
        bound = (info.get("NetworkSettings", {}).get("Ports") or {}).get(f"{container_port}/{protocol}") or []
        if not bound:
            raise KeyError(f"{name}: {container_port}/{protocol} is not published")
        return int(bound[0]["HostPort"])

    def exec(self, name: str, argv: Sequence[str], user: str | None = None, timeout: float = 60.0) -> ExecResult:
        """Run a command inside the running container, as its configured user unless ``user`` is given."""
        args = ["exec", *(["--user", user] if user else []), self.ids[name], *argv]
        proc = self.engine.cli(*args, check=False, timeout=timeout)
        return ExecResult(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))

    def connect(self, name: str, url: str, timeout: float = 5.0) -> dict[str, Any]:
        """Open ``url`` (http, https, tcp) from inside the container, with the container's own ``python3``.

        Returns ``{"ok": bool, "status": HTTP status or None, "error": "..." or None}``; any
        HTTP answer counts as connected (a 404 still proves the address reaches a server).
        """
        res = self.exec(name, ["python3", "-c", _CONNECT_PY, url, str(timeout)], timeout=timeout + 30)
        try:
            return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
        except (ValueError, IndexError):
            return {"ok": False, "status": None, "error": f"exec exited {res.returncode}: {res.stderr.strip()[-500:]}"}

    def wait_for(self, name: str, health: str | None = None, exited: bool = False, timeout: float = 120.0) -> State:
        """Wait until the container has the given health (or has exited); TaskFailed with its logs if it does not."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state(name)
            if state is not None:
                if health is not None and state.health == health:
                    return state
                if state.status in ENDED:
                    if exited:
                        return state
                    if health is not None:
                        raise TaskFailed(f"{name} exited {state.exit_code} before {health}:\n{self.logs(name)[-3000:]}")
            if time.monotonic() > deadline:
                log = self.health_log(name)[-2:] if name in self.ids else []
                raise TaskFailed(
                    f"{name}: not {health or 'exited'} after {timeout:g} s ({state}); health log {log}\n"
                    + (self.logs(name)[-3000:] if name in self.ids else "(not created)")
                )
            time.sleep(0.2)

    def wait_stopped(self, timeout: float = 120.0) -> str:
        """Wait until the task has stopped (an essential container ended, or stop() ran); return why."""
        if not self.stopped.wait(timeout):
            raise TaskFailed(f"{self.name} still running after {timeout:g} s: {self.events}")
        return self.stopped_reason or ""

    # -- stopping ---------------------------------------------------------------------------

    def stop(self, reason: str = "stopped by the test") -> None:
        """ECS's task stop: SIGTERM in reverse dependency order, each waited for up to its stopTimeout, then removal."""
        with self.lock:
            already = self.stopping.is_set()
            self.stopping.set()
            self.stopped_reason = self.stopped_reason or reason
        if already:  # another thread (the supervisor) is stopping it: wait for that
            self.stopped.wait(600)
            return
        try:
            self._stop_all()
        finally:
            self.stopped.set()

    def _stop_all(self) -> None:
        if self.monitor is not None and self.monitor is not threading.current_thread():
            self.monitor.join(10)
        with self.lock:
            for name in reversed(start_order(self.definition)):
                if name in self.ids:
                    self._stop_container(name)
            for name, cid in self.ids.items():
                self.final_logs.setdefault(name, self._read_logs(cid))
                with contextlib.suppress(DockerError):
                    self.engine.api("DELETE", f"/containers/{cid}?force=1")
            if self.pause_id:
                with contextlib.suppress(DockerError):
                    self.engine.api("DELETE", f"/containers/{self.pause_id}?force=1")
            for vol in self.volumes:
                with contextlib.suppress(DockerError):
                    self.engine.api("DELETE", f"/volumes/{vol}?force=1")
            if self.metadata is not None:
                self.metadata.shutdown()
                self.metadata.server_close()

    def _stop_container(self, name: str) -> None:
        state = self.state(name)
        if state is None or state.status not in ("running", "restarting", "paused"):
            return
        wait = int(self.containers[name].get("stopTimeout", DEFAULT_STOP_TIMEOUT))
        began = time.monotonic()
        with contextlib.suppress(DockerError):
            self.engine.api("POST", f"/containers/{self.ids[name]}/stop?t={wait}", timeout=wait + 30)
        after = self.state(name)
        self.events.append(
            f"stopped {name} in {time.monotonic() - began:.1f} s (stopTimeout {wait}): exit {after and after.exit_code}"
        )

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_CONNECT_PY = r"""
import json, socket, sys, urllib.error, urllib.parse, urllib.request
url, timeout = sys.argv[1], float(sys.argv[2])
out = {"ok": False, "status": None, "error": None}
try:
    if url.startswith("tcp://"):
        p = urllib.parse.urlsplit(url)
        socket.create_connection((p.hostname, p.port), timeout=timeout).close()
        out["ok"] = True
    else:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                out["status"] = r.status
        except urllib.error.HTTPError as e:
            out["status"] = e.code
        out["ok"] = True
except Exception as e:
    reason = getattr(e, "reason", e)
    out["error"] = f"{type(reason).__name__}: {reason}"
print(json.dumps(out))
"""


def docker_time(text: str) -> float:
    """Docker's RFC 3339 time with nanoseconds -> epoch seconds."""
    whole, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float("0." + (frac[:6] or "0"))


# --- starting ---------------------------------------------------------------------------------


def run_task(engine: DockerEngine, task_definition: Mapping[str, Any], options: Options, name: str = "") -> Task:
    """Start the task as ECS would; return it once every container has started (TaskFailed otherwise).

    Use it as a context manager (or call ``stop()``) so its containers, pause container,
    volumes and metadata server go away whatever the test does. A start that fails has
    already stopped and removed everything; the exception carries the containers' logs.
    """
    td = json.loads(json.dumps(task_definition))
    start_order(td)  # names and cycles checked before anything starts
    family = str(td.get("family", "task"))
    task_name = name or f"rh-{re.sub(r'[^a-zA-Z0-9_.-]', '-', family)}-{secrets.token_hex(3)}"
    workdir = options.host_root / ".tasks" / task_name
    workdir.mkdir(parents=True, exist_ok=True)
    task = Task(engine, td, options, task_name, workdir)
    try:
        _prepare(task)
        _start_containers(task)
    except BaseException:
        task.stop("start failed")
        raise
    return task


def _prepare(task: Task) -> None:
    td, opts = task.definition, task.options
    unknown = set(opts.environment) - set(task.containers)
    if unknown:
        raise ValueError(f"Options.environment names no container of {td.get('family')}: {sorted(unknown)}")
    if task.network_mode not in ("awsvpc", "host", "bridge"):
        raise NotModelled(f"networkMode {task.network_mode!r}")
    for vol in td.get("volumes", []):
        if vol.get("efsVolumeConfiguration") or vol.get("fsxWindowsFileServerVolumeConfiguration"):
            raise NotModelled(f"volume {vol['name']}: EFS / FSx")
    for c in td["containerDefinitions"]:
        for key in ("environmentFiles", "logConfiguration", "firelensConfiguration"):
            if c.get(key):
                task.notes.append(f"{c['name']}: {key} not modelled")
    if opts.metadata_host:
        task.metadata = _metadata_server(task, opts.metadata_host)
    if task.network_mode == "awsvpc":
        body = {
            "Image": opts.pause_image,
            "Cmd": ["sleep", "infinity"],
            "Labels": {LABEL: task.name, "rehearsal.container": "pause"},
            "HostConfig": {"NetworkMode": opts.network, "Init": True},
        }
        task.pause_id = _create(task.engine, f"{task.name}-pause", body)
        task.engine.api("POST", f"/containers/{task.pause_id}/start")


def _create(engine: DockerEngine, name: str, body: Mapping[str, Any]) -> str:
    return str(engine.api("POST", f"/containers/create?name={name}", body)["Id"])


def _start_containers(task: Task) -> None:
    defs = task.containers
    firelens = firelens_container(task.definition)
    pending = start_order(task.definition)
    task.monitor = threading.Thread(target=_monitor, args=(task,), name=f"{task.name}-monitor", daemon=True)
    task.monitor.start()
    since = time.monotonic()
    while pending:
        if task.stopping.is_set():
            raise TaskFailed(f"{task.name} stopped while starting: {task.stopped_reason}\n{_recent_logs(task)}")
        started = False
        for name in list(pending):
            deps = dependencies(defs[name], firelens)
            verdict = _dependencies_met(task, deps)
            if verdict is True:
                with task.lock:
                    if task.stopping.is_set():
                        break
                    _create_and_start(task, defs[name])
                pending.remove(name)
                started = True
            elif isinstance(verdict, str):
                raise TaskFailed(f"{task.name}: {name} cannot start: {verdict}\n{_recent_logs(task)}")
            elif time.monotonic() - since > float(defs[name].get("startTimeout", task.options.start_timeout)):
                raise TaskFailed(f"{task.name}: {name}: {deps} not met in time\n{_recent_logs(task)}")
        if not started:
            time.sleep(0.2)


def _recent_logs(task: Task) -> str:
    return "\n".join(f"--- {n} ({task.state(n)}):\n{task.logs(n)[-2000:]}" for n in task.ids)


def _dependencies_met(task: Task, deps: Iterable[tuple[str, str]]) -> bool | str | None:
    """True when every one is met, a reason when one never can be, None to keep waiting."""
    result: bool | None = True
    for dep, condition in deps:
        state = task.state(dep)
        if state is None:
            result = None
            continue
        ended = state.status in ENDED
        if condition == "START":
            ok = state.started_at is not None
        elif condition == "COMPLETE":
            ok = ended
        elif condition == "SUCCESS":
            if ended and state.exit_code != 0:
                return f"{dep} exited {state.exit_code} (SUCCESS wanted)"
            ok = ended
        elif condition == "HEALTHY":
            if ended:
                return f"{dep} exited {state.exit_code} before it was HEALTHY"
            if state.health is None:
                return f"{dep} has no healthCheck (HEALTHY wanted)"
            ok = state.health == "healthy"
        else:
            raise NotModelled(f"dependsOn condition {condition!r}")
        if not ok:
            result = None
    return result


def _create_and_start(task: Task, c: Mapping[str, Any]) -> None:
    cid = _create(task.engine, task.container_name(c["name"]), container_config(task, c))
    task.ids[c["name"]] = cid
    task.engine.api("POST", f"/containers/{cid}/start")
    task.events.append(f"started {c['name']}")


def local_image(images: Mapping[str, str], image: str) -> str:
    for key in (image, repository(image)):
        if key in images:
            return images[key]
    raise NotModelled(f"no local image for {image!r} (repository {repository(image)!r}); known: {sorted(images)}")


def _secrets(task: Task, c: Mapping[str, Any]) -> dict[str, str]:
    """The container's ``secrets`` as variables, from ``Options.secrets``; TaskFailed for one it does not hold."""
    out = {}
    for secret in c.get("secrets", []):
        value = task.options.secrets.get(secret["valueFrom"])
        if value is None:
            raise TaskFailed(
                f"{task.name}: {c['name']}: ResourceInitializationError: unable to pull secrets or registry auth: "
                f"{secret['valueFrom']} is not in the rehearsal's secrets"
            )
        out[secret["name"]] = value
    return out


def container_config(task: Task, c: Mapping[str, Any]) -> dict[str, Any]:
    """The Engine API create body for one container definition."""
    opts, name = task.options, c["name"]
    env = {**env_dict(c), **_secrets(task, c), **_agent_env(task, name)}
    for var, value in opts.environment.get(name, {}).items():
        was = f" (task definition: {env[var]!r})" if var in env else ""
        task.notes.append(f"{name}: {var}={value!r} set by the rehearsal's options{was}")
        env[var] = value
    host: dict[str, Any] = {
        "Binds": _binds(task, c),
        "Init": bool((c.get("linuxParameters") or {}).get("initProcessEnabled")),
        "ReadonlyRootfs": bool(c.get("readonlyRootFilesystem")),
        "Privileged": bool(c.get("privileged")),
        "Ulimits": _ulimits(task, c),
        "Devices": _devices(task, c),
    }
    body: dict[str, Any] = {
        "Image": local_image(opts.images, c["image"]),
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Labels": {**c.get("dockerLabels", {}), LABEL: task.name, "rehearsal.container": name},
        "StopTimeout": int(c.get("stopTimeout", DEFAULT_STOP_TIMEOUT)),
        "HostConfig": host,
    }
    for key, api_key in (("entryPoint", "Entrypoint"), ("command", "Cmd")):
        if key in c:
            body[api_key] = list(c[key])
    for key, api_key in (("user", "User"), ("workingDirectory", "WorkingDir")):
        if c.get(key):
            body[api_key] = c[key]
    if c.get("healthCheck"):
        body["Healthcheck"] = _healthcheck(c["healthCheck"], opts.health_interval)
    _resources(host, c)
    _linux_parameters(task, host, c)
    _network(task, body, host, c)
    if c.get("volumesFrom"):
        host["VolumesFrom"] = [
            task.container_name(v["sourceContainer"]) + (":ro" if v.get("readOnly") else "") for v in c["volumesFrom"]
        ]
    return body


def _agent_env(task: Task, name: str) -> dict[str, str]:
    env = {"AWS_EXECUTION_ENV": "AWS_ECS_EC2"}
    if task.metadata is not None:
        host, port = task.metadata.server_address[:2]
        env["ECS_CONTAINER_METADATA_URI_V4"] = f"http://{host!s}:{port}/v4/{task.name}/{name}"
    return env


def _healthcheck(hc: Mapping[str, Any], interval: float) -> dict[str, Any]:
    merged = {**HEALTH_DEFAULTS, **hc}
    return {
        "Test": list(hc["command"]),
        "Interval": int(interval * NS),
        "Timeout": int(merged["timeout"] * NS),
        "Retries": int(merged["retries"]),
        "StartPeriod": int(merged["startPeriod"] * NS),
    }


def _binds(task: Task, c: Mapping[str, Any]) -> list[str]:
    vols = {v["name"]: v for v in task.definition.get("volumes", [])}
    binds = []
    for mp in c.get("mountPoints", []):
        if mp["sourceVolume"] not in vols:
            raise NotModelled(f"{c['name']}: mountPoint names unknown volume {mp['sourceVolume']!r}")
        source = _volume_source(task, vols[mp["sourceVolume"]])
        binds.append(f"{source}:{mp['containerPath']}" + (":ro" if mp.get("readOnly") else ""))
    return binds


def host_path(options: Options, source_path: str) -> Path:
    """Where a task definition's ``host.sourcePath`` lives in this rehearsal."""
    return options.host_root / source_path.lstrip("/")


def _volume_source(task: Task, vol: Mapping[str, Any]) -> str:
    source_path = (vol.get("host") or {}).get("sourcePath")
    if source_path:
        return str(host_path(task.options, source_path))
    cfg = vol.get("dockerVolumeConfiguration") or {}
    shared = cfg.get("scope") == "shared"
    vname = vol["name"] if shared else f"{task.name}-{vol['name']}"
    if vname in task.volumes or (shared and _volume_exists(task.engine, vname)):
        return vname
    body = {
        "Name": vname,
        "Driver": cfg.get("driver", "local"),
        "DriverOpts": cfg.get("driverOpts", {}),
        "Labels": {**cfg.get("labels", {}), LABEL: task.name},
    }
    task.engine.api("POST", "/volumes/create", body)
    if not shared:
        task.volumes.append(vname)
    return vname


def _volume_exists(engine: DockerEngine, name: str) -> bool:
    try:
        engine.api("GET", f"/volumes/{name}")
    except DockerError:
        return False
    return True


def _ulimits(task: Task, c: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for u in c.get("ulimits", []):
        soft, hard = int(u["softLimit"]), int(u["hardLimit"])
        rlimit = ULIMITS.get(u["name"])
        cap = resource.getrlimit(rlimit)[1] if rlimit is not None else resource.RLIM_INFINITY
        if cap != resource.RLIM_INFINITY:
            new = tuple(cap if v < 0 or v > cap else v for v in (soft, hard))
            if new != (soft, hard):
                task.notes.append(
                    f"{c['name']}: ulimit {u['name']} {soft}/{hard} lowered to {new[0]}/{new[1]} "
                    "(this host's hard limit: runc cannot raise it here)"
                )
            soft, hard = new
        out.append({"Name": u["name"], "Soft": soft, "Hard": hard})
    return out


def _gpus(c: Mapping[str, Any]) -> int:
    return sum(int(r["value"]) for r in c.get("resourceRequirements", []) if r["type"] == "GPU")


def _devices(task: Task, c: Mapping[str, Any]) -> list[dict[str, str]]:
    devices = [
        {
            "PathOnHost": d["hostPath"],
            "PathInContainer": d.get("containerPath", d["hostPath"]),
            "CgroupPermissions": "".join(p[0] for p in d.get("permissions", ["read", "write", "mknod"])),
        }
        for d in (c.get("linuxParameters") or {}).get("devices", [])
    ]
    gpus = _gpus(c)
    if gpus and task.options.fake_gpu is None:
        task.notes.append(f"{c['name']}: {gpus} GPU(s) requested, none given (GPUs are not modelled)")
    elif gpus:
        task.notes.append(f"{c['name']}: {gpus} GPU(s) requested: placeholder device nodes and a fake nvidia-smi")
        nodes = ["nvidiactl", *(f"nvidia{i}" for i in range(gpus))]
        devices += [
            {"PathOnHost": "/dev/null", "PathInContainer": f"/dev/{n}", "CgroupPermissions": "rw"} for n in nodes
        ]
    return devices


def _resources(host: dict[str, Any], c: Mapping[str, Any]) -> None:
    cpu = int(c.get("cpu", 0))
    if cpu:
        host["CpuShares"] = max(cpu, 2)  # the agent: none or 0 -> Docker's default; below 2 -> 2
    if c.get("memory"):
        host["Memory"] = int(c["memory"]) * 1024 * 1024
    if c.get("memoryReservation"):
        host["MemoryReservation"] = int(c["memoryReservation"]) * 1024 * 1024


def _linux_parameters(task: Task, host: dict[str, Any], c: Mapping[str, Any]) -> None:
    lp = c.get("linuxParameters") or {}
    if lp.get("sharedMemorySize"):
        host["ShmSize"] = int(lp["sharedMemorySize"]) * 1024 * 1024
    caps = lp.get("capabilities") or {}
    if caps.get("add"):
        host["CapAdd"] = list(caps["add"])
    if caps.get("drop"):
        host["CapDrop"] = list(caps["drop"])
    if lp.get("tmpfs"):
        host["Tmpfs"] = {
            t["containerPath"]: ",".join([f"size={t['size']}m", *t.get("mountOptions", [])]) for t in lp["tmpfs"]
        }
    for key in ("maxSwap", "swappiness"):
        if key in lp:
            task.notes.append(f"{c['name']}: linuxParameters.{key} not modelled")
    if task.options.fake_gpu is not None and _gpus(c):
        smi = task.workdir / f"nvidia-smi-{c['name']}"
        smi.write_text(task.options.fake_gpu.script())
        smi.chmod(0o755)
        host["Binds"].append(f"{smi}:/usr/bin/nvidia-smi:ro")


def _network(task: Task, body: dict[str, Any], host: dict[str, Any], c: Mapping[str, Any]) -> None:
    mode = task.network_mode
    if mode == "awsvpc":
        host["NetworkMode"] = f"container:{task.pause_id}"
        return
    if c.get("extraHosts"):
        host["ExtraHosts"] = [f"{h['hostname']}:{h['ipAddress']}" for h in c["extraHosts"]]
    if mode == "host":
        host["NetworkMode"] = "host"
        return
    host["NetworkMode"] = "bridge"
    ports = c.get("portMappings", [])
    body["ExposedPorts"] = {f"{p['containerPort']}/{p.get('protocol', 'tcp')}": {} for p in ports}
    host["PortBindings"] = {
        f"{p['containerPort']}/{p.get('protocol', 'tcp')}": [{"HostPort": str(p.get("hostPort") or "")}] for p in ports
    }
    if c.get("hostname"):
        body["Hostname"] = c["hostname"]
    if c.get("links"):
        host["Links"] = [f"{task.container_name(a)}:{b or a}" for a, _, b in (x.partition(":") for x in c["links"])]


# --- supervision: essential exits, restart policies --------------------------------------------


def _monitor(task: Task) -> None:
    """The agent's job while the task runs: restart per policy, stop the task when an essential container ends."""
    seen: set[tuple[str, float | None]] = set()
    while not task.stopping.wait(0.5):
        try:
            with task.lock:
                if task.stopping.is_set():
                    return
                reason = _supervise(task, seen)
        except DockerError as exc:  # the engine went away: nothing left to supervise
            task.events.append(f"monitor: {exc}")
            return
        if reason:
            task.stopped_reason = reason
            task.events.append(reason)
            threading.Thread(target=task.stop, args=(reason,), daemon=True).start()
            return


def _supervise(task: Task, seen: set[tuple[str, float | None]]) -> str | None:
    for name, c in task.containers.items():
        state = task.state(name)
        if state is None or state.status not in ("exited", "dead") or (name, state.started_at) in seen:
            continue
        seen.add((name, state.started_at))
        task.events.append(f"{name} exited {state.exit_code}" + (" (OOM killed)" if state.oom_killed else ""))
        if _should_restart(task, c, state):
            task.restarts[name] = task.restarts.get(name, 0) + 1
            task.events.append(f"restarting {name} (restart {task.restarts[name]})")
            task.engine.api("POST", f"/containers/{task.ids[name]}/start")
        elif c.get("essential", True):
            return f"essential container {name} exited {state.exit_code}"
    return None


def _should_restart(task: Task, c: Mapping[str, Any], state: State) -> bool:
    policy = c.get("restartPolicy") or {}
    if not policy.get("enabled") or state.exit_code in policy.get("ignoredExitCodes", []):
        return False
    period = float(policy.get("restartAttemptPeriod", RESTART_PERIOD_DEFAULT)) * task.options.restart_period_scale
    ran = time.time() - state.started_at if state.started_at else 0.0
    if ran < period:  # ECS: only a container that ran for restartAttemptPeriod is restarted
        task.events.append(f"{c['name']} ran {ran:.1f} s < restartAttemptPeriod {period:g} s: not restarted")
        return False
    return True


# --- the task metadata endpoint (v4): what containers read of it --------------------------------


def task_id(task_name: str) -> str:
    """The task's id in its ARN: 32 hex digits, as ECS's (model sync names its fan-out queue after it), derived
    from the task's name so that a test knows it before the task starts."""
    return hashlib.sha256(task_name.encode()).hexdigest()[:32]


def task_arn(task_name: str, cluster: str) -> str:
    return f"arn:aws:ecs:local:000000000000:task/{cluster}/{task_id(task_name)}"


def _metadata_server(task: Task, host: str) -> ThreadingHTTPServer:
    def task_doc() -> dict[str, Any]:
        cluster = task.options.cluster
        return {
            "Cluster": cluster,
            "TaskARN": task_arn(task.name, cluster),
            "Family": task.definition.get("family", ""),
            "Revision": "1",
            "DesiredStatus": "RUNNING",
            "KnownStatus": "RUNNING",
            "LaunchType": "EC2",
            "AvailabilityZone": "local-rehearsal",
            "Containers": [container_doc(n) for n in task.ids],
        }

    def container_doc(name: str) -> dict[str, Any]:
        return {"Name": name, "DockerName": task.container_name(name), "DockerId": task.ids.get(name, "")}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            doc: dict[str, Any] | None = None
            if parts[:2] == ["v4", task.name] and len(parts) == 4 and parts[3] == "task":
                doc = task_doc()
            elif parts[:2] == ["v4", task.name] and len(parts) == 3 and parts[2] in task.containers:
                doc = container_doc(parts[2])
            raw = json.dumps(doc if doc is not None else {"error": "not found"}).encode()
            self.send_response(200 if doc is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, name=f"{task.name}-metadata", daemon=True).start()
    return server


@contextlib.contextmanager
def running(engine: DockerEngine, task_definition: Mapping[str, Any], options: Options) -> Iterator[Task]:
    """``with running(engine, td, opts) as task:``: the task is stopped and removed on the way out."""
    task = run_task(engine, task_definition, options)
    try:
        yield task
    finally:
        task.stop()
