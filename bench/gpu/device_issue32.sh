#!/usr/bin/env bash
# Issue 32 on the lent GPU: the token2wav speed step, then the sweep (goodput by a rate search
# whose steps are 100 requests), as ONE job that outlives a single device call.
#
#   bash bench/gpu/device_issue32.sh WAIT_S STOP_AT_S POINTS PROFILE_POINTS
#
# The first call on a fresh machine sets up (as device_run.sh does) and starts the job in its
# own session (setsid): it keeps running after the call returns, as long as the machine is
# held, i.e. the next call comes within the machine's idle window (30 s). Every call (the
# first and each later one, same arguments) waits up to WAIT_S seconds or until the job ends,
# then copies what the job has written so far to $OUT: a later call picks up where the last
# one left off, with no second set-up or server start. STOP_AT_S: the sweep starts nothing that
# would end after this many seconds of its own (sweep.py --stop-at). POINTS: sweep.py's
# --points (NAME@FIRST_RATE,...; none: the speed step alone). Carry ["bench/gpu/build"].
set -uo pipefail
wait_s="$1"
stop_at="$2"
points="$3"
profile="${4:-}"
called=$(date +%s)
export PYTHONUNBUFFERED=1
B=bench/gpu/build
SITE=/tmp/stubenv/lib/python3.12/site-packages
RELEASE=/tmp/cv2-release
J=/tmp/i32
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"

if [ ! -e $J/started ]; then
  mkdir -p $J && date +%s >$J/started
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $J/device.txt
  python3 -m venv --without-pip /tmp/stubenv && mkdir -p /tmp/triton /tmp/py &&
    tar xJf "$B/triton.tar.xz" -C /tmp/triton && tar xJf "$B/site.tar.xz" -C /tmp/py &&
    rm -rf "$SITE" && mv /tmp/py/site "$SITE" || { echo setup failed; exit 3; }
  rm -rf /tmp/orchenv && python3 -m venv --without-pip /tmp/orchenv &&
    cp -a /tmp/py/np126/. /tmp/orchenv/lib/python3.12/site-packages/ &&
    ln -s /tmp/orchenv/lib/python3.12/site-packages /tmp/orchenv/numpy126 || exit 3
  cat >$J/job.sh <<EOF
set -uo pipefail
export PYTHONUNBUFFERED=1 COSYVOICE_ORCHESTRATOR_NUMPY=/tmp/orchenv
cd "$PWD"
echo "release: \$(date +%T)"
PYTHONPATH="$SITE" python3 bench/gpu/full_release.py $RELEASE >$J/release.json 2>$J/release.err || exit 4
echo "speed: \$(date +%T)"
PYTHONPATH="$SITE" python3 bench/gpu/token2wav_speed.py $RELEASE >$J/token2wav-speed.json 2>$J/speed.err
echo "speed rc=\$? \$(date +%T)"
[ "$points" = none ] && exit 0  # the speed step alone
python3 bench/gpu/orchestrator_numpy.py /tmp/triton "$B" /tmp/orchenv /tmp/stubenv >$J/numpy-probe.json || exit 5
echo "sweep: \$(date +%T)"
(cd bench/gpu && python3 sweep.py --triton /tmp/triton --build build --out $J/sweep.json \
  --stub-prefix /tmp/stubenv --stop-at $stop_at --logs /tmp/logs --points "$points" \
  --profile-points "$profile" --step-requests 100 --profile-requests 100 --profile-levels 1,16) \
  2>&1 | grep --line-buffered -v "^I1\|^W1" >$J/sweep.log
echo "sweep done: \$(date +%T)"
EOF
  setsid nohup bash -c "bash $J/job.sh >$J/job.log 2>&1; date +%s >$J/done" >/dev/null 2>&1 &
fi
while [ ! -e $J/done ] && [ $(($(date +%s) - called)) -lt "$wait_s" ]; do sleep 5; done
[ -d /tmp/logs ] && tar cJf "$OUT/logs.tar.xz" -C /tmp logs 2>/dev/null
for f in job.log sweep.json sweep.log token2wav-speed.json speed.err release.json device.txt; do
  [ -e $J/$f ] && cp $J/$f "$OUT/"
done
echo "job: $([ -e $J/done ] && echo done || echo running) after $(($(date +%s) - $(cat $J/started))) s"
cat $J/job.log
tail -25 $J/sweep.log 2>/dev/null
