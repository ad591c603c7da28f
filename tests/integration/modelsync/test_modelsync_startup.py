"""A task's start measured as a whole (modelsync/startup.py): ``python -m modelsync`` as a process on moto's S3 with a
real Triton, in the Triton task's order (the daemon first, Triton once the daemon is healthy) and with Triton already
up. Each start writes one ``task start`` JSON line and one EMF ``start`` event, with plausible phases: a first start
downloads, a second task of the instance links the store's copy (reused, 0 bytes), and a daemon restarted inside its
task reports nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from modelsync.startup import PHASES
from tests.integration.modelsync.test_modelsync_daemon import Host
from tests.support.msync import (
    Moto,
    make_zip,
    model_files,
    moto,  # noqa: F401 - fixture
    new_bucket,
    unique,
    upload,
    wait_for,
)
from tests.support.paths import REPO

pytestmark = [pytest.mark.triton, pytest.mark.slow]
TICK = 0.05  # the kernel's start time of a process is in 10 ms ticks; the test's own clock reads add a little


def daemon(moto: Moto, h: Host, bucket: str) -> subprocess.Popen[bytes]:  # noqa: F811
    log = (h.root / "daemon.log").open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "modelsync", *h.args(bucket, "--interval", "2")],
            cwd=REPO,
            env=moto.env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    finally:
        log.close()


def lines(h: Host) -> list[dict[str, Any]]:
    path = h.root / "daemon.log"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def starts(h: Host) -> list[dict[str, Any]]:
    return [x for x in lines(h) if str(x.get("msg", "")).startswith("task start")]


def start_events(h: Host) -> list[dict[str, Any]]:
    return [d for d in h.docs() if "TimeToServe" in d]


def healthy(moto: Moto, h: Host, bucket: str) -> bool:  # noqa: F811
    proc = subprocess.run(
        [sys.executable, "-m", "modelsync.health", *h.args(bucket)],
        cwd=REPO,
        env=moto.env(),
        capture_output=True,
        timeout=30,
    )
    return proc.returncode == 0


def check_one_start(h: Host, models: list[str], began: float, seen: float) -> dict[str, Any]:
    """The start's JSON line and its EMF event: one each, saying the same, phases inside the start."""
    (line,) = starts(h)
    tts = line["time_to_serve_s"]
    assert line["msg"] == f"task start: serving {len(models)} models after {tts:.1f} s"
    assert line["models"] == sorted(models) and line["since"] == "process start" and line["host"] == h.root.name
    assert 0 < tts <= seen - began + TICK  # the process started after ``began``; the line came before ``seen``
    assert set(line["phases"]) == set(PHASES) and all(0 <= v <= tts for v in line["phases"].values())
    assert line["first_sync_s"] + line["phases"]["first_ready"] == pytest.approx(tts, abs=0.003)
    assert 0 <= line["outside_phases_s"] < tts
    (event,) = start_events(h)
    assert event["TimeToServe"] == tts and event["host"] == h.root.name and event["models"] == len(models)
    assert {p: event[f"Start{p.title().replace('_', '')}Time"] for p in PHASES} == line["phases"]
    assert event["reused"] is line["reused"] and event["bytes_downloaded"] == line["bytes_downloaded"]
    return line


def test_two_task_starts_on_one_store_from_process_start_to_ready(moto, tmp_path: Path) -> None:  # noqa: F811
    """The Triton task's order: the daemon syncs, turns healthy, Triton starts and loads the links. The start counts
    from the daemon process's start to the model READY: at least until Triton was started, at most until the line.
    Task B on the same instance store links what task A extracted: reused, not a byte downloaded."""
    bucket = new_bucket(moto)
    model = unique("start")
    data = make_zip({**model_files(model, 1), f"{model}/1/weights.bin": os.urandom(1 << 20)})
    upload(moto, bucket, f"{model}.zip", data)
    store = tmp_path / "instance-store"
    tasks = [Host(tmp_path / name, store=store) for name in ("task-a", "task-b")]
    procs: list[subprocess.Popen[bytes]] = []
    measured = []
    try:
        for h in tasks:
            began = time.time()
            procs.append(daemon(moto, h, bucket))
            wait_for(lambda h=h: healthy(moto, h, bucket), timeout=60, step=0.2)  # type: ignore[misc]
            triton_started = time.time()  # in ECS: dependsOn modelsync HEALTHY
            h.triton.start()
            wait_for(lambda h=h: starts(h), timeout=60, step=0.1)  # type: ignore[misc]
            seen = time.time()
            assert h.infer(model) == 2.0
            line = check_one_start(h, [model], began, seen)
            assert line["time_to_serve_s"] >= triton_started - began - TICK  # READY only once Triton ran
            assert line["phases"]["load"] == 0.0  # Triton was not up: it loaded the link at its start
            assert line["phases"]["first_ready"] > 0 and line["phases"]["list"] > 0
            measured.append(line)
        first, second = measured
        assert first["reused"] is False and first["bytes_downloaded"] == len(data)
        assert first["phases"]["download"] > 0 and first["phases"]["verify"] > 0 and first["phases"]["place"] > 0
        assert second["reused"] is True and second["bytes_downloaded"] == 0
        # linked, then the flip (a flip can take less than the millisecond the phases are rounded to)
        assert second["phases"]["verify"] == 0.0  # its download phase is the HEAD only: bytes_downloaded 0 above
        assert 0.0 <= second["phases"]["place"] < first["phases"]["place"] + 1.0
        assert "SyncBytesDownloaded" not in next(d for d in tasks[1].docs() if "SyncAttempts" in d)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=20) == 0
        # Task A's daemon restarts inside its task: the first sync was done; not a task start, nothing reported.
        procs.append(daemon(moto, tasks[0], bucket))
        wait_for(lambda: any("earlier run in this task" in str(x.get("msg")) for x in lines(tasks[0])), timeout=30)
        wait_for(lambda: sum(x.get("msg") == "modelsync started" for x in lines(tasks[0])) == 2, timeout=30)
        time.sleep(3)  # a pass or two at --interval 2
        assert len(starts(tasks[0])) == 1 and len(start_events(tasks[0])) == 1
        procs[-1].send_signal(signal.SIGTERM)
        assert procs[-1].wait(timeout=20) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for h in tasks:
            h.triton.stop()
        for h in tasks:
            log = h.root / "daemon.log"
            tail = log.read_text()[-3000:] if log.exists() else ""
            sys.stderr.write(f"--- {h.root.name} daemon log (tail)\n{tail}\n")


def test_with_triton_up_the_daemon_loads_and_phases_are_unions(moto, tmp_path: Path) -> None:  # noqa: F811
    """Triton already running (outside ECS): the daemon loads each model itself, the load is a phase of the start and
    the first READY comes right after the first sync. A phase is the union of the attempts' intervals: never more
    than the sum of the per-model times, never less than the longest."""
    bucket = new_bucket(moto)
    names = [unique("up"), unique("up")]
    for i, name in enumerate(names):
        upload(moto, bucket, f"{name}.zip", make_zip(model_files(name, i + 1)))
    h = Host(tmp_path / "host")
    h.triton.start()
    proc = None
    try:
        began = time.time()
        proc = daemon(moto, h, bucket)
        wait_for(lambda: starts(h), timeout=60, step=0.1)
        line = check_one_start(h, names, began, time.time())
        assert [h.infer(n) for n in names] == [2.0, 3.0]
        assert (
            line["phases"]["load"] > 0 and line["phases"]["first_ready"] < line["phases"]["load"] + 5.0
        )  # loaded in the pass, not at a start
        assert line["reused"] is False and line["bytes_downloaded"] > 0
        attempts = [d for d in h.docs() if "SyncAttempts" in d]
        assert len(attempts) == 2
        for phase, metric in (("download", "SyncDownloadTime"), ("verify", "SyncVerifyTime"), ("load", "SyncLoadTime")):
            per_model = [d[metric] / 1000 for d in attempts]
            assert max(per_model) - 0.002 <= line["phases"][phase] <= sum(per_model) + 0.002, (phase, per_model)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        h.triton.stop()
