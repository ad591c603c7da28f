"""Directory models (``<model>/manifest.json`` and its files) against moto's S3 and one real Triton.

Each test has its own bucket and model names; the Triton and its repository are shared by the module.
What is measured is what the daemon reports (the attempt's EMF, its outcome) and what Triton serves.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from modelsync.events import EventFilter, parse
from modelsync.manifest import blocks
from tests.support.msync import (
    CONFIG,
    MODEL_PY,
    Env,
    FaultFileSystem,
    leftovers,
    make_zip,
    model_files,
    module_env,
    module_triton,
    moto,  # noqa: F401 - a fixture
    sha,
    unique,
    upload,
)

pytestmark = [pytest.mark.triton]

BROKEN_PY = b'raise RuntimeError("boom: this build does not load")\n'


served = module_triton("msyncdir")


@pytest.fixture
def env(moto, served, request) -> Env:  # noqa: F811 - the fixtures
    return module_env(moto, served, request)


def files_of(model: str, add: float = 1.0, **extra: bytes) -> dict[str, bytes]:
    """A directory model's files, paths relative to the model directory."""
    return {
        "config.pbtxt": CONFIG.format(name=model).encode(),
        "1/model.py": MODEL_PY.format(add=add).encode(),
        **{f"1/{name}": data for name, data in extra.items()},
    }


def manifest_of(files: dict[str, bytes]) -> bytes:
    return json.dumps({"files": [{"path": p, "size": len(d), "sha256": sha(d)} for p, d in files.items()]}).encode()


def upload_dir(env: Env, model: str, files: dict[str, bytes], manifest: bytes | None = None) -> bytes:
    """Files first, the manifest last (its sha256 as user metadata), as docs/modelsync.md says."""
    for path, data in files.items():
        upload(env.moto, env.bucket, f"{model}/{path}", data, digest=None)
    manifest = manifest_of(files) if manifest is None else manifest
    upload(env.moto, env.bucket, f"{model}/manifest.json", manifest)
    return manifest


def install_dir(env: Env, model: str, files: dict[str, bytes]) -> str:
    manifest = upload_dir(env, model, files)
    outcome = env.sync().outcomes[model]
    assert outcome.in_sync, outcome
    return sha(manifest)


def store_dirs(env: Env, model: str) -> set[str]:
    return {p.name for p in (env.store / model).iterdir()} if (env.store / model).exists() else set()


def assert_untouched(env: Env, model: str, digest: str, before: set[str], add: float = 1.0) -> None:
    assert env.link(model).endswith(digest)
    assert env.infer(model, 1.0) == 1.0 + add
    assert leftovers(env.store, env.repository) == []
    assert store_dirs(env, model) <= before


WEIGHTS = os.urandom(300_000)


def fetched(caplog: pytest.LogCaptureFixture, env: Env, model: str) -> list[str]:
    """The object GETs moto served for ``model`` (its request log: moto runs in this process), then forget them."""
    pattern = re.compile(rf'"GET /{re.escape(env.bucket)}/{re.escape(model)}/([^ ?]+)')
    keys = [m.group(1) for r in caplog.records if r.name == "werkzeug" and (m := pattern.search(r.getMessage()))]
    caplog.clear()
    return keys


def test_directory_model_is_installed_and_served(env: Env) -> None:
    model = unique("dir")
    files = files_of(model, 1, **{"weights.bin": WEIGHTS})
    digest = install_dir(env, model, files)
    assert env.link(model) == f"../store/{model}/{digest}"  # named by the manifest's sha256, like an archive
    assert env.infer(model, 1.0) == 2.0
    served = env.store / model / digest
    on_disk = {p.relative_to(served).as_posix() for p in served.rglob("*") if p.is_file()}
    assert {p for p in on_disk if "__pycache__" not in p} == {*files, "manifest.json"}  # (Triton's python backend
    # writes its bytecode cache beside model.py here; in the ECS task the store is mounted read-only for Triton)
    assert all((served / p).read_bytes() == d for p, d in files.items())
    (attempt,) = env.attempts(model)
    assert attempt["result"] == "ok" and attempt["key"] == f"{model}/manifest.json"
    assert attempt["SyncBytesDownloaded"] == sum(map(len, files.values())) + len(manifest_of(files))
    assert leftovers(env.store, env.repository) == []
    assert env.sync().outcomes[model].in_sync and len(env.attempts(model)) == 1  # unchanged manifest: nothing more


def test_update_downloads_only_the_changed_file_and_triton_reloads(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """One file changed: only it is downloaded, the rest hard-linked from the installed directory; Triton
    still sees a change and reloads (the directories are new; link(2) moves the shared inodes' ctime)."""
    model = unique("dirup")
    v1 = install_dir(env, model, files_of(model, 1, **{"weights.bin": WEIGHTS}))
    old = env.store / model / v1
    loads = env.triton.log_text().count(f"loading: {model}:1")
    v2_files = files_of(model, 2, **{"weights.bin": WEIGHTS})
    v2_manifest = upload_dir(env, model, v2_files)
    caplog.set_level("INFO", logger="werkzeug")
    fetched(caplog, env, model)
    ctime = os.stat(old / "config.pbtxt").st_ctime_ns
    outcome = env.sync().outcomes[model]
    assert fetched(caplog, env, model) == ["manifest.json", "1/model.py"]
    assert outcome.in_sync and outcome.result == "ok", outcome
    v2 = sha(v2_manifest)
    new = env.store / model / v2
    assert env.infer(model, 1.0) == 3.0  # Triton serves the new model.py
    attempt = env.attempts(model)[-1]
    assert attempt["SyncBytesDownloaded"] == len(v2_manifest) + len(v2_files["1/model.py"])  # not the 300 kB
    for same in ("config.pbtxt", "1/weights.bin"):
        assert os.stat(new / same).st_ino == os.stat(old / same).st_ino  # one file on disk, two names
    assert os.stat(new / "1/model.py").st_ino != os.stat(old / "1/model.py").st_ino
    assert os.stat(old / "config.pbtxt").st_ctime_ns > ctime  # link(2) moved the shared inode's ctime
    assert store_dirs(env, model) == {v1, f"{v1}.json", v2, f"{v2}.json"}  # --keep-previous (default)
    assert env.triton.log_text().count(f"loading: {model}:1") == loads + 1

    # Only config.pbtxt changes: every file of version 1 is a hard link, and Triton still reloads the model.
    v3_files = {
        **v2_files,
        "config.pbtxt": v2_files["config.pbtxt"].replace(b"max_batch_size: 8", b"max_batch_size: 4"),
    }
    v3_manifest = upload_dir(env, model, v3_files)
    fetched(caplog, env, model)
    assert env.sync().outcomes[model].in_sync
    assert fetched(caplog, env, model) == ["manifest.json", "config.pbtxt"]
    assert env.attempts(model)[-1]["SyncBytesDownloaded"] == len(v3_manifest) + len(v3_files["config.pbtxt"])
    v3 = env.store / model / sha(v3_manifest)
    assert os.stat(v3 / "1/model.py").st_ino == os.stat(new / "1/model.py").st_ino
    status, config = env.triton.request("GET", f"/v2/models/{model}/config")
    assert status == 200 and config["max_batch_size"] == 4, config  # the reload happened
    assert env.triton.log_text().count(f"loading: {model}:1") == loads + 2  # version 1 loaded again
    assert env.infer(model, 1.0) == 3.0
    assert store_dirs(env, model) == {v2, f"{v2}.json", v3.name, f"{v3.name}.json"}  # v1 pruned, shared inodes kept
    assert (v3 / "1/weights.bin").read_bytes() == WEIGHTS

    # A new manifest listing the same files (another order): nothing is fetched but the manifest, every file
    # is a hard link, the directories are new; Triton is asked to load it.
    v4_manifest = json.dumps({"files": json.loads(v3_manifest)["files"][::-1]}).encode()
    upload(env.moto, env.bucket, f"{model}/manifest.json", v4_manifest)
    assert env.sync().outcomes[model].in_sync
    assert fetched(caplog, env, model) == ["manifest.json"]
    loaded = lambda: env.triton.log_text().count(f"loading: {model}:1") - loads  # noqa: E731
    assert loaded() == 3  # reloaded, though no file content changed

    # Why: Triton compares max(mtime, ctime), and link(2) moves ctime. A served directory made read-only (as
    # in the ECS task: here Triton's python backend writes __pycache__ into it) is not reloaded by a load
    # call; after a hard link to one of its files is made elsewhere, the same call reloads it.
    v4 = env.store / model / sha(v4_manifest)
    folders = [d for d in (v4, v4 / "1", v4 / "1" / "__pycache__") if d.exists()]
    extra = env.root / f"{model}-extra-link"
    try:
        for d in folders:
            os.chmod(d, 0o555)
        assert env.triton.load(model) == 200 and loaded() == 4  # chmod moved the directories' ctime
        assert env.triton.load(model) == 200 and env.triton.load(model) == 200 and loaded() == 4  # no reload
        os.link(v4 / "1/model.py", extra)
        assert env.triton.load(model) == 200 and loaded() == 5  # only the shared inode's ctime changed
    finally:
        extra.unlink(missing_ok=True)
        for d in folders:
            os.chmod(d, 0o755)


def test_rollback_to_an_earlier_manifest_serves_it_again(env: Env) -> None:
    """The old directory shares inodes with the current one (their ctime moved with every link), so it never
    looks newer than what Triton serves: it is fetched afresh (<sha>.1), hard-linking what it can."""
    model = unique("dirback")
    v1_files = files_of(model, 1)
    v1 = install_dir(env, model, v1_files)
    install_dir(env, model, files_of(model, 2))
    assert env.infer(model, 1.0) == 3.0
    upload_dir(env, model, v1_files)
    assert env.sync().outcomes[model].in_sync
    assert env.infer(model, 1.0) == 2.0 and env.link(model).endswith(f"{v1}.1")


def test_a_manifest_inside_an_archive_is_not_believed(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """From an archive to a directory model: a manifest.json the zip carried claims a hash for a file that has
    other content; only a manifest verified at install (its sha256 names the directory) lets files be linked."""
    model = unique("zip2dir")
    files = files_of(model, 2)
    size = len(files["1/model.py"])
    lie = {"files": [{"path": "1/model.py", "size": size, "sha256": sha(files["1/model.py"])}]}
    zipped = {**model_files(model, 1), f"{model}/manifest.json": json.dumps(lie).encode()}
    assert len(zipped[f"{model}/1/model.py"]) == size and zipped[f"{model}/1/model.py"] != files["1/model.py"]
    upload(env.moto, env.bucket, f"{model}.zip", make_zip(zipped))
    assert env.sync().outcomes[model].in_sync and env.infer(model, 1.0) == 2.0
    env.moto.client("s3").delete_object(Bucket=env.bucket, Key=f"{model}.zip")
    caplog.set_level("INFO", logger="werkzeug")
    upload_dir(env, model, files)
    fetched(caplog, env, model)
    assert env.sync().outcomes[model].in_sync
    assert sorted(fetched(caplog, env, model)) == ["1/model.py", "config.pbtxt", "manifest.json"]
    assert env.infer(model, 1.0) == 3.0


# --- faults: each fails cleanly, leaves no staging, and the old version keeps serving --------------------


FAULTS = {
    # kind: (result, words of the reason)
    "file_hash": ("hash_mismatch", "1/model.py: sha256"),
    "truncated_manifest": ("unsafe_archive", "not valid JSON (truncated?)"),
    "missing_file": ("download_error", "names 1/extra.bin, which is not in s3://"),
    "traversal": ("unsafe_archive", "'..' in the path"),
    "disk_fills": ("disk_full", "No space left on device"),
}


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_a_faulty_update_fails_cleanly_and_the_old_version_serves(env: Env, kind: str) -> None:
    model = unique(kind.replace("_", "")[:10])
    v1 = install_dir(env, model, files_of(model, 1))
    before = store_dirs(env, model)
    outside = env.files_outside_store()
    files = files_of(model, 2, **({"weights.bin": WEIGHTS} if kind == "disk_fills" else {}))
    manifest = manifest_of(files)
    fs = None
    if kind == "file_hash":
        doc = json.loads(manifest)
        doc["files"][1]["sha256"] = sha(b"not what is uploaded")
        manifest = json.dumps(doc).encode()
    elif kind == "truncated_manifest":
        manifest = manifest[: len(manifest) // 2]  # its metadata hash is the truncated bytes' (the uploader's)
    elif kind == "missing_file":
        doc = json.loads(manifest)
        doc["files"].append({"path": "1/extra.bin", "size": 3, "sha256": sha(b"abc")})
        manifest = json.dumps(doc).encode()
    elif kind == "traversal":
        doc = json.loads(manifest)
        doc["files"].append({"path": "1/../../escaped-rel", "size": 1, "sha256": sha(b"x")})
        manifest = json.dumps(doc).encode()
        upload(env.moto, env.bucket, f"{model}/1/../../escaped-rel", b"x", digest=None)
    elif kind == "disk_fills":
        fs = FaultFileSystem(write_budget=len(manifest) + 100_000)  # the manifest and model.py fit, the weights not
    upload_dir(env, model, files, manifest)
    outcome = env.sync(**({"fs": fs} if fs else {})).outcomes[model]
    result, words = FAULTS[kind]
    assert (outcome.result, outcome.failed) == (result, True), outcome
    assert words in outcome.reason, outcome.reason
    assert_untouched(env, model, v1, before)
    assert env.files_outside_store() == outside
    assert not list(env.root.parent.rglob("escaped*"))
    if kind == "missing_file":  # not the manifest's fault: retried, and installed once the file is there
        upload(env.moto, env.bucket, f"{model}/1/extra.bin", b"abc", digest=None)
    if kind in ("missing_file", "disk_fills"):
        assert env.sync().outcomes[model].in_sync
        assert env.infer(model, 1.0) == 3.0


def test_free_space_counts_only_the_files_to_download_and_is_checked_first(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    model = unique("dirfree")
    install_dir(env, model, files_of(model, 1, **{"weights.bin": WEIGHTS}))
    v1 = env.link(model).rsplit("/", 1)[1]
    before = store_dirs(env, model)
    new_weights = os.urandom(200_000)
    files = files_of(model, 2, **{"weights.bin": WEIGHTS, "more.bin": new_weights})
    manifest = upload_dir(env, model, files)
    block = os.statvfs(env.store).f_frsize
    caplog.set_level("INFO", logger="werkzeug")
    fetched(caplog, env, model)
    need = blocks(len(files["1/model.py"]), block) + blocks(len(new_weights), block) + block * 2  # "1/" and "."
    outcome = env.sync(fs=FaultFileSystem(free=need - 1)).outcomes[model]
    assert outcome.result == "disk_full", outcome
    assert f"needs {need} bytes" in outcome.reason and "2 of 4 files (2 reused" in outcome.reason  # weights: linked
    attempt = env.attempts(model)[-1]
    assert attempt["SyncBytesDownloaded"] == len(manifest)  # not one byte of a model file was fetched
    assert fetched(caplog, env, model) == ["manifest.json"]
    assert_untouched(env, model, v1, before)
    assert env.sync(fs=FaultFileSystem(free=need)).outcomes[model].in_sync  # exactly enough: installed
    assert env.infer(model, 1.0) == 3.0


def test_keep_previous_off_removes_the_old_directory_once_the_new_one_is_loaded(env: Env) -> None:
    model = unique("dirprune")
    v1 = install_dir(env, model, files_of(model, 1, **{"weights.bin": WEIGHTS}))
    manifest = upload_dir(env, model, files_of(model, 2, **{"weights.bin": WEIGHTS}))
    assert env.sync(keep_previous=False).outcomes[model].in_sync
    v2 = sha(manifest)
    assert store_dirs(env, model) == {v2, f"{v2}.json"} and not (env.store / model / v1).exists()
    assert env.infer(model, 1.0) == 3.0
    assert (env.store / model / v2 / "1/weights.bin").read_bytes() == WEIGHTS  # the linked file outlives the dir


# --- listing and events ------------------------------------------------------------------------------


def test_a_zip_and_a_manifest_for_one_model_are_refused_and_the_others_continue(env: Env) -> None:
    model, other = unique("both"), unique("fine")
    upload(env.moto, env.bucket, f"{model}.zip", make_zip(model_files(model, 1)))
    upload_dir(env, model, files_of(model, 2))
    upload_dir(env, other, files_of(other, 4))
    report = env.sync()
    outcome = report.outcomes[model]
    assert (outcome.result, outcome.failed, outcome.transient) == ("", True, False)  # refused, first sync complete
    assert "both" in outcome.reason and f"{model}.zip" in outcome.reason and f"{model}/manifest.json" in outcome.reason
    assert report.complete and not (env.repository / model).is_symlink() and outcome.serving == ""
    assert [a["result"] for a in env.attempts(model)] == ["unsafe_archive"]
    assert report.outcomes[other].in_sync and env.infer(other, 1.0) == 5.0
    app = env.app()
    try:
        assert "both" in app.syncer.reconcile_models([model])[model].reason  # an event finds the conflict too
    finally:
        app.close()
    env.moto.client("s3").delete_object(Bucket=env.bucket, Key=f"{model}.zip")
    assert env.sync().outcomes[model].in_sync and env.infer(model, 1.0) == 3.0
    served = env.link(model).rsplit("/", 1)[1]
    upload(env.moto, env.bucket, f"{model}.zip", make_zip(model_files(model, 9)))  # a conflict once installed
    outcome = env.sync().outcomes[model]
    assert outcome.failed and "both" in outcome.reason and outcome.serving == served  # reported as still served
    assert env.link(model).endswith(served) and env.infer(model, 1.0) == 3.0


def test_a_manifest_event_reconciles_the_model_and_file_events_are_ignored(env: Env) -> None:
    from tests.integration.modelsync.test_modelsync_sync import s3_record

    model = unique("direv")
    manifest = upload_dir(env, model, files_of(model, 6))
    filt = EventFilter(env.bucket, "")
    for n, key in enumerate(("config.pbtxt", "1/model.py")):
        assert filt.accept(*parse(s3_record(env.bucket, f"{model}/{key}", f"0{n}", "v"))) is None
    assert filt.accept(*parse(s3_record(env.bucket, f"{model}/manifest.json", "09", "v"))) == model
    app = env.app()
    try:
        outcome = app.syncer.reconcile_models([model])[model]
    finally:
        app.close()
    assert outcome.in_sync and env.link(model).endswith(sha(manifest)) and env.infer(model, 1.0) == 7.0


# --- in sync only when Triton says READY -----------------------------------------------------------------


def test_a_model_unloaded_behind_our_back_is_not_in_sync_and_is_reloaded(env: Env) -> None:
    model = unique("dirgone")
    install_dir(env, model, files_of(model, 1))
    assert env.triton.unload(model) == 200
    assert env.triton.request("GET", f"/v2/models/{model}/ready")[0] != 200
    outcome = env.sync().outcomes[model]
    assert outcome.in_sync and outcome.result == "ok"  # reloaded in this pass: a load attempt, nothing downloaded
    attempt = env.attempts(model)[-1]
    assert "SyncLoadTime" in attempt and "SyncBytesDownloaded" not in attempt
    assert env.infer(model, 1.0) == 2.0


def test_a_model_triton_cannot_load_is_not_counted_in_sync_until_it_is_ready(env: Env) -> None:
    """The link is right but Triton reports the model not READY (here: its load fails after an unload)."""
    model = unique("dirfail")
    digest = install_dir(env, model, files_of(model, 1))
    code = env.store / model / digest / "1" / "model.py"
    good = code.read_bytes()
    assert env.triton.unload(model) == 200
    os.chmod(code, 0o644)
    code.write_bytes(BROKEN_PY)  # what Triton would read now fails (the store is never edited outside tests)
    try:
        outcome = env.sync().outcomes[model]
        assert not outcome.in_sync and outcome.failed and outcome.result == "load_failed", outcome
        assert "boom" in outcome.reason
        state = [d for d in env.docs() if d.get("model") == model and "ModelInSync" in d][-1]
        assert state["ModelInSync"] == 0 and state["ModelArtifact"] == digest
        host = [d for d in env.docs() if "ModelsOutOfSync" in d][-1]
        assert host["ModelsOutOfSync"] >= 1
    finally:
        code.write_bytes(good)
    outcome = env.sync().outcomes[model]  # retried every pass (not the archive's fault that it is unloaded)
    assert outcome.in_sync and env.infer(model, 1.0) == 2.0
    state = [d for d in env.docs() if d.get("model") == model and "ModelInSync" in d][-1]
    assert state["ModelInSync"] == 1


# --- Triton's model_warmup: READY after our load call means warmed up ------------------------------------

WARMUP = """model_warmup [{{
  name: "zeros"
  batch_size: 1
  inputs {{ key: "INPUT0" value: {{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true }} }}
}}]
"""

COUNTING_PY = """import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        time.sleep({sleep})
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x + self.calls).astype(np.float32))]))
        return out
"""


def test_model_warmup_runs_inside_the_load_call(env: Env) -> None:
    """READY after our load call means warmed up, and the warmup time is part of our load phase.

    A failing warmup is not tested here: on a reload of a READY model it failed the load and rolled back in
    runs of the test alone, but the load call hung in 3 of 4 runs of the whole modelsync test set, one of them
    with tritonserver 2.51 dying of SIGSEGV in its log (docs/modelsync.md)."""
    model = unique("warm")
    files = {
        "config.pbtxt": (CONFIG.format(name=model) + WARMUP.format()).encode(),
        "1/model.py": COUNTING_PY.format(sleep=1.5).encode(),
    }
    install_dir(env, model, files)
    attempt = env.attempts(model)[-1]
    assert attempt["SyncLoadTime"] >= 1500  # the warmup's 1.5 s is inside Triton's load call, so in our phase
    assert env.infer(model, 1.0) == 3.0  # 1 + 2 calls: the warmup ran before the model was READY to us


def test_a_directory_models_files_download_at_once_each_hashed_as_it_arrives(env: Env) -> None:
    """Issue 39: a directory model's files come in parallel, largest first, each straight into its staging
    path and hashed by its own transfer. With the largest file's GETs held at the proxy, the other files
    arrive whole meanwhile (one after another, they would wait behind it)."""
    import threading

    from tests.support.msync import TruncatingProxy, wait_for

    model = unique("pfiles")
    files = files_of(model, 2.0, **{"a.bin": os.urandom(300_000), "b.bin": os.urandom(200_000),
                                    "c.bin": os.urandom(100_000)})  # fmt: skip
    upload_dir(env, model, files)
    with TruncatingProxy(env.moto.url) as proxy:
        proxy.hold.add(f"{model}/1/a.bin")
        env.s3_url = proxy.url
        done: list[bool] = []
        sync = threading.Thread(target=lambda: done.append(env.sync(part_size=64 * 1024).outcomes[model].in_sync))
        sync.start()
        try:
            others = [f"{model}/1/b.bin", f"{model}/1/c.bin", f"{model}/1/model.py", f"{model}/config.pbtxt"]

            def others_whole() -> bool:
                got = {k: sum(e[4] for e in proxy.gets(k)) for k in others}
                return proxy.held > 0 and all(got[k] == len(files[k.split("/", 1)[1]]) for k in others)

            wait_for(others_whole, timeout=50, step=0.1)
            assert not done
        finally:
            proxy.release()
            sync.join(timeout=120)
    env.s3_url = ""
    assert done == [True] and env.infer(model, 1.0) == 3.0
