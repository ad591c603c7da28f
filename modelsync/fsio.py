"""The file-system operations a sync performs, behind one small interface.

Everything that writes (staging files, extracted entries, the temporary link,
the flip) goes through :class:`FileSystem`, so the tests can run the real
code on a real size-limited filesystem and also inject a fault at one exact
operation (ENOSPC on the n-th write, a crash right before the flip). The
default :class:`LocalFileSystem` is the only implementation shipped.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

from .errors import DiskFull

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
CHUNK = 1024 * 1024  # bytes per read and write of a download or an extracted entry


class FileSystem(Protocol):
    def create(self, path: Path) -> BinaryIO:
        """A new file opened for binary writing; fails if it exists."""
        ...

    def free_bytes(self, path: Path) -> int:
        """Bytes an unprivileged process may still write on the filesystem holding ``path``."""
        ...

    def block_size(self, path: Path) -> int: ...

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        """pwrite(2): the parallel download writes each part at its own offset; returns the bytes written."""
        ...

    def symlink(self, target: str, link: Path) -> None: ...

    def replace(self, src: Path, dst: Path) -> None:
        """rename(2): atomic on one filesystem, also over an existing symbolic link."""
        ...


class LocalFileSystem:
    def create(self, path: Path) -> BinaryIO:
        return open(path, "xb")

    def free_bytes(self, path: Path) -> int:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def block_size(self, path: Path) -> int:
        return os.statvfs(path).f_frsize or 4096

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def symlink(self, target: str, link: Path) -> None:
        os.symlink(target, link)

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable (POSIX needs the directory fsync'd too)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(
    fs: FileSystem, path: Path, chunks: Iterable[bytes], on_chunk: Callable[[bytes], None] | None = None
) -> int:
    """Create ``path``, write ``chunks`` to it and fsync it; returns the bytes written. The one copy loop of
    downloads and extraction: nothing is visible under a final name before it is on the disk."""
    written = 0
    with fs.create(path) as out:
        for chunk in chunks:
            out.write(chunk)
            written += len(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
        out.flush()
        os.fsync(out.fileno())
    return written


def write_json(fs: FileSystem, path: Path, data: object) -> None:
    """Write a small JSON file atomically: temporary file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        with fs.create(tmp) as f:
            f.write(json.dumps(data, indent=1, sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())
        fs.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise_disk_full(exc, f"cannot write {path}")
        raise
    fsync_dir(path.parent)


def raise_disk_full(exc: OSError, what: str) -> None:
    """Turn ENOSPC/EDQUOT into :class:`DiskFull`; return (so the caller re-raises) for any other error."""
    if exc.errno in NO_SPACE:
        raise DiskFull(f"{what}: {os.strerror(exc.errno)}") from exc
