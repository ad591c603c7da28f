#!/usr/bin/env bash
# Set up everything the test suite needs, then run it: ruff (lint and format), mypy, then pytest
# (including the real-Triton tests). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the shipped packages, strict ([tool.mypy] in pyproject.toml)
exec .venv/bin/python -m pytest "$@"
