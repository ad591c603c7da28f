"""The rules behind issue 36's findings 2 and 3, without S3 or Triton (the outcome tests are in
tests/integration/modelsync/test_modelsync_trust.py).

- A rollout state names only the model's own key (``<prefix><model>.zip``, which is also a bundle's, or
  ``<prefix><model>/manifest.json``) with a sha256; the planner never hands the reconcile anything else to
  install, and what it hands over carries the sha256 the state recorded.
- A bundle may not take a name a listed key owns.
"""

from __future__ import annotations

import io
import logging
from datetime import UTC, datetime

import pytest

from modelsync.bundle import taken
from modelsync.install import Served
from modelsync.ledger import (
    REJECTED,
    Artifact,
    Ledger,
    State,
    UntrustedArtifact,
    Verdict,
    artifact_problem,
    own_keys,
    record_artifact,
)
from modelsync.metrics import Recorder
from modelsync.rollout import Rollouts
from modelsync.s3 import Archive
from modelsync.settings import Settings
from telemetry.sinks.stdout import StreamSink

PREFIX = "triton/"
A, B, EVIL = "a" * 64, "b" * 64, "e" * 64


def test_own_keys_are_the_models_zip_and_manifest() -> None:
    assert own_keys(PREFIX, "add") == ("triton/add.zip", "triton/add/manifest.json")
    assert own_keys("", "add") == ("add.zip", "add/manifest.json")


@pytest.mark.parametrize(
    "key",
    [
        "triton/.modelsync/rollouts/x.zip",  # planted beside the states
        "triton/other.zip",  # another model's zip
        "triton/other/manifest.json",  # another model's manifest
        "add.zip",  # the model's name outside the prefix
        "triton/add.zip.sig",
        "triton/add/1/model.py",  # a file of the model's directory, not its manifest
        "triton/sub/add.zip",
        "",
    ],
)
def test_a_state_may_not_name_any_other_key(key: str) -> None:
    problem = artifact_problem(PREFIX, "add", Artifact(A, key, '"e"', "v1"))
    assert problem and "not triton/add.zip or triton/add/manifest.json" in problem
    with pytest.raises(UntrustedArtifact, match="not recorded in the rollout state of add"):
        record_artifact(PREFIX, "add", A, key, '"e"', "v1")


def test_the_models_own_keys_with_a_sha256_are_recorded() -> None:
    for key in own_keys(PREFIX, "add"):
        assert artifact_problem(PREFIX, "add", Artifact(A, key, '"e"', "v1")) == ""
    recorded = record_artifact(PREFIX, "add", A.upper(), "triton/add.zip", '"e"', "v1")
    assert recorded == Artifact(A, "triton/add.zip", '"e"', "v1")  # lower-case, as every hash compared
    unverified = record_artifact(PREFIX, "add", 'unverified-"e"', "triton/add.zip", '"e"', "v1")
    assert unverified.sha256 == 'unverified-"e"'  # --allow-unverified: no hash to compare, the key still checked


@pytest.mark.parametrize("sha", ["", "abc", "g" * 64, A + "0", "../" * 30])
def test_a_sha256_that_is_none_is_refused(sha: str) -> None:
    assert "is not a sha256" in artifact_problem(PREFIX, "add", Artifact(sha, "triton/add.zip", '"e"', "v1"))


# --- the planner -----------------------------------------------------------------------------------------


class FakeLedger(Ledger):
    """The ledger's read and write on a dict: the planner's decisions without S3."""

    def __init__(self, state: State | None) -> None:
        super().__init__(None, "bucket", PREFIX, clock=lambda: 1_000_000.0)
        self.state = state
        self.writes = 0

    def read(self, model: str) -> tuple[State | None, str]:
        return (self.state.copy() if self.state else None), f'"{self.writes}"'

    def write(self, state: State, etag: str) -> str:
        self.writes += 1
        self.state = state
        return f'"{self.writes}"'


UPLOADED = datetime(2026, 12, 1, tzinfo=UTC)
LISTED = Archive("add", "triton/add.zip", '"e1"', 100, UPLOADED)  # S3 lists v1 (sha A) under the own key
V1 = Served("add", A, '"e1"', "v1", "triton/add.zip")


def planner(state: State | None) -> tuple[Rollouts, FakeLedger]:
    ledger = FakeLedger(state)
    settings = Settings(bucket="bucket", prefix=PREFIX, host="h1", canary_fraction=0.5)
    log = logging.getLogger("test.trust.rollout")
    rollouts = Rollouts(
        settings, ledger, Recorder("Triton", StreamSink(io.BytesIO()), "h1"), log,
        identify=lambda a: {'"e1"': (A, "v1"), '"e2"': (B, "v2")}[a.etag],
        entry_models=lambda name: [name], live_hosts=lambda: 4,
    )  # fmt: skip
    return rollouts, ledger


def poisoned(stable: Artifact) -> State:
    """Stable: ``stable``; v1 (what S3 lists and the host serves) rejected: every host goes to ``stable``."""
    return State("add", stable, None, [Verdict(A, REJECTED, 1.0, "operator", "bad build")])


@pytest.mark.parametrize("current", [V1, None])  # a host serving v1, a fresh host
def test_a_state_naming_a_planted_key_yields_nothing_to_install(current: Served | None) -> None:
    planted = Artifact(EVIL, "triton/.modelsync/rollouts/x.zip", '"p"', "vp")
    rollouts, ledger = planner(poisoned(planted))
    plan = rollouts.plan("add", LISTED, current, fresh=True)
    assert plan.install is None and plan.named is not None
    assert plan.named.key == planted.key and plan.named.version_id == "vp"
    assert "not triton/add.zip or triton/add/manifest.json" in plan.refused
    assert ledger.writes == 0  # the planner does not act on the state it refuses


def test_the_stable_artifact_is_installed_pinned_with_the_sha256_the_state_recorded() -> None:
    own = Artifact(B, "triton/add.zip", '"e0"', "v0")  # an earlier version of the model's own key
    rollouts, _ = planner(poisoned(own))
    plan = rollouts.plan("add", LISTED, V1, fresh=True)
    assert plan.install is not None and plan.install.key == "triton/add.zip" and plan.install.version_id == "v0"
    assert plan.expected == B and not plan.refused  # the install checks the object and its bytes against B


def test_a_promoted_artifact_is_installed_with_its_recorded_sha256_and_a_canary_with_the_rollouts() -> None:
    stable = Artifact(B, "triton/add.zip", '"e2"', "v2")
    rollouts, _ = planner(State("add", stable))
    listed = Archive("add", "triton/add.zip", '"e2"', 100, UPLOADED)
    plan = rollouts.plan("add", listed, V1, fresh=True)  # v2 promoted: this host installs S3's object
    assert plan.install == listed and plan.expected == B

    rollouts, ledger = planner(State("add", Artifact(A, "triton/add.zip", '"e1"', "v1")))
    plan = rollouts.plan("add", listed, V1, fresh=True)  # v2 is new: this host starts its rollout as canary
    assert plan.role == "canary" and plan.install == listed and plan.expected == B
    assert ledger.state is not None and ledger.state.rollout is not None
    assert ledger.state.rollout.artifact == Artifact(B, "triton/add.zip", '"e2"', "v2")  # recorded from S3


def test_an_unverified_artifact_is_installed_without_a_recorded_hash() -> None:
    own = Artifact('unverified-"e0"', "triton/add.zip", '"e0"', "v0")
    rollouts, _ = planner(poisoned(own))
    plan = rollouts.plan("add", LISTED, V1, fresh=True)
    assert plan.install is not None and plan.expected == ""  # --allow-unverified decides, as without rollouts


# --- bundles and names -----------------------------------------------------------------------------------


def listing(*keys: str) -> dict[str, Archive]:
    out = {}
    for key in keys:
        model = key.removesuffix(".zip").removesuffix("/manifest.json")
        out[model] = Archive(model, key, '"e"', 1, UPLOADED)
    return out


def test_a_bundle_may_not_take_a_listed_keys_name() -> None:
    listed = listing("0evil.zip", "resnet.zip", "bert/manifest.json")
    found = taken("0evil", ["0evil", "resnet"], listed.get)
    assert found is not None and found[0] == "resnet" and found[1].key == "resnet.zip"
    found = taken("0evil", ["bert"], listed.get)
    assert found is not None and found[1].key == "bert/manifest.json"  # a directory model owns its name too


def test_a_bundle_holds_its_own_name_and_names_no_key_owns() -> None:
    listed = listing("llm.zip", "resnet.zip")
    assert taken("llm", ["llm", "llm-pre", "llm-post"], listed.get) is None
    assert taken("resnet", ["resnet", "resnet-pre"], listed.get) is None  # resnet.zip is this bundle's own key


def test_the_verdict_does_not_depend_on_the_order_of_the_parts() -> None:
    listed = listing("a.zip", "b.zip", "x.zip")
    first = taken("x", ["b", "a", "x"], listed.get)
    again = taken("x", ["x", "a", "b"], listed.get)
    assert first is not None and again is not None and first[0] == again[0] == "a"
