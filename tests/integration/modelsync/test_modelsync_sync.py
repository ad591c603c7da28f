"""modelsync against moto's S3 and SQS and one real Triton in explicit mode (shared by the module).

Each test has its own bucket and model names; the Triton and its repository
are shared, so a test only looks at its own models. Every EMF line read back
goes through telemetry.emf_validate (Env.docs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from modelsync.archive import END_BYTES
from modelsync.events import EventFilter, Pending, QueuePoller
from modelsync.metrics import BY_NAME, PHASES
from modelsync.reconcile import Report
from tests.support.msync import (
    Env,
    FaultFileSystem,
    TruncatingProxy,
    leftovers,
    make_zip,
    model_files,
    module_env,
    module_triton,
    moto,  # noqa: F401 - a fixture
    sha,
    unique,
    upload,
    wait_for,
)
from tests.support.paths import REPO

pytestmark = [pytest.mark.triton]


served = module_triton("msync")


@pytest.fixture
def env(moto, served, request) -> Env:  # noqa: F811 - the fixtures
    return module_env(moto, served, request)


def install(env: Env, model: str, add: float = 1.0) -> str:
    data = make_zip(model_files(model, add))
    upload(env.moto, env.bucket, f"{model}.zip", data)
    report = env.sync()
    assert report.outcomes[model].in_sync, report.outcomes[model]
    return sha(data)


def staging_empty(env: Env) -> bool:
    return leftovers(env.store, env.repository) == []


def store_dirs(env: Env, model: str) -> set[str]:
    return {p.name for p in (env.store / model).iterdir()} if (env.store / model).exists() else set()


# --- the happy paths ---------------------------------------------------------------------------


def test_new_model_is_installed_and_ready(env: Env) -> None:
    model = unique("new")
    data = make_zip(model_files(model, 1))
    put = upload(env.moto, env.bucket, f"{model}.zip", data)
    report = env.sync()
    assert report.ok and report.outcomes[model].in_sync
    digest = sha(data)
    assert env.link(model) == f"../store/{model}/{digest}"  # relative: resolves in any container mounting both
    assert (env.repository / model).is_symlink() and env.triton.request("GET", f"/v2/models/{model}/ready")[0] == 200
    assert env.infer(model, 1.0) == 2.0
    record = json.loads((env.store / model / f"{digest}.json").read_text())
    assert (record["version_id"], record["etag"], record["hash_source"]) == (put["VersionId"], put["ETag"], "metadata")
    assert staging_empty(env)

    (attempt,) = env.attempts(model)
    assert attempt["result"] == "ok" and attempt["SyncFailures"] == 0 and attempt["SyncAttempts"] == 1
    assert {f"Sync{p.title()}Time" for p in PHASES} <= attempt.keys()
    assert attempt["SyncBytesDownloaded"] == len(data)
    assert 0 < attempt["SyncUploadToReady"] < 120
    assert (attempt["sha256"], attempt["ModelArtifact"], attempt["s3_version_id"], attempt["host"]) == (
        digest,
        digest,
        put["VersionId"],
        "test-host",
    )
    directives = {m["Name"]: d["Dimensions"] for d in attempt["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert directives["SyncAttempts"] == [[], ["result"], ["model", "result"]]
    assert directives["SyncLoadTime"] == [[], ["model"]]
    state = [d for d in env.docs() if d.get("model") == model and "ModelInSync" in d]
    assert state[-1]["ModelInSync"] == 1 and state[-1]["ModelArtifact"] == digest
    host = [d for d in env.docs() if "ModelsInSync" in d]
    assert host[-1]["ModelsOutOfSync"] == 0 and host[-1]["ModelsInSync"] >= 1

    # In sync: the next reconcile lists, sees the same ETag and READY, and does nothing else.
    assert env.sync().outcomes[model].in_sync
    assert len(env.attempts(model)) == 1


def test_update_swaps_in_under_continuous_inference_without_a_failed_request(env: Env) -> None:
    model = unique("live")
    v1 = install(env, model, 1)
    results: list[tuple[int, float | None]] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            status, body = env.triton.infer(
                model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]
            )
            results.append((status, body["outputs"][0]["data"][0] if status == 200 else None))
            time.sleep(0.02)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        time.sleep(0.3)
        v2_data = make_zip(model_files(model, 2))
        upload(env.moto, env.bucket, f"{model}.zip", v2_data)
        assert env.sync().outcomes[model].in_sync
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not results or results[-1][1] != 3.0):
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join()
    statuses = [s for s, _ in results]
    assert statuses.count(200) == len(statuses) and len(statuses) > 20, statuses
    values = [v for _, v in results]
    assert values[0] == 2.0 and values[-1] == 3.0  # served v1, then v2, nothing in between failed
    v2 = sha(v2_data)
    assert env.link(model).endswith(v2)
    assert store_dirs(env, model) == {v1, f"{v1}.json", v2, f"{v2}.json"}  # current and previous kept
    v3 = install(env, model, 3)
    assert store_dirs(env, model) == {v2, f"{v2}.json", v3, f"{v3}.json"}  # older ones pruned


# --- refused archives: the old version keeps serving, nothing is left behind ----------------------


def assert_untouched(env: Env, model: str, digest: str, before: set[str], add: float = 1.0) -> None:
    assert env.link(model).endswith(digest)
    assert env.infer(model, 1.0) == 1.0 + add
    assert staging_empty(env)
    assert store_dirs(env, model) <= before


def test_wrong_hash_is_refused_and_not_retried(env: Env) -> None:
    model = unique("hash")
    v1 = install(env, model)
    before = store_dirs(env, model)
    upload(env.moto, env.bucket, f"{model}.zip", make_zip(model_files(model, 2)), digest="0" * 64)
    outcome = env.sync().outcomes[model]
    assert (outcome.result, outcome.failed) == ("hash_mismatch", True)
    assert "differs from the expected " + "0" * 64 in outcome.reason
    assert_untouched(env, model, v1, before)
    attempts = len(env.attempts(model))
    again = env.app()  # the memory of failed archives lives in the daemon: same daemon, second pass
    try:
        first = app_pass(again, model)
        second = app_pass(again, model)
    finally:
        again.close()
    assert first.failed and second.failed and second.reason == first.reason
    assert len(env.attempts(model)) == attempts + 1  # the second pass did not download it again


def app_pass(app, model):  # type: ignore[no-untyped-def]
    return app.syncer.reconcile_all().outcomes[model]


def test_missing_hash_is_refused_until_a_tag_names_it(env: Env) -> None:
    model = unique("nohash")
    v1 = install(env, model)
    before = store_dirs(env, model)
    data = make_zip(model_files(model, 2))
    put = upload(env.moto, env.bucket, f"{model}.zip", data, digest=None)
    outcome = env.sync().outcomes[model]
    assert outcome.result == "missing_hash" and "--allow-unverified" in outcome.reason
    assert_untouched(env, model, v1, before)
    # The uploader adds the tag afterwards (allowed: the tag is read per object version).
    env.moto.client("s3").put_object_tagging(
        Bucket=env.bucket,
        Key=f"{model}.zip",
        VersionId=put["VersionId"],
        Tagging={"TagSet": [{"Key": "sha256", "Value": sha(data)}]},
    )
    assert env.sync().outcomes[model].in_sync
    assert env.infer(model, 1.0) == 3.0
    record = json.loads((env.store / model / f"{sha(data)}.json").read_text())
    assert record["hash_source"] == "tag"


def test_allow_unverified_installs_an_archive_without_hash(env: Env) -> None:
    model = unique("unverified")
    data = make_zip(model_files(model, 5))
    upload(env.moto, env.bucket, f"{model}.zip", data, digest=None)
    assert env.sync().outcomes[model].result == "missing_hash"
    assert env.sync(allow_unverified=True).outcomes[model].in_sync
    assert env.infer(model, 1.0) == 6.0 and env.link(model).endswith(sha(data))


def test_truncated_download_leaves_nothing_and_is_retried(env: Env) -> None:
    model = unique("cut")
    v1 = install(env, model)
    before = store_dirs(env, model)
    upload(env.moto, env.bucket, f"{model}.zip", make_zip(model_files(model, 2)))
    with TruncatingProxy(env.moto.url, keep=100) as proxy:
        proxy.cut.add(f"{model}.zip")
        env.s3_url = proxy.url
        outcome = env.sync().outcomes[model]
        assert proxy.cuts >= 1
        assert outcome.result == "download_error", outcome
        assert_untouched(env, model, v1, before)
        proxy.cut.clear()  # the network recovers: transient, so the same archive is tried again
        assert env.sync().outcomes[model].in_sync
    assert env.infer(model, 1.0) == 3.0


@pytest.mark.parametrize("where", ["download", "extract"])
def test_disk_full_during_a_write_leaves_nothing(env: Env, where: str) -> None:
    model = unique(f"full{where[:3]}")
    v1 = install(env, model)
    before = store_dirs(env, model)
    data = make_zip({**model_files(model, 2), f"{model}/1/weights.bin": os.urandom(200_000)})
    upload(env.moto, env.bucket, f"{model}.zip", data)
    # ENOSPC from the write layer: during the download, or after it (the extraction's writes).
    budget = 1000 if where == "download" else len(data) + 1000
    outcome = env.sync(fs=FaultFileSystem(write_budget=budget)).outcomes[model]
    assert outcome.result == "disk_full" and "No space left on device" in outcome.reason, outcome
    assert_untouched(env, model, v1, before)
    assert env.sync().outcomes[model].in_sync  # space is back: retried
    assert env.infer(model, 1.0) == 3.0


def test_free_space_is_checked_before_downloading(env: Env) -> None:
    model = unique("headroom")
    v1 = install(env, model)
    before = store_dirs(env, model)
    data = make_zip(model_files(model, 2))
    upload(env.moto, env.bucket, f"{model}.zip", data)
    outcome = env.sync(fs=FaultFileSystem(free=len(data) + 4096), min_free_bytes=1 << 20).outcomes[model]
    assert outcome.result == "disk_full" and "headroom" in outcome.reason
    attempt = env.attempts(model)[-1]
    assert attempt["result"] == "disk_full" and "SyncBytesDownloaded" not in attempt  # nothing was fetched
    assert_untouched(env, model, v1, before)


def test_a_streamed_zip_needs_room_for_its_scratch_copy_and_its_entries_at_once(env: Env) -> None:
    """The archive is placed while it downloads: its scratch copy and its entries are on the disk together, so
    room for either alone is refused before a byte of the body is fetched."""
    model = unique("roomboth")
    v1 = install(env, model)
    before = store_dirs(env, model)
    data = big_zip(model, 2)  # 1 MiB of incompressible weights: the entries take about the archive's size
    upload(env.moto, env.bucket, f"{model}.zip", data)
    free = len(data) + (1 << 20) + (256 << 10)  # the archive and the headroom fit; the entries on top do not
    outcome = env.sync(fs=FaultFileSystem(free=free), min_free_bytes=1 << 20, part_size=PART).outcomes[model]
    assert outcome.result == "disk_full" and "downloading and extracting" in outcome.reason, outcome
    assert "SyncBytesDownloaded" not in env.attempts(model)[-1]
    assert_untouched(env, model, v1, before)


HOSTILE = {
    "traversal": lambda m, root: make_zip({**model_files(m, 2), f"{m}/1/../../../escaped-rel": b"x"}),
    "absolute": lambda m, root: make_zip({**model_files(m, 2), f"{root}/escaped-abs": b"x"}),
    "symlink": lambda m, root: make_zip(model_files(m, 2), symlinks={f"{m}/1/passwd": "/etc/passwd"}),
    "outside": lambda m, root: make_zip({**model_files(m, 2), "other/escaped": b"x"}),
    "zip_bomb": lambda m, root: make_zip({**model_files(m, 2), f"{m}/1/zeros.bin": bytes(30 * 1024 * 1024)}),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_archive_is_refused_with_nothing_written_outside_the_store(env: Env, kind: str) -> None:
    model = unique(kind.replace("_", ""))
    v1 = install(env, model)
    before = store_dirs(env, model)
    outside = env.files_outside_store()
    upload(env.moto, env.bucket, f"{model}.zip", HOSTILE[kind](model, env.root))
    outcome = env.sync().outcomes[model]
    assert outcome.result == "unsafe_archive", outcome
    expected = {
        "traversal": "'..' in the path",
        "absolute": "absolute path",
        "symlink": "a symlink",
        "outside": "outside",
        "zip_bomb": "compression ratio",
    }[kind]
    assert expected in outcome.reason
    assert_untouched(env, model, v1, before)
    assert env.files_outside_store() == outside
    assert not any(p.name.startswith("escaped") for p in env.root.parent.rglob("escaped*"))


# --- load failures ----------------------------------------------------------------------------------


def test_model_that_fails_to_load_is_rolled_back_and_not_retried(env: Env) -> None:
    model = unique("broken")
    v1 = install(env, model)
    v1_code = (env.repository / model / "1" / "model.py").read_text()
    broken = make_zip(model_files(model, broken=True))
    upload(env.moto, env.bucket, f"{model}.zip", broken)
    app = env.app()
    try:
        outcome = app.syncer.reconcile_all().outcomes[model]
        assert outcome.result == "rolled_back" and "boom: this build does not load" in outcome.reason
        # The disk matches what Triton serves: the link is back on v1 and Triton still answers with v1.
        assert env.link(model).endswith(v1)
        assert (env.repository / model / "1" / "model.py").read_text() == v1_code
        assert env.infer(model, 1.0) == 2.0
        assert sha(broken) not in store_dirs(env, model) and staging_empty(env)
        loads = env.triton.log_text().count(f"loading: {model}:1")
        assert app.syncer.reconcile_all().outcomes[model].failed  # still reported ...
        assert env.triton.log_text().count(f"loading: {model}:1") == loads  # ... but not loaded again
    finally:
        app.close()
    assert [a["result"] for a in env.attempts(model)] == ["ok", "rolled_back"]
    v3 = install(env, model, 3)  # a new archive is tried
    assert env.link(model).endswith(v3) and env.infer(model, 1.0) == 4.0


def test_new_model_that_fails_to_load_leaves_no_link(env: Env) -> None:
    model = unique("newbroken")
    upload(env.moto, env.bucket, f"{model}.zip", make_zip(model_files(model, broken=True)))
    outcome = env.sync().outcomes[model]
    assert outcome.result == "load_failed" and outcome.failed
    assert not (env.repository / model).exists() and not (env.repository / model).is_symlink()
    assert store_dirs(env, model) == set()


def test_rollback_on_purpose_re_extracts_the_old_archive(env: Env) -> None:
    """Re-uploading v1 must make Triton serve v1 again: its old directory's timestamps would look unmodified."""
    model = unique("revert")
    v1_data = make_zip(model_files(model, 1))
    upload(env.moto, env.bucket, f"{model}.zip", v1_data)
    assert env.sync().outcomes[model].in_sync
    v2 = install(env, model, 2)
    assert env.infer(model, 1.0) == 3.0
    old_ctime = os.stat(env.store / model / sha(v1_data) / "1" / "model.py").st_ctime
    upload(env.moto, env.bucket, f"{model}.zip", v1_data)
    assert env.sync().outcomes[model].in_sync
    assert env.infer(model, 1.0) == 2.0  # v1 serves again, from a fresh extraction beside the old one
    assert env.link(model).endswith(f"{sha(v1_data)}.1") and v2 in store_dirs(env, model)
    assert os.stat(env.repository / model / "1" / "model.py").st_ctime > old_ctime


# --- events -------------------------------------------------------------------------------------------


def s3_record(bucket: str, key: str, sequencer: str, version: str, name: str = "ObjectCreated:Put") -> str:
    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.1",
                    "eventSource": "aws:s3",
                    "eventName": name,
                    "eventTime": "2026-11-30T12:00:00.000Z",
                    "s3": {
                        "bucket": {"name": bucket},
                        "object": {"key": key, "sequencer": sequencer, "versionId": version},
                    },
                }
            ]
        }
    )


def test_duplicate_and_out_of_order_events_never_load_an_older_archive(env: Env) -> None:
    model = unique("ev+x")  # '+' in the name: the S3 notification key is URL-encoded as %2B
    key = f"{model}.zip"
    encoded = key.replace("+", "%2B")
    v1_data, v2_data = make_zip(model_files(model, 1)), make_zip(model_files(model, 2))
    put1 = upload(env.moto, env.bucket, key, v1_data)
    put2 = upload(env.moto, env.bucket, key, v2_data)
    sqs = env.moto.client("sqs")
    queue = sqs.create_queue(QueueName=unique("events-"))["QueueUrl"]
    messages = [
        json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": env.bucket}),
        s3_record(env.bucket, encoded, "0064D3901D00059242", put2["VersionId"]),
        s3_record(env.bucket, encoded, "0064D3901D00059242", put2["VersionId"]),  # delivered twice
        s3_record(env.bucket, encoded, "0064D3901D0005923F", put1["VersionId"]),  # the older PUT, late
        "not json at all",
    ]
    for body in messages:
        sqs.send_message(QueueUrl=queue, MessageBody=body)
    app = env.app(queue_url=queue)
    try:
        filt, pending = EventFilter(env.bucket, ""), Pending()
        poller = QueuePoller(sqs, queue, filt, pending, app.syncer.log, wait_seconds=1)
        while poller.received < len(messages):
            assert poller.poll_once() > 0
        assert (filt.duplicates, filt.stale, poller.malformed) == (1, 1, 1)
        assert list(pending.take(0)) == [model]
        assert sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0).get("Messages") is None  # all deleted
        outcome = app.syncer.reconcile_models([model])[model]
        assert outcome.in_sync and env.link(model).endswith(sha(v2_data))
        # A daemon that never saw the v2 event gets only the late v1 one: the listing still decides.
        fresh = EventFilter(env.bucket, "")
        assert fresh.accept(*__import__("modelsync.events", fromlist=["parse"]).parse(messages[3])) == model
        assert app.syncer.reconcile_models([model])[model].in_sync
    finally:
        app.close()
    assert env.infer(model, 1.0) == 3.0 and env.link(model).endswith(sha(v2_data))
    assert [(a["result"], a["sha256"]) for a in env.attempts(model)] == [("ok", sha(v2_data))]


def test_removed_model_is_kept_unless_delete_removed(env: Env) -> None:
    model = unique("gone")
    digest = install(env, model)
    env.moto.client("s3").delete_object(Bucket=env.bucket, Key=f"{model}.zip")
    report = env.sync()
    assert report.ok and not report.outcomes[model].in_sync and "--delete-removed" in report.outcomes[model].reason
    assert env.link(model).endswith(digest) and env.infer(model, 1.0) == 2.0
    report = env.sync(delete_removed=True)
    assert report.ok and report.outcomes[model].gone
    assert not (env.repository / model).is_symlink() and not (env.store / model).exists()
    assert env.triton.request("GET", f"/v2/models/{model}/ready")[0] != 200


def test_emitted_metrics_match_the_table(env: Env) -> None:
    install(env, unique("table"))
    docs = env.docs()
    assert docs
    for doc in docs:
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "Triton"
            for metric in directive["Metrics"]:
                row = BY_NAME[metric["Name"]]
                assert metric["Unit"] == row.unit
                assert [tuple(d) for d in directive["Dimensions"]] == list(row.dimension_sets)


def test_a_directory_placed_by_hand_is_reported_and_left_alone(env: Env) -> None:
    model = unique("manual")
    (env.repository / model).mkdir()
    (env.repository / model / "config.pbtxt").write_text("mine")
    try:
        upload(env.moto, env.bucket, f"{model}.zip", make_zip(model_files(model, 1)))
        outcome = env.sync().outcomes[model]
        assert outcome.result == "load_failed" and "not a modelsync link" in outcome.reason
        assert (env.repository / model / "config.pbtxt").read_text() == "mine"
        assert store_dirs(env, model) == set() and staging_empty(env)
    finally:
        import shutil

        shutil.rmtree(env.repository / model)


def test_triton_unreachable_defers_the_install_and_is_retried(env: Env) -> None:
    """After the first sync, a Triton that does not answer gets no new link: nothing is downloaded or flipped
    under a Triton that is down or starting, and the attempt is retried once it answers."""
    from demo.triton import free_port

    model = unique("down")
    v1 = install(env, model)
    dead = f"http://127.0.0.1:{free_port()}"
    outcome = env.sync(triton_url=dead).outcomes[model]  # installed, but READY cannot be confirmed
    assert outcome.failed and "unreachable" in outcome.reason and env.link(model).endswith(v1)
    v2_data = make_zip(model_files(model, 2))
    upload(env.moto, env.bucket, f"{model}.zip", v2_data)
    attempts = len(env.attempts(model))
    outcome = env.sync(triton_url=dead).outcomes[model]
    assert outcome.result == "load_failed" and outcome.transient and "does not answer" in outcome.reason
    assert len(env.attempts(model)) == attempts and sha(v2_data) not in store_dirs(env, model)  # nothing fetched
    assert env.link(model).endswith(v1) and env.infer(model, 1.0) == 2.0 and staging_empty(env)
    assert env.sync().outcomes[model].in_sync  # not blamed on the archive: tried again once Triton answers
    assert env.link(model).endswith(sha(v2_data)) and env.infer(model, 1.0) == 3.0


# --- large archives: parallel ranged GETs (modelsync/transfer.py) ----------------------------------

PART = 64 * 1024  # small parts, so a 1 MiB archive is ~17 ranged GETs
ROOT = REPO


def big_zip(model: str, add: float) -> bytes:
    return make_zip({**model_files(model, add), f"{model}/1/weights.bin": os.urandom(1 << 20)})


def ranged(proxy: TruncatingProxy, key: str) -> list[str]:
    """The body's parts asked for (the zip's directory, read first from the end as a suffix range, aside)."""
    return sorted(r for _, _, r, status, _ in proxy.gets(key) if status == 206 and not r.startswith("bytes=-"))


def all_ranges(size: int, first: int = 0) -> list[str]:
    return sorted(f"bytes={a}-{min(size, a + PART) - 1}" for a in range(first * PART, size, PART))


@pytest.mark.parametrize("fault", ["corrupt", "cut"])
def test_a_bad_part_fails_the_attempt_and_the_old_version_keeps_serving(env: Env, fault: str) -> None:
    model = unique(f"part{fault}")
    v1 = install(env, model)
    before = store_dirs(env, model)
    data = big_zip(model, 2)
    upload(env.moto, env.bucket, f"{model}.zip", data)
    with TruncatingProxy(env.moto.url, keep=1000) as proxy:
        getattr(proxy, fault).add(f"{model}.zip")
        env.s3_url = proxy.url
        outcome = env.sync(part_size=PART, connections=4).outcomes[model]
        assert len(ranged(proxy, f"{model}.zip")) > 1  # it came in parts
        assert outcome.result == ("hash_mismatch" if fault == "corrupt" else "download_error"), outcome
        assert_untouched(env, model, v1, before)
    env.s3_url = ""
    if fault == "cut":  # transient: the same archive is fetched again once the network recovers
        assert env.sync(part_size=PART, connections=4).outcomes[model].in_sync
        assert env.infer(model, 1.0) == 3.0 and env.link(model).endswith(sha(data))


def crash_mid_download(env: Env, proxy: TruncatingProxy, key: str, parts: int) -> None:
    """A daemon (a subprocess, the real settings and parts) killed once the first ``parts`` parts of ``key`` are
    in its journal, the proxy holding every GET from there on."""
    proxy.hold.add(key)
    proxy.hold_from = parts * PART
    s = env.settings()
    args = [
        f"--bucket={s.bucket}",
        f"--repository={s.repository}",
        f"--store={s.store}",
        f"--triton-url={s.triton_url}",
        f"--output=file:{env.emf}",
        "--min-free-bytes=0",
        "--hash-tag-wait=0",
        f"--part-size={PART}",
        "--connections=4",
        "--host-id=test-host",
    ]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "modelsync_crash.py"), *args],
        cwd=ROOT,
        env=env.moto.env(proxy.url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def journaled() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the daemon exited ({proc.returncode}): {proc.communicate()[1].decode()}")
            lines = [ln for j in env.store.glob(".staging/*/partial-*.journal") for ln in j.read_text().splitlines()]
            return len(lines) == 1 + parts and proxy.held == 4  # every connection waits at the proxy

        wait_for(journaled, timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    proxy.hold.clear()  # the GETs held for the dead process stay held; new ones pass
    proxy.log.clear()


def test_a_daemon_killed_mid_download_resumes_with_only_the_missing_parts(env: Env) -> None:
    model = unique("resume")
    v1 = install(env, model)
    data = big_zip(model, 2)
    upload(env.moto, env.bucket, f"{model}.zip", data)
    key = f"{model}.zip"
    with TruncatingProxy(env.moto.url) as proxy:
        crash_mid_download(env, proxy, key, 3)
        assert env.link(model).endswith(v1) and env.infer(model, 1.0) == 2.0
        env.s3_url = proxy.url
        assert env.sync(part_size=PART, connections=4).outcomes[model].in_sync  # recover() kept the partial
        assert ranged(proxy, key) == all_ranges(len(data), first=3)  # the journaled parts are not asked for
        body = [e[4] for e in proxy.gets(key) if not e[2].startswith("bytes=-")]
        directory = [e[4] for e in proxy.gets(key) if e[2].startswith("bytes=-")]
        assert sum(body) == len(data) - 3 * PART and directory == [min(len(data), END_BYTES)]
    assert env.infer(model, 1.0) == 3.0 and env.link(model).endswith(sha(data))
    assert staging_empty(env)


def test_an_archive_replaced_between_crash_and_resume_is_fetched_whole(env: Env) -> None:
    model = unique("replaced")
    install(env, model)
    upload(env.moto, env.bucket, f"{model}.zip", big_zip(model, 2))
    key = f"{model}.zip"
    with TruncatingProxy(env.moto.url) as proxy:
        crash_mid_download(env, proxy, key, 3)
        data = big_zip(model, 4)
        upload(env.moto, env.bucket, key, data)
        env.s3_url = proxy.url
        assert env.sync(part_size=PART, connections=4).outcomes[model].in_sync
        assert ranged(proxy, key) == all_ranges(len(data))
    assert env.infer(model, 1.0) == 5.0 and env.link(model).endswith(sha(data))
    assert staging_empty(env)  # the old version's partial and journal are gone too


def test_an_archive_is_read_back_once_for_its_hash_and_its_entries_together(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Download, verify and place at once (issue 39): the bytes of the downloaded archive are read back from
    its file once, by the hash, and the entries are written from that same read. Before, zipfile read the
    file a second time to extract it (the reads counted here: 2x the archive)."""
    import builtins
    import io

    model = unique("onepass")
    install(env, model)
    data = big_zip(model, 2)
    upload(env.moto, env.bucket, f"{model}.zip", data)
    staging = str(env.store / ".staging")
    read = [0]
    real_pread, real_open = os.pread, io.open

    def pread(fd: int, n: int, offset: int) -> bytes:
        got = real_pread(fd, n, offset)
        if os.readlink(f"/proc/self/fd/{fd}").startswith(staging):
            read[0] += len(got)
        return got

    class Counted(io.BufferedReader):
        def read(self, n: int | None = -1) -> bytes:
            got = super().read(n)
            read[0] += len(got)
            return got

    def opener(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        f = real_open(file, mode, *args, **kw)
        if mode == "rb" and isinstance(file, (str, os.PathLike)) and str(file).startswith(staging):
            return Counted(f.detach())
        return f

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(io, "open", opener)
    monkeypatch.setattr(builtins, "open", opener)
    assert env.sync(part_size=PART, connections=4).outcomes[model].in_sync
    assert read[0] == len(data)
    assert env.infer(model, 1.0) == 3.0 and env.link(model).endswith(sha(data))


def test_a_model_loads_while_another_still_downloads(env: Env) -> None:
    """Across models (issue 39): the pass installs --parallel-models at once, the largest first. The larger
    model's body is held at the proxy; the smaller one is downloaded, loaded and served meanwhile. One after
    another (--parallel-models 1), the smaller would wait behind the held one."""
    held, quick = unique("held"), unique("quick")
    big = big_zip(held, 2)
    upload(env.moto, env.bucket, f"{held}.zip", big)
    upload(env.moto, env.bucket, f"{quick}.zip", make_zip(model_files(quick, 1.0)))
    with TruncatingProxy(env.moto.url) as proxy:
        proxy.hold.add(f"{held}.zip")  # every ranged GET of its body waits (its directory read passes)
        env.s3_url = proxy.url
        result: list[Report] = []
        sync = threading.Thread(target=lambda: result.append(env.sync(part_size=PART, connections=4)))
        sync.start()
        try:

            def quick_served() -> bool:
                try:
                    return proxy.held > 0 and env.infer(quick, 1.0) == 2.0
                except AssertionError:  # not loaded yet
                    return False

            wait_for(quick_served, timeout=50, step=0.2)
            assert proxy.held > 0 and not result  # served while the other's download is still held
        finally:
            proxy.release()
            sync.join(timeout=120)
    env.s3_url = ""
    assert result and result[0].outcomes[held].in_sync and result[0].outcomes[quick].in_sync
    assert env.infer(held, 1.0) == 3.0


def test_install_order_is_the_operators_then_the_largest_first() -> None:
    from datetime import UTC, datetime

    from modelsync.reconcile import install_order
    from modelsync.s3 import Archive

    now = datetime.now(UTC)
    archives = {m: Archive(m, f"{m}.zip", "e", size, now) for m, size in
                [("a", 10), ("b", 30), ("c", 20), ("d", 30), ("e", 5)]}  # fmt: skip
    assert install_order(archives) == ["b", "d", "c", "a", "e"]
    assert install_order(archives, ("e", "zz", "a", "e")) == ["e", "a", "b", "d", "c"]


def test_a_directory_read_flipped_on_the_wire_is_retried_never_remembered(env: Env) -> None:
    """The zip's directory is read from the object's end by a GET the whole object's sha256 does not cover:
    a byte flipped there is a download error (transient, retried), never an unsafe archive remembered until
    the object changes; once the network is sane the same object installs."""
    model = unique("dirflip")
    v1 = install(env, model)
    data = big_zip(model, 2)
    upload(env.moto, env.bucket, f"{model}.zip", data)
    with TruncatingProxy(env.moto.url) as proxy:
        proxy.corrupt_directory.add(f"{model}.zip")
        env.s3_url = proxy.url
        outcome = env.sync(part_size=PART, connections=4).outcomes[model]
    env.s3_url = ""
    assert outcome.result == "download_error" and outcome.transient, outcome
    assert env.link(model).endswith(v1) and env.infer(model, 1.0) == 2.0
    assert not (env.store / ".refused.json").exists() or model not in (env.store / ".refused.json").read_text()
    assert env.sync(part_size=PART, connections=4).outcomes[model].in_sync
    assert env.infer(model, 1.0) == 3.0 and env.link(model).endswith(sha(data))


def test_a_directory_read_that_looks_unsafe_is_judged_again_from_the_verified_download(env: Env) -> None:
    """A flipped byte that makes the directory read from the end unreadable is not a verdict on the archive:
    the archive is downloaded whole, its sha256 checked, and judged from those bytes (here: installed)."""
    model = unique("dirsig")
    install(env, model)
    data = big_zip(model, 2)
    upload(env.moto, env.bucket, f"{model}.zip", data)
    with TruncatingProxy(env.moto.url) as proxy:
        proxy.corrupt_directory.add(f"{model}.zip")
        proxy.directory_fault = "signature"
        env.s3_url = proxy.url
        outcome = env.sync(part_size=PART, connections=4).outcomes[model]
        whole = [e for e in proxy.gets(f"{model}.zip") if not e[2].startswith("bytes=-")]
    env.s3_url = ""
    assert outcome.in_sync, outcome
    assert sum(e[4] for e in whole) == len(data)  # the body, once
    assert env.infer(model, 1.0) == 3.0 and env.link(model).endswith(sha(data))
