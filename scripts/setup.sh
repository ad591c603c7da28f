#!/usr/bin/env bash
# Create .venv and install everything the demo and tests need, at the pins of
# requirements-dev.lock (hash-checked; the real Triton binary comes from the
# nvidia-pytriton wheel), then the package itself, editable. Idempotent.
# To change a dependency: edit pyproject.toml or requirements-test.txt, then bash scripts/lock.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip >/dev/null
"${PIP[@]}" --require-hashes -r requirements-dev.lock
# System tools some tests use where the machine allows (the user data's real XFS on a loop device, shellcheck
# on the user data): installed when running as root with apt, skipped (and those checks skip) otherwise.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=()
  command -v mkfs.xfs >/dev/null 2>&1 || missing+=(xfsprogs)
  command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
  if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
           --no-install-recommends "${missing[@]}" >/dev/null 2>&1; } \
      || echo "setup: could not install ${missing[*]}; the tests that need them skip" >&2
  fi
fi
# The lock holds the build backend: no isolated build env to download, no dependency resolved twice.
PYTHONWARNINGS=ignore "${PIP[@]}" --no-deps --no-build-isolation -e .
