"""Safe rollouts against real parts, when things happen mid-rollout: a daemon restarted after a rejection, an
operator promoting a silent bake, a canary killed mid-bake, a host joining (the fleet and its settings:
test_modelsync_rollouts.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.integration.modelsync.test_modelsync_rollouts import (
    assert_only_the_canary_saw_it,
    canary_of,
    failures,
    first_version,
    rejected,
    verdicts,
)
from tests.support.msync import (
    Fleet,
    moto,  # noqa: F401 - fixture
    rollout_files,
    unique,
    wait_for,
)
from tests.support.paths import REPO

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelsync", "rollout", *args, "--bucket", fleet.bucket],
        cwd=REPO,
        env=fleet.moto.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_restart_after_a_rejection_keeps_it_out_and_a_good_artifact_after_two_rejections_goes_out(
    fleet: Fleet,
) -> None:
    model = unique("again")
    first_version(fleet, model)
    canary, traffic = rejected(fleet, model, "fail", 3)
    assert_only_the_canary_saw_it(fleet, canary, traffic)
    for h in fleet.hosts:  # every daemon restarts: the rejection is in the bucket, not in a process
        fleet.stop(h)
    fleet.start_all()
    fleet.traffic(model)
    time.sleep(8.0)  # a start reconcile and a few rollout ticks on every host
    traffic = fleet.stop_traffic(model)
    assert fleet.answers(model) == [1.0] * len(fleet.hosts)
    assert all(t.failures() == 0 and t.answers() == {1.0} for t in traffic.values()), failures(traffic)
    assert verdicts(fleet, model) == ["rejected"]
    # A second harmful upload, then a good one: the good one goes out.
    canary, traffic = rejected(fleet, model, "slow", 4)
    assert_only_the_canary_saw_it(fleet, canary, traffic)
    fleet.traffic(model)
    fleet.upload(model, rollout_files(model, 5))
    wait_for(lambda: fleet.answers(model) == [5.0] * len(fleet.hosts), timeout=120, step=0.2)
    traffic = fleet.stop_traffic(model)
    assert failures(traffic) == {h.name: 0 for h in fleet.hosts}
    assert verdicts(fleet, model) == ["rejected", "rejected", "promoted"]


def test_silence_keeps_it_baking_until_an_operator_promotes_it(fleet: Fleet) -> None:
    model = unique("quiet")
    first_version(fleet, model)
    fleet.upload(model, rollout_files(model, 2))  # no traffic at all
    canary = canary_of(fleet, model)
    wait_for(lambda: any(d["verdict"] == "waiting for evidence" for d in canary.decisions(model)), timeout=60)
    time.sleep(3.0)
    state = fleet.state(model)
    assert state is not None and state["rollout"]["waiting_since"] is not None and state["verdicts"] == []
    others = [h for h in fleet.hosts if h is not canary]
    assert [h.answer(model) for h in others] == [1.0] * len(others)  # silence never promotes
    waiting = next(d for d in canary.decisions(model) if d["verdict"] == "waiting for evidence")
    assert "fewer than --bake-min-requests 20" in waiting["reason"]
    status = cli(fleet, "status", model)
    assert "WAITING FOR EVIDENCE" in status.stdout and canary.name in status.stdout, status.stdout
    done = cli(fleet, "promote", model)
    assert done.returncode == 0 and json.loads(done.stdout)["verdict"] == "promoted", done.stderr
    wait_for(lambda: fleet.answers(model) == [2.0] * len(fleet.hosts), timeout=60, step=0.2)
    assert verdicts(fleet, model) == ["promoted"]


def test_a_canary_daemon_killed_mid_bake_hands_its_slot_over_and_nothing_is_promoted_on_its_word(
    fleet: Fleet,
) -> None:
    model = unique("killed")
    first_version(fleet, model)
    fleet.traffic(model)
    fleet.upload(model, rollout_files(model, 2))
    canary = canary_of(fleet, model)
    fleet.kill(canary)  # mid-bake: its Triton keeps serving the new artifact, nobody reports for it
    assert canary.answer(model) == 2.0
    lost = wait_for(
        lambda: [d for h in fleet.hosts for d in h.decisions(model) if d["verdict"] == "participant lost"],
        timeout=60,
    )
    assert canary.name in lost[0]["reason"]
    promoted = wait_for(
        lambda: [d for h in fleet.hosts for d in h.decisions(model) if d["verdict"] == "promoted"], timeout=90
    )
    assert len(promoted) == 1 and promoted[0]["evidence"]["canaries"] != [canary.name], promoted
    fleet.start(canary)  # back: it follows the fleet
    wait_for(lambda: fleet.answers(model) == [2.0] * len(fleet.hosts), timeout=90, step=0.2)
    traffic = fleet.stop_traffic(model)
    assert failures(traffic) == {h.name: 0 for h in fleet.hosts}


def test_a_host_joining_mid_rollout_serves_the_promoted_artifact_not_the_canarys(fleet: Fleet) -> None:
    model = unique("join")
    first_version(fleet, model)
    fleet.upload(model, rollout_files(model, 2))  # no traffic yet: the rollout stays in flight, waiting
    canary = canary_of(fleet, model)
    wait_for(lambda: any(d["verdict"] == "waiting for evidence" for d in canary.decisions(model)), timeout=60)
    new = fleet.add_host(start=True)  # a fresh task: nothing installed
    wait_for(lambda: new.answer(model) == 1.0, timeout=90, step=0.2)  # the stable artifact, not the canary's
    assert (fleet.state(model) or {}).get("rollout") is not None  # still in flight when it joined
    fleet.traffic(model)  # evidence comes: the rollout is promoted, and the new host follows
    wait_for(lambda: fleet.answers(model) == [2.0] * len(fleet.hosts), timeout=120, step=0.2)
    traffic = fleet.stop_traffic(model)
    assert failures(traffic) == {h.name: 0 for h in fleet.hosts}
    assert verdicts(fleet, model) == ["promoted"] and canary is not new
    assert not any(d["verdict"] in ("started", "canary claimed") for d in new.decisions(model))
