#!/usr/bin/env bash
# Set up, then run the built-in demo: a real local Triton with sample models,
# traffic, and the exporter's --once output (EMF on stdout, a table on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m demo "$@"
