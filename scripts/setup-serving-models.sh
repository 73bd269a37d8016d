#!/usr/bin/env bash
# Upstream CosyVoice's library for the CPU twin of the project's own model code
# (serving-models/): Debian's python3-torchaudio (beside the python3-torch scripts/setup.sh
# installs) and the pinned packages of serving-models/cpu-twin-requirements.txt, with
# --no-deps into a folder outside the repository that the Triton stub puts on sys.path.
# Run by `make test` and `make serving-models` (not by scripts/setup.sh, which `make demo` also
# runs): about 570 MB, once; afterwards it returns at once (serving-models/README.md: times).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE="${COSYVOICE_UPSTREAM_SITE:-$HOME/.cache/cosyvoice-operator/upstream-cpu-site}"
REQS=serving-models/cpu-twin-requirements.txt

if [ ! -d /usr/lib/python3/dist-packages/torchaudio ]; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-torch python3-torchaudio
  else
    sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-torch python3-torchaudio
  fi
fi

stamp="$SITE/.requirements"
if [ -f "$stamp" ] && cmp -s "$stamp" "$REQS"; then
  exit 0
fi
rm -rf "$SITE.partial"
.venv/bin/python -m pip install -q --no-deps --target "$SITE.partial" -r "$REQS"
cp "$REQS" "$SITE.partial/.requirements"
rm -rf "$SITE"
mv "$SITE.partial" "$SITE"
echo "upstream's library for the CPU twin: $SITE ($(du -sh "$SITE" | cut -f1))"
