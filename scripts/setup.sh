#!/usr/bin/env bash
# Installs what the operator, its tests and the local cluster need on a fresh machine:
# a virtualenv with the package (editable) and its test tools, Debian's Prometheus,
# and the control-plane binaries (built once from the Go module proxy into ~/.cache).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
echo "== installing cosyvoice-operator[test] (editable)" >&2
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet -e '.[test]'

command -v go >/dev/null || { echo "error: Go (>= 1.26) is needed to build the local cluster" >&2; exit 1; }
echo "== control-plane binaries (cold build: ~12 min on 2 cores; cached afterwards)" >&2
.venv/bin/cosyvoice-operator cluster build
