"""Issue 36, on the real daemon: a hostile 600,000-entry zip next to a good model, on moto's S3 and a real Triton.

``python -m modelsync`` runs as a process, the way the ECS task runs it. Before the fix its peak RSS went to
466 MB reading the zip's central directory (in the OOM-killed task, again at every start); now the zip is
refused from its end record, the good model is served, and the refusal, written to the store, keeps a
restarted daemon from downloading the zip again. A new version of the key is tried afresh.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.triton import TritonServer
from modelsync.refusals import NAME
from telemetry.emf_validate import validate
from tests.support.msync import (
    Moto,
    make_zip,
    model_files,
    moto,  # noqa: F401 - fixture
    new_bucket,
    upload,
    wait_for,
)
from tests.support.paths import REPO
from tests.unit.modelsync.zipcraft import hostile_zip

pytestmark = [pytest.mark.triton, pytest.mark.slow]
MB = 1024 * 1024
RSS_LIMIT = 300 * MB


class Daemon:
    """One ``python -m modelsync`` over a repository and store of its own; its log and EMF are files."""

    def __init__(self, root: Path, triton: TritonServer, bucket: str, moto: Moto) -> None:  # noqa: F811
        self.root, self.triton, self.bucket, self.moto = root, triton, bucket, moto
        self.emf = root / "emf.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        args = [
            *("--bucket", self.bucket, "--repository", str(self.root / "repo"), "--store", str(self.root / "store")),
            *("--triton-url", self.triton.url, "--output", f"file:{self.emf}", "--min-free-bytes", "0"),
            *("--interval", "2", "--host-id", "bounds"),
        ]
        with open(self.log(self.runs), "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "modelsync", *args], cwd=REPO, env=self.moto.env(), stderr=err
            )

    def log(self, run: int) -> Path:
        return self.root / f"daemon-{run}.log"

    def lines(self, run: int) -> list[dict[str, Any]]:
        text = self.log(run).read_text() if self.log(run).exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def peak_rss(self) -> int:
        """VmHWM: the most resident memory the process ever had (read while it still runs)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0, self.log(self.runs).read_text()[-3000:]

    def docs(self) -> list[dict[str, Any]]:
        lines = self.emf.read_bytes().splitlines() if self.emf.exists() else []
        for line in lines:
            assert validate(line) == [], line[:300]
        return [json.loads(line) for line in lines]

    def attempts(self, model: str) -> list[dict[str, Any]]:
        return [d for d in self.docs() if d.get("model") == model and "SyncAttempts" in d]

    def reconciles(self) -> int:
        return sum(1 for d in self.docs() if "ModelsInSync" in d)

    def infer(self, model: str) -> float | None:
        status, body = self.triton.infer(
            model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]
        )
        return body["outputs"][0]["data"][0] if status == 200 else None


@pytest.fixture
def daemon(moto: Moto, tmp_path: Path) -> Iterator[Daemon]:  # noqa: F811
    (tmp_path / "repo").mkdir()
    (tmp_path / "triton").mkdir()
    triton = TritonServer(tmp_path / "repo", workdir=tmp_path / "triton")
    triton.start()
    d = Daemon(tmp_path, triton, new_bucket(moto), moto)
    try:
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        for run in range(1, d.runs + 1):
            sys.stderr.write(f"--- daemon run {run} (tail)\n{d.log(run).read_text()[-3000:]}\n")
        triton.stop()


def test_a_hostile_zip_is_refused_in_bounded_memory_and_not_fetched_again_after_a_restart(
    moto: Moto,  # noqa: F811
    daemon: Daemon,
    tmp_path: Path,
) -> None:
    upload(moto, daemon.bucket, "good.zip", make_zip(model_files("good", 1)))
    hostile = tmp_path / "bad.zip"
    size = hostile_zip(hostile, "bad", 600_000)
    assert 25 * MB < size < 64 * MB
    first = upload(moto, daemon.bucket, "bad.zip", hostile.read_bytes())
    hostile.unlink()

    daemon.start()
    wait_for(lambda: daemon.infer("good") == 2.0 and daemon.attempts("bad"), timeout=120, step=0.5)
    peak = daemon.peak_rss()
    assert peak < RSS_LIMIT, f"peak RSS {peak / MB:.0f} MB"
    (refusal,) = daemon.attempts("bad")
    assert refusal["result"] == "unsafe_archive" and refusal["SyncFailures"] == 1
    reason = "600000 entries, more than the limit of 10000 (declared by its end record"
    assert any(reason in line["msg"] and line["level"] == "warning" for line in daemon.lines(1))
    (stored,) = json.loads((tmp_path / "store" / NAME).read_text())["refusals"]
    assert (stored["key"], stored["version_id"]) == ("bad.zip", first["VersionId"])
    daemon.stop()

    daemon.start()  # a restarted daemon (in ECS: after an OOM kill, or a new task on the instance)
    wait_for(lambda: any("not downloading" in line["msg"] for line in daemon.lines(2)), timeout=60, step=0.5)
    seen = daemon.reconciles()
    wait_for(lambda: daemon.reconciles() >= seen + 2, timeout=60, step=0.5)  # two more passes
    assert len(daemon.attempts("bad")) == 1  # no new attempt: nothing downloaded, nothing judged
    (remembered,) = [line for line in daemon.lines(2) if "not downloading" in line["msg"]]
    assert "s3://" in remembered["msg"] and reason in remembered["msg"]
    assert daemon.infer("good") == 2.0
    states = [d for d in daemon.docs() if d.get("model") == "bad" and "ModelInSync" in d]
    assert states[-1]["ModelInSync"] == 0 and reason in states[-1]["reason"]
    assert daemon.peak_rss() < RSS_LIMIT

    upload(moto, daemon.bucket, "bad.zip", make_zip(model_files("bad", 5)))  # a new version: tried afresh
    wait_for(lambda: daemon.infer("bad") == 6.0, timeout=60, step=0.5)
    assert [a["result"] for a in daemon.attempts("bad")] == ["unsafe_archive", "ok"]
    assert json.loads((tmp_path / "store" / NAME).read_text())["refusals"] == []  # it installed: forgotten
    daemon.stop()
