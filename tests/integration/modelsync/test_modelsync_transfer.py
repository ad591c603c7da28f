"""modelsync/transfer.py against moto's S3 server, with the fault proxy of tests/support/msync.py in front of it.

Real boto3 clients, real HTTP, real files; the proxy's log is what the
assertions count (which ranges were asked for, how many bytes came). Part
sizes are small (64 KiB) so a 1 MiB object is 16 parts. Whole-sync checks
(the old version keeps serving, a crashed daemon resumes) are in
tests/integration/modelsync/test_modelsync_sync.py, which has a Triton.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelsync.errors import DiskFull, DownloadError
from modelsync.fsio import CHUNK, LocalFileSystem
from modelsync.s3 import S3, Archive
from modelsync.store import Store
from modelsync.transfer import (
    PARTIAL,
    STALE_AFTER,
    Source,
    Transfer,
    TransferConfig,
    journal_of,
    partial_path,
    resumable,
)
from tests.support.msync import (
    FaultFileSystem,
    Moto,
    TruncatingProxy,
    moto,  # noqa: F401 - fixture
    new_bucket,
    sha,
    unique,
    upload,
)

PART = 64 * 1024
SIZE = 16 * PART - 1000  # 16 parts, the last one short
CONFIG = TransferConfig(part_size=PART, connections=4, tries=3, backoff=0.01)


@pytest.fixture
def proxy(moto: Moto) -> Iterator[TruncatingProxy]:  # noqa: F811 - the fixture above
    with TruncatingProxy(moto.url) as p:
        yield p


def put(moto: Moto, bucket: str, data: bytes, key: str = "") -> tuple[S3, Archive]:  # noqa: F811
    key = key or f"{unique('big')}.zip"
    upload(moto, bucket, key, data)
    s3 = S3(moto.client("s3"), bucket, "", CONFIG)
    listed = s3.find(key.removesuffix(".zip"))
    assert listed is not None
    return s3, s3.head(listed)


def through(proxy: TruncatingProxy, moto: Moto, s3: S3) -> S3:  # noqa: F811
    return S3(moto.client("s3", proxy.url), s3.bucket, s3.prefix, s3.transfer)


def ranges(proxy: TruncatingProxy, key: str) -> list[str]:
    return sorted(r for _, _, r, status, _ in proxy.gets(key) if status == 206)


def want_ranges(parts: range, size: int = SIZE) -> list[str]:
    return sorted(f"bytes={n * PART}-{min(size, (n + 1) * PART) - 1}" for n in parts)


def transfer(s3: S3, archive: Archive, dest: Path, **kw: Any) -> Transfer:
    source = Source(s3.bucket, archive.key, archive.version_id, archive.etag, archive.size)
    return Transfer(s3.client, source, dest, kw.pop("fs", LocalFileSystem()), kw.pop("config", CONFIG), **kw)


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no cleanup of the partial runs."""


def crash_after(limit: int) -> Any:
    seen = [0]

    def on_bytes(n: int) -> None:
        seen[0] += n
        if seen[0] > limit:
            raise Crash

    return on_bytes


def test_a_large_object_comes_in_parts_each_range_once_and_hashed(
    moto: Moto,  # noqa: F811
    proxy: TruncatingProxy,
    tmp_path: Path,
) -> None:
    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    job = transfer(through(proxy, moto, s3), archive, tmp_path / "out")
    assert job.run() == (sha(data), SIZE)
    assert (tmp_path / "out").read_bytes() == data
    assert ranges(proxy, archive.key) == want_ranges(range(16))  # every part once, nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial, no journal
    assert job.peak_buffered <= CONFIG.connections * CHUNK


def test_a_small_object_is_one_plain_get(moto: Moto, proxy: TruncatingProxy, tmp_path: Path) -> None:  # noqa: F811
    data = os.urandom(PART)
    s3, archive = put(moto, new_bucket(moto), data)
    assert through(proxy, moto, s3).download(archive, tmp_path / "out", LocalFileSystem()) == (sha(data), PART)
    assert [(r, status) for _, _, r, status, _ in proxy.gets(archive.key)] == [("", 200)]


def test_memory_is_bounded_by_connections_not_by_part_or_object_size(moto: Moto, tmp_path: Path) -> None:  # noqa: F811
    """Parts of 4 chunks, 2 connections: never more than one chunk per connection in hand."""
    data = os.urandom(6 * CHUNK + 123)
    s3, archive = put(moto, new_bucket(moto), data)
    config = TransferConfig(part_size=4 * CHUNK, connections=2)
    job = transfer(s3, archive, tmp_path / "out", config=config)
    assert job.run() == (sha(data), len(data))
    assert 0 < job.peak_buffered <= 2 * CHUNK < config.part_size


def test_the_whole_hash_is_over_the_bytes_written(moto: Moto, proxy: TruncatingProxy, tmp_path: Path) -> None:  # noqa: F811
    """A byte flipped on the wire: the download succeeds but its hash is not the object's, so the sync's
    verify refuses it (tests/integration/modelsync/test_modelsync_sync.py checks the old version keeps serving)."""
    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    proxy.corrupt.add(archive.key)
    digest, count = through(proxy, moto, s3).download(archive, tmp_path / "out", LocalFileSystem())
    assert count == SIZE and digest != sha(data)
    assert digest == sha((tmp_path / "out").read_bytes())


def test_parts_cut_short_fail_cleanly_after_bounded_tries(
    moto: Moto,  # noqa: F811
    proxy: TruncatingProxy,
    tmp_path: Path,
) -> None:
    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    proxy.cut.add(archive.key)
    with pytest.raises(DownloadError, match=r"after 3 tries"):
        through(proxy, moto, s3).download(archive, tmp_path / "out", LocalFileSystem())
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no partial kept
    # each GET that fails is tried 3 times by us (botocore does not retry a body cut short); the other parts
    # stop at once: far fewer than 16 parts x 3
    assert 3 <= len(proxy.gets(archive.key)) <= CONFIG.connections * CONFIG.tries


def test_a_5xx_is_retried_and_then_succeeds(moto: Moto, proxy: TruncatingProxy, tmp_path: Path) -> None:  # noqa: F811
    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    proxy.fail = 5
    assert through(proxy, moto, s3).download(archive, tmp_path / "out", LocalFileSystem()) == (sha(data), SIZE)
    assert [e[3] for e in proxy.gets(archive.key)].count(503) == 5
    assert ranges(proxy, archive.key) == want_ranges(range(16))


def test_a_5xx_that_lasts_fails_after_a_bounded_number_of_requests(
    moto: Moto,  # noqa: F811
    proxy: TruncatingProxy,
    tmp_path: Path,
) -> None:
    data = os.urandom(PART)
    s3, archive = put(moto, new_bucket(moto), data)
    proxy.fail = 1000
    via = through(proxy, moto, s3)
    with pytest.raises(DownloadError, match="after 3 tries"):
        via.download(archive, tmp_path / "out", LocalFileSystem())
    assert list(tmp_path.iterdir()) == []
    per_call = via.client.meta.config.retries["total_max_attempts"]  # botocore's own retries of a 5xx
    assert len(proxy.gets(archive.key)) == per_call * CONFIG.tries


def test_an_object_replaced_during_the_transfer_fails_without_retry(moto: Moto, tmp_path: Path) -> None:  # noqa: F811
    """Unversioned bucket: each part is pinned by IfMatch on the listed ETag; a new upload answers 412."""
    bucket = new_bucket(moto, versioned=False)
    s3, archive = put(moto, bucket, os.urandom(SIZE))
    upload(moto, bucket, archive.key, os.urandom(SIZE))
    with pytest.raises(DownloadError, match=r"PreconditionFailed.*replaced or deleted"):
        s3.download(archive, tmp_path / "out", LocalFileSystem())
    assert list(tmp_path.iterdir()) == []


def test_a_versioned_object_replaced_during_the_transfer_still_yields_the_listed_version(
    moto: Moto,  # noqa: F811
    tmp_path: Path,
) -> None:
    bucket = new_bucket(moto)
    data = os.urandom(SIZE)
    s3, archive = put(moto, bucket, data)
    upload(moto, bucket, archive.key, os.urandom(SIZE))
    assert s3.download(archive, tmp_path / "out", LocalFileSystem()) == (sha(data), SIZE)


def test_disk_full_during_the_parts_fails_with_disk_full_and_leaves_nothing(moto: Moto, tmp_path: Path) -> None:  # noqa: F811
    s3, archive = put(moto, new_bucket(moto), os.urandom(SIZE))
    with pytest.raises(DiskFull, match="No space left on device"):
        s3.download(archive, tmp_path / "out", FaultFileSystem(write_budget=5 * PART))
    assert list(tmp_path.iterdir()) == []


# --- resume ------------------------------------------------------------------------------------


def interrupted(s3: S3, archive: Archive, dest: Path, parts: int) -> list[int]:
    """Run a transfer on one connection that dies while part ``parts`` streams; the parts in the journal."""
    config = TransferConfig(part_size=PART, connections=1)
    job = transfer(s3, archive, dest, config=config, on_bytes=crash_after(parts * PART + 10))
    with pytest.raises(Crash):
        job.run()
    source = Source(s3.bucket, archive.key, archive.version_id, archive.etag, archive.size)
    lines = journal_of(partial_path(dest.parent, source)).read_text().splitlines()
    return [json.loads(line)["part"] for line in lines[1:]]


def test_a_crash_then_a_resume_fetches_only_the_missing_parts(
    moto: Moto,  # noqa: F811
    proxy: TruncatingProxy,
    tmp_path: Path,
) -> None:
    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    via = through(proxy, moto, s3)
    assert interrupted(via, archive, tmp_path / "out", 5) == [0, 1, 2, 3, 4]
    assert not (tmp_path / "out").exists()
    assert all(resumable(p) for p in tmp_path.iterdir())  # what the store's recovery keeps
    proxy.log.clear()
    job = transfer(via, archive, tmp_path / "out")
    assert job.run() == (sha(data), SIZE)
    assert (job.resumed_parts, job.resumed_bytes) == (5, 5 * PART)
    assert ranges(proxy, archive.key) == want_ranges(range(5, 16))
    assert sum(e[4] for e in proxy.gets(archive.key)) == SIZE - 5 * PART
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_journaled_part_that_does_not_match_the_disk_is_fetched_again(
    moto: Moto,  # noqa: F811
    proxy: TruncatingProxy,
    tmp_path: Path,
) -> None:
    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    via = through(proxy, moto, s3)
    interrupted(via, archive, tmp_path / "out", 4)
    (partial,) = [p for p in tmp_path.iterdir() if not p.name.endswith(".journal")]
    with partial.open("r+b") as f:  # part 2 damaged on disk (a lost write, a bad block)
        f.seek(2 * PART + 7)
        f.write(b"\0" * 3)
    proxy.log.clear()
    job = transfer(via, archive, tmp_path / "out")
    assert job.run() == (sha(data), SIZE)
    assert ranges(proxy, archive.key) == want_ranges(range(2, 16))  # parts 0 and 1 still hash as journaled
    assert job.resumed_parts == 2


def test_an_object_replaced_between_crash_and_resume_starts_over(
    moto: Moto,  # noqa: F811
    proxy: TruncatingProxy,
    tmp_path: Path,
) -> None:
    bucket = new_bucket(moto)
    s3, archive = put(moto, bucket, os.urandom(SIZE))
    via = through(proxy, moto, s3)
    interrupted(via, archive, tmp_path / "out", 6)
    old = {p.name for p in tmp_path.iterdir()}
    new = os.urandom(SIZE + 5)
    upload(moto, bucket, archive.key, new)
    replaced = s3.head(s3.find(archive.model) or archive)
    assert replaced.version_id != archive.version_id
    proxy.log.clear()
    job = transfer(via, replaced, tmp_path / "out")
    assert job.run() == (sha(new), SIZE + 5)
    assert job.resumed_parts == 0
    assert ranges(proxy, archive.key) == want_ranges(range(16), SIZE + 5)
    assert not old & {p.name for p in tmp_path.iterdir()}  # the old version's partial and journal are gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_journal_of_another_part_size_starts_over(moto: Moto, proxy: TruncatingProxy, tmp_path: Path) -> None:  # noqa: F811
    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    via = through(proxy, moto, s3)
    interrupted(via, archive, tmp_path / "out", 6)
    proxy.log.clear()
    job = transfer(via, archive, tmp_path / "out", config=TransferConfig(part_size=2 * PART, connections=4))
    assert job.run() == (sha(data), SIZE)
    assert job.resumed_parts == 0 and len(ranges(proxy, archive.key)) == 8


def test_store_recovery_keeps_a_resumable_download_and_drops_stale_or_unjournaled_ones(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    store = Store(repo, tmp_path / "store", LocalFileSystem())
    store.open()
    try:
        header = '{"bucket": "b", "etag": "\\"e\\"", "key": "k", "part_size": 65536, "size": 9, "version_id": "v"}\n'
        fresh = store.staging / f"{PARTIAL}aaaa-1111"
        stale = store.staging / f"{PARTIAL}bbbb-2222"
        orphan = store.staging / f"{PARTIAL}cccc-3333"  # data without a journal: cannot be trusted
        for p in (fresh, stale, orphan):
            p.write_bytes(b"x" * 9)
        for p in (fresh, stale):
            journal_of(p).write_text(header)
        old = time.time() - STALE_AFTER - 60
        os.utime(journal_of(stale), (old, old))
        (store.staging / "download-m-1-0").write_bytes(b"half")
        removed = store.recover()
        assert sorted(p.name for p in store.staging.iterdir()) == sorted([fresh.name, journal_of(fresh).name])
        assert len(removed) == 4
    finally:
        store.close()


# --- the tuner, the window, the budget ----------------------------------------------------------------------


class Counting:
    """A real boto3 client, with the GETs in flight counted (the most at once) and, optionally, each slowed."""

    def __init__(self, client: Any, delay: float = 0.0) -> None:
        import threading

        self.client, self.delay = client, delay
        self.lock = threading.Lock()
        self.now = self.most = self.total = 0

    def get_object(self, **kw: Any) -> Any:
        with self.lock:
            self.now += 1
            self.total += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(self.delay)
            return self.client.get_object(**kw)
        finally:
            with self.lock:
                self.now -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_transfers_sharing_a_budget_never_exceed_it(moto: Moto, tmp_path: Path) -> None:  # noqa: F811
    import threading

    from modelsync.transfer import Budget

    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    client = Counting(s3.client, delay=0.05)
    config = TransferConfig(part_size=PART, connections=4, start_connections=4, budget=Budget(3))
    shared = S3(client, s3.bucket, "", config)
    got: list[tuple[str, int]] = []
    for i in range(3):  # one folder each: a partial download's name is its object version's
        (tmp_path / str(i)).mkdir()

    def one(i: int) -> None:
        got.append(shared.download(archive, tmp_path / str(i) / "out", LocalFileSystem()))

    jobs = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    assert got == [(sha(data), SIZE)] * 3
    assert 1 <= client.most <= 3  # 3 transfers x 4 connections wanted, 3 allowed (12 at once without it)


def test_parts_never_run_more_than_the_window_ahead_of_the_hash(
    moto: Moto,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hash (and the zip placed from it) reads each part back while it is in the page cache: with the hash
    held on part 0, the workers stop at the window (8 parts of 16), never the whole object."""
    import modelsync.transfer as tr

    data = os.urandom(SIZE)
    s3, archive = put(moto, new_bucket(moto), data)
    client = Counting(s3.client)
    source = Source(s3.bucket, archive.key, archive.version_id, archive.etag, archive.size)
    job = Transfer(client, source, tmp_path / "out", LocalFileSystem(),
                   TransferConfig(part_size=PART, connections=4, start_connections=4))  # fmt: skip
    real, gets_while_held = tr._read_range, []

    def held(fd: int, start: int, end: int, digest: Any, consumer: Any) -> None:
        if start == 0:  # the hash stays on part 0 until the window is full, and a while longer
            deadline = time.monotonic() + 30
            while client.total < 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            gets_while_held.append(client.total)
        real(fd, start, end, digest, consumer)

    monkeypatch.setattr(tr, "_read_range", held)
    assert job.run() == (sha(data), SIZE)
    assert job.window == 8 and gets_while_held == [8]
