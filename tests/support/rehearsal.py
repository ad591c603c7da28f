"""The container rehearsal's engine and images: our own dockerd, and images built without a registry.

Why this shape: no registry but the package ones is reachable here, so every image a task
definition names is built locally, and the project's own Dockerfiles are built unchanged on
top of stand-in bases tagged with the names their ``FROM`` lines expect
(docs/rehearsal.md has what was learned getting there):

* ``rehearsal/bookworm-minbase``: ``mmdebstrap --variant=minbase`` + ``docker import``; also
  the awsvpc pause image;
* the root Dockerfile's ``python:3.11.14-slim-bookworm``: Debian's ``python3`` (with
  ``venv`` and the headers the C scanner needs, ``python`` on PATH) and the host's CA bundle
  for pip (these machines reach PyPI through a proxy whose CA only the host bundle has).
  A test artifact: the bundle is in the rehearsal images, never in the ones we ship;
* deploy/triton.Dockerfile's ``nvcr.io/nvidia/tritonserver:<TRITON_TAG>``: the real
  ``tritonserver`` and Python backend from the nvidia-pytriton wheel (TRITON_FACTS.md), laid
  out as in NVIDIA's image (``/opt/tritonserver/{bin,lib,backends}``), Debian's numpy for
  the sample models, and the core sample models under ``/opt/rehearsal/models``. No GPU:
  ecs_local.FakeGpu gives GPU containers placeholder devices and a fake ``nvidia-smi``;
* fluentbit/Dockerfile's ``aws-for-fluent-bit:<BASE_TAG>``: tests/support/rehearsal_router.py, a
  listener on the router's ports (Fluent Bit is not packaged for Debian).

Builds use the classic builder (``DOCKER_BUILDKIT=0``: BuildKit would fetch the
``# syntax=`` frontend from Docker Hub) with ``--network host`` (containers have no route
out). A generated base is rebuilt only when its inputs change (a content key in an image
label); the project's images go through Docker's layer cache; within one session each image
is built once.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.ecs_local import DockerEngine, DockerError, Options

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "rehearsal-engine.sh"
REHEARSAL_ROOT = Path(os.environ.get("REHEARSAL_ROOT", "/var/tmp/triton-rehearsal"))
TASK_NETWORK = os.environ.get("REHEARSAL_TASK_NETWORK", "rehearsal-tasks")
TASK_GATEWAY = os.environ.get("REHEARSAL_TASK_GATEWAY", "169.254.124.1")
CLI = os.environ.get("REHEARSAL_DOCKER", "/usr/bin/docker")
KEY_LABEL = "rehearsal.key"
MINBASE = "rehearsal/bookworm-minbase"
MODELS = ("add", "fails", "slow", "text")  # the sample models that load (demo/models; not broken, not the LLM ones)
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


# --- the engine ---------------------------------------------------------------------------------


def unavailable() -> str | None:
    """Why the rehearsal cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (it starts its own dockerd)"
    installed = Path(os.environ.get("REHEARSAL_DOCKERD", "/usr/sbin/dockerd")).exists() and shutil.which("mmdebstrap")
    if not installed and not shutil.which("apt-get"):
        return "needs docker.io and mmdebstrap, or apt-get to install them"
    return None


@dataclass
class Engine:
    """Our dockerd, started and stopped by scripts/rehearsal-engine.sh (own socket, pidfile, data root).

    One engine per machine (its networks' addresses are fixed): a session holds an exclusive
    lock on ``<root>/lock`` from start to stop, so a second session (another checkout's test
    run) waits for it instead of sharing or stopping the first one's daemon. The kernel drops
    the lock when a session dies; the next one removes what that session left behind.
    """

    root: Path = REHEARSAL_ROOT
    lock_timeout: float = 1800.0
    _lock: int | None = None

    @property
    def docker(self) -> DockerEngine:
        return DockerEngine(self.root / "run" / "docker.sock", CLI)

    def _script(self, command: str) -> None:
        env = {**os.environ, "REHEARSAL_ROOT": str(self.root), "REHEARSAL_DOCKER": CLI}
        proc = subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"rehearsal-engine.sh {command} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")

    def _acquire(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(
                        f"another session holds {self.root / 'lock'} for over {self.lock_timeout:g} s"
                    ) from None
                time.sleep(1)
        self._lock = fd

    def start(self) -> DockerEngine:
        """Take the machine's engine lock, install what is missing, start the daemon, clear leftovers.

        The daemon is stopped at exit whatever happens (atexit here, the fixture's finalizer,
        and scripts/test.sh's trap).
        """
        self._acquire()
        atexit.register(self.stop)
        self._script("start")
        remove_containers(self.docker)
        return self.docker

    def stop(self) -> None:
        """Remove every container and stop the daemon by its pidfile; release the lock (safe to call twice)."""
        if self._lock is None:
            return
        fd, self._lock = self._lock, None
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        self._script("stop")  # takes the lock itself: a session that got it meanwhile keeps its engine


# --- images -------------------------------------------------------------------------------------


def dockerfile_base(dockerfile: Path) -> str:
    """The image the first ``FROM`` names, with the ``ARG`` defaults declared before it substituted."""
    args: dict[str, str] = {}
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "ARG" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            args[key] = value
        elif words[0].upper() == "FROM":
            return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[1])
    raise ValueError(f"{dockerfile}: no FROM")


def content_key(*parts: str | bytes | Path) -> str:
    """A hash of strings, bytes and files (every file under a folder, by relative path and content)."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = sorted(p for p in part.rglob("*") if p.is_file()) if part.is_dir() else [part]
            for f in files:
                h.update(str(f.relative_to(part) if part.is_dir() else f.name).encode())
                h.update(hashlib.sha256(f.read_bytes()).digest())
        else:
            h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()[:16]


def _pytriton() -> tuple[Path, Path]:
    """The wheel's tritonserver folder and its bundled libraries (nvidia-pytriton is a dev dependency)."""
    import pytriton

    server = Path(pytriton.__file__).parent / "tritonserver"
    return server, server.parent.parent / "nvidia_pytriton.libs"


@dataclass
class Images:
    """Builds the rehearsal's images once per session; ``images()`` maps repository names to local tags."""

    docker: DockerEngine
    log: Callable[[str], None] = print
    built: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    # -- helpers -------------------------------------------------------------------------------

    def _label(self, image: str) -> str | None:
        proc = self.docker.cli(
            "image", "inspect", "--format", f'{{{{index .Config.Labels "{KEY_LABEL}"}}}}', image, check=False
        )
        return proc.stdout.decode().strip() if proc.returncode == 0 else None

    def _timed(self, name: str, fn: Callable[[], None]) -> None:
        began = time.monotonic()
        fn()
        self.timings[name] = round(time.monotonic() - began, 1)
        self.log(f"rehearsal: {name} in {self.timings[name]} s")

    def _build(self, tag: str, context: Path, dockerfile: Path | None = None, key: str | None = None) -> None:
        args = ["build", "--network", "host", "-t", tag]
        if key:
            args += ["--label", f"{KEY_LABEL}={key}"]
        if dockerfile:
            args += ["-f", str(dockerfile)]
        self.docker.cli(*args, str(context), timeout=1800)

    def _generated(self, tag: str, key: str, fill: Callable[[Path], None]) -> None:
        """Build a generated base unless an image with this content key exists."""
        if self._label(tag) == key:
            return
        with tempfile.TemporaryDirectory(prefix="rehearsal-ctx-", dir=REHEARSAL_ROOT) as ctx:
            fill(Path(ctx))
            self._timed(f"build {tag}", lambda: self._build(tag, Path(ctx), key=key))

    # -- the bases -----------------------------------------------------------------------------

    MMDEBSTRAP = ("--variant=minbase", "--include=ca-certificates", '--aptopt=Acquire::Check-Valid-Until "false"')

    def minbase(self) -> str:
        return self.debian_root("bookworm", MINBASE)

    def debian_root(self, suite: str, tag: str, include: tuple[str, ...] = ()) -> str:
        """A Debian ``suite`` root (with the packages in ``include``) as image ``tag``, unless it is current."""
        options = (*self.MMDEBSTRAP, *(f"--include={package}" for package in include))
        key = content_key(*options, suite)
        if self._label(tag) != key:
            name = "mmdebstrap + docker import" if tag == MINBASE else f"mmdebstrap {suite} + docker import"
            self._timed(name, lambda: self._import_root(tag, suite, options, key))
        return tag

    def _import_root(self, tag: str, suite: str, options: tuple[str, ...], key: str) -> None:
        with tempfile.TemporaryDirectory(prefix="rehearsal-base-", dir=REHEARSAL_ROOT) as tmp:
            tar = Path(tmp) / "base.tar"
            subprocess.run(["mmdebstrap", *options, suite, str(tar)], check=True, capture_output=True)
            self.docker.cli(
                "import", "--change", 'CMD ["/bin/bash"]', "--change", f"LABEL {KEY_LABEL}={key}", str(tar), tag
            )

    def python_base(self) -> str:
        tag = dockerfile_base(ROOT / "Dockerfile")
        host_ca = HOST_CA.read_bytes() if HOST_CA.exists() else b""
        # Rehearsal only: the host's CA bundle, for pip behind this machine's TLS proxy (none: pip's own).
        pem = "/usr/local/share/rehearsal/host-ca.crt"
        ca = f"COPY host-ca.crt {pem}\nENV PIP_CERT={pem}\n"
        recipe = f"""FROM {self.minbase()}
{ca if host_ca else ""}RUN apt-get update \\
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \\
 && ln -s /usr/bin/python3 /usr/local/bin/python \\
 && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
"""

        def fill(ctx: Path) -> None:
            (ctx / "Dockerfile").write_text(recipe)
            if host_ca:
                (ctx / "host-ca.crt").write_bytes(host_ca)

        self._generated(tag, content_key(recipe, self._label(MINBASE) or "", host_ca), fill)
        return tag

    def triton_base(self) -> str:
        tag = dockerfile_base(ROOT / "deploy" / "triton.Dockerfile")
        server, libs = _pytriton()
        stub = server / "python_backend_stubs" / "3.11" / "triton_python_backend_stub"  # Debian 12's python3 is 3.11
        models = ROOT / "demo" / "models"
        recipe = f"""FROM {self.python_base()}
RUN apt-get update && apt-get install -y --no-install-recommends python3-numpy && rm -rf /var/lib/apt/lists/*
COPY tritonserver/ /opt/tritonserver/
COPY models/ /opt/rehearsal/models/
# As NVIDIA's image: tritonserver on PATH, its libraries found, CUDA_VERSION set (24.10 ships CUDA 12.6).
ENV PATH=/opt/tritonserver/bin:$PATH \\
    LD_LIBRARY_PATH=/opt/tritonserver/lib \\
    CUDA_VERSION=12.6.2
"""

        def fill(ctx: Path) -> None:
            (ctx / "Dockerfile").write_text(recipe)
            dest = ctx / "tritonserver"
            _link_tree(server / "bin", dest / "bin")
            _link_tree(server / "caches", dest / "caches")
            _link_tree(server / "backends", dest / "backends")
            _link_tree(libs, dest / "lib")
            shutil.copy2(stub, dest / "backends" / "python" / "triton_python_backend_stub")
            for name in MODELS:
                shutil.copytree(models / name, ctx / "models" / name, ignore=shutil.ignore_patterns("__pycache__"))

        model_dirs = [models / n for n in MODELS]
        key = content_key(recipe, self._label(dockerfile_base(ROOT / "Dockerfile")) or "", server, libs, *model_dirs)
        self._generated(tag, key, fill)
        return tag

    def router_base(self) -> str:
        tag = dockerfile_base(ROOT / "fluentbit" / "Dockerfile")
        recipe = f"""FROM {self.python_base()}
COPY rehearsal_router.py /rehearsal/log_router_standin.py
ENTRYPOINT ["python3", "-u", "/rehearsal/log_router_standin.py"]
"""
        source = Path(__file__).parent / "rehearsal_router.py"

        def fill(ctx: Path) -> None:
            (ctx / "Dockerfile").write_text(recipe)
            shutil.copyfile(source, ctx / "rehearsal_router.py")

        self._generated(tag, content_key(recipe, self._label(self.python_base()) or "", source), fill)
        return tag

    # -- the project's images, from its Dockerfiles unchanged ------------------------------------

    def project(self, repository: str, dockerfile: Path, context: Path, base: Callable[[], str]) -> str:
        if repository not in self.built:
            base()
            tag = f"rehearsal/{repository}:local"
            self._timed(f"build {tag}", lambda: self._build(tag, context, dockerfile))
            self.built[repository] = tag
        return self.built[repository]

    def images(self) -> dict[str, str]:
        """Repository name (as the task definitions' ECR URIs have it) -> local image."""
        return {
            "triton-server": self.project(
                "triton-server", ROOT / "deploy" / "triton.Dockerfile", ROOT, self.triton_base
            ),
            "triton-emf-exporter": self.project("triton-emf-exporter", ROOT / "Dockerfile", ROOT, self.python_base),
            "triton-log-router": self.project(
                "triton-log-router", ROOT / "fluentbit" / "Dockerfile", ROOT / "fluentbit", self.router_base
            ),
        }


def _link_tree(src: Path, dest: Path) -> None:
    """Hard-link a tree into a build context (copy where links cannot cross filesystems)."""
    try:
        shutil.copytree(src, dest, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))


def remove_containers(docker: DockerEngine, label_values: Iterable[str] = ()) -> None:
    """Remove leftover rehearsal containers (all, or those of the given tasks)."""
    filters = [f"label=rehearsal.task={v}" for v in label_values] or ["label=rehearsal.task"]
    for flt in filters:
        ids = docker.cli("ps", "-aq", "--filter", flt, check=False).stdout.decode().split()
        if ids:
            with contextlib.suppress(DockerError):
                docker.cli("rm", "-f", *ids)


# --- the pytest fixture ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rehearsal:
    """What a rehearsal test gets: the engine, the task definitions' images, and option defaults."""

    docker: DockerEngine
    images: dict[str, str]
    python_image: str
    """The rehearsal's Python base (python3 and sh): for tests' own small task definitions."""
    timings: dict[str, float]

    def options(self, host_root: Path, **kw: Any) -> Options:
        """ecs_local.Options on this engine: its task network, pause image and metadata address."""
        base: dict[str, Any] = {
            "images": self.images | {self.python_image: self.python_image},
            "host_root": host_root,
            "network": TASK_NETWORK,
            "pause_image": MINBASE,
            "metadata_host": TASK_GATEWAY,
        }
        return Options(**(base | kw))


_SHARED: list[Engine] = []  # this process's engine, started by the first fixture that needs it
_USERS: list[str] = []


@contextlib.contextmanager
def shared_engine(user: str) -> Iterator[DockerEngine]:
    """This session's engine, started once however many fixtures use it, stopped when the last one is done.

    One lock per process: a second ``Engine().start()`` in the same session would wait on the
    lock the first one holds (flock locks belong to the open file, not the process).
    """
    if not _SHARED:
        engine = Engine()
        try:
            engine.start()
        except BaseException:
            engine.stop()  # releases the lock if it was taken
            raise
        _SHARED.append(engine)
    _USERS.append(user)
    try:
        yield _SHARED[0].docker
    finally:
        _USERS.remove(user)
        if not _USERS:
            _SHARED.pop().stop()


@pytest.fixture(scope="session")
def rehearsal() -> Iterator[Rehearsal]:
    """Our engine with every image built; skipped (with the reason) only where it cannot run at all."""
    reason = unavailable()
    if reason:
        pytest.skip(f"container rehearsal: {reason}")
    with shared_engine("rehearsal") as docker:
        builder = Images(docker, log=lambda line: print(line, flush=True))
        images = builder.images()
        yield Rehearsal(docker, images, builder.python_base(), builder.timings)
