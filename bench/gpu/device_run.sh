#!/usr/bin/env bash
# The GPU sweep on the lent H200, from a build of bench/gpu/pack.py (issue 20). Run in the
# repository root on the device machine (the `device` tool's run, carry ["bench/gpu/build"]):
#
#   bash bench/gpu/device_run.sh STEPS POINTS DEADLINE
#
# STEPS: comma-separated, of: release (full-size synthetic release, no LLM), llm (also its
# Qwen2 checkpoint and llm.pt), speed (token2wav eager vs CUDA graphs), sweep.
# POINTS: sweep point names, comma-separated ("" = all of build/points.json; a name twice
# runs it twice). DEADLINE: seconds after which the sweep starts no new point.
# Everything it measures goes to $OUT (release.json, token2wav-speed.json, sweep.json,
# sweep.log, logs.tar.xz).
set -uo pipefail
steps=",$1,"
points="${2:-}"
deadline="${3:-300}"
export PYTHONUNBUFFERED=1
B=bench/gpu/build
SITE=/tmp/stubenv/lib/python3.12/site-packages
RELEASE=/tmp/cv2-release
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if [ ! -d "$SITE" ]; then
  python3 -m venv --without-pip /tmp/stubenv && mkdir -p /tmp/triton /tmp/py &&
    tar xJf "$B/triton.tar.xz" -C /tmp/triton && tar xJf "$B/site.tar.xz" -C /tmp/py &&
    rm -rf "$SITE" && mv /tmp/py/site "$SITE" || exit 3
fi
# NumPy 1.26 for the orchestrator's stub alone (pack.py, ORCHESTRATOR_STUB): a venv holding it.
export COSYVOICE_ORCHESTRATOR_NUMPY=/tmp/orchenv
if [ ! -e /tmp/orchenv/numpy126 ]; then
  rm -rf /tmp/orchenv
  python3 -m venv --without-pip /tmp/orchenv && cp -a /tmp/py/np126/. /tmp/orchenv/lib/python3.12/site-packages/ &&
    ln -s /tmp/orchenv/lib/python3.12/site-packages /tmp/orchenv/numpy126 || exit 3
fi
# The scripts see what the GPU models' stubs see: the packed library, the device's NumPy.
run_py() { PYTHONPATH="$SITE" python3 "$@"; }

llm=""
[[ $steps == *,llm,* ]] && llm="--llm"
if [[ $steps == *,release,* || -n $llm ]] && [[ ! -f $RELEASE/flow.pt || ( -n $llm && ! -f $RELEASE/llm.pt ) ]]; then
  run_py bench/gpu/full_release.py "$RELEASE" $llm >"$OUT/release.json" 2>"$OUT/release.err"
  echo "release rc=$?"; cat "$OUT/release.json"; tail -3 "$OUT/release.err"
fi
if [[ $steps == *,sweep,* ]]; then
  # Which stub wrapper gives the orchestrator NumPy 1.26 here (orchestrator_numpy.py); no sweep
  # without one (every stream would fail).
  python3 bench/gpu/orchestrator_numpy.py /tmp/triton "$B" /tmp/orchenv /tmp/stubenv >"$OUT/numpy-probe.json"
  probe=$?
  python3 -c "import json; d=json.load(open('$OUT/numpy-probe.json')); print('wrapper:', d['chosen'], {k: v['numpy'][0] for k, v in d['findings'].items()})"
  [ $probe = 0 ] || steps="${steps/,sweep,/,}"
fi
if [[ $steps == *,sweep,* ]]; then
  (cd bench/gpu && python3 sweep.py --triton /tmp/triton --build build --out "$OUT/sweep.json" \
    --stub-prefix /tmp/stubenv --deadline "$deadline" --logs /tmp/logs --points "$points" \
    --step-seconds 6 --probe-seconds 5 --profile-seconds 4) 2>&1 | tee "$OUT/sweep.log" | grep -v "^I1\|^W1"
  tar cJf "$OUT/logs.tar.xz" -C /tmp logs 2>/dev/null
fi
if [[ $steps == *,speed,* ]]; then
  run_py bench/gpu/token2wav_speed.py "$RELEASE" >"$OUT/token2wav-speed.json" 2>"$OUT/speed.err"
  echo "speed rc=$?"; cat "$OUT/token2wav-speed.json"; grep -v Warning "$OUT/speed.err" | tail -5
fi
if [[ $steps == *,llm,* ]]; then
  cat "$OUT/release.json"
fi
