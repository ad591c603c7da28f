"""The rollout tests' fleet: three hosts, each a real Triton with its ``python -m modelsync``, on moto's S3, SNS and
SQS; one per module, so that the rollout modules run on two workers at once."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support.msync import Fleet, moto  # noqa: F401 - fixture


@pytest.fixture(scope="module")
def fleet(moto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:  # noqa: F811
    f = Fleet(moto, tmp_path_factory.mktemp("fleet"), 3)
    try:
        f.start_all()
        yield f
    finally:
        for h in f.hosts:
            sys.stderr.write(f"--- {h.name} daemon log (tail)\n{h.log.read_text()[-4000:] if h.log.exists() else ''}\n")
        f.close()
