"""The process's own log: one JSON object per line on stderr, never mixed into EMF.

Repeated warnings (a source down every cycle) are logged when they start,
when their message changes and when they stop, not every cycle
(:class:`Conditions`); events that hostile input can repeat at will (a
refused request) at most once a minute per kind (:class:`Throttled`).

Once :func:`setup` has run, stderr carries JSON lines only, whatever fails:
an exception nobody caught, in the main thread or any other, an exception
Python can only ignore (in ``__del__``), a warning, a library's log record
without a handler. The traceback goes into the line's ``exception`` field.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

import orjson

LOGGER = "exporter"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update(extra)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class _StderrJson(logging.StreamHandler[TextIO]):
    """JSON lines to whatever ``sys.stderr`` is when a record comes (as logging's own last resort does)."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(sys.stderr)
        self.setLevel(level)
        self.setFormatter(JsonFormatter())

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def setup(level: str = "info", stream: TextIO | None = None, name: str = LOGGER) -> logging.Logger:
    """JSON lines on stderr for the ``name`` logger tree (the exporter's, or modelsync's), and for everything
    else that would write to stderr from now on (see the module's docstring)."""
    logger = logging.getLogger(name)
    logger.handlers.clear()
    handler = logging.StreamHandler(stream) if stream is not None else _StderrJson()
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    _catch_everything(logger)
    return logger


def catch_unexpected(name: str = LOGGER) -> None:
    """For a command, before its logging is set up: whatever nobody caught becomes one JSON line on stderr
    with its traceback in the ``exception`` field (never a raw traceback), as under :func:`setup`."""
    _catch_everything(logging.getLogger(name))


def _catch_everything(logger: logging.Logger) -> None:
    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "?"
        if args.exc_value is None:
            logger.error("unexpected %s in thread %s", args.exc_type.__name__, name)
            return
        exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
        logger.error("unexpected error in thread %s", name, exc_info=exc_info)

    def main_hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            logger.error("interrupted")
            return
        logger.critical("unexpected error; stopping", exc_info=(kind, value, tb))

    def unraisable_hook(u: Any) -> None:
        exc_info = (u.exc_type, u.exc_value, u.exc_traceback) if u.exc_value is not None else None
        where = f"{u.err_msg or 'Exception ignored in'}: {u.object!r}"[:300]
        logger.error(where, exc_info=exc_info)

    threading.excepthook = thread_hook
    sys.excepthook = main_hook
    sys.unraisablehook = unraisable_hook
    logging.lastResort = _StderrJson(logging.WARNING)  # a library's record with no handler of its own
    logging.captureWarnings(True)  # warnings through that last resort, as JSON


def get(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{LOGGER}.{name}" if name else LOGGER)


class Conditions:
    """Tracks on/off conditions so each change is logged once."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.active: dict[str, str] = {}

    def set(self, key: str, message: str | None, level: int = logging.WARNING, **fields: object) -> None:
        """``message`` None means the condition cleared."""
        before = self.active.get(key)
        if message is None:
            if before is not None:
                del self.active[key]
                self.logger.info(f"{key}: recovered", extra={"fields": {"condition": key, **fields}})
            return
        if before != message:
            self.active[key] = message
            self.logger.log(level, message, extra={"fields": {"condition": key, **fields}})


class Throttled:
    """At most one line per ``key`` every ``every`` seconds; the next one says how many were left out.

    For events that input can repeat at will (each refused request), so the log stays bounded whatever
    arrives. Thread-safe."""

    def __init__(self, logger: logging.Logger, every: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.every = every
        self.clock = clock
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}
        self._lock = threading.Lock()

    def log(self, key: str, level: int, message: str, exc_info: Any = None, **fields: object) -> bool:
        """Log ``message`` unless ``key`` was logged less than ``every`` seconds ago; True when it was logged."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every:
                self._left_out[key] = self._left_out.get(key, 0) + 1
                return False
            self._last[key] = now
            left_out = self._left_out.pop(key, 0)
        extra = {"kind": key, **fields, **({"left_out": left_out} if left_out else {})}
        self.logger.log(level, message, exc_info=exc_info, extra={"fields": extra})
        return True
