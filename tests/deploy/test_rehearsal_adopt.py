"""Container rehearsal of ``python -m exporter adopt``: a plain user task, adopted, runs as ECS would run it.

The user's task is what someone who already runs Triton has: one container on the stock Triton image (here the
rehearsal's stand-in for ``nvcr.io/nvidia/tritonserver``, which has no probe in it) running ``tritonserver``
with their own flags, the admin API restricted with a key from a secret, and nothing else. The command adds the
exporter and an init container of the sidecar image that hands the probe over through a task volume; this file
proves the adopted task serves, its sidecar emits EMF (reading the repository index with the key it was given),
and Triton's health check (the probe from the volume, not from the image) passes.

No GPU is modelled: the Triton container's GPU request gets placeholder devices (ecs_local.FakeGpu), Triton
runs on the CPU, and the exporter's NVML source reports itself down. Log drivers are not modelled: the
exporter's EMF is read from its stdout, which the awslogs driver would send to CloudWatch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.adopt import INIT, PROBE_DIR, Options, adopt
from telemetry.emf_validate import validate
from tests.deploy.test_rehearsal import NO_GPU, http_get, http_post, wait_until
from tests.support.ecs_local import Task, env_dict, run_task, start_order
from tests.support.paths import REPO
from tests.support.rehearsal import Rehearsal, dockerfile_base
from tests.support.rehearsal import rehearsal as rehearsal

pytestmark = [pytest.mark.rehearsal, pytest.mark.timeout(900)]

TRITON_BASE = dockerfile_base(REPO / "deploy" / "triton.Dockerfile")  # the stock image stand-in: no probe inside
EXPORTER_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/triton-emf-exporter:0.1.0"
KEY_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:users-triton-key-Xy12Ab"
ADMIN_KEY = "usersOwnAdminKey0123456789abcdef"
RESTRICTED = "model-repository,model-config,statistics,trace,logging,shared-memory"


def user_task() -> dict[str, Any]:
    """A user's own Triton task as describe-task-definition prints it: one container, their flags, their secret."""
    command = (
        "exec tritonserver --model-repository=/opt/rehearsal/models --exit-timeout-secs=5 "
        f'--http-restricted-api={RESTRICTED}:triton-admin-key="$TRITON_ADMIN_KEY"'
    )
    return {
        "taskDefinition": {
            "taskDefinitionArn": "arn:aws:ecs:us-east-1:123456789012:task-definition/users-triton:3",
            "family": "users-triton",
            "revision": 3,
            "status": "ACTIVE",
            "networkMode": "awsvpc",
            "executionRoleArn": "arn:aws:iam::123456789012:role/ecsTaskExecutionRole",
            "containerDefinitions": [
                {
                    "name": "triton",
                    "image": TRITON_BASE,
                    "essential": True,
                    "memoryReservation": 2048,
                    "command": ["/bin/sh", "-c", command],
                    "resourceRequirements": [{"type": "GPU", "value": "1"}],
                    "secrets": [{"name": "TRITON_ADMIN_KEY", "valueFrom": KEY_ARN}],
                    "portMappings": [{"containerPort": 8000}, {"containerPort": 8001}, {"containerPort": 8002}],
                    "linuxParameters": {"initProcessEnabled": True},
                    "stopTimeout": 10,
                    "logConfiguration": {
                        "logDriver": "awslogs",
                        "options": {"awslogs-group": "/ecs/users-triton", "awslogs-region": "us-east-1"},
                    },
                }
            ],
            "requiresAttributes": [{"name": "com.amazonaws.ecs.capability.secrets.asm.environment-variables"}],
            "compatibilities": ["EC2"],
            "registeredAt": "2026-11-02T10:00:00.000Z",
        }
    }


@pytest.fixture(scope="module")
def adopted(rehearsal: Rehearsal, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Task]:
    td = adopt(user_task(), Options(exporter_image=EXPORTER_IMAGE)).taskdef
    images = rehearsal.images | {TRITON_BASE: TRITON_BASE}
    opts = rehearsal.options(
        tmp_path_factory.mktemp("adopted"), images=images, fake_gpu=NO_GPU, secrets={KEY_ARN: ADMIN_KEY}
    )
    with run_task(rehearsal.docker, td, opts) as task:
        task.wait_for("triton", health="healthy", timeout=180)
        yield task


def test_the_probe_is_handed_over_through_the_volume_and_the_health_check_passes(adopted: Task) -> None:
    """The init container of the sidecar image copies the probe and exits; Triton, started after it, runs the deep
    probe from the read-only volume (its own image has none) and turns healthy with the restricted index read."""
    assert start_order(adopted.definition) == [INIT, "triton", "exporter"]
    assert [e.split()[1] for e in adopted.events if e.startswith("started")] == [INIT, "triton", "exporter"]
    init = adopted.state(INIT)
    assert init is not None and init.exit_code == 0, adopted.logs(INIT)
    assert "copied the health probe" in adopted.logs(INIT)
    last = adopted.health_log("triton")[-1]
    assert last["ExitCode"] == 0, last
    assert last["Output"].startswith("OK triton http://localhost:8000: live, 4 model version(s) ready"), last
    assert "readiness only" not in last["Output"]  # the deep probe ran, not the fallback
    denied = adopted.exec("triton", ["sh", "-c", f"touch {PROBE_DIR}/x"])
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr
    mounts = adopted.exec("triton", ["cat", "/proc/mounts"]).stdout
    assert f" {PROBE_DIR} " in mounts  # a mount, not the image's own folder


def test_the_adopted_task_serves_and_keeps_the_admin_api_closed(adopted: Task) -> None:
    base = f"http://{adopted.ip()}:8000"
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    status, raw = http_post(f"{base}/v2/models/add/infer", json.dumps(body).encode())
    assert status == 200 and json.loads(raw)["outputs"], raw[:300]
    assert http_get(f"{base}/v2/health/ready")[0] == 200
    status, raw = http_post(f"{base}/v2/repository/index", b"{}")
    assert status == 403 and b"restricted" in raw  # the user's restriction, untouched


def test_the_sidecar_reads_triton_with_the_key_and_emits_valid_emf(adopted: Task) -> None:
    """The exporter reaches both URLs it was given from inside its container, has the key from the same secret as
    Triton, and its EMF (stdout, for the awslogs driver) carries each model's state from the restricted index."""
    exporter = adopted.containers["exporter"]
    env = env_dict(exporter)
    assert (env["TRITON_URL"], env["TRITON_METRICS_URL"]) == ("http://localhost:8000", "http://localhost:8002/metrics")
    for url in (env["TRITON_URL"] + "/v2/health/ready", env["TRITON_METRICS_URL"]):
        assert adopted.connect("exporter", url)["ok"], url
    key = adopted.exec("exporter", ["sh", "-c", 'printf %s "$TRITON_ADMIN_KEY"']).stdout
    assert key == ADMIN_KEY

    def emf() -> list[dict[str, Any]]:
        return [json.loads(line) for line in adopted.logs("exporter").splitlines() if line.startswith('{"_aws"')]

    docs = wait_until(lambda: [d for d in emf() if d.get("model") == "add" and d.get("state")], 150, "EMF for add")
    assert docs[0]["state"] == "READY"
    assert all(validate(json.dumps(d)) == [] for d in emf())
    state = adopted.state("exporter")
    assert state is not None and state.status == "running", adopted.logs("exporter")[-800:]
    assert ADMIN_KEY not in adopted.logs("exporter")


def test_adopting_the_running_definition_again_changes_nothing(adopted: Task) -> None:
    again = adopt(adopted.definition, Options())
    assert again.taskdef == adopted.definition and again.added == []


def test_the_health_check_falls_back_to_readiness_without_the_probe(rehearsal: Rehearsal, tmp_path: Path) -> None:
    """Where the probe cannot run (here: it was never copied), the same health check asks /v2/health/ready and says
    so: Triton still turns healthy."""
    td = adopt(user_task(), Options(exporter_image=EXPORTER_IMAGE)).taskdef
    for c in td["containerDefinitions"]:
        if c["name"] == INIT:
            c["command"] = ["echo copy skipped"]  # the probe never reaches the volume
    images = rehearsal.images | {TRITON_BASE: TRITON_BASE}
    opts = rehearsal.options(tmp_path, images=images, fake_gpu=NO_GPU, secrets={KEY_ARN: ADMIN_KEY})
    with run_task(rehearsal.docker, td, opts) as task:
        task.wait_for("triton", health="healthy", timeout=180)
        last = task.health_log("triton")[-1]
        assert last["ExitCode"] == 0 and "readiness only" in last["Output"], last
