#!/usr/bin/env bash
# Set up everything the test suite needs (a local venv with the real Triton
# binary from nvidia-pytriton, linters, AWS validators) and run it: ruff, then pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh -k emf -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' -r requirements-test.txt
.venv/bin/ruff check .
.venv/bin/ruff format --check . >/dev/null 2>&1 || echo "note: ruff format would reformat some files (not enforced)"
exec .venv/bin/python -m pytest "$@"
