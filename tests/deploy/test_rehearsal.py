"""Container rehearsal: our ECS task definitions run on a real Docker engine, on images built from our Dockerfiles.

``pytest -m rehearsal`` (or this file) runs it alone; scripts/test.sh runs it with the rest.
It needs root and apt (it installs docker.io and mmdebstrap when missing and starts its own
dockerd: scripts/rehearsal-engine.sh); without them it is skipped, saying why. How a task
definition is run, and what is not modelled, is in tests/support/ecs_local.py; how the images are
made, in tests/support/rehearsal.py.

No GPU is modelled anywhere here: the Triton container gets placeholder device nodes and a
fake ``nvidia-smi`` answering like an A10G (the deploy sample's ``ExpectGpu`` is
``A10G|L4``), so its start-up check passes; Triton itself runs on the CPU, and no NVML
library exists in any container.

What runs:

* deploy/task-definition.json as shipped (placeholders as tests/deploy/test_deploy.py fills them;
  ``ModelRepository`` is the rehearsal Triton base's copy of the core sample models);
* the stack's task definition (deploy/stack.yaml through tests/deploy/test_stack.py's evaluator)
  with ``ModelRepositoryHostPath``: the sample models come from a host volume;
* the Triton task with model sync, as the stack has it and as
  deploy/task-definition-modelsync.json has it, against moto's S3, SNS and SQS (a moto
  server on the task network's gateway, where the containers reach it): the init container
  gives the volumes ECS creates as root to the daemon's user, the daemon installs the
  bucket's model and turns HEALTHY, Triton starts only then and serves it, an upload
  announced on the topic is served within seconds through the task's queue, and at the task's
  stop that queue is gone. The queue is the controller's (MODELSYNC_FANOUT=controller): the
  controller's own fan-out code (controller/fanout.py) makes it, subscribed, for the task as
  ECS would list it, publishes the fleet's size, and removes the queue once the task stopped.
  The task's start is measured from outside, the model-sync container's start to the first
  inference answered through the task's port, and printed beside the daemon's own ``task start``
  line (TimeToServe and the sync's phases, modelsync/startup.py);
* the same task with safe rollouts on (CanaryFraction): a build that fails every request is
  rejected on the evidence of the task's own Triton and the previous build serves again.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cfnlint.decode.cfn_yaml import load as load_cfn_yaml
from tritonclient.utils import InferenceServerException

from controller.fanout import FleetSize, ServiceTask, TaskQueues
from telemetry.emf_validate import validate
from tests.deploy.test_deploy import SAMPLE, TASK_DEF, substitute
from tests.deploy.test_stack import STACK, mk, stack_taskdef
from tests.deploy.test_stack_modelsync import MODELSYNC_SAMPLE, modelsync_file
from tests.support.ecs_local import (
    FakeGpu,
    Task,
    TaskFailed,
    configured_urls,
    docker_time,
    env_dict,
    host_path,
    run_task,
    start_order,
    task_arn,
    task_id,
)
from tests.support.msync import Moto, make_zip, model_files, rollout_files, sha, upload
from tests.support.paths import REPO
from tests.support.rehearsal import MODELS, TASK_GATEWAY, Rehearsal
from tests.support.rehearsal import rehearsal as rehearsal
from tests.unit.triton_side.test_startup_check import A10G_QUERY, A10G_TABLE

pytestmark = [pytest.mark.rehearsal, pytest.mark.timeout(900)]

ROOT = REPO
BAKED_MODELS = "/opt/rehearsal/models"  # in the rehearsal Triton base (tests/support/rehearsal.py)
NO_GPU = FakeGpu(A10G_QUERY, A10G_TABLE)
MODELSYNC_UID = 10001  # the exporter image's user, which modelsync runs as
SYNC_ORDER = ["log_router", "modelsync-init", "modelsync", "triton-server", "exporter"]
# What Secrets Manager holds for the task definitions' admin-key secret (the stack's Ref and the files' sample ARN).
ADMIN_KEY = "rehearsalAdminKey0123456789abcdefABCDEF"
SECRETS = {SAMPLE["TritonAdminKeyArn"]: ADMIN_KEY}


# --- task definitions ------------------------------------------------------------------------


def shipped_task_definition() -> dict[str, Any]:
    """deploy/task-definition.json, placeholders filled like tests/deploy/test_deploy.py, models from the Triton
    base."""
    values = SAMPLE | {"ModelRepository": BAKED_MODELS}
    return json.loads(substitute(TASK_DEF.read_text(), {k: json.dumps(v)[1:-1] for k, v in values.items()}))


def template() -> dict[str, Any]:
    return json.loads(json.dumps(load_cfn_yaml(str(STACK))))


def stack_task_definition(**params: str) -> dict[str, Any]:
    """The stack's TaskDefinition in RegisterTaskDefinition's shape, for the given parameters."""
    return stack_taskdef(mk(template(), **params))


# --- helpers ---------------------------------------------------------------------------------

ADMIN = {"triton-admin-key": ADMIN_KEY}  # the header Triton's restricted APIs want (triton_http/admin.py)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    return http_post(url, None, timeout)


def http_post(
    url: str, data: bytes | None, timeout: float = 5.0, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, headers=headers or {}), timeout=timeout
        ) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError as err:
        return 0, str(err).encode()


def router_records(task: Task, router: str) -> list[dict[str, Any]]:
    """What the log-router stand-in printed, one JSON object per line."""
    out = []
    for line in task.logs(router).splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def wait_until(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def exporter_exit(task: Task) -> str:
    state = task.state("exporter")
    assert state is not None
    if state.status == "running":
        return ""
    return f"exporter exited {state.exit_code}: {task.logs('exporter').strip()[-800:]}"


# --- the shipped task definition --------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped(rehearsal: Rehearsal, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Task]:
    opts = rehearsal.options(tmp_path_factory.mktemp("shipped"), fake_gpu=NO_GPU, secrets=SECRETS)
    with run_task(rehearsal.docker, shipped_task_definition(), opts) as task:
        task.wait_for("triton-server", health="healthy", timeout=120)
        yield task


def test_shipped_task_starts_and_triton_becomes_healthy(shipped: Task) -> None:
    """Every container starts in dependsOn order; the shipped healthCheck (triton_side/health.py) passes.

    No GPU is modelled: the start-up check passes on placeholder devices and a fake nvidia-smi.
    """
    assert start_order(shipped.definition) == ["log_router", "triton-server", "exporter"]
    assert shipped.events[:3] == ["started log_router", "started triton-server", "started exporter"]
    assert shipped.health("triton-server") == "healthy"
    last = shipped.health_log("triton-server")[-1]
    assert last["ExitCode"] == 0
    assert last["Output"].startswith("OK triton http://localhost:8000: live, 4 model version(s) ready")
    logs = shipped.logs("triton-server")
    assert "startup_check: OK 1 GPU (NVIDIA A10G 23028 MiB), driver 535.104.05" in logs
    assert "1 GPU(s) requested: placeholder device nodes and a fake nvidia-smi" in " ".join(shipped.notes)
    # The VM caps memlock: the task's -1 is lowered (recorded), the rest of the ulimits are as written.
    assert any("ulimit memlock -1/-1 lowered" in n for n in shipped.notes)
    # The task's address (awsvpc: the pause container's) serves the port mappings.
    ip = shipped.ip()
    assert ip.startswith("169.254.124.")
    assert http_get(f"http://{ip}:8000/v2/health/ready")[0] == 200
    status, body = http_get(f"http://{ip}:8002/metrics")
    assert status == 200 and b'nv_inference_count{model="add",version="1"}' in body


def test_shipped_task_runs_the_router_and_triton_as_written(shipped: Task) -> None:
    """The container settings ECS applies, read back from the engine."""
    info = shipped.engine.inspect(shipped.ids["triton-server"]) or {}
    host = info["HostConfig"]
    assert host["Init"] is True and host["ShmSize"] == 1024 * 1024 * 1024
    assert host["NetworkMode"] == f"container:{shipped.pause_id}"
    assert {u["Name"]: u["Hard"] for u in host["Ulimits"]}["stack"] == 67108864
    assert info["Config"]["Healthcheck"]["Test"] == [
        "CMD",
        "python3",
        "/opt/triton-health/health.py",
        "--deadline",
        "4",
    ]
    assert info["Config"]["Healthcheck"]["StartPeriod"] == 300 * 10**9  # the shipped start period, kept
    exporter = shipped.engine.inspect(shipped.ids["exporter"]) or {}
    assert exporter["Config"]["User"] == "10001:10001"
    assert exporter["HostConfig"]["Memory"] == 256 * 1024 * 1024
    # The router listens where triton.conf says the exporter sends: 127.0.0.1:25888, in the task's namespace.
    records = router_records(shipped, "log_router")
    assert {"listening": "127.0.0.1:25888"} in records


def test_shipped_exporter_runs_and_its_emf_reaches_the_log_router(shipped: Task) -> None:
    """The shipped exporter, unchanged: it must stay up, reach Triton and send EMF to the router.

    No NVML library exists here (no GPU is modelled): the shipped EXPORTER_NVML=auto reports the GPU
    source down and keeps Triton's metrics flowing. (With the earlier `on` the exporter exited 2 at
    start, and the non-essential container without a restart policy stayed down for the task's life.)
    """
    time.sleep(3)  # the exporter's start-up: NVML is tried at once
    assert exporter_exit(shipped) == ""
    for name, url in configured_urls(shipped.containers["exporter"]).items():
        assert shipped.connect("exporter", url)["ok"], (name, url)
    wait_until(lambda: any(r.get("input") == "tcp" for r in router_records(shipped, "log_router")), 30, "EMF")


# --- the stack's task definition, models from a host volume -------------------------------------


def host_models(opts: Any) -> None:
    """The sample models on the instance's host path the stack's ModelRepositoryHostPath names."""
    models = host_path(opts, "/opt/triton/models")
    for name in MODELS:
        src = ROOT / "demo" / "models" / name
        for f in src.rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                dest = models / name / f.relative_to(src)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(f.read_bytes())


@pytest.fixture(scope="module")
def stack_task(rehearsal: Rehearsal, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Task]:
    td = stack_task_definition(ModelRepositoryHostPath="/opt/triton/models", ModelRepository="/models")
    opts = rehearsal.options(tmp_path_factory.mktemp("stack"), fake_gpu=NO_GPU, secrets=SECRETS)
    host_models(opts)
    with run_task(rehearsal.docker, td, opts) as task:
        task.wait_for("triton-server", health="healthy", timeout=120)
        yield task


def test_stack_task_serves_the_models_from_the_read_only_host_volume(stack_task: Task) -> None:
    triton = stack_task.containers["triton-server"]
    assert env_dict(triton)["MODEL_REPOSITORY"] == "/models"
    assert triton["mountPoints"] == [{"sourceVolume": "model-repository", "containerPath": "/models", "readOnly": True}]
    last = stack_task.health_log("triton-server")[-1]
    assert last["ExitCode"] == 0 and "4 model version(s) ready" in last["Output"], last
    denied = stack_task.exec("triton-server", ["sh", "-c", "touch /models/x"])
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr


def test_from_outside_the_task_the_admin_api_is_refused_and_inference_served(stack_task: Task) -> None:
    """What a client that reaches the task's ports (through the load balancer or beside it) can do: infer, read
    metadata and health; never load, unload or read the repository, over HTTP or gRPC, without the task's key,
    which ECS injected from the secret and the task definition does not show."""
    base = f"http://{stack_task.ip()}:8000"
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    status, raw = http_post(f"{base}/v2/models/add/infer", json.dumps(body).encode())
    assert status == 200 and json.loads(raw)["outputs"], raw[:300]
    assert http_get(f"{base}/v2/health/ready")[0] == 200 and http_get(f"{base}/v2/models/add")[0] == 200
    hostile = json.dumps({"parameters": {"config": "{}", "file:1/model.py": "aW1wb3J0IG9zCg=="}}).encode()
    for path, data in [
        ("/v2/repository/index", b"{}"),
        ("/v2/repository/models/add/unload", b"{}"),
        ("/v2/repository/models/add/load", hostile),
        ("/v2/models/add/config", None),
        ("/v2/logging", None),
    ]:
        status, raw = http_post(base + path, data)
        assert status == 403 and b"restricted" in raw, (path, status, raw[:200])
        status, raw = http_post(base + path, data, headers={"triton-admin-key": "guessed0123456789abcdef"})
        assert status == 403, (path, status, raw[:200])
    client = grpcclient.InferenceServerClient(f"{stack_task.ip()}:8001")
    try:
        for call in (
            client.get_model_repository_index,
            lambda: client.unload_model("add"),
            lambda: client.load_model("add", config="{}", files={"file:1/model.py": b"import os\n"}),
        ):
            with pytest.raises(InferenceServerException, match="restricted"):
                call()
        inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
        assert client.infer("add", [inp]).as_numpy("OUTPUT0") is not None
    finally:
        client.close()
    # Nothing was unloaded; the key opens the index (from outside too: the key is what guards it).
    status, raw = http_post(f"{base}/v2/repository/index", b"{}", headers=ADMIN)
    assert status == 200 and ("add", "READY") in {(m["name"], m.get("state")) for m in json.loads(raw)}
    # The key came from the secret, into the three containers that need it, and the task definition shows none.
    assert ADMIN_KEY not in json.dumps(stack_task.definition)
    for name in ("triton-server", "exporter"):
        env = stack_task.exec(name, ["sh", "-c", 'printf %s "$TRITON_ADMIN_KEY"']).stdout
        assert env == ADMIN_KEY, name
    assert stack_task.exec("log_router", ["sh", "-c", 'printf %s "$TRITON_ADMIN_KEY"']).stdout == ""
    for name in stack_task.containers:
        assert ADMIN_KEY not in stack_task.logs(name), f"{name}'s output shows the admin key"
    # The exporter (with the key) still reads the index: its coverage and heartbeat come from it.
    assert exporter_exit(stack_task) == ""


def test_stack_task_urls_connect_from_inside_and_emf_reaches_the_router(stack_task: Task) -> None:
    """Every http(s):// or tcp:// value in a container's environment connects from inside that container,
    and the exporter's EMF arrives at the router's TCP input."""
    assert exporter_exit(stack_task) == ""
    checked = []
    for name, container in stack_task.containers.items():
        for var, url in configured_urls(container).items():
            result = stack_task.connect(name, url)
            assert result["ok"], (name, var, url, result)
            checked.append((name, var))
    assert sorted(checked) == [
        ("exporter", "EXPORTER_OUTPUT"),
        ("exporter", "TRITON_METRICS_URL"),
        ("exporter", "TRITON_URL"),
    ]
    output = env_dict(stack_task.containers["exporter"])["EXPORTER_OUTPUT"]

    def emf() -> list[dict[str, Any]]:
        return [r for r in router_records(stack_task, "log_router") if r.get("input") == "tcp" and "_aws" in r["log"]]

    records = wait_until(emf, 30, "EMF at the router")
    assert all(f"tcp://{r['listen']}" == output for r in records)
    docs = [json.loads(r["log"]) for r in records]
    for r in records:
        assert validate(r["log"]) == [], r["log"][:300]
    assert {d["_aws"]["CloudWatchMetrics"][0]["Namespace"] for d in docs} == {"Triton/triton"}  # the stack's default
    # The task metadata endpoint the agent provides (modelled): the exporter attached it.
    assert {d.get("ecs_task_family") for d in docs} == {"triton"}
    assert any("ExporterHeartbeat" in d for d in docs)


def test_stack_task_with_tracing_sends_tritons_spans_to_the_relay(
    rehearsal: Rehearsal, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Tracing=true as the stack deploys it: Triton's trace flags point at the exporter's relay over the task's
    localhost, the relay measures the requests, its counts reach the log router and it logs the slow requests.
    (X-Ray itself is not reachable here: forwarding fails and is counted, which is the relay's job too.)"""
    td = stack_task_definition(
        Tracing="true", TraceRate="1", ModelRepositoryHostPath="/opt/triton/models", ModelRepository="/models"
    )
    exporter = next(c for c in td["containerDefinitions"] if c["name"] == "exporter")
    env = env_dict(exporter) | {"EXPORTER_INTERVAL": "5"}  # two windows in seconds (the stack says 60)
    exporter["environment"] = [{"name": k, "value": v} for k, v in env.items()]
    opts = rehearsal.options(tmp_path_factory.mktemp("tracing"), fake_gpu=NO_GPU, secrets=SECRETS)
    host_models(opts)
    with run_task(rehearsal.docker, td, opts) as task:
        task.wait_for("triton-server", health="healthy", timeout=120)
        for i in range(4):
            infer_add(task, float(i))

        def spans() -> list[dict[str, Any]]:
            docs = [
                json.loads(r["log"])
                for r in router_records(task, "log_router")
                if r.get("input") == "tcp" and '"SpansReceived"' in r["log"]
            ]
            return [d for d in docs if d["SpansReceived"] > 0]

        docs = wait_until(spans, 60, "SpansReceived > 0 at the router")
        assert sum(d["SpansReceived"] for d in docs) >= 12  # InferRequest, add, compute for each request

        def slow_lines() -> list[str]:  # the router stand-in does not decode FireLens's msgpack: the container's own
            return [line for line in task.logs("exporter").splitlines() if "slow request: model=add" in line]

        lines = wait_until(slow_lines, 30, "the relay's slow-request lines")
        assert all("trace_id=" in line and "span_id=" in line for line in lines)
        assert exporter_exit(task) == ""


# --- model sync: two more containers of the Triton task ------------------------------------------


@pytest.fixture(scope="module")
def task_moto() -> Iterator[Moto]:
    """moto's S3, SNS and SQS on the task network's gateway: the address an awsvpc container reaches the
    host at (the host's own 127.0.0.1 is not the container's). It stands for the AWS endpoints."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind((TASK_GATEWAY, 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address=TASK_GATEWAY, port=port, verbose=False)
    server.start()
    try:
        yield Moto(f"http://{TASK_GATEWAY}:{port}")
    finally:
        server.stop()


def aws_for(moto: Moto) -> dict[str, str]:
    """What IAM and the AWS endpoints supply, given explicitly: moto's address and test credentials. No
    region: the daemon must take it from the task definition's AWS_REGION."""
    return {"AWS_ENDPOINT_URL": moto.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _announce(moto: Moto, topic: str, bucket: str, key: str) -> None:
    """What the stack's EventBridge rule publishes for an upload (an S3 event through the topic)."""
    event = {
        "version": "0",
        "id": f"rehearsal-{time.time_ns()}",
        "detail-type": "Object Created",
        "source": "aws.s3",
        "time": "2026-12-01T00:00:00Z",
        "detail": {"bucket": {"name": bucket}, "object": {"key": key, "sequencer": f"{time.time_ns():X}"}},
    }
    moto.client("sns").publish(TopicArn=topic, Message=json.dumps(event))


@contextlib.contextmanager
def the_controllers_fanout(moto: Moto, td: dict[str, Any], opts: Any, topic: str, bucket: str) -> Iterator[str]:
    """What the deployed controller does for one Triton task (CONTROLLER_TOPIC_ARN, the daemons'
    CONTROLLER_QUEUE_NAME_PREFIX, CONTROLLER_BUCKET/PREFIX), with its own code against moto: the task's queue
    made, secured and subscribed as soon as ECS has placed the task, the fleet's size published; once the task
    stopped (ECS no longer lists it), its queue and subscription removed. Yields the task's name for run_task."""
    daemon = env_dict(next(c for c in td["containerDefinitions"] if c["name"] == "modelsync"))
    assert daemon["MODELSYNC_FANOUT"] == "controller"  # the daemon only reads the queue: someone must make it
    name = f"rh-sync-{secrets.token_hex(4)}"
    tid, prefix = task_id(name), daemon["MODELSYNC_QUEUE_NAME_PREFIX"]
    ecs = moto.client("ecs")
    ecs.create_cluster(clusterName=opts.cluster)
    # One service per task here (the fixtures' tasks share moto, the cluster and the queue prefix): the controller
    # of one never removes another's queue (its tags name another service).
    service = f"triton-{name}"
    queues = TaskQueues(opts.cluster, service, topic, prefix, ecs, moto.client("sqs"), moto.client("sns"))
    made = queues.reconcile({tid: ServiceTask(task_arn(name, opts.cluster), tid, "PENDING")})
    assert (made.created, made.subscribed, made.failures) == ([prefix + tid], [prefix + tid], 0)
    assert FleetSize(moto.client("s3"), bucket, daemon["MODELSYNC_PREFIX"], opts.cluster, service).publish(1, 1)
    yield name
    gone = queues.reconcile({})
    assert (gone.deleted, gone.failures) == ([prefix + tid], 0)


@pytest.fixture(scope="module")
def synced(
    rehearsal: Rehearsal, task_moto: Moto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Task, Moto, str, str]]:
    """The stack's Triton task with model sync on; the bucket holds add.zip (v1: adds 1)."""
    bucket = "rehearsal-sync"
    s3 = task_moto.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    topic = task_moto.client("sns").create_topic(Name="rehearsal-modelsync")["TopicArn"]
    upload(task_moto, bucket, "triton/add.zip", make_zip(model_files("add", 1)))
    td = stack_task_definition(ModelSyncBucketName=bucket, ModelSyncPrefix="triton/")
    # What IAM and CloudFormation supply, given explicitly: moto's endpoint and test credentials, and the
    # topic's ARN where the stack's Ref resolves to it.
    aws = aws_for(task_moto)
    opts = rehearsal.options(
        tmp_path_factory.mktemp("synced"),
        fake_gpu=NO_GPU,
        secrets=SECRETS,
        environment={"modelsync": aws | {"MODELSYNC_TOPIC_ARN": topic}},
    )
    assert not host_path(opts, "/opt/triton-models").exists()  # a fresh instance: no manual step
    with (
        the_controllers_fanout(task_moto, td, opts, topic, bucket) as name,
        run_task(rehearsal.docker, td, opts, name=name) as task,
    ):
        FIRST_INFERENCE[task.name] = first_inference(task)  # run_task returns as Triton starts: poll it from now
        task.wait_for("triton-server", health="healthy", timeout=180)
        yield task, task_moto, topic, bucket
    # After the task's stop (SIGTERM, stopTimeout) the controller removed its queue and subscription.
    prefix = env_dict(task.containers["modelsync"])["MODELSYNC_QUEUE_NAME_PREFIX"]
    assert task_moto.client("sqs").list_queues(QueueNamePrefix=prefix).get("QueueUrls", []) == []
    assert task_moto.client("sns").list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []


FIRST_INFERENCE: dict[str, tuple[float, int]] = {}  # task name -> (first inference that answered, refused before)
INFER_POLL = 0.1


def first_inference(task: Task, timeout: float = 180.0) -> tuple[float, int]:
    """When an inference through the task's own port first answered 200 (wall clock, like Docker's container
    times), and how many tries before it were refused or failed."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}).encode()
    url = f"http://{task.ip()}:8000/v2/models/add/infer"
    deadline, failed = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        status, _ = http_post(url, body, timeout=2.0)
        if status == 200:
            return time.time(), failed
        failed += 1
        time.sleep(INFER_POLL)
    raise AssertionError(f"no inference answered through {url} within {timeout:g} s")


def infer_add(task: Task, value: float = 1.0) -> float:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [value]}]}
    status, raw = http_post(f"http://{task.ip()}:8000/v2/models/add/infer", json.dumps(body).encode())
    assert status == 200, raw[:500]
    return float(json.loads(raw)["outputs"][0]["data"][0])


def test_model_sync_starts_before_triton_which_serves_the_synced_model(synced: tuple[Task, Moto, str, str]) -> None:
    """init (root) gives the volumes ECS created as root to uid 10001 and exits 0; the daemon installs the
    bucket's model and turns HEALTHY; only then does Triton start, load the link and pass its health check."""
    task, _, _, _ = synced
    assert start_order(task.definition) == SYNC_ORDER
    assert [e.split()[1] for e in task.events if e.startswith("started")] == SYNC_ORDER
    init, daemon, triton = (task.state(n) for n in ("modelsync-init", "modelsync", "triton-server"))
    assert init is not None and init.exit_code == 0 and init.finished_at is not None
    assert daemon is not None and daemon.started_at is not None and daemon.started_at >= init.finished_at
    healthy = [h for h in task.health_log("modelsync") if h["ExitCode"] == 0]
    assert healthy and triton is not None and triton.started_at is not None
    assert triton.started_at >= docker_time(healthy[0]["End"])  # Triton waited for the first sync
    store = host_path(task.options, "/opt/triton-models")
    assert (store.stat().st_uid, store.stat().st_gid) == (MODELSYNC_UID, MODELSYNC_UID)
    assert infer_add(task) == 2.0
    status, body = http_post(f"http://{task.ip()}:8000/v2/repository/index", b"{}", headers=ADMIN)
    assert status == 200 and {(m["name"], m.get("state")) for m in json.loads(body)} == {("add", "READY")}
    last = task.health_log("triton-server")[-1]
    assert last["ExitCode"] == 0 and "1 model version(s) ready" in last["Output"], last
    # Triton reads the task's repository and the instance's store, read-only.
    denied = task.exec("triton-server", ["sh", "-c", "touch /mnt/triton/store/x"])
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr


def test_a_task_start_from_container_start_to_the_first_inference(synced: tuple[Task, Moto, str, str]) -> None:
    """The start measured from outside (the model-sync container's start, as Docker records it, to the first
    inference that answered through the task's port) beside the daemon's own account of it: its ``task start``
    line (modelsync/startup.py), TimeToServe from its process's start to the model READY, and the sync's phases."""
    task, _, _, bucket = synced
    answered, refused = FIRST_INFERENCE[task.name]
    daemon, triton, first = task.state("modelsync"), task.state("triton-server"), task.state(SYNC_ORDER[0])
    assert daemon is not None and triton is not None and first is not None
    assert daemon.started_at is not None and triton.started_at is not None and first.started_at is not None
    assert refused > 0  # the polling began before Triton served: the first answer is within INFER_POLL of the first
    outside = answered - daemon.started_at

    def line() -> dict[str, Any] | None:
        for text in task.logs("modelsync").splitlines():
            if text.startswith('{"ts"') and '"task start: ' in text:
                return json.loads(text)  # type: ignore[no-any-return]
        return None

    said = wait_until(line, 30, "the daemon's task start line")
    phases = said["phases"]
    print(
        f"task start, container start -> first inference through the task's port: {outside:.2f} s "
        f"({answered - first.started_at:.2f} s from the task's first container, {SYNC_ORDER[0]}; Triton's container "
        f"started {triton.started_at - daemon.started_at:.2f} s after model sync's; health checks every "
        f"{task.options.health_interval:g} s here)\n"
        f"  the daemon's account: TimeToServe {said['time_to_serve_s']:.2f} s from its process's start, first sync "
        f"{said['first_sync_s']:.2f} s, outside any phase {said['outside_phases_s']:.2f} s; phases (s, unions): "
        + ", ".join(f"{p} {v:.3f}" for p, v in phases.items())
        + f"; {said['bytes_downloaded']} bytes downloaded, reused {str(said['reused']).lower()}"
    )
    (event,) = [d for d in emf_docs(task) if "TimeToServe" in d]  # one start, one event
    assert event["TimeToServe"] == said["time_to_serve_s"] and event["StartFirstReadyTime"] == phases["first_ready"]
    # Within the outside measure: the process starts after its container, READY comes before the answer (the
    # daemon asks every 0.25 s, the test every INFER_POLL; a second of slack for the two HTTP calls).
    assert triton.started_at - daemon.started_at - 0.05 <= said["time_to_serve_s"] <= outside + 1.0
    assert said["models"] == ["add"] and said["reused"] is False and phases["download"] > 0
    assert said["bytes_downloaded"] == task_object_size(synced, bucket)
    assert phases["load"] == 0.0 and phases["first_ready"] > 0  # Triton loaded the link at its own start


def emf_docs(task: Task) -> list[dict[str, Any]]:
    docs = [json.loads(line) for line in task.logs("modelsync").splitlines() if line.startswith('{"_aws"')]
    for doc in docs:
        assert validate(json.dumps(doc)) == []
    return docs


def task_object_size(synced: tuple[Task, Moto, str, str], bucket: str) -> int:
    """Bytes of the first version of triton/add.zip (what the task's first sync downloaded)."""
    _, moto, _, _ = synced
    versions = moto.client("s3").list_object_versions(Bucket=bucket, Prefix="triton/add.zip")["Versions"]
    return int(min(versions, key=lambda v: v["LastModified"])["Size"])


def test_model_sync_urls_connect_from_inside_their_containers(synced: tuple[Task, Moto, str, str]) -> None:
    """TRITON_URL=http://localhost:8000 from the daemon is this task's Triton (one network namespace)."""
    task, _, _, _ = synced
    checked = []
    for name, container in task.containers.items():
        for var, url in configured_urls(container).items():
            result = task.connect(name, url)
            assert result["ok"], (name, var, url, result)
            checked.append((name, var))
    assert ("modelsync", "TRITON_URL") in checked and ("exporter", "TRITON_METRICS_URL") in checked
    live = task.connect("modelsync", "http://localhost:8000/v2/health/live")
    assert live == {"ok": True, "status": 200, "error": None}


def test_an_upload_announced_on_the_topic_is_served_within_seconds(synced: tuple[Task, Moto, str, str]) -> None:
    """The daemon reconciles every 300 s: only the fan-out (its task's queue on the topic, made by the controller)
    makes this fast."""
    task, moto, topic, bucket = synced
    v2 = make_zip(model_files("add", 2))
    upload(moto, bucket, "triton/add.zip", v2)
    began = time.monotonic()
    _announce(moto, topic, bucket, "triton/add.zip")
    wait_until(lambda: infer_add(task) == 3.0, 60, "add v2 served")
    print(f"upload announced -> served by Triton in the task: {time.monotonic() - began:.1f} s")
    link = task.exec("modelsync", ["readlink", "/mnt/triton/task/repository/add"]).stdout.strip()
    assert link.endswith(sha(v2)), link
    emf = [json.loads(line) for line in task.logs("modelsync").splitlines() if line.startswith('{"_aws"')]
    for doc in emf:
        assert validate(json.dumps(doc)) == []
    assert any(d.get("model") == "add" and d.get("ModelInSync") == 1 and d["ModelArtifact"] == sha(v2) for d in emf)


def test_the_json_task_definition_with_model_sync_runs_the_same(
    rehearsal: Rehearsal, task_moto: Moto, tmp_path: Path
) -> None:
    """deploy/task-definition-modelsync.json, placeholders filled as a user would: the same start."""
    bucket = "rehearsal-json"
    task_moto.client("s3").create_bucket(Bucket=bucket)
    topic = task_moto.client("sns").create_topic(Name="rehearsal-json")["TopicArn"]
    upload(task_moto, bucket, "triton/add.zip", make_zip(model_files("add", 1)))
    td = modelsync_file(
        MODELSYNC_SAMPLE | {"ModelSyncBucketName": bucket, "ModelSyncPrefix": "triton/", "ModelSyncTopicArn": topic}
    )
    aws = aws_for(task_moto)
    opts = rehearsal.options(tmp_path, fake_gpu=NO_GPU, environment={"modelsync": aws}, secrets=SECRETS)
    with (
        the_controllers_fanout(task_moto, td, opts, topic, bucket) as name,
        run_task(rehearsal.docker, td, opts, name=name) as task,
    ):
        task.wait_for("triton-server", health="healthy", timeout=180)
        assert [e.split()[1] for e in task.events if e.startswith("started")] == SYNC_ORDER
        assert infer_add(task) == 2.0


@pytest.fixture(scope="module")
def rolling(
    rehearsal: Rehearsal, task_moto: Moto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Task, Moto, str, str]]:
    """The stack's Triton task with model sync and safe rollouts on (CanaryFraction 1: this one task is the
    canary share), a 10 s bake; the bucket holds add.zip (v1: adds 1).

    The stack now has the controller decide (MODELSYNC_ROLLOUTS=controller on the daemon, CONTROLLER_ROLLOUTS=on
    on the controller); this rehearsal does not run ``python -m controller`` against moto yet, so its daemon is put
    back in self mode: MODELSYNC_ROLLOUTS and MODELSYNC_CONTROLLER_QUEUE_URL removed, the stack's canary settings
    given to the daemon as MODELSYNC_* (the rollout code and the task's wiring to its own Triton are the same; the
    role's RolloutState write, which the stack no longer grants, is moto's to allow)."""
    bucket = "rehearsal-rollout"
    s3 = task_moto.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    topic = task_moto.client("sns").create_topic(Name="rehearsal-rollout")["TopicArn"]
    upload(task_moto, bucket, "triton/add.zip", make_zip(rollout_files("add", 1)))
    td = stack_task_definition(
        ModelSyncBucketName=bucket, ModelSyncPrefix="triton/", CanaryFraction="1", BakeSeconds="10",
        BakeMinRequests="20",
    )  # fmt: skip
    stack = mk(template(), ModelSyncBucketName=bucket, ModelSyncPrefix="triton/", CanaryFraction="1", BakeSeconds="10",
               BakeMinRequests="20")  # fmt: skip
    (controller,) = stack.props("ControllerTaskDefinition")["ContainerDefinitions"]
    self_mode = {e["Name"].replace("CONTROLLER_", "MODELSYNC_", 1): str(e["Value"]) for e in controller["Environment"]
                 if e["Name"] in ("CONTROLLER_CANARY_FRACTION", "CONTROLLER_BAKE_SECONDS",
                                  "CONTROLLER_BAKE_MIN_REQUESTS", "CONTROLLER_MAX_FAILURE_INCREASE",
                                  "CONTROLLER_MAX_LATENCY_RATIO")}  # fmt: skip
    for c in td["containerDefinitions"]:
        if c["name"] == "modelsync":
            assert {"MODELSYNC_ROLLOUTS", "MODELSYNC_CONTROLLER_QUEUE_URL"} <= {e["name"] for e in c["environment"]}
            c["environment"] = [
                e for e in c["environment"] if e["name"] not in ("MODELSYNC_ROLLOUTS", "MODELSYNC_CONTROLLER_QUEUE_URL")
            ] + [{"name": k, "value": v} for k, v in self_mode.items()]
    opts = rehearsal.options(
        tmp_path_factory.mktemp("rolling"),
        fake_gpu=NO_GPU,
        secrets=SECRETS,
        environment={"modelsync": aws_for(task_moto) | {"MODELSYNC_TOPIC_ARN": topic}},
    )
    # The canary share is sized from the controller's count of running tasks (fleet.json): this one.
    with (
        the_controllers_fanout(task_moto, td, opts, topic, bucket) as name,
        run_task(rehearsal.docker, td, opts, name=name) as task,
    ):
        task.wait_for("triton-server", health="healthy", timeout=180)
        yield task, task_moto, topic, bucket


def test_a_rollout_in_the_task_rejects_a_failing_build_on_its_own_tritons_metrics_and_rolls_back(
    rolling: tuple[Task, Moto, str, str],
) -> None:
    """The daemon in its container reads this task's Triton at localhost:8002 (TRITON_METRICS_URL), keeps the
    rollout's state in the bucket by conditional writes, rejects a build that fails every request after the
    bake and installs the previous one again, pinned to its S3 version."""
    task, moto, topic, bucket = rolling
    assert infer_add(task) == 2.0
    daemon = env_dict(task.containers["modelsync"])
    assert (daemon["MODELSYNC_CANARY_FRACTION"], daemon["MODELSYNC_BAKE_SECONDS"]) == ("1", "10")
    assert daemon["TRITON_METRICS_URL"] == "http://localhost:8002/metrics"
    assert task.connect("modelsync", daemon["TRITON_METRICS_URL"])["ok"]
    failed, stop = [0], False

    def traffic() -> None:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]})
        while not stop:
            status, _ = http_post(f"http://{task.ip()}:8000/v2/models/add/infer", body.encode())
            failed[0] += status != 200
            time.sleep(0.05)

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        upload(moto, bucket, "triton/add.zip", make_zip(rollout_files("add", 3, "fail")))
        _announce(moto, topic, bucket, "triton/add.zip")
        state_key = "triton/.modelsync/rollouts/add.json"

        def verdicts() -> list[str]:
            try:
                doc = json.loads(moto.client("s3").get_object(Bucket=bucket, Key=state_key)["Body"].read())
            except Exception:
                return []
            return [v["verdict"] for v in doc["verdicts"]]

        wait_until(lambda: "rejected" in verdicts(), 120, "the failing build rejected")

        def answer() -> float:
            body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]})
            status, raw = http_post(f"http://{task.ip()}:8000/v2/models/add/infer", body.encode())
            return float(json.loads(raw)["outputs"][0]["data"][0]) if status == 200 else float("nan")

        wait_until(lambda: answer() == 1.0, 60, "add v1 served again")
    finally:
        stop = True
        thread.join(10)
    assert failed[0] > 0  # the canary served it during the bake: what the bake is for

    def said() -> list[str]:
        lines = [json.loads(line) for line in task.logs("modelsync").splitlines() if line.startswith('{"ts"')]
        return [d["verdict"] for d in lines if d.get("model") == "add" and "verdict" in d]

    # Triton serves v1 a moment before its load call returns to the daemon, which logs the rollback then
    wait_until(lambda: "rolled back" in said(), 30, "the rollback logged")
    assert "rejected" in said(), said()
    emf = [json.loads(line) for line in task.logs("modelsync").splitlines() if line.startswith('{"_aws"')]
    assert any(d.get("RolloutsRejected") == 1.0 for d in emf) and all(validate(json.dumps(d)) == [] for d in emf)


# --- the harness itself, on small task definitions (what the redesign uses) ---------------------


def container(name: str, image: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "command": command, "essential": False} | extra


def test_harness_init_container_volumes_health_and_dependency_order(rehearsal: Rehearsal, tmp_path: Path) -> None:
    """A root init container prepares a task-scoped and a host volume and exits; the server waits for its
    SUCCESS, the client for the server's HEALTHY; the task's containers share one network namespace."""
    py = rehearsal.python_image
    scratch = {"sourceVolume": "scratch", "containerPath": "/scratch"}
    store = {"sourceVolume": "store", "containerPath": "/store"}
    probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/ready', timeout=2)"
    td = {
        "family": "harness-deps",
        "networkMode": "awsvpc",
        "volumes": [{"name": "scratch"}, {"name": "store", "host": {"sourcePath": "/opt/store"}}],
        "containerDefinitions": [
            container(
                "client",
                py,
                ["sleep", "infinity"],
                dependsOn=[{"containerName": "server", "condition": "HEALTHY"}],
                environment=[{"name": "SERVER_URL", "value": "http://localhost:8080/ready"}],
                linuxParameters={"initProcessEnabled": True},
            ),
            container(
                "server",
                py,
                ["sh", "-c", "touch /scratch/ready && exec python3 -m http.server 8080 -b 127.0.0.1 -d /scratch"],
                essential=True,
                user="10001:10001",
                readonlyRootFilesystem=True,
                dependsOn=[{"containerName": "init", "condition": "SUCCESS"}],
                healthCheck={"command": ["CMD", "python3", "-c", probe], "interval": 30, "startPeriod": 10},
                mountPoints=[scratch, store],
                linuxParameters={"initProcessEnabled": True},
                stopTimeout=5,
            ),
            container(
                "init",
                py,
                ["sh", "-c", "stat -c '%u:%g %a' /scratch; ls -A /scratch | wc -l; chown 10001:10001 /scratch /store"],
                user="0",
                mountPoints=[scratch, store],
            ),
        ],
    }
    with run_task(rehearsal.docker, td, rehearsal.options(tmp_path)) as task:
        assert start_order(td) == ["init", "server", "client"]
        server = task.wait_for("server", health="healthy", timeout=30)
        client = task.state("client")
        assert client is not None and client.started_at is not None and server.started_at is not None
        passed = [h for h in task.health_log("server") if h["ExitCode"] == 0]
        assert passed and client.started_at >= docker_time(passed[0]["End"])  # the client waited for HEALTHY
        init = task.state("init")
        assert init is not None and init.exit_code == 0 and init.finished_at is not None
        assert server.started_at >= init.finished_at  # the server waited for SUCCESS
        # Task-scoped volume: created empty and owned by root, as ECS does; the init container chowned both.
        assert task.logs("init").split() == ["0:0", "755", "0"]
        assert (host_path(task.options, "/opt/store").stat().st_uid) == MODELSYNC_UID
        denied = task.exec("server", ["sh", "-c", "touch /rootfs-write"])
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr
        # One network namespace: the client reaches the server's loopback listener.
        assert configured_urls(task.containers["client"]) == {"SERVER_URL": "http://localhost:8080/ready"}
        assert task.connect("client", "http://localhost:8080/ready") == {"ok": True, "status": 200, "error": None}
        volume = f"{task.name}-scratch"
        assert rehearsal.docker.api("GET", f"/volumes/{volume}")["Name"] == volume
    stops = [e for e in task.events if e.startswith("stopped")]
    assert [e.split()[1] for e in stops] == ["client", "server"]  # reverse dependency order (init had exited)
    assert rehearsal.docker.cli("volume", "inspect", volume, check=False).returncode != 0


def test_harness_essential_exit_restart_policy_and_stop_timeout(rehearsal: Rehearsal, tmp_path: Path) -> None:
    """restartPolicy restarts a container that ran long enough unless its code is ignored; an essential
    container's exit stops the task; a container ignoring SIGTERM is killed after its stopTimeout."""
    py = rehearsal.python_image
    policy = {"enabled": True, "ignoredExitCodes": [0], "restartAttemptPeriod": 60}
    td = {
        "family": "harness-exits",
        "networkMode": "awsvpc",
        "containerDefinitions": [
            container("flaky", py, ["sh", "-c", "sleep 2; exit 3"], restartPolicy=policy),
            container("once", py, ["true"], restartPolicy=policy),
            container("stubborn", py, ["sh", "-c", "trap '' TERM; sleep 1000 & wait"], stopTimeout=2),
            container("main", py, ["sh", "-c", "sleep 9; exit 7"], essential=True),
        ],
    }
    opts = rehearsal.options(tmp_path, restart_period_scale=1 / 60)  # restartAttemptPeriod 60 s -> 1 s
    with run_task(rehearsal.docker, td, opts) as task:
        assert task.wait_stopped(60) == "essential container main exited 7"
    assert task.restarts["flaky"] >= 2
    assert "once exited 0" in task.events and "once" not in task.restarts
    (stubborn,) = [e for e in task.events if e.startswith("stopped stubborn")]
    seconds = float(stubborn.split()[3])
    assert 1.5 < seconds < 10 and stubborn.endswith("exit 137"), stubborn


def test_harness_a_dependency_that_fails_stops_the_start(rehearsal: Rehearsal, tmp_path: Path) -> None:
    py = rehearsal.python_image
    td = {
        "family": "harness-fail",
        "networkMode": "awsvpc",
        "containerDefinitions": [
            container("setup", py, ["sh", "-c", "echo no; exit 4"]),
            container(
                "app",
                py,
                ["sleep", "infinity"],
                essential=True,
                dependsOn=[{"containerName": "setup", "condition": "SUCCESS"}],
            ),
        ],
    }
    with pytest.raises(TaskFailed, match=r"app cannot start: setup exited 4 \(SUCCESS wanted\)"):
        run_task(rehearsal.docker, td, rehearsal.options(tmp_path))
    leftovers = rehearsal.docker.cli("ps", "-aq", "--filter", "name=rh-harness-fail-").stdout.split()
    assert leftovers == []  # the failed start removed what it had started


def test_harness_bridge_and_host_network_modes(rehearsal: Rehearsal, tmp_path: Path) -> None:
    """bridge: the port mapping is published on a dynamic host port; host: the container is on the host's loopback."""
    py = rehearsal.python_image
    serve = ["python3", "-m", "http.server", "8080"]
    init = {"initProcessEnabled": True}  # python as PID 1 would ignore SIGTERM: the stop would wait 30 s
    bridge = {
        "family": "harness-bridge",
        "networkMode": "bridge",
        "containerDefinitions": [
            container("web", py, serve, essential=True, portMappings=[{"containerPort": 8080}], linuxParameters=init)
        ],
    }
    with run_task(rehearsal.docker, bridge, rehearsal.options(tmp_path)) as task:
        port = task.host_port("web", 8080)
        assert port != 8080 and task.ip().startswith("169.254.123.")
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/")[0] == 200, 20, "the published port")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    host = {
        "family": "harness-host",
        "networkMode": "host",
        "containerDefinitions": [
            container("web", py, [*serve[:-1], str(free), "-b", "127.0.0.1"], essential=True, linuxParameters=init)
        ],
    }
    with run_task(rehearsal.docker, host, rehearsal.options(tmp_path)) as task:
        assert task.ip() == "127.0.0.1"
        wait_until(lambda: http_get(f"http://127.0.0.1:{free}/")[0] == 200, 20, "the host's loopback")
