"""modelsync/unzip.py: a zip's directory read from the object's end, its entries placed from the bytes in order.

The reference is zipfile: every archive here is written by zipfile (stored, deflated, data descriptors from a
stream, a comment, bytes prepended), fed to StreamingExtract in chunks of random sizes, and what lands on the
disk must be what ``zipfile.extractall`` writes. Hostile bytes (a flipped bit, a lying size, a renamed local
header, a cut archive) are refused with UnsafeArchive, naming the entry.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelsync.archive import Limits, inspect
from modelsync.errors import UnsafeArchive
from modelsync.fsio import LocalFileSystem
from modelsync.unzip import MAX_DIRECTORY_BYTES, StreamingExtract, read_directory, streamable

LIMITS = Limits(max_entries=10_000, max_bytes=1 << 30, max_ratio=2000.0)
MODEL = "m"


def build(files: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED, stream: bool = False, prefix: bytes = b"",
          comment: bytes = b"") -> bytes:  # fmt: skip
    buf = io.BytesIO()
    buf.write(prefix)
    raw: io.RawIOBase | io.BytesIO = buf
    if stream:  # an unseekable output: zipfile writes data descriptors (flag bit 3) and sizes after the data
        raw = _Unseekable(buf)
    with zipfile.ZipFile(raw, "w", compression=method) as z:
        for name, data in files.items():
            if stream:
                with z.open(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), "w") as f:
                    f.write(data)
            else:
                z.writestr(name, data)
        z.comment = comment
    return buf.getvalue()


class _Unseekable(io.RawIOBase):
    def __init__(self, buf: io.BytesIO) -> None:
        self.buf = buf

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        return self.buf.write(b)

    def flush(self) -> None:
        pass


def sample(seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {
        f"{MODEL}/config.pbtxt": b'name: "m"\nbackend: "python"\n' * 3,
        f"{MODEL}/1/model.py": b"# model\n" * 200,
        f"{MODEL}/1/weights.bin": rng.randbytes(300_000),  # incompressible, like weights
        f"{MODEL}/1/empty": b"",
        f"{MODEL}/1/tokens.txt": b"token\n" * 50_000,  # compresses 1000x: above RATIO_MIN, under the limit
    }


def directory(data: bytes) -> zipfile.ZipFile:
    zd = read_directory(lambda a, b: data[a:b], len(data), LIMITS)
    assert zd is not None
    return zd.zf


def place(data: bytes, dest: Path, chunks: list[int] | None = None, digests: dict[str, str] | None = None) -> int:
    plan = inspect(directory(data), len(data), MODEL, LIMITS)
    dest.mkdir()
    placer = StreamingExtract(plan, dest, LocalFileSystem(), digests)
    offset, sizes = 0, iter(chunks or [])
    while offset < len(data):
        n = next(sizes, 1 << 20)
        placer.feed(offset, data[offset : offset + n])
        offset += n
    placer.finish()
    return placer.reads


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def reference(data: bytes, dest: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        z.extractall(dest)
    return tree(dest / MODEL)


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
@pytest.mark.parametrize("stream", [False, True], ids=["sizes-in-header", "data-descriptors"])
def test_the_entries_placed_from_the_stream_are_what_zipfile_extracts(
    tmp_path: Path, method: int, stream: bool
) -> None:
    data = build(sample(), method, stream, prefix=b"#!/bin/sh\nexit 0\n", comment=b"built by ci")
    digests: dict[str, str] = {}
    place(data, tmp_path / "ours", [7, 1, 4096, 30, 65536, 3], digests)
    want = reference(data, tmp_path / "ref")
    assert tree(tmp_path / "ours") == want
    assert digests == {k: hashlib.sha256(v).hexdigest() for k, v in want.items()}


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=70_000), min_size=1, max_size=40), seed=st.integers(0, 5))
def test_any_chunking_places_the_same_bytes(
    tmp_path_factory: pytest.TempPathFactory, cuts: list[int], seed: int
) -> None:
    data = build(sample(seed), zipfile.ZIP_DEFLATED, stream=bool(seed % 2))
    root = tmp_path_factory.mktemp("chunks")
    place(data, root / "ours", cuts * (len(data) // sum(cuts) + 1))
    assert tree(root / "ours") == reference(data, root / "ref")


def test_each_byte_is_fed_once(tmp_path: Path) -> None:
    data = build(sample())
    assert place(data, tmp_path / "x", [1 << 16] * (len(data) // (1 << 16) + 1)) == -(-len(data) // (1 << 16))


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def _data_offset(data: bytes, name: str) -> int:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.getinfo(name)
    n, m = (
        int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little"),
        int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little"),
    )
    return info.header_offset + 30 + n + m


@pytest.mark.parametrize(
    ("method", "why"), [(zipfile.ZIP_STORED, "bad CRC-32"), (zipfile.ZIP_DEFLATED, "m/1/weights.bin")]
)
def test_a_flipped_byte_in_an_entry_is_refused_naming_it(tmp_path: Path, method: int, why: str) -> None:
    data = build(sample(), method)
    bad = _flip(data, _data_offset(data, f"{MODEL}/1/weights.bin") + 1000)
    with pytest.raises(UnsafeArchive, match=r"weights\.bin") as exc:
        place(bad, tmp_path / "x")
    assert why in str(exc.value)


def test_a_local_header_naming_another_file_is_refused(tmp_path: Path) -> None:
    data = build(sample(), zipfile.ZIP_STORED)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        at = z.getinfo(f"{MODEL}/1/model.py").header_offset + 30
    bad = data[:at] + b"n" + data[at + 1 :]  # "m/1/model.py" -> "n/1/model.py" in the local header only
    with pytest.raises(UnsafeArchive, match="local header names"):
        place(bad, tmp_path / "x")


def test_an_entry_that_inflates_past_its_declared_size_is_refused(tmp_path: Path) -> None:
    data = bytearray(build(sample(), zipfile.ZIP_DEFLATED))
    name = f"{MODEL}/1/tokens.txt".encode()
    at = bytes(data).index(b"PK\x01\x02")  # the first central directory header
    while bytes(data[at + 46 : at + 46 + len(name)]) != name:
        at = bytes(data).index(b"PK\x01\x02", at + 4)
    declared = int.from_bytes(data[at + 24 : at + 28], "little")
    data[at + 24 : at + 28] = (declared // 2).to_bytes(4, "little")  # its uncompressed size, halved
    with pytest.raises(UnsafeArchive, match=r"tokens\.txt.*inflates past"):
        place(bytes(data), tmp_path / "x")


def test_an_archive_cut_short_is_refused_at_finish(tmp_path: Path) -> None:
    data = build(sample())
    plan = inspect(directory(data), len(data), MODEL, LIMITS)
    (tmp_path / "x").mkdir()
    placer = StreamingExtract(plan, tmp_path / "x", LocalFileSystem())
    placer.feed(0, data[: len(data) // 2])
    with pytest.raises(UnsafeArchive, match="ended before entry"):
        placer.finish()


def test_reset_starts_over_with_nothing_left(tmp_path: Path) -> None:
    data = build(sample())
    plan = inspect(directory(data), len(data), MODEL, LIMITS)
    (tmp_path / "x").mkdir()
    placer = StreamingExtract(plan, tmp_path / "x", LocalFileSystem())
    placer.feed(0, data[: len(data) - 100])
    placer.reset()
    assert not [p for p in (tmp_path / "x").rglob("*") if p.is_file()]
    placer.feed(0, data)
    placer.finish()
    assert tree(tmp_path / "x") == reference(data, tmp_path / "ref")


def test_the_directory_is_read_from_the_end_in_at_most_two_ranges() -> None:
    files = {f"{MODEL}/config.pbtxt": b"x", **{f"{MODEL}/1/f{i:05d}-{'y' * 100}": b"" for i in range(1500)}}
    data = build(files, zipfile.ZIP_STORED)  # a directory of ~220 KB: beyond the first 64 KiB read
    asked: list[tuple[int, int]] = []

    def read(a: int, b: int) -> bytes:
        asked.append((a, b))
        return data[a:b]

    zd = read_directory(read, len(data), LIMITS)
    assert zd is not None and len(zd.zf.namelist()) == len(files)
    assert len(asked) == 2 and asked[-1][1] == len(data)
    assert sum(b - a for a, b in asked) < 2 * (len(data) - zd.zf.start_dir) + 70_000  # never the body


def test_a_directory_over_the_bound_is_left_to_the_downloaded_file() -> None:
    n = MAX_DIRECTORY_BYTES // 300 + 10
    names = [f"{MODEL}/1/{i:07d}-{'z' * 250}" for i in range(n)]
    from tests.unit.modelsync.zipcraft import craft

    data = craft([f"{MODEL}/config.pbtxt", *names])
    assert read_directory(lambda a, b: data[a:b], len(data), Limits(n + 10, 1 << 30, 2000.0)) is None


def test_not_a_zip_is_refused_from_its_end() -> None:
    junk = os.urandom(100_000)
    with pytest.raises(UnsafeArchive, match="not a zip archive"):
        read_directory(lambda a, b: junk[a:b], len(junk), LIMITS)


def test_bzip2_entries_do_not_stream() -> None:
    data = build(sample(), zipfile.ZIP_BZIP2)
    assert not streamable(inspect(directory(data), len(data), MODEL, LIMITS))
    assert streamable(inspect(directory(build(sample())), len(data), MODEL, LIMITS))


def test_a_directory_read_that_differs_from_the_body_is_a_download_error_not_a_refusal(tmp_path: Path) -> None:
    """The directory is a GET of its own, outside the whole object's sha256: a byte of it flipped on the wire
    (here the CRC of the last entry) must not become a remembered refusal. The body's bytes at the same
    offsets differ from the ones the plan came from: finish() says so, transiently, before anything else."""
    from modelsync.errors import DownloadError

    data = build(sample())
    at = _entry_header(data, b"PK\x01\x02", 46, f"{MODEL}/1/tokens.txt".encode())
    flipped = _flip(data, at + 16)  # the central entry's CRC-32, in the directory read only
    zd = read_directory(lambda a, b: flipped[a:b], len(flipped), LIMITS)
    assert zd is not None
    plan = inspect(zd.zf, len(data), MODEL, LIMITS)
    (tmp_path / "x").mkdir()
    placer = StreamingExtract(plan, tmp_path / "x", LocalFileSystem(), directory=zd)
    placer.feed(0, data)  # the body, as S3 holds it
    with pytest.raises(DownloadError, match="differs from the same bytes in the body"):
        placer.finish()


def _entry_header(data: bytes | bytearray, sig: bytes, name_at: int, name: bytes) -> int:
    at = bytes(data).index(sig)
    while bytes(data[at + name_at : at + name_at + len(name)]) != name:
        at = bytes(data).index(sig, at + 4)
    return at


def test_an_empty_deflated_entry_without_a_stream_is_taken_as_zipfile_takes_it(tmp_path: Path) -> None:
    """Some tools write an empty file as 'deflated' with no deflate stream at all (0 compressed bytes)."""
    data = bytearray(build(sample(), zipfile.ZIP_STORED))
    name = f"{MODEL}/1/empty".encode()
    for sig, name_at, method_at in ((b"PK\x03\x04", 30, 8), (b"PK\x01\x02", 46, 10)):
        at = _entry_header(data, sig, name_at, name)
        data[at + method_at : at + method_at + 2] = zipfile.ZIP_DEFLATED.to_bytes(2, "little")
    want = reference(bytes(data), tmp_path / "ref")  # zipfile takes it
    assert want["1/empty"] == b""
    place(bytes(data), tmp_path / "ours")
    assert tree(tmp_path / "ours") == want
