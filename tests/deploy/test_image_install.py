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
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.paths import REPO

# the replayed image installs the lock into a fresh venv (minutes on a busy 2-core machine, more on a
# cold pip cache), in the module fixture whose time counts against the first test's limit.
pytestmark = pytest.mark.timeout(1200)

ROOT = REPO
DOCKERFILE = ROOT / "Dockerfile"
# the packages the wheel holds
SHIPPED = ("telemetry", "catalog", "triton_http", "exporter", "modelsync", "triton_side", "render", "controller")
TRITON_DOCKERFILE = ROOT / "deploy" / "triton.Dockerfile"
LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"


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
            # OS packages (the compiler for exporter/sources/_scan.c): this machine has them already.
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


def lock_entries(lock: Path = LOCK) -> dict[str, tuple[str, list[str]]]:
    text = lock.read_text().replace("\\\n", " ")
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


def assert_pinned_with_hashes(entries: dict[str, tuple[str, list[str]]], lock: str) -> None:
    assert entries, f"{lock} is empty"
    for name, (version, hashes) in entries.items():
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), f"{name} is not pinned with == in {lock}"
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), f"{name} has no sha256 in {lock}"


def assert_covers(entries: dict[str, tuple[str, list[str]]], requirements: list[str], lock: str) -> None:
    for dep in requirements:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in entries, f"{dep!r} is missing from {lock}"
        assert req.specifier.contains(entries[name][0], prereleases=True), (
            f"{lock} pins {name}=={entries[name][0]}, outside {dep!r}"
        )


def closure(names: list[str]) -> set[str]:
    """The installed distributions ``names`` need, transitively (markers evaluated here), with the extras a
    requirement asks for (sigstore-rekor-types needs ``pydantic[email]``: email-validator is in the closure)."""
    import importlib.metadata

    seen: set[tuple[str, str]] = set()
    todo = [(canonicalize_name(n), "") for n in names]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for text in importlib.metadata.distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(canonicalize_name(req.name), e) for e in ("", *sorted(req.extras))]
    return {name for name, _ in seen}


def test_lock_pins_exactly_the_runtime_closure_with_hashes():
    entries = lock_entries()
    assert_pinned_with_hashes(entries, "requirements.lock")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert_covers(entries, project["dependencies"], "requirements.lock")
    runtime = closure([Requirement(d).name for d in project["dependencies"]])
    assert set(entries) == runtime, "requirements.lock is not the closure of the runtime dependencies"


def test_runtime_dependencies_are_what_the_shipped_code_imports():
    """A library only the tests use (aws-embedded-metrics) belongs in the dev extra, not in the image."""
    import ast
    import importlib.metadata

    imported: set[str] = set()
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted({p.rstrip("*") for p in shipped})
    assert packages == [
        "catalog", "controller", "exporter", "modelsync", "render", "telemetry", "triton_http", "triton_side"
    ]  # fmt: skip
    for path in (p for package in packages for p in (ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    providers = importlib.metadata.packages_distributions()
    used = {canonicalize_name(d) for module in imported for d in providers.get(module, [])}
    used.discard("triton-emf-exporter")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {canonicalize_name(Requirement(d).name) for d in project["dependencies"]}
    assert declared == used


def test_dev_lock_pins_everything_setup_installs_with_the_runtime_pins():
    dev = lock_entries(DEV_LOCK)
    assert_pinned_with_hashes(dev, "requirements-dev.lock")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tools = [line.split("#", 1)[0].strip() for line in (ROOT / "requirements-test.txt").read_text().splitlines()]
    assert_covers(
        dev,
        [
            *pyproject["project"]["dependencies"],
            *pyproject["project"]["optional-dependencies"]["dev"],
            *[t for t in tools if t],
            *pyproject["build-system"]["requires"],
        ],
        "requirements-dev.lock",
    )
    for name, pinned in lock_entries().items():
        assert dev.get(name) == pinned, f"{name}: requirements-dev.lock and requirements.lock disagree"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "--require-hashes -r requirements-dev.lock" in setup and "--no-deps --no-build-isolation -e ." in setup


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


def test_one_version_source():
    """pyproject.toml's [project].version, read from the package metadata; no copy of it anywhere that ships."""
    import importlib.metadata

    import exporter

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert exporter.__version__ == importlib.metadata.version("triton-emf-exporter") == version
    literal = re.compile(r"(?<![\w.])" + re.escape(version) + r"(?![\w.])")
    shipped = [*sorted(p for d in SHIPPED for p in (ROOT / d).rglob("*.py")), ROOT / "setup.py", DOCKERFILE]
    assert [p.relative_to(ROOT).as_posix() for p in shipped if literal.search(p.read_text())] == []
    _, stages = parse_dockerfile(DOCKERFILE.read_text())
    final_args = [s.args for s in stages[-1].steps if s.op == "ARG" and s.args.startswith("VERSION")]
    assert final_args == ["VERSION=unknown"], "the image label's version comes from --build-arg VERSION only"


def test_license_is_the_apache_2_text_pyproject_declares():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "9. Accepting Warranty or Additional Liability." in text
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in DOCKERFILE.read_text()


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
    assert not dockerignore_included("triton_side/__pycache__/probe.cpython-311.pyc", patterns)
    # A C scanner built on the host must not reach the image: the build stage compiles its own.
    assert not dockerignore_included("exporter/sources/_scan.cpython-311-x86_64-linux-gnu.so", patterns)
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
    native = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import exporter.sources._scan"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert native.returncode == 0, "the image must carry the C scanner: " + native.stderr
    installed = {canonicalize_name(d.split("==")[0]): d.split("==")[1] for d in dists}
    expected = {name: version for name, (version, _) in lock_entries().items()}
    expected["triton-emf-exporter"] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert installed == expected
    assert "setuptools" not in installed

    proc = subprocess.run(
        [*entrypoint(final, root), "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("TRITON_URL", "TRITON_METRICS_URL", "EXPORTER_OUTPUT", "EXPORTER_INTERVAL", "EXPORTER_NVML"):
        assert name in proc.stdout

    # the wheel carries triton_side/ for ``python -m exporter health``
    proc = subprocess.run([*entrypoint(final, root), "health", "--help"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0 and "HEALTH_DEADLINE" in proc.stdout, proc.stderr

    published = root / "opt" / "triton-health"  # the folder published for the Triton image
    assert sorted(p.name for p in published.iterdir()) == sorted(p.name for p in (ROOT / "triton_side").glob("*.py"))

    # The model-sync daemon: same image, other entry point (docs/modelsync.md), boto3 from the lock.
    modelsync = [str(venv / "bin" / "python"), "-m", "modelsync"]
    proc = subprocess.run([*modelsync, "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in ("MODELSYNC_BUCKET", "MODELSYNC_REPOSITORY", "MODELSYNC_QUEUE_URL", "TRITON_URL"):
        assert name in proc.stdout
    proc = subprocess.run([*modelsync, "--once"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--bucket (or MODELSYNC_BUCKET) is required" in proc.stderr
    assert {"boto3", "botocore", "s3transfer"} <= installed.keys()
    # The fleet's controller: same image, other entry point (deploy/task-definition-controller.json).
    controller = [str(venv / "bin" / "python"), "-m", "controller"]
    proc = subprocess.run([*controller, "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in ("CONTROLLER_QUEUE_URL", "CONTROLLER_CLUSTER", "CONTROLLER_STATE_BUCKET"):
        assert name in proc.stdout

    for script in ("health.py", "startup_check.py"):
        proc = subprocess.run(
            ["python3", "-I", str(published / script), "--help"], cwd=cwd, capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr


# Test-only code by its name: fakes, mocks, test modules, the dashboard/alarm reference reader.
TEST_ONLY = re.compile(r"(^|_)(tests?|fakes?|mocks?|conftest|refs)(_|$)")


def is_test_only(path: str) -> bool:
    """A module path that names test-only code, or that imports the tests' package."""
    stem = path.rsplit("/", 1)[-1].split(".", 1)[0]
    return bool(TEST_ONLY.search(stem)) or any(part in ("tests", "test") for part in path.split("/")[:-1])


def test_test_only_rule_catches_what_used_to_ship():
    assert is_test_only("exporter/sources/nvml_fake.py") and is_test_only("render/refs.py")
    assert is_test_only("tests/support/helpers.py") and is_test_only("exporter/test_x.py")
    assert not is_test_only("exporter/sources/nvml.py") and not is_test_only("render/dashboard.py")


@pytest.mark.slow
def test_wheel_and_image_hold_only_what_runs(image):
    """The wheel the image build made (and the image's installed copy) has no fake or test-only module."""
    root, _ = image
    wheels = list((root / "opt" / "build" / "dist").glob("*.whl"))
    assert len(wheels) == 1, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    modules = [n for n in names if n.endswith((".py", ".c", ".so"))]
    assert {"exporter/__main__.py", "exporter/sources/nvml.py", "render/dashboard/__init__.py"} <= set(modules)
    # The output layer, the catalog, the exporter, the Triton-side probe (``python -m exporter health`` runs it)
    # and the model-sync daemon.
    others = {n.split("/")[0] for n in names if n.split("/")[0] not in SHIPPED}
    assert len(others) == 1 and others.pop().endswith(".dist-info"), "the wheel holds only the shipped packages"
    assert {"catalog/core.toml", "catalog/llm.toml", "catalog/example.toml", "catalog/modelsync.toml"} <= set(names)
    assert [n for n in modules if is_test_only(n)] == []
    importers = re.compile(r"^\s*(from|import)\s+tests\b", re.MULTILINE)
    with zipfile.ZipFile(wheels[0]) as whl:
        assert [n for n in modules if n.endswith(".py") and importers.search(whl.read(n).decode())] == []
    site = next((root / "opt" / "venv" / "lib").glob("python3*/site-packages"))
    installed = sorted(
        p.relative_to(site).as_posix()
        for d in SHIPPED
        for p in (site / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert installed == sorted(n for n in names if n.split("/")[0] in SHIPPED and not n.endswith("/"))


@pytest.mark.slow
@pytest.mark.triton
def test_replayed_image_prints_one_emf_window_from_real_triton(image, triton):
    root, final = image
    env = final_env(final, root)
    cwd = root / "empty"
    cwd.mkdir(exist_ok=True)
    args = ["--once", "--interval", "1", "--triton-url", triton.url, "--triton-metrics-url", triton.metrics_url]
    proc = subprocess.run(
        [*entrypoint(final, root), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    docs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert docs, proc.stdout
    namespaces = {d["Namespace"] for doc in docs for d in doc["_aws"]["CloudWatchMetrics"]}
    assert namespaces == {"Triton"}
    assert any(doc.get("model") == "add" for doc in docs)
