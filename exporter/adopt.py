"""``python -m exporter adopt``: add the sidecar to a Triton task definition you already run.

Most users already run Triton on ECS; a new stack is not what they need. This command reads the task
definition as ``aws ecs describe-task-definition`` prints it and writes one that
``aws ecs register-task-definition --cli-input-json`` takes, with what this project adds to a Triton task:

* the exporter container, reaching Triton's HTTP and metrics ports as the network mode allows;
* the deep health probe as Triton's ``healthCheck``, handed over by an init container of the sidecar
  image through a task volume (the user's Triton image is not rebuilt);
* optionally the FireLens log router of ``fluentbit/``;
* the admin key secret, when Triton restricts its repository API with one.

Nothing else of the user's containers changes. Adopting an adopted definition changes nothing (or only the
sidecars' images), and ``--check`` lists what is missing. docs/adopt.md walks a deployment through it.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from telemetry.settings import ArgumentParser, fail, parse

EXPORTER = "exporter"
EXPORTER_FALLBACK = "triton-emf-exporter"  # when the task already has an unrelated container named exporter
INIT = "triton-health-init"
PROBE_VOLUME = "triton-health"
PROBE_DIR = "/opt/triton-health"  # where Triton sees the probe: the path our own Triton image bakes it in
PROBE_SCRIPT = f"{PROBE_DIR}/health.py"
INIT_TARGET = "/mnt/triton-health"
ROUTER = "log_router"
ROUTER_CONFIG = "/fluent-bit/etc/triton/triton.conf"  # fluentbit/Dockerfile copies triton.conf there
ROUTER_TCP = "tcp://127.0.0.1:25888"  # the router's tcp input (fluentbit/triton.conf)
TRITON_FOR_ROUTER = "triton-server"  # fluentbit/triton.conf reads Triton's records by this container name
ADMIN_KEY = "TRITON_ADMIN_KEY"
DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT = 8000, 8002
BRIDGE_ALIAS = "triton"  # the exporter's link name for Triton in bridge mode

# What describe-task-definition returns and register-task-definition refuses.
READ_ONLY = (
    "taskDefinitionArn",
    "revision",
    "status",
    "requiresAttributes",
    "compatibilities",
    "registeredAt",
    "registeredBy",
    "deregisteredAt",
)
HEALTH_TIMINGS = {"interval": 30, "timeout": 6, "retries": 5, "startPeriod": 300}  # deploy/task-definition.json's
RESTART = {"enabled": True, "ignoredExitCodes": [0], "restartAttemptPeriod": 60}
ECR = re.compile(r"^(\d{12})\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/([^:@]+)")


class AdoptError(ValueError):
    """Input the command cannot adopt (exit 2): the message is the one line the user sees."""


@dataclass(frozen=True)
class Options:
    exporter_image: str | None = None
    triton_container: str | None = None
    logs: str = "keep"  # keep | firelens
    log_router_image: str | None = None
    region: str | None = None
    log_group_prefix: str | None = None
    namespace: str | None = None


@dataclass
class Result:
    """The adopted task definition and what the user should know about it."""

    taskdef: dict[str, Any]
    added: list[str] = field(default_factory=list)
    """What was missing and is now there (``--check`` prints these as missing)."""
    updated: list[str] = field(default_factory=list)
    """Sidecar images changed by the options."""
    notes: list[str] = field(default_factory=list)
    iam: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"taskRole": [], "executionRole": []})


# --- reading ----------------------------------------------------------------------------------------------------


def read(path: str) -> dict[str, Any]:
    """The JSON document at ``path`` (``-``: stdin); AdoptError when it cannot be read or parsed."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as exc:
        raise AdoptError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AdoptError(f"{path} is not JSON: not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AdoptError(f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(doc, dict):
        raise AdoptError(f"{path} is not a task definition: a JSON object is expected")
    return doc


def registrable(doc: dict[str, Any]) -> dict[str, Any]:
    """RegisterTaskDefinition's input from describe-task-definition's output (wrapped or bare)."""
    td = doc.get("taskDefinition", doc)
    if not isinstance(td, dict):
        raise AdoptError("not a task definition: taskDefinition is not an object")
    containers = td.get("containerDefinitions")
    if not isinstance(containers, list) or not containers:
        raise AdoptError("not a task definition: no containerDefinitions")
    if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in containers):
        raise AdoptError("not a task definition: every container definition needs a name")
    if not isinstance(td.get("family"), str):
        raise AdoptError("not a task definition: no family")
    out = {k: copy.deepcopy(v) for k, v in td.items() if k not in READ_ONLY}
    tags = doc.get("tags") if td is not doc else None
    if tags:
        out["tags"] = copy.deepcopy(tags)
    return out


# --- Triton ------------------------------------------------------------------------------------------------------


def words(container: dict[str, Any]) -> list[str]:
    """The container's entry point and command as words (a shell script split as the shell would)."""
    out: list[str] = []
    for part in [*(container.get("entryPoint") or []), *(container.get("command") or [])]:
        if not isinstance(part, str):
            continue
        if any(ch.isspace() for ch in part):
            try:
                out += shlex.split(part)
            except ValueError:
                out += part.split()
        else:
            out.append(part)
    return out


def runs_triton(container: dict[str, Any]) -> bool:
    image = str(container.get("image", ""))
    return "tritonserver" in image or any(re.search(r"(^|/)tritonserver$", w) for w in words(container))


def find_triton(td: dict[str, Any], name: str | None) -> dict[str, Any]:
    """The Triton container: the one named, or the only one whose image or command names tritonserver."""
    containers = td["containerDefinitions"]
    if name is not None:
        for c in containers:
            if c["name"] == name:
                return c  # type: ignore[no-any-return]
        raise AdoptError(f"--triton-container {name}: no such container (the task has {_names(containers)})")
    candidates = [c for c in containers if runs_triton(c)]
    if not candidates:
        raise AdoptError(
            f"no Triton container: no image or command names tritonserver among {_names(containers)}; "
            "pass --triton-container NAME"
        )
    if len(candidates) > 1:
        raise AdoptError(f"several containers could be Triton ({_names(candidates)}): pass --triton-container NAME")
    return candidates[0]  # type: ignore[no-any-return]


def _names(containers: Sequence[dict[str, Any]]) -> str:
    return ", ".join(str(c["name"]) for c in containers)


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag=V`` or ``--flag V`` (the last one wins, as in Triton's parser)."""
    value = None
    for i, word in enumerate(args):
        if word.startswith(flag + "="):
            value = word[len(flag) + 1 :]
        elif word == flag and i + 1 < len(args):
            value = args[i + 1]
    return value


def triton_ports(triton: dict[str, Any]) -> tuple[int, int]:
    """Triton's HTTP and metrics ports, from its command or Triton's defaults."""
    args = words(triton)
    for flag in ("--allow-http", "--allow-metrics"):
        if (flag_value(args, flag) or "").lower() in ("false", "0", "no", "off"):
            raise AdoptError(f"Triton runs with {flag}=false: the exporter reads Triton's HTTP API and metrics")
    ports = []
    for flag, default in (("--http-port", DEFAULT_HTTP_PORT), ("--metrics-port", DEFAULT_METRICS_PORT)):
        value = flag_value(args, flag)
        if value is None:
            ports.append(default)
            continue
        try:
            ports.append(int(value))
        except ValueError:
            raise AdoptError(f"cannot read Triton's {flag} {value!r}: write the port as a number") from None
    return ports[0], ports[1]


def restricts_repository(triton: dict[str, Any]) -> bool:
    """Whether Triton keeps its repository API (the index the exporter reads) behind triton-admin-key."""
    value = flag_value(words(triton), "--http-restricted-api") or ""
    groups, _, key = value.partition(":")
    return "model-repository" in groups.split(",") and key.startswith("triton-admin-key=")


# --- where the task is ------------------------------------------------------------------------------------------


def network_mode(td: dict[str, Any]) -> str:
    mode = str(td.get("networkMode", "bridge"))  # ECS's default on EC2 Linux
    if mode not in ("awsvpc", "host", "bridge"):
        raise AdoptError(f"networkMode {mode}: the exporter cannot reach Triton's ports (awsvpc, host or bridge)")
    return mode


def triton_urls(mode: str, ports: tuple[int, int]) -> tuple[str, str]:
    """TRITON_URL and TRITON_METRICS_URL as the exporter reaches Triton: one namespace, or the bridge link."""
    host = BRIDGE_ALIAS if mode == "bridge" else "localhost"
    return f"http://{host}:{ports[0]}", f"http://{host}:{ports[1]}/metrics"


def region(td: dict[str, Any], triton: dict[str, Any], opts: Options) -> str:
    """The task's region: --region, Triton's log driver's, or an ECR image's; AdoptError when none says."""
    if opts.region:
        return opts.region
    options = (triton.get("logConfiguration") or {}).get("options") or {}
    for key in ("awslogs-region", "region"):
        if options.get(key):
            return str(options[key])
    for image in (triton.get("image"), opts.exporter_image, opts.log_router_image):  # an image may be pulled across
        match = ECR.match(str(image or ""))
        if match:
            return match.group(2)
    raise AdoptError("cannot tell the task's region (no ECR image, no awslogs-region): pass --region")


def account_and_partition(td: dict[str, Any], opts: Options) -> tuple[str, str]:
    """For the IAM statements' ARNs: from the roles' ARNs or an ECR image, else a wildcard account."""
    for key in ("executionRoleArn", "taskRoleArn"):
        parts = str(td.get(key) or "").split(":")
        if len(parts) >= 5 and parts[0] == "arn" and parts[4].isdigit():
            return parts[4], parts[1]
    for image in (opts.exporter_image, opts.log_router_image):
        match = ECR.match(str(image or ""))
        if match:
            return match.group(1), "aws"
    return "*", "aws"


def prefix(td: dict[str, Any], opts: Options) -> str:
    return opts.log_group_prefix or f"/ecs/{td['family']}"


def has_gpu(td: dict[str, Any]) -> bool:
    return any(r.get("type") == "GPU" for c in td["containerDefinitions"] for r in c.get("resourceRequirements") or [])


# --- the containers this command adds -----------------------------------------------------------------------------


def is_exporter(container: dict[str, Any]) -> bool:
    """This project's exporter: reads TRITON_METRICS_URL, runs the image's own entry point (not modelsync)."""
    env = {e.get("name") for e in container.get("environment") or []}
    entry = container.get("entryPoint") or []
    return "TRITON_METRICS_URL" in env and (not entry or entry[-1] == "exporter")


def by_name(td: dict[str, Any], name: str) -> dict[str, Any] | None:
    for c in td["containerDefinitions"]:
        if c["name"] == name:
            return c  # type: ignore[no-any-return]
    return None


def router_of(td: dict[str, Any]) -> dict[str, Any] | None:
    for c in td["containerDefinitions"]:
        if c.get("firelensConfiguration"):
            return c  # type: ignore[no-any-return]
    return None


def is_our_router(router: dict[str, Any]) -> bool:
    options = (router.get("firelensConfiguration") or {}).get("options") or {}
    return options.get("config-file-value") == ROUTER_CONFIG


def awslogs(group: str, region_name: str, stream_prefix: str) -> dict[str, Any]:
    return {
        "logDriver": "awslogs",
        "options": {
            "awslogs-group": group,
            "awslogs-region": region_name,
            "awslogs-stream-prefix": stream_prefix,
            "awslogs-create-group": "true",
        },
    }


def exporter_container(
    name: str, image: str, triton: dict[str, Any], urls: tuple[str, str], mode: str, gpu: bool, namespace: str
) -> dict[str, Any]:
    """The sidecar as deploy/task-definition.json has it: not essential, restarted, waiting only for Triton's start."""
    env = {
        "TRITON_URL": urls[0],
        "TRITON_METRICS_URL": urls[1],
        "AWS_EMF_NAMESPACE": namespace,
        "EXPORTER_OUTPUT": "stdout",
        "EXPORTER_INTERVAL": "60",
        "EXPORTER_NVML": "auto" if gpu else "off",
        "EXPORTER_GPU_FAULT_ACTION": "report",
    }
    if gpu:  # NVML through the NVIDIA runtime, without reserving a GPU (docs/gpu.md)
        env |= {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    c: dict[str, Any] = {
        "name": name,
        "image": image,
        "essential": False,
        "restartPolicy": copy.deepcopy(RESTART),
        "cpu": 128,
        "memory": 256,
        "memoryReservation": 128,
        "user": "10001:10001",
        "dependsOn": [{"containerName": triton["name"], "condition": "START"}],
        "environment": [{"name": k, "value": v} for k, v in env.items()],
        "linuxParameters": {"initProcessEnabled": True},
    }
    if mode == "bridge":
        c["links"] = [f"{triton['name']}:{BRIDGE_ALIAS}"]
    return c


def init_container(image: str) -> dict[str, Any]:
    """Copies the probe from the sidecar image into the task volume Triton mounts read-only, then exits.

    Root only for the copy: ECS creates the volume owned by root. Python's version in Triton's image may differ
    from the sidecar's, so no bytecode is compiled here.
    """
    return {
        "name": INIT,
        "image": image,
        "essential": False,
        "entryPoint": ["/bin/sh", "-c"],
        "command": [f"cp -R {PROBE_DIR}/. {INIT_TARGET}/ && echo copied the health probe to {INIT_TARGET}"],
        "user": "0:0",
        "memoryReservation": 32,
        "readonlyRootFilesystem": True,
        "mountPoints": [{"sourceVolume": PROBE_VOLUME, "containerPath": INIT_TARGET, "readOnly": False}],
    }


def health_command(http_port: int) -> list[str]:
    """The deep probe where Triton's image has Python 3.8+, else a plain readiness check (curl, wget or python3).

    Which one runs is decided at each check, in the container: adopt cannot look inside the user's image.
    """
    url = "" if http_port == DEFAULT_HTTP_PORT else f" --triton-url http://localhost:{http_port}"
    ready = f"http://localhost:{http_port}/v2/health/ready"
    script = (
        f"if [ -f {PROBE_SCRIPT} ] && python3 -c 'import sys; sys.exit(sys.version_info < (3, 8))' 2>/dev/null; "
        f"then exec python3 {PROBE_SCRIPT} --deadline 4{url}; fi; "
        "echo 'WARNING: no health probe or no python3 3.8+ here: readiness only (docs/adopt.md)'; "
        f"if command -v curl >/dev/null 2>&1; then exec curl -fsS -m 4 -o /dev/null {ready}; fi; "
        f"if command -v wget >/dev/null 2>&1; then exec wget -q -T 4 -O /dev/null {ready}; fi; "
        f"exec python3 -c 'import urllib.request as u; u.urlopen(\"{ready}\", timeout=4)'"
    )
    return ["CMD-SHELL", script]


def router_container(image: str, region_name: str, log_prefix: str) -> dict[str, Any]:
    """fluentbit/'s router, as deploy/task-definition.json has it."""
    return {
        "name": ROUTER,
        "image": image,
        "essential": True,
        "cpu": 128,
        "memoryReservation": 64,
        "firelensConfiguration": {
            "type": "fluentbit",
            "options": {
                "config-file-type": "file",
                "config-file-value": ROUTER_CONFIG,
                "enable-ecs-log-metadata": "true",
            },
        },
        "environment": [
            {"name": "AWS_REGION", "value": region_name},
            {"name": "TRITON_LOG_GROUP_PREFIX", "value": log_prefix},
            {"name": "TRITON_LOG_RETENTION_DAYS", "value": "30"},
        ],
        "logConfiguration": awslogs(f"{log_prefix}/log-router", region_name, "firelens"),
    }


# --- IAM ----------------------------------------------------------------------------------------------------------


def log_group_arns(partition: str, region_name: str, account: str, group: str) -> list[str]:
    base = f"arn:{partition}:logs:{region_name}:{account}:log-group:{group}"
    return [base, f"{base}:*"]


def pull_statements(images: Sequence[str], partition: str) -> list[dict[str, Any]]:
    """ECR pull rights for the sidecar images (none for images outside ECR)."""
    repos = sorted(
        {
            f"arn:{partition}:ecr:{m.group(2)}:{m.group(1)}:repository/{m.group(3)}"
            for m in (ECR.match(i) for i in images)
            if m
        }
    )
    if not repos:
        return []
    return [
        {"Sid": "EcrAuthToken", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        {
            "Sid": "EcrPullSidecarImages",
            "Effect": "Allow",
            "Action": ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"],
            "Resource": repos,
        },
    ]


# --- adopting ----------------------------------------------------------------------------------------------------


@dataclass
class _Context:
    td: dict[str, Any]
    triton: dict[str, Any]
    opts: Options
    result: Result
    images: list[str] = field(default_factory=list)  # sidecar images this run added
    log_groups: list[str] = field(default_factory=list)  # awslogs groups the execution role writes

    @property
    def containers(self) -> list[dict[str, Any]]:
        return self.td["containerDefinitions"]  # type: ignore[no-any-return]


def ensure_router(ctx: _Context) -> None:
    """--logs firelens: fluentbit/'s router, and Triton's logs through it; this project's router gets
    --log-router-image whatever --logs says."""
    router = router_of(ctx.td)
    if router is not None and is_our_router(router):
        _update_image(ctx, router, ctx.opts.log_router_image, "log router")
        return
    if ctx.opts.logs != "firelens":
        return
    if router is not None:
        raise AdoptError(
            f"--logs firelens: the task already has a FireLens router ({router['name']}) of its own: "
            "keep it with --logs keep"
        )
    if ctx.triton["name"] != TRITON_FOR_ROUTER:
        raise AdoptError(
            f"--logs firelens: fluentbit/triton.conf reads Triton's logs from a container named {TRITON_FOR_ROUTER}, "
            f"this task's is {ctx.triton['name']}: rename it, or keep your logs (--logs keep)"
        )
    if not ctx.opts.log_router_image:
        raise AdoptError("--logs firelens needs --log-router-image (fluentbit/Dockerfile's image)")
    region_name = region(ctx.td, ctx.triton, ctx.opts)
    log_prefix = prefix(ctx.td, ctx.opts)
    ctx.containers.insert(0, router_container(ctx.opts.log_router_image, region_name, log_prefix))
    before = (ctx.triton.get("logConfiguration") or {}).get("logDriver")
    ctx.triton["logConfiguration"] = {"logDriver": "awsfirelens"}
    ctx.images.append(ctx.opts.log_router_image)
    ctx.log_groups.append(f"{log_prefix}/log-router")
    ctx.result.added.append(f"log router {ROUTER} (FireLens, fluentbit/triton.conf): log groups under {log_prefix}/")
    ctx.result.added.append(f"{ctx.triton['name']} logs through the router" + (f" (was {before})" if before else ""))
    _router_grants(ctx, region_name, log_prefix)


def _router_grants(ctx: _Context, region_name: str, log_prefix: str) -> None:
    """The router writes (and creates, per model) the groups under the prefix with the task role (docs/logs.md)."""
    account, partition = account_and_partition(ctx.td, ctx.opts)
    ctx.result.iam["taskRole"].append(
        {
            "Sid": "TritonLogRouterGroups",
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": f"arn:{partition}:logs:{region_name}:{account}:log-group:{log_prefix}/*",
        }
    )
    if not ctx.td.get("taskRoleArn"):
        ctx.result.notes.append("the task has no taskRoleArn: the log router writes with the task role; add one")


def ensure_exporter(ctx: _Context) -> dict[str, Any]:
    """The exporter, added or (its image) updated; returns it."""
    existing = next((c for c in ctx.containers if is_exporter(c)), None)
    if existing is not None:
        _update_image(ctx, existing, ctx.opts.exporter_image, "exporter")
        return existing
    name = EXPORTER if by_name(ctx.td, EXPORTER) is None else EXPORTER_FALLBACK
    if by_name(ctx.td, name) is not None:
        raise AdoptError(f"the task already has containers named {EXPORTER} and {EXPORTER_FALLBACK}")
    mode = network_mode(ctx.td)
    urls = triton_urls(mode, triton_ports(ctx.triton))
    image = ctx.opts.exporter_image
    if not image:
        raise AdoptError("--exporter-image is needed: the task has no exporter yet")
    gpu = has_gpu(ctx.td)
    namespace = ctx.opts.namespace or f"Triton/{ctx.td['family']}"
    exporter = exporter_container(name, image, ctx.triton, urls, mode, gpu, namespace)
    ctx.result.added.append(f"exporter container {name}: Triton at {urls[0]}, metrics {urls[1]}, namespace {namespace}")
    if not gpu:
        ctx.result.notes.append("no container requests a GPU: the exporter runs with NVML off")
    _exporter_logs(ctx, exporter, mode)
    ctx.containers.append(exporter)
    ctx.images.append(image)
    return exporter


def _exporter_logs(ctx: _Context, exporter: dict[str, Any], mode: str) -> None:
    """EMF to the router's tcp input (FireLens, one namespace) or to stdout, which an awslogs group extracts."""
    router = router_of(ctx.td)
    if router is not None and is_our_router(router):
        exporter["logConfiguration"] = {"logDriver": "awsfirelens"}
        if mode != "bridge":  # bridge: no shared loopback; triton.conf takes EMF from the exporter's stdout too
            _set_env(exporter, "EXPORTER_OUTPUT", ROUTER_TCP)
        if exporter["name"] != EXPORTER:
            raise AdoptError(f"fluentbit/triton.conf reads the exporter's logs from a container named {EXPORTER}")
        return
    group = f"{prefix(ctx.td, ctx.opts)}/exporter"
    exporter["logConfiguration"] = awslogs(group, region(ctx.td, ctx.triton, ctx.opts), "exporter")
    ctx.log_groups.append(group)


def ensure_admin_key(ctx: _Context, exporter: dict[str, Any]) -> None:
    """The exporter gets Triton's admin key secret when Triton restricts its repository API with it."""
    secret = next((s for s in ctx.triton.get("secrets") or [] if s.get("name") == ADMIN_KEY), None)
    if not restricts_repository(ctx.triton):
        ctx.result.notes.append(
            "Triton's repository API (load, unload) is open to whoever reaches its HTTP port: restrict it with "
            "--http-restricted-api=model-repository,model-config,statistics,trace,logging,shared-memory:"
            'triton-admin-key="$TRITON_ADMIN_KEY" and a Secrets Manager secret TRITON_ADMIN_KEY in its secrets '
            "(docs/security.md), then adopt again: the exporter gets the same secret"
        )
        return
    if secret is None:
        ctx.result.notes.append(
            "Triton restricts its repository API, but its key is not a secret named TRITON_ADMIN_KEY: "
            "give the exporter the key as that secret (docs/security.md), or it cannot read the repository index"
        )
        return
    mine = exporter.setdefault("secrets", [])
    if any(s.get("name") == ADMIN_KEY for s in mine):
        return
    mine.append(copy.deepcopy(secret))
    ctx.result.added.append(f"{exporter['name']} gets Triton's admin key secret ({ADMIN_KEY})")
    ctx.result.notes.append(
        "the execution role already reads the admin key secret for Triton; the exporter's copy needs nothing more"
    )


def ensure_probe(ctx: _Context, image: str) -> None:
    """The deep probe as Triton's healthCheck, handed over through a task volume unless the image bakes it in."""
    triton = ctx.triton
    command = " ".join((triton.get("healthCheck") or {}).get("command") or [])
    mounts = triton.get("mountPoints") or []
    mounted = any(m.get("sourceVolume") == PROBE_VOLUME for m in mounts)
    if PROBE_SCRIPT in command and not mounted:
        return  # deploy/triton.Dockerfile's image: the probe is in it
    if not any(v.get("name") == PROBE_VOLUME for v in ctx.td.get("volumes") or []):
        ctx.td.setdefault("volumes", []).append({"name": PROBE_VOLUME})
        ctx.result.added.append(f"task volume {PROBE_VOLUME} for the health probe")
    init = by_name(ctx.td, INIT)
    if init is None:
        ctx.containers.append(init_container(image))
        ctx.images.append(image)
        ctx.result.added.append(f"init container {INIT}: copies the probe from the sidecar image")
    else:
        _update_image(ctx, init, ctx.opts.exporter_image, INIT)
    if not mounted:
        mounts.append({"sourceVolume": PROBE_VOLUME, "containerPath": PROBE_DIR, "readOnly": True})
        triton["mountPoints"] = mounts
        ctx.result.added.append(f"{triton['name']} mounts the probe read-only at {PROBE_DIR}")
    deps = triton.setdefault("dependsOn", [])
    if not any(d.get("containerName") == INIT for d in deps):
        # COMPLETE, not SUCCESS: a failed copy leaves the readiness fallback, it never keeps Triton from starting.
        deps.append({"containerName": INIT, "condition": "COMPLETE"})
        ctx.result.added.append(f"{triton['name']} starts once {INIT} has run")
    if PROBE_SCRIPT not in command:
        old = triton.get("healthCheck") or {}
        timings = {k: old.get(k, v) for k, v in HEALTH_TIMINGS.items()}
        triton["healthCheck"] = {"command": health_command(triton_ports(triton)[0]), **timings}
        was = f" (replacing {command!r})" if command else ""
        ctx.result.added.append(f"{triton['name']} health check: the deep probe{was}")
        if not re.search(r"tritonserver:[^/]*-py3", str(triton.get("image", ""))):
            ctx.result.notes.append(
                f"{triton['name']}'s image is not an NGC -py3 image: without python3 3.8+ in it, the health check "
                "only asks /v2/health/ready (curl, wget or python3) and says so in its output (docs/adopt.md)"
            )


def _update_image(ctx: _Context, container: dict[str, Any], image: str | None, what: str) -> None:
    if image and container.get("image") != image:
        ctx.result.updated.append(f"{what} image {container.get('image')} -> {image}")
        container["image"] = image
        ctx.images.append(image)


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    for e in container.get("environment") or []:
        if e.get("name") == name:
            e["value"] = value
            return
    container.setdefault("environment", []).append({"name": name, "value": value})


def execution_role_statements(ctx: _Context) -> None:
    """Pull rights for the sidecar images and write rights for the awslogs groups this run added."""
    account, partition = account_and_partition(ctx.td, ctx.opts)
    statements = pull_statements(sorted(set(ctx.images)), partition)
    if ctx.log_groups:
        region_name = region(ctx.td, ctx.triton, ctx.opts)
        resources = [a for g in ctx.log_groups for a in log_group_arns(partition, region_name, account, g)]
        statements.append(
            {
                "Sid": "SidecarLogGroups",
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": resources,
            }
        )
    ctx.result.iam["executionRole"] += statements
    if statements and not ctx.td.get("executionRoleArn"):
        ctx.result.notes.append(
            "the task has no executionRoleArn: pulling from ECR and the awslogs driver need one (ecsTaskExecutionRole)"
        )


def adopt(doc: dict[str, Any], opts: Options) -> Result:
    """The task definition with the sidecar, the probe and (with --logs firelens) the router; AdoptError if it
    cannot be wired."""
    td = registrable(doc)
    result = Result(td)
    ctx = _Context(td, find_triton(td, opts.triton_container), opts, result)
    network_mode(td)
    ensure_router(ctx)
    exporter = ensure_exporter(ctx)
    ensure_admin_key(ctx, exporter)
    ensure_probe(ctx, exporter["image"])
    execution_role_statements(ctx)
    return result


def missing(doc: dict[str, Any], opts: Options) -> list[str]:
    """What adopting would add to this task definition (images aside: placeholders stand in for them)."""
    placeholders = Options(
        exporter_image=opts.exporter_image or "<exporter image>",
        triton_container=opts.triton_container,
        logs=opts.logs,
        log_router_image=opts.log_router_image or "<log router image>",
        region=opts.region or "<region>",
        log_group_prefix=opts.log_group_prefix,
        namespace=opts.namespace,
    )
    return adopt(doc, placeholders).added


# --- the command ----------------------------------------------------------------------------------------------


def parser(prog: str) -> ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        description="Add the exporter sidecar and the deep health probe to a Triton task definition you already "
        "run: reads `aws ecs describe-task-definition` output, writes `register-task-definition --cli-input-json` "
        "input; prints the IAM statements to add (docs/adopt.md).",
    )
    p.add_argument(
        "taskdef", metavar="TASKDEF.json", help="describe-task-definition output (wrapped or bare); - reads stdin"
    )
    p.add_argument("--out", metavar="FILE", help="write the task definition here (default: stdout)")
    p.add_argument("--check", action="store_true", help="write nothing: list what is missing, exit 1 if anything is")
    p.add_argument("--exporter-image", metavar="IMAGE", help="the sidecar image (needed when the task has no exporter)")
    p.add_argument("--triton-container", metavar="NAME", help="the Triton container, when several could be")
    p.add_argument(
        "--logs",
        choices=("keep", "firelens"),
        default="keep",
        help="keep the task's log configuration (the exporter logs to awslogs), or route Triton's logs per model "
        "through the FireLens router (default: keep)",
    )
    p.add_argument("--log-router-image", metavar="IMAGE", help="fluentbit/Dockerfile's image, for --logs firelens")
    p.add_argument(
        "--region", metavar="REGION", help="the task's region (default: from an ECR image or Triton's awslogs-region)"
    )
    p.add_argument(
        "--log-group-prefix", metavar="PREFIX", help="log groups the sidecars write (default: /ecs/<family>)"
    )
    p.add_argument(
        "--namespace", metavar="NAMESPACE", help="the exporter's CloudWatch namespace (default: Triton/<family>)"
    )
    p.add_argument("--iam", metavar="FILE", help="write the IAM statements here as JSON (default: stderr)")
    return p


def main(argv: Sequence[str], prog: str = "python -m exporter adopt") -> int:
    args, _ = parse(parser(prog), (), argv, {})  # the one way commands read their flags (no variables here)
    opts = Options(
        exporter_image=args.exporter_image,
        triton_container=args.triton_container,
        logs=args.logs,
        log_router_image=args.log_router_image,
        region=args.region,
        log_group_prefix=args.log_group_prefix,
        namespace=args.namespace,
    )
    try:
        doc = read(args.taskdef)
        if args.check:
            gaps = missing(doc, opts)
            for gap in gaps:
                sys.stdout.write(f"missing: {gap}\n")
            if not gaps:
                sys.stdout.write("nothing missing\n")
            return 1 if gaps else 0
        result = adopt(doc, opts)
        text = json.dumps(result.taskdef, indent=2) + "\n"
        if args.out:
            _write(args.out, text)
        else:
            sys.stdout.write(text)
        if args.iam:
            _write(args.iam, json.dumps(result.iam, indent=2) + "\n")
    except AdoptError as exc:
        return fail(prog, str(exc))
    report(result, sys.stderr, iam_inline=not args.iam)
    return 0


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise AdoptError(f"cannot write {path}: {exc.strerror or exc}") from None


def report(result: Result, out: Any, iam_inline: bool) -> None:
    """What changed, what to know, and the IAM statements, for a person reading the terminal."""
    if not result.added and not result.updated:
        out.write("nothing to add: the task definition already has the sidecar\n")
    for line in result.added:
        out.write(f"added: {line}\n")
    for line in result.updated:
        out.write(f"updated: {line}\n")
    for line in result.notes:
        out.write(f"note: {line}\n")
    if not iam_inline:
        return
    for role, key in (("task role", "taskRole"), ("execution role", "executionRole")):
        statements = result.iam[key]
        if statements:
            out.write(f"add to the {role} ({result.taskdef.get(key + 'Arn') or 'none set'}):\n")
            out.write(json.dumps(statements, indent=2) + "\n")
