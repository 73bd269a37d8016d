#!/usr/bin/env bash
# Installs what the operator, its tests and the local cluster need on a fresh machine:
# a virtualenv with the package (editable) and its test tools, Debian's Prometheus, HAProxy
# and CPU torch,
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
# The package has two roots (operator/ and engine-builder/), so setuptools installs it in
# editable mode through a meta path finder and says so in a 10-line note ("Editable
# installation ... be careful with folders named like your package"); that one note is
# filtered by its title, every other warning still shows.
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/pip install --quiet -e '.[test]'

# The tests start their own Prometheus on loopback: only the binary is wanted, not the
# package's system service (policy-rc.d keeps it from starting; node-exporter, a
# recommendation, would bind :9100, hence --no-install-recommends).
apt_install() {  # Debian packages, as root (or through sudo -n); services stay off
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "error: the tests need these Debian packages; install them as root: apt-get install -y --no-install-recommends $*" >&2
      return 1
    fi
  fi
  command -v apt-get >/dev/null || {
    echo "error: the tests need Debian's packages $* (apt-get not found)" >&2
    return 1
  }
  "${sudo[@]}" sh -ec '
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
      printf "#!/bin/sh\nexit 101\n" >"$policy"; chmod 755 "$policy"
      trap "rm -f $policy" EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
    if [ -d /run/systemd/system ]; then
      systemctl disable --now prometheus haproxy >/dev/null 2>&1 || true
    fi
  ' apt_install "$@"
}
# promtool (the chart's alert rules are checked and unit-tested with it) comes in the same
# Debian package as Prometheus. Debian's python3-torch (CPU) lets the CPU twin load the GPU
# data plane's stand-ins (bench/gpu/standins) in CI, which has no GPU.
packages=()
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  packages+=(prometheus)
fi
# The closed loop's router (issue 30): Debian's HAProxy 2.6, binary only (its service stays
# off like Prometheus's); the tests run it on loopback with the config the operator renders.
if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  packages+=(haproxy)
fi
if [ ! -d /usr/lib/python3/dist-packages/torch ]; then
  packages+=(python3-torch)
fi
if [ ${#packages[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${packages[*]} (services stay off)" >&2
  apt_install "${packages[@]}"
fi

command -v go >/dev/null || { echo "error: Go (>= 1.26) is needed to build the local cluster" >&2; exit 1; }
echo "== control-plane binaries (cold build: ~12 min on 2 cores; cached afterwards)" >&2
.venv/bin/cosyvoice-operator cluster build
