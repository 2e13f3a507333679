#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine with Python 3.11: apt packages when missing, then a
# virtual environment in .venv with edge-agent and its test tools installed (editable); with
# --tests (scripts/test.sh) also .venv-triton, the tests' Triton server (below).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v mosquitto >/dev/null 2>&1 || need_apt+=(mosquitto)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)   # the official AsyncAPI parser (tests)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

# The three environments install side by side (pip and npm mostly wait on the network and the
# disk): the tests' Triton server and the AsyncAPI parser in the background, edge-agent here.
pids=()
# The real Triton server of the tests and benches (tests/triton_server.py) in an environment of
# its own: pytriton pins numpy<2, the daemon runs on numpy 2 (pyproject.toml, extra
# `triton-server`, read from there so the list lives in one place). Only for the tests
# (`setup.sh --tests`, what scripts/test.sh runs): the simulated robot does not need it.
tstamp=.venv-triton/.edge-agent-installed
if [ "${1:-}" = "--tests" ] && { [ ! -f "$tstamp" ] || [ pyproject.toml -nt "$tstamp" ]; }; then
  (
    [ -x .venv-triton/bin/python ] || python3 -m venv .venv-triton
    .venv-triton/bin/python -m pip install -q --upgrade pip
    python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["triton-server"]))' > .venv-triton/requirements.txt
    .venv-triton/bin/python -m pip install -q -r .venv-triton/requirements.txt
    touch "$tstamp"
  ) &
  pids+=($!)
fi
# The official AsyncAPI parser that tests/test_asyncapi_official.py runs on docs/asyncapi.yaml,
# pinned by tests/asyncapi/package-lock.json (installed again only when the lockfile changes).
pstamp=tests/asyncapi/node_modules/.edge-agent-installed
if [ ! -f "$pstamp" ] || [ tests/asyncapi/package-lock.json -nt "$pstamp" ]; then
  (
    npm ci --prefix tests/asyncapi --silent --no-audit --no-fund
    touch "$pstamp"
  ) &
  pids+=($!)
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.edge-agent-installed-compat
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # editable_mode=compat: a plain .pth path entry instead of setuptools' import finder, which
  # costs every Python process here ~15-20 ms (pathlib, urllib.parse, fnmatch) at start-up
  .venv/bin/python -m pip install -q -e '.[dev]' --config-settings editable_mode=compat
  touch "$stamp"
fi
for pid in "${pids[@]}"; do
  wait "$pid"  # a failed install fails the set-up (set -e)
done
# Byte-compile the package (an editable install does not, and the service cannot write next to
# its code: ProtectSystem=strict). Without .pyc files every start compiles ~80 modules again —
# ~250 ms here, more than the whole start-up budget. Quick when nothing changed.
.venv/bin/python -m compileall -q -j 0 edge_agent hil >/dev/null
