#!/usr/bin/env bash
# Regenerate docs/dashboard-preview.png: set up .venv, run the demo (a real local Triton with the sample
# models and traffic, the exporter's loop for a few short windows, model sync on moto's S3), then draw
# dashboards/triton.json with that run's EMF and log lines. Options: python -m demo.preview --help.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m demo.preview "$@"
