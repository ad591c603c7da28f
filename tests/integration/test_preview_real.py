"""The dashboard preview command end to end: a demo run against a real Triton, drawn to a PNG."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from demo.preview import collect, logsinsights
from demo.preview.emf import Store
from tests.unit.demo.test_preview import ROOT, dashboard_query

# a whole demo run with a rollout to its verdict, drawn: three minutes on a busy 2-core machine.
pytestmark = pytest.mark.timeout(600)


@pytest.mark.triton
def test_the_preview_command_draws_a_real_run(tmp_path: Path) -> None:
    out = tmp_path / "preview.png"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "demo.preview",
            "--window",
            "2",
            "--windows",
            "3",
            "--out",
            str(out),
            "--keep",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    meta, groups = collect.load(tmp_path / "run" / "events.jsonl")
    assert meta["windows"] == 3
    store = Store.from_lines(e.message for evs in groups.values() for e in evs)
    names = {k.name for k in store.points}
    assert {"RequestSuccess", "ExporterHeartbeat", "SyncAttempts"} <= names
    assert any("failed to load 'broken'" in e.message for e in groups["/ecs/triton/errors"])
    # the update is a safe rollout on the demo's one host, seen through the dashboard's rollout timeline
    query = dashboard_query("Rollout timeline per model: every decision with its evidence (newest first)")
    timeline = logsinsights.run(query, groups["/ecs/triton/modelsync"])
    decided = [(r["model"], r["verdict"], r["host"]) for r in timeline.rows]
    assert {("text", v, meta["host"]) for v in ("started", "baking", "promoted")} <= set(decided), decided
    assert [v for _, v, _ in decided].count("promoted") == 1, decided  # once: not again as its EMF event
    assert {"RolloutsStarted", "RolloutsPromoted", "RolloutsInFlight"} <= names
    assert out.stat().st_size > 100_000
    # the exporter ran on the test suite's NVML fake: the GPU section has its GPUs; the README's first screen too
    assert meta["nvml"] == collect.NVML_FAKE
    gpus = {k.value("gpu") for k in store.points if k.name == "GpuUtilization" and "gpu" in dict(k.dims)}
    assert gpus == {"0", "1"}, gpus
    assert (tmp_path / "preview-top.png").stat().st_size > 50_000
