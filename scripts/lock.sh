#!/usr/bin/env bash
# Regenerate requirements.lock: the closure of pyproject.toml's [project].dependencies at the exact
# versions the project venv (.venv, from scripts/setup.sh) runs, with the sha256 of every wheel and
# sdist of each release (so one lock builds the image on x86_64 and arm64).
#
#   bash scripts/setup.sh && bash scripts/lock.sh
#
# pip-tools lives in its own venv (.venv-lock), never in the project's. The lock's header comment
# (everything before the first pin) is kept as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-lock
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x "$VENV/bin/pip-compile" ]; then
  "$PY" -m venv "$VENV"
  printf '*\n' > "$VENV/.gitignore"   # keep git and ruff out of it
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check pip-tools
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The closure, pinned to what .venv has installed (markers evaluated for this Python).
.venv/bin/python - > "$work/requirements.in" <<'PY'
import importlib.metadata as md
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

todo = [Requirement(d) for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]]
pins = {}
while todo:
    req = todo.pop()
    name = canonicalize_name(req.name)
    if name in pins:
        continue
    dist = md.distribution(req.name)
    pins[name] = dist.version
    for raw in dist.requires or []:
        sub = Requirement(raw)
        if sub.marker is None or sub.marker.evaluate({"extra": ""}):
            todo.append(sub)
for name in sorted(pins):
    print(f"{name}=={pins[name]}")
PY
awk '/^[a-z0-9]/ {exit} {print}' requirements.lock > "$work/header"
"$VENV/bin/pip-compile" --quiet --generate-hashes --no-header --no-annotate --strip-extras \
  --index-url https://pypi.org/simple --no-emit-index-url --no-emit-find-links \
  -o "$work/body" "$work/requirements.in"
cat "$work/header" "$work/body" > requirements.lock
echo "requirements.lock: $(grep -c '^[a-z0-9]' requirements.lock) pins"
