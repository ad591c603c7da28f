#!/usr/bin/env bash
# Set up everything the test suite needs, then run it: ruff (lint and format), mypy, then pytest
# (including the real-Triton tests and the container rehearsal), on TEST_WORKERS (6) pytest-xdist workers.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the shipped packages, strict ([tool.mypy] in pyproject.toml)
# The container rehearsal (tests/deploy/test_rehearsal.py) starts its own dockerd; whatever happens to pytest,
# stop it by its pidfile (a no-op when none runs, or while another session holds it).
trap 'bash scripts/rehearsal-engine.sh stop' EXIT
# Independent test modules run on six workers (most of the suite's time is waiting on servers, not CPU);
# tests/conftest.py keeps each module, and the tests sharing the container engine, on one worker.
.venv/bin/python -m pytest -n "${TEST_WORKERS:-6}" "$@"
