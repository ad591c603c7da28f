"""modelsync's parts on their own: settings, archive checks, events, the store's flip and recovery, metrics."""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from catalog import Catalog
from modelsync.__main__ import main, one_line
from modelsync.archive import Limits, extract, inspect
from modelsync.errors import Result, UnsafeArchive
from modelsync.events import EventFilter, MalformedMessage, ObjectEvent, newer, parse
from modelsync.fsio import LocalFileSystem
from modelsync.metrics import METRICS, PACK, Attempt, ModelState, Recorder, check_pack
from modelsync.settings import ENV_VARS, OPTIONS, ConfigError, load
from modelsync.store import Store, StoreError, model_name_problem
from telemetry.emf_validate import validate
from telemetry.settings import size
from telemetry.sinks import StreamSink
from tests.support.msync import make_zip, model_files

LIMITS = Limits(max_entries=100, max_bytes=10 * 1024 * 1024, max_ratio=50)


# --- settings ---------------------------------------------------------------------------------------


def test_flag_wins_over_variable_and_variable_over_default() -> None:
    env = {
        "MODELSYNC_BUCKET": "env-bucket",
        "MODELSYNC_INTERVAL": "30",
        "MODELSYNC_ALLOW_UNVERIFIED": "true",
        "AWS_EMF_AGENT_ENDPOINT": "udp://127.0.0.1:25888",
        "MODELSYNC_MAX_ARCHIVE_BYTES": "2G",
    }
    s = load(["--bucket", "flag-bucket", "--no-allow-unverified"], env)
    assert (s.bucket, s.interval, s.allow_unverified, str(s.output)) == (
        "flag-bucket",
        30.0,
        False,
        "udp://127.0.0.1:25888",
    )
    assert s.max_archive_bytes == 2 * 1024**3 and s.prefix == "" and s.triton_url == "http://localhost:8000"
    assert str(s.repository) == "/mnt/triton-models" and str(s.store_root) == "/mnt/triton-models.store"
    assert load(["--bucket", "abc", "--output", "file:/tmp/x"], env).output.path == "/tmp/x"
    assert load([], env).allow_unverified is True


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "--bucket (or MODELSYNC_BUCKET) is required"),
        (["--bucket", "Bad_Bucket"], "--bucket='Bad_Bucket'"),
        (["--bucket", "abc", "--interval", "-1"], "--interval='-1'"),
        (["--bucket", "abc", "--repository", "relative/path"], "must be an absolute path"),
        (["--bucket", "abc", "--repository", "/m", "--store", "/m/store"], "must be outside --repository"),
        (["--bucket", "abc", "--max-archive-bytes", "lots"], "--max-archive-bytes='lots'"),
        (["--bucket", "abc", "--triton-url", "localhost:8000"], "--triton-url="),
    ],
)
def test_invalid_settings_are_one_line_and_exit_2(argv: list[str], needle: str, capsys, monkeypatch) -> None:
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    with pytest.raises(ConfigError):
        load(argv, {})


def test_help_lists_every_flag_and_variable(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for option in OPTIONS:
        assert option.flag in out
        for env in option.env:
            assert env in out
    for flag in (
        "--once",
        "--bucket",
        "--prefix",
        "--repository",
        "--store",
        "--triton-url",
        "--queue-url",
        "--interval",
        "--output",
        "--allow-unverified",
        "--delete-removed",
        "--max-entries",
        "--max-ratio",
        "--max-extracted-bytes",
    ):
        assert flag in out


def test_sizes() -> None:
    assert [size(t) for t in ("1", "2K", "3MiB", "1g", "1T")] == [1, 2048, 3 * 1024**2, 1024**3, 1024**4]
    with pytest.raises(ValueError):
        size("-1")


def test_one_line_reason() -> None:
    assert (
        one_line("Internal: RuntimeError: boom\n\nAt:\n  model.py(1)\n;\n; rolled back")
        == "Internal: RuntimeError: boom / At: / model.py(1) / rolled back"
    )


# --- archive checks -----------------------------------------------------------------------------------


def zf_of(data: bytes) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(data))


def check(data: bytes, model: str = "m", limits: Limits = LIMITS):  # type: ignore[no-untyped-def]
    return inspect(zf_of(data), len(data), model, limits)


def special(name: str, mode: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, d in model_files("m").items():
            zf.writestr(n, d)
        info = zipfile.ZipInfo(name)
        info.create_system = 3
        info.external_attr = mode << 16
        zf.writestr(info, b"")
    return buf.getvalue()


def test_a_plain_model_archive_is_accepted_and_extracted(tmp_path: Path) -> None:
    files = {**model_files("m"), "m/labels.txt": b"a\nb\n", "m/2/model.py": b"# v2"}
    plan = check(make_zip(files))
    assert sorted(e.path.as_posix() for e in plan.files) == ["1/model.py", "2/model.py", "config.pbtxt", "labels.txt"]
    dest = tmp_path / "m"
    dest.mkdir()
    assert extract(zf_of(make_zip(files)), plan, dest, LocalFileSystem()) == plan.total_bytes
    assert (dest / "2" / "model.py").read_bytes() == b"# v2" and (dest / "labels.txt").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"m/../evil": b"x"}, "'..' in the path"),
        ({"/etc/evil": b"x"}, "absolute path"),
        ({"C:/evil": b"x"}, "absolute path"),
        ({"m\\1\\evil": b"x"}, "backslash"),
        ({"other/x": b"x"}, "outside m/"),
        ({"M/x": b"x"}, "outside m/"),
        ({"m/latest/model.py": b"x"}, "must be numeric versions, found latest"),
        ({"m": b"x"}, "a file where the model directory"),
    ],
)
def test_unsafe_paths_are_refused(files: dict[str, bytes], needle: str) -> None:
    with pytest.raises(UnsafeArchive, match=None) as exc:
        check(make_zip({**model_files("m"), **files}))
    assert needle in str(exc.value)


@pytest.mark.parametrize(
    ("name", "mode", "kind"),
    [
        ("m/1/link", stat.S_IFLNK | 0o777, "a symlink"),
        ("m/1/dev", stat.S_IFCHR | 0o600, "a character device"),
        ("m/1/disk", stat.S_IFBLK | 0o600, "a block device"),
        ("m/1/pipe", stat.S_IFIFO | 0o600, "a fifo"),
    ],
)
def test_non_regular_entries_are_refused(name: str, mode: int, kind: str) -> None:
    with pytest.raises(UnsafeArchive) as exc:
        check(special(name, mode))
    assert kind in str(exc.value)


def test_structure_is_required() -> None:
    with pytest.raises(UnsafeArchive, match=r"no m/config\.pbtxt"):
        check(make_zip({"m/1/model.py": b"x"}))
    with pytest.raises(UnsafeArchive, match="no numeric version directory"):
        check(make_zip({"m/config.pbtxt": b"x"}))
    with pytest.raises(UnsafeArchive, match="appears twice"):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for n, d in model_files("m").items():
                zf.writestr(n, d)
            with pytest.warns(UserWarning):
                zf.writestr("m/1/model.py", b"the other one")
        check(buf.getvalue())


def test_limits_and_zip_bombs() -> None:
    many = make_zip({**model_files("m"), **{f"m/1/f{i}": b"x" for i in range(200)}})
    with pytest.raises(UnsafeArchive, match=r"202 entries, more than the limit"):
        check(many)
    big = make_zip({**model_files("m"), "m/1/w.bin": os.urandom(11 * 1024 * 1024)}, compression=zipfile.ZIP_STORED)
    with pytest.raises(UnsafeArchive, match="bytes uncompressed"):
        check(big)
    bomb = make_zip({**model_files("m"), "m/1/zeros": bytes(5 * 1024 * 1024)})
    with pytest.raises(UnsafeArchive, match="compression ratio"):
        check(bomb)
    assert check(bomb, limits=Limits(100, 10 * 1024 * 1024, 10_000))  # under a looser limit it is just a file


def test_overlapping_entries_are_refused() -> None:
    """The "better zip bomb": many central-directory entries sharing one compressed body."""
    data = bytearray(make_zip({**model_files("m"), "m/1/a": bytes(1000)}))
    zf = zf_of(bytes(data))
    base = zf.getinfo("m/1/a")
    eocd = data.rfind(b"PK\x05\x06")
    cd_offset = int.from_bytes(data[eocd + 16 : eocd + 20], "little")
    central = bytes(data[cd_offset:eocd])
    start = central.find(b"m/1/a") - 46
    record = bytearray(central[start : start + 46 + len("m/1/a")])
    extra = b""
    for i in range(30):  # the same local header, 30 more names
        r = bytearray(record)
        name = f"m/1/{i:03d}".encode()
        r[28:30] = len(name).to_bytes(2, "little")
        extra += bytes(r[:46]) + name
    new_central = central + extra
    count = len(zf.infolist()) + 30
    tail = bytearray(data[eocd:])
    tail[8:10] = count.to_bytes(2, "little")
    tail[10:12] = count.to_bytes(2, "little")
    tail[12:16] = len(new_central).to_bytes(4, "little")
    forged = bytes(data[:cd_offset]) + new_central + bytes(tail)
    assert base.compress_size > 0
    with pytest.raises(UnsafeArchive, match="overlapping"):
        check(forged)


# --- events ---------------------------------------------------------------------------------------------


def test_envelopes_are_parsed_and_keys_decoded() -> None:
    s3 = {
        "Records": [
            {
                "eventSource": "aws:s3",
                "eventName": "ObjectCreated:Put",
                "eventTime": "t1",
                "s3": {"bucket": {"name": "b"}, "object": {"key": "models/a+b%2Bc.zip", "sequencer": "0A"}},
            }
        ]
    }
    (ev,) = parse(json.dumps(s3))
    assert (ev.bucket, ev.key, ev.removed, ev.sequencer) == ("b", "models/a b+c.zip", False, "0A")
    (via_sns,) = parse(json.dumps({"Type": "Notification", "Message": json.dumps(s3)}))
    assert via_sns == ev
    assert parse(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"})) == []
    bridge = {
        "source": "aws.s3",
        "detail-type": "Object Deleted",
        "time": "t2",
        "detail": {"bucket": {"name": "b"}, "object": {"key": "m+x.zip", "sequencer": "0B"}},
    }
    assert [(e.key, e.removed) for e in parse(json.dumps(bridge))] == [("m+x.zip", True), ("m x.zip", True)]
    for junk in ("nope", "[]", json.dumps({"hello": 1})):
        with pytest.raises(MalformedMessage):
            parse(junk)


def test_sequencers_compare_after_right_padding() -> None:
    a = ObjectEvent("b", "k.zip", False, sequencer="0055AED6DCD90281E5")
    b = ObjectEvent("b", "k.zip", False, sequencer="0055AED6DCD9028")  # shorter: padded with zeros on the right
    assert newer(a, b) and not newer(b, a)
    assert newer(ObjectEvent("b", "k", False, time="2026-01-02"), ObjectEvent("b", "k", False, time="2026-01-01"))


def test_filter_drops_duplicates_stale_and_foreign_events() -> None:
    f = EventFilter("b", "p/")
    new, old = ObjectEvent("b", "p/m.zip", False, "0002"), ObjectEvent("b", "p/m.zip", False, "0001")
    assert f.accept(new) == "m"
    assert f.accept(new) is None and f.accept(old) is None
    assert f.accept(ObjectEvent("other", "p/m.zip", False, "9")) is None
    assert f.accept(ObjectEvent("b", "p/sub/m.zip", False, "9")) is None
    assert f.accept(ObjectEvent("b", "p/m.zip", True, "0003")) == "m"
    assert (f.duplicates, f.stale, f.foreign) == (1, 1, 2)


# --- store ----------------------------------------------------------------------------------------------


def make_store(tmp_path: Path, repo: str = "repo") -> Store:
    store = Store(tmp_path / repo, tmp_path / "store", LocalFileSystem())
    store.open()
    return store


def installed(store: Store, model: str, sha: str) -> Path:
    d = store.staging_dir(model)
    (d / "config.pbtxt").write_text("x")
    final = store.commit(model, sha, d, {"etag": sha[:4]})
    store.flip(model, final)
    store.prune(model)
    return final


def store_names(store: Store, model: str) -> list[str]:
    return sorted(p.name for p in (store.root / model).iterdir())


def test_flip_replaces_the_link_atomically_and_leaves_no_temporary_entry(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    installed(store, "m", a)
    inode = os.lstat(store.repository / "m").st_ino
    installed(store, "m", b)
    assert os.readlink(store.repository / "m") == f"../store/m/{b}"
    assert os.lstat(store.repository / "m").st_ino != inode  # a new link renamed over the old one
    assert [p.name for p in store.repository.iterdir()] == ["m"] and list(store.staging.iterdir()) == []
    assert not list(store.state.glob("link-*"))
    assert store.previous("m") == a
    installed(store, "m", c)  # prune keeps the current directory and the one it replaced
    assert store_names(store, "m") == [b, f"{b}.json", c, f"{c}.json"]
    store.close()


def test_the_store_may_be_another_mount_than_the_repository(tmp_path: Path) -> None:
    """The repository and its temporary links live on one mount (the task's volume), the store on another
    (the instance's disk): only symbolic links cross, and they resolve in every container that mounts both
    at the same paths."""
    store = Store(tmp_path / "task" / "repository", tmp_path / "store", LocalFileSystem())
    store.open()
    installed(store, "m", "a" * 64)
    assert os.readlink(store.repository / "m") == "../../store/m/" + "a" * 64
    assert (store.repository / "m" / "config.pbtxt").read_text() == "x"
    assert store.state == tmp_path / "task" / ".repository.modelsync"
    store.close()


def test_recover_cleans_what_an_interrupted_sync_left(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    a, b = "a" * 64, "b" * 64
    installed(store, "m", a)
    (store.staging / "download-m-1-0").write_bytes(b"partial")
    (store.staging / "extract-m-1-1").mkdir()
    os.symlink("../store/m/" + b, store.state / "link-m-1-2")
    orphan = store.staging_dir("m")
    (orphan / "config.pbtxt").write_text("x")
    store.commit("m", b, orphan, {})  # extracted and committed, never flipped
    fresh = store.staging_dir("n")
    store.commit("n", a, fresh, {})  # a new model whose first flip never happened
    os.symlink("../store/gone/" + a, store.repository / "gone")  # a link whose directory is missing
    (store.repository / "handmade").mkdir()  # not ours: left alone
    store.close()
    store = make_store(tmp_path)  # the daemon's next start
    done = store.recover()
    assert len(done) == 8, done  # 3 staging leftovers, the dangling link, the orphan and n, each with its record
    assert list(store.staging.iterdir()) == [] and not list(store.state.glob("link-*"))
    assert sorted(p.name for p in store.repository.iterdir()) == ["handmade", "m"]
    assert store_names(store, "m") == [a, f"{a}.json"]
    assert not (store.root / "n").exists()
    assert store.recover() == []
    store.close()


def test_one_daemon_per_repository(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(StoreError) as exc:
        make_store(tmp_path)
    assert exc.value.busy and "one daemon per repository" in str(exc.value)
    store.close()
    again = make_store(tmp_path)  # released, and the repository keeps its id in the store
    assert again.id == store.id
    again.close()


def test_repositories_share_a_store_and_never_remove_what_another_links(tmp_path: Path) -> None:
    """Two Triton tasks on one instance: the second links what the first extracted (no second copy), and a
    directory goes only when no repository references it any more."""
    one, two = make_store(tmp_path, "one"), make_store(tmp_path, "two")
    assert one.id != two.id
    a, b = "a" * 64, "b" * 64
    installed(one, "m", a)
    reused = two.reusable("m", a, None)
    assert reused is not None and reused.path == one.current("m").path  # type: ignore[union-attr]
    two.flip("m", reused.path)
    installed(one, "m", b)
    installed(one, "m", "c" * 64)  # one no longer references a; two still links it
    assert (tmp_path / "store" / "m" / a / "config.pbtxt").exists()
    assert (two.repository / "m" / "config.pbtxt").read_text() == "x"
    assert two.reusable("m", "c" * 64, two.current("m")) is not None  # newer than a: linked, not fetched
    two.flip("m", tmp_path / "store" / "m" / ("c" * 64))
    two.prune("m")
    assert a in store_names(one, "m")  # two's previous directory: kept
    installed(one, "m", "d" * 64)
    assert two.reusable("m", "d" * 64, two.current("m")) is not None
    two.flip("m", tmp_path / "store" / "m" / ("d" * 64))
    two.prune("m")  # a is now nobody's: collected
    assert store_names(one, "m") == ["c" * 64, f"{'c' * 64}.json", "d" * 64, f"{'d' * 64}.json"]
    one.close()
    two.close()


def test_an_older_directory_is_extracted_afresh_not_linked(tmp_path: Path) -> None:
    """Triton ignores a model directory that is not newer than the one it serves: a rollback to an archive
    extracted before gets a new directory, <sha>.1, with fresh timestamps."""
    store = make_store(tmp_path)
    a, b = "a" * 64, "b" * 64
    installed(store, "m", a)
    installed(store, "m", b)
    assert store.reusable("m", a, store.current("m")) is None  # a is there, but older than b
    again = installed(store, "m", a)
    assert again.name == f"{a}.1" and store.current("m").sha256 == a  # type: ignore[union-attr]
    assert store_names(store, "m") == sorted([b, f"{b}.json", f"{a}.1", f"{a}.1.json"])
    store.close()


def test_a_repository_gone_silent_is_forgotten_after_its_lease(tmp_path: Path) -> None:
    """A task killed without a clean stop leaves its reference; past the lease, the others remove it, its
    staging folder, and whatever only it referenced."""
    import modelsync.store as store_module

    dead, alive = make_store(tmp_path, "dead"), make_store(tmp_path, "alive")
    installed(dead, "m", "a" * 64)
    (dead.staging / "download-m-9-9").write_bytes(b"partial")
    dead.close()
    ref = tmp_path / "store" / ".refs" / f"{dead.id}.json"
    installed(alive, "n", "b" * 64)
    alive.recover()
    assert ref.exists() and (tmp_path / "store" / "m").exists()  # within its lease: kept
    old = ref.stat().st_mtime - store_module.REF_LEASE - 1
    os.utime(ref, (old, old))
    alive.recover()
    assert not ref.exists() and not (tmp_path / "store" / "m").exists()
    assert not (tmp_path / "store" / ".staging" / dead.id).exists()
    assert (tmp_path / "store" / "n").exists()
    alive.close()


def test_a_claim_makes_the_second_repository_wait_for_the_first_download(tmp_path: Path) -> None:
    import threading

    one, two = make_store(tmp_path, "one"), make_store(tmp_path, "two")
    a = "a" * 64
    order: list[str] = []
    claimed = threading.Event()

    def first() -> None:
        with one.claim(a):
            claimed.set()
            order.append("one extracting")
            d = one.staging_dir("m")
            (d / "config.pbtxt").write_text("x")
            one.flip("m", one.commit("m", a, d, {}))
            order.append("one committed")

    t = threading.Thread(target=first)
    t.start()
    claimed.wait(5)
    with two.claim(a):
        order.append("two claimed")
        found = two.reusable("m", a, None)
    t.join()
    assert order == ["one extracting", "one committed", "two claimed"] and found is not None
    one.close()
    two.close()


def test_a_hand_made_directory_is_never_replaced(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    (store.repository / "m").mkdir()
    (store.repository / "m" / "config.pbtxt").write_text("mine")
    with pytest.raises(Exception, match="not a modelsync link"):
        installed(store, "m", "a" * 64)
    assert (store.repository / "m" / "config.pbtxt").read_text() == "mine"
    store.close()


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "a/b", "a b", 'q"', "mod%C3", "modèle", "x" * 201])
def test_model_names_that_cannot_be_served_verbatim_are_refused(name: str) -> None:
    assert model_name_problem(name)


def test_model_names_triton_takes_are_accepted() -> None:
    for name in ("add", "m@x.v2+b", "ns::ranker", "a-b_c.d"):
        assert model_name_problem(name) is None


# --- metrics --------------------------------------------------------------------------------------------


def test_every_event_the_recorder_writes_is_valid_emf() -> None:
    buf = io.BytesIO()
    rec = Recorder("Triton", StreamSink(buf), "host-1")
    rec.attempt(
        Attempt(
            "m@x",
            "ok",
            phases={"download": 0.1, "verify": 0.01, "extract": 0.2, "swap": 0.001, "load": 1.5},
            bytes_downloaded=123,
            sha256="a" * 64,
            version_id="v1",
            serving="a" * 64,
            upload_to_ready=4.2,
        )
    )
    rec.attempt(Attempt("modèle", "rolled_back", reason="boom\n" * 2000, serving="b" * 64))
    rec.model_state(ModelState("m@x", True, serving="a" * 64, expected="a" * 64))
    rec.host_state(3, 1, 12.5)
    rec.host_state(None, None, None)  # S3 unreachable and never a success: nothing to say
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4
    docs = [json.loads(line) for line in lines]
    for line in lines:
        assert validate(line) == []
    assert docs[1]["model"].startswith("mod_le~") and docs[1]["model_original"] == "modèle"
    assert docs[1]["reason"].endswith("...[truncated]")
    assert docs[0]["ModelArtifact"] == "a" * 64 and docs[0]["SyncFailures"] == 0 and docs[1]["SyncFailures"] == 1


_ALL, _M, _R, _MR = (), ("model",), ("result",), ("model", "result")
# What modelsync has always emitted (name, unit, event, dimension sets): the pack must keep it byte for byte.
EMITTED = [
    ("SyncAttempts", "Count", "attempt", (_ALL, _R, _MR)),
    ("SyncFailures", "Count", "attempt", (_ALL, _M)),
    *(
        (f"Sync{p}Time", "Milliseconds", "attempt", (_ALL, _M))
        for p in ("Download", "Verify", "Extract", "Swap", "Load")
    ),
    ("SyncUploadToReady", "Seconds", "attempt", (_ALL, _M)),
    ("SyncBytesDownloaded", "Bytes", "attempt", (_ALL, _M)),
    ("ModelInSync", "Count", "model", (_ALL, _M)),
    ("ModelsInSync", "Count", "host", (_ALL,)),
    ("ModelsOutOfSync", "Count", "host", (_ALL,)),
    ("SecondsSinceLastSuccess", "Seconds", "host", (_ALL,)),
    # safe rollouts (modelsync/rollout.py)
    ("RolloutsStarted", "Count", "rollout", (_ALL, _M)),
    ("RolloutsPromoted", "Count", "rollout", (_ALL, _M)),
    ("RolloutsRejected", "Count", "rollout", (_ALL, _M)),
    ("RolloutRollbacks", "Count", "rollout", (_ALL, _M)),
    ("RolloutEvidenceWait", "Seconds", "rollout", (_ALL, _M)),
    ("RolloutsInFlight", "Count", "host", (_ALL,)),
    # a task's start (modelsync/startup.py)
    ("TimeToServe", "Seconds", "start", (_ALL,)),
    *(
        (f"Start{p}Time", "Seconds", "start", (_ALL,))
        for p in ("Wait", "List", "Download", "Verify", "Place", "Load", "FirstReady")
    ),
]


def test_the_pack_defines_what_modelsync_emits() -> None:
    assert [(m.name, m.unit, m.event, m.dimension_sets) for m in METRICS] == EMITTED
    assert all(m.help and m.kind == "supplied" and m.scope == "modelsync" for m in METRICS)


def test_result_names_are_the_packs() -> None:
    assert PACK.dimensions["result"].names() == tuple(r.value for r in Result)
    assert all(meaning for _, meaning in PACK.dimensions["result"].values)


def test_a_pack_that_disagrees_with_errors_py_is_refused() -> None:
    result = PACK.dimensions["result"]
    fewer = replace(result, values=result.values[:-1])
    bad = Catalog(PACK.defined, PACK.families, dimensions={"result": fewer})
    with pytest.raises(ValueError, match="rolled_back"):
        check_pack(bad)
    with pytest.raises(ValueError, match="SyncLoadTime"):
        check_pack(Catalog([m for m in PACK.defined if m.name != "SyncLoadTime"], {}, dimensions=PACK.dimensions))


def test_clients_take_the_region_from_aws_region(monkeypatch) -> None:
    """The task definitions set AWS_REGION, which boto3's own chain ignores (it reads AWS_DEFAULT_REGION):
    without this, an S3 client had no region and an SQS endpoint URL without one failed with NoRegionError."""
    from modelsync.s3 import make_client

    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    assert make_client("s3").meta.region_name == "eu-west-3"
    assert make_client("sqs", region_hint="us-east-1").meta.region_name == "eu-west-3"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")  # the standard chain's own variable wins
    assert make_client("s3").meta.region_name == "ap-south-1"
    assert make_client("sns", region="us-west-2").meta.region_name == "us-west-2"  # an explicit one wins over all


def test_urls_follow_the_exporters_rule() -> None:
    """One URL converter for both daemons (the two copies disagreed on trailing slashes): a base URL loses a
    bare trailing '/', a path is kept as written, a port must be valid."""
    from exporter.config import load as load_exporter
    from telemetry.settings import http_url

    converters = {o.field: o.convert for o in OPTIONS}
    assert converters["triton_url"] is http_url
    env = {"MODELSYNC_BUCKET": "models", "TRITON_URL": "http://triton:8000/"}
    queue = "https://sqs.us-east-1.amazonaws.com/123456789012/q/"
    s = load(["--queue-url", queue], env)
    assert s.triton_url == "http://triton:8000" and s.queue_url == queue
    assert load_exporter([], {"TRITON_URL": "http://triton:8000/"}).triton_url == s.triton_url
    with pytest.raises(ConfigError, match="TRITON_URL"):
        load([], env | {"TRITON_URL": "http://triton:99999"})


def test_a_prefix_is_a_folder() -> None:
    """``models`` is read as ``models/`` (a grant on the prefix must not reach ``models-private/``)."""
    from modelsync.settings import load

    assert [load(["--bucket", "b-models", "--prefix", p]).prefix for p in ("", "models", "models/", "a/b")] == [
        "",
        "models/",
        "models/",
        "a/b/",
    ]
