#!/usr/bin/env bash
# Regenerate docs/dashboard-preview.png and docs/dashboard-preview-top.png (its first screen, the README's
# picture): set up .venv, run the demo (a real local Triton with the sample models and traffic, the exporter's
# loop for a few short windows on the test suite's NVML fake, model sync on moto's S3), then draw
# dashboards/triton.json with that run's EMF and log lines. Options: python -m demo.preview --help.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m demo.preview "$@"
