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

# The tests start their own Prometheus on loopback: only the binary is wanted, not the
# package's system service (policy-rc.d keeps it from starting; node-exporter, a
# recommendation, would bind :9100, hence --no-install-recommends).
install_prometheus() {
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "error: the tests need Prometheus; install it as root: apt-get install -y --no-install-recommends prometheus" >&2
      return 1
    fi
  fi
  command -v apt-get >/dev/null || {
    echo "error: the tests need the prometheus binary on PATH (Debian's package: apt-get install prometheus)" >&2
    return 1
  }
  "${sudo[@]}" sh -ec '
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
      printf "#!/bin/sh\nexit 101\n" >"$policy"; chmod 755 "$policy"
      trap "rm -f $policy" EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
    if [ -d /run/systemd/system ]; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
  '
}
if ! command -v prometheus >/dev/null; then
  echo "== installing Prometheus (Debian package; its service stays off)" >&2
  install_prometheus
fi

command -v go >/dev/null || { echo "error: Go (>= 1.26) is needed to build the local cluster" >&2; exit 1; }
echo "== control-plane binaries (cold build: ~12 min on 2 cores; cached afterwards)" >&2
.venv/bin/cosyvoice-operator cluster build
