#!/usr/bin/env bash
# Runs the daemon in the foreground on the simulated robot (set-up is idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/edge-agent run --config configs/sim.toml --sim "$@"
