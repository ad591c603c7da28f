"""``python -m exporter adopt`` (issue 38): a Triton task definition a user already runs, with the sidecar added.

Every output is checked against botocore's RegisterTaskDefinition input model (what ``register-task-definition
--cli-input-json`` validates), on task definitions of each network mode, with and without GPUs, with a FireLens
router of the user's own, with several containers, and on this project's own task definitions (the files' and
the stack's), which already have everything: adopting them changes nothing. tests/deploy/test_rehearsal_adopt.py
runs an adopted task on a container engine.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters
from cfnlint.decode.cfn_yaml import load as load_cfn_yaml

from exporter import adopt as adopt_module
from exporter.adopt import INIT, PROBE_DIR, PROBE_VOLUME, AdoptError, Options, adopt, health_command, main, registrable
from tests.deploy.test_deploy import SAMPLE, TASK_DEF, substitute
from tests.deploy.test_stack import STACK, mk, stack_taskdef
from tests.deploy.test_stack_modelsync import modelsync_file
from tests.support.paths import REPO

NAME = "exporter adopt"  # what python -m exporter adopt's errors start with (telemetry.settings.fail)
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/triton-emf-exporter:0.2.0"
ROUTER_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/triton-log-router:2.32.5"
KEY_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:triton-key-AbCdEf"
RESTRICTED = (
    'tritonserver --model-repository=/models --http-restricted-api=model-repository,model-config:triton-admin-key="$K"'
)


@pytest.fixture(scope="module")
def shape() -> Any:
    return botocore.session.get_session().get_service_model("ecs").operation_model("RegisterTaskDefinition").input_shape


def triton(name: str = "triton", gpu: bool = True, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": "nvcr.io/nvidia/tritonserver:24.10-py3",
        "essential": True,
        "memoryReservation": 8192,
        "command": ["tritonserver", "--model-repository=s3://models/triton"],
        "portMappings": [{"containerPort": 8000, "protocol": "tcp"}],
        "logConfiguration": {
            "logDriver": "awslogs",
            "options": {"awslogs-group": "/ecs/serving", "awslogs-region": "eu-west-1", "awslogs-stream-prefix": "t"},
        },
    }
    if gpu:
        c["resourceRequirements"] = [{"type": "GPU", "value": "1"}]
    return c | extra


def described(*containers: dict[str, Any], mode: str | None = "awsvpc", **extra: Any) -> dict[str, Any]:
    """What ``aws ecs describe-task-definition`` prints: the wrapper and the read-only fields."""
    td: dict[str, Any] = {
        "taskDefinitionArn": "arn:aws:ecs:eu-west-1:123456789012:task-definition/serving:12",
        "family": "serving",
        "executionRoleArn": "arn:aws:iam::123456789012:role/ecsTaskExecutionRole",
        "containerDefinitions": list(containers or [triton()]),
        "revision": 12,
        "status": "ACTIVE",
        "requiresAttributes": [{"name": "com.amazonaws.ecs.capability.docker-remote-api.1.29"}],
        "compatibilities": ["EC2"],
        "requiresCompatibilities": ["EC2"],
        "registeredAt": "2026-10-01T12:00:00.000Z",
        "registeredBy": "arn:aws:iam::123456789012:user/ops",
    }
    if mode is not None:
        td["networkMode"] = mode
    return {"taskDefinition": td | extra, "tags": []}


def by_name(td: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in td["containerDefinitions"]}


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("environment", [])}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def written(tmp_path: Path, doc: dict[str, Any], name: str = "td.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


# --- the project's own task definitions: everything is there already ------------------------------------------------


def _file(path: Path, values: dict[str, str]) -> dict[str, Any]:
    return json.loads(substitute(path.read_text(), {k: json.dumps(v)[1:-1] for k, v in values.items()}))


def _stack(**params: str) -> dict[str, Any]:
    return stack_taskdef(mk(json.loads(json.dumps(load_cfn_yaml(str(STACK)))), **params))


OWN = {
    "task-definition.json": lambda: _file(TASK_DEF, SAMPLE),
    "task-definition-modelsync.json": lambda: modelsync_file(),
    "the stack": lambda: _stack(),
    "the stack with model sync": lambda: _stack(ModelSyncBucketName="models", ModelSyncPrefix="triton/"),
}


@pytest.mark.parametrize("which", OWN)
def test_adopting_our_own_task_definitions_changes_nothing(which: str, tmp_path: Path, capsys: Any) -> None:
    td = OWN[which]()
    result = adopt(td, Options())
    assert result.taskdef == td
    assert (result.added, result.updated) == ([], [])
    assert result.iam == {"taskRole": [], "executionRole": []}  # nothing added, nothing to grant
    code, out, _ = run(["--check", written(tmp_path, td)], capsys)
    assert (code, out) == (0, "nothing missing\n")


def test_new_sidecar_images_on_our_own_task_definition_change_only_the_images() -> None:
    td = OWN["task-definition.json"]()
    router = ROUTER_IMAGE.replace(":2.32.5", ":3.0.0")
    result = adopt(td, Options(exporter_image=IMAGE, log_router_image=router))
    assert result.added == [] and len(result.updated) == 2
    assert {c["name"]: c["image"] for c in result.taskdef["containerDefinitions"]} == {
        "log_router": router,
        "triton-server": by_name(td)["triton-server"]["image"],
        "exporter": IMAGE,
    }
    for c in result.taskdef["containerDefinitions"]:
        assert {k: v for k, v in c.items() if k != "image"} == {
            k: v for k, v in by_name(td)[c["name"]].items() if k != "image"
        }


# --- network modes, GPUs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "host"), [("awsvpc", "localhost"), ("host", "localhost"), ("bridge", "triton"), (None, "triton")]
)
def test_the_exporter_reaches_triton_as_the_network_mode_allows(mode: str | None, host: str, shape: Any) -> None:
    """awsvpc and host share a loopback with Triton; bridge (also ECS's default on EC2) needs the link."""
    td = adopt(described(mode=mode), Options(exporter_image=IMAGE)).taskdef
    validate_parameters(td, shape)
    exporter = by_name(td)["exporter"]
    assert env(exporter)["TRITON_URL"] == f"http://{host}:8000"
    assert env(exporter)["TRITON_METRICS_URL"] == f"http://{host}:8002/metrics"
    assert exporter.get("links") == (["triton:triton"] if host == "triton" else None)
    assert ("networkMode" in td) == (mode is not None)  # ECS's default is not written in


def test_the_sidecars_never_hold_triton_back_and_reserve_no_gpu(shape: Any) -> None:
    td = adopt(described(), Options(exporter_image=IMAGE)).taskdef
    validate_parameters(td, shape)
    c = by_name(td)
    exporter, init, server = c["exporter"], c[INIT], c["triton"]
    assert exporter["essential"] is False and init["essential"] is False
    assert exporter["dependsOn"] == [{"containerName": "triton", "condition": "START"}]
    assert exporter["restartPolicy"]["enabled"] is True
    # Triton waits only for the copy to have run (COMPLETE: a failed copy never keeps it from starting).
    assert server["dependsOn"] == [{"containerName": INIT, "condition": "COMPLETE"}]
    assert "resourceRequirements" not in exporter and "resourceRequirements" not in init
    assert env(exporter)["NVIDIA_VISIBLE_DEVICES"] == "all" and env(exporter)["EXPORTER_NVML"] == "auto"
    assert env(exporter)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env(exporter)["AWS_EMF_NAMESPACE"] == "Triton/serving"
    # Keep mode: EMF on stdout, which the awslogs driver sends to a group CloudWatch extracts metrics from.
    assert env(exporter)["EXPORTER_OUTPUT"] == "stdout"
    assert exporter["logConfiguration"]["options"]["awslogs-group"] == "/ecs/serving/exporter"
    assert exporter["logConfiguration"]["options"]["awslogs-region"] == "eu-west-1"  # Triton's awslogs-region


def test_without_gpus_nvml_is_off_and_no_nvidia_runtime_is_asked_for(shape: Any) -> None:
    result = adopt(described(triton(gpu=False)), Options(exporter_image=IMAGE))
    validate_parameters(result.taskdef, shape)
    variables = env(by_name(result.taskdef)["exporter"])
    assert variables["EXPORTER_NVML"] == "off"
    assert not {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"} & set(variables)
    assert any("no container requests a GPU" in n for n in result.notes)


def test_ports_are_read_from_tritons_command_shell_form_included() -> None:
    server = triton(
        command=["/bin/sh", "-c", "exec tritonserver --model-repository=/m --http-port 9000 --metrics-port=9002"]
    )
    td = adopt(described(server), Options(exporter_image=IMAGE)).taskdef
    variables = env(by_name(td)["exporter"])
    assert (variables["TRITON_URL"], variables["TRITON_METRICS_URL"]) == (
        "http://localhost:9000",
        "http://localhost:9002/metrics",
    )
    check = by_name(td)["triton"]["healthCheck"]["command"]
    assert check[0] == "CMD-SHELL" and "--triton-url http://localhost:9000" in check[1]
    assert "http://localhost:9000/v2/health/ready" in check[1]


# --- the probe, handed over -------------------------------------------------------------------------------------


def test_the_probe_comes_from_the_sidecar_image_through_a_read_only_volume() -> None:
    td = adopt(described(), Options(exporter_image=IMAGE)).taskdef
    c = by_name(td)
    assert {"name": PROBE_VOLUME} in td["volumes"]
    init = c[INIT]
    assert init["image"] == IMAGE and init["readonlyRootFilesystem"] is True
    assert init["mountPoints"] == [
        {"sourceVolume": PROBE_VOLUME, "containerPath": "/mnt/triton-health", "readOnly": False}
    ]
    assert f"cp -R {PROBE_DIR}/. /mnt/triton-health/" in init["command"][0]
    assert c["triton"]["mountPoints"] == [{"sourceVolume": PROBE_VOLUME, "containerPath": PROBE_DIR, "readOnly": True}]
    check = c["triton"]["healthCheck"]
    assert f"exec python3 {PROBE_DIR}/health.py --deadline 4;" in check["command"][1]
    assert (check["interval"], check["timeout"], check["retries"], check["startPeriod"]) == (30, 6, 5, 300)


def test_a_users_health_check_timings_are_kept_and_its_command_replaced() -> None:
    own = {"command": ["CMD-SHELL", "curl -f localhost:8000/v2/health/ready"], "interval": 10, "startPeriod": 600}
    result = adopt(described(triton(healthCheck=own)), Options(exporter_image=IMAGE))
    check = by_name(result.taskdef)["triton"]["healthCheck"]
    assert (check["interval"], check["startPeriod"], check["timeout"], check["retries"]) == (10, 600, 6, 5)
    assert any("replacing 'CMD-SHELL curl -f" in a for a in result.added)


def test_a_non_ngc_image_is_warned_about_python() -> None:
    result = adopt(described(triton(image="example.com/team/inference:3")), Options(exporter_image=IMAGE))
    # not named tritonserver by its image, found by its command
    assert any("not an NGC -py3 image" in n and "/v2/health/ready" in n for n in result.notes)
    assert not any("NGC" in n for n in adopt(described(), Options(exporter_image=IMAGE)).notes)


class _Ready(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/v2/health/ready" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ready_server() -> Iterator[tuple[int, type[_Ready]]]:
    handler = type("Ready", (_Ready,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


@pytest.mark.skipif(os.path.exists(f"{PROBE_DIR}/health.py"), reason="this host has the probe where Triton would")
def test_without_the_probe_the_check_asks_readiness_and_says_so(ready_server: tuple[int, type[_Ready]]) -> None:
    """The health check's fallback, run by a real shell: no probe here, so it asks /v2/health/ready and warns."""
    port, handler = ready_server
    script = health_command(port)[1]
    ok = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "readiness only" in ok.stdout
    handler.status = 503
    down = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert down.returncode != 0


# --- logs -------------------------------------------------------------------------------------------------------


def _their_router() -> dict[str, Any]:
    return {
        "name": "fluent",
        "image": "public.ecr.aws/aws-observability/aws-for-fluent-bit:stable",
        "essential": True,
        "memoryReservation": 50,
        "firelensConfiguration": {"type": "fluentbit", "options": {"enable-ecs-log-metadata": "true"}},
    }


def test_a_firelens_router_of_the_users_own_is_kept_as_it_is(shape: Any) -> None:
    server = triton(
        logConfiguration={
            "logDriver": "awsfirelens",
            "options": {"Name": "cloudwatch_logs", "region": "eu-west-1", "log_group_name": "/serving"},
        }
    )
    doc = described(_their_router(), server)
    result = adopt(doc, Options(exporter_image=IMAGE))
    validate_parameters(result.taskdef, shape)
    c = by_name(result.taskdef)
    assert c["fluent"] == _their_router()
    assert c["triton"]["logConfiguration"] == server["logConfiguration"]
    assert c["exporter"]["logConfiguration"]["logDriver"] == "awslogs"  # EMF needs raw events: not their router
    assert c["exporter"]["logConfiguration"]["options"]["awslogs-region"] == "eu-west-1"


def test_firelens_is_refused_beside_a_router_of_the_users_own(tmp_path: Path, capsys: Any) -> None:
    path = written(tmp_path, described(_their_router(), triton(name="triton-server")))
    code, out, err = run(
        [path, "--exporter-image", IMAGE, "--logs", "firelens", "--log-router-image", ROUTER_IMAGE], capsys
    )
    assert (code, out) == (2, "")
    said = "--logs firelens: the task already has a FireLens router (fluent) of its own: keep it with --logs keep"
    assert err == f"{NAME}: error: {said}\n"


@pytest.mark.parametrize("mode", ["awsvpc", "bridge"])
def test_logs_firelens_adds_the_router_and_routes_triton_through_it(mode: str, shape: Any) -> None:
    opts = Options(exporter_image=IMAGE, logs="firelens", log_router_image=ROUTER_IMAGE)
    result = adopt(described(triton(name="triton-server"), mode=mode), opts)
    validate_parameters(result.taskdef, shape)
    c = by_name(result.taskdef)
    router = c["log_router"]
    assert router["image"] == ROUTER_IMAGE and router["essential"] is True
    assert router["firelensConfiguration"]["options"]["config-file-value"] == "/fluent-bit/etc/triton/triton.conf"
    assert env(router) == {
        "AWS_REGION": "eu-west-1",
        "TRITON_LOG_GROUP_PREFIX": "/ecs/serving",
        "TRITON_LOG_RETENTION_DAYS": "30",
    }
    assert c["triton-server"]["logConfiguration"] == {"logDriver": "awsfirelens"}
    assert c["exporter"]["logConfiguration"] == {"logDriver": "awsfirelens"}
    # awsvpc: the router's tcp input on the shared loopback; bridge: none shared, EMF on stdout (triton.conf
    # takes EMF from the exporter's stdout too).
    assert env(c["exporter"])["EXPORTER_OUTPUT"] == ("tcp://127.0.0.1:25888" if mode == "awsvpc" else "stdout")
    (statement,) = result.iam["taskRole"]
    assert statement["Resource"] == "arn:aws:logs:eu-west-1:123456789012:log-group:/ecs/serving/*"
    assert "logs:CreateLogGroup" in statement["Action"]
    again = adopt(result.taskdef, opts)
    assert again.taskdef == result.taskdef and again.added == []


def test_firelens_needs_triton_named_as_the_router_config_reads_it() -> None:
    opts = Options(exporter_image=IMAGE, logs="firelens", log_router_image=ROUTER_IMAGE)
    with pytest.raises(AdoptError, match="container named triton-server, this task's is triton"):
        adopt(described(), opts)


# --- several containers: the others stay as they are ---------------------------------------------------------------


def test_with_several_containers_only_triton_gets_what_it_needs(shape: Any) -> None:
    proxy = {"name": "proxy", "image": "public.ecr.aws/nginx/nginx:1.27", "essential": True, "memoryReservation": 64}
    agent = {"name": "exporter", "image": "prom/node-exporter:v1.8", "essential": False, "memoryReservation": 32}
    doc = described(proxy, triton(), agent)
    result = adopt(doc, Options(exporter_image=IMAGE))
    validate_parameters(result.taskdef, shape)
    c = by_name(result.taskdef)
    assert c["proxy"] == proxy and c["exporter"] == agent  # a container named exporter that is not ours
    assert c["triton-emf-exporter"]["image"] == IMAGE
    original = by_name(registrable(doc))["triton"]
    changed = {k for k in c["triton"] if c["triton"].get(k) != original.get(k)}
    assert changed == {"mountPoints", "dependsOn", "healthCheck"}
    assert [x["name"] for x in result.taskdef["containerDefinitions"]] == [
        "proxy", "triton", "exporter", "triton-emf-exporter", INIT,
    ]  # fmt: skip


def test_triton_container_picks_one_of_two_candidates(shape: Any) -> None:
    doc = described(triton("triton-a"), triton("triton-b", gpu=False))
    result = adopt(doc, Options(exporter_image=IMAGE, triton_container="triton-b"))
    validate_parameters(result.taskdef, shape)
    c = by_name(result.taskdef)
    assert c["exporter"]["dependsOn"] == [{"containerName": "triton-b", "condition": "START"}]
    assert "healthCheck" in c["triton-b"] and "healthCheck" not in c["triton-a"]


# --- the admin key --------------------------------------------------------------------------------------------


def test_a_restricted_triton_gives_the_exporter_its_own_key_secret(shape: Any) -> None:
    secret = {"name": "TRITON_ADMIN_KEY", "valueFrom": KEY_ARN}
    server = triton(command=["/bin/sh", "-c", RESTRICTED], secrets=[secret])
    result = adopt(described(server), Options(exporter_image=IMAGE))
    validate_parameters(result.taskdef, shape)
    assert by_name(result.taskdef)["exporter"]["secrets"] == [secret]
    assert not any("open to whoever" in n for n in result.notes)
    # The execution role reads the secret already (Triton's): nothing more is asked for it.
    assert not any("secretsmanager" in json.dumps(s) for s in result.iam["executionRole"])


def test_an_open_triton_is_told_how_to_restrict_it_and_no_key_is_invented() -> None:
    result = adopt(described(), Options(exporter_image=IMAGE))
    assert "secrets" not in by_name(result.taskdef)["exporter"]
    (note,) = [n for n in result.notes if "open to whoever" in n]
    assert "--http-restricted-api=model-repository" in note and "docs/security.md" in note


def test_a_restriction_whose_key_is_not_a_secret_is_said() -> None:
    server = triton(command=["/bin/sh", "-c", RESTRICTED], environment=[{"name": "K", "value": "plain"}])
    result = adopt(described(server), Options(exporter_image=IMAGE))
    assert "secrets" not in by_name(result.taskdef)["exporter"]
    assert any("not a secret named TRITON_ADMIN_KEY" in n for n in result.notes)


# --- idempotence, images, --check ------------------------------------------------------------------------------


CASES = {
    "awsvpc": lambda: described(),
    "host": lambda: described(mode="host"),
    "bridge": lambda: described(mode="bridge"),
    "no gpu": lambda: described(triton(gpu=False)),
    "their router": lambda: described(_their_router(), triton()),
    "restricted": lambda: described(
        triton(command=["sh", "-c", RESTRICTED], secrets=[{"name": "TRITON_ADMIN_KEY", "valueFrom": KEY_ARN}])
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_adopting_an_adopted_definition_gives_the_same_document(case: str, tmp_path: Path, capsys: Any) -> None:
    first = tmp_path / "first.json"
    second = tmp_path / "second.json"
    code, _, err = run([written(tmp_path, CASES[case]()), "--exporter-image", IMAGE, "--out", str(first)], capsys)
    assert code == 0 and err.startswith("added: exporter container exporter"), err
    code, _, err = run([str(first), "--exporter-image", IMAGE, "--out", str(second)], capsys)
    assert code == 0 and err.startswith("nothing to add"), err
    assert second.read_bytes() == first.read_bytes()
    assert run(["--check", str(first)], capsys)[:2] == (0, "nothing missing\n")


def test_a_new_exporter_image_changes_only_the_sidecars_images() -> None:
    first = adopt(described(), Options(exporter_image=IMAGE)).taskdef
    newer = IMAGE.replace("0.2.0", "0.3.0")
    result = adopt(first, Options(exporter_image=newer))
    assert result.added == [] and len(result.updated) == 2
    expected = copy.deepcopy(first)
    for c in expected["containerDefinitions"]:
        if c["image"] == IMAGE:
            c["image"] = newer
    assert result.taskdef == expected


def test_check_lists_what_is_missing_and_exits_1(tmp_path: Path, capsys: Any) -> None:
    code, out, err = run(["--check", written(tmp_path, described())], capsys)
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert all(line.startswith("missing: ") for line in lines)
    text = "\n".join(lines)
    for what in ("exporter container", "init container", "mounts the probe", "health check: the deep probe"):
        assert what in text
    # Half adopted: the exporter is there, the probe is not.
    partial = adopt(described(), Options(exporter_image=IMAGE)).taskdef
    c = by_name(partial)
    del c["triton"]["healthCheck"], c["triton"]["mountPoints"], c["triton"]["dependsOn"]
    partial["containerDefinitions"] = [x for x in partial["containerDefinitions"] if x["name"] != INIT]
    code, out, _ = run(["--check", written(tmp_path, partial, "partial.json")], capsys)
    assert code == 1 and "exporter container" not in out and "init container" in out, out


# --- the read-only fields, the wrapper, IAM -----------------------------------------------------------------------


def test_the_read_only_fields_are_dropped_and_the_tags_kept(shape: Any) -> None:
    doc = described()
    doc["tags"] = [{"key": "team", "value": "ml"}]
    td = adopt(doc, Options(exporter_image=IMAGE)).taskdef
    validate_parameters(td, shape)
    for field in adopt_module.READ_ONLY:
        assert field not in td
    assert td["tags"] == [{"key": "team", "value": "ml"}]
    bare = adopt(doc["taskDefinition"], Options(exporter_image=IMAGE)).taskdef
    assert bare == {k: v for k, v in td.items() if k != "tags"}


def test_iam_statements_cover_what_was_added_and_nothing_more(tmp_path: Path, capsys: Any) -> None:
    iam = tmp_path / "iam.json"
    code, _, err = run([written(tmp_path, described()), "--exporter-image", IMAGE, "--iam", str(iam)], capsys)
    assert code == 0 and "add to the" not in err  # the statements went to the file
    doc = json.loads(iam.read_text())
    assert doc["taskRole"] == []  # the exporter needs no AWS call: EMF goes through the logs
    by_sid = {s["Sid"]: s for s in doc["executionRole"]}
    assert set(by_sid) == {"EcrAuthToken", "EcrPullSidecarImages", "SidecarLogGroups"}
    assert by_sid["EcrPullSidecarImages"]["Resource"] == [
        "arn:aws:ecr:us-east-1:123456789012:repository/triton-emf-exporter"
    ]
    assert by_sid["SidecarLogGroups"]["Resource"] == [
        "arn:aws:logs:eu-west-1:123456789012:log-group:/ecs/serving/exporter",
        "arn:aws:logs:eu-west-1:123456789012:log-group:/ecs/serving/exporter:*",
    ]
    code, _, err = run([written(tmp_path, described()), "--exporter-image", IMAGE], capsys)
    assert "add to the execution role (arn:aws:iam::123456789012:role/ecsTaskExecutionRole):" in err
    assert "add to the task role" not in err


def test_images_outside_ecr_need_no_pull_statement() -> None:
    result = adopt(described(), Options(exporter_image="ghcr.io/example/triton-emf-exporter:0.2.0"))
    assert [s["Sid"] for s in result.iam["executionRole"]] == ["SidecarLogGroups"]


# --- bad input: one line, exit 2 --------------------------------------------------------------------------------


BAD = {
    "no triton": (
        described({"name": "web", "image": "nginx", "memoryReservation": 64}),
        "no Triton container: no image or command names tritonserver among web; pass --triton-container NAME",
    ),
    "two candidates": (
        described(triton("a"), triton("b")),
        "several containers could be Triton (a, b): pass --triton-container NAME",
    ),
    "network none": (
        described(mode="none"),
        "networkMode none: the exporter cannot reach Triton's ports (awsvpc, host or bridge)",
    ),
    "not a task definition": ({"services": []}, "not a task definition: no containerDefinitions"),
    "no family": ({"containerDefinitions": [triton()]}, "not a task definition: no family"),
    "metrics off": (
        described(triton(command=["tritonserver", "--allow-metrics=false"])),
        "Triton runs with --allow-metrics=false: the exporter reads Triton's HTTP API and metrics",
    ),
    "port not a number": (
        described(triton(command=["sh", "-c", "tritonserver --http-port=$PORT"])),
        "cannot read Triton's --http-port '$PORT': write the port as a number",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_gets_one_line_and_exit_2(case: str, tmp_path: Path, capsys: Any) -> None:
    doc, message = BAD[case]
    code, out, err = run([written(tmp_path, doc), "--exporter-image", IMAGE], capsys)
    assert (code, out, err) == (2, "", f"{NAME}: error: {message}\n")
    assert run(["--check", written(tmp_path, doc)], capsys) == (2, "", f"{NAME}: error: {message}\n")


def test_unreadable_and_non_json_files(tmp_path: Path, capsys: Any) -> None:
    missing = tmp_path / "nope.json"
    assert run([str(missing), "--exporter-image", IMAGE], capsys) == (
        2, "", f"{NAME}: error: cannot read {missing}: No such file or directory\n",
    )  # fmt: skip
    text = tmp_path / "text.json"
    text.write_text("taskDefinition: yes\n")
    assert run([str(text), "--exporter-image", IMAGE], capsys) == (
        2, "", f"{NAME}: error: {text} is not JSON: Expecting value at line 1 column 1\n",
    )  # fmt: skip
    array = tmp_path / "array.json"
    array.write_text("[]")
    code, _, err = run([str(array), "--exporter-image", IMAGE], capsys)
    assert code == 2 and err == f"{NAME}: error: {array} is not a task definition: a JSON object is expected\n"


def test_an_unknown_triton_container_and_a_missing_image(tmp_path: Path, capsys: Any) -> None:
    path = written(tmp_path, described())
    code, _, err = run([path, "--exporter-image", IMAGE, "--triton-container", "gpu"], capsys)
    assert (code, err) == (2, f"{NAME}: error: --triton-container gpu: no such container (the task has triton)\n")
    code, _, err = run([path], capsys)
    assert (code, err) == (2, f"{NAME}: error: --exporter-image is needed: the task has no exporter yet\n")
    with pytest.raises(SystemExit) as exit_:  # argparse: an abbreviated flag is no flag
        main([path, "--exporter-im", IMAGE])
    assert exit_.value.code == 2


# --- the subcommand --------------------------------------------------------------------------------------------


def test_python_m_exporter_adopt_reads_stdin_and_writes_stdout(tmp_path: Path) -> None:
    """The command as registered in the exporter's entry point, in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "adopt", "-", "--exporter-image", IMAGE],
        input=json.dumps(described()),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    td = json.loads(proc.stdout)
    assert {c["name"] for c in td["containerDefinitions"]} == {"triton", "exporter", INIT}
    assert "added: exporter container exporter" in proc.stderr
