"""``python -m exporter adopt`` on the Terraform module's task definition (issue 38).

tests/unit/cli/test_adopt.py adopts the project's task definition files and the stack's; this adopts the one the
Terraform module registers: ``aws_ecs_task_definition.this`` as tests/support/tfeval.py evaluates ``terraform
plan`` (its ``container_definitions`` are the JSON the provider sends to RegisterTaskDefinition, its ``volume``
blocks the task's volumes), in every scenario of tests/deploy/test_terraform.py (the defaults, model sync with
and without rollouts, tracing, OTLP, GPU drains, task protection, a host volume...). It already has everything
adopt adds, so ``--check`` reports nothing missing, adopting it changes nothing and grants nothing, and new
sidecar images change only what docs/adopt.md says they change.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.validate import validate_parameters

from exporter.adopt import Options, adopt, main
from tests.deploy.test_stack import ACCOUNT, REGION, REGISTRY, VALUES
from tests.deploy.test_terraform import SCENARIOS, module_for

# The module's values known only after apply, as the created resources would give them.
AFTER_APPLY = {
    "<aws_iam_role.execution.arn>": f"arn:aws:iam::{ACCOUNT}:role/triton-execution-20250101",
    "<aws_iam_role.task.arn>": f"arn:aws:iam::{ACCOUNT}:role/triton-task-20250101",
    "<aws_secretsmanager_secret.admin_key.arn>": (
        f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:gpu-cluster-triton-triton-admin-key-2025-AbCdEf"
    ),
    "<aws_sns_topic.modelsync[0].arn>": f"arn:aws:sns:{REGION}:{ACCOUNT}:terraform-20250101",
    "<aws_sqs_queue.controller[0].url>": f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/terraform-20250102",
}
_PLACEHOLDER = re.compile(r"<[a-z_]+\.[^<>]+>")


def _known(x: Any) -> Any:
    if isinstance(x, str):
        x = AFTER_APPLY.get(x, x)
        assert not _PLACEHOLDER.search(x), f"a value known after apply that the test does not fill in: {x}"
        return x
    if isinstance(x, list):
        return [_known(v) for v in x]
    if isinstance(x, dict):
        return {k: _known(v) for k, v in x.items()}
    return x


def module_taskdef(params: dict[str, str]) -> dict[str, Any]:
    """RegisterTaskDefinition's input as the module's aws_ecs_task_definition.this sends it."""
    args = module_for(params).plan()["aws_ecs_task_definition.this"]
    td: dict[str, Any] = {
        "family": args["family"],
        "taskRoleArn": str(args["task_role_arn"]),
        "executionRoleArn": str(args["execution_role_arn"]),
        "networkMode": args["network_mode"],
        "containerDefinitions": json.loads(args["container_definitions"]),
        "requiresCompatibilities": args["requires_compatibilities"],
    }
    volumes = [
        {"name": v["name"], **({"host": {"sourcePath": v["host_path"]}} if v.get("host_path") is not None else {})}
        for v in args.get("volume") or []
    ]  # no host path: a task volume
    if volumes:
        td["volumes"] = volumes
    for key, api in (("cpu", "cpu"), ("memory", "memory")):  # the Triton task has no task-level size
        if args.get(key) is not None:
            td[api] = str(args[key])
    if args.get("tags"):
        td["tags"] = [{"key": k, "value": v} for k, v in args["tags"].items()]
    return _known(td)


@pytest.fixture(scope="module")
def shape() -> Any:
    return botocore.session.get_session().get_service_model("ecs").operation_model("RegisterTaskDefinition").input_shape


@pytest.fixture(scope="module")
def taskdefs() -> dict[str, dict[str, Any]]:
    return {scenario: module_taskdef(VALUES | params) for scenario, params in SCENARIOS.items()}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_adopting_the_modules_task_definition_changes_nothing(
    scenario: str, taskdefs: dict[str, dict[str, Any]], shape: Any, tmp_path: Path, capsys: Any
) -> None:
    td = taskdefs[scenario]
    validate_parameters(td, shape)  # what the module registers is a RegisterTaskDefinition input
    result = adopt(copy.deepcopy(td), Options())
    assert result.taskdef == td
    assert (result.added, result.updated) == ([], [])
    assert result.iam == {"taskRole": [], "executionRole": []}  # nothing added, nothing to grant
    path = tmp_path / "module.json"
    path.write_text(json.dumps(td))
    # --check: nothing missing, exit 0. Wrapped as describe-task-definition prints it, too.
    assert main(["--check", str(path)]) == 0
    assert capsys.readouterr().out == "nothing missing\n"
    wrapped = tmp_path / "described.json"
    wrapped.write_text(json.dumps({"taskDefinition": td | {"revision": 3, "status": "ACTIVE"}, "tags": []}))
    assert main(["--check", str(wrapped)]) == 0
    assert capsys.readouterr().out == "nothing missing\n"
    # And the command writes the same document back, saying there was nothing to add.
    out = tmp_path / "adopted.json"
    assert main([str(path), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == td
    assert capsys.readouterr().err.startswith("nothing to add: the task definition already has the sidecar\n")


def test_the_scenarios_adopt_different_task_definitions(taskdefs: dict[str, dict[str, Any]]) -> None:
    """Not vacuous: the scenarios register tasks with and without model sync's containers and volumes, the trace
    relay, the OTLP output, the controller's queue, the admin key."""
    names = {tuple(c["name"] for c in td["containerDefinitions"]) for td in taskdefs.values()}
    assert names == {
        ("log_router", "triton-server", "exporter"),
        ("log_router", "modelsync-init", "modelsync", "triton-server", "exporter"),
    }
    assert len({json.dumps(td, sort_keys=True) for td in taskdefs.values()}) >= 15
    exporter = [next(c for c in td["containerDefinitions"] if c["name"] == "exporter") for td in taskdefs.values()]
    env = {e["name"] for c in exporter for e in c["environment"]}
    assert {"CONTROLLER_QUEUE_URL", "EXPORTER_OTLP_SEMCONV", "EXPORTER_TASK_PROTECTION"} <= env
    assert all(
        c["secrets"][0]["valueFrom"] == AFTER_APPLY["<aws_secretsmanager_secret.admin_key.arn>"] for c in exporter
    )


@pytest.mark.parametrize("scenario", ["defaults", "modelsync-rollouts"])
def test_new_sidecar_images_change_only_the_sidecars_images(scenario: str, taskdefs: dict[str, dict[str, Any]]) -> None:
    """docs/adopt.md: --exporter-image changes the image of the exporter (and of triton-health-init, which the
    module's task does not need: its Triton image has the probe) and --log-router-image the router's; nothing
    else, model sync's containers included."""
    td = taskdefs[scenario]
    exporter, router = f"{REGISTRY}/triton-emf-exporter:9.9.9", f"{REGISTRY}/triton-log-router:9.9.9"
    result = adopt(copy.deepcopy(td), Options(exporter_image=exporter, log_router_image=router))
    assert result.added == [] and len(result.updated) == 2, result.updated
    expected = copy.deepcopy(td)
    for c in expected["containerDefinitions"]:
        c["image"] = {"exporter": exporter, "log_router": router}.get(c["name"], c["image"])
    assert result.taskdef == expected


def test_check_is_not_vacuous_on_the_modules_task(
    taskdefs: dict[str, dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    """The module's task without its exporter and Triton's deep health check: --check lists both, exit 1."""
    td = copy.deepcopy(taskdefs["modelsync"])
    td["containerDefinitions"] = [c for c in td["containerDefinitions"] if c["name"] != "exporter"]
    for c in td["containerDefinitions"]:
        c["dependsOn"] = [d for d in c.get("dependsOn", []) if d["containerName"] != "exporter"]
        if c["name"] == "triton-server":
            del c["healthCheck"]
    path = tmp_path / "stripped.json"
    path.write_text(json.dumps(td))
    assert main(["--check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "missing: exporter container" in out and "health check: the deep probe" in out, out
