"""Intervals told to whoever measures them: the hook through which modelsync/startup.py times a task's start.

A part that may be timed (``S3.list``, ``Store.claim``) holds an ``observe`` attribute, None unless a measurement
is under way, and runs the timed block inside :func:`spanned`. Standard library only: the health check imports the
store, and must stay quick to start.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

Observe = Callable[[str, float, float], None]  # (phase, start, end), in time.perf_counter() seconds


@contextlib.contextmanager
def spanned(observe: Observe | None, phase: str) -> Iterator[None]:
    """Tell ``observe`` (when there is one) the block's interval as ``phase``, however the block ends."""
    if observe is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        observe(phase, start, time.perf_counter())
