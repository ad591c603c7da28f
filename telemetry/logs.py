"""The exporter's own log: one JSON object per line on stderr, never mixed into EMF.

Repeated warnings (a source down every cycle) are logged when they start,
when their message changes and when they stop, not every cycle.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

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


def setup(level: str = "info", stream: TextIO | None = None, name: str = LOGGER) -> logging.Logger:
    """JSON lines on stderr for the ``name`` logger tree (the exporter's, or modelsync's)."""
    logger = logging.getLogger(name)
    logger.handlers.clear()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger


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
