"""One pinned S3 object version into one file, by parallel ranged GETs: hashed, resumable, memory-bounded.

Our own pool of ranged GETs, not boto3's transfer manager (s3transfer 0.19)
nor the CRT client (awscrt 0.38). Measured with bench/bench_transfer.py
(Debian's nginx with ``limit_rate 40m`` per connection standing in for S3's
per-connection cap; this 2-core machine shared with other jobs; median of 3;
peak RSS of a child process doing only that download)::

    archive  client                              MB/s  vs boto3  peak RSS
    64 MiB   boto3 download_file (10 threads)     387    1.00      83 MB
    64 MiB   boto3 download_file, then fsync      334    0.86      81 MB
    64 MiB   CRT S3Client                         133    0.34      98 MB
    64 MiB   ours: 16 conn., hashed, fsync'd      390    1.01      90 MB
    1 GiB    boto3 download_file (10 threads)     373    1.00     119 MB
    1 GiB    boto3 download_file, then fsync      336    0.90     117 MB
    1 GiB    CRT S3Client                         495    1.33     435 MB
    1 GiB    ours: 16 conn., hashed, fsync'd      397    1.07      98 MB

(Three runs of this code: ours/boto3 0.80-1.06 for 64 MiB, 0.95-1.07 for
1 GiB; ours with 8 connections: 277 MB/s for 1 GiB, capped by 8 x 40 MB/s.)
Speed does not decide it: ours matches boto3 while hashing and syncing,
and the CRT is faster only on large objects at 4-7x the memory, growing
with the object. What decides is what a sync needs and neither gives:

- a SHA-256 of the whole object over the bytes written, computed while the
  download runs (ours reads each part back from the page cache as soon as
  the parts before it are in): s3transfer writes parts from its own I/O
  thread and reports progress, not offsets; the CRT validates S3's own
  checksums, which for a multipart upload are not the uploader's SHA-256.
  With either, the hash would be one more pass after the download;
- a resume after a crash: s3transfer writes to a temporary name it deletes,
  the CRT keeps no state; both start over;
- our typed failures (a full disk as DiskFull through modelsync's
  FileSystem, nothing left behind) and bounded memory: the CRT's buffer
  pool grows to hundreds of MB, and it is a native wheel in the image.

s3transfer does pin its ranged GETs (``IfMatch`` on the ETag, or a
``VersionId`` argument); ours pins every part the same way. A botocore
client is thread-safe, so a pool of threads sharing the daemon's client
costs little code and keeps every request in its retry and credential
chain.

How a transfer goes:

- An object of at most ``part_size`` is one plain GET, written straight to
  the destination and hashed while it streams.
- A larger one is written to ``partial-<key id>-<object id>`` beside the
  destination by ``connections`` threads, each GET asking for one part
  (``Range``, pinned by ``VersionId`` or ``IfMatch``) and writing it at its
  offset (``pwrite``) in :data:`~modelsync.fsio.CHUNK` pieces. Memory is
  bounded by ``connections`` chunks whatever the sizes. Parts are smaller
  than ``part_size`` (whole MiB) when that keeps every connection busy.
- Meanwhile the calling thread hashes the object in order, reading each
  part back once it and the ones before it are complete: one SHA-256 pass,
  over the bytes written. After each part it appends the hash of the
  object so far to a journal (``<partial>.journal``, fsync'd at most every
  :data:`JOURNAL_SYNC` seconds). When every part is in, the partial is
  fsync'd and renamed to the destination.
- After a crash the next download of the same object version hashes the
  journaled prefix again from the disk (which both checks it and restarts
  the whole-object hash), keeps it up to the last part that matches, and
  fetches only the rest. Parts that were complete beyond that prefix are
  fetched again: at most about ``connections`` parts, the price of hashing
  each byte once. A journal of another version of the key (the object was
  replaced), of another part size, or one that does not parse, starts over;
  :func:`resumable` tells the store's recovery which leftovers to keep.
- A part whose GET fails in a transient way (a 5xx, a reset, a body cut
  short) is fetched again, at most ``tries`` times; anything else (the
  object replaced: 412, 404; a full disk) stops every part at once, and the
  attempt fails with nothing left behind. Only a crash (the process killed,
  or a BaseException such as a stop) leaves the partial for a resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .errors import DownloadError, SyncError
from .fsio import CHUNK, FileSystem, fsync_dir, raise_disk_full

PARTIAL = "partial-"
JOURNAL = ".journal"
JOURNAL_SYNC = 0.5  # seconds: the journal is fsync'd at most this often (a power cut costs a re-download)
STALE_AFTER = 24 * 3600.0  # seconds: an untouched partial download older than this is not resumed
MiB = 1024 * 1024
START_CONNECTIONS = 16  # the tuner's first step in the daemon (then what the daemon's transfers learned)


@dataclass(frozen=True)
class TransferConfig:
    part_size: int = 8 * MiB
    connections: int = 16  # the most parallel GETs of one transfer (the tuner starts lower, see Tuner)
    tries: int = 3  # GETs of one part before the attempt fails (botocore's own retries come on top)
    backoff: float = 0.2  # seconds before the second try of a part, doubled each time
    start_connections: int = 4  # the tuner's first step; connections == start_connections: a fixed pool
    tune_every: float = 0.25  # seconds between the tuner's decisions
    budget: Budget | None = field(default=None, compare=False)  # GETs in flight across every transfer at once


class Budget:
    """The daemon's connections, shared by every transfer running at once (a directory model's files, models
    that overlap): a GET holds one while it runs, so concurrent transfers never open more than ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.learned = 0  # the best step a finished transfer found: the next ones start there
        self._sem = threading.BoundedSemaphore(size)

    def __enter__(self) -> None:
        self._sem.acquire()

    def __exit__(self, *exc: object) -> None:
        self._sem.release()


class Consumer(Protocol):
    """What sees an object's bytes once, in order, as the hash does (archive.StreamingExtract places a zip's
    entries from them): ``feed`` at consecutive offsets from 0, ``reset`` when a single GET starts over."""

    def feed(self, offset: int, data: bytes) -> None: ...

    def reset(self) -> None: ...


class Tuner:
    """How many GETs a transfer keeps in flight: more while the throughput grows, fewer when it stops.

    Starts at ``start``; every ``every`` seconds compares the bytes received with the last step's: a rise of at
    least :data:`GROWTH` doubles the target (up to ``most``); none, and the target goes back to the step that
    gave the best rate and stays there. A link capped per connection (S3's, about 80-100 MB/s each) keeps
    rising to ``most``; a link full at 8 connections stops at 8, where more would only split the same bytes.
    Decisions are logged on the transfer (``steps``) for the bench and the tests."""

    GROWTH = 1.10

    def __init__(self, start: int, most: int, every: float) -> None:
        self.most = max(1, most)
        self.target = max(1, min(start, self.most))
        self.every = every
        self.best_rate = 0.0
        self.best_target = self.target
        self.holding = self.target >= self.most
        self.steps: list[tuple[int, float]] = []  # (target, rate bytes/s measured with it)
        self._mark_t = 0.0
        self._mark_bytes = 0

    def start(self, now: float, received: int) -> None:
        self._mark_t, self._mark_bytes = now, received

    def observe(self, now: float, received: int) -> int:
        """The target after the bytes ``received`` so far at ``now`` (monotonic seconds)."""
        dt = now - self._mark_t
        if self.holding or dt < self.every:
            return self.target
        rate = (received - self._mark_bytes) / dt
        self._mark_t, self._mark_bytes = now, received
        self.steps.append((self.target, rate))
        if rate >= self.best_rate * self.GROWTH:
            self.best_rate, self.best_target = rate, self.target
            if self.target < self.most:
                self.target = min(self.most, self.target * 2)
            else:
                self.holding = True
        else:
            self.target, self.holding = self.best_target, True
        return self.target


@dataclass(frozen=True)
class Source:
    """The object version to fetch, as listed and HEAD-ed."""

    bucket: str
    key: str
    version_id: str
    etag: str
    size: int

    @property
    def pin(self) -> dict[str, str]:
        return {"VersionId": self.version_id} if self.version_id else {"IfMatch": self.etag}

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def header(self, part_size: int) -> dict[str, object]:
        return {
            "bucket": self.bucket,
            "key": self.key,
            "version_id": self.version_id,
            "etag": self.etag,
            "size": self.size,
            "part_size": part_size,
        }


def part_step(size: int, config: TransferConfig) -> int:
    """The part size of one object: ``part_size``, or smaller (whole MiB) so that an object of a few parts
    still keeps every connection busy; an object of at most ``part_size`` is one GET."""
    if size <= config.part_size:
        return max(1, size)
    spread = -(-size // config.connections)
    return min(config.part_size, max(MiB, -(-spread // MiB) * MiB))


def _short(*parts: object) -> str:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()[:16]


def partial_path(dest_dir: Path, source: Source) -> Path:
    """Where a multi-part download of ``source`` is kept until complete: one name per object version."""
    key_id = _short(source.bucket, source.key)
    return dest_dir / f"{PARTIAL}{key_id}-{_short(source.version_id, source.etag, source.size)}"


def journal_of(partial: Path) -> Path:
    return partial.with_name(partial.name + JOURNAL)


def resumable(entry: Path, now: float | None = None) -> bool:
    """Whether a staging leftover is (part of) a partial download worth resuming: a journal with a header,
    touched within :data:`STALE_AFTER`, beside its data file. The store's recovery keeps those."""
    if not entry.name.startswith(PARTIAL):
        return False
    partial = entry.with_name(entry.name.removesuffix(JOURNAL))
    journal = journal_of(partial)
    try:
        age = (time.time() if now is None else now) - journal.stat().st_mtime
        with journal.open("rb") as f:
            header = json.loads(f.readline())
        return age < STALE_AFTER and partial.is_file() and isinstance(header, dict) and "size" in header
    except (OSError, ValueError):
        return False


def _error(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return f"{code}: {exc}" if code else f"{type(exc).__name__}: {exc}"


def _transient(exc: Exception) -> bool:
    """A failure worth another GET of the part: 5xx, throttling, connection or body read errors."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError: an HTTP answer
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        code = str(response.get("Error", {}).get("Code") or "")
        return status >= 500 or status == 429 or code in ("SlowDown", "RequestTimeout", "Throttling")
    return not isinstance(exc, SyncError)  # connection reset, read timeout, body cut short, ...


class _Fatal(Exception):
    """Stops the transfer: not worth another GET."""


@dataclass
class _Progress:
    """What the workers and the hasher share, under one condition."""

    parts: int
    done: set[int] = field(default_factory=set)
    next_part: int = 0
    failure: BaseException | None = None
    buffered: int = 0  # bytes read from the network and not yet written
    peak_buffered: int = 0
    requests: int = 0
    received: int = 0  # bytes written by the workers (the tuner's measure)
    hashed: int = 0  # parts hashed in order (workers stay within WINDOW parts of it)
    active: int = 0  # workers running
    target: int = 0  # workers wanted (the tuner's)


class Transfer:
    """One download; :meth:`run` returns (sha256 hex, bytes) or raises a SyncError with nothing left."""

    def __init__(
        self,
        client: Any,
        source: Source,
        dest: Path,
        fs: FileSystem,
        config: TransferConfig | None = None,
        on_bytes: Callable[[int], None] | None = None,
        consumer: Consumer | None = None,
    ) -> None:
        self.client = client
        self.source = source
        self.dest = dest
        self.fs = fs
        self.config = config or TransferConfig()
        self.on_bytes = on_bytes
        self.consumer = consumer
        learned = self.config.budget.learned if self.config.budget is not None else 0
        self.tuner = Tuner(max(self.config.start_connections, learned), self.config.connections,
                           self.config.tune_every)  # fmt: skip
        # How far ahead of the in-order hash the parts may run: the hash (and the consumer) read each part
        # back while it is still in the page cache, never from the disk.
        self.window = max(8, 2 * self.config.connections)
        self.step = part_step(source.size, self.config)
        self.parts = max(1, -(-source.size // self.step))
        self.resumed_parts = 0
        self.resumed_bytes = 0
        self.peak_buffered = 0
        self.requests = 0
        self._lock = threading.Condition()
        self._stop = threading.Event()

    def _range(self, n: int) -> tuple[int, int]:
        start = n * self.step
        return start, min(self.source.size, start + self.step)

    # --- one GET ----------------------------------------------------------------------------

    def _get(self, fd: int, n: int | None, digest: Any, progress: _Progress) -> int:
        """GET part ``n`` (None: the whole object) and write it at its offset, feeding ``digest`` if one is
        given; returns the bytes written."""
        src = self.source
        start, end = (0, src.size) if n is None else self._range(n)
        kwargs: dict[str, Any] = dict(src.pin)
        if n is not None:
            kwargs["Range"] = f"bytes={start}-{end - 1}"
        with self._lock:
            progress.requests += 1
        try:
            resp = self.client.get_object(Bucket=src.bucket, Key=src.key, **kwargs)
        except Exception as exc:
            if _transient(exc):
                raise
            raise _Fatal(f"GET {src.where}: {_error(exc)} (replaced or deleted since the listing?)") from exc
        length = int(resp["ContentLength"])
        if n is not None and resp.get("ContentRange") != f"bytes {start}-{end - 1}/{src.size}":
            raise _Fatal(
                f"GET {src.where} part {n}: Content-Range {resp.get('ContentRange')!r}, asked for bytes "
                f"{start}-{end - 1}/{src.size} (the object changed?)"
            )
        if length != end - start:
            raise _Fatal(f"GET {src.where}: {length} bytes announced, {end - start} expected (listed size {src.size})")
        offset = start
        body = resp["Body"]
        try:
            for chunk in body.iter_chunks(CHUNK):
                if self._stop.is_set():
                    raise _Fatal("stopped")
                if offset + len(chunk) > end:
                    raise _Fatal(f"GET {src.where}: more bytes than asked for")
                with self._lock:
                    progress.buffered += len(chunk)
                    progress.peak_buffered = max(progress.peak_buffered, progress.buffered)
                try:
                    self._write(fd, chunk, offset)
                    if digest is not None:
                        digest.update(chunk)
                        if self.consumer is not None:
                            self.consumer.feed(offset, chunk)
                finally:
                    with self._lock:
                        progress.buffered -= len(chunk)
                        progress.received += len(chunk)
                offset += len(chunk)
                if self.on_bytes is not None:
                    self.on_bytes(len(chunk))
        finally:
            body.close()
        if offset != end:  # botocore checks Content-Length; a body cut short is transient anyway
            raise ConnectionError(f"truncated body, {offset - start} of {end - start} bytes")
        return offset - start

    def _write(self, fd: int, chunk: bytes, offset: int) -> None:
        view = memoryview(chunk)
        while view:
            try:
                written = self.fs.pwrite(fd, view, offset)
            except OSError as exc:
                raise_disk_full(exc, f"writing {self.dest}")
                raise _Fatal(f"writing {self.dest}: {exc}") from exc
            view = view[written:]
            offset += written

    # --- the whole transfer -------------------------------------------------------------------

    def run(self) -> tuple[str, int]:
        if self.parts == 1:
            return self._single()
        partial = partial_path(self.dest.parent, self.source)
        journal = journal_of(partial)
        try:
            return self._multi(partial, journal)
        except SyncError:
            _remove(partial, journal)
            raise
        except _Fatal as exc:
            _remove(partial, journal)
            raise DownloadError(str(exc)) from exc
        except OSError as exc:
            _remove(partial, journal)
            raise_disk_full(exc, f"writing {partial}")
            raise DownloadError(f"GET {self.source.where} into {partial}: {exc}") from exc
        except Exception as exc:
            _remove(partial, journal)
            raise DownloadError(f"GET {self.source.where}: {_error(exc)}") from exc

    def _single(self) -> tuple[str, int]:
        """One GET, hashed while it streams, straight into ``dest``."""
        digest = [hashlib.sha256()]
        progress = _Progress(1)

        def reset() -> None:
            digest[0] = hashlib.sha256()
            if self.consumer is not None:
                self.consumer.reset()

        try:
            fd = os.open(self.dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                count = self._with_tries(
                    lambda: self._budgeted(lambda: self._get(fd, None, digest[0], progress)), reset
                )
                if self.consumer is None:  # with a consumer the file is scratch, deleted once placed
                    os.fsync(fd)
            finally:
                os.close(fd)
        except SyncError:
            self.dest.unlink(missing_ok=True)
            raise
        except _Fatal as exc:
            self.dest.unlink(missing_ok=True)
            raise DownloadError(str(exc)) from exc
        except OSError as exc:
            self.dest.unlink(missing_ok=True)
            raise_disk_full(exc, f"writing {self.dest}")
            raise DownloadError(f"GET {self.source.where}: {exc}") from exc
        except Exception as exc:
            self.dest.unlink(missing_ok=True)
            raise DownloadError(f"GET {self.source.where}: {_error(exc)}") from exc
        finally:
            self.requests, self.peak_buffered = progress.requests, progress.peak_buffered
        return digest[0].hexdigest(), count

    def _with_tries(self, once: Callable[[], int], reset: Callable[[], None]) -> int:
        """``once()``, again after a transient failure (``reset()`` first), at most ``tries`` times."""
        tries = self.config.tries
        for attempt in range(1, tries + 1):
            try:
                return once()
            except (_Fatal, SyncError):
                raise
            except Exception as exc:
                if not _transient(exc) or attempt == tries or self._stop.is_set():
                    raise DownloadError(f"GET {self.source.where}: {_error(exc)} (after {attempt} tries)") from exc
                reset()
                self._stop.wait(self.config.backoff * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    def _budgeted(self, once: Callable[[], int]) -> int:
        if self.config.budget is None:
            return once()
        with self.config.budget:
            return once()

    def _multi(self, partial: Path, journal: Path) -> tuple[str, int]:
        self._forget_other_versions(partial)
        kept, digest, lines = self._verified_prefix(partial, journal)
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        jfd = -1
        workers: list[threading.Thread] = []
        try:
            jfd, joff = self._open_journal(journal, lines)
            if self.consumer is not None and kept:  # a resume: the kept prefix was checked; place it too
                _read_range(fd, 0, self._range(kept - 1)[1], None, self.consumer)
            progress = _Progress(self.parts, done=set(range(kept)), hashed=kept)
            self.resumed_parts = kept
            self.resumed_bytes = self._range(kept - 1)[1] if kept else 0
            self.tuner.start(time.monotonic(), 0)
            progress.target = self.tuner.target
            self._staff(fd, progress, workers)
            try:
                self._hash_in_order(fd, jfd, joff, progress, kept, digest, workers)
            except BaseException:
                self._stop.set()
                with self._lock:
                    self._lock.notify_all()
                raise
            finally:
                for w in workers:
                    w.join()
                self.requests, self.peak_buffered = progress.requests, progress.peak_buffered
            if progress.failure is not None:
                raise progress.failure
            if self.consumer is None:  # with a consumer the file is scratch, deleted once placed: never synced
                os.fsync(fd)
        finally:
            os.close(fd)
            if jfd >= 0:
                os.close(jfd)
        self.fs.replace(partial, self.dest)
        journal.unlink(missing_ok=True)
        if self.consumer is None:
            fsync_dir(self.dest.parent)
        if self.config.budget is not None:
            self.config.budget.learned = max(self.tuner.best_target, self.config.budget.learned)
        return digest.hexdigest(), self.source.size

    def _staff(self, fd: int, progress: _Progress, workers: list[threading.Thread]) -> None:
        """Start workers until ``target`` run (never more than parts are left); caller need not hold the lock."""
        with self._lock:
            left = self.parts - len(progress.done)
            while progress.active < min(progress.target, left) and progress.failure is None:
                progress.active += 1
                w = threading.Thread(target=self._worker, args=(fd, progress), daemon=True)
                workers.append(w)
                w.start()

    def _worker(self, fd: int, progress: _Progress) -> None:
        """Take the next part nobody has, GET it into the file; until none is left, one failed, the tuner wants
        fewer workers, or the part would run more than ``window`` parts ahead of the hash (then wait)."""
        while True:
            with self._lock:
                while True:
                    while progress.next_part < self.parts and progress.next_part in progress.done:
                        progress.next_part += 1
                    if (progress.failure is not None or self._stop.is_set() or progress.next_part >= self.parts
                            or progress.active > progress.target):  # fmt: skip
                        progress.active -= 1
                        self._lock.notify_all()
                        return
                    if progress.next_part < progress.hashed + self.window:
                        break
                    self._lock.wait()
                n = progress.next_part
                progress.next_part += 1

            def once(n: int = n) -> int:
                return self._budgeted(lambda: self._get(fd, n, None, progress))

            try:
                self._with_tries(once, lambda: None)
                with self._lock:
                    progress.done.add(n)
                    self._lock.notify_all()
            except BaseException as exc:
                with self._lock:
                    if progress.failure is None:
                        progress.failure = exc
                    progress.active -= 1
                    self._stop.set()
                    self._lock.notify_all()
                return

    def _write_journal(self, jfd: int, line: bytes, joff: list[int], sync: bool = True) -> None:
        self._write(jfd, line, joff[0])
        joff[0] += len(line)
        if sync:
            os.fsync(jfd)

    def _hash_in_order(
        self, fd: int, jfd: int, joff: int, progress: _Progress, first: int, digest: Any,
        workers: list[threading.Thread],
    ) -> None:  # fmt: skip
        """Feed ``digest`` (and the consumer) the parts from ``first`` on, in order, each read back from the file
        once complete, and journal the hash of the prefix after each (fsync'd at most every :data:`JOURNAL_SYNC`
        seconds); meanwhile the tuner sets how many workers run. After a failure that is not an Exception (a
        stop), the complete prefix is still journaled."""
        end = [joff]
        synced = time.monotonic()
        for n in range(first, self.parts):
            with self._lock:
                while n not in progress.done and progress.failure is None:
                    self._lock.wait(self.config.tune_every)
                    self._tune(progress)
                    self._staff(fd, progress, workers)
                if isinstance(progress.failure, Exception) or n not in progress.done:
                    break  # a failure (nothing is kept), or a stop once the complete prefix is journaled
            self._staff(fd, progress, workers)
            start, stop = self._range(n)
            _read_range(fd, start, stop, digest, self.consumer)
            with self._lock:
                progress.hashed = n + 1
                self._tune(progress)
                self._lock.notify_all()
            if n + 1 < self.parts:
                line = json.dumps({"part": n, "prefix_sha256": digest.copy().hexdigest()}).encode() + b"\n"
                now = time.monotonic()
                self._write_journal(jfd, line, end, sync=now - synced >= JOURNAL_SYNC or progress.failure is not None)
                synced = now if now - synced >= JOURNAL_SYNC else synced

    def _tune(self, progress: _Progress) -> None:
        """The tuner's target from the bytes received so far (the caller holds the lock; workers are started
        by :meth:`_staff`, and leave by themselves when there are more than the target)."""
        target = self.tuner.observe(time.monotonic(), progress.received)
        if target != progress.target:
            progress.target = target
            self._lock.notify_all()

    # --- resume -----------------------------------------------------------------------------

    def _forget_other_versions(self, partial: Path) -> None:
        """Partial downloads of this key for another object version (the object was replaced: start over),
        and any partial download untouched for :data:`STALE_AFTER` (its object is gone or changed)."""
        key_prefix = partial.name.rsplit("-", 1)[0] + "-"
        mine = (partial.name, journal_of(partial).name)
        now = time.time()
        for other in partial.parent.glob(f"{PARTIAL}*"):
            if other.name in mine:
                continue
            with contextlib.suppress(OSError):
                if other.name.startswith(key_prefix) or now - other.stat().st_mtime > STALE_AFTER:
                    other.unlink()

    def _verified_prefix(self, partial: Path, journal: Path) -> tuple[int, Any, list[str]]:
        """How many parts from the first one are on disk as the journal says (each journal line is the hash of
        the object up to the end of a part; the bytes are hashed again, which the whole hash needs anyway),
        the whole-object digest fed with them, and the journal lines that vouch for them. A journal of another
        object or part size, or none, means starting over."""
        digest = hashlib.sha256()
        try:
            lines = journal.read_bytes().decode(errors="replace").split("\n")
            header = json.loads(lines[0])
        except (OSError, ValueError):
            _remove(partial, journal)
            return 0, digest, []
        if header != self.source.header(self.step) or not partial.is_file():
            _remove(partial, journal)
            return 0, digest, []
        claimed: dict[int, tuple[str, str]] = {}
        for raw in lines[1:]:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                entry = json.loads(raw)
                n, sha = int(entry["part"]), str(entry["prefix_sha256"])
                if 0 <= n < self.parts - 1:
                    claimed[n] = (sha, raw)
        kept, good, vouching = 0, digest.copy(), []
        fd = os.open(partial, os.O_RDONLY)
        try:
            for n in range(max(claimed, default=-1) + 1):
                start, end = self._range(n)
                try:
                    _read_range(fd, start, end, digest, None)
                except DownloadError:
                    break
                if n in claimed:
                    if digest.hexdigest() != claimed[n][0]:
                        break
                    kept, good = n + 1, digest.copy()
                    vouching.append(claimed[n][1])
        finally:
            os.close(fd)
        return kept, good, vouching

    def _open_journal(self, journal: Path, kept: list[str]) -> tuple[int, int]:
        """A fresh journal (the header and the lines still vouched for, so a torn or stale line never counts),
        opened for appending; returns it and its length. Written beside and renamed over the old one."""
        lines = [json.dumps(self.source.header(self.step), sort_keys=True), *kept]
        data = ("\n".join(lines) + "\n").encode()
        tmp = journal.with_name(journal.name + ".tmp")
        tmp.unlink(missing_ok=True)
        jfd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            joff = [0]
            self._write_journal(jfd, data, joff)
            self.fs.replace(tmp, journal)
        except BaseException:
            os.close(jfd)
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(journal.parent)
        return jfd, joff[0]


def _read_range(fd: int, start: int, end: int, digest: Any, consumer: Consumer | None) -> None:
    """Read bytes ``start``-``end`` back once, feeding the digest and the consumer from the same read."""
    offset = start
    while offset < end:
        data = os.pread(fd, min(CHUNK, end - offset), offset)
        if not data:
            raise DownloadError(f"reading back bytes {offset}-{end}: the file is shorter")
        if digest is not None:
            digest.update(data)
        if consumer is not None:
            consumer.feed(offset, data)
        offset += len(data)


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            p.unlink()
