"""The sidecar image's install, replayed from the Dockerfile itself.

No Docker engine runs here, so the test reads the Dockerfile's ``build`` stage and
replays its ENV, WORKDIR, COPY and RUN lines in a temporary root (``/opt/...`` and
``/src`` mapped into it) with this machine's Python 3.11, then runs the final stage's
ENTRYPOINT from the resulting virtual environment: ``--help`` and one ``--once`` window
against the real test Triton. Change how the image installs and this test runs the
change; there is no second copy of the commands to drift.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
TRITON_DOCKERFILE = ROOT / "deploy" / "triton.Dockerfile"
LOCK = ROOT / "requirements.lock"


# --- a small Dockerfile reader ------------------------------------------------------------


@dataclass
class Instruction:
    op: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    steps: list[Instruction] = field(default_factory=list)


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages; continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif op == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key.strip()] = value.strip()
        elif stages:
            stages[-1].steps.append(Instruction(op, rest.strip()))
    return args, stages


def env_pairs(args: str) -> dict[str, str]:
    out = {}
    for word in shlex.split(args):
        key, _, value = word.partition("=")
        out[key] = value
    return out


def mapped(text: str, root: Path) -> str:
    """Image paths to paths under the replay root."""
    return re.sub(r"(?<![\w.])/(opt|src)(?=/|\b)", lambda m: f"{root}/{m.group(1)}", text)


def copy_sources(args: str) -> tuple[list[str], str] | None:
    words = shlex.split(args)
    if any(w.startswith("--from") for w in words):
        return None
    words = [w for w in words if not w.startswith("--")]
    return words[:-1], words[-1]


def replay_copy(args: str, workdir: Path, root: Path) -> None:
    parsed = copy_sources(args)
    if parsed is None:  # COPY --from=build: the replay already has it in place
        return
    sources, dest = parsed
    target = Path(mapped(dest, root)) if dest.startswith("/") else workdir / dest
    for src in sources:
        source = ROOT / src
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        elif dest.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / source.name)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def base_python() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def replay_build(root: Path) -> tuple[Stage, list[str]]:
    """Run the Dockerfile's build stage under ``root``; returns the final stage and the log."""
    _, stages = parse_dockerfile(DOCKERFILE.read_text())
    build = next(s for s in stages if s.name == "build")
    shim = root / "shim"
    shim.mkdir(parents=True)
    for name in ("python", "python3"):
        (shim / name).symlink_to(base_python())
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("LANG", "SSL_CERT_FILE")}
    env.update(PATH=f"{shim}{os.pathsep}/usr/bin{os.pathsep}/bin", HOME=str(root / "home"))
    workdir = root
    log = []
    for step in build.steps:
        if step.op == "ENV":
            env.update({k: mapped(v, root) for k, v in env_pairs(step.args).items()})
        elif step.op == "WORKDIR":
            workdir = Path(mapped(step.args, root))
            workdir.mkdir(parents=True, exist_ok=True)
        elif step.op == "COPY":
            replay_copy(step.args, workdir, root)
        elif step.op == "RUN" and step.args.startswith("apt-get "):
            # OS packages (the compiler for exporter/_scan.c): this machine has them already.
            assert shutil.which("gcc"), "the replay needs the compiler the Dockerfile installs"
            log.append(f"(skipped OS packages) {step.args}")
        elif step.op == "RUN":
            command = mapped(step.args, root)
            proc = subprocess.run(
                ["/bin/sh", "-ec", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
            )
            log.append(f"$ {command}\n{proc.stdout}{proc.stderr}")
            assert proc.returncode == 0, "\n".join(log)
        else:
            raise AssertionError(f"the replay does not know {step.op} in the build stage: {step.args}")
    final = stages[-1]
    for step in final.steps:
        if step.op == "COPY":
            replay_copy(step.args, root, root)
    return final, log


def final_env(final: Stage, root: Path) -> dict[str, str]:
    env: dict[str, str] = {"PATH": "/usr/bin:/bin", "HOME": str(root / "home")}
    for step in final.steps:
        if step.op == "ENV":
            for k, v in env_pairs(step.args).items():
                env[k] = mapped(v.replace("$PATH", env["PATH"]), root)
    return env


def entrypoint(final: Stage, root: Path) -> list[str]:
    step = next(s for s in final.steps if s.op == "ENTRYPOINT")
    return [mapped(word, root) for word in json.loads(step.args)]


# --- fast checks of the build inputs -------------------------------------------------------


def lock_entries() -> dict[str, tuple[str, list[str]]]:
    text = LOCK.read_text().replace("\\\n", " ")
    entries = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *rest = line.split()
        name, _, version = spec.partition("==")
        hashes = [w.removeprefix("--hash=sha256:") for w in rest if w.startswith("--hash=sha256:")]
        entries[canonicalize_name(name)] = (version, hashes)
    return entries


def test_lock_pins_every_runtime_dependency_with_hashes():
    entries = lock_entries()
    assert entries, "requirements.lock is empty"
    for name, (version, hashes) in entries.items():
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), f"{name} is not pinned with =="
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), f"{name} has no sha256"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in entries, f"pyproject dependency {dep!r} is missing from requirements.lock"
        assert req.specifier.contains(entries[name][0], prereleases=True), (
            f"requirements.lock pins {name}=={entries[name][0]}, outside pyproject's {dep!r}"
        )


def test_dockerfile_shape():
    """Multi-stage, pinned base, hash-locked wheel-only installs, non-root, no port, module entry."""
    text = DOCKERFILE.read_text()
    args, stages = parse_dockerfile(text)
    assert [s.name for s in stages] == ["build", None]
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", args["PYTHON_IMAGE"])
    assert stages[0].base == stages[1].base == args["PYTHON_IMAGE"], "the venv must run on the Python it was built by"
    runs = " ".join(s.args for s in stages[0].steps if s.op == "RUN")
    assert "--require-hashes --only-binary=:all: --no-deps -r requirements.lock" in runs
    final = stages[1]
    ops = [s.op for s in final.steps]
    assert not any(s.op == "RUN" and "pip" in s.args for s in final.steps)
    assert "EXPOSE" not in ops and "HEALTHCHECK" not in ops
    user = next(s.args for s in final.steps if s.op == "USER")
    assert user.split(":")[0] not in ("0", "root")
    assert json.loads(next(s.args for s in final.steps if s.op == "ENTRYPOINT"))[-2:] == ["-m", "exporter"]
    copies = [s.args for s in final.steps if s.op == "COPY"]
    assert copies[0].startswith("--from=build /opt/venv ")
    labels = " ".join(s.args for s in final.steps if s.op == "LABEL")
    for key in ("title", "version", "revision", "created", "licenses", "description"):
        assert f"org.opencontainers.image.{key}=" in labels


def dockerignore_included(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    included = True
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip().rstrip("/").lstrip("/")
        rx = re.escape(pat).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        rx = rx.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(rx, c) for c in candidates):
            included = negate
    return included


def test_dockerignore_lets_every_copied_file_through():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not dockerignore_included(".venv/bin/python", patterns)
    assert not dockerignore_included("tests/conftest.py", patterns)
    assert not dockerignore_included("exporter/__pycache__/health.cpython-311.pyc", patterns)
    # A C scanner built on the host must not reach the image: the build stage compiles its own.
    assert not dockerignore_included("exporter/_scan.cpython-311-x86_64-linux-gnu.so", patterns)
    for dockerfile in (DOCKERFILE, TRITON_DOCKERFILE):
        for stage in parse_dockerfile(dockerfile.read_text())[1]:
            for step in stage.steps:
                parsed = copy_sources(step.args) if step.op == "COPY" else None
                for src in parsed[0] if parsed else []:
                    path = ROOT / src
                    assert path.exists(), f"{dockerfile.name} copies {src}, which does not exist"
                    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
                    for f in files:
                        rel = f.relative_to(ROOT).as_posix()
                        if "__pycache__" not in rel and not rel.endswith(".so"):  # local build artifacts
                            assert dockerignore_included(rel, patterns), f".dockerignore drops {rel}"


# --- the replay -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("image")
    final, _ = replay_build(root)
    return root, final


@pytest.mark.slow
@pytest.mark.triton
def test_replayed_image_has_only_the_lock_and_runs_help(image):
    root, final = image
    venv = root / "opt" / "venv"
    assert not (venv / "bin" / "pip").exists(), "pip must not reach the final image"
    env = final_env(final, root)
    cwd = root / "empty"
    cwd.mkdir(exist_ok=True)  # nothing importable from the working directory
    listing = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m, exporter; print(exporter.__file__);"
         "print('\\n'.join(sorted(f'{d.metadata[\"Name\"]}=={d.version}' for d in m.distributions())))"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    where, *dists = listing.stdout.splitlines()
    assert where.startswith(str(venv)), where
    native = subprocess.run([str(venv / "bin" / "python"), "-c", "import exporter._scan"], cwd=cwd, env=env,
                            capture_output=True, text=True)
    assert native.returncode == 0, "the image must carry the C scanner: " + native.stderr
    installed = {canonicalize_name(d.split("==")[0]): d.split("==")[1] for d in dists}
    expected = {name: version for name, (version, _) in lock_entries().items()}
    expected["triton-emf-exporter"] = installed.get("triton-emf-exporter", "?")
    assert installed == expected
    assert "setuptools" not in installed

    proc = subprocess.run(
        [*entrypoint(final, root), "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("TRITON_URL", "TRITON_METRICS_URL", "EXPORTER_OUTPUT", "EXPORTER_INTERVAL", "EXPORTER_NVML"):
        assert name in proc.stdout

    # The model-sync daemon: same image, other entry point (docs/modelsync.md), boto3 from the lock.
    modelsync = [str(venv / "bin" / "python"), "-m", "modelsync"]
    proc = subprocess.run([*modelsync, "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in ("MODELSYNC_BUCKET", "MODELSYNC_REPOSITORY", "MODELSYNC_QUEUE_URL", "TRITON_URL"):
        assert name in proc.stdout
    proc = subprocess.run([*modelsync, "--once"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--bucket (or MODELSYNC_BUCKET) is required" in proc.stderr
    assert {"boto3", "botocore", "s3transfer"} <= installed.keys()

    for script in ("health.py", "startup_check.py"):  # the copies published for the Triton image
        published = root / "opt" / "triton-health" / script
        proc = subprocess.run(
            ["python3", "-I", str(published), "--help"], cwd=cwd, capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.triton
def test_replayed_image_prints_one_emf_window_from_real_triton(image, triton):
    root, final = image
    env = final_env(final, root)
    cwd = root / "empty"
    cwd.mkdir(exist_ok=True)
    args = ["--once", "--interval", "1", "--triton-url", triton.url, "--metrics-url", triton.metrics_url]
    proc = subprocess.run(
        [*entrypoint(final, root), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    docs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert docs, proc.stdout
    namespaces = {d["Namespace"] for doc in docs for d in doc["_aws"]["CloudWatchMetrics"]}
    assert namespaces == {"Triton"}
    assert any(doc.get("model") == "add" for doc in docs)
