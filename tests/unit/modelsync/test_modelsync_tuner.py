"""modelsync/transfer.py's Tuner on simulated links: how many GETs a transfer keeps in flight.

A link is a function from connections in flight to bytes per second: S3 caps each connection (about 80-100
MB/s), an instance's network caps the sum. The tuner must climb to the most allowed on a link capped per
connection, stop at the knee of one capped in total (more connections there only split the same bytes), and
never take fewer than it started with when nothing is learned.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from modelsync.transfer import Tuner

MB = 1_000_000


def run(tuner: Tuner, link: Callable[[int], float], seconds: float = 10.0, tick: float = 0.05) -> list[int]:
    now, received, targets = 0.0, 0.0, []
    tuner.start(now, 0)
    while now < seconds:
        now += tick
        received += link(tuner.target) * tick
        targets.append(tuner.observe(now, int(received)))
    return targets


def per_connection(each: float, total: float = float("inf")) -> Callable[[int], float]:
    return lambda n: min(n * each, total)


def test_a_link_capped_per_connection_gets_every_connection_allowed() -> None:
    tuner = Tuner(start=4, most=64, every=0.5)
    targets = run(tuner, per_connection(40 * MB))
    assert targets[-1] == 64 and [t for t, _ in tuner.steps][:5] == [4, 8, 16, 32, 64]


def test_a_link_full_at_eight_connections_stays_at_the_knee() -> None:
    tuner = Tuner(start=4, most=64, every=0.5)
    targets = run(tuner, per_connection(40 * MB, total=320 * MB))  # 8 x 40 MB/s fills it
    assert targets[-1] == 8  # 16 brought nothing: back to 8, and held
    assert tuner.holding


@pytest.mark.parametrize("start", [1, 4, 16])
def test_the_target_stays_within_start_and_most(start: int) -> None:
    tuner = Tuner(start=start, most=16, every=0.5)
    targets = run(tuner, per_connection(10 * MB, total=35 * MB))
    assert all(1 <= t <= 16 for t in targets) and min(targets) >= min(start, 16)


def test_a_fixed_pool_never_changes() -> None:
    tuner = Tuner(start=16, most=16, every=0.5)
    assert set(run(tuner, per_connection(1 * MB))) == {16} and tuner.steps == []
