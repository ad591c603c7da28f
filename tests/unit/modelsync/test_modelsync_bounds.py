"""Issue 36: archives and manifests are bounded before they are parsed, and refusals outlive the process.

Zips are judged from their end record (and the zip64 locator and record) before zipfile reads the central
directory; manifests by their size, then by a count of their values, before json.loads builds anything.
Memory is measured with tracemalloc around the call: what the judgement itself allocates.
"""

from __future__ import annotations

import io
import json
import os
import tracemalloc
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from modelsync.archive import END_BYTES, MAX_CENTRAL_ENTRY_BYTES, Limits, inspect, open_zip, read_end
from modelsync.bundle import BundleConflict, peek_names
from modelsync.dirmodel import DirectoryFetcher
from modelsync.errors import HashMismatch, LoadFailed, UnsafeArchive
from modelsync.fsio import LocalFileSystem
from modelsync.manifest import max_manifest_bytes, parse
from modelsync.metrics import Attempt
from modelsync.refusals import MAX_ENTRIES, NAME, Refusal, Refusals
from modelsync.s3 import Archive
from modelsync.store import Store
from tests.support.msync import make_zip, model_files
from tests.unit.modelsync.zipcraft import EOCD, LOCATOR, craft, hostile_manifest, hostile_zip

LIMITS = Limits(max_entries=100, max_bytes=10 * 1024 * 1024, max_ratio=50)
MiB = 1024 * 1024
H = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def peak_bytes(call: Callable[[], object]) -> int:
    """What ``call`` allocated at most (Python objects), whether it returned or raised."""
    tracemalloc.start()
    try:
        call()
    except UnsafeArchive:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def write(tmp_path: Path, data: bytes, name: str = "a.zip") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def refused(path: Path, limits: Limits = LIMITS) -> str:
    with pytest.raises(UnsafeArchive) as exc:
        open_zip(path, limits)
    return str(exc.value)


# --- zips: the end record --------------------------------------------------------------------------------


@pytest.mark.parametrize("zip64", [False, True])
@pytest.mark.parametrize("comment", [b"", b"a comment", b"x" * 65_535])
def test_a_valid_zip_passes_and_reads_as_zipfile_reads_it(tmp_path: Path, zip64: bool, comment: bytes) -> None:
    names = ["m/config.pbtxt", "m/1/model.py"]
    path = write(tmp_path, craft(names, zip64=zip64, comment=comment))
    with open_zip(path, LIMITS) as zf:
        assert zf.namelist() == names
    data = path.read_bytes()
    end = read_end(data[-END_BYTES:], len(data))
    assert (end.entries, end.zip64) == (2, zip64)


def test_zips_written_by_zipfile_pass_and_are_inspected_as_before(tmp_path: Path) -> None:
    path = write(tmp_path, make_zip(model_files("m")))
    with open_zip(path, LIMITS) as zf:
        plan = inspect(zf, path.stat().st_size, "m", LIMITS)
    assert sorted(e.path.as_posix() for e in plan.files) == ["1/model.py", "config.pbtxt"]
    buf = io.BytesIO()  # more than 65,535 entries: zipfile writes a zip64 end record
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(70_000):
            zf.writestr(f"m/1/{i}", b"")
    big = write(tmp_path, buf.getvalue(), "big.zip")
    assert len(open_zip(big, Limits(70_000, MiB, 50)).infolist()) == 70_000
    assert "70000 entries, more than the limit of 100" in refused(big)


def test_a_huge_declared_entry_count_is_refused_from_the_end_record(tmp_path: Path) -> None:
    """A few bytes declaring 600,000 entries (zip64): zipfile alone would not even notice (it parses until the
    directory's bytes are used up); the end record says it all."""
    path = write(tmp_path, craft(["m/config.pbtxt"], declared=600_000, zip64=True))
    assert zipfile.ZipFile(path).namelist() == ["m/config.pbtxt"]
    assert "600000 entries, more than the limit of 100" in refused(path)
    plain = write(tmp_path, craft(["m/config.pbtxt"], declared=65_000, zip64=False), "plain.zip")
    assert "65000 entries, more than the limit of 100" in refused(plain)


def test_a_directory_larger_than_its_entries_can_fill_is_refused(tmp_path: Path) -> None:
    """Two entries declared, 5,000 in the directory: zipfile would parse all 5,000."""
    path = write(tmp_path, craft([f"m/1/{i}" for i in range(5_000)], declared=2))
    message = refused(path)
    assert "a central directory of" in message and f"({MAX_CENTRAL_ENTRY_BYTES} each at most)" in message
    assert "for 2 entries" in message


def test_more_entries_than_declared_within_the_size_bound_are_counted(tmp_path: Path) -> None:
    """A directory within entries x the per-entry bound, holding many more (small) entries than declared: the
    walk of the fixed headers stops at the limit, before zipfile builds one ZipInfo."""
    path = write(tmp_path, craft([f"m/1/{i}" for i in range(5_000)], declared=100))
    message = refused(path)
    assert "more than 100 entries in its central directory (its end record declares 100)" in message


@pytest.mark.parametrize(
    ("cut", "needle"),
    [
        (lambda d: b"", "fewer than an end-of-central-directory record"),
        (lambda d: os.urandom(70_000).replace(b"PK", b"pk"), "no end-of-central-directory record"),
        (lambda d: d[:-1], "cut short"),  # the record's last byte gone
        (lambda d: d[:-10], "cut short"),
        (lambda d: d[: len(d) // 2], "no end-of-central-directory record"),  # a download cut in half
        (lambda d: d[-EOCD.size :], "does not fit before its end record"),  # the record alone: no directory
    ],
)
def test_missing_or_malformed_end_records_are_refused(
    tmp_path: Path, cut: Callable[[bytes], bytes], needle: str
) -> None:
    data = craft([f"m/1/{i}" for i in range(50)])
    message = refused(write(tmp_path, cut(data)))
    assert message.startswith("not a zip archive") and needle in message


def test_a_zip_spanning_several_disks_is_refused(tmp_path: Path) -> None:
    data = bytearray(craft(["m/config.pbtxt"], zip64=True))
    at = len(data) - EOCD.size - LOCATOR.size
    data[at:at + LOCATOR.size] = LOCATOR.pack(b"PK\x06\x07", 0, 0, 3)  # fmt: skip
    assert "spans several disks" in refused(write(tmp_path, bytes(data)))


def test_a_600000_entry_zip_is_refused_in_little_memory(tmp_path: Path) -> None:
    """The issue's archive: 600,000 entries. zipfile.ZipFile would build 600,000 ZipInfo (~466 MB in the
    daemon); the judgement reads the last 64 KiB."""
    path = tmp_path / "bad.zip"
    hostile_zip(path, "bad", 600_000)
    assert peak_bytes(lambda: open_zip(path, Limits(10_000, MiB, 50))) < 1 * MiB
    assert "600000 entries, more than the limit of 10000" in refused(path, Limits(10_000, MiB, 50))


# --- zips peeked at in S3 (bundle.py) ---------------------------------------------------------------------


class RangedS3:
    """Just enough of boto3's S3 client for ranged GETs of one object; counts the bytes served."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.served = 0
        self.client = self
        self.bucket = "b"

    def get_object(self, Bucket: str, Key: str, Range: str, IfMatch: str) -> dict[str, Any]:
        start, end = (int(x) for x in Range.removeprefix("bytes=").split("-"))
        body = self.data[start : end + 1]
        self.served += len(body)
        return {"Body": io.BytesIO(body)}


def listed(data: bytes, key: str = "m.zip") -> Archive:
    return Archive(key.removesuffix(".zip"), key, '"etag"', len(data), datetime.now(UTC))


def test_peeking_at_a_hostile_zip_reads_its_tail_only(tmp_path: Path) -> None:
    good = make_zip({**model_files("a"), **model_files("b")})
    s3 = RangedS3(good)
    assert sorted(peek_names(s3, listed(good), LIMITS) or []) == sorted([*model_files("a"), *model_files("b")])
    path = tmp_path / "bad.zip"
    hostile_zip(path, "bad", 600_000)
    bad = path.read_bytes()
    s3 = RangedS3(bad)
    assert peek_names(s3, listed(bad, "bad.zip"), Limits(10_000, MiB, 50)) is None  # type: ignore[arg-type]
    assert s3.served == END_BYTES  # one ranged GET of the tail
    peak = peak_bytes(lambda: peek_names(s3, listed(bad, "bad.zip"), Limits(10_000, MiB, 50)))  # type: ignore[arg-type]
    assert peak < 2 * MiB  # the tail and a read buffer, not 600,000 ZipInfo


# --- manifests ---------------------------------------------------------------------------------------------


def manifest(count: int) -> bytes:
    files = [{"path": "config.pbtxt", "size": 1, "sha256": H}] + [
        {"path": f"1/f{i}", "size": 1, "sha256": H} for i in range(count - 1)
    ]
    return json.dumps({"files": files}, indent=1).encode()


def test_the_manifest_byte_bound_follows_the_entry_limit() -> None:
    limits = Limits(10, MiB, 50)
    most = max_manifest_bytes(limits)
    assert most == 1024 * 1024 + 10 * 1024
    assert len(parse(manifest(10), limits).files) == 10
    padded = manifest(2)[:-1] + b" " * (most - len(manifest(2))) + b"}"
    assert len(padded) == most and len(parse(padded, limits).files) == 2  # the bound itself passes
    with pytest.raises(UnsafeArchive, match=f"is {most + 1} bytes, more than the {most} allowed for 10 files"):
        parse(padded + b" ", limits)


def test_a_manifest_of_empty_entries_is_counted_before_it_is_parsed(tmp_path: Path) -> None:
    """The issue's 8.4 MB of ``{},``: json.loads built 2.8 million dicts (205 MB in the daemon) before the count."""
    path = tmp_path / "m.json"
    hostile_manifest(path, 2_800_000, empty=True)
    data = path.read_bytes()
    limits = Limits(10_000, MiB, 50)
    assert len(data) < max_manifest_bytes(limits)  # within the byte bound: the count must refuse it
    with pytest.raises(UnsafeArchive, match="lists over 10000 files, more than the limit of 10000"):
        parse(data, limits)
    assert peak_bytes(lambda: parse(data, limits)) < 3 * len(data)  # its text, not its objects


def test_values_outside_the_files_list_are_counted_too() -> None:
    data = b'{"files": [], "padding": [' + b"1000," * 100_000 + b"1]}"
    with pytest.raises(UnsafeArchive, match="holds more than 4186 JSON values"):
        parse(data, Limits(10, MiB, 50))


def test_a_manifest_above_the_bound_is_refused_from_the_listing(tmp_path: Path) -> None:
    """DirectoryFetcher refuses before the first byte is downloaded (the S3 stand-in has no methods at all)."""
    store = Store(tmp_path / "repo", tmp_path / "store", LocalFileSystem())
    store.open()
    limits = Limits(10_000, MiB, 50)
    fetcher = DirectoryFetcher(object(), store, LocalFileSystem(), limits, lambda n, w: None)  # type: ignore[arg-type]
    big = Archive("m", "m/manifest.json", '"e"', 60_000_000, datetime.now(UTC))
    with pytest.raises(UnsafeArchive, match=r"m/manifest\.json is 60000000 bytes, more than the 11288576 allowed"):
        fetcher.fetch("m", big, None, Attempt("m", "ok"), H, "metadata", lambda s: {})  # type: ignore[arg-type]
    assert not any((tmp_path / "store" / ".staging").rglob("*.json"))
    store.close()


# --- refusals on disk --------------------------------------------------------------------------------------


def refusal(key: str, at: float = 1.0, etag: str = '"e1"', limits: list[float] | None = None) -> Refusal:
    return Refusal("b", key, etag, "v1", "unsafe_archive", "too many entries", "", limits or [1.0], at)


def test_refusals_are_read_back_by_a_new_process(tmp_path: Path) -> None:
    import logging

    log = logging.getLogger("test")
    Refusals(tmp_path, log).add(refusal("m.zip"))
    again = Refusals(tmp_path, log)  # a restarted daemon
    assert again.find("b", "m.zip", '"e1"', [1.0]) == refusal("m.zip")
    assert again.find("b", "m.zip", '"e2"', [1.0]) is None  # another object under the key: tried afresh
    assert again.find("b", "m.zip", '"e1"', [2.0]) is None  # judged under other limits: judged again
    assert again.find("other", "m.zip", '"e1"', [1.0]) is None
    again.forget("b", "m.zip")
    assert Refusals(tmp_path, log).find("b", "m.zip", '"e1"', [1.0]) is None
    assert not list(tmp_path.glob(".*.tmp-*"))  # written through a temporary file, renamed


def test_refusals_are_bounded(tmp_path: Path) -> None:
    import logging

    log = logging.getLogger("test")
    refusals = Refusals(tmp_path, log)
    for i in range(MAX_ENTRIES + 20):
        refusals.add(Refusal("b", f"m{i}.zip", '"e"', "", "unsafe_archive", "x" * 5000, "", [1.0], float(i)))
    doc = json.loads((tmp_path / NAME).read_text())
    assert len(doc["refusals"]) == MAX_ENTRIES
    assert doc["refusals"][0]["key"] == "m20.zip"  # the oldest went first
    assert all(len(r["reason"]) == 1000 for r in doc["refusals"])
    (tmp_path / NAME).write_text("x" * (2 * MiB))  # not what this module writes: ignored, not parsed
    assert Refusals(tmp_path, log).find("b", "m300.zip", '"e"', [1.0]) is None
    (tmp_path / NAME).write_text('{"refusals": [{"bucket": 1}]}')
    assert Refusals(tmp_path, log).find("b", "m.zip", '"e"', [1.0]) is None


def test_only_verdicts_on_the_bytes_are_remembered() -> None:
    assert UnsafeArchive.remembered
    assert not BundleConflict.remembered and not LoadFailed.remembered
    assert not HashMismatch.remembered  # a restart downloads it again (test_modelsync_sync.py says so)
