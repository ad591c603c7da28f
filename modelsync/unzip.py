"""A zip model placed while it downloads: its directory judged first, its entries written as their bytes pass.

The old way was three passes over an archive's bytes: download (and read
back for the hash), then ``zipfile`` reading the file again to extract it.
Here the central directory comes first, from the end of the object (one
ranged GET of the last :data:`~modelsync.archive.END_BYTES`, and one more
when the directory does not fit in them): the same checks as before
(archive.py: end record, directory walk, ``inspect``) run on it before a
byte of the body is fetched. That read is a GET of its own, which the
whole object's SHA-256 does not cover: a refusal from it is not final (the
archive is then downloaded whole and judged from the verified bytes, as
before), and the body's bytes at those offsets must equal the ones the plan
was read from (else a transient DownloadError): a byte flipped on the wire
never becomes a remembered refusal.
Then the parallel download (transfer.py) hands every byte, in order, to
:class:`StreamingExtract` from the same read that feeds the SHA-256: each
entry's local header is checked against the directory, its data inflated
(or, stored, written as is) into its staging path with its CRC and size
checked, and the bytes between entries skipped. No byte is read twice.

Nothing is visible before the whole object's SHA-256 matched, and a bad
entry is reported only after it (a byte flipped on the wire is a hash
mismatch, retried, not an unsafe archive, remembered): the entries
land in a fresh staging directory, each fsync'd by a thread of its own as
soon as it is complete (the disk writes back while the download goes on;
:meth:`StreamingExtract.finish` waits for the last), committed only after the hash check
(zipmodel.py); a mismatch or any failure removes the staging directory.

Only stored and deflated entries stream (every zip tool's default, and what
model archives are); an archive with another method (bzip2, lzma) or a
directory larger than :data:`MAX_DIRECTORY_BYTES` is downloaded whole and
extracted by archive.extract as before.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import struct
import threading
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from .archive import END_BYTES, Entry, Limits, Plan, judge_end, read_end, walk_directory
from .errors import DownloadError, UnsafeArchive
from .fsio import FileSystem, fsync_dir, raise_disk_full

MAX_DIRECTORY_BYTES = 16 * 1024 * 1024  # a central directory larger than this is read from the downloaded file
STREAMABLE = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
_LOCAL = struct.Struct("<4s2B4HL2L2H")  # a local file header's fixed part (30 bytes)
_LOCAL_SIG = b"PK\x03\x04"

ReadRange = Callable[[int, int], bytes]  # (start, end) -> the object's bytes start..end-1


class _Sparse(io.RawIOBase):
    """The object's last bytes at their offsets, as a seekable file for zipfile: reading anywhere else is an
    error (zipfile reads only the end record and the directory when it opens an archive)."""

    def __init__(self, size: int, base: int, data: bytes) -> None:
        self.size, self.base, self.data, self.pos = size, base, data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        if self.pos >= self.size:
            return 0
        if self.pos < self.base:
            raise zipfile.BadZipFile(f"reading byte {self.pos}, before the directory fetched from {self.base}")
        chunk = self.data[self.pos - self.base : self.pos - self.base + len(b)]
        b[: len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


@dataclass
class Directory:
    """An archive's central directory read from the object's end: zipfile's view of it, and the bytes it was
    read from (``data`` at offset ``start``), which StreamingExtract compares with the body's own: that read
    is a GET of its own, which the whole object's sha256 does not cover."""

    zf: zipfile.ZipFile
    start: int
    data: bytes


def read_directory(read: ReadRange, size: int, limits: Limits) -> Directory | None:
    """The archive's central directory, opened by zipfile from the object's end (bounded first, as
    archive.open_zip does on a file); None when it is larger than :data:`MAX_DIRECTORY_BYTES` (read from the
    downloaded file then). UnsafeArchive for what is not a zip or breaks the limits."""
    tail_start = max(0, size - END_BYTES)
    tail = read(tail_start, size)
    end = read_end(tail, size)
    judge_end(end, limits)
    if end.start < tail_start:
        if size - end.start > MAX_DIRECTORY_BYTES:
            return None
        tail_start = end.start
        tail = read(tail_start, size)
    try:
        walk_directory(io.BufferedReader(_Sparse(size, tail_start, tail)), end, limits)
        return Directory(zipfile.ZipFile(io.BufferedReader(_Sparse(size, tail_start, tail))), tail_start, tail)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnsafeArchive(f"not a zip archive: {exc}") from exc


def streamable(plan: Plan) -> bool:
    return all(e.info.compress_type in STREAMABLE for e in plan.files)


class _Open:
    """The entry being written."""

    def __init__(self, entry: Entry, out: BinaryIO, data_start: int, hasher: Any) -> None:
        self.entry = entry
        self.out = out
        self.data_start = data_start
        self.data_end = data_start + entry.info.compress_size
        self.inflate = zlib.decompressobj(-15) if entry.info.compress_type == zipfile.ZIP_DEFLATED else None
        self.crc = 0
        self.written = 0
        self.hasher = hasher


class StreamingExtract:
    """The planned entries of a zip written under ``dest`` from the archive's bytes fed in order (the
    transfer's Consumer). ``dest`` exists and is empty; :meth:`finish` checks every entry was written and
    fsyncs them. With ``digests``, each file's sha256 is computed from the bytes written (for a signature)."""

    def __init__(
        self,
        plan: Plan,
        dest: Path,
        fs: FileSystem,
        digests: dict[str, str] | None = None,
        directory: Directory | None = None,
    ) -> None:
        self.plan = plan
        self.directory = directory  # the bytes the plan was read from: the body's must be the same
        self.directory_differs = False
        self.dest = dest
        self.fs = fs
        self.digests = digests
        self.entries = sorted(plan.files, key=lambda e: e.info.header_offset)
        self.bytes_written = 0
        self.reads = 0  # feed calls: each archive byte arrives once (the tests count them)
        self.refused: UnsafeArchive | None = None
        self._start()

    def _start(self) -> None:
        self._syncer: threading.Thread | None = None
        self._to_sync: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._sync_error: OSError | None = None
        self.pos = 0
        self.index = 0
        self.header = bytearray()
        self.current: _Open | None = None
        self.written_paths: list[Path] = []
        for d in self.plan.dirs:
            (self.dest / d).mkdir(mode=0o755, exist_ok=True)

    def reset(self) -> None:
        """Start over (a single GET tried again): what was written is removed."""
        self._close()
        self._stop_syncing()
        for p in self.written_paths:
            p.unlink(missing_ok=True)
        if self.current is not None:
            (self.dest / self.current.entry.path).unlink(missing_ok=True)
        self.bytes_written = 0
        self.refused = None
        if self.digests is not None:
            self.digests.clear()
        self._start()

    def feed(self, offset: int, data: bytes) -> None:
        """Place what these bytes complete. Bad bytes are not judged here: a byte flipped on the wire looks
        like a corrupt entry, and it is the transfer's fault, not the archive's. The first refusal is kept,
        the rest of the bytes ignored, and :meth:`finish` raises it, after the caller compared the whole
        object's sha256 (a mismatch is then what is reported). A full disk stops at once."""
        if offset != self.pos:
            raise UnsafeArchive(f"internal: bytes at {offset} fed after {self.pos}")  # a bug, never data
        self.reads += 1
        d = self.directory
        if d is not None and offset + len(data) > d.start and not self.directory_differs:
            lo = max(offset, d.start)
            if data[lo - offset :] != d.data[lo - d.start : lo - d.start + offset + len(data) - lo]:
                self.directory_differs = True
        if self.refused is not None:
            self.pos += len(data)
            return
        view = memoryview(data)
        try:
            while view:
                view = self._step(view)
        except OSError as exc:
            raise_disk_full(exc, f"extracting into {self.dest}")
            raise
        except zlib.error as exc:
            name = self.current.entry.info.filename if self.current else "?"
            self._refuse(UnsafeArchive(f"entry {name!r}: corrupt deflate data: {exc}"), offset + len(data))
        except UnsafeArchive as exc:
            self._refuse(exc, offset + len(data))

    def _refuse(self, exc: UnsafeArchive, pos: int) -> None:
        self.refused = exc
        self.pos = pos
        self._close()

    def _step(self, view: memoryview) -> memoryview:
        """Consume some of ``view`` (at ``self.pos``); returns the rest."""
        if self.current is not None:
            return self._data(view)
        if self.index >= len(self.entries):  # the directory and whatever follows the last entry
            self.pos += len(view)
            return view[len(view) :]
        info = self.entries[self.index].info
        if self.pos < info.header_offset:  # between entries (a data descriptor, a directory entry's header...)
            skip = min(len(view), info.header_offset - self.pos)
            self.pos += skip
            return view[skip:]
        if self.pos > info.header_offset + len(self.header):
            raise UnsafeArchive(f"entry {info.filename!r} overlaps the entry before it (zip bomb?)")
        return self._local_header(view, info)

    def _local_header(self, view: memoryview, info: zipfile.ZipInfo) -> memoryview:
        need = _LOCAL.size
        if len(self.header) >= _LOCAL.size:
            fields = _LOCAL.unpack_from(self.header)
            need += fields[10] + fields[11]
        take = min(len(view), need - len(self.header))
        self.header += view[:take]
        self.pos += take
        if len(self.header) < _LOCAL.size:
            return view[take:]
        fields = _LOCAL.unpack_from(self.header)
        if fields[0] != _LOCAL_SIG:
            raise UnsafeArchive(f"entry {info.filename!r}: bad local header signature at {info.header_offset}")
        full = _LOCAL.size + fields[10] + fields[11]
        if len(self.header) < full:
            return view[take:]
        name = bytes(self.header[_LOCAL.size : _LOCAL.size + fields[10]])
        if name != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
            raise UnsafeArchive(f"entry {info.filename!r}: its local header names {name[:200]!r}")
        entry = self.entries[self.index]
        data_start = info.header_offset + full
        nxt = self.entries[self.index + 1].info.header_offset if self.index + 1 < len(self.entries) else None
        if nxt is not None and data_start + info.compress_size > nxt:
            raise UnsafeArchive(f"entry {info.filename!r} overlaps the next entry: overlapping entries (zip bomb)")
        target = self.dest / entry.path
        try:
            out = self.fs.create(target)
        except OSError as exc:
            raise_disk_full(exc, f"creating {target}")
            raise
        self.current = _Open(entry, out, data_start, hashlib.sha256() if self.digests is not None else None)
        self.header = bytearray()
        rest = view[take:]
        if info.compress_size == 0:
            self._end_entry()
        return rest

    def _data(self, view: memoryview) -> memoryview:
        cur = self.current
        assert cur is not None
        take = min(len(view), cur.data_end - self.pos)
        piece = view[:take]
        info = cur.entry.info
        if cur.inflate is None:
            self._write(cur, piece)
        else:
            left = info.file_size - cur.written
            out = cur.inflate.decompress(piece, left + 1)
            if len(out) > left or cur.inflate.unconsumed_tail:
                raise UnsafeArchive(f"entry {info.filename!r}: inflates past its declared {info.file_size} bytes")
            self._write(cur, out)
        self.pos += take
        if self.pos == cur.data_end:
            self._end_entry()
        return view[take:]

    def _write(self, cur: _Open, data: bytes | memoryview) -> None:
        if not data:
            return
        cur.out.write(data)
        cur.crc = zlib.crc32(data, cur.crc)
        cur.written += len(data)
        self.bytes_written += len(data)
        if cur.hasher is not None:
            cur.hasher.update(data)

    def _end_entry(self) -> None:
        cur = self.current
        assert cur is not None
        info = cur.entry.info
        if cur.inflate is not None:
            tail = cur.inflate.flush()
            if tail:
                if len(tail) > info.file_size - cur.written:
                    raise UnsafeArchive(f"entry {info.filename!r}: inflates past its declared {info.file_size} bytes")
                self._write(cur, tail)
            if not cur.inflate.eof and not (info.compress_size == 0 and info.file_size == 0):  # zipfile takes those
                raise UnsafeArchive(f"entry {info.filename!r}: its deflate stream is cut short")
        if cur.written != info.file_size:
            raise UnsafeArchive(
                f"entry {info.filename!r}: {cur.written} bytes, its directory declares {info.file_size}"
            )
        if cur.crc != info.CRC:
            raise UnsafeArchive(f"entry {info.filename!r}: bad CRC-32 (corrupt archive)")
        cur.out.close()
        path = self.dest / cur.entry.path
        os.chmod(path, 0o644)
        self.written_paths.append(path)
        self._sync_later(path)
        if self.digests is not None and cur.hasher is not None:
            self.digests[cur.entry.path.as_posix()] = cur.hasher.hexdigest()
        self.current = None
        self.index += 1

    def _sync_later(self, path: Path) -> None:
        """fsync a complete entry on a thread of its own while the download goes on: the disk writes back the
        first entries while the last ones arrive, and :meth:`finish` waits only for what is left."""
        if self._syncer is None:
            self._syncer = threading.Thread(target=self._sync_loop, name="unzip-fsync", daemon=True)
            self._syncer.start()
        self._to_sync.put(path)

    def _sync_loop(self) -> None:
        while (path := self._to_sync.get()) is not None:
            if self._sync_error is not None:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                self._sync_error = exc

    def _stop_syncing(self) -> None:
        if self._syncer is not None:
            self._to_sync.put(None)
            self._syncer.join()
            self._syncer = None

    def _close(self) -> None:
        if self.current is not None:
            self.current.out.close()

    def abort(self) -> None:
        self._close()
        self._stop_syncing()

    def finish(self) -> int:
        """Every entry written, then all of them and their directories fsync'd in one batch; the bytes written.
        Raises the refusal kept by :meth:`feed`, if any; first DownloadError (transient) when the directory
        the plan came from is not the body's (a read went wrong on the wire: judged again next time)."""
        if self.directory_differs:
            self._close()
            self._stop_syncing()
            raise DownloadError(
                "the zip's directory read from the object's end differs from the same bytes in the body "
                "(a read went wrong on the way); retried at the next reconcile"
            )
        if self.refused is not None:
            raise self.refused
        if self.current is not None or self.index < len(self.entries):
            missing = self.entries[self.index].info.filename if self.index < len(self.entries) else "?"
            self._close()
            raise UnsafeArchive(f"the archive ended before entry {missing!r} was complete")
        if self.bytes_written != self.plan.total_bytes:
            raise UnsafeArchive(f"extracted {self.bytes_written} bytes, the archive declared {self.plan.total_bytes}")
        self._stop_syncing()
        try:
            if self._sync_error is not None:
                raise self._sync_error
            for d in [*reversed(self.plan.dirs), PurePosixPath(".")]:
                fsync_dir(self.dest / d)
        except OSError as exc:
            raise_disk_full(exc, f"syncing {self.dest}")
            raise
        return self.bytes_written
