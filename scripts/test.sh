#!/usr/bin/env bash
# The test command: set up (idempotent), lint, type-check, then the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
