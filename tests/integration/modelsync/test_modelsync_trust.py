"""Trust boundaries of model sync (issue 36, findings 2 and 3), as an attacker would try them: the daemon's
Syncer on moto's S3 server and a real Triton.

- **The rollout state chooses which object a host installs.** Whoever can write under the rollout-state
  prefix (the Triton task's role could) plants a zip there and edits one state: its stable artifact names the
  planted zip (or another model's manifest), and a verdict rejects what the host serves. A host must install
  only the model's own key, with the sha256 the state recorded; anything else is refused, logged and counted,
  and the host keeps serving what it serves.
- **A bundle can take another model's name.** ``0evil.zip`` holding ``resnet/`` beside the real
  ``resnet.zip``: on a fresh host (every scale-out) the bundle must not serve resnet, whatever the listing
  order, and the refusal names both keys.

One Triton for the module; each test has its own bucket and model names (a name never installed here is a
fresh host's, for that name).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from modelsync.ledger import state_key
from tests.support.helpers import Capture
from tests.support.msync import (
    MODEL_PY,
    Env,
    make_zip,
    model_files,
    module_env,
    module_triton,
    moto,  # noqa: F401 - a fixture
    sha,
    unique,
    upload,
    upload_directory,
)

pytestmark = [pytest.mark.triton]

served = module_triton("trust")
ROLLOUTS = {"canary_fraction": 0.5}  # safe rollouts on (one host: it is its own canary)


@pytest.fixture
def env(moto, served, request) -> Env:  # noqa: F811 - the fixtures
    return module_env(moto, served, request)


def evil_files(model: str, marker: Path) -> dict[str, bytes]:
    """A model named ``model`` whose model.py runs code at import (writes ``marker``) and answers x + 666."""
    files = model_files(model, add=666)
    code = f"open({str(marker)!r}, 'w').write('ran')\n" + MODEL_PY.format(add=666)
    files[f"{model}/1/model.py"] = code.encode()
    return files


def read_state(env: Env, model: str) -> dict[str, Any]:
    body = env.moto.client("s3").get_object(Bucket=env.bucket, Key=state_key("", model))["Body"].read()
    state: dict[str, Any] = json.loads(body)
    return state


def write_state(env: Env, model: str, state: dict[str, Any]) -> None:
    """The attacker's PutObject on the rollout-state prefix: no condition, any content."""
    env.moto.client("s3").put_object(Bucket=env.bucket, Key=state_key("", model), Body=json.dumps(state).encode())


def poisoned(state: dict[str, Any], artifact: dict[str, str], reject: str) -> dict[str, Any]:
    """The state with ``artifact`` as stable and the served artifact ``reject`` rejected: every host goes to
    the "stable" artifact, pinned to its version."""
    verdict = {"sha256": reject, "verdict": "rejected", "at": time.time(), "by": "operator", "reason": "bad build",
               "evidence": {}}  # fmt: skip
    return {**state, "stable": artifact, "rollout": None, "verdicts": [*state.get("verdicts", []), verdict]}


def first_install(env: Env, model: str) -> str:
    """v1 of ``model`` (answers x + 1) installed with rollouts on; its state records it as stable."""
    data = make_zip(model_files(model, add=1))
    upload(env.moto, env.bucket, f"{model}.zip", data)
    report = env.sync(**ROLLOUTS)
    assert report.outcomes[model].in_sync, report.outcomes[model]
    assert env.infer(model) == 2.0
    assert read_state(env, model)["stable"]["sha256"] == sha(data)
    return sha(data)


def refusals(capture: Capture, model: str) -> list[dict[str, Any]]:
    """The JSON fields of the refusal lines about ``model``'s rollout state."""
    out = []
    for r in capture.records:
        fields = getattr(r, "fields", None) or {}
        if fields.get("model") == model and fields.get("refused") == "rollout state artifact":
            out.append(fields)
    return out


def refused_attempts(env: Env, model: str) -> list[dict[str, Any]]:
    """SyncAttempts events of ``model`` with result unsafe_archive (the refusal's metric; the alarm reads
    SyncFailures of the same event)."""
    return [d for d in env.attempts(model) if d.get("result") == "unsafe_archive"]


# --- finding 2: the rollout state names the object --------------------------------------------------------


def test_a_state_naming_a_zip_planted_under_the_rollout_prefix_is_refused_and_the_host_keeps_serving(
    env: Env,
) -> None:
    model = unique("add")
    v1 = first_install(env, model)
    marker = env.root / f"ran-{model}"
    planted_key = ".modelsync/rollouts/x.zip"  # writable with the rights on the rollout-state prefix
    planted = make_zip(evil_files(model, marker))
    put = upload(env.moto, env.bucket, planted_key, planted)  # its own sha256 metadata, as any upload
    artifact = {"sha256": sha(planted), "key": planted_key, "etag": put["ETag"], "version_id": put["VersionId"]}
    write_state(env, model, poisoned(read_state(env, model), artifact, reject=v1))

    with Capture.on("modelsync", logging.INFO) as capture:
        report = env.sync(**ROLLOUTS)

    outcome = report.outcomes[model]
    assert env.infer(model) == 2.0, "the planted zip is served"  # before the fix: 667.0, and the marker written
    assert not marker.exists()
    assert not outcome.in_sync and outcome.serving == v1
    assert planted_key in outcome.reason and state_key("", model) in outcome.reason
    lines = refusals(capture, model)
    assert len(lines) == 1, [r.getMessage() for r in capture.records]
    assert lines[0]["state"] == f"s3://{env.bucket}/{state_key('', model)}"
    assert lines[0]["key"] == planted_key and lines[0]["serving"] == v1
    assert f"not {model}.zip or {model}/manifest.json" in lines[0]["reason"]
    counted = refused_attempts(env, model)
    assert len(counted) == 1 and counted[0]["key"] == planted_key and counted[0]["SyncFailures"] == 1.0

    again = env.sync(**ROLLOUTS)  # idempotent: refused again, nothing installed, still serving v1
    assert not again.outcomes[model].in_sync and env.infer(model) == 2.0 and not marker.exists()


def test_a_state_naming_another_models_manifest_is_refused(env: Env) -> None:
    model, other = unique("add"), unique("other")
    v1 = first_install(env, model)
    # another model's directory whose files would load under this model's name (its config says so)
    put = upload_directory(env.moto, env.bucket, other, model_files(model, add=555))
    manifest = env.moto.client("s3").get_object(Bucket=env.bucket, Key=f"{other}/manifest.json")["Body"].read()
    artifact = {"sha256": sha(manifest), "key": f"{other}/manifest.json", "etag": put["ETag"],
                "version_id": put["VersionId"]}  # fmt: skip
    write_state(env, model, poisoned(read_state(env, model), artifact, reject=v1))

    with Capture.on("modelsync", logging.INFO) as capture:
        report = env.sync(**ROLLOUTS)

    assert env.infer(model) == 2.0, "another model's files are served"  # before the fix: 556.0
    assert report.outcomes[model].serving == v1 and not report.outcomes[model].in_sync
    assert [f["key"] for f in refusals(capture, model)] == [f"{other}/manifest.json"]


def test_a_state_whose_recorded_hash_differs_from_the_own_keys_object_is_refused(env: Env) -> None:
    """The model's own key at a version of its own, but a sha256 that version does not hold: refused before
    any download (the object's metadata, fixed for its version, disagrees with the state)."""
    model = unique("add")
    v1 = first_install(env, model)
    v2 = make_zip(model_files(model, add=2))
    put = upload(env.moto, env.bucket, f"{model}.zip", v2)
    forged = {"sha256": "f" * 64, "key": f"{model}.zip", "etag": put["ETag"], "version_id": put["VersionId"]}
    write_state(env, model, poisoned(read_state(env, model), forged, reject=sha(v2)))

    with Capture.on("modelsync", logging.INFO) as capture:
        report = env.sync(**ROLLOUTS)

    assert env.infer(model) == 2.0, "a version the state rejects is served"  # before the fix: 3.0
    lines = refusals(capture, model)
    assert len(lines) == 1 and "f" * 64 in lines[0]["reason"], [r.getMessage() for r in capture.records]
    assert sha(v2) in lines[0]["reason"] and lines[0]["serving"] == v1
    assert report.outcomes[model].serving == v1 and not report.outcomes[model].in_sync
    again = env.sync(**ROLLOUTS)  # the same state: refused again without a download
    assert not again.outcomes[model].in_sync and env.infer(model) == 2.0


def test_with_rollouts_off_the_state_is_not_read_and_the_objects_metadata_decides(env: Env) -> None:
    model = unique("add")
    v1 = first_install(env, model)
    planted_key = ".modelsync/rollouts/y.zip"
    planted = make_zip(model_files(model, add=666))
    put = upload(env.moto, env.bucket, planted_key, planted)
    artifact = {"sha256": sha(planted), "key": planted_key, "etag": put["ETag"], "version_id": put["VersionId"]}
    write_state(env, model, poisoned(read_state(env, model), artifact, reject=v1))
    report = env.sync()
    assert report.outcomes[model].in_sync and env.infer(model) == 2.0
    v2 = make_zip(model_files(model, add=2))
    upload(env.moto, env.bucket, f"{model}.zip", v2, digest="0" * 64)  # metadata that the bytes do not match
    report = env.sync()
    assert report.outcomes[model].result == "hash_mismatch" and env.infer(model) == 2.0


# --- finding 3: a bundle takes another model's name -------------------------------------------------------


def bundle_claiming(name: str, victim: str, marker: Path) -> bytes:
    """A bundle ``name`` holding its own model and ``victim``'s name (code that runs at load)."""
    return make_zip({**model_files(name, add=0), **evil_files(victim, marker)})


@pytest.mark.parametrize("bundle", ["0evil", "zevil"])  # listed before the victim, and after it
def test_a_bundle_cannot_take_the_name_of_a_listed_model_on_a_fresh_host(env: Env, bundle: str) -> None:
    victim, bundle = unique("resnet"), unique(bundle)
    marker = env.root / f"ran-{victim}"
    real = make_zip(model_files(victim, add=1))
    upload(env.moto, env.bucket, f"{victim}.zip", real)
    upload(env.moto, env.bucket, f"{bundle}.zip", bundle_claiming(bundle, victim, marker))

    report = env.sync()  # a fresh host: neither is installed here

    assert env.infer(victim) == 2.0, "the bundle serves the victim's name"  # before the fix (0evil): 667.0
    assert not marker.exists()
    assert report.outcomes[victim].in_sync, report.outcomes[victim]
    refused = report.outcomes[bundle]
    assert not refused.in_sync and refused.serving == ""
    assert f"{bundle}.zip" in refused.reason and f"{victim}.zip" in refused.reason, refused.reason
    attempts = [d for d in env.attempts(bundle) if d.get("result") == "unsafe_archive"]
    assert len(attempts) == 1
    assert not (env.repository / bundle).exists()

    app = env.app()  # a daemon's passes: each judges alike, the refusal is counted once for the same object
    try:
        for _ in range(2):
            again = app.syncer.reconcile_all()
            assert again.outcomes[victim].in_sync and not again.outcomes[bundle].in_sync
    finally:
        app.close()
    assert len([d for d in env.attempts(bundle) if d.get("result") == "unsafe_archive"]) == 2  # 1 per daemon


def test_an_event_for_the_bundle_alone_is_judged_on_the_listing_too(env: Env) -> None:
    """The fan-out names one key: the bundle's claim is checked against the victim's keys all the same."""
    victim, bundle = unique("resnet"), unique("0evil")
    marker = env.root / f"ran-{victim}"
    upload_directory(env.moto, env.bucket, victim, model_files(victim, add=1))  # a directory model owns it too
    upload(env.moto, env.bucket, f"{bundle}.zip", bundle_claiming(bundle, victim, marker))
    app = env.app()
    try:
        out = app.syncer.reconcile_models([bundle])
    finally:
        app.close()
    assert not out[bundle].in_sync and f"{victim}/manifest.json" in out[bundle].reason, out[bundle].reason
    assert not (env.repository / victim).exists() and not marker.exists()
    report = env.sync()
    assert report.outcomes[victim].in_sync and env.infer(victim) == 2.0


def test_a_bundle_may_still_hold_a_name_no_listed_key_owns(env: Env) -> None:
    name = unique("llm")
    step = f"{name}-step"
    upload(env.moto, env.bucket, f"{name}.zip", make_zip({**model_files(name, add=0), **model_files(step, add=3)}))
    report = env.sync()
    assert report.outcomes[name].in_sync, report.outcomes[name]
    assert env.infer(step) == 4.0
