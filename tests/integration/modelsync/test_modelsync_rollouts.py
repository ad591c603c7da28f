"""Safe rollouts against real parts: three hosts, each a real Triton with its ``python -m modelsync``, on moto's
S3, SNS and SQS, with traffic on every host while a new artifact rolls out (modelsync/rollout.py).

With 3 live hosts and ``--canary-fraction 0.25`` a rollout has one canary (ceil(0.75)) and one control; the
bake is a few seconds (``--bake-seconds 5``, ``--bake-min-requests 20``) so that each test stays short, and
``--max-latency-ratio 6`` (the slow build is 13x slower and more) so that a loaded machine's noise over such
short windows never rejects a good build.
Every test counts failed requests per host: outside the canary, there must be none. The fleet is shared by
the module (one bucket and topic; tests/integration/modelsync/conftest.py); each test rolls out a model of its
own. Here: the verdicts; test_modelsync_rollouts_recovery.py: restarts, operators, hosts coming and going.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.msync import (
    Fleet,
    Host,
    Traffic,
    moto,  # noqa: F401 - fixture
    rollout_bundle,
    rollout_files,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def first_version(fleet: Fleet, model: str) -> None:
    """v1 (answers x + 1): the model's first artifact, installed on every host at once."""
    for h in fleet.hosts:
        if h.proc is None:
            fleet.start(h)
    fleet.upload(model, rollout_files(model, 1))
    wait_for(lambda: fleet.answers(model) == [1.0] * len(fleet.hosts), timeout=120, step=0.3)
    wait_for(lambda: (fleet.state(model) or {}).get("stable") is not None, timeout=30)


def canary_of(fleet: Fleet, model: str) -> Host:
    def find() -> Host | None:
        r = (fleet.state(model) or {}).get("rollout") or {}
        canaries = [h for h, p in (r.get("participants") or {}).items() if p["role"] == "canary" and p["ready"]]
        return next((h for h in fleet.hosts if h.name in canaries), None)

    return wait_for(find, timeout=90, step=0.2)


def verdicts(fleet: Fleet, model: str) -> list[str]:
    return [v["verdict"] for v in (fleet.state(model) or {}).get("verdicts", [])]


def failures(traffic: dict[str, Traffic]) -> dict[str, int]:
    return {name: t.failures() for name, t in traffic.items()}


def test_a_good_artifact_reaches_the_canary_first_then_every_host(fleet: Fleet) -> None:
    model = unique("good")
    first_version(fleet, model)
    fleet.traffic(model)
    start = time.monotonic()
    fleet.upload(model, rollout_files(model, 2))
    canary = canary_of(fleet, model)
    wait_for(lambda: canary.answer(model) == 2.0, timeout=60, step=0.1)
    others = [h for h in fleet.hosts if h is not canary]
    assert [h.answer(model) for h in others] == [1.0] * len(others)  # while the canary bakes
    wait_for(lambda: fleet.answers(model) == [2.0] * len(fleet.hosts), timeout=90, step=0.2)
    took = time.monotonic() - start
    traffic = fleet.stop_traffic(model)
    assert failures(traffic) == {h.name: 0 for h in fleet.hosts}
    assert verdicts(fleet, model) == ["promoted"]
    state = fleet.state(model)
    assert state is not None and state["rollout"] is None
    promoted = wait_for(lambda: [d for d in canary.decisions(model) if d["verdict"] == "promoted"], timeout=10)
    assert len(promoted) == 1, canary.decisions(model)
    evidence = promoted[0]["evidence"]
    assert evidence["canary"]["requests"] >= 20 and evidence["canary"]["failures"] == 0
    assert evidence["baseline"]["source"].startswith("the hosts on the previous artifact")
    print(f"\nrollout of a good artifact: every host on it {took:.1f} s after the upload (bake 5 s)")


def rejected(fleet: Fleet, model: str, behaviour: str, add: float) -> tuple[Host, dict[str, Traffic]]:
    """Roll out a harmful artifact (answers x + ``add`` when it answers) under traffic; wait for its rejection
    and for the canary to serve v1 again. Returns the canary and the traffic."""
    fleet.traffic(model)
    fleet.upload(model, rollout_files(model, add, behaviour))
    canary = canary_of(fleet, model)
    wait_for(lambda: "rejected" in verdicts(fleet, model), timeout=90, step=0.2)
    wait_for(lambda: canary.answer(model) == 1.0, timeout=60, step=0.1)
    time.sleep(1.0)  # traffic on every host after the rollback
    return canary, fleet.stop_traffic(model)


def assert_only_the_canary_saw_it(fleet: Fleet, canary: Host, traffic: dict[str, Traffic]) -> None:
    """No failed request and no answer of the harmful artifact outside the canary; every host back on v1."""
    for h in fleet.hosts:
        if h is canary:
            continue
        assert traffic[h.name].failures() == 0, h.name
        assert traffic[h.name].answers() == {1.0}, (h.name, traffic[h.name].answers())
    assert fleet.answers(traffic[canary.name].model) == [1.0] * len(fleet.hosts)


def test_an_artifact_failing_every_request_is_rejected_and_never_leaves_the_canary(fleet: Fleet) -> None:
    model = unique("fails")
    first_version(fleet, model)
    canary, traffic = rejected(fleet, model, "fail", 3)
    assert traffic[canary.name].failures() > 0  # inside the canary share: what the bake is for
    assert_only_the_canary_saw_it(fleet, canary, traffic)
    decision = wait_for(lambda: [d for d in canary.decisions(model) if d["verdict"] == "rejected"], timeout=10)[-1]
    assert "failure ratio" in decision["reason"] and decision["evidence"]["canary"]["failure_ratio"] > 0.5
    assert decision["evidence"]["thresholds"]["max_failure_increase"] == 0.01
    back = wait_for(lambda: [d for d in canary.decisions(model) if d["verdict"] == "rolled back"], timeout=10)
    assert len(back) == 1 and back[0]["artifact"] == decision["artifact"], canary.decisions(model)

    def emf() -> list[dict[str, Any]]:
        return [d for d in map(json.loads, canary.emf.read_text().splitlines()) if d.get("model") == model]

    wait_for(lambda: any(d.get("RolloutRollbacks") == 1.0 for d in emf()), timeout=10)
    assert any(d.get("RolloutsRejected") == 1.0 and d["verdict"] == "rejected" for d in emf())


def test_a_20x_slower_artifact_is_rejected_on_latency(fleet: Fleet) -> None:
    model = unique("slow")
    first_version(fleet, model)
    canary, traffic = rejected(fleet, model, "slow", 4)
    assert_only_the_canary_saw_it(fleet, canary, traffic)
    assert traffic[canary.name].failures() == 0  # slow, not failing: the latency rule rejects it
    decision = wait_for(lambda: [d for d in canary.decisions(model) if d["verdict"] == "rejected"], timeout=10)[-1]
    assert "average latency" in decision["reason"] and decision["evidence"]["latency_ratio"] > 1.5


def test_a_second_upload_during_the_bake_wins_and_the_first_never_spreads(fleet: Fleet) -> None:
    model = unique("newest")
    first_version(fleet, model)
    fleet.traffic(model)
    fleet.upload(model, rollout_files(model, 2))
    canary = canary_of(fleet, model)
    wait_for(lambda: canary.answer(model) == 2.0, timeout=60, step=0.1)
    fleet.upload(model, rollout_files(model, 3))
    wait_for(lambda: fleet.answers(model) == [3.0] * len(fleet.hosts), timeout=120, step=0.2)
    traffic = fleet.stop_traffic(model)
    assert failures(traffic) == {h.name: 0 for h in fleet.hosts}
    assert verdicts(fleet, model) == ["superseded", "promoted"]
    spread = {h.name for h in fleet.hosts if 2.0 in traffic[h.name].answers()}
    assert len(spread) == 1, spread  # v2 served by one host only: the canary


def test_a_bundle_is_canaried_and_rejected_as_one_unit(fleet: Fleet) -> None:
    name = unique("bundle")
    for h in fleet.hosts:
        if h.proc is None:
            fleet.start(h)
    fleet.upload(name, rollout_bundle(name, 1))
    wait_for(lambda: fleet.answers(name) == [11.0] * len(fleet.hosts), timeout=120, step=0.3)
    fleet.traffic(name)
    fleet.upload(name, rollout_bundle(name, 2, "fail"))  # its last step fails every request
    canary = canary_of(fleet, name)
    wait_for(lambda: "rejected" in verdicts(fleet, name), timeout=90, step=0.2)
    wait_for(lambda: canary.answer(name) == 11.0, timeout=60, step=0.1)
    traffic = fleet.stop_traffic(name)
    for h in fleet.hosts:
        if h is not canary:
            assert traffic[h.name].failures() == 0 and traffic[h.name].answers() == {11.0}, h.name
    assert traffic[canary.name].failures() > 0
    decision = wait_for(lambda: [d for d in canary.decisions(name) if d["verdict"] == "rejected"], timeout=10)[-1]
    assert decision["evidence"]["canary"]["failure_ratio"] > 0.5


def test_a_directory_model_rolls_out_like_any_model(fleet: Fleet) -> None:
    model = unique("dir")
    for h in fleet.hosts:
        if h.proc is None:
            fleet.start(h)
    fleet.upload_directory(model, rollout_files(model, 1))
    wait_for(lambda: fleet.answers(model) == [1.0] * len(fleet.hosts), timeout=120, step=0.3)
    fleet.traffic(model)
    fleet.upload_directory(model, rollout_files(model, 3, "fail"))
    canary = canary_of(fleet, model)
    wait_for(lambda: "rejected" in verdicts(fleet, model), timeout=90, step=0.2)
    wait_for(lambda: canary.answer(model) == 1.0, timeout=60, step=0.1)
    fleet.upload_directory(model, rollout_files(model, 2))
    wait_for(lambda: fleet.answers(model) == [2.0] * len(fleet.hosts), timeout=120, step=0.2)
    traffic = fleet.stop_traffic(model)
    assert {h for h, n in failures(traffic).items() if n} <= {canary.name}
    assert verdicts(fleet, model) == ["rejected", "promoted"]
