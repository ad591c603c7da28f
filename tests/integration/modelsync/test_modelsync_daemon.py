"""``python -m modelsync`` as a process: --once exit codes, crash recovery, two daemons, a real full disk.

The entry point runs with only the standard AWS variables pointing at moto
(``AWS_ENDPOINT_URL``), the way the ECS task runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.triton import TritonServer
from modelsync.store import state_dir
from telemetry.emf_validate import validate
from tests.support.msync import (
    Moto,
    leftovers,
    make_zip,
    model_files,
    moto,  # noqa: F401 - fixture
    new_bucket,
    sha,
    unique,
    upload,
    wait_for,
)
from tests.support.paths import REPO

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = REPO


class Host:
    """One GPU host's worth: a repository and store on one filesystem, its own Triton."""

    def __init__(self, root: Path, store: Path | None = None) -> None:
        self.root = root
        self._store = store
        (root / "repo").mkdir(parents=True)
        (root / "triton").mkdir()
        self.triton = TritonServer(root / "repo", workdir=root / "triton")
        self.emf = root / "emf.log"

    @property
    def repository(self) -> Path:
        return self.root / "repo"

    @property
    def store(self) -> Path:
        return self._store or self.root / "store"

    def args(self, bucket: str, *extra: str) -> list[str]:
        return [
            "--bucket",
            bucket,
            "--repository",
            str(self.repository),
            "--store",
            str(self.store),
            "--triton-url",
            self.triton.url,
            "--output",
            f"file:{self.emf}",
            "--min-free-bytes",
            "0",
            "--host-id",
            self.root.name,
            *extra,
        ]

    def once(self, moto: Moto, bucket: str, *extra: str) -> subprocess.CompletedProcess[str]:  # noqa: F811
        return subprocess.run(
            [sys.executable, "-m", "modelsync", "--once", *self.args(bucket, *extra)],
            cwd=ROOT,
            env=moto.env(),
            capture_output=True,
            text=True,
            timeout=180,
        )

    def infer(self, model: str) -> float:
        status, body = self.triton.infer(
            model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]
        )
        return body["outputs"][0]["data"][0] if status == 200 else float("nan")

    def docs(self) -> list[dict]:
        lines = self.emf.read_bytes().splitlines() if self.emf.exists() else []
        for line in lines:
            assert validate(line) == [], line[:300]
        return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    h = Host(tmp_path_factory.mktemp("host"))
    h.triton.start()
    try:
        yield h
    finally:
        h.triton.stop()


def test_once_exit_code_and_one_line_per_failed_model(moto, host: Host) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    good, bad = unique("good"), unique("bad")
    upload(moto, bucket, f"{good}.zip", make_zip(model_files(good, 1)))
    upload(moto, bucket, f"{bad}.zip", make_zip(model_files(bad, broken=True)))
    upload(moto, bucket, "notes/readme.zip", b"ignored: not directly under the prefix")
    proc = host.once(moto, bucket)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("modelsync: ")]
    assert len(lines) == 1 and lines[0].startswith(f"modelsync: {bad}: load_failed: ")
    assert "boom: this build does not load" in lines[0]
    assert host.infer(good) == 2.0
    upload(moto, bucket, f"{bad}.zip", make_zip(model_files(bad, 7)))
    proc = host.once(moto, bucket)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("modelsync: ")] == []
    assert host.infer(bad) == 8.0
    docs = host.docs()
    assert any(d.get("model") == bad and d.get("result") == "load_failed" for d in docs)
    assert proc.stdout == ""  # --output file: EMF went to the file, nothing on stdout


def test_unreachable_s3_is_one_line_and_exit_1(moto, host: Host) -> None:  # noqa: F811
    env = {**moto.env(), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    proc = subprocess.run(
        [sys.executable, "-m", "modelsync", "--once", *host.args("some-bucket")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("modelsync: ")]
    assert len(lines) == 1 and "cannot list s3://some-bucket/" in lines[0]


def test_crash_between_extract_and_flip_leaves_a_clean_repository(moto, host: Host) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    model = unique("crash")
    v1 = make_zip(model_files(model, 1))
    upload(moto, bucket, f"{model}.zip", v1)
    assert host.once(moto, bucket).returncode == 0
    v2 = make_zip(model_files(model, 2))
    upload(moto, bucket, f"{model}.zip", v2)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support" / "modelsync_crash.py"), *host.args(bucket)],
        cwd=ROOT,
        env=moto.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 137, proc.stderr  # died at the flip
    # What the crash left: the new directory complete in the store but not linked, a temporary link in staging.
    assert (host.store / model / sha(v2) / "config.pbtxt").exists()
    assert any(p.name.startswith("link-") for p in state_dir(host.repository).iterdir())
    assert os.readlink(host.repository / model).endswith(sha(v1)) and host.infer(model) == 2.0
    proc = host.once(moto, bucket)
    assert proc.returncode == 0, proc.stderr
    assert "removed staging leftover link-" in proc.stderr
    assert leftovers(host.store, host.repository) == []
    for entry in host.repository.iterdir():  # only links, each to a complete directory in the store
        assert entry.is_symlink() and (entry / "config.pbtxt").is_file(), entry
    assert os.readlink(host.repository / model).endswith(sha(v2)) and host.infer(model) == 3.0


def test_the_daemon_starts_before_triton_which_loads_its_links(moto, tmp_path: Path) -> None:  # noqa: F811
    """The Triton task's order: modelsync first, healthy once its first sync is complete; Triton then starts
    with --load-model=* over the links. Two tasks of one instance share the store: the second task's daemon
    links what the first extracted and downloads nothing."""
    bucket = new_bucket(moto)
    model = unique("first")
    data = make_zip(model_files(model, 1))
    upload(moto, bucket, f"{model}.zip", data)
    store = tmp_path / "instance-store"
    tasks = [Host(tmp_path / name, store=store) for name in ("task-a", "task-b")]

    def health(h: Host) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "modelsync.health", *h.args(bucket)],
            cwd=ROOT,
            env=moto.env(),
            capture_output=True,
            text=True,
            timeout=30,
        )

    procs: list[subprocess.Popen[str]] = []
    try:
        for h in tasks:
            first = health(h)
            assert first.returncode == 1 and "no status file" in first.stderr
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "modelsync", *h.args(bucket, "--interval", "2")],
                    cwd=ROOT,
                    env=moto.env(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            wait_for(lambda h=h: health(h).returncode == 0, timeout=60, step=0.5)  # type: ignore[misc]
            assert os.readlink(h.repository / model).endswith(sha(data))
            staged = [d for d in h.docs() if d.get("model") == model and "ModelInSync" in d]
            assert staged and staged[0]["ModelInSync"] == 0 and "loads it at its start" in staged[0]["reason"]
            h.triton.start()  # in ECS: dependsOn modelsync HEALTHY
            assert h.infer(model) == 2.0
            wait_for(
                lambda h=h: any(  # type: ignore[misc]
                    d.get("ModelInSync") == 1 for d in h.docs() if d.get("model") == model
                ),
                timeout=30,
                step=0.5,
            )
        (a_attempt,) = [d for d in tasks[0].docs() if d.get("model") == model and "SyncAttempts" in d]
        (b_attempt,) = [d for d in tasks[1].docs() if d.get("model") == model and "SyncAttempts" in d]
        assert a_attempt["SyncBytesDownloaded"] == len(data) and "SyncLoadTime" not in a_attempt
        assert b_attempt.get("reused") is True and "SyncBytesDownloaded" not in b_attempt
        assert {p.name for p in (store / model).iterdir()} == {sha(data), f"{sha(data)}.json"}  # one copy
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=20) == 0, p.stderr.read() if p.stderr else ""
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for h in tasks:
            h.triton.stop()


def test_two_daemons_on_one_bucket_converge(moto, tmp_path: Path) -> None:  # noqa: F811
    """Both hosts read one queue, so each event reaches one of them; the reconcile brings the other along."""
    bucket = new_bucket(moto)
    model = unique("fleet")
    sqs = moto.client("sqs")
    queue = sqs.create_queue(QueueName=unique("fleet-"))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    moto.client("s3").put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": arn,
                    "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
                    "Filter": {"Key": {"FilterRules": [{"Name": "suffix", "Value": ".zip"}]}},
                }
            ]
        },
    )
    hosts = [Host(tmp_path / name) for name in ("host-a", "host-b")]
    procs = []
    try:
        for h in hosts:
            h.triton.start()
        for h in hosts:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "modelsync", *h.args(bucket, "--queue-url", queue, "--interval", "3")],
                    cwd=ROOT,
                    env=moto.env(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        v1, v2 = make_zip(model_files(model, 1)), make_zip(model_files(model, 2))
        upload(moto, bucket, f"{model}.zip", v1)
        wait_for(lambda: all(h.infer(model) == 2.0 for h in hosts), timeout=60, step=0.3)
        upload(moto, bucket, f"{model}.zip", v2)
        wait_for(lambda: all(h.infer(model) == 3.0 for h in hosts), timeout=60, step=0.3)
        for h in hosts:
            assert os.readlink(h.repository / model).endswith(sha(v2))
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=20) == 0, p.stderr.read() if p.stderr else ""
        artifacts = {
            (h.root.name, d["ModelArtifact"])
            for h in hosts
            for d in h.docs()
            if d.get("model") == model and "ModelInSync" in d and d["ModelInSync"] == 1
        }
        assert ("host-a", sha(v2)) in artifacts and ("host-b", sha(v2)) in artifacts
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for h in hosts:
            h.triton.stop()


# --- a real full disk: a small tmpfs holds repository and store ----------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[None]:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({proc.stderr.strip()}); test_disk_full_during_a_write_leaves_"
            "nothing covers ENOSPC through the write layer"
        )
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_real_full_filesystem_refuses_with_the_old_version_serving(moto, tmp_path: Path) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    model = unique("tiny")
    disk = tmp_path / "disk"
    with tmpfs(disk, "size=4m,nr_inodes=64"):
        h = Host(disk / "host")
        h.triton.workdir = tmp_path / "triton"
        h.triton.workdir.mkdir()
        h.triton.start()
        try:
            v1 = make_zip(model_files(model, 1))
            upload(moto, bucket, f"{model}.zip", v1)
            assert h.once(moto, bucket).returncode == 0
            # Too big for the filesystem: refused by the free-space check before anything is fetched.
            big = make_zip({**model_files(model, 2), f"{model}/1/weights.bin": os.urandom(6 * 1024 * 1024)})
            upload(moto, bucket, f"{model}.zip", big)
            proc = h.once(moto, bucket)
            assert proc.returncode == 1 and f"modelsync: {model}: disk_full: " in proc.stderr, proc.stderr
            assert "headroom" in proc.stderr
            assert h.infer(model) == 2.0 and os.readlink(h.repository / model).endswith(sha(v1))
            # Small in bytes but many files: the kernel runs out of inodes mid-extraction (a real ENOSPC).
            many = make_zip({**model_files(model, 3), **{f"{model}/1/part{i}.txt": b"x" for i in range(80)}})
            upload(moto, bucket, f"{model}.zip", many)
            proc = h.once(moto, bucket)
            assert proc.returncode == 1 and f"modelsync: {model}: disk_full: " in proc.stderr, proc.stderr
            assert "No space left on device" in proc.stderr
            assert h.infer(model) == 2.0 and os.readlink(h.repository / model).endswith(sha(v1))
            assert leftovers(h.store, h.repository) == []
            assert {p.name for p in (h.store / model).iterdir()} == {sha(v1), f"{sha(v1)}.json"}
            upload(moto, bucket, f"{model}.zip", make_zip(model_files(model, 4)))
            assert h.once(moto, bucket).returncode == 0  # the space was given back: the next archive installs
            assert h.infer(model) == 5.0
        finally:
            h.triton.stop()
            time.sleep(0.2)
