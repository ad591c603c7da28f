"""deploy/task-definition.json: valid for ECS, and consistent with the images and configs it names.

Validation is offline against botocore's own ``ecs`` service model (the shape the
RegisterTaskDefinition API accepts). The semantic checks tie the task definition to the
files it depends on: the probe path the Triton image copies to, the FireLens config path
the log-router image copies to, the Fluent Bit inputs and matches, and the settings
``python -m exporter --help`` documents. Two tests run the task's own commands: the
Triton start-up chain against fake GPUs, and the health check against a real Triton.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import botocore.session
import pytest
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters

from tests.support.paths import REPO
from tests.unit.triton_side.test_startup_check import A10G_QUERY, A10G_TABLE, L40S_QUERY, L40S_TABLE, fake_dev, fake_smi

ROOT = REPO
TASK_DEF = ROOT / "deploy" / "task-definition.json"
DOCS = ROOT / "docs" / "deploy.md"

# Placeholder -> a value of the shape a user would substitute (see docs/deploy.md).
SAMPLE = {
    "AccountId": "123456789012",
    "Region": "us-east-1",
    "TritonTag": "24.10-checked",
    "ExporterTag": "0.1.0",
    "LogRouterTag": "2.32.5",
    "ModelRepository": "s3://example-models/triton",
    "ExpectGpu": "A10G|L4",
    "Namespace": "Triton/triton",  # the stack's default: Triton/<stack name>, the task family
    "TritonAdminKeyArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:triton-admin-key-AbCdEf",
}
PLACEHOLDER = re.compile(r"\$\{(\w+)\}")

# Settings the exporter reads (the list); NVIDIA_* belong to the nvidia runtime.
EXPORTER_SETTINGS = {
    "TRITON_URL",
    "TRITON_METRICS_URL",
    "AWS_EMF_NAMESPACE",
    "EXPORTER_OUTPUT",
    "EXPORTER_INTERVAL",
    "EXPORTER_NVML",
    "EXPORTER_GPU_FAULT_ACTION",
}
RUNTIME_VARS = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}


def substitute(text: str, values: dict[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


@pytest.fixture(scope="module")
def taskdef() -> dict:
    # json.dumps keeps a value like A10G|L4 valid inside the JSON strings.
    return json.loads(substitute(TASK_DEF.read_text(), {k: json.dumps(v)[1:-1] for k, v in SAMPLE.items()}))


def containers(td: dict) -> dict[str, dict]:
    return {c["name"]: c for c in td["containerDefinitions"]}


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("environment", [])}


@pytest.fixture(scope="module")
def ecs_input_shape():
    model = botocore.session.get_session().get_service_model("ecs")
    return model.operation_model("RegisterTaskDefinition").input_shape


def test_placeholders_are_the_documented_ones():
    used = set(PLACEHOLDER.findall(TASK_DEF.read_text()))
    assert used == set(SAMPLE)
    docs = DOCS.read_text()
    for name in used:
        assert f"${{{name}}}" in docs, f"docs/deploy.md does not explain ${{{name}}}"


def test_valid_register_task_definition_input(taskdef, ecs_input_shape):
    validate_parameters(taskdef, ecs_input_shape)


def test_validator_catches_a_broken_definition(taskdef, ecs_input_shape):
    """Guard for the test above: the same validator refuses a wrong type and an unknown key."""
    broken = json.loads(json.dumps(taskdef))
    containers(broken)["exporter"]["essential"] = "false"
    containers(broken)["triton-server"]["healthCheck"]["startPeriodSeconds"] = 300
    with pytest.raises(ParamValidationError) as err:
        validate_parameters(broken, ecs_input_shape)
    assert "essential" in str(err.value) and "startPeriodSeconds" in str(err.value)


def test_task_shape(taskdef):
    assert taskdef["requiresCompatibilities"] == ["EC2"]
    # awsvpc: the three containers share one network namespace, so the exporter reaches
    # Triton and the Fluent Bit tcp input on localhost.
    assert taskdef["networkMode"] == "awsvpc"
    assert set(containers(taskdef)) == {"triton-server", "exporter", "log_router"}
    for c in taskdef["containerDefinitions"]:
        assert c.get("memory") or c.get("memoryReservation"), f"{c['name']} needs memory on EC2"


def test_triton_gets_most_of_the_cpu_units(taskdef):
    """CPU units are reservations and, under contention, weights: a Triton without any gets 2 shares against
    128 for each sidecar, under 1% of the CPU when the exporter or the router is busy."""
    cpu = {c["name"]: c.get("cpu", 0) for c in taskdef["containerDefinitions"]}
    assert cpu["triton-server"] >= 1024 and cpu["triton-server"] > 2 * sum(
        v for k, v in cpu.items() if k != "triton-server"
    )


def test_triton_container(taskdef):
    triton = containers(taskdef)["triton-server"]
    assert triton["essential"] is True
    gpus = [r for r in triton["resourceRequirements"] if r["type"] == "GPU"]
    assert gpus and int(gpus[0]["value"]) >= 1
    assert sorted(p["containerPort"] for p in triton["portMappings"]) == [8000, 8001, 8002]
    assert all("hostPort" not in p or p["hostPort"] == p["containerPort"] for p in triton["portMappings"])
    assert triton["logConfiguration"]["logDriver"] == "awsfirelens"
    script = triton["command"][-1]
    assert triton["command"][:2] == ["/bin/sh", "-c"]
    assert re.match(r"python3 /opt/triton-health/startup_check\.py && exec tritonserver ", script)


def triton_dockerfile_dest() -> str:
    text = (ROOT / "deploy" / "triton.Dockerfile").read_text()
    copies = [line for line in text.splitlines() if line.startswith("COPY ")]
    assert len(copies) == 1, "the Triton-side folder goes in with one COPY"
    words = shlex.split(copies[0])[1:]
    assert words[:-1] == ["triton_side/"], words
    return words[-1]


def test_health_check_matches_probe_and_ecs_limits(taskdef):
    hc = containers(taskdef)["triton-server"]["healthCheck"]
    cmd = hc["command"]
    assert cmd[0] == "CMD"
    dest = triton_dockerfile_dest()
    assert cmd[1] == "python3" and cmd[2] == dest.rstrip("/") + "/health.py"
    deadline = float(cmd[cmd.index("--deadline") + 1]) if "--deadline" in cmd else 4.0
    assert hc["timeout"] >= deadline + 1, "ECS must not kill the probe before its own deadline reports"
    # ECS limits: interval 5-300, timeout 2-60, retries 1-10, startPeriod 0-300.
    assert 5 <= hc["interval"] <= 300 and 2 <= hc["timeout"] <= 60
    assert 1 <= hc["retries"] <= 10 and 0 <= hc["startPeriod"] <= 300
    assert hc["timeout"] < hc["interval"]
    # Triton answers nothing until the initial model load ends: give big models minutes.
    assert hc["startPeriod"] + hc["interval"] * hc["retries"] >= 300


def test_exporter_container(taskdef):
    exporter = containers(taskdef)["exporter"]
    assert exporter["essential"] is False, "a sidecar failure must not stop inference"
    assert exporter["dependsOn"] == [{"containerName": "triton-server", "condition": "START"}]
    assert "resourceRequirements" not in exporter, "the GPU stays assigned to Triton"
    env = env_of(exporter)
    assert set(env) == EXPORTER_SETTINGS | RUNTIME_VARS
    # NVML: the agent gives the nvidia runtime to any container of a GPU task that has
    # NVIDIA_VISIBLE_DEVICES in its environment; utility mounts libnvidia-ml.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    # auto, never on: with on, a task placed where NVML cannot load (driver, runtime) would lose its
    # exporter, and every metric with it, for the task's life (exit 2 at start). With auto the GPU source
    # reports itself down with the reason and the Triton metrics keep flowing.
    assert env["EXPORTER_NVML"] == "auto"
    # An action on production is off by default: the stack's and the module's GpuFaultAction turns it on.
    assert env["EXPORTER_GPU_FAULT_ACTION"] == "report"
    # A sidecar that exits anyway (a bug, the OOM killer) is restarted rather than silent until the task ends.
    assert exporter["restartPolicy"]["enabled"] is True and 0 in exporter["restartPolicy"]["ignoredExitCodes"]
    assert env["TRITON_URL"] == "http://localhost:8000"
    assert env["TRITON_METRICS_URL"] == "http://localhost:8002/metrics"
    assert exporter["user"].split(":")[0] not in ("0", "root")
    assert exporter["logConfiguration"]["logDriver"] == "awsfirelens"
    assert exporter["memoryReservation"] < exporter["memory"]


def test_exporter_env_names_are_documented_by_the_cli(taskdef):
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    documented = set(
        re.findall(
            r"\b[A-Z][A-Z0-9_]*[A-Z0-9]\b", " ".join(re.findall(r"\[env: ([^\]]+)\]", " ".join(proc.stdout.split())))
        )
    )
    assert documented >= EXPORTER_SETTINGS, EXPORTER_SETTINGS - documented
    assert set(env_of(containers(taskdef)["exporter"])) - RUNTIME_VARS <= documented


def fluentbit_conf() -> str:
    return (ROOT / "fluentbit" / "triton.conf").read_text()


def test_log_router_matches_the_fluent_bit_image(taskdef):
    router = containers(taskdef)["log_router"]
    assert router["essential"] is True
    fl = router["firelensConfiguration"]
    assert fl["type"] == "fluentbit"
    assert fl["options"]["config-file-type"] == "file"
    copies = [
        shlex.split(line)[1:]
        for line in (ROOT / "fluentbit" / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
    ]
    assert ["triton.conf", fl["options"]["config-file-value"]] in copies
    # The router's own logs cannot go through itself.
    assert router["logConfiguration"]["logDriver"] == "awslogs"
    # Every ${VAR} the Fluent Bit config reads is set by the task or baked into the image.
    baked = set(re.findall(r"^\s*(?:ENV\s+)?([A-Z_]+)=", (ROOT / "fluentbit" / "Dockerfile").read_text(), re.M))
    needed = set(re.findall(r"\$\{([A-Z_]+)\}", fluentbit_conf()))
    docker_sets = {"HOSTNAME"}  # Docker sets it in every container
    assert needed <= set(env_of(router)) | baked | docker_sets, needed - set(env_of(router)) - baked


def test_fluent_bit_routes_the_containers_by_name(taskdef):
    conf = fluentbit_conf()
    for name in ("triton-server", "exporter"):
        assert f"{name}-firelens-" in conf, f"triton.conf never matches the {name} container"
    output = env_of(containers(taskdef)["exporter"])["EXPORTER_OUTPUT"]
    m = re.fullmatch(r"tcp://(127\.0\.0\.1|localhost):(\d+)", output)
    assert m, output
    tcp_input = re.search(r"\[INPUT\]\s+Name\s+tcp\b(.*?)(?=\n\[|\Z)", conf, re.S)
    assert tcp_input, "triton.conf has no tcp input for the exporter's EMF"
    assert re.search(rf"^\s*Port\s+{m.group(2)}\s*$", tcp_input.group(1), re.M)
    assert re.search(r"^\s*Listen\s+(127\.0\.0\.1|0\.0\.0\.0)\s*$", tcp_input.group(1), re.M)


# --- the task's own commands ----------------------------------------------------------------


def run_triton_command(taskdef: dict, tmp: Path, query: str, table: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The triton-server command as the container runs it, with fake GPUs and a fake tritonserver."""
    triton = containers(taskdef)["triton-server"]
    fake_smi(tmp, query, table)
    fake_dev(tmp)
    marker = tmp / "tritonserver.args"
    server = tmp / "bin" / "tritonserver"
    server.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{marker}"\n')
    server.chmod(0o755)
    dest = triton_dockerfile_dest().rstrip("/")
    script = triton["command"][-1].replace(dest + "/", str(ROOT / "triton_side") + "/")
    env = {
        **env_of(triton),
        "PATH": f"{tmp / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "STARTUP_DEV_DIR": str(tmp / "dev"),
        "CUDA_VERSION": "12.6.2.004",
    }
    proc = subprocess.run([*triton["command"][:2], script], env=env, capture_output=True, text=True, timeout=60)
    return proc, marker


def test_triton_command_starts_server_after_a_passing_check(taskdef, tmp_path):
    proc, marker = run_triton_command(taskdef, tmp_path, A10G_QUERY, A10G_TABLE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("startup_check: OK 1 GPU (NVIDIA A10G 23028 MiB)")
    args = marker.read_text().splitlines()
    assert f"--model-repository={SAMPLE['ModelRepository']}" in args
    assert "--metrics-config" in args and "summary_latencies=true" in args


def test_triton_command_stops_with_one_line_on_the_wrong_gpu(taskdef, tmp_path):
    proc, marker = run_triton_command(taskdef, tmp_path, L40S_QUERY, L40S_TABLE)
    assert proc.returncode == 5
    assert not marker.exists(), "tritonserver must not start after a failed check"
    assert proc.stderr == "startup_check: FAIL gpu-model: GPU 0 is 'NVIDIA L40S'; expected /A10G|L4/\n"


def run_health_check(taskdef: dict, url: str) -> subprocess.CompletedProcess:
    hc = containers(taskdef)["triton-server"]["healthCheck"]
    dest = triton_dockerfile_dest().rstrip("/")
    cmd = [w.replace(dest + "/", str(ROOT / "triton_side") + "/") for w in hc["command"][1:]]
    env = {"PATH": os.environ["PATH"], "TRITON_URL": url}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=hc["timeout"])


@pytest.mark.triton
def test_health_check_command_on_real_triton(taskdef, triton_factory, triton):
    healthy = triton_factory(models=["add"])
    proc = run_health_check(taskdef, healthy.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The session server has "broken", which failed to load: the probe must name it.
    proc = run_health_check(taskdef, triton.url)
    assert proc.returncode == 1
    assert "broken" in proc.stdout


def test_docs_show_the_health_check_the_task_definition_ships(taskdef):
    """docs/health.md shows the healthCheck block, and every one in the docs or the README is the one deployed."""
    import json as _json

    pattern = re.compile(r'```json\n\s*"healthCheck": (\{.*?\n\s*\})\n\s*```', re.S)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = {doc.name: pattern.findall(doc.read_text()) for doc in pages}
    assert blocks["health.md"], "docs/health.md lost its healthCheck block"
    for name, found in blocks.items():
        for block in found:
            assert _json.loads(block) == containers(taskdef)["triton-server"]["healthCheck"], name
